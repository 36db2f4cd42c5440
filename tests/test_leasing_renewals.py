"""Lease renewals while a body runs: renewals that do not get through stop the body before its
lease lapses, successful ones keep it for many times the TTL, and a renewal cut or slow near
the deadline is handled in time. Run on both stores.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import signoff as so
from signoff import _leasing
from signoff.stores import Commit, Store

from ._leasing import (
    SlowRefund,
    counting_renewals,
    event_types,
    finished_by_a_worker,
    once_each,
    refund_agent,
    until,
)


def noting_expiry(store: Store) -> Callable[[], float]:
    """Note the expiry, by the lease clock, that `store` gives the runtime's leases as they are
    granted (asked for, or with the commit of a message's turn) and renewed; the returned
    function gives the latest (the store keeps the latest)."""
    acquire, renew, commit = store.acquire_lease, store.renew_lease, store.commit
    expiries = [0.0]

    async def committed(c: Commit) -> None:
        await commit(c)
        if c.granted is not None and c.grant is not None:
            expiries.append(c.grant[2] + c.grant[1])

    async def acquired(session_id: str, owner: str, ttl: float, now: float) -> int | None:
        token = await acquire(session_id, owner, ttl, now)
        if token is not None and owner != "elsewhere":
            expiries.append(now + ttl)
        return token

    async def renewed(session_id: str, owner: str, token: int, ttl: float, now: float) -> bool:
        live = await renew(session_id, owner, token, ttl, now)
        if live:
            expiries.append(now + ttl)
        return live

    store.acquire_lease = acquired  # type: ignore[method-assign]
    store.renew_lease = renewed  # type: ignore[method-assign]
    store.commit = committed  # type: ignore[method-assign,assignment]
    return lambda: max(expiries)


async def store_now(store: Store) -> float:
    """The time by the store's clock, as another process claiming a lease reads it."""
    server_time = getattr(store, "server_time", None)
    return time.time() if server_time is None else float(await server_time())


async def claimed_once_lapsed(store: Store, expiry: Callable[[], float]) -> float:
    """Claim the session as another worker does, as soon as the store's clock passes the
    lease's expiry (never before, whether or not the drive gave its lease back); the claim is
    given back at once. The store's time of the claim."""
    while True:
        now = await store_now(store)
        if now > expiry():
            got = await store.claim("elsewhere", 30.0, now, 10)
            if got:
                ((session_id, token),) = got
                await store.release_lease(session_id, "elsewhere", token)
                return now
        await asyncio.sleep(0.002)


@pytest.mark.parametrize("renewals", ["failing", "hanging"])
async def test_a_body_whose_renewals_do_not_get_through_stops_before_its_lease_lapses(
    store_url: str, renewals: str
) -> None:
    """Renewals that fail (the store unreachable) or hang (a connection gone silent) leave the
    body running only until a margin before the lease's expiry: it is cancelled before then, by
    the lease clock, so a worker that claims the session the moment the lease lapses never runs
    the call while this process still does."""
    ttl = 2.0  # a margin of 0.2 s: more than any scheduling delay of the event loop
    seen: list[tuple[str, float]] = []
    runs: list[str] = []
    lease_now: Callable[[], float] = time.time

    @so.tool(approval=so.never())
    async def issue_refund(ctx: so.ToolContext, order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        runs.append(ctx.idempotency_key())
        if len(runs) == 1:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                seen.append(("cancelled", lease_now()))
                raise
        return {"refunded": amount}

    async with so.Runtime([refund_agent(issue_refund)], store=store_url, lease_ttl=ttl) as rt:
        lease_now = rt.now
        expiry = noting_expiry(rt.store)
        renew = rt.store.renew_lease
        silent = asyncio.Event()  # never set

        async def unreachable(*args: Any) -> bool:
            if runs:
                if renewals == "failing":
                    raise so.StoreError("renewing the lease: connection lost (test)")
                await silent.wait()
            return await renew(*args)

        rt.store.renew_lease = unreachable  # type: ignore[method-assign,assignment]
        sid = await rt.create_session("support")
        drive = asyncio.create_task(rt.generate("support", "Refund", session_id=sid))
        await until(lambda: bool(runs))
        before = await event_types(rt, sid)
        claim = asyncio.create_task(claimed_once_lapsed(rt.store, expiry))
        seen.append(("claimed", await asyncio.wait_for(claim, 10)))
        result = await asyncio.wait_for(drive, 10)
        assert [what for what, _ in seen] == ["cancelled", "claimed"]
        assert seen[0][1] < expiry()  # cancelled while the lease was still live
        assert result.status == "running"
        assert await event_types(rt, sid) == before and before[-1] == "tool.started"
    types = await finished_by_a_worker(store_url, issue_refund, sid)
    assert runs == [f"{sid}:1:call_refund"] * 2
    assert once_each(types)


async def test_a_sync_body_whose_renewals_fail_is_left_before_its_lease_lapses(
    store_url: str,
) -> None:
    """A body run in a thread cannot be stopped: with renewals failing, its drive ends before
    the lease's expiry all the same, giving the lease back, and what the body returns once it
    finishes is recorded nowhere."""
    ttl = 2.0
    runs: list[str] = []
    go_on, returned = threading.Event(), threading.Event()

    @so.tool(approval=so.never())
    def issue_refund(ctx: so.ToolContext, order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        runs.append(ctx.idempotency_key())
        if len(runs) == 1:
            go_on.wait(30)
            returned.set()
        return {"refunded": amount}

    async with so.Runtime([refund_agent(issue_refund)], store=store_url, lease_ttl=ttl) as rt:
        expiry = noting_expiry(rt.store)
        counting_renewals(rt.store, failing=lambda: bool(runs))
        release, given_back = rt.store.release_lease, []

        async def releasing(session_id: str, owner: str, token: int) -> None:
            given_back.append((rt.now(), expiry()))  # when, by the lease clock, and its expiry
            await release(session_id, owner, token)

        rt.store.release_lease = releasing  # type: ignore[method-assign]
        sid = await rt.create_session("support")
        drive = asyncio.create_task(rt.generate("support", "Refund", session_id=sid))
        try:
            await until(lambda: bool(runs))
            before = await event_types(rt, sid)
            result = await asyncio.wait_for(drive, 10)
            # When the drive gave the lease back, not when this task resumed after it ended.
            ((left, expires),) = given_back
            assert left < expires == expiry()  # left while the lease was still live
            assert result.status == "running" and not returned.is_set()
            assert not await rt._busy(sid)  # given back: another worker may take it over
        finally:
            go_on.set()
        await until(returned.is_set)
        assert await event_types(rt, sid) == before and before[-1] == "tool.started"
    types = await finished_by_a_worker(store_url, issue_refund, sid)
    assert runs == [f"{sid}:1:call_refund"] * 2
    assert once_each(types)


async def test_a_body_running_many_times_the_ttl_keeps_its_lease_while_renewals_succeed(
    store_url: str,
) -> None:
    """Renewals every third of the TTL keep the lease far from the margin before its expiry:
    a body that runs for several TTLs is never stopped, and its call completes once."""
    runs: list[str] = []

    @so.tool(approval=so.never())
    async def issue_refund(ctx: so.ToolContext, order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        runs.append(ctx.idempotency_key())
        await asyncio.sleep(3.0)  # three TTLs
        return {"refunded": amount}

    # A TTL of 1 s (not 0.3 s): a busy machine's process descheduled for a quarter second
    # lost a 0.3 s lease, which is what a lease is for, and no failure of the renewals.
    async with so.Runtime([refund_agent(issue_refund)], store=store_url, lease_ttl=1.0) as rt:
        made = counting_renewals(rt.store)
        sid = await rt.create_session("support")
        result = await asyncio.wait_for(rt.generate("support", "Refund", session_id=sid), 10)
        assert result.status == "completed" and len(made) >= 3
        assert once_each(await event_types(rt, sid))
    assert runs == [f"{sid}:1:call_refund"]


async def test_a_renewal_cut_just_before_the_deadline_is_tried_again_in_time(
    store_url: str,
) -> None:
    """A renewal that fails with little time left before the deadline (on PostgreSQL, one that
    hung until `operation_timeout` cut it, with a TTL above that timeout) is tried again before
    the deadline, not given up untried: the store answering again by then keeps the lease, and
    the body runs on to complete once."""
    ttl = 3.0
    skew = [0.0]
    runs: list[str] = []
    renewed_after_the_cut = asyncio.Event()

    def clock() -> float:
        return time.time() + skew[0]

    @so.tool(approval=so.never())
    async def issue_refund(ctx: so.ToolContext, order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        runs.append(ctx.idempotency_key())
        await renewed_after_the_cut.wait()
        return {"refunded": amount}

    agent = refund_agent(issue_refund)
    async with so.Runtime([agent], store=store_url, lease_ttl=ttl, clock=clock) as rt:
        expiry = noting_expiry(rt.store)
        renew = rt.store.renew_lease
        cuts: list[float] = []

        async def cut_once(*args: Any) -> bool:
            if runs and not cuts:
                # It hung until the timeout cut it: a quarter second is left before the
                # deadline (a tenth of the TTL before the expiry), less than the TTL's tenth.
                cuts.append(1.0)
                skew[0] += expiry() - ttl / 10 - 0.25 - rt.now()
                raise so.StoreError("renewing the lease: the operation timed out (test)")
            live = await renew(*args)
            if cuts and live:
                renewed_after_the_cut.set()
            return live

        rt.store.renew_lease = cut_once  # type: ignore[method-assign,assignment]
        sid = await rt.create_session("support")
        result = await asyncio.wait_for(rt.generate("support", "Refund", session_id=sid), 10)
        assert cuts and renewed_after_the_cut.is_set()
        assert result.status == "completed"
        assert once_each(await event_types(rt, sid))
    assert runs == [f"{sid}:1:call_refund"]


@pytest.mark.parametrize("renewed_by", ["confirming", "renewals"])
async def test_a_slow_renewal_keeps_the_lease_known_live_from_when_it_was_sent(
    store_url: str, renewed_by: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A renewal renews the lease from when it was sent, however late its answer: the lease is
    known live from then. So a drive about to run a tool body renews it first once half the
    TTL has passed since the renewal was sent, not since it answered: after a slow renewal and
    a stall of the process, the lease may have lapsed and another worker run the call."""
    ttl = 0.3
    monotonic = [1000.0]
    monkeypatch.setattr(_leasing, "_AWAKE", lambda: monotonic[0])  # the clock leases count by
    async with so.Runtime([refund_agent(SlowRefund().tool)], store=store_url, lease_ttl=ttl) as rt:
        sid = await rt.create_session("support")
        owner = "test-owner"
        token = await rt.store.acquire_lease(sid, owner, ttl, rt.now())
        assert token is not None
        held = _leasing.Held(monotonic[0] - 0.6 * ttl, rt.now() + ttl)
        renew = rt.store.renew_lease
        made: list[int] = []
        go_on = asyncio.Event()
        go_on.set()

        async def slow(*args: Any) -> bool:
            made.append(1)
            live = await renew(*args)
            monotonic[0] += 0.45 * ttl  # answered long after it was sent
            go_on.clear()  # the renewals stop after this one
            return live

        rt.store.renew_lease = slow  # type: ignore[method-assign,assignment]
        if renewed_by == "confirming":
            await rt._confirm(sid, owner, token, held)
        else:
            await asyncio.wait_for(rt._renew(sid, owner, token, go_on, held), 10)
        assert made == [1] and not held.lost
        monotonic[0] += 0.1 * ttl  # a stall: 0.55 of the TTL since the renewal was sent
        await rt._confirm(sid, owner, token, held)
        assert made == [1, 1]


async def test_a_renewal_that_meets_the_drive_s_own_release_says_nothing_of_a_takeover(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A drive's last commit gives its lease back while a renewal is on its way (on PostgreSQL
    the two go out on different connections, and the renewal's answer may come back first).
    That renewal finds the lease no longer held, by the drive's own release: no one took it
    over. It used to log `lease N was taken over` for a turn that completed normally."""
    model = so.models.Scripted([so.ModelResponse(text="Done.")])
    agent = so.Agent(name="support", model=model)
    async with so.Runtime([agent], store=store_url, lease_ttl=1.5) as rt:
        commit, renew = rt.store.commit, rt.store.renew_lease
        refused = asyncio.Event()  # a renewal made after the release came back refused

        async def slow_ack(c: Any) -> None:
            await commit(c)
            if c.release_lease:  # its answer comes back after the next renewal's
                await asyncio.wait_for(refused.wait(), 5)
                await asyncio.sleep(0.05)  # for the renewals to handle that answer

        async def renewing(*args: Any) -> bool:
            live = await renew(*args)
            if not live:
                refused.set()
            return live

        rt.store.commit = slow_ack  # type: ignore[method-assign,assignment]
        rt.store.renew_lease = renewing  # type: ignore[method-assign,assignment]
        with caplog.at_level(logging.INFO, logger="signoff"):
            r = await rt.generate("support", "Hello")
        assert r.status == "completed" and refused.is_set()
        assert "taken over" not in caplog.text and "lost" not in caplog.text
