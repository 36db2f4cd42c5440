"""A worker whose store holds up a claim or a sweep (its SQLite file locked by another process,
its PostgreSQL server down or frozen): told to stop, or cancelled (a second signal), it returns
at once, not once the store answers, and the leases of a claim that answers later are given
back. And what it says of a tool outcome the store refused as its lease lapsed."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

import signoff as so
from signoff.testing import reply, scripted_agent

from ._workers import refund_agent, until

AT_ONCE = 1.0  # seconds: a worker returning later than this waited for its store


async def _acquirable(rt: so.Runtime, session_id: str) -> bool:
    """Whether another owner gets the session's lease now (taking it)."""
    return await rt.store.acquire_lease(session_id, "another", 30.0, rt.now()) is not None


@pytest.mark.parametrize("how", ["stop", "cancel"])
async def test_a_worker_returns_at_once_while_the_store_holds_up_its_claim(
    store_url: str, how: str
) -> None:
    """An idle worker's claim waiting on the store (a SQLite file another connection held
    locked, a PostgreSQL server stopped with `outage_grace`): a stop (one SIGTERM) and a cancel
    (a second one) were both seen only once the claim answered, up to its busy timeout or
    grace, 24-28 s in `signoff worker`. It returns at once; the claim answering later has the
    sessions it granted given back, not held for the lease's TTL (600 s here)."""
    agent = scripted_agent("support", [reply("Done.")])
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=600) as worker,
    ):
        session_id = (await front.generate("support", prompt="hello")).session_id
        claim = worker.store.claim
        asked, answer = asyncio.Event(), asyncio.Event()

        async def held_up(*args: Any, **kwargs: Any) -> list[tuple[str, int]]:
            asked.set()
            await answer.wait()  # the lock let go, the server back: much later
            return await claim(*args, **kwargs)

        worker.store.claim = held_up  # type: ignore[method-assign]
        stop = asyncio.Event()
        task = asyncio.create_task(worker.work(stop=stop, idle_wait=0.05))
        await asyncio.wait_for(asked.wait(), 10)
        told = time.monotonic()
        if how == "stop":
            stop.set()
        else:
            task.cancel()
        await asyncio.wait({task}, timeout=AT_ONCE * 3)
        took = time.monotonic() - told
        answer.set()  # the claim answers, granting the session
        await asyncio.gather(asyncio.wait_for(task, 10), return_exceptions=True)
        assert took < AT_ONCE, f"work() returned {took:.1f}s after it was told to {how}"
        assert task.cancelled() if how == "cancel" else task.result() is None
        await until(lambda: _acquirable(front, session_id), timeout=5)  # given back


async def test_closing_the_runtime_waits_not_for_a_claim_its_stopped_worker_left(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The runtime closing after its worker stopped (`signoff worker` exiting) waits only a
    moment for a claim still held up, then cancels it (a lease it may have granted lapses, as
    after a crash), and closes: it neither waits for the store nor leaves the claim running on
    a closed store."""
    agent = scripted_agent("support", [reply("Done.")])
    worker = so.Runtime([agent], store=store_url, inline=False, lease_ttl=600)
    try:
        claim = worker.store.claim
        asked = asyncio.Event()
        ended: list[str] = []

        async def held_up(*args: Any, **kwargs: Any) -> list[tuple[str, int]]:
            asked.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                ended.append("cancelled")
                raise
            return await claim(*args, **kwargs)

        worker.store.claim = held_up  # type: ignore[method-assign]
        stop = asyncio.Event()
        task = asyncio.create_task(worker.work(stop=stop, idle_wait=0.05))
        await asyncio.wait_for(asked.wait(), 10)
        stop.set()
        await asyncio.wait_for(task, AT_ONCE)
        told = time.monotonic()
        await asyncio.wait_for(worker.close(), 10)
        assert time.monotonic() - told < AT_ONCE * 2
        assert ended == ["cancelled"]  # not left waiting, nor running on after the close
        # Said, not silent: the sessions it took (if any) stay leased until their TTL passes.
        assert "still unanswered at close" in caplog.text
    finally:
        await worker.close()


async def test_a_worker_told_to_stop_returns_at_once_while_the_store_holds_up_its_sweep(
    store_url: str,
) -> None:
    """The same for the sweep of passed deadlines (and the check of the store's clock before
    it): a stop waited for it to end, the store answering."""
    agent = scripted_agent("support", [reply("Done.")])
    async with so.Runtime([agent], store=store_url, inline=False) as worker:
        pending = worker.store.pending
        asked, answer = asyncio.Event(), asyncio.Event()

        async def held_up(*args: Any, **kwargs: Any) -> Any:
            asked.set()
            await answer.wait()
            return await pending(*args, **kwargs)

        worker.store.pending = held_up  # type: ignore[method-assign]
        stop = asyncio.Event()
        task = asyncio.create_task(worker.work(stop=stop, idle_wait=0.05))
        await asyncio.wait_for(asked.wait(), 10)
        told = time.monotonic()
        stop.set()
        await asyncio.wait({task}, timeout=AT_ONCE * 3)
        took = time.monotonic() - told
        answer.set()
        await asyncio.wait_for(task, 10)
        assert took < AT_ONCE, f"work() returned {took:.1f}s after it was told to stop"


async def test_an_outcome_refused_as_the_lease_lapsed_is_not_said_to_keep_the_lease(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A store frozen (its server stopped with SIGSTOP, a lock held past `busy_timeout`) while
    a tool ran: no renewal got through, so the drive gave its lease up as it was about to lapse,
    then the store refused the tool's outcome. The worker logged "its lease kept" though another
    worker could take the session at the thaw and run the call again (as it did). It says the
    lease lapsed, and that another worker may run the call again; it still records the outcome
    itself when it can, the call not run again here."""
    caplog.set_level(logging.INFO)
    runs: list[str] = []
    hold = asyncio.Event()
    agent = refund_agent(runs, approval=so.never(), hold=hold)
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=1.0) as worker,
    ):
        store = worker.store
        frozen, thaw = [False], asyncio.Event()

        def freezing(name: str) -> None:
            real = getattr(store, name)

            async def call(*args: Any, **kwargs: Any) -> Any:
                if frozen[0]:
                    if name in ("commit", "renew_lease"):
                        await thaw.wait()  # unanswered while frozen
                    raise so.StoreError(f"{name}: no answer (test)")
                return await real(*args, **kwargs)

            setattr(store, name, call)

        for name in ("commit", "renew_lease", "claim", "acquire_lease", "release_lease"):
            freezing(name)
        r = await front.generate("support", prompt="Refund order 1042")
        task = asyncio.create_task(worker.work(idle_wait=0.05, sweep_every=60))
        try:
            await until(lambda: _has(runs, f"{r.session_id}:1:call_refund"))  # the body runs
            frozen[0] = True
            hold.set()  # the refund ran; the record of its outcome is not answered
            await until(lambda: _said(caplog, f"session {r.session_id}: lease 1 about to lapse"))
            frozen[0] = False
            thaw.set()  # the store answers again: the outcome refused
            await until(lambda: _said(caplog, "recorded (not run again)"))
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert runs == [f"{r.session_id}:1:call_refund"]  # here, once
    (line,) = [m for m in _lines(caplog) if "the store refused the outcome of" in m]
    assert "its lease kept" not in line, line
    assert "its lease lapsed" in line and "may take the session first and run the call again" in (
        line
    ), line


async def _has(seen: list[str], what: str) -> bool:
    return what in seen


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records]


async def _said(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return any(text in line for line in _lines(caplog))
