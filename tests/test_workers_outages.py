"""Workers and a store that fails or stalls for a while: an outage, a claim that waited long,
lease renewals that fail.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import pytest

import signoff as so
from signoff.testing import ManualClock

from ._workers import (
    is_,
    refund_agent,
    until,
    working,
)

# -- a store that fails or stalls for a while -----------------------------------------------


async def test_a_worker_outlives_a_store_outage(store_url: str) -> None:
    """Claims and the deadline sweep failing for a while (the database restarting, its pool
    timing out) are logged and retried: the worker keeps going and runs the turns after."""
    runs: list[str] = []
    agent = refund_agent(runs)
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=2.0) as worker,
    ):
        failures = {"claim": 3, "pending": 2}
        claim, pending = worker.store.claim, worker.store.pending

        async def down_claim(*args: Any, **kwargs: Any) -> list[tuple[str, int]]:
            if failures["claim"]:
                failures["claim"] -= 1
                raise so.StoreError("claiming runnable sessions: no connection (test)")
            return await claim(*args, **kwargs)

        async def down_pending(*args: Any) -> list[so.InputRequest]:
            if failures["pending"]:
                failures["pending"] -= 1
                raise so.StoreError("listing requests: no connection (test)")
            return await pending(*args)

        worker.store.claim = down_claim  # type: ignore[method-assign]
        worker.store.pending = down_pending  # type: ignore[method-assign,assignment]
        r = await front.generate("support", prompt="Refund order 1042")
        async with working(worker, sweep_every=0.01):
            await until(lambda: is_(front, r.session_id, "waiting"))
        assert failures == {"claim": 0, "pending": 0}


async def test_a_claim_that_waited_long_still_holds_a_live_lease(store_url: str) -> None:
    """A claim stuck longer than the lease TTL (waiting for a pool connection) must not hand
    the worker a lease that is already expired, which any other worker could claim at once."""
    entered = asyncio.Event()
    release = asyncio.Event()

    async def slow(messages: list[so.Message]) -> so.ModelResponse:
        entered.set()
        await release.wait()
        return so.ModelResponse(text="Done.")

    agent = refund_agent([], first=slow)
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=1.5) as worker,
    ):
        claim = worker.store.claim

        async def stuck(
            owner: str,
            ttl: float,
            now: float,
            limit: int,
            agents: Sequence[str] | None = None,
            *,
            skip: Sequence[str] = (),
        ) -> list[tuple[str, int]]:
            await asyncio.sleep(2.25)  # the `now` it was given is older than the TTL by then
            return await claim(owner, ttl, now, limit, agents, skip=skip)

        worker.store.claim = stuck  # type: ignore[method-assign]
        r = await front.generate("support", prompt="Refund order 1042")
        async with working(worker):
            await asyncio.wait_for(entered.wait(), 10)
            try:
                assert await front.store.claim("other", 10, time.time(), 10) == []
            finally:
                release.set()
            await until(lambda: is_(front, r.session_id, "completed"))


async def test_a_failed_renewal_is_retried_and_does_not_fail_the_turn(store_url: str) -> None:
    """One renewal failing (a dropped connection) must not end the renewals, or the lease lapses
    under a long tool call and another worker runs it again, nor turn the drive into an error."""
    runs: list[str] = []
    agent = refund_agent(runs, approval=so.never(), delay=4.0)
    async with so.Runtime([agent], store=store_url, lease_ttl=1.5) as rt:
        renew = rt.store.renew_lease
        calls = 0

        async def flaky(*args: Any) -> bool:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise so.StoreError("renewing the lease: connection lost (test)")
            return await renew(*args)

        rt.store.renew_lease = flaky  # type: ignore[method-assign,assignment]
        sid = await rt.create_session("support")
        task = asyncio.create_task(rt.generate("support", "Refund order 1042", session_id=sid))
        await until(lambda: asyncio.sleep(0, bool(runs)))  # the tool body is running
        await asyncio.sleep(2.33)  # past the TTL since the failed renewal
        try:
            assert await rt.store.claim("other", 10, time.time(), 10) == []
        finally:
            result = await asyncio.wait_for(task, 10)
        assert result.status == "completed" and calls >= 2
        assert runs == [f"{sid}:1:call_refund"]


async def test_a_renewal_failing_in_a_claim_gives_back_only_what_it_could_not_confirm(
    store_url: str,
) -> None:
    """A claim that took long renews each lease before driving it; one renewal failing (a
    dropped connection) must not drop the whole claim, leaving every session leased to this
    worker and driven by nobody until the TTL lapses: that one is given back, the rest driven."""
    clock = ManualClock(time.time())
    agent = refund_agent([])
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False, clock=clock, lease_ttl=30) as worker,
    ):
        first = await front.generate("support", prompt="Refund order 1042")
        second = await front.generate("support", prompt="Refund order 1042")
        claim, renew = worker.store.claim, worker.store.renew_lease
        slow, failing = [True], [True]

        async def slow_claim(
            owner: str,
            ttl: float,
            now: float,
            limit: int,
            agents: Sequence[str] | None = None,
            *,
            skip: Sequence[str] = (),
        ) -> list[tuple[str, int]]:
            claimed = await claim(owner, ttl, now, limit, agents, skip=skip)
            if slow:  # as if it waited half the TTL: each lease is renewed before it is driven
                slow.clear()
                assert len(claimed) == 2
                clock.advance(15)
            return claimed

        async def flaky_renew(*args: Any) -> bool:
            if failing:
                failing.clear()
                raise so.StoreError("renewing the lease: connection lost (test)")
            return await renew(*args)

        worker.store.claim = slow_claim  # type: ignore[method-assign]
        worker.store.renew_lease = flaky_renew  # type: ignore[method-assign,assignment]
        async with working(worker):
            for r in (first, second):  # long before the 30 s lease could lapse
                await until(lambda r=r: is_(front, r.session_id, "waiting"))  # type: ignore[misc]
        assert not slow and not failing


@pytest.mark.parametrize("pending", [False, True])
async def test_a_session_that_expires_with_its_turn_unfinished_is_recorded_expired(
    store_url: str, pending: bool
) -> None:
    """A session whose TTL passes while its turn is unfinished (no worker ran it, or one died;
    or its open requests expire with it) can never run again: claims skip it. The sweep records
    that, so the store stops listing it as `running` for ever, and it stays expired after."""
    clock = ManualClock(time.time())
    runs: list[str] = []
    approval = so.always() if pending else so.never()
    agent = refund_agent(runs, approval=approval, ttl=60)
    async with so.Runtime([agent], store=store_url, inline=pending, clock=clock) as rt:
        r = await rt.generate("support", prompt="Refund order 1042")
        # waiting for a person, or recorded for a worker that never comes
        assert r.status == ("waiting" if pending else "running")
        clock.advance(61)
        await rt.expire_due()
        assert await rt.store.sessions(status="running") == []
        assert await rt.store.claim("other", 10, time.time(), 10) == []
        state = await rt.state(r.session_id)
        assert state.turn is not None and state.turn.status == "failed"
        assert not state.turn.retryable and state.expired(clock())
        [summary] = await rt.sessions()
        assert summary.status == "failed"
        with pytest.raises(so.SessionExpired):
            await rt.generate(session_id=r.session_id, prompt="hello again")
        clock.advance(3600)
        await rt.expire_due()  # recorded once
        types = [e.type async for e in rt.events(r.session_id, follow=False)]
        assert types.count("turn.failed") == 1
        assert runs == []
