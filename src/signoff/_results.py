"""What the runtime returns: `GenerateResult` and the per-answer `Outcome`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ._types import InputRequest

__all__ = ["GenerateResult", "Outcome"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """What became of one answer: `applied` is False when it repeated an earlier answer."""

    request_id: str
    outcome: str
    applied: bool
    reason: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerateResult:
    """Where a turn stands after a call: completed, waiting for people, failed, or other.

    `running` means the turn has work it can do without anyone: another process (or a worker)
    is running it, or will (its answers were accepted with `respond(resume=False)`); `waiting`
    means it can go on only once a person answers `pending`. `replayed` is True when the call
    repeated an earlier one with its idempotency key: it started or sent nothing. `queued` is
    True when `send` left the message waiting for the end of the turn it reports (the message
    starts a later turn), rather than delivering it, or `generate` or `schedule` its prompt
    (queued behind a message that waited). `cut_off` says why the model's latest
    reply in the turn stopped short (`max_tokens`, `content_filter`): `text` ends in a partial
    answer. `cancelled` is True when `cancel` recorded the cancel of the turn it reports; a
    cancel that found that turn over (sent twice, say) or another the session's is False.
    """

    status: Literal["completed", "waiting", "failed", "cancelled", "running", "idle"]
    session_id: str
    turn_id: str | None
    text: str
    pending: list[InputRequest] = field(default_factory=list)
    error: dict[str, Any] | None = None
    retryable: bool = False
    outcomes: list[Outcome] = field(default_factory=list)
    replayed: bool = False
    queued: bool = False
    cut_off: str | None = None
    cancelled: bool = False
