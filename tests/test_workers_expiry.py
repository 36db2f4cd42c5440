"""Workers and sessions whose time to live passes: recorded expired while running, by a listing,
on resuming, and what a worker logs.
"""

from __future__ import annotations

import logging
import time

import pytest

import signoff as so
from signoff.testing import ManualClock

from ._workers import refund_agent


async def test_the_listing_records_a_running_session_whose_ttl_passed(store_url: str) -> None:
    """Like a request whose deadline passed, a session that expired running is never listed
    as running, even before any sweep has run: the listing records its expiry first."""
    clock = ManualClock(time.time())
    agent = refund_agent([], ttl=60)
    async with so.Runtime([agent], store=store_url, inline=False, clock=clock) as rt:
        r = await rt.generate("support", prompt="Refund order 1042")
        [summary] = await rt.sessions(status="running")
        assert summary.id == r.session_id
        clock.advance(61)
        assert await rt.sessions(status="running") == []
        assert [s.status for s in await rt.sessions()] == ["failed"]


async def test_resuming_a_session_that_expired_running_records_its_expiry(store_url: str) -> None:
    """`generate(session_id=...)` drives under a lease of its own, then finds the TTL passed:
    it records the expiry under that lease (no one else can hold the session), so the store
    stops listing it running; while another process holds the lease, nothing is recorded."""
    clock = ManualClock(time.time())
    agent = refund_agent([], ttl=60)
    async with so.Runtime([agent], store=store_url, inline=False, clock=clock) as rt:
        held = await rt.generate("support", prompt="Refund order 1042")
        r = await rt.generate("support", prompt="Refund order 1043")
        clock.advance(61)
        now = rt.now()
        assert await rt.store.acquire_lease(held.session_id, "other", 60, now) is not None
    async with so.Runtime([agent], store=store_url, inline=True, clock=clock, lease_wait=0.1) as rt:
        with pytest.raises(so.SessionExpired):
            await rt.generate(session_id=r.session_id)
        [summary] = await rt.store.sessions(status="running")
        assert summary.id == held.session_id  # the other process's turn is left to it
        state = await rt.state(r.session_id)
        assert state.turn is not None and state.turn.status == "failed"
        assert (state.turn.error or {}).get("code") == "session_expired"
        assert await rt.generate(session_id=held.session_id) is not None
        assert (await rt.state(held.session_id)).turn.status == "running"  # type: ignore[union-attr]


async def test_a_worker_whose_claimed_session_expired_logs_it_without_a_traceback(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A session whose TTL passes between a worker's claim and its drive: the drive records the
    expiry, and the worker said "the turn failed in the worker" with a traceback."""
    clock = ManualClock(time.time())
    agent = refund_agent([], ttl=60)
    async with so.Runtime([agent], store=store_url, inline=False, clock=clock) as rt:
        r = await rt.generate("support", prompt="Refund order 1042")
        owner = f"{rt.owner}:worker"
        token = await rt.store.acquire_lease(r.session_id, owner, 60, rt.now())
        assert token is not None
        clock.advance(61)
        with caplog.at_level(logging.INFO, logger="signoff.worker"):
            await rt._work_on(r.session_id, owner, token)
        assert [x for x in caplog.records if x.levelno >= logging.WARNING] == []
        assert f"session {r.session_id}: expired" in caplog.text
        state = await rt.state(r.session_id)
        assert state.turn is not None and (state.turn.error or {}).get("code") == "session_expired"


async def test_a_listing_that_cannot_record_an_expiry_shows_it(store_url: str) -> None:
    """A runtime without the session's agent (as `signoff sessions` is) cannot record that
    its TTL passed running; like a passed deadline, it lists it as the expiry leaves it:
    failed, and not among the running ones."""
    clock = ManualClock(time.time())
    agent = refund_agent([], ttl=60)
    async with so.Runtime([agent], store=store_url, inline=False, clock=clock) as rt:
        r = await rt.generate("support", prompt="Refund order 1042")
    clock.advance(61)
    async with so.Runtime([], store=store_url, clock=clock) as rt:
        assert await rt.sessions(status="running") == []
        [summary] = await rt.sessions()
        assert (summary.id, summary.status) == (r.session_id, "failed")
        assert [s.id for s in await rt.store.sessions(status="running")] == [r.session_id]
