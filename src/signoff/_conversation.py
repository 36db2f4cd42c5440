"""The model-visible conversation of a session, folded from its message events: what the
engine sends the model, rebuilt from the log when a snapshot left it out."""

from __future__ import annotations

from collections.abc import Iterable

from ._events import Event
from ._exceptions import StoreError
from ._types import AssistantMessage, Message, ToolCall, ToolResultMessage, UserMessage

__all__ = ["MALFORMED", "MESSAGE_EVENT_TYPES", "Conversation", "conversation"]

# What a handler or the snapshot loader raises on data of the wrong shape (pydantic's
# ValidationError is a ValueError); it reaches callers as a StoreError.
MALFORMED = (KeyError, TypeError, ValueError, AttributeError, IndexError)

MESSAGE_EVENT_TYPES = ("turn.started", "turn.message", "model.completed", "tool.completed")
"""The event types the conversation is made of."""

# What the model reads for a call its turn ended without a result for.
_UNFINISHED = {"cancelled": True, "reason": "the turn ended before this call had a result"}


def conversation(events: Iterable[Event], *, partial: bool = False) -> Conversation:
    """The model-visible conversation of a whole log (used when a snapshot left it out), or of
    its end from a `turn.started` on (`partial`): the same messages as the whole log's from
    that turn on, since a turn starts with no call open and nothing held back."""
    conv = Conversation(partial=partial)
    for event in events:
        try:
            conv.add(event)
        except MALFORMED as exc:  # as `SessionState.apply` names it when it folds the event
            raise StoreError(f"event {event.id} ({event.type}) is malformed: {exc!r}") from exc
    return conv


class Conversation:
    """Messages as the model sees them; a message that arrives while calls are still open is
    held back until their results are in, so results always follow their calls."""

    __slots__ = ("deferred", "messages", "open_calls", "partial", "turn_start", "unread")

    def __init__(self, *, partial: bool = False) -> None:
        # partial: built from a recent turn on (enough for a message window), not the whole log
        self.partial = partial
        self.turn_start = 0
        self.messages: list[Message] = []
        self.open_calls: dict[str, str] = {}  # call id -> tool name, for calls with no result
        self.deferred: list[Message] = []
        # messages said since the last response, with their seq: one the next response did not
        # read (it came while the model was busy) goes after that response
        self.unread: list[tuple[int, Message]] = []

    def copy(self) -> Conversation:
        """A conversation that adding to leaves this one as it is (the messages, immutable,
        are shared: `add` tells a message by its identity)."""
        other = Conversation(partial=self.partial)
        other.turn_start = self.turn_start
        other.messages = list(self.messages)
        other.open_calls = dict(self.open_calls)
        other.deferred = list(self.deferred)
        other.unread = list(self.unread)
        return other

    def _say(self, message: Message, seq: int) -> None:
        if self.open_calls:
            self.deferred.append(message)
        else:
            self.messages.append(message)
            self.unread.append((seq, message))

    def add(self, event: Event) -> None:
        d = event.data
        if event.type == "turn.started":
            # A turn cancelled (or otherwise ended) with calls open left them without a result;
            # each gets one, as a call with none makes the providers refuse the conversation.
            self.messages.extend(
                ToolResultMessage(
                    call_id=call_id, tool_name=name, content=_UNFINISHED, is_error=True
                )
                for call_id, name in self.open_calls.items()
            )
            self.open_calls.clear()
            self.messages.extend(self.deferred)
            self.deferred.clear()
            self.turn_start = len(self.messages)
            self.unread.clear()
            if d.get("message") is not None:
                self.messages.append(UserMessage(text=d["message"]))
        elif event.type == "turn.message":
            if not d.get("queued"):
                self._say(UserMessage(text=d["message"]), event.seq)
        elif event.type == "model.completed":
            calls = [ToolCall(**c) for c in d.get("tool_calls", [])]
            reasoning = d.get("reasoning") or []
            read = d.get("read_through")  # absent from logs of older versions
            missed = [m for seq, m in self.unread if isinstance(read, int) and seq > read]
            self.unread.clear()
            if missed:  # by identity: an equal message said earlier stays where it is
                gone = {id(m) for m in missed}
                self.messages[:] = [m for m in self.messages if id(m) not in gone]
            self.messages.append(
                AssistantMessage(text=d.get("text", ""), tool_calls=calls, reasoning=reasoning)
            )
            self.open_calls = {c.id: c.name for c in calls if c.id}
            for m in missed:
                self._say(m, event.seq)
        elif event.type == "tool.completed":
            self.messages.append(
                ToolResultMessage(
                    call_id=d["call_id"],
                    tool_name=d["tool_name"],
                    content=d.get("result"),
                    is_error=d.get("status") not in ("ok", "decided"),
                )
            )
            self.open_calls.pop(d["call_id"], None)
            if not self.open_calls and self.deferred:
                self.messages.extend(self.deferred)
                self.deferred.clear()
