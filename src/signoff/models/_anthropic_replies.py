"""An Anthropic reply, read: its content blocks (text, tool calls, reasoning; a paused turn's,
sent back as they came), whether it paused the turn, and whether the session's budgets can
count its usage. `Anthropic` parses a reply through these."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._exceptions import ModelError
from .._types import ToolCall, Usage
from ._anthropic_wire import REASONING
from ._counts import uncounted, unread_usage
from ._provider import plain_input, plain_str

__all__ = ["Stored", "check_counted", "paused", "read_blocks", "sent_back", "total"]

# The token counts of a reply's usage the session's budgets need.
_COUNTS = ("input_tokens", "output_tokens")


def check_counted(message: Any, where: str, budgeted: bool, unjournaled: Sequence[Usage]) -> None:
    """Fail a call the session's budgets bound whose reply reports no usage they can count,
    counting the paused parts before it that were billed and not journaled."""
    unread = unread_usage(getattr(message, "usage", None), _COUNTS)
    if budgeted and unread is not None:
        spent = total(unjournaled) if unjournaled else None
        raise ModelError(uncounted("Anthropic messages call", where, unread), usage=spent)


def read_blocks(
    content: list[Any],
    where: str,
    usage: Usage,
    texts: list[str],
    calls: list[ToolCall],
    reasoning: list[dict[str, Any]],
) -> None:
    """Add a message's text, tool calls and reasoning blocks to `texts`, `calls` and
    `reasoning`; a block of the wrong shape fails the call, counting `usage`."""
    for block in content:
        if block is None or isinstance(block, str | int | float | list):
            # Skipped, a reply of such blocks passed for an empty answer that ended the turn.
            raise ModelError(
                f"Anthropic messages call for {where} has a content block that is not an "
                f"object: {type(block).__name__}",
                usage=usage,
            )
        kind = plain_str(getattr(block, "type", None))
        if kind == "text":
            text = getattr(block, "text", None)
            if not isinstance(text, str):
                raise ModelError(
                    f"Anthropic messages call for {where} has a text block whose text is not "
                    f"text: {type(text).__name__}",
                    usage=usage,
                )
            texts.append(text)
        elif kind == "tool_use":
            name = getattr(block, "name", None)
            if not isinstance(name, str) or not name:
                raise ModelError(
                    f"Anthropic messages call for {where} has a tool_use block with no name",
                    usage=usage,
                )
            call_id = getattr(block, "id", None)
            raw = getattr(block, "input", None)
            calls.append(
                ToolCall(
                    name=name,
                    input={} if raw is None else plain_input(raw),
                    id=call_id if isinstance(call_id, str) and call_id else None,
                )
            )
        elif kind in REASONING:
            # With thinking on, the API wants these back, unchanged, with the tool_use.
            block_data = {k: getattr(block, k, None) for k in REASONING[kind]}
            if all(isinstance(v, str) for v in block_data.values()):
                reasoning.append({"type": kind, **block_data})
        # server-tool blocks are not part of signoff's conversation


class Stored:
    """A block of a paused part as journaled (its JSON), read as the SDK's blocks are."""

    __slots__ = ("_block",)

    def __init__(self, block: dict[str, Any]) -> None:
        self._block = block

    def __getattr__(self, name: str) -> Any:
        return self._block.get(name)


def paused(message: Any) -> bool:
    """Whether the API paused the turn (a long server-tool loop) with content to send back."""
    content = getattr(message, "content", None)
    stop = plain_str(getattr(message, "stop_reason", None))
    return stop == "pause_turn" and isinstance(content, list) and bool(content)


def sent_back(block: Any) -> Any:
    """A content block of a paused turn as the API sent it, to be sent back unchanged."""
    to_dict = getattr(block, "to_dict", None)
    return to_dict(mode="json") if callable(to_dict) else block


def total(usages: Any) -> Usage:
    """The sum of `usages` (None counts nothing)."""
    total = Usage()
    for u in usages:
        if u is not None:
            total = total + u
    return total
