"""A listing of the queue that meets passed deadlines records them all before it goes on with
any turn they make runnable, and goes on with those turns `SWEEP_DRIVES` at once, as a sweep
does: one after another, a listing took as long as all their model calls together."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

import signoff as so
from signoff import _sweeping
from signoff._sweeping import SWEEP_DRIVES, SweepDrives
from signoff.server import TokenAuth, create_app
from signoff.stores import PendingFilter
from signoff.testing import ExecutionLog, ManualClock, call, call_tools, reply, scripted_agent

from ._dashboard import csrf_of
from .test_deadlines import ALICE, payout_agent
from .test_runtime import types_of

SESSIONS = SWEEP_DRIVES + 2


async def test_a_listing_records_every_deadline_before_it_drives_their_turns(
    store_url: str,
) -> None:
    """Before, `rt.pending()` recorded one session's deadline, drove its turn to the end, then
    the next: with 6 due sessions and a model taking 0.5 s, the listing took 3.1 s, and at the
    first resumed model call only 1 of the 6 deadlines was recorded."""
    clock = ManualClock()
    agent = payout_agent(ExecutionLog(), so.always(expires_in=60))
    complete = agent.model.complete
    resumed = {"running": 0, "most": 0, "seen": 0}
    expired_at_first: list[int] = []
    together = asyncio.Event()

    async def slow(request: Any) -> so.ModelResponse:
        if clock.now > start:  # a turn the deadline made runnable
            resumed["running"] += 1
            if not resumed["seen"]:
                resumed["seen"] = 1
                closed = await rt.store.pending(so.stores.PendingFilter(status="expired"))
                expired_at_first.append(len(closed))
            resumed["most"] = max(resumed["most"], resumed["running"])
            if resumed["running"] == SWEEP_DRIVES:
                together.set()
            # Held until as many run at once as may (2 s at most: one at a time, as before).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(together.wait(), 2)
            resumed["running"] -= 1
        return await complete(request)

    agent.model.complete = slow  # type: ignore[method-assign]
    start = clock.now
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        sids = [(await rt.generate("pay", prompt="pay", auth=ALICE)).session_id for _ in range(6)]
        clock.advance(60)
        assert await rt.pending() == []
        assert expired_at_first == [SESSIONS]
        assert resumed["most"] == SWEEP_DRIVES
        for sid in sids:  # each turn moved on, as before
            state = await rt.state(sid)
            assert state.turn is not None and state.turn.status == "completed"


async def test_a_listing_passes_over_a_session_deleted_after_it_read_the_page(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Another process cancels and deletes a session between the listing's read of its passed
    deadline and the recording of it: the listing shows the rest, with their deadlines
    recorded, and logs nothing. Before, `rt.pending()` raised `UnknownSession` for a session
    the caller never asked about (`GET /v1/requests` answered 404), recording no other's."""
    clock = ManualClock()
    agent = payout_agent(ExecutionLog(), so.always(expires_in=60))
    async with (
        so.Runtime([agent], store=store_url, clock=clock) as rt,
        so.Runtime([agent], store=store_url, clock=clock) as other,
    ):
        gone, kept = [(await rt.generate("pay", prompt="pay", auth=ALICE)).session_id for _ in "ab"]
        clock.advance(60)
        listed = rt.store.pending
        deleted: list[str] = []

        async def pending(flt: so.stores.PendingFilter) -> list[so.InputRequest]:
            page = await listed(flt)
            if not deleted and any(r.session_id == gone for r in page):
                await other.cancel(gone)
                deleted.extend(await other.delete_session(gone))
            return page

        rt.store.pending = pending  # type: ignore[method-assign]
        with caplog.at_level(logging.WARNING, logger="signoff"):
            assert await rt.pending() == []
        assert deleted == [gone]
        assert [r.message for r in caplog.records] == []
        state = await rt.state(kept)  # its deadline recorded, its turn gone on with
        assert state.turn is not None and state.turn.status == "completed"
        with pytest.raises(so.UnknownSession):
            await rt.state(gone)


