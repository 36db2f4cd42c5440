"""A subagent's requests closing on their own (answered on the child, a deadline, its turn
cancelled, its TTL), seen from its parent: the parent's mirrors of them close and its delegate
call goes on. The runtime calls these hooks through `_child_sessions`, which re-exports them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from ._exceptions import SessionExpired, StoreError, UnknownSession
from ._mirror_keys import MAX_HOPS
from ._mirrors import close_mirror
from ._recording import runnable
from ._state import SessionState
from ._types import InputRequest

if TYPE_CHECKING:
    from ._answering import Answering
    from ._runtime import Runtime

__all__ = [
    "after_close",
    "after_drive",
    "before_drive",
    "delegating",
    "open_mirrors",
    "parents_left_to_holders",
    "parents_to_claims",
    "record_behind_mirrors",
]

delegating: ContextVar[frozenset[str]] = ContextVar("signoff_delegating", default=frozenset())
"""Child sessions their parent's drive is handling in this task (it goes on by itself)."""

_to_claims: ContextVar[asyncio.Task[Any] | None] = ContextVar("signoff_to_claims_in", default=None)
"""The task of a worker's drive (`parents_to_claims`)."""


_leaving: ContextVar[bool] = ContextVar("signoff_parents_left", default=False)
"""Within a read's or a sweep's records and drives (`parents_left_to_holders`)."""


@contextlib.contextmanager
def parents_left_to_holders(leave: bool = True) -> Iterator[None]:
    """Within, a read or a sweep records subagents' passed deadlines and TTLs and drives their
    turns: a parent that can go on after one is driven only if no other drive holds it
    (`lease_wait` 0), not waited for, as such a read leaves any turn another drive holds: that
    drive finds the mirror closed and goes on itself. `leave=False` within: a turn's own drive
    (`_child_drives.driven`), whose calls wait as they would anywhere."""
    reset = _leaving.set(leave)
    try:
        yield
    finally:
        _leaving.reset(reset)


@contextlib.contextmanager
def parents_to_claims() -> Iterator[None]:
    """Within, in this task, a worker drives a session it claimed: a subagent's parent that can
    go on after it is left runnable for the worker's claims (`concurrency` at once, a stop
    heeded), whatever `inline` is. The tasks it starts (its tools') drive as they would anywhere."""
    reset = _to_claims.set(asyncio.current_task())
    try:
        yield
    finally:
        _to_claims.reset(reset)


async def after_drive(rt: Runtime, session_id: str) -> None:
    """A child session driven on its own (answered directly, a deadline passed): close the
    parent's mirrors of requests it closed and let the parent's turn go on. The child is read
    from the store when the cache does not hold it (`cache_size=0`)."""
    if session_id in delegating.get():
        return
    try:
        state = rt._cache.get(session_id) or await rt._state(session_id)
    except UnknownSession:  # deleted with its tree meanwhile: no parent goes on
        return
    if state.parent is None:
        return
    try:
        parent = await rt._state(state.parent)
    except UnknownSession:  # deleted with its tree once the child's turn ended: none goes on
        return
    if await _lapsed(rt, parent):
        return
    # Mirrors closed already count too: an answer through the parent that lost to one given
    # here closes the mirror and raises, leaving the parent's turn for this drive to go on.
    mirrors = _mirrors(parent, session_id)
    await _close_all(rt, parent, mirrors)
    if mirrors:
        await _go_on(rt, parent.id)


async def before_drive(rt: Runtime, session_id: str) -> None:
    """A child session about to be driven on its own (answered directly, claimed by a worker):
    close the parent's mirrors of the requests it closed first, so that a process dying once
    its turn ended leaves the parent's turn runnable (a worker's to claim) rather than waiting
    on a mirror nothing looks at again. The parent's turn goes on after the child's
    (`after_drive`)."""
    state = rt._cache.get(session_id) or await rt._state(session_id)
    if state.parent is None or session_id in delegating.get():
        return
    try:
        parent = await rt._state(state.parent)
    except UnknownSession:
        return
    if parent.expired(rt.now()):  # its expiry is recorded instead (`after_drive`)
        return
    await _close_all(rt, parent, _mirrors(parent, session_id))


async def after_close(rt: Runtime, state: SessionState) -> None:
    """A child whose requests closed on their own (its turn cancelled, its session expired),
    not from its parent's drive: close the parent's mirrors of them and let the parent's turn
    go on, so the delegate call gets its result instead of a wait that never ends."""
    if state.parent is None or state.id in delegating.get():
        return
    try:
        parent = await rt._state(state.parent)
    except UnknownSession:
        return
    if await _lapsed(rt, parent):
        return
    # Mirrors closed already count too, as for `after_drive`: an answer through the parent that
    # lost to this close closes its mirror and raises, leaving the parent's turn to go on here.
    mirrors = _mirrors(parent, state.id)
    await _close_all(rt, parent, mirrors)
    if mirrors:
        await _go_on(rt, parent.id)


