"""`Runtime.cancel` of a parent whose subagent waits on an approval, SIGKILLed right before or
right after each of its writes (the parent's cancellation, the child's, what the child spent
counted in the parent). Nobody calling again, the next sweep cancels the child the dead cancel
did not reach. The caller, who got no answer, cancels again: the parent's turn and the child's
are each cancelled once, the spend counted once, nothing left pending, the audit trail verifies.

Not promised here: a cancel killed after the child's cancellation, before the spend's count,
leaves the parent owing it (`SessionState.owed`) until the parent is cancelled again or driven
(`Runtime._recover` counts it before its next turn runs); a sweep does not count it: it
lists only live orphans."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

import signoff as so

from . import _proof
from ._cancel_crash import agents
from ._forks import Forks
from ._procs import lapse_leases
from ._subagents import ALICE, events
from .test_subagents_spend import spent, tokens, waiting_child


@pytest.fixture
def children(tmp_path: Path) -> Iterator[Forks]:
    forks = Forks("tests._cancel_crash", tmp_path)
    try:
        yield forks
    finally:
        forks.close()


async def _cancels(rt: so.Runtime, session_id: str) -> int:
    return sum(e.type == "turn.cancelled" for e in await events(rt, session_id))


async def _cancelled_once(url: str, parent: str, child: str) -> None:
    """The parent's turn and its child's each cancelled once, what the child spent counted in
    the parent once, nothing of either pending."""
    async with so.Runtime(agents(), store=url) as rt:
        for sid in (parent, child):
            turn = (await rt.state(sid)).turn
            assert turn is not None and turn.status == "cancelled", (sid, turn)
            assert await _cancels(rt, sid) == 1, sid
            assert await rt.pending(session_id=sid) == [], sid
        assert await spent(rt, parent) == [
            {"session_id": child, "delegated": tokens(40).model_dump()}
        ]
        assert (await rt.state(parent)).delegated == tokens(40)


async def _child_cancelled(url: str, parent: str, child: str) -> None:
    """After a sweep: the parent's turn and the child's each cancelled once, nothing of either
    pending, the child's spend counted at most once (a cancel killed after the child's commit,
    before the count, leaves it owed: see the module's docstring)."""
    async with so.Runtime(agents(), store=url) as rt:
        for sid in (parent, child):
            turn = (await rt.state(sid)).turn
            assert turn is not None and turn.status == "cancelled", (sid, turn)
            assert await _cancels(rt, sid) == 1, sid
            assert await rt.pending(session_id=sid) == [], sid
        assert len(await spent(rt, parent)) <= 1


async def _untouched(url: str, parent: str, child: str) -> None:
    """Nothing of the cancel recorded: both turns still wait, each on its request."""
    async with so.Runtime(agents(), store=url) as rt:
        for sid in (parent, child):
            turn = (await rt.state(sid)).turn
            assert turn is not None and turn.status == "waiting", (sid, turn)
            assert await _cancels(rt, sid) == 0, sid
            assert len(await rt.pending(session_id=sid)) == 1, sid
        assert await spent(rt, parent) == []


async def _waiting_child(url: str) -> tuple[str, str]:
    async with so.Runtime(agents(), store=url) as rt:
        return await waiting_child(rt)


@pytest.mark.parametrize("when", ["before", "after"])
async def test_a_cancel_killed_around_each_write_is_finished_once(
    store_url: str, children: Forks, when: str
) -> None:
    parent, child = await _waiting_child(store_url)
    rc, baseline = children.run(store_url, parent, "0", when)
    assert rc == 0 and baseline is not None, children.stderr()
    assert baseline["status"] == "cancelled"
    await _cancelled_once(store_url, parent, child)
    labels = baseline["labels"]
    assert len(labels) >= 3, labels  # the parent's cancellation, the child's, the spend
    for point in range(1, len(labels) + 1):
        parent, child = await _waiting_child(store_url)
        rc, _ = children.run(store_url, parent, str(point), when)
        assert rc == -signal.SIGKILL, (point, children.stderr())
        _proof.record("crash-outside:kills")
        lapse_leases(store_url)  # as its TTL passing would
        # Nobody calls again: the sweep finishes what the dead cancel committed.
        async with so.Runtime(agents(), store=store_url) as rt:
            await rt.expire_due()
            turn = (await rt.state(parent)).turn
        assert turn is not None
        if turn.status == "cancelled":
            await _child_cancelled(store_url, parent, child)
        else:
            await _untouched(store_url, parent, child)
        # The caller, who got no answer, cancels again.
        async with so.Runtime(agents(), store=store_url) as rt:
            again = await rt.cancel(parent, principal=ALICE)
            assert again.status == "cancelled", point
        await _cancelled_once(store_url, parent, child)
    async with so.Runtime(agents(), store=store_url) as rt:
        assert await rt.expire_due() == 0
        assert await rt.pending() == []
        assert await rt.verify_audit() == []
