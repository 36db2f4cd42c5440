"""`Runtime.cancel` of a session whose approval's `on_timeout="approve"` deadline passed
unrecorded (its own, or its subagent's behind a mirror), SIGKILLed right before or right after
each of its writes. The deadline's record goes in the cancel's own commit (the subagent's in the
subagent's cancel, after its parent's): no write leaves the turn the deadline resumed runnable
before it is cancelled, so neither a sweep after the kill nor the caller's repeat runs the call
the deadline approved. A cancel used to record the deadline first, then cancel: killed in
between, the next sweep drove the turn on and the refund ran. Both stores."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

import signoff as so
from signoff.testing import ExecutionLog

from . import _proof
from ._cancel_deadline_crash import agents, waiting
from ._forks import Forks
from ._procs import lapse_leases
from ._subagents import ALICE


@pytest.fixture
def children(tmp_path: Path) -> Iterator[Forks]:
    forks = Forks("tests._cancel_deadline_crash", tmp_path)
    try:
        yield forks
    finally:
        forks.close()


async def _cancelled(url: str, sid: str, kind: str, log: str) -> None:
    """The session's turn (and its subagent's) cancelled once, the deadline's approval recorded
    once, its request (and the mirror) closed `expired`, nothing pending, the refund never run."""
    async with so.Runtime(agents(kind, log), store=url) as rt:
        state = await rt.state(sid)
        [mirror] = [live.request for live in state.requests.values()]
        sids = [sid] if mirror.child is None else [sid, mirror.child.session_id]
        asked = mirror if mirror.child is None else None
        for s in sids:
            turn = (await rt.state(s)).turn
            assert turn is not None and turn.status == "cancelled", (s, turn)
            evs = [e async for e in rt.events(s, follow=False)]
            types = [e.type for e in evs]
            assert types.count("turn.cancelled") == 1, (s, types)
            refunds = [
                e for e in evs if e.type == "tool.started" and e.data["tool_name"] == "refund"
            ]
            assert refunds == [], (s, types)
            assert await rt.pending(session_id=s) == [], s
        for rid in [mirror.id] + ([] if mirror.child is None else [mirror.child.request_id]):
            stored = await rt.store.get_request(rid)
            assert stored is not None and stored.status == "expired", (rid, stored)
        owner = sids[-1]  # the session whose request the deadline approved
        settled = [e async for e in rt.events(owner, follow=False) if e.type == "approval.settled"]
        assert [e.data.get("auto") for e in settled] == ["timeout"], settled
        assert asked is None or asked.id == settled[0].data["request_id"]
        assert ExecutionLog(log).executions == []


@pytest.mark.parametrize("kind", ["own", "behind"])
@pytest.mark.parametrize("when", ["before", "after"])
async def test_a_cancel_killed_around_each_write_never_runs_what_the_deadline_approved(
    store_url: str, children: Forks, tmp_path: Path, kind: str, when: str
) -> None:
    log = str(tmp_path / "ran.log")
    sid = await waiting(store_url, kind, log)
    rc, baseline = children.run(store_url, sid, kind, log, "0", when)
    assert rc == 0 and baseline is not None, children.stderr()
    assert (baseline["status"], baseline["cancelled"]) == ("cancelled", True)
    await _cancelled(store_url, sid, kind, log)
    labels = baseline["labels"]
    for point in range(1, len(labels) + 1):
        sid = await waiting(store_url, kind, log)
        rc, _ = children.run(store_url, sid, kind, log, str(point), when)
        assert rc == -signal.SIGKILL, (point, children.stderr())
        _proof.record("crash-outside:kills")
        lapse_leases(store_url)  # as its TTL passing would
        if when == "after":
            # Nobody calls again: the session's cancel is recorded, and the sweep cancels the
            # subagent it did not reach (not running the call its deadline approved).
            async with so.Runtime(agents(kind, log), store=store_url) as rt:
                await rt.expire_due()
            await _cancelled(store_url, sid, kind, log)
        # The caller, who got no answer, cancels again (before any sweep, when the kill came
        # before a write: nothing of it recorded, the deadline is time's to apply, as it would
        # have without the cancel); a sweep then finds nothing to do.
        async with so.Runtime(agents(kind, log), store=store_url) as rt:
            again = await rt.cancel(sid, "never mind", principal=ALICE)
            assert again.status == "cancelled", point
            await rt.expire_due()
        await _cancelled(store_url, sid, kind, log)
    async with so.Runtime(agents(kind, log), store=store_url) as rt:
        assert await rt.expire_due() == 0
        assert await rt.pending() == []
        assert await rt.verify_audit() == []
    # One commit records the deadline and cancels: its own (`approval.settled` first), or the
    # parent's (the mirror closed `expired`, the cancel) and then the subagent's.
    if kind == "own":
        assert labels == ["approval.settled"]
    else:
        assert labels == ["input.resolved", "approval.settled", "subagent.spent"]
