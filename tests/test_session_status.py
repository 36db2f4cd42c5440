"""One session, one status, everywhere: the runtime's result and state, the store's summary (on
SQLite and PostgreSQL), the HTTP API, the dashboard and `signoff sessions` say the same thing
for a turn parked on input, answered without resuming, failed (retryably or not) and cancelled;
and every end of a turn is followed by `session.waiting`, so a client reading until then stops."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

import signoff as so
from signoff.cli import _deletion
from signoff.cli import app as cli_app
from signoff.server import TokenAuth, create_app
from signoff.testing import call, call_tools, reply, scripted_agent

from .test_server_common import ALICE, BOB, TOKENS


@so.tool(approval=so.always())
async def refund(amount: int) -> dict[str, int]:
    """Refund an amount."""
    return {"refunded": amount}


@so.tool
async def lookup(n: int) -> int:
    """Look something up."""
    return n


def _down(conversation: list[so.Message]) -> so.ModelResponse:
    raise so.ModelError("the provider is down")


def _costly() -> so.ModelResponse:
    return so.ModelResponse(
        tool_calls=call_tools(call("lookup", n=1)).tool_calls,
        usage=so.Usage(input_tokens=60, output_tokens=0),
    )


def agents() -> list[so.Agent]:
    return [
        scripted_agent(
            "gated", [call_tools(call("refund", amount=5)), reply("done")], tools=[refund]
        ),
        scripted_agent("broken", [_down], tools=[]),
        scripted_agent(
            "fleeting",
            [call_tools(call("refund", amount=5))],
            tools=[refund],
            limits=so.Limits(ttl=60),
        ),
        scripted_agent(
            "spender",
            [_costly(), _costly(), reply("finished")],
            tools=[lookup],
            limits=so.Limits(max_tokens=100),
        ),
    ]


@dataclass
class World:
    url: str
    rt: so.Runtime
    api: httpx.AsyncClient
    dashboard: httpx.AsyncClient

    async def statuses(self, sid: str) -> dict[str, Any]:
        """The session's status as each surface shows it."""
        state = await self.rt.state(sid)
        async with so.Runtime([], store=self.url) as fresh:  # folded from the store anew
            loaded = await fresh.state(sid)
            [row] = [r for r in await fresh.sessions(limit=1000) if r.id == sid]
        body = (await self.api.get(f"/v1/sessions/{sid}")).json()
        page = (await self.dashboard.get(f"/_signoff/sessions/{sid}")).text
        badge = re.search(r"data-session-status>([a-z]+)<", page)
        listed = await asyncio.to_thread(
            CliRunner().invoke, cli_app, ["sessions", "--store", self.url, "--json"]
        )
        assert listed.exit_code == 0, listed.output
        [cli] = [r for r in json.loads(listed.stdout) if r["id"] == sid]
        return {
            "state": state.status,
            "state (new process)": loaded.status,
            "store": row.status,
            "http": body["status"],
            "dashboard": None if badge is None else badge.group(1),
            "cli": cli["status"],
        }

    async def agree(self, sid: str, status: str) -> None:
        shown = await self.statuses(sid)
        assert shown == dict.fromkeys(shown, status)
        body = (await self.api.get(f"/v1/sessions/{sid}")).json()
        assert body["turn"]["status"] == status  # the turn's own status agrees too
        assert (await self.rt.state(sid)).turn_status == status

    async def read_until_idle(self, sid: str) -> list[str]:
        """Follow the stream from the start until `session.waiting`, as a client would."""

        async def follow() -> list[str]:
            types: list[str] = []
            async for e in self.rt.events(sid, after=0):
                types.append(e.type)
                if e.type == "session.waiting":
                    return types
            return types

        return await asyncio.wait_for(follow(), timeout=5)


@asynccontextmanager
async def world(
    store_url: str, serving: list[so.Agent] | None = None, **kw: Any
) -> AsyncIterator[World]:
    """The surfaces of a server whose runtime has `serving` (every agent of `agents()` if None)."""
    rt = so.Runtime(
        agents() if serving is None else serving, store=store_url, poll_interval=0.01, **kw
    )
    app = create_app(rt, auth=TokenAuth(TOKENS), sweep_every=None)
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), rt:
        headers = {"Authorization": "Bearer alice-token"}
        async with (
            httpx.AsyncClient(base_url="http://t", transport=transport, headers=headers) as api,
            httpx.AsyncClient(base_url="http://t", transport=transport) as dashboard,
        ):
            login = await dashboard.get("/_signoff/login")
            csrf = re.search(r'name="csrf-token" content="([^"]+)"', login.text)
            assert csrf is not None
            r = await dashboard.post(
                "/_signoff/login", data={"token": "alice-token", "csrf": csrf.group(1)}
            )
            assert r.status_code == 303
            yield World(store_url, rt, api, dashboard)


