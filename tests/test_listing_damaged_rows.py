"""A listing people read (`rt.pending()`, `rt.sessions()`, `GET /v1/requests`,
`GET /v1/sessions`, the dashboard) with one row a hand edit damaged: that row is logged and
left out, so one damaged session does not fail every caller's listing; it keeps its place among
those listed (a page may show fewer than its limit, the total counts it), and reading it by
itself (the store's own listing, its session) is still `StoreDamaged`.

Both stores where the fixtures allow (`store_url`)."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

import signoff as so
from signoff.cli import app as cli_app
from signoff.server import TokenAuth, create_app, default_access
from signoff.server._context import ServerContext
from signoff.stores import PendingFilter
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from .test_store_edited_rows import edit

T0 = 1_700_000_000.0


def gated_agent() -> so.Agent:
    @so.tool(approval=so.ApprovalSpec(request=so.always(), expires_in=60, on_timeout="deny"))
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return f"refunded {order_id}"

    steps = [call_tools(call("issue_refund", order_id="1")), reply("done")] * 2
    return scripted_agent("support", steps, tools=[issue_refund])


async def three_parked(url: str) -> list[so.GenerateResult]:
    """Three sessions each waiting for an approval, a second apart (the first is oldest)."""
    clock = ManualClock(T0)
    made = []
    async with so.Runtime([gated_agent()], store=url, clock=clock) as rt:
        for i in range(3):
            made.append(await rt.generate("support", prompt=f"order {i}"))
            clock.advance(1)
    return made


def everyone(caller: so.Principal, initiator: so.Principal | None) -> bool:
    return True


@asynccontextmanager
async def served(rt: so.Runtime, **options: Any) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(rt, dev=True, sweep_every=None, **options)
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 1234))
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
        yield c


async def test_a_damaged_request_row_is_left_out_of_the_queue(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A request row whose data does not decode failed the queue of every caller:
    `rt.pending()`, `GET /v1/requests` (503), the dashboard's home, the expired listing."""
    made = await three_parked(store_url)
    bad = made[0].pending[0]
    edit(store_url, "UPDATE {t}requests SET data = {p} WHERE id = {p}", b"garbage", bad.id)
    others = [m.pending[0].id for m in made[1:]]
    clock = ManualClock(T0 + 5)
    async with so.Runtime([gated_agent()], store=store_url, clock=clock) as rt:
        with caplog.at_level(logging.WARNING, logger="signoff"):
            assert [r.id for r in await rt.pending()] == others
        assert [r for r in caplog.records if bad.id in r.getMessage()], caplog.text
        with pytest.raises(so.StoreDamaged, match=bad.id):  # the store's own listing names it
            await rt.store.pending(PendingFilter())
        # Page by page, it keeps its place: the first page is empty and says more follow.
        pages = [await rt.pending_page(PendingFilter(limit=1, offset=i)) for i in range(3)]
        assert [([r.id for r in p], more) for p, more in pages] == [
            ([], True),
            (others[:1], True),
            (others[1:], True),
        ]
        async with served(rt) as c, served(rt, access=everyone) as ruled:
            for client in (c, ruled):
                r = await client.get("/v1/requests")
                assert r.status_code == 200, r.text
                assert [i["id"] for i in r.json()["items"]] == others
            r = await c.get("/v1/requests", params={"limit": 1, "offset": 1})
            assert r.status_code == 200, r.text
            assert ([i["id"] for i in r.json()["items"]], r.json()["total"]) == (others[:1], 3)
            for page in ("/_signoff/", "/_signoff/fragments/queue"):
                r = await c.get(page)
                assert r.status_code == 200, (page, r.text[:300])
            clock.advance(120)  # every deadline passed: the expired listing records them first
            r = await c.get("/v1/requests", params={"status": "expired"})
            assert r.status_code == 200, r.text
            assert [i["id"] for i in r.json()["items"]] == others


