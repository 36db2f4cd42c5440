"""`TurnLeases`: the lease a call that makes a session's turn runnable (an answer, a message)
has its commit grant to the call's own drive of that turn, so no worker's claim takes it first."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ._engine import Driver
from ._exceptions import StoreError
from ._recording import new_id
from ._session_cache import SessionCache
from ._state import SessionState

__all__ = ["TurnLeases", "to_claims"]

to_claims: ContextVar[bool] = ContextVar("signoff_to_claims", default=False)
"""Set while a worker sweeps (`Runtime.work`): a drive asked for then leaves the turn to the
worker's claims, as `inline=False` does, so the sweep does not run turns one after another,
past `concurrency` and a `stop`, while no claim is made."""


@dataclass(slots=True)
class _Ahead:
    """The lease a call of an inline runtime has a commit of its that makes the session's turn
    runnable (an answer's settlement, a message's turn) grant to its drive of that turn, in the
    same write, so no worker's claim takes the turn first (`TurnLeases._own_turn`)."""

    runner: TurnLeases
    session_id: str
    owner: str
    task: asyncio.Task[Any] | None  # the call's: a task it started (a tool's) asks for none
    # Tasks settling for the call (`_acting_for`: an answer judged or counted past a cancel).
    helpers: set[asyncio.Task[Any]] = field(default_factory=set)
    token: int | None = None  # None: not held (not granted yet, or handed to the drive)
    asking: int = 0  # commits that asked for it whose answer has not come (it may yet)
    granted: float = 0.0  # when it was asked for, by the lease clock (`Leasing.now`)
    closed: bool = False  # the call ended: nothing more is asked, and a grant come late given back


_ahead: ContextVar[_Ahead | None] = ContextVar("signoff_ahead", default=None)


def _unanswered(ahead: _Ahead) -> bool:
    """Whether a commit asked for the call's lease unanswered; none is from now on."""
    asked, ahead.asking = ahead.asking, 0
    return asked > 0


