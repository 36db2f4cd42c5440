"""`Runtime.delete_session` SIGKILLed right before and right after its commit, on each store:
the session and its subagent's session are then either wholly there (and their trails verify)
or wholly gone with the deletion recorded once (and the whole store verifies), never half; a
deletion asked again then finishes it or finds nothing."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

import signoff as so
from signoff.stores._deletions import DELETIONS_STREAM

from . import _proof
from ._deletion_crash import agents
from ._forks import Forks
from ._subagents import ALICE
from .test_subagents_spend import waiting_child


@pytest.fixture
def children(tmp_path: Path) -> Iterator[Forks]:
    forks = Forks("tests._deletion_crash", tmp_path)
    try:
        yield forks
    finally:
        forks.close()


async def _cancelled_pair(url: str) -> tuple[str, str]:
    async with so.Runtime(agents(), store=url) as rt:
        parent, child = await waiting_child(rt)
        await rt.cancel(parent, principal=ALICE)
        return parent, child


async def _whole_or_gone(url: str, parent: str, child: str) -> bool:
    """Whether the pair is gone (else it is wholly there); either way the store verifies."""
    async with so.Runtime(agents(), store=url) as rt:
        here = [await rt.store.head(sid) is not None for sid in (parent, child)]
        assert here[0] == here[1], here  # never one without the other
        recorded = [
            e for e in await rt.audit(stream=DELETIONS_STREAM) if e.data["session_id"] == parent
        ]
        assert len(recorded) == (0 if here[0] else 1)
        if here[0]:
            assert await rt.verify_audit(parent) == []
            assert await rt.verify_audit(child) == []
            assert (await rt.state(child)).turn is not None
        assert await rt.verify_audit() == []
        return not here[0]


@pytest.mark.parametrize("when", ["before", "after"])
async def test_a_deletion_killed_around_its_commit_leaves_all_or_nothing(
    store_url: str, children: Forks, when: str
) -> None:
    parent, child = await _cancelled_pair(store_url)
    rc, baseline = children.run(store_url, parent, "never")
    assert rc == 0 and baseline is not None, children.stderr()
    assert baseline["deleted"] == [parent, child]
    assert await _whole_or_gone(store_url, parent, child)
    parent, child = await _cancelled_pair(store_url)
    rc, _ = children.run(store_url, parent, when)
    assert rc == -signal.SIGKILL, children.stderr()
    _proof.record("crash-outside:kills")
    gone = await _whole_or_gone(store_url, parent, child)
    assert gone == (when == "after")
    # The operator, who got no answer, deletes again: finished, or nothing left to delete.
    async with so.Runtime(agents(), store=store_url) as rt:
        if gone:
            with pytest.raises(so.UnknownSession):
                await rt.delete_session(parent)
        else:
            assert await rt.delete_session(parent) == [parent, child]
    assert await _whole_or_gone(store_url, parent, child)
