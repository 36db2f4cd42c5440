"""A worker frozen (SIGSTOP: a long GC pause, a paused virtual machine, a laptop lid) in the
middle of a turn, its lease held: another worker takes the turn over once the lease lapses and
finishes it; the frozen one, woken (SIGCONT) long after, is fenced (its lease is gone, so it
records nothing more), logs that it left the turn, and works on. Real `signoff worker`
processes and real signals, on both stores."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import signoff as so

from ._frozen import is_stopped, wake
from ._procs import is_type, query
from ._worker_procs import (
    AGENT,
    Worker,
    check_logs,
    make_agent,
    read_records,
    settled_counts,
)
from .test_store_edited_rows import edit

LEASE_TTL = 1.0
TOOL_DELAY = 1.0


def _count(url: str, type_: str) -> int:
    return int(query(url, "SELECT COUNT(*) FROM {t}events WHERE type " + is_type(type_))[0][0])


async def _until(check: Callable[[], object], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        await asyncio.sleep(0.02)


async def test_a_worker_frozen_mid_tool_body_is_taken_over_and_fenced_when_it_wakes(
    store_url: str, tmp_path: Path
) -> None:
    url = store_url
    records = tmp_path / "runs.jsonl"
    options = {"lease_ttl": LEASE_TTL, "idle_wait": 0.1, "sweep_every": 60}
    workers: list[Worker] = []
    frozen: Worker | None = None
    try:
        async with so.Runtime([make_agent(str(records))], store=url, inline=False) as front:
            sid = (await front.generate(AGENT, prompt="Refund order 1042")).session_id
            workers = [
                Worker(url, tmp_path, f"w{i}", records, delay=TOOL_DELAY, **options) for i in (0, 1)
            ]
            # Both started at once: each waits for its store to open.
            await _until(lambda: all("worker " in w.log() for w in workers), "workers started")
            pending: list[so.InputRequest] = []
            deadline = time.monotonic() + 20
            while not pending:
                assert time.monotonic() < deadline, "no approval asked"
                await asyncio.sleep(0.05)
                pending = await front.pending(session_id=sid)
            answer = so.InputResponse(request_id=pending[0].id, option_id="approve")
            assert (await front.respond(sid, [answer])).outcomes[0].applied

            # Whichever worker starts the tool body is frozen in it, its lease held.
            await _until(lambda: read_records(records), "the tool body started")
            pid = read_records(records)[0][2]
            os.kill(pid, signal.SIGSTOP)
            frozen = next(w for w in workers if w.pid == pid)
            survivor = next(w for w in workers if w.pid != pid)
            await _until(lambda: is_stopped(pid), "the worker stopped")
            frozen_at = time.monotonic()

            # The other worker takes the turn over once the lease lapsed, and finishes it.
            await _until(lambda: _count(url, "turn.completed") == 1, "the turn completed")
            assert time.monotonic() - frozen_at >= LEASE_TTL * 0.9  # not before it lapsed
            assert is_stopped(pid)
            wake(pid)

            # Woken, the frozen worker finds its lease gone and leaves the turn, recording
            # nothing; its loop goes on.
            await _until(lambda: "the turn is left to the process" in frozen.log(), "fenced")
            # Said once, as a warning (the runtime and the worker each said it), after the
            # renewals' own line of what they found ("lease N was taken over").
            (line,) = [x for x in frozen.log().splitlines() if re.search(r"lease \d+ lost", x)]
            said = (
                rf"\d{{4}}-\d\d-\d\d [\d:,]+ WARNING signoff\.worker: session {sid}: lease \d+ "
                r"lost \(the drive stalled past it or could not renew it\); the turn is left to "
                r"the process that takes it over"
            )
            assert re.fullmatch(said, line), line
            # What it did, not the state the other worker left: it completed nothing.
            assert f"session {sid}: completed" not in frozen.log()
            await asyncio.sleep(LEASE_TTL)  # time for a write it should not make
            assert frozen.proc.poll() is None, frozen.log()
            state = await front.state(sid)
            assert state.turn is not None and state.turn.status == "completed"
            assert state.turn.text == "Refunded."

        for w in workers:  # both stop cleanly: no worker loop crashed
            w.proc.send_signal(signal.SIGTERM)
        for w in workers:
            assert w.proc.wait(timeout=20) == 0, w.log()
            assert "worker stopped" in w.log()
            assert "Traceback" not in w.log(), w.log()

        # The body ran twice (the frozen run was cut off, the survivor's recorded), with the
        # same idempotency key; its result, the approval and the turn were recorded once, in a
        # log without gaps.
        starts = [(key, p) for what, key, p in read_records(records) if what == "start"]
        assert [p for _, p in starts] == [pid, survivor.pid]
        assert len({key for key, _ in starts}) == 1
        for type_ in ("tool.started", "tool.completed", "turn.completed", "approval.settled"):
            assert _count(url, type_) == 1, type_
        check_logs(url)
        events, rows = settled_counts(url)
        assert events == rows == Counter({sid: 1})
        held = query(url, "SELECT COUNT(*) FROM {t}leases WHERE owner <> ''")
        assert held == [(0,)]
    finally:
        if frozen is not None:
            wake(frozen.pid)
        for w in workers:
            w.close()


async def test_a_worker_whose_lease_row_was_deleted_is_fenced_though_its_token_was_reissued(
    store_url: str, tmp_path: Path
) -> None:
    """A real `signoff worker` runs a tool body; the lease row is deleted under it (by hand, a
    restore) and another process is granted the very token the worker holds. The worker, still
    running and unaware, finishes the body: its commit is refused (fenced on the owner too), it
    logs the loss and records nothing. Killed then, it leaves the turn to the lease's holder,
    whose worker runs it once more and records it once."""
    url = store_url
    records = tmp_path / "runs.jsonl"
    hold = tmp_path / "go"
    options = {"lease_ttl": 30, "idle_wait": 0.1, "sweep_every": 60}
    old: Worker | None = None
    try:
        async with so.Runtime([make_agent(str(records))], store=url, inline=False) as front:
            sid = (await front.generate(AGENT, prompt="Refund order 1042")).session_id
            old = Worker(url, tmp_path, "old", records, delay=0.0, hold=hold, **options)
            pending: list[so.InputRequest] = []
            deadline = time.monotonic() + 20
            while not pending:
                assert time.monotonic() < deadline, "no approval asked"
                await asyncio.sleep(0.05)
                pending = await front.pending(session_id=sid)
            answer = so.InputResponse(request_id=pending[0].id, option_id="approve")
            assert (await front.respond(sid, [answer])).outcomes[0].applied
            await _until(lambda: read_records(records), "the tool body started")

            where = "sk = (SELECT sk FROM {t}sessions WHERE id = {p})"
            [(held,)] = query(url, "SELECT token FROM {t}leases WHERE " + where, sid)
            edit(url, "DELETE FROM {t}leases WHERE " + where, sid)
            now = front.now()
            while True:  # asked for until it is given the worker's token
                token = await front.store.acquire_lease(sid, "restored", 30, now)
                assert token is not None and token <= held
                if token == held:
                    break
                await front.store.release_lease(sid, "restored", token)
            hold.touch()
            await _until(lambda: f"lease {held} lost" in old.log(), "fenced")
            assert _count(url, "tool.completed") == 0 and _count(url, "turn.completed") == 0
            os.kill(old.pid, signal.SIGKILL)
            old.proc.wait(timeout=10)

            await front.store.release_lease(sid, "restored", held)
            survivor = Worker(url, tmp_path, "new", records, delay=0.0, **options)
            try:
                await _until(lambda: _count(url, "turn.completed") == 1, "the turn completed")
            finally:
                survivor.close()
            state = await front.state(sid)
            assert state.turn is not None and state.turn.text == "Refunded."
        starts = [p for what, _, p in read_records(records) if what == "start"]
        assert starts == [old.pid, survivor.pid]
        for type_ in ("tool.started", "tool.completed", "turn.completed", "approval.settled"):
            assert _count(url, type_) == 1, type_
        check_logs(url)
    finally:
        if old is not None:
            old.close()