async def test_a_sweep_passes_over_a_session_deleted_after_it_listed_it(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The same between an expiry sweep's listing of a session whose TTL passed and the
    recording of its expiry (a prune in another process): before, the sweep logged an ERROR
    with `UnknownSession`'s traceback."""
    clock = ManualClock()

    @so.tool(approval=so.always())
    async def pay_invoice(invoice: str) -> str:
        """Pay an invoice."""
        return "paid"

    agent = scripted_agent(
        "pay",
        [call_tools(call("pay_invoice", invoice="INV-7")), reply("done")],
        tools=[pay_invoice],
        limits=so.Limits(ttl=60),
    )
    async with (
        so.Runtime([agent], store=store_url, clock=clock) as rt,
        so.Runtime([agent], store=store_url, clock=clock) as other,
    ):
        sid = (await rt.generate("pay", prompt="pay", auth=ALICE)).session_id
        clock.advance(120)
        lapsed = rt._lapsed
        pruned: list[str] = []

        async def pruning(*args: Any, **kw: Any) -> Any:
            rows = await lapsed(*args, **kw)
            if not pruned and any(r.id == sid for r in rows):
                pruned.extend(await other.prune(older_than=60))
            return rows

        rt._lapsed = pruning  # type: ignore[method-assign]
        with caplog.at_level(logging.WARNING, logger="signoff"):
            await rt.expire_due()
        assert pruned == [sid]
        assert [r.message for r in caplog.records] == []


async def test_a_sweeps_background_drive_passes_over_a_session_deleted_before_it_began(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """`serve`'s sweep hands a turn its deadline made runnable to `SweepDrives`; another process
    cancels and deletes the session before that drive begins (it waits behind others): nothing
    is logged. Before, an ERROR with `UnknownSession`'s traceback."""
    clock = ManualClock()
    agent = payout_agent(ExecutionLog(), so.always(expires_in=60))
    async with (
        so.Runtime([agent], store=store_url, clock=clock) as rt,
        so.Runtime([agent], store=store_url, clock=clock) as other,
    ):
        sid = (await rt.generate("pay", prompt="pay", auth=ALICE)).session_id
        clock.advance(60)
        drives = SweepDrives(rt)
        deleting: list[asyncio.Task[None]] = []
        start = drives.start

        def deleted_first(session_id: str, lease_wait: float | None = None) -> None:
            async def gone() -> None:
                await other.cancel(session_id)
                await other.delete_session(session_id)
                start(session_id, lease_wait)

            deleting.append(asyncio.create_task(gone()))

        drives.start = deleted_first  # type: ignore[method-assign]
        with caplog.at_level(logging.WARNING, logger="signoff"):
            with drives.handing():
                assert await rt.expire_due() == 1
            await asyncio.gather(*deleting)
            await asyncio.gather(*drives.tasks.values())
        assert [r.message for r in caplog.records] == []
        with pytest.raises(so.UnknownSession):
            await rt.state(sid)


async def _lapsed_request(store_url: str, clock: ManualClock) -> tuple[str, str]:
    """A session waiting on a request whose deadline then passes, nothing recording it."""
    async with so.Runtime([_payer()], store=store_url, clock=clock) as rt:
        r = await rt.generate("pay", prompt="pay", auth=ALICE)
    clock.advance(61)
    return r.session_id, r.pending[0].id


def _payer() -> so.Agent:
    return payout_agent(ExecutionLog(), so.always(expires_in=60))


async def test_a_listing_of_expired_requests_holds_one_whose_deadline_passed_unrecorded(
    store_url: str,
) -> None:
    """`state()` showed the request `expired`, but `pending_page(status="expired")` listed
    nothing until some read recorded the deadline: it records it first, as the queue does,
    and lists it (the turn goes on). A listing of every status shows it `expired` too."""
    clock = ManualClock()
    sid, rid = await _lapsed_request(store_url, clock)
    async with so.Runtime([_payer()], store=store_url, clock=clock) as rt:
        assert (await rt.state(sid)).requests[rid].status == "expired"
        page, more = await rt.pending_page(PendingFilter(status="expired"))
        assert ([(r.id, r.status) for r in page], more) == ([(rid, "expired")], False)
        assert (await rt.state(sid)).status == "idle"  # recorded, and the turn went on
    sid, rid = await _lapsed_request(store_url, clock)
    async with so.Runtime([_payer()], store=store_url, clock=clock) as rt:
        page, _ = await rt.pending_page(PendingFilter(status=None, session_id=sid))
        assert [(r.id, r.status) for r in page] == [(rid, "expired")]
        assert (await rt.state(sid)).status == "idle"


async def test_a_listing_of_every_status_without_the_agent_shows_a_passed_deadline_closed(
    store_url: str,
) -> None:
    """A runtime without the agent cannot record the deadline: a listing of every status left
    the request out (its total counted it); it shows it as the deadline leaves it, `expired`,
    writing nothing."""
    clock = ManualClock()
    sid, rid = await _lapsed_request(store_url, clock)
    async with so.Runtime([], store=store_url, clock=clock) as reader:
        before = await types_of(reader, sid)
        page, _ = await reader.pending_page(PendingFilter(status=None))
        assert [(r.id, r.status) for r in page] == [(rid, "expired")]
        assert await types_of(reader, sid) == before


@pytest.mark.parametrize("rule", ["default", "own"])
async def test_the_http_listing_of_expired_requests_holds_a_passed_deadline(
    store_url: str, rule: str
) -> None:
    """A server with the agent: `GET /v1/requests?status=expired` listed and counted nothing
    (the dashboard's audit page alike) until `GET /v1/requests/{id}` recorded the deadline;
    it records it first, under the default rule and under an app's own, which it filters by."""
    clock = ManualClock()
    sid, rid = await _lapsed_request(store_url, clock)
    runtime = so.Runtime([_payer()], store=store_url, clock=clock)
    async with served(runtime, rule) as c:
        body = (await c.get("/v1/requests", params={"status": "expired"})).json()
        assert (body["total"], [i["id"] for i in body["items"]]) == (1, [rid])
        assert (await c.get(f"/v1/sessions/{sid}")).json()["status"] == "idle"
        _, later = await _lapsed_request(store_url, clock)
        page = await c.get("/_signoff/login")
        signed = {"token": "tok", "csrf": csrf_of(page.text)}
        assert (await c.post("/_signoff/login", data=signed)).status_code == 303
        audit = (await c.get("/_signoff/audit", params={"status": "expired"})).text
        assert rid in audit and later in audit


DUE = 12  # sessions whose deadline passed during an outage
PAGE = 3  # the listing's page


class _SlowPayers:
    """`DUE` sessions of a payer waiting on a request whose deadline then passed, nothing
    recording it; the model a resumed turn calls takes 0.05 s, and `calls` counts those calls."""

    def __init__(self) -> None:
        self.clock = ManualClock()
        self.agent = payout_agent(ExecutionLog(), so.always(expires_in=60))
        self.calls = 0
        self.sids: list[str] = []
        complete = self.agent.model.complete
        start = self.clock.now

        async def slow(request: Any) -> so.ModelResponse:
            if self.clock.now > start:  # a turn the deadline made runnable
                self.calls += 1
                await asyncio.sleep(0.05)
            return await complete(request)

        self.agent.model.complete = slow  # type: ignore[method-assign]

    async def lapsed(self, rt: so.Runtime) -> None:
        for _ in range(DUE):
            self.sids.append((await rt.generate("pay", prompt="pay", auth=ALICE)).session_id)
        self.clock.advance(61)

    async def completed(self, rt: so.Runtime) -> set[str]:
        """The sessions whose turn went on to its end."""
        done = set()
        for sid in self.sids:
            turn = (await rt.state(sid)).turn
            if turn is not None and turn.status == "completed":
                done.add(sid)
        return done


@pytest.mark.parametrize("via", ["runtime", "default", "own"])
async def test_a_listing_of_expired_requests_drives_only_the_turns_of_its_page(
    store_url: str, via: str
) -> None:
    """A listing of expired requests recorded every passed deadline it would list (as it
    should: its total counts them), then drove every one of their turns, model calls and all,
    before it answered: 1,000 sessions due after an outage and a 0.2 s model took 52 s for a
    page of 10. It drives only those of its page (the rest are left to a sweep or a worker):
    at most `PAGE` model calls, the total still every one."""
    tree = _SlowPayers()
    runtime = so.Runtime([tree.agent], store=store_url, clock=tree.clock)
    async with runtime as rt:
        await tree.lapsed(rt)
        if via == "runtime":
            page, more = await rt.pending_page(PendingFilter(status="expired", limit=PAGE))
            ids, total = [r.session_id for r in page], None
            assert more
        else:
            extra: dict[str, Any] = {}
            if via == "own":
                extra["access"] = lambda caller, initiator: caller == initiator
            app = create_app(rt, auth=TokenAuth({"tok": ALICE}), sweep_every=None, **extra)
            transport = httpx.ASGITransport(app=app)
            headers = {"Authorization": "Bearer tok"}
            async with (
                app.router.lifespan_context(app),
                httpx.AsyncClient(transport=transport, base_url="http://t", headers=headers) as c,
            ):
                params = {"status": "expired", "limit": str(PAGE)}
                body = (await c.get("/v1/requests", params=params)).json()
            ids, total = [i["session_id"] for i in body["items"]], body["total"]
        assert len(ids) == PAGE and tree.calls <= PAGE, (ids, tree.calls)
        assert total in (None, DUE)
        assert await rt.store.count_pending(PendingFilter(status="expired")) == DUE
        assert await tree.completed(rt) == set(ids)  # the page's turns went on, no other


@pytest.mark.parametrize("then", ["expire_due", "worker"])
async def test_the_turns_an_expired_listing_left_are_driven_by_a_sweep_or_a_worker(
    store_url: str, then: str
) -> None:
    """The turns whose deadlines a listing of expired requests recorded but whose requests its
    page did not show: a later `expire_due` goes on with them (`_left_undriven`), and a
    worker's claims take them."""
    tree = _SlowPayers()
    flt = PendingFilter(status="expired", limit=PAGE)
    async with so.Runtime([tree.agent], store=store_url, clock=tree.clock) as rt:
        await tree.lapsed(rt)
        page, _ = await rt.pending_page(flt)
        assert await tree.completed(rt) == {r.session_id for r in page}
        if then == "expire_due":
            assert await rt.expire_due() == DUE - PAGE
        else:
            stop = asyncio.Event()
            working = asyncio.create_task(rt.work(stop=stop, idle_wait=0.05, sweep_every=3600))
            await _all_completed(tree, rt)
            stop.set()
            await asyncio.wait_for(working, 10)
        assert await tree.completed(rt) == set(tree.sids)
        assert tree.calls == DUE  # each turn went on once


async def _all_completed(tree: _SlowPayers, rt: so.Runtime) -> None:
    for _ in range(200):
        if len(await tree.completed(rt)) == DUE:
            return
        await asyncio.sleep(0.05)


async def test_serve_s_sweep_goes_on_with_the_turns_an_expired_listing_left(
    store_url: str,
) -> None:
    """In `serve` with no workers (`create_app`'s sweep, in its lifespan), the turns whose
    deadlines a listing of expired requests recorded and did not show are gone on with by the
    next sweep, in the background."""
    tree = _SlowPayers()
    async with so.Runtime([tree.agent], store=store_url, clock=tree.clock) as rt:
        await tree.lapsed(rt)
        app = create_app(rt, auth=TokenAuth({"tok": ALICE}), sweep_every=0.2)
        async with app.router.lifespan_context(app), _client(app) as c:
            params = {"status": "expired", "limit": str(PAGE)}
            assert len((await c.get("/v1/requests", params=params)).json()["items"]) == PAGE
            await _all_completed(tree, rt)
        assert await tree.completed(rt) == set(tree.sids)
        assert tree.calls == DUE


@contextlib.asynccontextmanager
async def served(runtime: so.Runtime, rule: str) -> AsyncIterator[httpx.AsyncClient]:
    """A client of an app serving `runtime` to alice (`tok`) with no sweep, closing it after,
    under the default access rule or (`rule="own"`) an app's own: each sees their own."""
    extra: dict[str, Any] = {}
    if rule == "own":
        extra["access"] = lambda caller, initiator: caller == initiator
    app = create_app(
        runtime, auth=TokenAuth({"tok": ALICE}), sweep_every=None, close_runtime=True, **extra
    )
    async with app.router.lifespan_context(app), _client(app) as c:
        yield c


def _client(app: Any) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app)
    headers = {"Authorization": "Bearer tok"}
    return httpx.AsyncClient(transport=transport, base_url="http://t", headers=headers)


async def _expired_page(
    rt: so.Runtime, c: httpx.AsyncClient | None, offset: int, limit: int
) -> list[str]:
    """The sessions of a page of the expired requests, by `rt.pending_page` or over HTTP."""
    if c is None:
        flt = PendingFilter(status="expired", limit=limit, offset=offset)
        return [r.session_id for r in (await rt.pending_page(flt))[0]]
    params = {"status": "expired", "limit": str(limit), "offset": str(offset)}
    return [i["session_id"] for i in (await c.get("/v1/requests", params=params)).json()["items"]]


@pytest.mark.parametrize("via", ["runtime", "default", "own"])
async def test_a_later_listing_goes_on_with_the_turns_its_page_shows_that_one_left(
    store_url: str, via: str
) -> None:
    """A listing of expired requests recorded every passed deadline but drove only its page's
    turns; a later one (page 2, or the first again) recorded nothing new, so it drove none of
    those it showed either: with neither a sweep nor a worker (an app that never calls
    `expire_due`, `create_app(sweep_every=None)`), nothing ever went on with them, their
    requests closed. A listing goes on with the turns its page shows that a recorded deadline
    left undriven: page 2 with its own, no other, and a page of every one with the rest."""
    tree = _SlowPayers()
    async with contextlib.AsyncExitStack() as stack:
        rt = await stack.enter_async_context(
            so.Runtime([tree.agent], store=store_url, clock=tree.clock)
        )
        await tree.lapsed(rt)
        c = None
        if via != "runtime":
            extra: dict[str, Any] = {}
            if via == "own":
                extra["access"] = lambda caller, initiator: caller == initiator
            app = create_app(rt, auth=TokenAuth({"tok": ALICE}), sweep_every=None, **extra)
            await stack.enter_async_context(app.router.lifespan_context(app))
            c = await stack.enter_async_context(_client(app))
        first = await _expired_page(rt, c, 0, PAGE)
        assert await tree.completed(rt) == set(first)
        second = await _expired_page(rt, c, PAGE, PAGE)
        assert len(second) == PAGE and not set(first) & set(second)
        assert await tree.completed(rt) == set(first) | set(second)  # its page's, no other
        assert len(await _expired_page(rt, c, 0, 100)) == DUE
        assert await tree.completed(rt) == set(tree.sids)
        assert tree.calls == DUE  # each turn went on once


async def test_a_session_s_read_goes_on_with_its_turn_a_listing_left(store_url: str) -> None:
    """`GET /v1/sessions/{id}` of a session whose deadline a listing of expired requests
    recorded and left undriven (not on its page) showed it `running` for ever where nothing
    sweeps; the read goes on with its turn, as it does with one whose deadline it records."""
    tree = _SlowPayers()
    async with so.Runtime([tree.agent], store=store_url, clock=tree.clock) as rt:
        await tree.lapsed(rt)
        app = create_app(rt, auth=TokenAuth({"tok": ALICE}), sweep_every=None)
        async with app.router.lifespan_context(app), _client(app) as c:
            first = await _expired_page(rt, c, 0, PAGE)
            sid = next(s for s in tree.sids if s not in first)
            body = (await c.get(f"/v1/sessions/{sid}")).json()
            assert (body["status"], body["turn"]["status"]) == ("idle", "completed"), body
        assert await tree.completed(rt) == {*first, sid}


def _counting(store: Any, names: tuple[str, ...]) -> dict[str, int]:
    """Count the calls of `store`'s methods `names` (patched on the instance)."""
    counts: dict[str, int] = {}
    for name in names:
        method = getattr(store, name)

        def counted(*args: Any, _name: str = name, _m: Any = method, **kw: Any) -> Any:
            counts[_name] = counts.get(_name, 0) + 1
            return _m(*args, **kw)

        setattr(store, name, counted)
    return counts


async def test_an_expired_listing_with_nothing_left_reads_no_session_s_state(
    store_url: str,
) -> None:
    """Every turn its deadline resumed went on to its end: a listing of the expired requests
    loaded the state of every session on its page to tell whether one was left undriven (a
    fresh runtime's listing of 500: 0.35 s became 2.8 s on PostgreSQL, 0.71 s warm). The
    store tells in one query which may be; none is, so no session's state is read."""
    tree = _SlowPayers()
    async with so.Runtime([tree.agent], store=store_url, clock=tree.clock) as rt:
        await tree.lapsed(rt)
        await rt.expire_due()
        assert await tree.completed(rt) == set(tree.sids)
    async with so.Runtime([tree.agent], store=store_url, clock=tree.clock) as rt:
        await rt.open()
        reads = _counting(rt.store, ("load", "head", "read_events", "lease_held"))
        for _ in ("cold", "warm"):
            page, _ = await rt.pending_page(PendingFilter(status="expired", limit=100))
            assert len(page) == DUE
            assert sum(reads.values()) <= 2, reads  # before: DUE loads, then DUE heads
            reads.clear()
    assert tree.calls == DUE


async def test_a_read_leaves_a_left_turn_another_drive_took_meanwhile_to_it(
    store_url: str,
) -> None:
    """A turn a listing left undriven is taken by another process's drive between a read's
    check of it and the read's drive: the read waited `lease_wait` (10 s) for that drive, then
    showed the session `running` all the same. It leaves it to that drive at once, as a sweep
    does (`expire_due`)."""
    tree = _SlowPayers()
    async with (
        so.Runtime([tree.agent], store=store_url, clock=tree.clock) as rt,
        so.Runtime([tree.agent], store=store_url, clock=tree.clock) as other,
    ):
        await tree.lapsed(rt)
        first = {
            r.session_id
            for r in (await rt.pending_page(PendingFilter(status="expired", limit=PAGE)))[0]
        }
        checked = rt._left_by_deadline

        async def taken_after(session_id: str) -> bool:
            left = await checked(session_id)
            if left:
                assert await other.store.acquire_lease(session_id, "x", 30.0, tree.clock.now)
            return left

        rt._left_by_deadline = taken_after  # type: ignore[method-assign]
        app = create_app(rt, auth=TokenAuth({"tok": ALICE}), sweep_every=None)
        async with app.router.lifespan_context(app), _client(app) as c:
            sid = next(s for s in tree.sids if s not in first)
            started = time.monotonic()
            body = (await c.get(f"/v1/sessions/{sid}")).json()
            assert body["status"] == "running"
            assert time.monotonic() - started < 3, rt.lease_wait
            started = time.monotonic()
            assert len(await _expired_page(rt, c, 0, 100)) == DUE
            assert time.monotonic() - started < 3
        assert await tree.completed(rt) == first
        assert tree.calls == PAGE


async def test_a_runtime_that_cannot_write_says_once_it_leaves_the_left_turns(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A runtime whose store refuses its writes (read-only to it, a hot standby) logged a
    warning for every turn left undriven on a listing's page, at every listing (9 each time).
    It says so once."""
    tree = _SlowPayers()
    async with so.Runtime([tree.agent], store=store_url, clock=tree.clock) as rt:
        await tree.lapsed(rt)
        await rt.pending_page(PendingFilter(status="expired", limit=PAGE))
    async with so.Runtime([tree.agent], store=store_url, clock=tree.clock) as reader:
        await reader.open()

        async def refuse(*args: Any, **kw: Any) -> Any:
            raise so.StoreError("the store is read-only to this process; nothing was written")

        reader.store.acquire_lease = refuse  # type: ignore[method-assign]
        said = []
        for _ in range(3):
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="signoff"):
                page, _ = await reader.pending_page(PendingFilter(status="expired", limit=100))
            assert len(page) == DUE
            said.append([r.getMessage() for r in caplog.records])
        assert len(said[0]) == 1 and "read-only" in said[0][0], said[0]
        assert said[1:] == [[], []]
    assert tree.calls == PAGE


@pytest.mark.parametrize("ids", [True, False], ids=["ids", "no-ids"])
async def test_an_expired_listing_asks_the_store_of_its_page_not_of_every_left_turn(
    store_url: str, monkeypatch: pytest.MonkeyPatch, ids: bool
) -> None:
    """`DUE` turns left undriven (a listing recorded every deadline and drove its page's; no
    sweep since): a listing of `PAGE` of them read every left turn of the agent, page after
    page of `running_unheld`, to keep its page's (3,000: 6 queries and 0.1 s a listing,
    SQLite). It asks about its page's sessions only, one query a `_SWEEP_PAGE` of them (2
    here); a store whose `running_unheld` takes no `ids` has each read (`_left_of`)."""
    monkeypatch.setattr(_sweeping, "_SWEEP_PAGE", 2)
    tree = _SlowPayers()
    async with so.Runtime([tree.agent], store=store_url, clock=tree.clock) as rt:
        await tree.lapsed(rt)
        await rt.pending_page(PendingFilter(status="expired", limit=PAGE))
    assert tree.calls == PAGE
    async with so.Runtime([tree.agent], store=store_url, clock=tree.clock) as rt:
        await rt.open()
        rows: list[int] = []  # the rows of each `running_unheld` query
        query = rt.store.running_unheld  # type: ignore[attr-defined]

        async def counted(*args: Any, **kw: Any) -> Any:
            found = await query(*args, **kw)
            rows.append(len(found))
            return found

        async def earlier(
            agent: str, now: float, *, last_types: Any, among: Any = None, **page: Any
        ) -> Any:
            """As a store for an earlier signoff has it: `limit` and `after`, no `ids`."""
            assert set(page) <= {"limit", "after"}
            return await counted(agent, now, last_types=last_types, among=among, **page)

        counted.__signature__ = inspect.signature(query)  # type: ignore[attr-defined]
        rt.store.running_unheld = counted if ids else earlier  # type: ignore[attr-defined]
        page, _ = await rt.pending_page(PendingFilter(status="expired", limit=PAGE, offset=PAGE))
        assert len(page) == PAGE
        assert rows == ([2, 1] if ids else []), rows  # before: [2, 2, 2, 2, 1], each listing
        assert len(await tree.completed(rt)) == 2 * PAGE
    assert tree.calls == 2 * PAGE


async def test_the_refused_drives_a_runtime_told_of_are_bounded_and_named_plainly(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The sessions whose refused drives a read told of were kept until a drive of each went
    through, which on a runtime that may only read never comes: every left session it ever
    met, deleted ones too. The newest `REFUSED_KEPT` are kept, a deleted one is dropped, and
    another kind of error is told again; the warning says "their" of several sessions."""
    monkeypatch.setattr(_sweeping, "REFUSED_KEPT", 3)
    tree = _SlowPayers()
    async with so.Runtime([tree.agent], store=f"sqlite:///{tmp_path}/s.db") as rt:
        sid = (await rt.generate("pay", prompt="pay", auth=ALICE)).session_id
        busy = so.StoreError("read-only")
        with caplog.at_level(logging.WARNING, logger="signoff"):
            rt._say_refused({s: busy for s in ("a", "b", sid)})
            rt._say_refused({"a": busy})
            rt._say_refused({"a": so.StoreUnavailable("down")})
        assert [r.getMessage() for r in caplog.records] == [
            "session a and 2 more: continuing after their deadlines failed: read-only (not "
            "logged again for these sessions until a drive of theirs goes through)",
            "session a: continuing after its deadline failed: down (not logged again for it "
            "until a drive of it goes through)",
        ]
        rt._say_refused({"c": busy})  # the oldest told of, "b", dropped
        assert list(rt._refused_drives) == [sid, "a", "c"]
        await rt.cancel(sid, principal=ALICE)
        await rt.delete_session(sid)
        assert list(rt._refused_drives) == ["a", "c"]
