"""The bounds an answer meets: a free-text answer, a decision's value or an edit is refused
(`InvalidAnswer`) over the `max_result_bytes` of the call it becomes the result of; a call
answers at most `MAX_ANSWERS` requests, and `generate(approvals=)` all those pending."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ._agent import Limits
from ._exceptions import InvalidAnswer, PartialAnswer
from ._tool_json import over_limit, result_bound
from ._tools import Tool
from ._types import MAX_ANSWERS, InputRequest

if TYPE_CHECKING:
    from ._state import SessionState

__all__ = ["answer_bound", "check_all_answered", "check_count", "check_size"]

_IN_BATCHES = "answer them with respond() in batches, over HTTP POST /v1/sessions/{}/responses"


def answer_bound(request: InputRequest, tool: Tool | None, limits: Limits) -> int:
    """The bound on the result `request`'s answer makes its call return: its tool's when this
    runtime has it (it runs the call on), else the one recorded when it asked, else `limits`'
    (the default, which a question leaves unrecorded)."""
    if tool is None and request.max_result_bytes is not None:
        return request.max_result_bytes
    return result_bound(tool, limits)


def check_size(request: InputRequest, what: str, value: Any, limit: int) -> None:
    """Refuse an edit or a value over the tool's `max_result_bytes`: the call's result repeats
    it to the model, which reads it again in every later call of the session."""
    why = over_limit(
        f"request {request.id}: the {what} is",
        value,
        limit,
        tail=f"(max_result_bytes of {request.tool_name})",
    )
    if why is not None:
        raise InvalidAnswer(why, [request.id])


def check_count(session_id: str, count: int, *, require_all: bool) -> None:
    """Refuse more than `MAX_ANSWERS` answers in one call, before anything is read. For
    `generate(approvals=)` (`require_all`), which must settle every pending request at once,
    batches are no way out: `respond()`'s are."""
    if count <= MAX_ANSWERS:
        return
    how = "send them in batches"
    if require_all:
        how = "generate(approvals=...) settles every pending request at once, so " + (
            _IN_BATCHES.format(session_id)
        )
    raise InvalidAnswer(f"at most {MAX_ANSWERS} answers in one call, not {count}: {how}")


def check_all_answered(state: SessionState, answered: Iterable[str]) -> None:
    """Refuse a `generate(approvals=)` that leaves a pending request of `state` open
    (`PartialAnswer`); when more are pending than one call answers (a subagent's mirrored
    requests count), say how they can be: with `respond()`, in batches."""
    ids = set(answered)
    pending = state.pending_requests()
    missing = [r for r in pending if r.id not in ids]
    if not missing:
        return
    way_out = None
    if len(pending) > MAX_ANSWERS:
        way_out = (
            f"{len(pending)} requests are pending, and one call answers at most {MAX_ANSWERS}: "
            + _IN_BATCHES.format(state.id)
        )
    raise PartialAnswer(
        state.id,
        [r.id for r in missing],
        [r.id for r in missing if r.kind != "tool-approval"],
        way_out=way_out,
    )
