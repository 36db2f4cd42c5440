"""The security tests' world under attack: a runtime with sessions in every state, a snapshot of
its whole store to prove an attack changed nothing, the app served over it, and hostile values.
"""

from __future__ import annotations

import atexit
import dataclasses
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

import signoff as so
from signoff.server import TokenAuth, create_app
from signoff.server._app import MAX_BODY_SIZE
from signoff.testing import ManualClock

from .test_server_common import ALICE, TOKENS, _echo, analysed_once, make_agents

__all__ = [
    "A",
    "BIG",
    "CHARSET",
    "DEEP",
    "JSON",
    "JSON_REPLY",
    "RA",
    "STALE_HASH",
    "Served",
    "World",
    "build_world",
    "copied_world",
    "deep_json",
    "expiring_agent",
    "forged",
    "nested",
    "served",
    "snapshot",
    "world",
]


STALE_HASH = "sha256:" + "0" * 64
DEEP = 100_000


def nested(depth: int) -> Any:
    """`depth` levels of lists, built without recursion."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def deep_json(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


# -- the runtime under attack ---------------------------------------------------------------------


def expiring_agent() -> so.Agent:
    @so.tool(approval=so.always(expires_in=60))
    async def close_account(account: str) -> dict[str, Any]:
        """Close a customer's account."""
        return {"closed": account}

    call = so.ModelResponse(
        tool_calls=[so.ToolCall(name="close_account", input={"account": "ACC-1"})]
    )
    return so.Agent(
        name="closer",
        model=so.models.Scripted([call, _echo], repeat_last=True),
        tools=[close_account],
    )


@dataclass(slots=True)
class World:
    """A runtime with requests in every state, each owned by Alice (tenant `acme`)."""

    rt: so.Runtime
    clock: ManualClock
    a: str = ""  # a waiting support session and its open approval
    ra: str = ""
    b: str = ""  # a second one
    rb: str = ""
    q: str = ""  # a waiting question
    rq: str = ""
    t: str = ""  # a two-approver (quorum) approval
    rt_: str = ""
    s: str = ""  # a session whose approval was settled (approved)
    rs: str = ""
    c: str = ""  # a session whose approval was withdrawn by a cancel
    rc: str = ""
    x: str = ""  # a session whose approval expired
    rx: str = ""


async def build_world(tmp_path: Path) -> World:
    clock = ManualClock()
    rt = so.Runtime(
        [*make_agents(), expiring_agent()],
        store=f"sqlite:///{tmp_path / 'state.db'}",
        clock=clock,
    )
    w = World(rt=rt, clock=clock)

    async def start(agent: str) -> tuple[str, str]:
        r = await rt.generate(agent, prompt="please", auth=ALICE)
        assert r.status == "waiting", r
        return r.session_id, r.pending[0].id

    w.a, w.ra = await start("support")
    w.b, w.rb = await start("support")
    w.q, w.rq = await start("helper")
    w.t, w.rt_ = await start("treasury")
    w.s, w.rs = await start("support")
    done = await rt.respond(
        w.s, [so.InputResponse(request_id=w.rs, option_id="approve")], principal=ALICE
    )
    assert done.status == "completed"
    w.c, w.rc = await start("support")
    await rt.cancel(w.c, "changed my mind")
    w.x, w.rx = await start("closer")
    clock.advance(61)
    assert await rt.expire_due() == 1
    return w


_built: list[World] = []  # the world built once in this process, its runtime closed
_built_dir = tempfile.TemporaryDirectory(prefix="signoff-world-")
atexit.register(_built_dir.cleanup)


async def copied_world(tmp_path: Path) -> World:
    """The world on a copy of the store of one built once in this process, with a clock of its
    own at the same time: building it (seven sessions driven) took ~50 ms of CPU a test, the
    copy ~5 ms. The runtime shares the built one's agents (their scripts keep no state)."""
    if not _built:
        built = await build_world(Path(_built_dir.name))
        await built.rt.close()
        _built.append(built)
    built = _built[0]
    for path in Path(_built_dir.name).glob("state.db*"):
        shutil.copyfile(path, tmp_path / path.name)
    clock = ManualClock(built.clock())
    store = f"sqlite:///{tmp_path / 'state.db'}"
    rt = so.Runtime(list(built.rt.agents.values()), store=store, clock=clock)
    return dataclasses.replace(built, rt=rt, clock=clock)


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    w = await copied_world(tmp_path)
    try:
        yield w
    finally:
        await w.rt.close()


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    dump = getattr(value, "model_dump", None)
    return dump(mode="json") if dump is not None else value


async def snapshot(rt: so.Runtime) -> dict[str, Any]:
    """Everything the public API shows of the store: every session with its events and its
    requests (status and resolution), the open queue, and the audit trail."""
    sessions = await rt.sessions(limit=10_000)
    out: dict[str, Any] = {
        "sessions": [_plain(s) for s in sessions],
        "pending": [_plain(r) for r in await rt.pending(limit=10_000)],
        "audit": [_plain(e) for e in await rt.audit()],
        "events": {},
        "requests": {},
    }
    for s in sessions:
        events = [_plain(e) async for e in rt.events(s.id, follow=False)]
        out["events"][s.id] = events
        for rid in sorted((await rt.state(s.id)).requests):
            stored = await rt.store.get_request(rid)
            assert stored is not None, rid
            out["requests"][rid] = (stored.status, stored.outcome, stored.resolution)
    assert out["events"] and out["requests"], "the snapshot must see the world's sessions"
    return out


def forged() -> str:
    return f"req_{uuid.uuid4().hex[:20]}"


def A(w: World) -> str:
    return w.a


def RA(w: World) -> str:
    return w.ra


# -- the HTTP API ---------------------------------------------------------------------------------


@dataclass(slots=True)
class Served:
    world: World
    client: httpx.AsyncClient
    transport: httpx.ASGITransport


@pytest.fixture
async def served(world: World) -> AsyncIterator[Served]:
    """The app over the test's own world, routed as the first one was (`analysed_once`)."""
    app = analysed_once(create_app(world.rt, auth=TokenAuth(TOKENS), sweep_every=None))
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=transport, base_url="http://signoff.test") as c:
            yield Served(world, c, transport)


JSON = {"Content-Type": "application/json"}
CHARSET = "application/json; charset=utf-8"
JSON_REPLY = {"Accept": "application/json"}


BIG = MAX_BODY_SIZE + 1024
