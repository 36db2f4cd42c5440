"""Tool-call ids and names on the wire: each provider accepts only some ids (Anthropic's must
match `[a-zA-Z0-9_-]+` and be unique in a request, OpenAI's are at most 40 characters) and
names (`[a-zA-Z0-9_-]{1,64}`), while a session's history holds whatever ids the models that
served it chose, and the names of tools they made up."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from typing import Any

from .._types import AssistantMessage, ToolResultMessage

__all__ = ["anthropic_id_fits", "openai_id_fits", "wire_ids", "wire_name"]

_ANTHROPIC_ID = re.compile(r"[a-zA-Z0-9_-]+")
_NOT_ID = re.compile(r"[^a-zA-Z0-9_-]")
_TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_SURROGATE = re.compile("[\ud800-\udfff]")


def anthropic_id_fits(call_id: str) -> bool:
    """Whether the messages API takes `call_id` as a `tool_use` id."""
    return _ANTHROPIC_ID.fullmatch(call_id) is not None


def openai_id_fits(call_id: str) -> bool:
    """Whether the chat-completions API takes `call_id` as a tool call id: a lone surrogate
    cannot be sent (it would go as U+FFFD, and two ids could become one)."""
    return 0 < len(call_id) <= 40 and _SURROGATE.search(call_id) is None


def wire_name(name: str) -> str:
    """A tool name as the APIs take it in a conversation: a registered tool's always fits, and
    one a model made up (`multi_tool_use.parallel`) is shown with its refused characters as `_`
    (its error result still names it as called)."""
    if _TOOL_NAME.fullmatch(name):
        return name
    return _NOT_ID.sub("_", name)[:64] or "unnamed_tool"


def _derived(call_id: str | None) -> str:
    """An id that fits every provider, made from `call_id` alone: its safe characters (short)
    and a hash of it all, so two ids that differ only in refused characters stay apart."""
    raw = call_id or ""
    digest = hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    stem = _NOT_ID.sub("_", raw)[:20]
    return f"{stem}_{digest}" if stem else f"call_{digest}"


def wire_ids(messages: Iterable[Any], fits: Callable[[str], bool]) -> list[Any]:
    """The messages with every tool-call id one the provider accepts and no id used twice, and
    every tool name one it accepts (`wire_name`).

    Ids that fit and are new are kept; the rest are derived from the id and its order in the
    conversation, so the same history always gives the same request. A result takes the id
    given to its call in the assistant message before it.
    """
    used: set[str] = set()
    resume: dict[str | None, tuple[str, int, str]] = {}  # see `_unique`
    given: dict[str, list[str]] = {}  # id in the history -> wire ids of the last calls message
    out: list[Any] = []
    for m in messages:
        if isinstance(m, AssistantMessage) and m.tool_calls:
            given = {}
            calls = []
            for c in m.tool_calls:
                wire = _unique(c.id, fits, used, resume)
                given.setdefault(c.id or "", []).append(wire)
                name = wire_name(c.name)
                if (wire, name) != (c.id, c.name):
                    c = c.model_copy(update={"id": wire, "name": name})
                calls.append(c)
            out.append(m.model_copy(update={"tool_calls": calls}))
        elif isinstance(m, ToolResultMessage):
            waiting = given.get(m.call_id)
            if waiting:
                # Calls sharing an id (sent by hand; the engine never stores them) in order.
                wire = waiting.pop(0) if len(waiting) > 1 else waiting[0]
            else:
                wire = m.call_id if fits(m.call_id) else _derived(m.call_id)
            out.append(m if wire == m.call_id else m.model_copy(update={"call_id": wire}))
        else:
            out.append(m)
    return out


def _unique(
    call_id: str | None,
    fits: Callable[[str], bool],
    used: set[str],
    resume: dict[str | None, tuple[str, int, str]],
) -> str:
    """`call_id` if it fits and is not `used` yet, else the first free id derived from it
    (`call_id_2`, `call_id_3`, ...). The candidates tried for one id are always the same, and
    `used` only grows, so `resume` keeps where the last search for each id stopped and the next
    starts there: a server that gives every call one id (`functions.lookup:0`) made each
    request's conversion quadratic in the calls before it."""
    state = resume.get(call_id)
    if state is None:
        base = call_id if call_id and fits(call_id) else _derived(call_id)
        n, wire = 1, base
    else:
        base, n, wire = state
    while wire in used:
        n += 1
        wire = f"{base}_{n}"
        if not fits(wire):
            base = _derived(call_id)
            wire = f"{base}_{n}"
    used.add(wire)
    resume[call_id] = (base, n, wire)
    return wire
