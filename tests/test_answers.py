"""Answers on their way in (`_answers`): how a reply is checked against its request before
anything is recorded, and how a second answer to a settled request is told apart from the
first."""

from __future__ import annotations

from typing import Any

import pytest

import signoff as so
from signoff._answers import MAX_DEPTH, MAX_TEXT_BYTES, Reply, repeat, resolution


def question(**fields: Any) -> so.InputRequest:
    return so.InputRequest(
        id="req_1",
        kind="question",
        session_id="ses_1",
        turn_id="trn_1",
        agent="ops",
        question="Which plan?",
        created_at=1.0,
        **fields,
    )


def nested(levels: int) -> Any:
    """A value of `levels` lists, one inside the other."""
    value: Any = "x"
    for _ in range(levels):
        value = [value]
    return value


def test_a_hash_on_the_answer_to_a_question_bound_to_no_call_is_invalid_not_stale() -> None:
    """A question asked outside any call has no input hash to compare: an answer naming one is
    malformed (`InvalidAnswer`), not an answer to another version of the call (`StaleAnswer`)."""
    with pytest.raises(so.InvalidAnswer, match="bound to no call: it takes no input_hash"):
        resolution(question(allow_text=True), Reply("req_1", None, "pro", input_hash="sha256:x"))


def test_an_answers_value_may_nest_up_to_the_limit_and_no_deeper() -> None:
    request = question(allow_text=True)
    done = resolution(request, Reply("req_1", None, "pro", value=nested(MAX_DEPTH)))
    assert done["outcome"] == "answered"
    with pytest.raises(so.InvalidAnswer, match=f"nests deeper than {MAX_DEPTH} levels"):
        resolution(request, Reply("req_1", None, "pro", value=nested(MAX_DEPTH + 1)))


def test_an_answer_over_the_text_limit_is_refused() -> None:
    """What an answer records is bounded like any text a person sends (`MAX_TEXT_BYTES`), its
    value included; an answer just inside the bound is taken."""
    request = question(allow_text=True)
    small = resolution(request, Reply("req_1", None, "pro", value="x" * (MAX_TEXT_BYTES - 200)))
    assert small["outcome"] == "answered"
    with pytest.raises(so.InvalidAnswer, match=f"over the limit of {MAX_TEXT_BYTES}"):
        resolution(request, Reply("req_1", None, "pro", value="x" * (MAX_TEXT_BYTES + 1)))


def _request(kind: str) -> so.InputRequest:
    return so.InputRequest(
        kind=kind, id="req_1", session_id="ses_1", turn_id="trn_1", agent="a", created_at=0.0
    )


def test_a_conflicting_answer_says_a_cancelled_approval_was_denied() -> None:
    """A deny's outcome is `cancelled`: a person who typed `deny` reads that it was denied."""
    approval = _request("tool-approval")
    with pytest.raises(so.ConflictingAnswer) as denied_first:
        repeat(approval, "settled", {"outcome": "cancelled"}, {"outcome": "approved"})
    assert str(denied_first.value) == (
        "request req_1 was already settled as 'cancelled' (denied); this answer says 'approved'"
    )
    with pytest.raises(so.ConflictingAnswer) as approved_first:
        repeat(approval, "settled", {"outcome": "approved"}, {"outcome": "cancelled"})
    assert str(approved_first.value).endswith("this answer says 'cancelled' (denied)")
    question = _request("question")  # a question's `cancel` option is no deny
    with pytest.raises(so.ConflictingAnswer) as other:
        repeat(question, "settled", {"outcome": "answered"}, {"outcome": "cancelled"})
    assert str(other.value).endswith("already settled as 'answered'; this answer says 'cancelled'")
    same = repeat(approval, "settled", {"outcome": "cancelled"}, {"outcome": "cancelled"})
    assert (same.outcome, same.applied) == ("cancelled", False)
