"""The parts of a session state (`_state_parts`): a call's journal as its entries are recorded."""

from __future__ import annotations

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