class TurnLeases(SessionCache):
    """Grants a call's drive the lease its own commit made the turn runnable under
    (`_own_turn`); `SessionRunner` builds on it."""

    @contextlib.asynccontextmanager
    async def _own_turn(self, session_id: str | None) -> AsyncIterator[None]:
        """Around a call that may make the session's turn runnable, then drives it: in an inline
        runtime, the commit doing so grants the session's lease in the same write (`_driver`),
        and the call's drive is given it (`_drive`), so no worker's claim, here or in another
        process, takes the turn in between. Only a commit that leaves the turn runnable asks for
        it, and a lease no drive took is given back as the call ends. No `session_id`: nothing
        (a session not created yet, whose creation leases it itself)."""
        if session_id is None or not self.inline or to_claims.get():
            yield
            return
        owner = f"{self.owner}:{new_id('drv')}"
        ahead = _Ahead(self, session_id, owner, asyncio.current_task())
        reset = _ahead.set(ahead)
        try:
            yield
        finally:
            _ahead.reset(reset)
            await self._drop_ahead(ahead)

    def _ahead_of(self, session_id: str) -> _Ahead | None:
        """The call's lease for its drive of the session (`_own_turn`), held or to be granted."""
        ahead = _ahead.get()
        task = asyncio.current_task()
        if (
            ahead is None
            or ahead.closed
            or ahead.runner is not self
            or ahead.session_id != session_id
            or (task is not ahead.task and task not in ahead.helpers)
        ):
            return None
        return ahead

    def _acting_for(self, task: asyncio.Task[Any]) -> None:
        """`task`, started by the current call to settle its answer (`past_cancel`: the last
        vote of a quorum, an answer a response policy judges), may ask for the call's lease as
        the call may (`_own_turn`): its commit is the one that makes the turn runnable."""
        ahead = _ahead.get()
        if ahead is not None and ahead.runner is self and ahead.task is asyncio.current_task():
            ahead.helpers.add(task)
            task.add_done_callback(ahead.helpers.discard)

    def _driver(self, state: SessionState, lease: tuple[str, int] | None) -> Driver:
        driver = super()._driver(state, lease)
        ahead = None if lease is not None else self._ahead_of(state.id)
        if ahead is not None:  # a commit of the call that may make its turn runnable
            driver.grant = partial(self._to_grant, ahead)
            driver.on_grant = partial(self._on_grant, ahead)
            driver.not_granted = partial(self._not_granted, ahead)
        return driver

    def _to_grant(self, ahead: _Ahead) -> tuple[str, float] | None:
        """The owner a commit of the call asks the store to grant the lease to, with its TTL:
        none once the call holds it, nor while a drive here holds or asks for it (the call's own
        drive, whose lease a grant to its owner would replace: it has the turn already)."""
        if ahead.closed or ahead.token is not None or ahead.session_id in self._holders:
            return None
        ahead.asking += 1
        return ahead.owner, self.lease_ttl

    @staticmethod
    def _not_granted(ahead: _Ahead) -> None:
        """A commit of the call that asked for the lease failed having written nothing (refused
        as busy, or cancelled waiting for a SQLite file's lock: `wrote_nothing`): it granted
        none, so none is given back for it, which would wait for the busy store again, and
        write after the call was told nothing was."""
        ahead.asking = max(0, ahead.asking - 1)  # none, if another of its commits granted it

    async def _on_grant(self, ahead: _Ahead, token: int | None, asked: float) -> None:
        """A commit of the call that asked for the lease came back, granting its drive the
        lease `token` (None: not granted, or not known to be: a lost acknowledgement whose
        grant could not be read again, which `asking` keeps for `_lease_ahead` and `_drop_ahead`
        to take again under its owner). One that came after the call ended (a settlement going
        on past its cancel) is given back at once."""
        if token is None:
            return
        ahead.asking = 0  # its owner's lease, whichever of its commits granted it
        if ahead.closed:
            with contextlib.suppress(StoreError):  # else kept in `_unreleased` for later
                await self._release(ahead.session_id, ahead.owner, token)
            return
        session_id = ahead.session_id
        ahead.token, ahead.granted = token, asked
        self._holders.setdefault(session_id, ahead.owner)  # `_drive` checks it is the call's
        self._expiries[session_id] = (token, asked + self.lease_ttl)
        self._driving[session_id] += 1  # this process's claims leave it alone too

    async def _lease_ahead(self, session_id: str) -> tuple[str, int] | None:
        """The lease a commit of this call granted its drive of the session (`_on_grant`), handed
        to that drive: renewed first if granted a while ago (a slow response policy judging
        another answer after it), and given up if it lapsed and another took it over meanwhile
        (the drive then asks for the lease anew). The drive counts it in `_driving` from here."""
        ahead = self._ahead_of(session_id)
        if ahead is not None and ahead.token is None and ahead.asking:
            # Granted, for all this call knows (`_on_grant`): its owner takes it again, as a
            # store grants an owner its own lease; refused (another's live lease), none was.
            with contextlib.suppress(StoreError):
                now = self.now()
                again = await self.store.acquire_lease(session_id, ahead.owner, self.lease_ttl, now)
                if again is not None:
                    await self._on_grant(ahead, again, now)
        if ahead is None or ahead.token is None:
            return None
        owner, token = ahead.owner, ahead.token
        ahead.token = None
        live = False
        try:
            live = await self._confirmed(session_id, owner, token, ahead.granted)
        finally:
            if not live:
                self._let_go(session_id, owner)
                self._undrive(session_id)
        return (owner, token) if live else None

    async def _drop_ahead(self, ahead: _Ahead) -> None:
        """Give back the lease granted for a drive of the call that did not take it, or that a
        commit stopped on its way (the call cancelled) may have granted all the same."""
        ahead.closed = True
        settling = {task for task in ahead.helpers if not task.done()}
        if ahead.asking and settling:  # answers judged past a cancel: a grant of theirs goes
            # back at `_on_grant`, one unanswered when they end then, not waited for here
            unanswered = partial(_unanswered, ahead)
            self._give_back_after(ahead.session_id, ahead.owner, settling, unanswered)
        elif _unanswered(ahead):
            await self._give_back_unseen(ahead.session_id, ahead.owner)
        if ahead.token is None:
            return
        session_id, owner, token = ahead.session_id, ahead.owner, ahead.token
        ahead.token = None
        self._undrive(session_id)
        if self._expiries.get(session_id, (None,))[0] == token:
            del self._expiries[session_id]  # kept for a drive (`_hold`) that never came
        try:
            with contextlib.suppress(StoreError):  # else kept in `_unreleased` for later
                await self._release(session_id, owner, token)
        finally:
            self._let_go(session_id, owner)

    def _undrive(self, session_id: str) -> None:
        """One drive (or lease held for one) fewer of the session in this process."""
        self._driving[session_id] -= 1
        if not self._driving[session_id]:
            del self._driving[session_id]

    async def _probe(self, session_id: str) -> bool:
        # The lease this call holds for the drive it has yet to begin: no drive runs the turn.
        ahead = self._ahead_of(session_id)
        if ahead is not None and ahead.token is not None:
            return False
        return await super()._probe(session_id)
