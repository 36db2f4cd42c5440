"""Whether a model's response can be recorded as it is: of its declared types, plain JSON, within
the agent's size and count limits; what the log holds is what a resumed drive reads back."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, get_args

from ._exceptions import ModelError
from ._text import cut
from ._tool_json import MAX_INPUT_DEPTH, key_not_text, nests_deeper
from ._types import (
    MODEL_NAME_MAX,
    CutOff,
    ModelResponse,
    ToolCall,
    Usage,
    reported_usage,
    usage_too_large,
)

if TYPE_CHECKING:
    from ._agent import Limits

__all__ = ["check_recordable"]


def check_recordable(response: ModelResponse, limits: Limits) -> dict[str, Any]:
    """Refuse a response the log cannot hold faithfully: one built past validation (fields of
    the wrong type could be recorded but never read back), NaN, infinity or objects that are
    not JSON (a NaN amount slips past `amount > 100`, infinity is read back as null), negative
    usage (which would give budget back) or usage too large to add up, tool-call input or
    reasoning nested deeper than `MAX_INPUT_DEPTH` levels, more tool calls than
    `max_calls_per_response`, or JSON over `max_response_bytes`. Returns the response as its
    JSON reads back, which the run records and reads as a resumed one does."""
    problem = _malformed(response)
    if problem is not None:
        raise ModelError(f"model response is malformed: {problem}")
    usage = response.usage
    if min(usage.input_tokens, usage.output_tokens, usage.cost_usd) < 0:
        raise ModelError(f"model response has negative usage: {usage!r}")
    if usage_too_large(usage):
        # Counted, a session's cost could add up to infinity, which no JSON reply can show.
        raise ModelError(f"model response has usage too large to add up: {usage!r}")
    if response.cost_reported:  # a refused reply's usage says so too, as `turn.failed` shows
        usage = reported_usage(usage)
    most, calls = limits.max_calls_per_response, len(response.tool_calls)
    if most is not None and calls > most:
        # Recorded, each gated call would open a request (and notify) of its own.
        raise ModelError(
            f"model response has {calls} tool calls, over the limit of {most} "
            "(max_calls_per_response)",
            usage=usage,
        )
    # Checked as given first: pydantic's dump below fails past about 250 levels.
    r = response
    for name, given in [(c.name, c.input) for c in r.tool_calls] + [(None, r.reasoning)]:
        if nests_deeper(given):
            raise _too_deep(name, usage)
    try:
        # Models and dataclasses in it are dicts here, their keys as they are, checked below.
        data: Any = response.model_dump()
    except (TypeError, ValueError, RecursionError) as exc:
        raise ModelError(
            f"model response is not plain JSON: {type(exc).__name__}: {exc}", usage=usage
        ) from None
    dumped = [(c.name, d["input"]) for c, d in zip(r.tool_calls, data["tool_calls"], strict=True)]
    for name, given in [*dumped, (None, data["reasoning"])]:
        if nests_deeper(given):  # a model in it is a level more
            raise _too_deep(name, usage)
        problem = key_not_text(given)
        if problem is not None:
            raise _not_plain(name, problem, usage)
    try:
        text = json.dumps(data, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        raise ModelError(
            f"model response is not plain JSON: {type(exc).__name__}: {exc}", usage=usage
        ) from None
    size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
    max_bytes = limits.max_response_bytes
    if size > max_bytes:
        # Stored, it would be sent back on every later model call of the session, and fail it.
        raise ModelError(
            f"model response is {size} bytes, over the limit of {max_bytes} bytes "
            "(max_response_bytes)",
            usage=usage,
        )
    return json.loads(text)  # type: ignore[no-any-return]


def _too_deep(name: str | None, usage: Usage) -> ModelError:
    """Recorded, input nested this deep would fail every later drive: pydantic cannot show it
    to a reviewer."""
    if name is None:
        what = f"reasoning nested deeper than {MAX_INPUT_DEPTH} levels"
    else:
        what = (
            f"a call to {cut(name, 100)!r} whose input nests deeper than {MAX_INPUT_DEPTH} levels"
        )
    return ModelError(f"model response has {what}", usage=usage)


def _not_plain(name: str | None, problem: str, usage: Usage) -> ModelError:
    """Recorded as JSON, a key that is not text would be text on replay: the tool would see
    another input."""
    what = "reasoning that is" if name is None else f"a call to {cut(name, 100)!r} whose input is"
    return ModelError(f"model response has {what} not plain JSON: its {problem}", usage=usage)


def _malformed(response: ModelResponse) -> str | None:
    """What in `response` is not of its declared type, as `ModelResponse.model_construct` or a
    list appended to can leave it: checked by hand, as validating it again costs more."""
    r: Any = response
    if not isinstance(r.text, str):
        return f"text is a {type(r.text).__name__}, not a str"
    if not isinstance(r.reasoning, list) or not all(isinstance(b, dict) for b in r.reasoning):
        return "reasoning is not a list of objects"
    u = r.usage
    if not (
        isinstance(u, Usage)
        and type(u.input_tokens) is int
        and type(u.output_tokens) is int
        and type(u.cost_usd) in (int, float)
    ):
        return f"usage is not a Usage of two whole numbers and a cost ({type(u).__name__})"
    n = r.context_tokens
    if n is not None and (type(n) is not int or n < 0):
        return f"context_tokens is {cut(repr(n), 100)}, not a whole number >= 0 or None"
    if r.cut_off not in (None, *get_args(CutOff)):
        return f"cut_off is {cut(repr(r.cut_off), 100)}, not max_tokens, content_filter or None"
    m = r.model
    if m is not None and not (
        isinstance(m, str) and 0 < len(m) <= MODEL_NAME_MAX and m.isprintable()
    ):
        most = MODEL_NAME_MAX
        return f"model is {cut(repr(m), 100)}, not a printable name of 1 to {most} characters"
    if not isinstance(r.tool_calls, list):
        return "tool_calls is not a list"
    for c in r.tool_calls:
        if not isinstance(c, ToolCall):
            return f"a tool call is a {type(c).__name__}, not a ToolCall"
        if not isinstance(c.name, str) or not (c.id is None or isinstance(c.id, str)):
            kinds = f"{type(c.name).__name__}, {type(c.id).__name__}"
            return f"a tool call's name or id is not text ({kinds})"
    return None
