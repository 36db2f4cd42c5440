"""The parts of a session state (`_state_parts`): a call's journal as its entries are recorded."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

import signoff as so
from signoff._state_parts import CallState


def test_a_keyed_journal_keeps_one_entry_per_kind_name_and_occurrence() -> None:
    """Entries are found by kind, name and occurrence: recording the same one again replaces it
    in place (a replay reads the newest), and each occurrence of a name keeps its own entry."""
    call = CallState(id="c1", tool_name="t", input={}, keyed=True)
    call.record(0, {"kind": "step", "name": "charge", "result": 1})
    call.record(1, {"kind": "step", "name": "charge", "result": 2})
    call.record(0, {"kind": "ask", "name": "Go?", "request_id": "req_1"})
    call.record(0, {"kind": "ask", "name": "Go?", "request_id": "req_2"})
    assert call.journal == [
        {"kind": "step", "name": "charge", "result": 1, "n": 0},
        {"kind": "step", "name": "charge", "result": 2, "n": 1},
        {"kind": "ask", "name": "Go?", "request_id": "req_2", "n": 0},
    ]


def test_a_positional_journal_keeps_each_entry_at_its_index() -> None:
    """A journal from before keys: an entry goes at its position, gaps stay empty."""
    call = CallState(id="c1", tool_name="t", input={})
    call.record(2, {"kind": "step", "name": "b", "result": None})
    call.record(0, {"kind": "step", "name": "a", "result": 1})
    assert call.journal == [
        {"kind": "step", "name": "a", "result": 1},
        None,
        {"kind": "step", "name": "b", "result": None},
    ]


def _positional_call_state() -> so.SessionState:
    """A state whose one call has a journal from before keys, with one entry."""
    state = so.SessionState(id="s")
    specs: list[tuple[str, str | None, dict[str, Any]]] = [
        ("session.created", None, {"agent": "a"}),
        ("turn.started", "t", {"message": "hi"}),
        ("model.completed", "t", {"tool_calls": [{"id": "c", "name": "x", "input": {}}]}),
        ("tool.started", "t", {"call_id": "c"}),
        ("tool.step", "t", {"call_id": "c", "name": "a", "index": 0, "result": 1}),
    ]
    for t, turn, data in specs:
        state.apply(
            so.Event(session_id="s", seq=state.seq + 1, type=t, at=1.0, turn_id=turn, data=data)  # type: ignore[arg-type]
        )
    return state


@pytest.mark.parametrize("index", [-1, 10**12, 1.5, "1"])
def test_a_positional_journal_refuses_an_index_no_signoff_writes(index: object) -> None:
    """A damaged step's position is named, not obeyed: a huge one would fill memory with gaps
    (for minutes, or until the process dies) and a negative one would overwrite another entry."""
    state = _positional_call_state()
    step = so.Event(
        session_id="s",
        seq=state.seq + 1,
        type="tool.step",
        at=1.0,
        turn_id="t",
        data={"call_id": "c", "name": "b", "index": index, "result": 2},
    )
    started = time.monotonic()
    with pytest.raises(so.StoreError, match="malformed"):
        state.apply(step)
    assert time.monotonic() - started < 5
    assert state.turn is not None
    assert state.turn.calls["c"].journal == [{"kind": "step", "name": "a", "result": 1}]


def test_a_positional_journal_takes_a_gap_that_concurrent_steps_leave() -> None:
    """Steps run together may be journaled out of order: a later position may come first."""
    call = CallState(id="c1", tool_name="t", input={})
    call.record(40, {"kind": "step", "name": "b", "result": None})
    assert call.journal[:40] == [None] * 40
    assert call.journal[40] == {"kind": "step", "name": "b", "result": None}


class Counted(list[dict[str, Any] | None]):
    """A journal that counts the entries read from it."""

    reads = 0

    def __iter__(self) -> Iterator[dict[str, Any] | None]:
        for entry in super().__iter__():
            self.reads += 1
            yield entry

    def __getitem__(self, i: Any) -> Any:
        self.reads += 1
        return super().__getitem__(i)


def test_recording_a_keyed_entry_reads_no_other_entry() -> None:
    """Each entry of a call of many steps is placed by a look-up, not a scan of the entries
    before it: folding N steps read N²/2 entries (minutes of replay for a long workflow)."""
    n = 2000
    call = CallState(id="c1", tool_name="t", input={}, keyed=True, journal=Counted())
    for i in range(n):
        call.record(0, {"kind": "step", "name": f"s{i}", "result": i})
    call.record(0, {"kind": "step", "name": "s7", "result": "again"})  # replaced in place
    assert isinstance(call.journal, Counted) and call.journal.reads == 0
    assert len(call.journal) == n and call.journal[7] == {
        "kind": "step",
        "name": "s7",
        "result": "again",
        "n": 0,
    }


def test_a_keyed_journal_from_a_snapshot_or_a_copy_places_entries_where_they_are() -> None:
    """A call built with its journal (a snapshot read, a state copied) finds its entries again:
    recording one replaces it where it is, in the copy only."""
    entries: list[dict[str, Any] | None] = [
        {"kind": "step", "name": "a", "result": 1, "n": 0},
        {"kind": "ask", "name": "a", "request_id": "r", "n": 0},
        {"kind": "step", "name": "a", "result": 2, "n": 1},
    ]
    state = _positional_call_state()
    assert state.turn is not None
    state.turn.calls["c"] = CallState(id="c", tool_name="x", input={}, keyed=True, journal=entries)
    copy = state.copy()
    assert copy.turn is not None
    copy.turn.calls["c"].record(1, {"kind": "step", "name": "a", "result": 3})
    copy.turn.calls["c"].record(0, {"kind": "step", "name": "b", "result": 4})
    assert [e and e.get("result") for e in copy.turn.calls["c"].journal] == [1, None, 3, 4]
    assert [e and e.get("result") for e in state.turn.calls["c"].journal] == [1, None, 2]
    state.turn.calls["c"].record(0, {"kind": "ask", "name": "a", "request_id": "r2"})
    assert state.turn.calls["c"].journal[1] == {
        "kind": "ask",
        "name": "a",
        "request_id": "r2",
        "n": 0,
    }
