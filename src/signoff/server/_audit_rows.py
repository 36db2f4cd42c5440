"""A row of the dashboard's audit page: a closed request, how it closed, by whom and why."""

from __future__ import annotations

import json
from typing import Any

from .._types import InputRequest
from ..stores import StoredRequest

__all__ = ["audit_row"]


def audit_row(request: InputRequest, stored: StoredRequest | None) -> dict[str, Any]:
    """What the audit page shows of `request`, closed as `stored` keeps it."""
    resolution = (stored.resolution if stored else None) or {}
    outcome = stored.outcome if stored else None
    # Cut, as the answer is: a reason of megabytes made a page of megabytes.
    reason = _cut(resolution.get("reason"))
    return {
        "request": request,
        "outcome": outcome,
        # Closed `expired`, but its deadline approved it (`on_timeout="approve"`).
        "approved_on_timeout": outcome == "expired" and resolution.get("on_timeout") == "approve",
        "by": resolution.get("by"),
        "reason": reason,
        "reason_cut": reason != resolution.get("reason"),  # the rest a link away
        "answer": _answer(resolution),
        # The arguments an approver ran the call with instead of those proposed.
        "edited": resolution.get("edited_input"),
    }


def _answer(resolution: dict[str, Any]) -> str | None:
    """What a person answered, as the audit shows it: a question's answer (kept under
    `answer`), else a decision's value; text as it is, other JSON as JSON, cut at 300."""
    answer = resolution.get("answer")
    return _cut(answer.get("value") if isinstance(answer, dict) else resolution.get("value"))


def _cut(value: Any) -> str | None:
    """`value` as the audit shows it: text as it is, other JSON as JSON, cut at 300."""
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 300 else text[:300] + "…"
