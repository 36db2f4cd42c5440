"""Every total of open requests and sessions agrees with the listing it counts, paged to its end:
the `total` of `GET /v1/requests` and of `GET /v1/sessions` (so `Client.pending()` and
`Client.sessions()`), the dashboard's badge and `X-Total-Count`, the live stream's count, the
metrics gauge and `signoff pending`. One store is built with the states that listings leave out
though the store still holds them open (a deadline passed that this server cannot record, for an
agent it does not serve; a mirror whose subagent's request passed its deadline, or whose
subagent's session passed its TTL), beside other tenants' requests and closed ones, and every
caller and filter is paged through as the clock moves past each deadline and TTL."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

import signoff as so
from signoff.server import TokenAuth, create_app
from signoff.server._auth import default_access
from signoff.server._context import ServerContext
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from ._cli import invoke
from .test_server_common import ADMIN, ALICE, MALLORY, TOKENS, auth

SERVED = ("desk", "mom", "kid", "dad")  # the server's runtime has these; not remote, nor rkid
CALLERS = ("alice", "mallory", "admin")
REQUEST_FILTERS: list[dict[str, Any]] = [
    {},
    {"agent": "remote"},
    {"agent": "dad"},
    {"tool": "refund"},
    {"older_than": 10},
    {"status": "settled"},
    {"status": "expired"},
]
SESSION_FILTERS: list[dict[str, Any]] = [
    {},
    {"agent": "remote"},
    {"status": "waiting"},
    {"status": "failed"},
    {"status": "idle"},
    {"agent": "remote", "status": "waiting"},
]


def _script(conversation: list[so.Message]) -> so.ModelResponse:
    """Calls the tool the prompt names (a subagent: with a message), then says it is done."""
    if any(isinstance(m, so.ToolResultMessage) for m in conversation):
        return reply("done")
    prompt = next(m.text for m in conversation if isinstance(m, so.UserMessage))
    name, _, child = prompt.partition(" ")
    return call_tools(call(name, message=child) if child else call(name, order_id="1"))


def _agents() -> list[so.Agent]:
    """`desk` (served) and `remote` (not) with approvals of each kind of deadline; `mom`
    delegating to `kid` (TTL 60 s, no deadline), `dad` to `rkid` (not served, deadline 30 s)."""

    def tool(name: str, approval: Any) -> so.Tool:
        async def run(order_id: str) -> str:
            return "ok"

        run.__name__ = name
        run.__doc__ = f"{name} an order."
        return so.tool(approval=approval)(run)

    tools = [
        tool("refund", so.always(expires_in=60)),
        tool("escalating", so.always(expires_in=60, on_timeout="escalate", escalate_to="leads")),
        tool("lenient", so.always(expires_in=60, on_timeout="approve")),
        tool("plain", so.always()),
    ]
    quick = tool("quick", so.always(expires_in=30))

    def agent(name: str, tools: list[so.Tool], ttl: float | None = None) -> so.Agent:
        limits = None if ttl is None else so.Limits(ttl=ttl)
        return scripted_agent(name, [_script], tools=tools, limits=limits, repeat_last=True)

    return [
        agent("desk", tools),
        agent("remote", tools, ttl=150),
        agent("mom", [so.delegate("kid")]),
        agent("kid", [tools[3]], ttl=60),
        agent("dad", [so.delegate("rkid")]),
        agent("rkid", [quick]),
    ]


async def _build(rt: so.Runtime, clock: ManualClock) -> None:
    """The store's states: open requests of both tenants, served and not, with deadlines of
    each kind; mirrors; a settled, a withdrawn request; more asked 20 s later."""
    for agent, prompt, who in [
        ("desk", "refund", ALICE),
        ("desk", "escalating", ALICE),
        ("desk", "lenient", MALLORY),
        ("remote", "refund", ALICE),
        ("remote", "escalating", MALLORY),
        ("remote", "lenient", ALICE),
        ("remote", "plain", ALICE),
        ("mom", "kid plain", ALICE),
        ("dad", "rkid quick", ALICE),
        ("dad", "rkid quick", MALLORY),
    ]:
        await rt.generate(agent, prompt=prompt, auth=who)
    settled = await rt.generate("desk", prompt="plain", auth=ALICE)
    answer = {"request_id": settled.pending[0].id, "option_id": "approve"}
    await rt.respond(settled.session_id, [answer], principal=ALICE)
    withdrawn = await rt.generate("desk", prompt="plain", auth=MALLORY)
    await rt.cancel(withdrawn.session_id)
    clock.advance(20)
    for agent, prompt, who in [
        ("desk", "refund", ALICE),
        ("remote", "refund", ALICE),
        ("remote", "plain", MALLORY),
    ]:
        await rt.generate(agent, prompt=prompt, auth=who)


async def _listed(c: httpx.AsyncClient, path: str, who: str, params: dict[str, Any]) -> int:
    """Checks a listing against its total: all of it in one page is `total` items, and paged
    three at a time it is the same items, each page full until the total and empty past it
    (for the unfiltered listing; a filtered one has its last offset and the one past checked).
    Returns the total."""

    async def page(limit: int, offset: int) -> tuple[list[str], int]:
        query = {**params, "limit": limit, "offset": offset}
        body = (await c.get(path, params=query, headers=auth(f"{who}-token"))).json()
        return [item["id"] for item in body["items"]], body["total"]

    whole, total = await page(500, 0)
    assert len(whole) == total, (who, path, params, whole, total)
    offsets = range(0, total + 1, 3) if not params else [max(total - 1, 0), total]
    step = 3 if not params else 1
    seen: list[str] = []
    for offset in offsets:
        ids, again = await page(step, offset)
        assert again == total and ids == whole[offset : offset + step], (who, path, offset)
        seen += ids
    if not params:
        assert seen == whole, (who, path)
    return total


async def _dashboard(c: httpx.AsyncClient, who: str) -> tuple[int, int]:
    """The badge on the dashboard's page and the queue fragment's `X-Total-Count`."""
    c.cookies.clear()
    login = (await c.get("/_signoff/login")).text
    csrf = re.search(r'name="csrf-token" content="([^"]+)"', login)
    assert csrf is not None
    form = {"token": f"{who}-token", "csrf": csrf.group(1)}
    assert (await c.post("/_signoff/login", data=form)).status_code == 303
    badge = re.search(r'id="queue-count"[^>]*>(\d+)<', (await c.get("/_signoff")).text)
    assert badge is not None
    fragment = await c.get("/_signoff/fragments/queue")
    c.cookies.clear()
    return int(badge.group(1)), int(fragment.headers["X-Total-Count"])


def _cli_totals(url: str) -> tuple[int, int]:
    """The total `signoff pending --limit 1` prints (`1 of N`, or the one it lists), and how
    many `--limit 500` lists (by the wall clock: every deadline and TTL here long passed)."""
    one = invoke("pending", "--store", url, "--limit", "1")
    assert one.exit_code == 0, one.output
    shown = re.search(r"Pending requests \((\d+)(?: of (\d+))?\)", one.output)
    total = 0 if shown is None else int(shown.group(2) or shown.group(1))
    every = invoke("pending", "--store", url, "--limit", "500", "--json")
    assert every.exit_code == 0, every.output
    return total, len(json.loads(every.output))


def _own_rule(caller: so.Principal, initiator: so.Principal | None) -> bool:
    """The default rule, as a rule of one's own: the server then filters the queue itself."""
    return default_access(caller, initiator)


