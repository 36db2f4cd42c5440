"""A worker that claimed a session which a prune then deleted (its TTL passed, and the worker's
lease lapsed while it stalled before driving): the drive finds the session gone, which is what
happened, not a failure of the turn to log with a traceback. Both stores."""

from __future__ import annotations

import logging
import time

import pytest

import signoff as so
from signoff.testing import ManualClock

from ._workers import refund_agent


async def test_a_worker_whose_claimed_session_was_deleted_logs_it_without_a_traceback(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock(time.time())
    agent = refund_agent([], ttl=60)
    async with so.Runtime([agent], store=store_url, inline=False, clock=clock) as rt:
        r = await rt.generate("support", prompt="Refund order 1042")
        owner = f"{rt.owner}:worker"
        token = await rt.store.acquire_lease(r.session_id, owner, 30, rt.now())
        assert token is not None
        clock.advance(61)  # the lease lapsed, and the session's TTL passed
        assert await rt.prune(older_than=0) == [r.session_id]
        with caplog.at_level(logging.INFO, logger="signoff.worker"):
            await rt._work_on(r.session_id, owner, token)
        assert [x.getMessage() for x in caplog.records if x.levelno >= logging.WARNING] == []
        assert f"session {r.session_id}: deleted" in caplog.text
        with pytest.raises(so.UnknownSession):
            await rt.state(r.session_id)
