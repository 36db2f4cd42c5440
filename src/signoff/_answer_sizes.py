"""The bounds an answer meets: a free-text answer, a decision's value or an edit is refused
(`InvalidAnswer`) over the `max_result_bytes` of the call it becomes the result of."""

from __future__ import annotations

from typing import Any

from ._agent import Limits
from ._exceptions import InvalidAnswer
from ._tool_json import over_limit, result_bound
from ._tools import Tool
from ._types import InputRequest

__all__ = ["answer_bound", "check_size"]


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
