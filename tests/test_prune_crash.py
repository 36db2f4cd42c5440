"""`Runtime.prune` SIGKILLed around the commit of its second session's deletion, on each store:
the first session (with its subagent's) is gone, the second wholly there or wholly gone, the
third whole, and the store verifies; the next prune deletes the rest, never half a session."""

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
from .test_deletion_crash import _cancelled_pair


@pytest.fixture
def children(tmp_path: Path) -> Iterator[Forks]:
    forks = Forks("tests._prune_crash", tmp_path)
    try:
        yield forks
    finally:
        forks.close()


async def _gone(url: str, pairs: list[tuple[str, str]]) -> list[bool]:
    """Which pairs are gone (each is wholly there or wholly gone, its deletion recorded once
    if gone); the whole store verifies."""
    async with so.Runtime(agents(), store=url) as rt:
        entries = await rt.audit(stream=DELETIONS_STREAM)
        gone = []
        for parent, child in pairs:
            here = [await rt.store.head(sid) is not None for sid in (parent, child)]
            assert here[0] == here[1], here  # never one without the other
            recorded = [e for e in entries if e.data["session_id"] == parent]
            assert len(recorded) == (0 if here[0] else 1)
            if here[0]:
                assert await rt.verify_audit(parent) == []
                assert await rt.verify_audit(child) == []
            gone.append(not here[0])
        assert len(entries) == sum(gone)
        assert await rt.verify_audit() == []
        return gone


@pytest.mark.parametrize("when", ["before", "after"])
async def test_a_prune_killed_between_sessions_leaves_each_whole_or_gone(
    store_url: str, children: Forks, when: str
) -> None:
    pairs = [await _cancelled_pair(store_url) for _ in range(3)]
    rc, _ = children.run(store_url, when, "2")
    assert rc == -signal.SIGKILL, children.stderr()
    _proof.record("crash-outside:kills")
    assert await _gone(store_url, pairs) == [True, when == "after", False]
    async with so.Runtime(agents(), store=store_url) as rt:  # the next run goes on
        rest = [p for p, _ in pairs[1 if when == "before" else 2 :]]
        assert await rt.prune(older_than=0) == rest
    assert await _gone(store_url, pairs) == [True, True, True]