@asynccontextmanager
async def _served(store_url: str) -> AsyncIterator[tuple[ManualClock, so.Runtime]]:
    """The store built (`_build`), and a runtime of the `SERVED` agents on it, at 20 s."""
    clock = ManualClock()
    async with so.Runtime(_agents(), store=store_url, clock=clock) as rt:
        await _build(rt, clock)
    served = [a for a in _agents() if a.name in SERVED]
    async with so.Runtime(served, store=store_url, clock=clock) as rt:
        yield clock, rt


# Each moment's advance: at 20 s nothing passed; at 35 s `rkid`'s deadlines; at 65 s the first
# 60 s deadlines and `kid`'s TTL; at 90 s the later deadlines; at 190 s `remote`'s TTL.
STEPS = (0, 15, 30, 25, 100)
QUEUES = {
    "admin": [16, 12, 6, 4, 1],
    "alice": [11, 9, 4, 2, 1],
    "mallory": [5, 3, 2, 2, 0],
}


async def test_the_queues_totals_are_what_their_listings_page_to(store_url: str) -> None:
    """`GET /v1/requests` for an admin, a tenant's user and another tenant's, under every
    filter: as the clock passes each deadline and TTL, the total is what the listing pages to,
    and the queue shrinks as it should, what this server cannot close no longer offered."""
    async with _served(store_url) as (clock, rt):
        app = create_app(rt, auth=TokenAuth(TOKENS))
        queues: dict[str, list[int]] = {who: [] for who in CALLERS}
        async with _client(app) as c:
            for step in STEPS:
                clock.advance(step)
                for who in CALLERS:
                    for params in REQUEST_FILTERS:
                        total = await _listed(c, "/v1/requests", who, params)
                        if not params:
                            queues[who].append(total)
    assert queues == QUEUES


