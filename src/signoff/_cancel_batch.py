"""`CancelBatch`: the batch `Runtime.cancel` commits, built from the state it is committed on,
with the passed deadlines it records first in the same commit (`timed_out`, `closed_by_time`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from . import _child_sessions
from ._cancellation import cancel_specs, withdrawal
from ._deadlines import TIMED_OUT, after_deadline, due_batch
from ._exceptions import StoreBusy, StoreError, StoreGone, StoreUnavailable, UnknownSession
from ._mirror_keys import MAX_HOPS, keep_late, keeping, mirrored_keys
from ._mirrors import timed_out_close
from ._recording import Batch, EventSpec, shown_recorded
from ._state import SessionState, turn_over
from ._types import InputRequest
from .stores import Resolve

if TYPE_CHECKING:
    from ._answering import Answering

__all__ = ["CancelBatch", "closed_by_time"]


class CancelBatch:
    """Cancels turn `turn_id` as of the state it is built from: after a concurrent append the
    turn may have ended (nothing to cancel) or opened other requests (withdrawn too). What the
    last build withdrew and found delegated is kept for the steps after its commit. `expiry`:
    a passed TTL above the session ends its delegated turn (`cancel_specs`).

    Given a `clock`, the passed deadlines of the turn's requests are recorded first in the same
    commit (`due_batch`), and the mirrors in `timed_out` (`closed_by_time`) close as time closed
    the subagents' requests they stand for, not withdrawn: no commit in between leaves the turn
    a deadline resumed runnable, for a worker to claim or a crash to leave, before it is
    cancelled (the call an approving deadline approved never runs)."""

    def __init__(
        self,
        turn_id: str,
        reason: str | None,
        by: dict[str, Any] | None,
        made: Sequence[str],
        voted: dict[str, list[list[str]]] | None = None,
        *,
        expiry: bool = False,
        clock: Callable[[], float] | None = None,
        timed_out: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self.turn_id = turn_id
        self.reason = reason
        self.by = by
        self.made = list(made)  # children its calls created and did not journal
        self.voted = voted or {}  # the keys each mirror's subagent recorded (`mirrored_keys`)
        self.expiry = expiry
        self.clock = clock
        self.timed_out = timed_out or {}
        self.withdrawn: list[InputRequest] = []  # with the mirrors it closed as time did
        self.delegated: list[str] = []
        self.built_on: int | None = None  # the seq of the state the batch was built from
        self.resolved: list[Resolve] = []

    def __call__(self, current: SessionState) -> Batch:
        now = current.turn
        if now is None or now.id != self.turn_id or turn_over(now):
            return Batch(specs=[])
        at = None if self.clock is None else self.clock()
        first = (None if at is None else due_batch(current, at)) or Batch(specs=[])
        after = (
            current if at is None or not first.specs else shown_recorded(current, first.specs, at)
        )
        self.withdrawn = after.pending_requests()
        self.delegated = [*_child_sessions.delegated(after), *self.made]
        self.built_on = current.seq
        closes: list[EventSpec] = []
        resolves = list(first.resolve)
        updated = list(first.updated_requests)
        for r in self.withdrawn:
            data = self.timed_out.get(r.id)
            if data is None:
                resolves.append(withdrawal(r.id, self.reason, self.by))
                continue
            closes.append(("input.resolved", data))
            resolves.append(
                Resolve(request_id=r.id, status="expired", outcome="expired", resolution=data)
            )
            votes = data.get("approved_by")
            if isinstance(votes, list) and r.approved_by != votes:
                updated.append(r.model_copy(update={"approved_by": votes}))  # as `close_mirror`
        rest = [r for r in self.withdrawn if r.id not in self.timed_out]
        specs = cancel_specs(rest, self.reason, self.by, self.made, expiry=self.expiry)
        self.resolved = resolves
        return Batch(
            specs=keeping(current, [*first.specs, *closes, *specs], self.voted),
            resolve=resolves,
            updated_requests=updated,
        )

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
        had yet to keep, is a repeat once the parent moves on to another turn. Unless a TTL
        above ends the turn (`expiry`: that records what time did, and a deadline's record is
        activity), passed deadlines are recorded with it: the turn's own, and the subagents'
        behind its open mirrors (`closed_by_time`)."""
        assert state.turn is not None
        pending = state.pending_requests()
        voted = await mirrored_keys(rt, pending)
        timed_out = {} if expiry else await closed_by_time(rt, pending)
        clock = None if expiry else rt.now
        return cls(
            state.turn.id, reason, by, made, voted, expiry=expiry, clock=clock, timed_out=timed_out
        )

    async def keep_late(self, rt: Answering, session_id: str) -> None:
        """Once the cancel is recorded and its subagents' turns cancelled: keep the keys they
        recorded for messages sent through the mirrors it withdrew since it read them
        (`_mirror_keys.keep_late`)."""
        await keep_late(rt, session_id, self.withdrawn, self.voted)

    def resolves(self) -> list[Resolve]:
        """The store's records of the requests the last build closed."""
        return self.resolved


async def closed_by_time(
    rt: Answering, requests: Sequence[InputRequest]
) -> dict[str, dict[str, Any]]:
    """The open mirrors among `requests` whose subagent's request (at the end of the way, hop
    by hop) time closed, unrecorded: its deadline passed (one that escalates closes nothing),
    or the TTL of a session down the way did with no live drive running it on. By mirror id,
    what `close_mirror` records for each once the subagents' sessions record that (their own
    cancels do, after the parent's): so a cancel shows it `expired`, not withdrawn. A mirror
    whose request closed otherwise, or that cannot be read, is left out (withdrawn)."""
    now = rt.now()
    out: dict[str, dict[str, Any]] = {}
    for mirror in requests:
        ref, asked, lapsed = mirror.child, None, False
        for _ in range(MAX_HOPS):
            if ref is None:
                break
            try:
                stored = await rt.store.get_request(ref.request_id)
                if stored is None or stored.status != "pending":
                    asked = None  # closed unseen, or gone: not by time, as far as this tells
                    break
                asked = stored.request
                ends = stored.session_expires_at
                if not lapsed and ends is not None and ends <= now:
                    lapsed = await rt._ended(await rt._state(asked.session_id), now) is not None
            except (UnknownSession, StoreError) as exc:
                if isinstance(exc, (StoreUnavailable, StoreBusy, StoreGone)):
                    raise  # the store cannot answer now: nor would it take the cancel
                asked = None  # unreadable: it closed nothing this can tell
                break
            ref = asked.child
        if asked is None:
            continue
        if lapsed:
            out[mirror.id] = timed_out_close(mirror, asked, {"outcome": "expired"})
        elif after_deadline(asked, now) is None:
            resolution = {"outcome": "expired", "reason": TIMED_OUT, "on_timeout": asked.on_timeout}
            out[mirror.id] = timed_out_close(mirror, asked, resolution)
    return out
