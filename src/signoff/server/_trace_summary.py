"""A trace row's one-line summary on a session page: signoff's words for an event, with what
others wrote (a model, a tool, a person) kept apart so the page can isolate it."""

from __future__ import annotations

import math
from typing import Any

from .._events import Event
from .._key_holds import HELD
from .._state_parts import RequestState
from ._pages import who

__all__ = ["SUMMARY_CHARS", "Part", "summary", "trace_summary"]


Part = tuple[str, bool]
"""A piece of a trace row's summary, and whether someone else wrote it (a model, a tool, a person,
a channel): the page isolates such a piece (`<bdi>`), so right-to-left text in it cannot reorder
the words and punctuation around it."""


def _said(value: object) -> Part:
    return (str(value), True)


def _listed(values: list[Any], between: str = ", ") -> list[Part]:
    """`values`, each its own isolated piece, joined by `between`."""
    parts: list[Part] = []
    for i, value in enumerate(values):
        if i:
            parts.append((between, False))
        parts.append(_said(value))
    return parts


def _items(value: object) -> list[Any]:
    """`value` if it is a list, else none: a field the fold never reads may be anything in a
    damaged log, and the page shows the event (its data whole beside) rather than fail."""
    return value if isinstance(value, list) else []


def _field(value: object, key: str) -> Any:
    """`value[key]` if `value` is an object, else None (a damaged log's item)."""
    return value.get(key) if isinstance(value, dict) else None


def _waiting(d: dict[str, Any], requests: dict[str, RequestState]) -> list[Part]:
    """A parked turn's row names what it awaits: the approval of which tools, the answer to
    which questions (a spent budget's too), so a run waiting on approval reads as such."""
    ids = _items(d.get("request_ids"))
    asked = [requests[i].request for i in ids if isinstance(i, str) and i in requests]
    if d.get("on", "input") != "input" or not asked:
        return [(f"Waiting on {d.get('on', 'input')}", False)]
    tools = [r.tool_name or "?" for r in asked if r.kind == "tool-approval"]
    questions = [r.question or "?" for r in asked if r.kind != "tool-approval"]
    parts: list[Part] = [("Awaiting ", False)]
    if tools:
        parts += [("approval: ", False), *_listed(tools)]
    if questions:
        parts += [("; " if tools else "", False), ("an answer: ", False), *_listed(questions)]
    return parts


def _raised(error: object) -> list[Part]:
    """What a journaled step that raised records instead of its result (`error`): its class and
    message; nothing for a step that returned."""
    if error is None:
        return []
    kind, message = _field(error, "type"), _field(error, "message")
    if not kind:  # a damaged log's: whatever it holds
        return [(" raised ", False), _said(message or error)]
    return [(" raised ", False), _said(kind), *([(": ", False), _said(message)] if message else [])]


