"""A call with an idempotency key (`generate`, or a scheduled run's `schedule`) SIGKILLed right
before or right after each commit it makes (its session with its message, one write; the
model's answer; the turn's end): the client, which got no answer, sends it again with the same
key, and exactly one conversation holds the message, once, with the answer the uninterrupted
call gives."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

import signoff as so
from signoff._idempotency import keyed, session_for
from signoff.stores import open_store

from . import _proof
from ._forks import Forks
from ._keyed_child import ALICE
from ._procs import lapse_leases


async def _head(url: str, key: str, call: str) -> int | None:
    """The head of the session a call with `key` (Alice's, or the app's for a `schedule`)
    starts, None if there is none."""
    who = so.APP_PRINCIPAL if call == "schedule" else ALICE
    idem = keyed(key, who, "start", "chat", "hello")
    assert idem is not None
    store = open_store(url)
    await store.open()
    try:
        return await store.head(session_for(idem))
    finally:
        await store.close()


@pytest.fixture
def children(tmp_path: Path) -> Iterator[Forks]:
    forks = Forks("tests._keyed_child", tmp_path)
    try:
        yield forks
    finally:
        forks.close()


@pytest.mark.parametrize("call", ["generate", "schedule"])
@pytest.mark.parametrize("when", ["before", "after"])
async def test_a_keyed_call_killed_at_each_commit_is_sent_again_once(
    store_url: str, children: Forks, when: str, call: str
) -> None:
    rc, baseline = children.run(store_url, "baseline", "0", when, call)
    assert rc == 0 and baseline is not None, children.stderr()
    assert (baseline["status"], baseline["text"], baseline["replayed"]) == (
        "completed",
        "ok",
        False,
    )
    assert baseline["points"] >= 2  # the session with its message, the model's answer...
    # The first write makes the session and starts its turn: no commit of its own does.
    assert baseline["labels"][0] == "session.created"
    assert "turn.started" not in baseline["labels"]
    keys = {"baseline": baseline["session"]}
    for point in range(1, baseline["points"] + 1):
        key = f"k-{point}"
        rc, _ = children.run(store_url, key, str(point), when, call)
        assert rc == -signal.SIGKILL, (point, children.stderr())
        _proof.record("crash-outside:kills")
        lapse_leases(store_url)  # as its TTL passing would
        if point == 1:
            # Killed before the session exists: nothing; after: the session and its message.
            assert await _head(store_url, key, call) == (None if when == "before" else 2)
        rc, again = children.run(store_url, key, "0", when, call)
        assert rc == 0 and again is not None, (point, children.stderr())
        assert (again["status"], again["text"]) == ("completed", "ok"), (point, again)
        keys[key] = again["session"]
        repeat = children.run(store_url, key, "0", when, call)[1]
        assert repeat is not None and repeat["replayed"] and repeat["session"] == again["session"]

    async with so.Runtime([], store=store_url) as rt:
        assert sorted(s.id for s in await rt.sessions()) == sorted(keys.values())
        for key, sid in keys.items():
            events = [e async for e in rt.events(sid, follow=False)]
            started = [e.data["message"] for e in events if e.type == "turn.started"]
            assert started == ["hello"], (key, started)
            answers = [e.data.get("text") for e in events if e.type == "model.completed"]
            assert answers == ["ok"], (key, answers)
        assert await rt.verify_audit() == []