async def record_behind_mirrors(
    rt: Answering, state: SessionState, *, lease_wait: float | None = None
) -> bool:
    """Record the passed deadlines and TTLs of the subagents the session's open mirrors stand
    for (deepest first, where this runtime has their agents, as a listing does), and go on with
    the turns that left runnable (a listing drives them too: a call the deadline approved
    runs; a subagent held by another drive is waited for `lease_wait`, `rt.lease_wait` if
    None); then close the mirrors of the requests that closed. Returns whether the session
    changed. A send or prompt deciding on its turn finds it as it would had a listing looked:
    an approval a deadline closed holds the turn no more. The session's own turn is left to
    that call, and so is a mirror whose request closed unseen (an answer that call gives to it
    finds it closed) or one it cannot read. (A cancel records them in its own commit instead,
    and its subagents' cancels in theirs: `_cancel_batch`.)"""
    mirrors = open_mirrors(state)
    kids = list(dict.fromkeys(r.child.session_id for r in mirrors if r.child is not None))
    if not kids:
        return False
    seq = state.seq  # `state` may be the cached copy, which the appends below move on
    reset = delegating.set(delegating.get() | set(kids))  # their ends drive no parent
    try:
        moved = [kid for kid in kids if await _record_below(rt, kid, lease_wait)]
        for mirror in mirrors:
            if mirror.child is not None and mirror.child.session_id in moved:
                await close_mirror(rt, state.id, mirror)
    finally:
        delegating.reset(reset)
    return (await rt._state(state.id)).seq != seq


async def _record_below(rt: Answering, child: str, lease_wait: float | None) -> bool:
    """`record_behind_mirrors` for one subagent's session: whether this recorded anything."""
    try:
        kid = await rt._state(child)
    except (UnknownSession, StoreError):
        return False  # gone, or unreadable: the caller goes on as it would have
    if kid.agent not in rt.agents:
        return False  # left to a process that has it (a message refuses first: `Answering`)
    seq = kid.seq
    with contextlib.suppress(SessionExpired, UnknownSession, StoreError):
        applied: list[bool] = []
        below = await record_behind_mirrors(rt, kid, lease_wait=lease_wait)
        kid = await rt._checked(child, applied=applied)
        if (applied or below) and runnable(kid):
            await rt._drive(child, lease_wait=lease_wait)
    try:
        return (await rt._state(child)).seq != seq
    except (UnknownSession, StoreError):
        return False


def open_mirrors(state: SessionState) -> list[InputRequest]:
    """The session's current turn's open mirrors."""
    turn = state.turn
    return [
        r
        for r in state.pending_requests()
        if r.child is not None and turn is not None and r.turn_id == turn.id
    ]


async def _close_all(rt: Runtime, parent: SessionState, mirrors: list[Any]) -> None:
    """Close the open ones of `mirrors` (the parent's, of one child's requests) as their
    requests closed, and pass every close up the chain (`_close_above`)."""
    for live in mirrors:
        if live.status == "pending":
            await close_mirror(rt, parent.id, live.request)
    for live in mirrors:
        await _close_above(rt, parent.id, live.request)


async def _close_above(rt: Runtime, session_id: str, mirror: InputRequest) -> None:
    """Once `mirror` (in `session_id`) is closed, close each ancestor's mirror of it in turn,
    walking up while one closes: a mirror shows the request it stands for as it stands now,
    three levels up as one. Each close is fenced as the first (`close_mirror`: its turn, still
    open, no lease needed while another drive holds that session); one that stays open (its
    session's TTL passed, a turn moved on) ends the walk, left to that session's next drive."""
    for _ in range(MAX_HOPS):
        try:
            state = await rt._state(session_id)
            live = state.requests.get(mirror.id)
            if state.parent is None or live is None or live.status == "pending":
                return
            above = await rt._state(state.parent)
        except UnknownSession:  # deleted with its tree meanwhile: nothing above to close
            return
        ups = [
            m.request
            for m in _mirrors(above, session_id)
            if m.status == "pending"
            and m.request.child is not None
            and m.request.child.request_id == mirror.id
        ]
        if not ups:
            return
        session_id, mirror = above.id, ups[0]
        await close_mirror(rt, session_id, mirror)


def _mirrors(parent: SessionState, child: str) -> list[Any]:
    """The parent's current turn's mirrors of `child`'s requests, open or closed."""
    turn = parent.turn
    return [
        live
        for live in parent.requests.values()
        if live.request.child is not None
        and live.request.child.session_id == child
        and turn is not None
        and live.request.turn_id == turn.id
    ]


async def _lapsed(rt: Runtime, parent: SessionState) -> bool:
    """Whether the parent's TTL passed: its delegate call can never take the child's result, so
    its mirrors are not closed (that would count its TTL again from now) nor its turn driven
    on; its expiry is recorded instead where this runtime has its agent (else by one that has)."""
    if not parent.expired(rt.now()):
        return False
    if parent.agent in rt.agents:
        with contextlib.suppress(SessionExpired):
            await rt._checked(parent.id)
    return True


async def _go_on(rt: Runtime, parent: str) -> None:
    """Drive the parent's turn if it can go on and this runtime has its agent; otherwise it is
    left runnable in the store for a process (a worker) that has it, as it is in a worker's
    drive (`parents_to_claims`). A parent deleted since it was read (another process finished its
    turn, then a prune took the tree) has none. A read's or a sweep's drive of the child waits
    for no other drive holding the parent (`parents_left_to_holders`); a call's waits
    `lease_wait`, as for a session of its own."""
    worker = _to_claims.get()
    if worker is not None and worker is asyncio.current_task():
        return
    try:
        state = await rt._state(parent)
        if state.agent in rt.agents and runnable(state):
            await rt._drive(parent, lease_wait=0.0 if _leaving.get() else None)
    except UnknownSession as exc:
        if exc.session_id != parent:
            raise
