"""`CancelBatch`: the batch `Runtime.cancel` commits, built from the state it is committed on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from . import _child_sessions
from ._cancellation import cancel_specs, withdrawal
from ._mirror_keys import keep_late, keeping, mirrored_keys
from ._recording import Batch
from ._state import SessionState, turn_over
from ._types import InputRequest
from .stores import Resolve

if TYPE_CHECKING:
    from ._answering import Answering

__all__ = ["CancelBatch"]


class CancelBatch:
    """Cancels turn `turn_id` as of the state it is built from: after a concurrent append the
    turn may have ended (nothing to cancel) or opened other requests (withdrawn too). What the
    last build withdrew and found delegated is kept for the steps after its commit. `expiry`:
    a passed TTL above the session ends its delegated turn (`cancel_specs`)."""

    def __init__(
        self,
        turn_id: str,
        reason: str | None,
        by: dict[str, Any] | None,
        made: Sequence[str],
        voted: dict[str, list[list[str]]] | None = None,
        *,
        expiry: bool = False,
    ) -> None:
        self.turn_id = turn_id
        self.reason = reason
        self.by = by
        self.made = list(made)  # children its calls created and did not journal
        self.voted = voted or {}  # the keys each mirror's subagent recorded (`mirrored_keys`)
        self.expiry = expiry
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
        specs = cancel_specs(self.withdrawn, self.reason, self.by, self.made, expiry=self.expiry)
        return Batch(specs=keeping(current, specs, self.voted), resolve=self.resolves())

    @classmethod
    async def of(
        cls,
        rt: Answering,
        state: SessionState,
        reason: str | None,
        by: dict[str, Any] | None,
        made: Sequence[str],
        *,
        expiry: bool = False,
    ) -> CancelBatch:
        """The cancel of `state`'s turn, its mirrors' withdrawals keeping the keys their
        subagents' sessions recorded (`keeping`): a keyed vote through one, which the parent
        had yet to keep, is a repeat once the parent moves on to another turn."""
        assert state.turn is not None
        voted = await mirrored_keys(rt, state.pending_requests())
        return cls(state.turn.id, reason, by, made, voted, expiry=expiry)

    async def keep_late(self, rt: Answering, session_id: str) -> None:
        """Once the cancel is recorded and its subagents' turns cancelled: keep the keys they
        recorded for messages sent through the mirrors it withdrew since it read them
        (`_mirror_keys.keep_late`)."""
        await keep_late(rt, session_id, self.withdrawn, self.voted)

    def resolves(self) -> list[Resolve]:
        """The store's records of the requests the last build withdrew."""
        return [withdrawal(r.id, self.reason, self.by) for r in self.withdrawn]
