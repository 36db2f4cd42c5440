"""What cancelling a turn records (`Runtime.cancel`): its open requests withdrawn, then the
cancellation itself, which leaves the session waiting for its next message."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._types import InputRequest
from .stores import Resolve

__all__ = ["cancel_specs", "withdrawal"]


def cancel_specs(
    pending: Sequence[InputRequest], reason: str | None, by: dict[str, Any] | None
) -> list[Any]:
    """The events of a turn's cancellation by `by`: its open requests withdrawn, then the
    cancellation."""
    specs: list[Any] = [
        (
            "input.resolved",
            {
                "request_id": r.id,
                "outcome": "cancelled",
                "status": "withdrawn",
                "reason": "turn cancelled",
                "by": by,
            },
        )
        for r in pending
    ]
    return [*specs, ("turn.cancelled", {"reason": reason, "by": by}), ("session.waiting", {})]


def withdrawal(request_id: str, by: dict[str, Any] | None) -> Resolve:
    """The store's record of an open request the cancellation withdrew."""
    resolution = {"outcome": "cancelled", "reason": "turn cancelled", "by": by}
    return Resolve(
        request_id=request_id, status="withdrawn", outcome="cancelled", resolution=resolution
    )
