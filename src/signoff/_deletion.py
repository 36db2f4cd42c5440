"""`Runtime.delete_session`: a finished session erased from the store, with its subagents'
sessions, in one transaction that also records who deleted it and why in the audit trail."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

from ._answers import check_principal, check_text
from ._call_guards import closes_stop
from ._cancel_batch import CancelBatch
from ._child_sessions import awaited, cancel_expired, delegating, first_turn
from ._deadlines import expiry_resolves, expiry_specs
from ._event_stream import EventStream
from ._exceptions import (
    SessionBusy,
    SessionError,
    SessionExpired,
    SessionWaiting,
    StoreDamaged,
    StoreError,
    SubagentSession,
    UnknownSession,
    UsageError,
)
from ._recording import Batch
from ._session_cache import check_session_id
from ._session_page import check_listing
from ._settings import seconds, whole
from ._state import SessionState, turn_over
from ._sweeps import STORE_FAILING
from ._sync import twin
from ._text import storable
from ._types import Principal
from .stores._deletions import StaleKey

if TYPE_CHECKING:
    from ._runtime import Runtime

__all__ = ["Deletion"]

log = logging.getLogger("signoff.runtime")

_PARENT_EXPIRED = "the parent session expired"
"""The reason a delegated turn is cancelled with when its parent's TTL passed, as
`cancel_expired` records it."""


def _unread(session_id: str, exc: StoreError, damaged: dict[str, str]) -> list[str]:
    """A prune's session it cannot read (a damaged row): noted in `damaged` and logged, none
    deleted. Listed first at every prune, the others are deleted all the same, and this one is
    left to a forced deletion, or to a prune once it is mended."""
    damaged[session_id] = str(exc)
    log.warning(
        "session %s: not pruned, as it cannot be read (delete it with force): %s", session_id, exc
    )
    return []


def _expiry(now: Callable[[], float]) -> Callable[[SessionState], Batch]:
    """The batch recording a session's passed TTL (`expiry_specs`), built on its state at
    `now()`: none once recorded."""

    def build(current: SessionState) -> Batch:
        if not (current.expired(now()) and expiry_specs(current)):
            return Batch(specs=[])
        return Batch(specs=expiry_specs(current), resolve=expiry_resolves(current))

    return build


def _deleter(by: Principal | None, reason: str | None) -> dict[str, object] | None:
    """`by` as a deletion records it (its text `storable`), once it and `reason` are checked
    (`UsageError`)."""
    if reason is not None and not isinstance(reason, str):
        raise UsageError(f"reason must be a string, not {type(reason).__name__}")
    if reason is not None:
        check_text(reason, "the reason")
    principal = check_principal(by, "by")
    if principal is None:
        return None
    # The deletion's entry is written as UTF-8 text, which cannot hold a lone surrogate (the
    # session's events, which `by` may have signed, can): kept escaped, as a sign-out's is.
    return {key: _escaped(value) for key, value in principal.model_dump().items()}


def _escaped(value: object) -> object:
    """`value` (plain JSON, as `check_principal` leaves attributes: keys UTF-8 text) with its
    text `storable`: each lone surrogate as its escape."""
    if isinstance(value, str):
        return storable(value)
    if isinstance(value, dict):
        return {key: _escaped(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_escaped(item) for item in value]
    return value


class Deletion(EventStream):
    """Session deletion, which `Runtime` offers beside its turns, answers and audit trail."""

    @closes_stop
    async def delete_session(
        self,
        session_id: str,
        *,
        by: Principal | None = None,
        reason: str | None = None,
        force: bool = False,
    ) -> list[str]:
        """Delete the session and everything the store keeps of it: events, snapshot, requests,
        lease, audit entries, and the same of its subagents' sessions; the deletion itself is
        recorded (by whom, why, where each chain ended) in the audit stream `store:deletions`.
        Returns the ids deleted, the session's first. Refused, nothing changed: a turn running
        or with work to do, under a lease or not, before its TTL passes (`SessionBusy`), or
        waiting on people (`SessionWaiting`): cancel it first (past its TTL, or that of a
        subagent whose own turn holds them, the expiry is recorded as its agent records it, and
        it is deleted, unless another turn of the tree is unfinished before its TTL: then
        nothing is recorded); a subagent's session whose parent exists (`SubagentSession`); an
        unknown id (`UnknownSession`).

        `force`: delete it unfinished too, its open requests with it, for a session no cancel
        can finish (a damaged one: `StoreError`), or whose row cannot be read (`StoreDamaged`).
        Only a lease a drive plainly holds still refuses it (`SessionBusy`); the deletion's
        audit entry says it was forced."""
        check_session_id(session_id)
        who = _deleter(by, reason)
        if not isinstance(force, bool):
            raise UsageError(f"force must be True or False, not {force!r}")
        await self.open()
        if getattr(self.store, "delete_session", None) is None:  # a store for an earlier signoff
            raise UsageError(f"{type(self.store).__name__} cannot delete sessions")
        return await self._erase(session_id, who, reason, force=force)

    @closes_stop
    async def prune(
        self,
        *,
        older_than: float,
        by: Principal | None = None,
        reason: str | None = None,
        limit: int = 1000,
        agent: str | None = None,
    ) -> list[str]:
        """Retention: delete the finished top-level sessions (`idle`, `failed`, `cancelled`, or
        any whose TTL passed) of `agent` (of every agent if None) whose last activity, the
        newest of theirs and their subagents' sessions', is more than `older_than` seconds
        before now, oldest first, at most `limit` of them, each with
        its subagents' sessions as `delete_session` deletes them: one transaction and one
        `store:deletions` entry per session, so a crash midway leaves each whole or gone, and
        the next prune goes on. A session found live, or touched since it was listed, is
        skipped, as is one it cannot read (a damaged row, or its events when its passed TTL
        must be recorded first: `delete_session(force=True)` deletes it), logged as a warning
        naming it; the prune goes on past them until `limit` are deleted or none is left, so
        one that returns fewer than `limit` left none it could delete. Returns the ids of the
        top-level sessions deleted, oldest first."""
        deleted, _, _, _ = await self._prune(
            older_than=older_than, by=by, reason=reason, limit=limit, agent=agent
        )
        return deleted

    async def _prune(
        self,
        *,
        older_than: object,
        by: Principal | None,
        reason: str | None,
        limit: object,
        agent: str | None,
        dry_run: bool = False,
        at: float | None = None,
    ) -> tuple[list[str], list[str], bool, dict[str, str]]:
        """`prune`: the ids it deleted, the candidates it tried (those deleted, skipped and
        damaged, oldest first), whether more were old enough past the last it tried, and the
        candidates it could not read, with why. With `dry_run`, nothing is deleted, and the
        candidates are the oldest `limit`. `at`: the moment `older_than` counts back from and
        TTLs are read at (now if None), so a listing and the deletion asked about share it."""
        age = seconds("older_than", older_than, zero=True)
        count = whole("limit", limit, least=1, most=2**63 - 1)
        check_listing(agent, None)
        who = _deleter(by, reason)
        await self.open()
        stale = getattr(self.store, "stale_sessions", None)
        if stale is None or not all(
            getattr(self.store, name, None) is not None for name in ("delete_session", "flush")
        ):
            raise UsageError(f"{type(self.store).__name__} cannot prune sessions")
        now = self.now() if at is None else at
        before = now - age
        size = min(count + 1, 2**63 - 1)  # one more than the limit tells whether any are left

        async def page(after: StaleKey | None, most: int = size) -> list[tuple[str, StaleKey]]:
            found: list[tuple[str, StaleKey]] = await stale(
                before=before, now=now, limit=most, agent=agent, after=after
            )
            return found

        rows = await page(None)
        if dry_run:
            return [], [sid for sid, _ in rows[:count]], len(rows) > count, {}
        listed: list[str] = []
        deleted: list[str] = []
        damaged: dict[str, str] = {}
        place: StaleKey | None = None
        ahead = rows[::-1]  # popped from the end: the oldest first
        try:
            while len(deleted) < count:
                if not ahead:
                    if len(rows) < size:
                        break  # the last page: none left
                    # A full page tried, some skipped: the next starts past them, not at the
                    # oldest again, which every prune would list, and skip, for ever.
                    rows = await page(place)
                    ahead = rows[::-1]
                    if not ahead:
                        break
                session_id, place = ahead.pop()
                listed.append(session_id)
                # A store that never suspends (SQLite's) held the loop for the whole prune: a
                # server answered nothing, and a drive renewed no lease, while thousands went.
                await asyncio.sleep(0)
                try:
                    erased = await self._erase(
                        session_id, who, reason, before=before, durable=False, damaged=damaged
                    )
                except (SessionBusy, SessionWaiting, SubagentSession, UnknownSession):
                    continue  # live, a subagent's by now, or gone already: another run's to see
                if erased:
                    deleted.append(session_id)
            more = bool(ahead) or (len(rows) == size and bool(await page(place, 1)))
        except BaseException as exc:
            if deleted:  # the first error is the one raised; the sync's is noted on it
                try:
                    await self.store.flush()  # type: ignore[attr-defined]
                except Exception as also:
                    exc.add_note(
                        f"the {len(deleted)} deletion(s) before it may not be on disk: "
                        f"syncing them failed too ({type(also).__name__}: {also})"
                    )
            raise
        if deleted:  # each committed without waiting for the disk: synced together
            await self.store.flush()  # type: ignore[attr-defined]
        return deleted, listed, more, damaged

    async def _erase(
        self,
        session_id: str,
        who: dict[str, object] | None,
        reason: str | None,
        *,
        before: float | None = None,
        durable: bool = True,
        force: bool = False,
        damaged: dict[str, str] | None = None,
    ) -> list[str]:
        """Delete the session in the store, recording first a TTL that passed while it waited;
        with `before`, only if its last activity is older ([] if it was touched since); not
        `durable`, committed without waiting for the disk (the caller's `flush` syncs it);
        `force`, unfinished too (see `delete_session`). With `damaged` (a prune's), a session
        that cannot be read (its row, or its events when its TTL must be recorded) is noted
        there and logged ([])."""
        delete = self.store.delete_session  # type: ignore[attr-defined]
        since: dict[str, object] = {"durable": durable}
        if before is not None:
            since["before"] = before
        if force:  # passed only when given: a store that cannot force is asked nothing else
            if "force" not in inspect.signature(delete).parameters:
                raise UsageError(f"{type(self.store).__name__} cannot force a deletion")
            since["force"] = True
        try:
            ids: list[str] = await delete(
                session_id, now=self.now(), by=who, reason=reason, **since
            )
        except StoreDamaged as exc:  # its row: not its other sessions' to fail on
            if damaged is None:
                raise
            return _unread(session_id, exc, damaged)
        except SessionWaiting as waiting:
            # Waiting on requests no one can answer any more (a TTL passed): recorded as a
            # listing would record it (they expire), then deleted. Recording it, its subagents'
            # turns cancelled with it, is no activity (`records_expiry`), and a session past its
            # TTL comes to life no more: no `before` then (but while only a subagent's own turn
            # expired, the session itself may yet be touched).
            try:
                expired, failed = await self._expired_now(
                    session_id, waiting.held_by, getattr(waiting, "unfinished", None)
                )
            except STORE_FAILING:
                raise  # the store failing as a whole: a prune's other sessions would too
            except StoreError as exc:
                if damaged is None:
                    raise
                return _unread(session_id, exc, damaged)
            if not expired:
                raise
            again = {} if before is None or session_id in expired else {"before": before}
            try:
                ids = await delete(
                    session_id, now=self.now(), by=who, reason=reason, durable=durable, **again
                )
            except SessionWaiting:
                if failed is None or damaged is not None:
                    raise  # a prune's: skipped, tried again by the next prune
                # Still waiting as the store failed to record an expiry: that failure is why,
                # not people to cancel first (it said "cancel it first").
                raise failed from None

        for sid in ids:
            self._cache.pop(sid, None)
            self._refused_drives.pop(sid, None)
        return ids

    async def _deletion_refusal(
        self, session_id: str, *, force: bool = False
    ) -> SessionError | None:
        """What `delete_session` (`force`: a forced one) would refuse the session with now,
        found without deleting or recording anything: None if it would delete it, recording
        first the passed TTLs that leave its open requests to no one (`_expired_now`), or if
        the store cannot tell beforehand. `signoff delete` asks it before asking a person."""
        check = getattr(self.store, "check_deletion", None)
        if check is None:
            return None
        try:
            await check(session_id, now=self.now(), force=force)
        except SessionWaiting as waiting:
            unfinished = getattr(waiting, "unfinished", None)
            return (
                None
                if await self._freeing_expiries(session_id, waiting.held_by, unfinished)
                else waiting
            )
        except (SessionBusy, SubagentSession, UnknownSession) as refused:
            return refused
        return None

    async def _expired_now(
        self,
        session_id: str,
        held_by: Sequence[str] = (),
        unfinished: Sequence[str] | None = None,
    ) -> tuple[list[str], StoreError | None]:
        """Record the passed TTLs that leave the open requests of the session's tree to no one
        (`_freeing_expiries`), as their agents record them. The ids whose expiry it recorded;
        none (nothing recorded) if the deletion would be refused all the same; and the first
        store error a record met (another process may have recorded it meanwhile)."""
        ends = await self._freeing_expiries(session_id, held_by, unfinished)
        failures: list[StoreError] = []
        for ended in ends.values():
            await self._record_ends(ended, failures)
        return list(ends), failures[0] if failures else None

    async def _freeing_expiries(
        self,
        session_id: str,
        held_by: Sequence[str] = (),
        unfinished: Sequence[str] | None = None,
    ) -> dict[str, dict[str, SessionState]]:
        """The passed TTLs that leave the open requests of the session's tree to no one, read
        only, each with the turns recording it ends (`_finished_with`): the session's, and that
        of each session above a request of `held_by`'s whose own turn (a subagent's a message
        started, which its parent's expiry leaves alone) is unfinished past its own TTL, each
        with the delegated turns it waits on. None (empty) if a request would stay open, or a
        turn of `unfinished` (the store's `SessionWaiting.unfinished`: unfinished before their
        TTL) go on, which would refuse the deletion all the same (`SessionBusy`)."""
        ends: dict[str, dict[str, SessionState]] = {}  # each expiring session: the turns it ends
        seen: set[str] = set()
        for holder in dict.fromkeys([session_id, *held_by]):
            path: list[SessionState] = []  # the holder, then the sessions above it
            sid: str | None = holder
            while sid is not None and sid not in seen:
                seen.add(sid)
                try:
                    state = await self._state(sid)
                except UnknownSession:
                    break
                path.append(state)
                sid = None if sid == session_id else state.parent
            for state in reversed(path):  # a parent's first, whose expiry ends what it awaits
                if await self._expiring(state, session_id):
                    ends[state.id] = await self._finished_with(state)
        over = {sid for ended in ends.values() for sid in ended}  # the turns the expiries end
        if not ends or not over.issuperset(held_by) or not over.issuperset(unfinished or ()):
            return {}
        return ends

    async def _expiring(self, state: SessionState, top: str) -> bool:
        """Whether the session's TTL passed with its turn unfinished, and its expiry ends that
        turn for good: not a subagent's turn its parent's (unexpired) turn awaits, which would
        go on with the failure."""
        if not (state.expired(self.now()) and expiry_specs(state) and state.turn is not None):
            return False
        if state.id == top or state.parent is None:
            return True
        try:
            parent = await self._state(state.parent)
        except UnknownSession:
            return True
        return state.id not in awaited(parent)

    async def _record_ends(
        self, ended: dict[str, SessionState], failures: list[StoreError]
    ) -> None:
        """Record the expiry of the first of `ended` (`_finished_with`'s), as its agent records
        it: the delegated turns it waits on cancelled, then its own requests expired. A store
        error is noted in `failures`, not raised: another process may have recorded it."""
        top, *kids = ended.values()
        turn = top.turn
        assert turn is not None  # `_expiring`'s: an unfinished turn
        if top.agent in self.agents:  # its subagents' turns cancelled first, then its expiry
            try:
                await self._checked(top.id)
            except SessionExpired:
                pass
            except StoreError as exc:
                failures.append(exc)
        # What that left (no agent of theirs here), or all of it for a runtime without the
        # agent (the CLI's on --store), in the same order: nothing drives these sessions,
        # deleted next.
        for kid in kids:
            await self._end_delegated(kid, failures)
        if top.agent not in self.agents or await self._still_on(top.id, turn.id):
            # Recorded as a stand-in, as a subagent's mirror closed is (`_append`); also where
            # its agent's record did not take (`_record_expiry` passes a store's failure by).
            try:
                await self._append(top.id, _expiry(self.now), durable=True, turn_id=turn.id)
            except StoreError as exc:
                failures.append(exc)

    async def _still_on(self, session_id: str, turn_id: str) -> bool:
        """Whether the session's turn `turn_id` is still unfinished, read from the store."""
        try:
            now = (await self._state(session_id)).turn
        except UnknownSession:
            return False
        return now is not None and now.id == turn_id and not turn_over(now)

    async def _end_delegated(self, kid: SessionState, failures: list[StoreError]) -> None:
        """End the delegated turn of `kid` its parent's expiry ends, unless it ended already:
        cancelled (its own TTL passed: expired) by its agent if here, as `cancel_expired` does,
        else by a stand-in that only records it."""
        turn = kid.turn
        assert turn is not None and kid.parent is not None  # `_finished_with`'s: a live child
        try:
            now = (await self._state(kid.id)).turn
        except UnknownSession:
            return
        if now is None or now.id != turn.id or turn_over(now):
            return  # its agent here cancelled it with its parent's (`_checked`), or it ended
        if kid.agent in self.agents:
            reset = delegating.set(delegating.get() | {kid.id})  # its parent's expiry closes
            try:
                await cancel_expired(cast("Runtime", self), [kid.id], kid.parent)
            finally:
                delegating.reset(reset)
            return
        build: Callable[[SessionState], Batch] = (
            _expiry(self.now)
            if kid.expired(self.now())
            else CancelBatch(turn.id, _PARENT_EXPIRED, None, [], expiry=True)
        )
        try:
            await self._append(kid.id, build, durable=True, turn_id=turn.id)
        except StoreError as exc:
            failures.append(exc)

    async def _finished_with(self, state: SessionState) -> dict[str, SessionState]:
        """The sessions whose turns the expiry of `state` ends, it first: it, and the delegated
        turns it waits on (`awaited`), recursively, as `cancel_delegated` cancels them (a turn a
        message to the child started since is the child's own, and left)."""
        found = {state.id: state}
        todo = deque((state.id, child) for child in awaited(state))
        while todo:
            parent, child = todo.popleft()
            if child in found:
                continue
            try:
                kid = await self._state(child)
            except UnknownSession:
                continue
            if kid.parent != parent or kid.turn is None or turn_over(kid.turn):
                continue  # a session whose creation named another parent is not its child
            first = (await first_turn(cast("Runtime", self), kid)).turn
            if first is not None and first.id == kid.turn.id:
                found[child] = kid
                todo.extend((child, grandchild) for grandchild in awaited(kid))
        return found

    delete_session_sync = twin(delete_session)
    prune_sync = twin(prune)