async def test_the_totals_of_sessions_are_what_their_listings_page_to(store_url: str) -> None:
    """`GET /v1/sessions`, for each caller and filter, before and after `kid`'s and `remote`'s
    sessions passed their TTLs (`remote`'s unrecorded: this server does not run it)."""
    async with _served(store_url) as (clock, rt):
        app = create_app(rt, auth=TokenAuth(TOKENS))
        failed: list[int] = []
        async with _client(app) as c:
            for step in (0, 45, 125):  # at 20 s, 65 s and 190 s
                clock.advance(step)
                for who in CALLERS:
                    for params in SESSION_FILTERS:
                        total = await _listed(c, "/v1/sessions", who, params)
                        if who == "admin" and params == {"status": "failed"}:
                            failed.append(total)
    assert failed == [0, 1, 7]  # `kid`'s, then `remote`'s six too


async def test_every_count_of_the_queue_is_its_total(store_url: str) -> None:
    """Asked first at each moment, before any listing records a deadline: the live stream's
    count (each caller's and every request's), the metrics gauge, the dashboard's badge and
    `X-Total-Count`, `Client.pending()`, a listing under a rule of one's own, and then
    `signoff pending`, all agree with the total of `GET /v1/requests`."""
    async with _served(store_url) as (clock, rt):
        app = create_app(rt, auth=TokenAuth(TOKENS), metrics=True)
        ruled = create_app(rt, auth=TokenAuth(TOKENS), access=_own_rule)
        ctx = app.state.signoff
        assert isinstance(ctx, ServerContext)
        async with _client(app) as c, _client(ruled) as own:
            for step in STEPS:
                clock.advance(step)
                streams = {
                    who: (await ctx.queue_version(p))[0]
                    for who, p in (("alice", ALICE), ("mallory", MALLORY), ("admin", ADMIN))
                }
                every = (await ctx.open_requests_version())[0]
                metrics = (await c.get("/metrics", headers=auth("admin-token"))).text
                gauge = re.search(r"^signoff_open_requests (\d+)", metrics, re.M)
                assert gauge is not None
                queues = {who: await _listed(c, "/v1/requests", who, {}) for who in CALLERS}
                assert streams == queues
                assert every == int(gauge.group(1)) == queues["admin"]
                for who in ("alice", "admin"):
                    assert await _dashboard(c, who) == (queues[who], queues[who]), who
                for who in ("alice", "mallory"):
                    assert await _listed(own, "/v1/requests", who, {}) == queues[who]
                    assert await _listed(own, "/v1/requests", who, {"agent": "remote"}) >= 0
                client = so.AsyncClient(
                    "http://t", token="mallory-token", transport=httpx.ASGITransport(app=app)
                )
                async with client:
                    assert (await client.pending(limit=1))[1] == queues["mallory"]
        total, listed = await asyncio.to_thread(_cli_totals, store_url)
        assert total == listed, (total, listed)


@asynccontextmanager
async def _client(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        yield c
