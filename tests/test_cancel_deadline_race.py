"""A worker claiming the session at a cancel's first write, when the approval's
`on_timeout="approve"` deadline had passed unrecorded (the session's own, or its subagent's
behind a mirror): the cancel used to record the deadline in one write, with no lease held, and
cancel in the next; in between the turn the deadline resumed was runnable, and a worker
(`inline=False`, `serve --workers`) claiming it ran the refund the cancel was to stop (the
turn completed, the cancel said `cancelled: False`). The deadline's record now goes in the
cancel's own commit (the subagent's in its cancel, after its parent's): the worker finds
nothing to run. Both stores."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

import signoff as so
from signoff.stores._base import AUDIT_RECORDED, LEASE_RENEWED
from signoff.testing import ExecutionLog

from ._cancel_deadline_crash import agents, waiting
from ._subagents import ALICE


def _work_a_while(url: str, sid: str, kind: str, log: str) -> None:
    """Run a worker, on a loop and runtime of its own, until the session it could claim (the
    subagent's, `behind`) no longer reads `running` (it ran its turn, or never could), or 10 s."""

    async def work() -> None:
        async with so.Runtime(agents(kind, log), store=url, inline=False) as rt:
            stop = asyncio.Event()
            task = asyncio.create_task(rt.work(stop=stop, idle_wait=0.05))
            try:
                state = await rt.state(sid)
                if kind == "behind":
                    [mirror] = [live.request for live in state.requests.values()]
                    assert mirror.child is not None
                    state = await rt.state(mirror.child.session_id)
                ends = time.monotonic() + 10
                while state.status == "running" and time.monotonic() < ends:
                    await asyncio.sleep(0.05)
                    state = await rt.state(state.id)
            finally:
                stop.set()
                await task

    thread = threading.Thread(target=lambda: asyncio.run(work()))
    thread.start()
    thread.join()


@pytest.mark.parametrize("kind", ["own", "behind"])
async def test_a_worker_claiming_at_the_cancels_first_write_runs_nothing(
    store_url: str, tmp_path: Path, kind: str
) -> None:
    log = str(tmp_path / "ran.log")
    sid = await waiting(store_url, kind, log)
    writes: list[str] = []
    async with so.Runtime(agents(kind, log), store=store_url) as rt:

        def hook(at: str, label: str) -> None:
            if at != "after" or label in (AUDIT_RECORDED, LEASE_RENEWED):
                return
            writes.append(label)
            if len(writes) == 1:  # a worker's claim right after the cancel's first write
                _work_a_while(store_url, sid, kind, log)

        rt.store.set_fault_hook(hook)
        try:
            done = await rt.cancel(sid, "never mind", principal=ALICE)
        finally:
            rt.store.set_fault_hook(None)
        assert (done.status, done.cancelled) == ("cancelled", True), done
        assert ExecutionLog(log).executions == []
        state = await rt.state(sid)
        [mirror] = [live.request for live in state.requests.values()]
        rids = [mirror.id] + ([] if mirror.child is None else [mirror.child.request_id])
        for rid in rids:  # the deadline's close, not the cancel's withdrawal
            stored = await rt.store.get_request(rid)
            assert stored is not None and stored.status == "expired", (rid, stored)
        if mirror.child is not None:
            assert (await rt.state(mirror.child.session_id)).status == "cancelled"
        assert await rt.verify_audit() == []
