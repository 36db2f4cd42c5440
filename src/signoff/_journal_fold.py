"""A call's journal as the fold keeps it (its steps and questions, how it is keyed), for
`SessionState.apply` and for a journal read back from its events (`journal_fold`)."""

from __future__ import annotations

from typing import Any

from ._events import Event
from ._state_parts import CallState
from ._types import InputRequest

__all__ = ["asked", "journal_fold", "stepped"]


def stepped(call: CallState, d: dict[str, Any]) -> None:
    """`call`'s journal with the step a `tool.step` (`d`) records."""
    if not call.journaled and d.get("keyed"):  # `_key_journal`, inline: one call per step
        call.keyed = True
    entry = {"kind": "step", "name": d["name"], "result": d.get("result")}
    if d.get("child") is True:  # a delegate call's creation of its child (`_child`)
        entry["child"] = True
    error = d.get("error")
    if error is not None:  # the step raised: its replay raises it again
        entry["error"] = error
    call.record(d["index"], entry)


def asked(call: CallState, request: InputRequest, data: dict[str, Any]) -> None:
    """`call`'s journal with the question `request` its `ctx.ask` asked."""
    entry = {"kind": "ask", "name": request.question, "request_id": request.id}
    _key_journal(call, data)
    call.record(request.index or 0, entry)


def _key_journal(call: CallState, data: dict[str, Any]) -> None:
    """A call's first entry says how its journal is keyed: entries journaled before keys
    existed have no `keyed` mark, and their call goes on by position (unless its `tool.started`
    said it was keyed, as signoff wrote it for a while)."""
    if not call.journaled and data.get("keyed"):
        call.keyed = True


def journal_fold(call: CallState, turn_id: str, e: Event) -> CallState:
    """`call` after event `e` as `SessionState.apply` would leave its journal (`e` is of its
    session, past its `since`), for a journal read back from its events; a response that names
    the call again makes it anew, as the fold does."""
    d = e.data
    if e.turn_id != turn_id:
        return call
    kind = e.type
    if kind == "tool.step":  # the most of them, by far
        if d["call_id"] == call.id:
            stepped(call, d)
    elif kind == "model.completed":
        if any(c["id"] == call.id for c in d.get("tool_calls", [])):
            return CallState(id=call.id, tool_name=call.tool_name, input=None, since=e.seq)
    elif kind == "tool.started" and d["call_id"] == call.id:
        call.idempotency_key = d.get("idempotency_key")  # an older child's entry needs it
        if d.get("keyed"):
            call.keyed = True
    elif kind == "input.requested":
        for raw in d["requests"]:
            request = InputRequest.model_validate(raw)
            action = request.action
            if request.child is None and action is not None and action.call_id == call.id:
                if request.source == "ask":
                    asked(call, request, d)
    return call