async def test_a_damaged_session_row_is_left_out_of_the_sessions_listing(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A session row whose `updated_at` is no number (text SQLite keeps, PostgreSQL's
    '-infinity') failed every caller's listing of sessions: `rt.sessions()`, `GET /v1/sessions`
    (also under an app's own `access=` rule), the dashboard's sessions page."""
    made = await three_parked(store_url)
    bad = made[0].session_id
    value: Any = "x" if store_url.startswith("sqlite") else -math.inf
    edit(store_url, "UPDATE {t}sessions SET updated_at = {p} WHERE id = {p}", value, bad)
    others = {m.session_id for m in made[1:]}
    async with so.Runtime([gated_agent()], store=store_url, clock=ManualClock(T0 + 5)) as rt:
        with caplog.at_level(logging.WARNING, logger="signoff"):
            assert {s.id for s in await rt.sessions()} == others
        assert [r for r in caplog.records if bad in r.getMessage()], caplog.text
        with pytest.raises(so.StoreDamaged, match=bad):  # the store's own listing names it
            await rt.store.sessions()
        paged = [s.id for i in range(3) for s in await rt.sessions(limit=1, offset=i)]
        assert sorted(paged) == sorted(others)
        async with served(rt) as c, served(rt, access=everyone) as ruled:
            # The store counts it; a scan under an app's own rule, which cannot tell whether the
            # caller may see it, counts those it shows.
            for client, total in ((c, 3), (ruled, 2)):
                r = await client.get("/v1/sessions")
                assert r.status_code == 200, r.text
                assert {i["id"] for i in r.json()["items"]} == others
                assert r.json()["total"] == total
            r = await c.get("/_signoff/sessions")
            assert r.status_code == 200, r.text[:300]
            r = await c.get(f"/v1/sessions/{made[1].session_id}")
            assert r.status_code == 200, r.text


async def test_a_status_no_signoff_writes_is_store_damaged(store_url: str) -> None:
    """A session row's status a hand edit set to text no signoff writes was listed as that
    status (`rt.sessions()`, `GET /v1/sessions`) though its state reads another; a request
    row's is `StoreDamaged` naming it. Either is left out of the listings people read."""
    made = await three_parked(store_url)
    bad, odd = made[0].session_id, made[1].pending[0].id
    edit(store_url, "UPDATE {t}sessions SET status = 'bogus' WHERE id = {p}", bad)
    edit(store_url, "UPDATE {t}requests SET status = 'bogus' WHERE id = {p}", odd)
    async with so.Runtime([gated_agent()], store=store_url, clock=ManualClock(T0 + 5)) as rt:
        with pytest.raises(so.StoreDamaged, match=f"'{bad}' is damaged: its status is 'bogus'"):
            await rt.store.sessions()
        assert {s.id for s in await rt.sessions()} == {m.session_id for m in made[1:]}
        assert (await rt.state(bad)).status == "waiting"  # its log says so
        with pytest.raises(so.StoreDamaged, match=odd):
            await rt.store.get_request(odd)
        every = [r.id for r in await rt.pending(PendingFilter(status=None))]
        assert every == [made[0].pending[0].id, made[2].pending[0].id]


def _two_calls_agent() -> so.Agent:
    """One reply asking for two approvals, in a session with a 30 s TTL."""

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return f"refunded {order_id}"

    steps = [call_tools(call("issue_refund", order_id="1"), call("issue_refund", order_id="2"))]
    return scripted_agent(
        "support", [*steps, reply("done")], tools=[issue_refund], limits=so.Limits(ttl=30)
    )


async def test_a_damaged_row_in_a_session_past_its_ttl_is_left_out_of_every_listing(
    store_url: str,
) -> None:
    """The listings that read a TTL-lapsed session's open requests to record or show its
    expiry (`_record_expiries`, `_lapsed_on`) read them with the store's own listing, which
    a damaged row among them failed: the expired listing and that of every status raised."""
    clock = ManualClock(T0)
    async with so.Runtime([_two_calls_agent()], store=store_url, clock=clock) as rt:
        bad, kept = (await rt.generate("support", prompt="orders 1 and 2")).pending
    edit(store_url, "UPDATE {t}requests SET data = {p} WHERE id = {p}", b"garbage", bad.id)
    clock.advance(40)  # the session's TTL passed, nothing recorded
    async with so.Runtime([_two_calls_agent()], store=store_url, clock=clock) as rt:
        every = {r.id: r.status for r in await rt.pending(PendingFilter(status=None))}
        assert every == {kept.id: "expired"}
        expired = await rt.pending(PendingFilter(status="expired"))
        assert [r.id for r in expired] == [kept.id]


async def test_a_damaged_row_past_its_deadline_is_left_out_of_the_servers_queue(
    store_url: str,
) -> None:
    """The server's queue reads the requests past a deadline (to record them, and to leave out
    those it cannot record) with the store's own listing: a damaged row among them, which can
    never be recorded, answered 503 to `GET /v1/requests`, the dashboard's queue and `signoff
    pending` for as long as it stayed damaged."""
    made = await three_parked(store_url)
    bad = made[0].pending[0]
    edit(store_url, "UPDATE {t}requests SET data = {p} WHERE id = {p}", b"garbage", bad.id)
    clock = ManualClock(T0 + 120)  # every deadline passed, none recorded
    async with so.Runtime([gated_agent()], store=store_url, clock=clock) as rt:
        async with served(rt) as c:
            for page in ("/v1/requests", "/_signoff/", "/_signoff/fragments/queue"):
                r = await c.get(page)
                assert r.status_code == 200, (page, r.text[:300])
            assert (await c.get("/v1/requests")).json()["items"] == []
        assert await rt.pending() == []
    args = ["pending", "--store", store_url]
    result = await asyncio.to_thread(CliRunner().invoke, cli_app, args)
    assert result.exit_code == 0, result.output
    assert bad.id not in result.output


def _delegating_agents() -> list[so.Agent]:
    """`desk` delegates to `support`, whose approval (also asked in a session of its own) has a
    60 s deadline that denies it."""
    gated = gated_agent()
    desk = scripted_agent(
        "desk",
        [call_tools(call("support", call_id="d1", message="Refund 1")), reply("done")],
        tools=[so.delegate("support")],
    )
    return [desk, gated]


async def test_a_damaged_subagent_request_behind_a_mirror_is_left_out_of_the_queue(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A subagent's request row that does not read back, behind its parent's open mirror: once
    its deadline passed, what the queue leaves out (`_unlisted`) followed every mirror in one
    read, which it failed, so `GET /v1/requests`, the dashboard's queue and its stream's count,
    and `signoff pending` answered 503 (exit 1) for as long as it stayed damaged; the sessions
    listing read every passed deadline so, and listed each session they free as `waiting`."""
    clock = ManualClock(T0)
    async with so.Runtime(_delegating_agents(), store=store_url, clock=clock) as rt:
        (mirror,) = (await rt.generate("desk", prompt="Handle it")).pending
        freed = (await rt.generate("support", prompt="order 2")).session_id
        clock.advance(100)
        (kept,) = (await rt.generate("support", prompt="order 3")).pending  # open at +120
    assert mirror.child is not None
    bad = mirror.child.request_id
    edit(store_url, "UPDATE {t}requests SET data = {p} WHERE id = {p}", b"garbage", bad)
    clock = ManualClock(T0 + 120)  # the subagent's deadline and the second's passed, unrecorded
    async with so.Runtime(_delegating_agents(), store=store_url, clock=clock) as rt:
        # Read first: the queue's listings record passed deadlines (its turn then goes on).
        assert {s.id: s.status for s in await rt.sessions()}[freed] == "running"
        assert (await rt.state(freed)).status == "running"  # as it shows it, deny unrecorded
        async with served(rt) as c:
            r = await c.get("/v1/sessions", params={"status": "running"})
            assert r.status_code == 200, r.text
            assert freed in [i["id"] for i in r.json()["items"]]
        with caplog.at_level(logging.WARNING, logger="signoff"):
            assert [r.id for r in await rt.pending()] == [kept.id]
        assert [r for r in caplog.records if bad in r.getMessage()], caplog.text
        async with served(rt) as c:
            r = await c.get("/v1/requests")
            assert r.status_code == 200, r.text
            assert [i["id"] for i in r.json()["items"]] == [kept.id]
            for page in ("/_signoff/", "/_signoff/fragments/queue"):
                r = await c.get(page)
                assert r.status_code == 200, (page, r.text[:300])
        # The count the dashboard's queue stream polls, which ended that stream.
        ctx = ServerContext(runtime=rt, auth=TokenAuth({}), access=default_access, secret=b"k" * 32)
        total, _ = await ctx.open_requests_version()
        assert total >= 1
    args = ["pending", "--store", store_url]  # on the real clock: every deadline passed
    result = await asyncio.to_thread(CliRunner().invoke, cli_app, args)
    assert result.exit_code == 0, result.output
    assert mirror.id not in result.output


async def test_a_damaged_row_past_its_deadline_leaves_the_others_freed(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The sessions listing reads the requests past their deadline, which free their sessions
    (`running` while the store holds them `waiting`), with the store's own listing: one damaged
    row among them listed every other such session as `waiting` in `rt.sessions()` and
    `GET /v1/sessions`, and the `running` filter left them out, though `rt.state()` shows them
    running. That row is logged and left out; its own session is listed as the store holds it."""
    made = await three_parked(store_url)
    bad = made[0].pending[0]
    edit(store_url, "UPDATE {t}requests SET data = {p} WHERE id = {p}", b"garbage", bad.id)
    freed = {m.session_id for m in made[1:]}
    clock = ManualClock(T0 + 120)  # every deadline (deny) passed, none recorded
    async with so.Runtime([gated_agent()], store=store_url, clock=clock) as rt:
        with caplog.at_level(logging.WARNING, logger="signoff"):
            listed = {s.id: s.status for s in await rt.sessions()}
        assert [r for r in caplog.records if bad.id in r.getMessage()], caplog.text
        assert {sid: listed[sid] for sid in freed} == dict.fromkeys(freed, "running")
        assert made[0].session_id in listed
        assert freed <= {s.id for s in await rt.sessions(status="running")}
        assert freed.isdisjoint(s.id for s in await rt.sessions(status="waiting"))
        async with served(rt) as c:
            r = await c.get("/v1/sessions")
            assert r.status_code == 200, r.text
            shown = {i["id"]: i["status"] for i in r.json()["items"]}
            assert {sid: shown[sid] for sid in freed} == dict.fromkeys(freed, "running")
            r = await c.get("/v1/sessions", params={"status": "running"})
            assert freed <= {i["id"] for i in r.json()["items"]}
        assert {(await rt.state(sid)).status for sid in freed} == {"running"}
