"""A worker's drive that the store fails: its lease is given back once the store works again,
not kept for the whole TTL, and a session whose drive the store fails every time is retried
less and less often, never in a loop."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

import signoff as so

from ._workers import is_, refund_agent, until, working

TTL = 4.0


def store_down(rt: so.Runtime, *, commits: int | None) -> dict[str, Any]:
    """Make `rt`'s store fail its commits (the first `commits`, or every one if None) and, while
    that lasts, its lease releases: the database going away under a drive. Returns the state:
    `down` (clear it to end the outage), `failed` (the commits it failed), `back` (the
    monotonic time it came back)."""
    outage: dict[str, Any] = {"down": True, "failed": 0, "back": None}
    commit, release = rt.store.commit, rt.store.release_lease

    async def failing_commit(*args: Any, **kwargs: Any) -> None:
        if outage["down"] and (commits is None or outage["failed"] < commits):
            outage["failed"] += 1
            raise so.StoreError("committing: the connection was lost (test)")
        await commit(*args, **kwargs)

    async def failing_release(*args: Any, **kwargs: Any) -> None:
        if outage["down"]:
            raise so.StoreError("releasing a lease: the connection was lost (test)")
        await release(*args, **kwargs)

    rt.store.commit = failing_commit  # type: ignore[method-assign]
    rt.store.release_lease = failing_release  # type: ignore[method-assign]
    return outage


async def test_a_drive_the_store_failed_is_retried_soon_after_the_store_is_back(
    store_url: str,
) -> None:
    """The store failing a worker's drive kept its lease for the whole TTL: the turn waited
    that long after the store came back. It is given back once the store takes it."""
    agent = refund_agent([])
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=TTL) as worker,
    ):
        outage = store_down(worker, commits=1)
        r = await front.generate("support", prompt="Refund order 1042")
        async with working(worker):
            await until(lambda: _true(outage["failed"] == 1))
            await asyncio.sleep(0.3)  # the store is down for a while after the failed drive
            outage["down"] = False
            back = time.monotonic()
            await until(lambda: is_(front, r.session_id, "waiting"), timeout=2 * TTL)
            took = time.monotonic() - back
        assert took < TTL / 3, f"{took:.2f}s from the store coming back to the turn"


async def test_a_session_whose_drive_the_store_always_fails_is_not_retried_in_a_loop(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A drive the store fails every time (a row it cannot take, say) is given back after a
    wait that doubles at each failure, up to the TTL: a few tries, not hundreds a second."""
    agent = refund_agent([])
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=TTL) as worker,
    ):
        outage = store_down(worker, commits=None)
        release = worker.store.release_lease
        outage["down"] = False  # releases work; every commit fails
        worker.store.commit = _always_failing  # type: ignore[method-assign]
        worker.store.release_lease = release  # type: ignore[method-assign]
        r = await front.generate("support", prompt="Refund order 1042")
        with caplog.at_level(logging.INFO, logger="signoff.worker"):
            async with working(worker):
                await asyncio.sleep(2.0)
        claims = caplog.text.count(f"claimed session {r.session_id}")
        assert 2 <= claims <= 4, claims  # at about 0, 0, 0.5 and 1.5 s
        assert "given back in" in caplog.text
        assert await is_(front, r.session_id, "running")


async def _always_failing(*args: Any, **kwargs: Any) -> None:
    raise so.StoreError("committing: the row was refused (test)")


async def _true(value: bool) -> bool:
    return value


async def test_a_worker_stopping_gives_back_at_once_a_lease_it_was_waiting_to(
    store_url: str,
) -> None:
    """A worker stopped while it waits to give back the lease of a drive the store failed gives
    it back then, and does not wait out the rest: another worker may try the turn at once."""
    agent = refund_agent([])
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=30.0) as worker,
    ):
        failed: list[str] = []

        async def failing(*args: Any, **kwargs: Any) -> None:
            failed.append("commit")
            raise so.StoreError("committing: the row was refused (test)")

        worker.store.commit = failing  # type: ignore[method-assign]
        r = await front.generate("support", prompt="Refund order 1042")
        async with working(worker):
            await until(lambda: _true(len(failed) == 3))  # its lease is given back in 1 s
            started = time.monotonic()
        assert time.monotonic() - started < 0.6
        assert await front.store.acquire_lease(r.session_id, "another", 10, front.now())
