"""The parts a `SessionState` is made of: its turn (`TurnState`), the turn's tool calls
(`CallState`, with the statuses a call moves through) and its input requests (`RequestState`).
Apart from `_state` so the event handlers of `_event_handlers`, below it, can build them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ._types import InputRequest, Principal

__all__ = [
    "CallState",
    "CallStatus",
    "RequestState",
    "TurnState",
    "TurnStatus",
    "dump_principal",
    "load_principal",
]

CallStatus = Literal[
    "proposed",  # the model asked for it; no approval decision recorded yet
    "requested",  # an approval request is open for it
    "approved",  # a person approved it; it has not started
    "denied",  # denied, cancelled or ignored before it ran; its result is not recorded yet
    "running",  # tool.started recorded, no result yet
    "awaiting",  # the tool body asked for approval itself (ApprovalRequired)
    "asking",  # the tool body is parked on ctx.ask(); it re-runs (replaying) once answered
    "decided",  # that approval was settled; the decision becomes the result
    "done",  # tool.completed recorded
]

TurnStatus = Literal["running", "waiting", "completed", "failed", "cancelled"]


_GAP_MAX = 65_536
"""How far past a positional journal's end an entry may land: steps run together leave gaps
(one journaled before those claimed earlier), never this many; a damaged event's huge position
would otherwise fill memory with empty places."""


@dataclass(slots=True, kw_only=True)
class CallState:
    id: str
    tool_name: str
    input: Any
    status: CallStatus = "proposed"
    request_id: str | None = None
    decision: dict[str, Any] | None = None
    idempotency_key: str | None = None
    edited_input: Any = None
    journal: list[dict[str, Any] | None] = field(default_factory=list)
    keyed: bool = False  # the journal's `index` is the occurrence of a name, not a position
    # Where each entry of a keyed journal is, by kind, name and occurrence: recording one is
    # then a look-up, not a scan of every entry (a call of N steps cost N² as they were folded).
    placed: dict[tuple[str, str, Any], int] = field(default_factory=dict, repr=False, compare=False)

    def record(self, index: int, entry: dict[str, Any]) -> None:
        """Journal `entry`: in a keyed journal as occurrence `index` of its kind and name (in
        the order recorded), in an older positional one at position `index`."""
        if self.keyed:
            entry = {**entry, "n": index}
            key = (entry["kind"], entry["name"], index)
            at = self.placed_at(key)
            if at is not None:
                self.journal[at] = entry
                return
            self.placed[key] = len(self.journal)
            self.journal.append(entry)
            return
        if (
            not isinstance(index, int)
            or isinstance(index, bool)
            or not 0 <= index <= len(self.journal) + _GAP_MAX
        ):
            raise ValueError(f"journal position {index!r} of call {self.id!r} is out of range")
        while len(self.journal) <= index:
            self.journal.append(None)
        self.journal[index] = entry

    def placed_at(self, key: tuple[str, str, Any]) -> int | None:
        """The position of the keyed entry `key` (kind, name, occurrence), None if not journaled;
        `placed` is built again first if it does not index the journal as it is (a state built
        from a snapshot)."""
        if len(self.placed) != len(self.journal):
            self.placed = {}
            for i in reversed(range(len(self.journal))):  # the first of two alike wins
                e = self.journal[i]
                if e is not None:
                    self.placed[(e["kind"], e["name"], e.get("n"))] = i
        return self.placed.get(key)

    def subagents(self) -> list[str]:
        """The child sessions this delegate call journaled creating (`tool.step`
        `subagent.session`), in order."""
        out: list[str] = []
        for entry in self.journal:
            child = None if entry is None else entry.get("result")
            if (
                entry is not None
                and entry.get("name") == "subagent.session"
                and isinstance(child, str)
            ):
                out.append(child)
        return out


@dataclass(slots=True, kw_only=True)
class RequestState:
    request: InputRequest
    status: str = "pending"
    outcome: str | None = None
    resolution: dict[str, Any] | None = None


@dataclass(slots=True, kw_only=True)
class TurnState:
    id: str
    status: TurnStatus = "running"
    principal: Principal | None = None
    started_at: float = 0.0
    steps: int = 0
    text: str = ""
    cut_off: str | None = None  # why the latest model reply stopped short (`ModelResponse`)
    calls: dict[str, CallState] = field(default_factory=dict)
    retryable: bool = False
    error: dict[str, Any] | None = None
    first_seq: int = 0
    last_message_seq: int = 0
    model_seq: int = 0  # the latest model.completed: a message after it is not read yet
    source: str = "message"
    # The W3C trace context of the last traced drive that parked the turn (`_tracing`).
    traceparent: str | None = None

    @property
    def steered(self) -> bool:
        """A steering message arrived that the model has not read yet."""
        return self.last_message_seq > self.model_seq


def dump_principal(p: Principal | None) -> dict[str, Any] | None:
    return None if p is None else p.model_dump()


def load_principal(d: dict[str, Any] | None) -> Principal | None:
    return None if d is None else Principal.model_validate(d)