def summary(e: Event, requests: dict[str, RequestState]) -> list[Part]:
    """A trace row's one line, in pieces: signoff's words, and what others wrote isolated."""
    d = e.data
    t = e.type
    if t == "session.created":
        by = who(d.get("initiator"))
        return [("Session with ", False), _said(d.get("agent")), (" opened by ", False), _said(by)]
    if t == "turn.started":
        msg = d.get("message")
        if msg:
            return [("“", False), _said(msg), ("”", False)]
        return [(f"Turn started ({d.get('source', 'message')})", False)]
    if t == "model.completed":
        names = [_field(c, "name") or "?" for c in _items(d.get("tool_calls"))]
        text = d.get("text") or ""
        parts: list[Part] = [("“", False), _said(text), ("”", False)] if text else []
        if names:
            parts += [(" — " if text else "", False), ("calls ", False), *_listed(names)]
        if d.get("cut_off"):
            parts += [(" (cut off: ", False), _said(str(d["cut_off"])), (")", False)]
        return parts or [("empty response", False)]
    if t == "model.paused":  # a part of the reply, not a message: its text is the reply's
        paused = (
            f"The model's reply paused (its server tools ran): {_tokens(d.get('usage')):,} tokens"
        )
        return [(paused, False)]
    if t in ("tool.started", "tool.step"):
        step = d.get("name", "")
        parts = [_said(d.get("tool_name") or d.get("call_id", ""))]
        if step:
            parts += [(" ", False), _said(step)]
        return parts + _raised(d.get("error")) if t == "tool.step" else parts
    if t == "tool.completed":
        return [_said(d.get("tool_name")), (f" → {d.get('status')}", False)]
    if t == "input.requested":
        names = [
            _field(_field(r, "action"), "tool_name")
            or _field(r, "question")
            or _field(r, "kind")
            or "?"
            for r in _items(d.get("requests"))
        ]
        return [("Waiting for a person: ", False), *_listed(names)]
    if t == "approval.settled":
        if d.get("auto") == "timeout":  # no one approved it; its reason says so again
            return [("Approved automatically when the deadline passed", False)]
        verb = "Approved" if d.get("decision") == "approve" else "Denied"
        parts = [(f"{verb} by ", False), _said(who(d.get("by")))]
        if d.get("edited_input") is not None:
            parts.append((" with edited arguments", False))
        if d.get("reason"):
            parts += [(": “", False), _said(d["reason"]), ("”", False)]
        return parts
    if t == "approval.candidate":
        return _candidate(d)
    if t == "input.resolved":
        return [(f"{d.get('request_id')} {d.get('outcome')}", False)]
    if t == "input.repeated" and d.get("held_idem") is not None:
        held = f"{d.get('request_id')} {HELD[0]}"
        return [(held, False), _said(who(d.get("by"))), (HELD[1], False)]
    if t == "input.repeated":
        repeated = f"{d.get('request_id')} answered again by "
        return [(repeated, False), _said(who(d.get("by"))), (" (nothing changed)", False)]
    if t == "turn.failed":
        err = d.get("error")
        said = _field(err, "message") or err  # an error object's message, or whatever it is
        return [_said(said)] if said else [("failed", False)]
    if t == "turn.completed":
        return [("Turn completed", False)]
    if t == "turn.resumed":  # a retry of the failed turn, inline or by a worker
        return [("Retrying the failed turn", False)]
    if t == "turn.waiting":
        return _waiting(d, requests)
    if t == "session.waiting":
        return [("Idle: waiting for the next message", False)]
    if t == "subagent.spent":
        count = _tokens(d.get("delegated"))
        if isinstance(d.get("counted"), dict):  # the rest of a child its call counted short
            more = (
                f"Subagent {d.get('session_id')} spent {count:,} more tokens, past the"
                f" {_tokens(d['counted']):,} its call counted (its own subagent was still"
                " working then)"
            )
            return [(more, False)]
        spent = f"Subagent {d.get('session_id')} spent {count:,} tokens (counted after its turn)"
        return [(spent, False)]
    if t == "model.spent":
        late = f"Billed {_tokens(d.get('usage')):,} tokens after the turn ended (counted)"
        return [(late, False)]
    if t == "turn.cancelled":
        if d.get("reason"):
            return [("Cancelled: ", False), _said(d["reason"])]
        return [("Cancelled", False)]
    if t == "turn.message":
        queued = " (queued)" if d.get("queued") else ""
        return [("Message: “", False), _said(d.get("message")), (f"”{queued}", False)]
    return []


_ANSWERS = {"approve": "Approval", "cancel": "Denial"}


def _candidate(d: dict[str, Any]) -> list[Part]:
    """An `approval.candidate`: a deadline's escalation to a group, or a step of an answer a
    response policy or a quorum judges: awaited, refused, counted, or one that changed nothing."""
    outcome = d.get("outcome")
    why: list[Part] = [(": ", False), _said(d["reason"])] if d.get("reason") else []
    if outcome == "escalated":
        return [("Escalated to ", False), _said(d.get("to")), *why]
    answer = _ANSWERS.get(str(d.get("decision")), "Answer")
    parts: list[Part] = [(f"{answer} by ", False), _said(who(d.get("by")))]
    if outcome == "pending":
        return [*parts, (": awaiting the response policy", False)]
    if outcome == "counted":
        return [*parts, (f" counted ({d.get('votes')} of {d.get('needed')})", False)]
    if outcome in ("rejected", "failed", "timed-out"):
        return [*parts, (f" not accepted ({outcome}", False), *why, (")", False)]
    if outcome == "stale":
        return [*parts, (" changed nothing", False), *why]
    return [*parts, (f": {outcome}", False), *why]


def _tokens(usage: object) -> int:
    """The tokens a recorded usage figure counts (0 for one that is not a figure, or for a
    count in it that is no number)."""
    if not isinstance(usage, dict):
        return 0
    return sum(_count(usage.get(k)) for k in ("input_tokens", "output_tokens"))


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0
    return int(value)


SUMMARY_CHARS = 300
"""How much of an event a trace row's one-line summary shows; the row's details hold it all."""


def _cut(parts: list[Part]) -> list[Part]:
    """`parts` up to `SUMMARY_CHARS` characters in all, marked `…` where they were cut."""
    kept: list[Part] = []
    left = SUMMARY_CHARS
    for text, said in parts:
        if not text:
            continue
        if len(text) > left:
            if left:
                kept.append((text[:left], said))
            kept.append(("…", False))
            break
        kept.append((text, said))
        left -= len(text)
    return kept


def trace_summary(e: Event, requests: dict[str, RequestState]) -> list[Part]:
    """`summary` of `e`, cut at `SUMMARY_CHARS`, as the trace row shows it."""
    return _cut(summary(e, requests))
