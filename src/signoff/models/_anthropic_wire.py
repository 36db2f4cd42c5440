"""The messages API's wire format: signoff's conversation and tools as `Anthropic` sends them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .._exceptions import UsageError
from .._types import AssistantMessage, ToolResultMessage
from ._base import ToolSpec
from ._ids import anthropic_id_fits, wire_ids
from ._provider import encode_tool_result

__all__ = [
    "LEAST_THINKING",
    "REASONING",
    "check_thinking",
    "last_turn_thinks",
    "stand_in_tools",
    "thinking_on",
    "to_anthropic_messages",
    "to_anthropic_tool",
]

# The reasoning blocks of a response and their fields, sent back as they came.
REASONING = {"thinking": ("thinking", "signature"), "redacted_thinking": ("data",)}

# The least `budget_tokens` thinking takes.
LEAST_THINKING = 1024

# What a stand-in for a tool the conversation used and the agent no longer has says of itself.
_STAND_IN = "No longer available: this conversation used it earlier."


def to_anthropic_tool(spec: ToolSpec) -> dict[str, Any]:
    """A tool as a messages-API tool definition."""
    tool: dict[str, Any] = {"name": spec.name, "input_schema": spec.input_schema}
    if spec.description:
        tool["description"] = spec.description
    return tool


def stand_in_tools(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tools to declare for a request that has none while its conversation holds `tool_use`
    blocks (the agent's tools were removed since, or a model made a call up): the API refuses
    them without `tools`. One per tool the conversation names, taking any input, sent with
    `tool_choice` none so the model calls none of them."""
    names: dict[str, None] = {}  # in order, once each
    for m in messages:
        for b in m["content"]:
            if b["type"] == "tool_use":
                names[b["name"]] = None  # a name the API takes (`wire_name`)
    return [
        {"name": name, "description": _STAND_IN, "input_schema": {"type": "object"}}
        for name in names
    ]


def check_thinking(
    owner: str, params: Mapping[str, Any], max_tokens: int, *, interleaved: bool = False
) -> None:
    """Refuse a thinking `budget_tokens` the API refuses on every call (below 1,024, or not
    below `max_tokens`, as `params` or its `extra_body` set it): else every turn fails, in vain.
    With interleaved thinking (a beta) it is the whole turn's, and may pass `max_tokens`."""
    extra = params.get("extra_body")
    extra = extra if isinstance(extra, Mapping) else {}
    most = max_tokens
    for where in (params, extra):  # `extra_body` is merged last into the body the SDK sends
        given = where.get("max_tokens")
        if isinstance(given, int) and not isinstance(given, bool):
            most = given
    for where in (params, extra):
        thinking = where.get("thinking")
        if not isinstance(thinking, Mapping) or thinking.get("type") == "disabled":
            continue
        budget = thinking.get("budget_tokens")
        if not isinstance(budget, int) or isinstance(budget, bool):
            continue
        if not LEAST_THINKING <= budget < (math.inf if interleaved else most):
            below = "" if interleaved else f" and below max_tokens ({most:,})"
            raise UsageError(
                f"{owner}: thinking's budget_tokens must be at least {LEAST_THINKING:,}{below}, "
                f"not {budget:,}: the API refuses every call otherwise"
            )


def thinking_on(params: Mapping[str, Any]) -> bool:
    """Whether `params` turn thinking on (`thinking`, or `extra_body`'s `thinking`)."""
    extra = params.get("extra_body")
    for where in (params, extra if isinstance(extra, Mapping) else {}):
        thinking = where.get("thinking")
        if isinstance(thinking, Mapping) and thinking.get("type") != "disabled":
            return True
    return False


def last_turn_thinks(messages: list[dict[str, Any]]) -> bool:
    """Whether the API takes these messages with thinking on: the last turn (from the last user
    message that is not only tool results; a tool-use loop is one turn) uses no tools, or its
    first assistant message starts with a thinking block."""
    start = 0
    for i, m in enumerate(messages):
        if m["role"] == "user" and any(b["type"] != "tool_result" for b in m["content"]):
            start = i + 1
    turn = [m["content"] for m in messages[start:] if m["role"] == "assistant"]
    if not any(b["type"] == "tool_use" for blocks in turn for b in blocks):
        return True
    return turn[0][0]["type"] in REASONING


def to_anthropic_messages(messages: Any, *, thinking: bool = True) -> list[dict[str, Any]]:
    """The conversation as alternating user/assistant messages of content blocks.

    Tool results become `tool_result` blocks of the next user message (before any text, as the
    API requires); consecutive messages of one role are merged; empty ones are left out. The API
    refuses text of whitespace alone: the model's is left out, a person's says it was empty.
    Tool-call ids it refuses (another provider's, or repeated) are mapped to ones it takes.
    Thinking blocks go back only with `thinking` on: with it off the API refuses them.
    """
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if out and out[-1]["role"] == role:
            previous = out[-1]["content"]
            if role == "user" and blocks[0]["type"] == "tool_result":
                # results answer the assistant's calls: they go before any text of this message
                at = sum(1 for b in previous if b["type"] == "tool_result")
                previous[at:at] = blocks
            else:
                previous.extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for m in wire_ids(messages, anthropic_id_fits):
        if isinstance(m, AssistantMessage):
            # thinking first, as the API requires of the message holding the tool_use blocks
            reasoning = m.reasoning if thinking and m.tool_calls else []
            blocks: list[dict[str, Any]] = list(reasoning)
            if m.text.strip():
                blocks.append({"type": "text", "text": m.text})
            for c in m.tool_calls:
                tool_input = c.input if isinstance(c.input, dict) else {"input": c.input}
                blocks.append({"type": "tool_use", "id": c.id, "name": c.name, "input": tool_input})
            add("assistant", blocks)
        elif isinstance(m, ToolResultMessage):
            block: dict[str, Any] = {"type": "tool_result", "tool_use_id": m.call_id}
            text = encode_tool_result(m.content)
            if text.strip():  # a blank text is refused; no content at all is allowed
                block["content"] = text
            if m.is_error:
                block["is_error"] = True
            add("user", [block])
        elif m.text:
            text = m.text if m.text.strip() else "(empty message)"
            add("user", [{"type": "text", "text": text}])
    if out and out[0]["role"] == "assistant":
        # The window cut the conversation after a user message; the API must start with one.
        out.insert(0, {"role": "user", "content": [{"type": "text", "text": "(continued)"}]})
    return out