def approve(request: so.InputRequest) -> list[so.InputResponse]:
    return [so.InputResponse(request_id=request.id, option_id="approve")]


async def test_parked_on_input_is_waiting_everywhere(store_url: str) -> None:
    async with world(store_url) as w:
        r = await w.rt.generate("gated", prompt="refund", auth=ALICE)
        assert (r.status, len(r.pending)) == ("waiting", 1)
        await w.agree(r.session_id, "waiting")
        types = [e.type async for e in w.rt.events(r.session_id, follow=False)]
        assert types[-1] == "turn.waiting" and "session.waiting" not in types  # the turn is open


async def test_answered_without_resuming_is_running_everywhere(store_url: str) -> None:
    """The answers are in and nothing waits for a person: the turn has work, and a worker (or the
    next call) runs it. It said `waiting` with nothing pending in the result, the state and the
    HTTP view while the store's summary said `running`."""
    async with world(store_url) as w:
        parked = await w.rt.generate("gated", prompt="refund", auth=ALICE)
        sid = parked.session_id
        r = await w.rt.respond(sid, approve(parked.pending[0]), principal=ALICE, resume=False)
        assert (r.status, r.pending) == ("running", [])
        await w.agree(sid, "running")
        done = await w.rt.generate(session_id=sid)  # the next call runs it
        assert (done.status, done.text) == ("completed", "done")


async def test_a_runtime_leaving_turns_to_workers_says_the_same(store_url: str) -> None:
    """`inline=False` reported `running` where an inline runtime's `resume=False` said `waiting`."""
    async with world(store_url) as w:
        one = await w.rt.generate("gated", prompt="refund", auth=ALICE)
        two = await w.rt.generate("gated", prompt="refund", auth=ALICE)
        async with so.Runtime(agents(), store=store_url, inline=False) as queued:
            r1 = await queued.respond(one.session_id, approve(one.pending[0]), principal=ALICE)
            r2 = await queued.respond(
                two.session_id, approve(two.pending[0]), principal=ALICE, resume=False
            )
            assert (r1.status, r2.status) == ("running", "running")
            assert (await queued.state(one.session_id)).status == "running"
        await w.agree(one.session_id, "running")
        await w.agree(two.session_id, "running")


async def test_a_retryable_failure_is_failed_everywhere_and_ends_with_session_waiting(
    store_url: str,
) -> None:
    """A client reading the stream until `session.waiting` waited for ever after a model error:
    only a failure no retry could lift was followed by it."""
    async with world(store_url) as w:
        r = await w.rt.generate("broken", prompt="hello", auth=ALICE)
        assert (r.status, r.retryable) == ("failed", True)
        await w.agree(r.session_id, "failed")
        types = await w.read_until_idle(r.session_id)
        assert types[-2:] == ["turn.failed", "session.waiting"]


async def test_a_failure_for_good_is_failed_everywhere_and_ends_with_session_waiting(
    store_url: str,
) -> None:
    async with world(store_url) as w:
        r = await w.rt.generate("spender", prompt="go", auth=ALICE)
        [limit] = r.pending
        assert limit.kind == "session-limit"
        stop = [so.InputResponse(request_id=limit.id, option_id="stop")]
        r = await w.rt.respond(r.session_id, stop, principal=ALICE)
        assert (r.status, r.retryable) == ("failed", False)
        await w.agree(r.session_id, "failed")
        types = await w.read_until_idle(r.session_id)
        assert types[-2:] == ["turn.failed", "session.waiting"]


async def test_cancelled_is_cancelled_everywhere_and_ends_with_session_waiting(
    store_url: str,
) -> None:
    async with world(store_url) as w:
        parked = await w.rt.generate("gated", prompt="refund", auth=ALICE)
        r = await w.rt.cancel(parked.session_id, "not now", principal=ALICE)
        assert (r.status, r.pending) == ("cancelled", [])
        await w.agree(parked.session_id, "cancelled")
        types = await w.read_until_idle(parked.session_id)
        assert types[-2:] == ["turn.cancelled", "session.waiting"]


