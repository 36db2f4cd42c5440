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
from signoff import _work

from ._workers import is_, refund_agent, until, working

TTL = 4.0
LONG_TTL = 30.0  # a lease kept until it lapses fails a test by far


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
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=LONG_TTL) as worker,
    ):
        outage = store_down(worker, commits=1)
        r = await front.generate("support", prompt="Refund order 1042")
        async with working(worker):
            await until(lambda: _true(outage["failed"] == 1))
            await asyncio.sleep(0.3)  # the store is down for a while after the failed drive
            outage["down"] = False
            back = time.monotonic()
            await until(lambda: is_(front, r.session_id, "waiting"), timeout=LONG_TTL / 3)
            took = time.monotonic() - back
        # Given back within a try of the store coming back (0.5 s apart at most), then claimed
        # and driven: well under a second, and a fifth of the lease kept until it lapses.
        assert took < LONG_TTL / 5, f"{took:.2f}s from the store coming back to the turn"


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
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker stopped while it waits to give back the lease of a drive the store failed gives
    it back then, and does not wait out the rest: another worker may try the turn at once."""
    # The second failure's lease waits 20 s to be given back (not 0.5 s): the stop cuts it short.
    monkeypatch.setattr(_work, "GIVE_BACK_AFTER", 20.0)
    waits: list[float] = []
    failed_drive = _work._GiveBacks.failed

    def noted(self: Any, *args: Any) -> float:
        waits.append(failed_drive(self, *args))
        return waits[-1]

    monkeypatch.setattr(_work._GiveBacks, "failed", noted)
    agent = refund_agent([])
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=LONG_TTL) as worker,
    ):

        async def failing(*args: Any, **kwargs: Any) -> None:
            raise so.StoreError("committing: the row was refused (test)")

        worker.store.commit = failing  # type: ignore[method-assign]
        r = await front.generate("support", prompt="Refund order 1042")
        async with working(worker):  # which waits 10 s at most for the worker to stop
            await until(lambda: _true(len(waits) == 2))
            assert waits == [0.0, 20.0]  # its lease is given back in 20 s
            started = time.monotonic()
        assert time.monotonic() - started < 5  # at once, not 20 s
        assert await front.store.acquire_lease(r.session_id, "another", 10, front.now())
