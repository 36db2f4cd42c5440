"""`CancelBatch`: the batch `Runtime.cancel` commits, built from the state it is committed on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import _child_sessions
from ._cancellation import cancel_specs, withdrawal
from ._recording import Batch
from ._state import SessionState, turn_over
from ._types import InputRequest
from .stores import Resolve

__all__ = ["CancelBatch"]


class CancelBatch:
    """Cancels turn `turn_id` as of the state it is built from: after a concurrent append the
    turn may have ended (nothing to cancel) or opened other requests (withdrawn too). What the
    last build withdrew and found delegated is kept for the steps after its commit."""

    def __init__(
        self, turn_id: str, reason: str | None, by: dict[str, Any] | None, made: Sequence[str]
    ) -> None:
        self.turn_id = turn_id
        self.reason = reason
        self.by = by
        self.made = list(made)  # children its calls created and did not journal
        self.withdrawn: list[InputRequest] = []
        self.delegated: list[str] = []
        self.built_on: int | None = None  # the seq of the state the batch was built from

    def __call__(self, current: SessionState) -> Batch:
        now = current.turn
        if now is None or now.id != self.turn_id or turn_over(now):
            return Batch(specs=[])
        self.withdrawn = current.pending_requests()
        self.delegated = [*_child_sessions.delegated(current), *self.made]
        self.built_on = current.seq
        return Batch(
            specs=cancel_specs(self.withdrawn, self.reason, self.by, self.made),
            resolve=self.resolves(),
        )

    def resolves(self) -> list[Resolve]:
        """The store's records of the requests the last build withdrew."""
        return [withdrawal(r.id, self.reason, self.by) for r in self.withdrawn]