async def test_a_cancelled_turn_with_a_message_waiting_is_running_everywhere(
    store_url: str,
) -> None:
    """Bob's message waited for Alice's turn to end: once a runtime that leaves its turns to
    workers cancels it, the session has work (a worker or the next call starts Bob's turn; an
    inline runtime's cancel starts it at once), so it is `running` in the state as it was in
    the store's summary; the cancel's result and the turn still say `cancelled`."""
    async with world(store_url) as w:
        parked = await w.rt.generate("gated", prompt="refund", auth=ALICE)
        sid = parked.session_id
        queued = await w.rt.send(sid, "bob here", principal=BOB)
        assert queued.status == "waiting"
        async with so.Runtime(agents(), store=store_url, inline=False) as workers:
            r = await workers.cancel(sid, principal=ALICE)
        assert r.status == "cancelled"
        shown = await w.statuses(sid)
        assert shown == dict.fromkeys(shown, "running")
        assert (await w.rt.state(sid)).turn_status == "cancelled"
        body = (await w.api.get(f"/v1/sessions/{sid}")).json()
        assert body["turn"]["status"] == "cancelled"
        done = await w.rt.generate(session_id=sid)  # the next call starts Bob's turn
        assert (done.status, done.text) == ("completed", "done")
        assert (await w.statuses(sid))["store"] == "idle"


async def test_a_turn_its_ttl_caught_is_failed_everywhere_first_of_all_in_the_state(
    store_url: str,
) -> None:
    """A session whose TTL passed while it waited on a person: `rt.state` read before any
    listing records the expiry as listings do (its request expires, its turn fails for good)
    instead of showing it `waiting` on a request no one can answer any more."""
    now = [1_000_000.0]
    async with world(store_url, clock=lambda: now[0]) as w:
        r = await w.rt.generate("fleeting", prompt="refund", auth=ALICE)
        assert r.status == "waiting"
        now[0] += 61
        state = await w.rt.state(r.session_id)  # before anything else has looked
        assert (state.status, state.pending_requests()) == ("failed", [])
        assert state.turn is not None and state.turn.error is not None
        assert state.turn.error["code"] == "session_expired"
        await w.agree(r.session_id, "failed")
        types = [e.type async for e in w.rt.events(r.session_id, follow=False)]
        assert types[-2:] == ["input.resolved", "turn.failed"]


async def test_a_turn_its_ttl_caught_is_failed_everywhere_on_a_server_without_its_agent(
    store_url: str,
) -> None:
    """A server whose runtime lacks the session's agent cannot record its passed TTL: its
    listings, queue and request read showed the session failed and its request expired, but
    `rt.state`, `GET /v1/sessions/{id}` and the dashboard's page `waiting` on that request. Each
    shows it as recording the expiry leaves it, and nothing is recorded by reading it."""
    now = [1_000_000.0]
    async with so.Runtime(agents(), store=store_url, clock=lambda: now[0]) as parked:
        r = await parked.generate("fleeting", prompt="refund", auth=ALICE)
        assert r.status == "waiting"
    now[0] += 61
    async with world(
        store_url, [scripted_agent("other", [reply("hi")])], clock=lambda: now[0]
    ) as w:
        before = [e.type async for e in w.rt.events(r.session_id, follow=False)]
        await w.agree(r.session_id, "failed")
        body = (await w.api.get(f"/v1/sessions/{r.session_id}")).json()
        assert (body["pending"], body["turn"]["error"]["code"]) == ([], "session_expired")
        rid = r.pending[0].id
        assert (await w.api.get(f"/v1/requests/{rid}")).json()["status"] == "expired"
        assert (await w.api.get("/v1/requests")).json()["total"] == 0
        assert [e.type async for e in w.rt.events(r.session_id, follow=False)] == before


async def test_a_message_queued_behind_a_turn_its_ttl_caught_starts_nothing_on_any_surface(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another person's message is queued behind the parked turn when its TTL passes: a server
    without the session's agent showed it `running` (`rt.state`, `GET /v1/sessions/{id}`, the
    dashboard's badge, `signoff delete`'s question) as if the message could start, while its
    listings said `failed`. The TTL's failure starts nothing queued behind it, recorded or not."""
    now = [1_000_000.0]
    async with so.Runtime(agents(), store=store_url, clock=lambda: now[0]) as parked:
        r = await parked.generate("fleeting", prompt="refund", auth=ALICE)
        assert (await parked.send(r.session_id, "and another", principal=BOB)).queued
    now[0] += 61
    async with world(
        store_url, [scripted_agent("other", [reply("hi")])], clock=lambda: now[0]
    ) as w:
        before = [e.type async for e in w.rt.events(r.session_id, follow=False)]
        await w.agree(r.session_id, "failed")
        body = (await w.api.get(f"/v1/sessions/{r.session_id}")).json()
        assert (body["pending"], body["turn"]["error"]["code"]) == ([], "session_expired")
        monkeypatch.setattr(_deletion, "_can_ask", lambda: True)
        asked = await asyncio.to_thread(
            CliRunner().invoke, cli_app, ["delete", r.session_id, "--store", w.url], input="n\n"
        )
        assert asked.exit_code == 1, asked.output
        assert f"Delete session {r.session_id} (fleeting, failed, " in asked.stdout
        assert [e.type async for e in w.rt.events(r.session_id, follow=False)] == before
