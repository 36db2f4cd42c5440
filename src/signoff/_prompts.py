"""The prompt that starts a turn: checked before anything is recorded, and the events that
start the turn, in the order messages were sent."""

from __future__ import annotations

from typing import Any

from ._answers import check_text
from ._exceptions import UsageError
from ._idempotency import Keyed
from ._recording import EventSpec
from ._state import SessionState
from ._text import NOTHING_SAID, is_blank

__all__ = ["check_prompt", "next_turn"]


def check_prompt(prompt: object) -> None:
    """A prompt is text that can be stored and says something (as a message to `send` must);
    checked before anything (a session) is created."""
    if not isinstance(prompt, str):
        raise UsageError(f"prompt must be a string, not {type(prompt).__name__}")
    check_text(prompt, "the prompt")  # first: a lone surrogate is invalid, not blank
    if is_blank(prompt):
        raise UsageError(NOTHING_SAID.format(what="the prompt"))


def next_turn(
    state: SessionState,
    prompt: str,
    who: dict[str, Any] | None,
    source: str,
    idem: Keyed | None = None,
) -> list[EventSpec]:
    """The events that start the session's next turn: the prompt's, or, when messages still
    wait from an earlier turn (it was cancelled, failed or its process died), the first of them,
    with the prompt queued behind the rest, so messages are answered in the order sent. The
    prompt's event carries its idempotency key, if it has one."""
    key = {} if idem is None else {"idem": list(idem)}
    if not state.queued:
        return [("turn.started", {"message": prompt, "principal": who, "source": source, **key})]
    first = state.queued[0]
    queued: dict[str, Any] = {"message": prompt, "principal": who, "queued": True, **key}
    if source != "message":
        queued["source"] = source
    return [
        (
            "turn.started",
            {
                "message": first["message"],
                "principal": first.get("principal"),
                "source": first.get("source", "message"),
                "dequeued": True,
            },
        ),
        ("turn.message", queued),
    ]
