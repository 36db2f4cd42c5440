"""What a response policy is shown of a request: the call's input as its tool validated it, and
the session it was asked in."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from ._approval import SessionAuth, SessionInfo
from ._raw_input import raw_copy
from ._state import SessionState
from ._tools import Tool
from ._types import InputRequest

__all__ = ["proposed_input", "session_info", "typed_input"]


def proposed_input(state: SessionState, tool: Tool, request: InputRequest) -> Any:
    """The input of the call `request` asks about, as the tool validated it when proposed: the
    request shows its JSON form, which a masked secret or a validator that changes a value
    would not give back."""
    turn = state.turn
    call = turn.calls.get(request.call_id or "") if turn is not None else None
    if call is None or turn is None or turn.id != request.turn_id:
        return typed_input(tool, request.input)
    return typed_input(tool, call.input)


def typed_input(tool: Tool, value: Any) -> Any:
    """The call's input as the tool's validated model, as approval policies see it: made anew,
    theirs to change, as is a copy of `value` that does not validate (the call's or request's
    own, changed, changed the call or what the next reader of it got)."""
    try:
        return tool.validate(value)
    except ValidationError:
        return raw_copy(value)


def session_info(state: SessionState, request: InputRequest) -> SessionInfo:
    turn = state.turn
    return SessionInfo(
        id=state.id,
        agent=state.agent,
        turn=request.turn_id,
        parent=state.parent,
        auth=SessionAuth(
            current=None if turn is None else turn.principal, initiator=state.initiator
        ),
    )
