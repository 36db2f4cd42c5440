"""`_answers`: how a second answer to a settled request is told apart from the first."""

from __future__ import annotations

import pytest

import signoff as so
from signoff._answers import repeat


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
