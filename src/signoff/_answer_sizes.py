"""The bounds an answer meets: a free-text answer, a decision's value or an edit is refused
(`InvalidAnswer`) over the `max_result_bytes` of the call it becomes the result of; a call
answers at most `MAX_ANSWERS` requests, and `generate(approvals=)` all those pending."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ._agent import Limits
from ._ask import answered as question_result
from ._ask import echoes_answers
from ._exceptions import InvalidAnswer, PartialAnswer
from ._tool_json import over_limit, result_bound
from ._tools import Tool
from ._types import MAX_ANSWERS, InputRequest

if TYPE_CHECKING:
    from ._state import SessionState

__all__ = ["answer_bound", "check_all_answered", "check_bounds", "check_count", "check_size"]

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


def check_bounds(
    request: InputRequest, tool: Tool | None, wanted: dict[str, Any], limits: Limits
) -> None:
    """Refuse an answer to the open `request` whose free text, value or edit (in `wanted`, its
    resolution) is over the bound of the result it becomes (`check_size`)."""
    text = (wanted.get("answer") or {}).get("text")
    if text is not None and (tool is not None or request.source == "ask"):
        # A free-text answer is bounded as its question is, by the tool's result:
        # `ask_question` returns it whole, a tool's own `ctx.ask` as it likes.
        if tool is not None:
            echoed = echoes_answers(tool)
        else:  # unknown under the default bound, which records neither: stricter
            echoed = request.echoes_answer or request.max_result_bytes is None
        shown = question_result(text) if echoed else text
        check_size(request, "answer", shown, answer_bound(request, tool, limits))
    if wanted.get("value") is not None:
        # The decision on a tool's own approval is its call's result, value and all.
        check_size(request, "value", wanted["value"], answer_bound(request, tool, limits))
    if wanted.get("edited_input") is not None and tool is not None:
        check_size(request, "edited input", wanted["edited_input"], result_bound(tool, limits))


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
