"""The parts of a session state (`_state_parts`): a call's journal as its entries are recorded,
and an approval as its settling leaves it."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from typing import Any

import pytest

import signoff as so
from signoff._state_parts import CallState, settled_applied


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
    assert call.journal is not None and call.journal[:40] == [None] * 40
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


def test_a_keyed_journal_read_whole_places_entries_where_they_are() -> None:
    """A call built with its journal (an older snapshot's, which held it whole) finds its entries
    again: recording one replaces it where it is. A copy leaves the journal out (read back from
    the events when a body needs it) and keeps what is kept beside it; recording into the copy
    changes nothing of the original."""
    entries: list[dict[str, Any] | None] = [
        {"kind": "step", "name": "a", "result": 1, "n": 0},
        {"kind": "ask", "name": "a", "request_id": "r", "n": 0},
        {"kind": "step", "name": "a", "result": 2, "n": 1},
    ]
    state = _positional_call_state()
    assert state.turn is not None
    state.turn.calls["c"] = CallState(id="c", tool_name="x", input={}, keyed=True, journal=entries)
    state.turn.calls["c"].kept_beside()
    copy = state.copy()
    assert copy.turn is not None
    copied = copy.turn.calls["c"]
    assert copied.journal is None and copied.journaled and copied.keyed
    copied.record(1, {"kind": "step", "name": "subagent.session", "result": "ses_2", "child": True})
    assert copied.subagents() == ["ses_2"]
    original = state.turn.calls["c"]
    assert [e and e.get("result") for e in original.journal or []] == [1, None, 2]
    assert original.subagents() == []
    original.record(1, {"kind": "step", "name": "a", "result": 3})
    original.record(0, {"kind": "ask", "name": "a", "request_id": "r2"})
    assert original.journal == [
        {"kind": "step", "name": "a", "result": 1, "n": 0},
        {"kind": "ask", "name": "a", "request_id": "r2", "n": 0},
        {"kind": "step", "name": "a", "result": 3, "n": 1},
    ]


def test_the_children_kept_beside_the_journal_are_those_it_holds() -> None:
    """`subagents()` reads what `record` keeps beside the journal, so it needs no journal: the
    children are those of the entries as they stand, in the journal's order (positional
    entries before keyed ones), an entry replaced by another step dropping its child; the same
    as read from a whole journal (`kept_beside`)."""
    child = "subagent.session"
    positional = CallState(id="c", tool_name="x", input={})
    positional.record(3, {"kind": "step", "name": child, "result": "ses_3", "child": True})
    positional.record(1, {"kind": "step", "name": child, "result": "ses_1", "child": True})
    positional.record(0, {"kind": "step", "name": child, "result": "ses_0", "child": True})
    positional.record(0, {"kind": "step", "name": "other", "result": "x"})  # replaced
    positional.record(2, {"kind": "ask", "name": child, "request_id": "r"})
    positional.keyed = True  # as an older signoff's `tool.started` marked it, after entries
    positional.record(0, {"kind": "step", "name": child, "result": "ses_k0", "child": True})
    positional.record(0, {"kind": "ask", "name": child, "request_id": "r2"})  # not a step's
    positional.record(1, {"kind": "step", "name": child, "result": {"not": "an id"}, "child": True})
    assert positional.subagents() == ["ses_1", "ses_3", "ses_k0"]
    whole = CallState(id="c", tool_name="x", input={}, keyed=True, journal=positional.journal)
    whole.kept_beside()
    assert whole.subagents() == positional.subagents() and whole.kids == positional.kids
    assert whole.journaled
    without = CallState(id="c", tool_name="x", input={}, journal=None)
    without.record(3, {"kind": "step", "name": child, "result": "ses_3", "child": True})
    without.record(1, {"kind": "step", "name": child, "result": "ses_1", "child": True})
    assert without.subagents() == ["ses_1", "ses_3"] and without.journal is None


def test_only_a_delegate_calls_own_step_makes_a_session_its_child() -> None:
    """A `subagent.session` step names the call's child if it is marked so (`child`, as a
    delegate call journals it) or, unmarked as an older signoff journaled it, names the session
    the call's key derives (`child_id`); a tool's own step of that name naming any other session
    makes it no child, read as it is recorded or from a whole journal (`kept_beside`)."""
    name, key = "subagent.session", "ses_1:1:c"
    own = "ses_" + hashlib.sha256(f"{key}:subagent".encode()).hexdigest()[:20]
    for keyed in (False, True):
        call = CallState(id="c", tool_name="x", input={}, idempotency_key=key, keyed=keyed)
        call.record(0, {"kind": "step", "name": name, "result": "ses_other"})
        call.record(1, {"kind": "step", "name": name, "result": own})
        call.record(2, {"kind": "step", "name": name, "result": "ses_made", "child": True})
        assert call.subagents() == [own, "ses_made"]
        whole = CallState(
            id="c", tool_name="x", input={}, idempotency_key=key, keyed=keyed, journal=call.journal
        )
        whole.kept_beside()
        assert whole.kids == call.kids
    unkeyed = CallState(id="c", tool_name="x", input={})  # no key: only a marked step names one
    unkeyed.record(0, {"kind": "step", "name": name, "result": own})
    assert unkeyed.subagents() == []


def test_an_approvals_settling_gives_it_its_quorums_votes_and_nothing_else_does() -> None:
    """Approved with its quorum's votes (`approval.settled`, or a mirror's `input.resolved`),
    an approval holds them all; a deny, a settling that names no votes (one approver, or its
    deadline), or a question leaves the request as it was."""
    asked = so.InputRequest(
        kind="tool-approval",
        id="r1",
        session_id="s1",
        turn_id="t1",
        agent="a",
        created_at=1.0,
        approvers=2,
    )
    voted = asked.model_copy(update={"approved_by": ["bob"]})
    both = {"approved_by": ["bob", "carol"]}
    assert settled_applied(voted, {"decision": "approve", **both}).approved_by == ["bob", "carol"]
    assert settled_applied(asked, {"outcome": "approved", **both}).approved_by == ["bob", "carol"]
    for data in (
        {"decision": "cancel", **both},
        {"outcome": "cancelled", **both},
        {"decision": "approve", "approved_by": None},
        {"outcome": "approved"},
    ):
        assert settled_applied(voted, data) is voted
    question = voted.model_copy(update={"kind": "question"})
    assert settled_applied(question, {"outcome": "approved", **both}) is question
