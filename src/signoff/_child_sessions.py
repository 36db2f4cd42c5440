"""The child sessions of delegate calls, seen from their parent: closing the parent's mirrors
when a child's requests close (`reconcile`; the hooks around a child's own drives are
`_child_closes`'s, re-exported or wrapped here), cancelling a delegated turn its parent no
longer waits on, and counting in the parent what its children spent (what a child may still
spend is `_child_headroom`'s).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ._cancellation import cancelled_for_expiry, expiring
from ._child_closes import after_close as _after_close
from ._child_closes import after_drive as _after_drive
from ._child_closes import before_drive, delegating
from ._events import Event
from ._exceptions import (
    SessionExpired,
    SignoffError,
    SubagentOrphaned,
    UnknownAgent,
    UnknownSession,
)
from ._mirrors import close_mirror
from ._recording import EventSpec
from ._state import CallState, SessionState, fold
from ._state_parts import CHILD_KEY, child_id
from ._types import InputRequest, Principal, Usage

if TYPE_CHECKING:
    from ._runtime import Runtime

__all__ = [
    "CHILD_KEY",
    "after_close",
    "after_drive",
    "before_drive",
    "awaited",
    "cancel_delegated",
    "cancel_expired",
    "cancel_for_expiry",
    "cancel_orphan",
    "child_id",
    "children",
    "count_owed",
    "counted_once_stopped",
    "count_spent",
    "delegated",
    "delegating",
    "first_turn",
    "reconcile",
    "orphaned_retry",
    "refuse_orphaned_retry",
    "unjournaled",
    "with_spend",
]

log = logging.getLogger("signoff.runtime")


async def reconcile(rt: Runtime, state: SessionState) -> bool:
    """Before the parent's turn is driven, close its open mirrors whose child requests closed
    while nothing told it (an answer given with `resume=False`, a process that died, a child
    session that expired); returns whether it closed any. Each child's own mirrors first, so a
    grandchild's request closed so closes the mirrors above it too."""
    turn = state.turn
    mirrors = [
        r
        for r in state.pending_requests()
        if r.child is not None and turn is not None and r.turn_id == turn.id
    ]
    if not mirrors:
        return False
    kids = children(mirrors)
    reset = delegating.set(delegating.get() | set(kids))  # this drive goes on by itself
    try:
        for child in kids:
            with contextlib.suppress(SessionExpired, UnknownSession):
                await rt._checked(child)  # records the child's expiry and passed deadlines
                await reconcile(rt, await rt._state(child))
        for mirror in mirrors:
            await close_mirror(rt, state.id, mirror)
    finally:
        delegating.reset(reset)
    return (await rt._state(state.id)).seq != state.seq


def children(requests: Iterable[InputRequest]) -> list[str]:
    """The child sessions that `requests` (mirrors among them) were asked for, once each."""
    out: list[str] = []
    for r in requests:
        if r.child is not None and r.child.session_id not in out:
            out.append(r.child.session_id)
    return out


def unjournaled(state: SessionState) -> list[str]:
    """The child sessions the turn's started calls that journaled none may have created: a
    delegate call creates its child (its turn started with it), then journals it, and a cancel
    between the two writes, or after its process died there, must reach that child too. Most
    such ids name no session (the calls of other tools)."""
    turn = state.turn
    out: list[str] = []
    for c in [] if turn is None else turn.calls.values():
        if c.status in _UNSTARTED or c.idempotency_key is None or c.subagents():
            continue
        out.append(child_id(f"{c.idempotency_key}:{CHILD_KEY}"))
    return out


_UNSTARTED = ("proposed", "requested", "approved", "denied", "done")


def delegated(state: SessionState) -> list[str]:
    """The child sessions of the turn's delegate calls that have no result yet: cancelling the
    turn cancels them too, whether or not they wait on a person yet."""
    return _journaled(state, done=False)


async def cancel_orphan(rt: Runtime, state: SessionState) -> bool:
    """Cancel a child's live delegated turn that its parent no longer waits on (the parent's
    turn was cancelled, completed or replaced), so no one runs it or asks for a cancelled task.

    Checked after the child's turn starts and before any drive of it: a cancel of the parent
    that swept its children just before the turn started, or a starter that died before this
    check, still leaves no live child. Returns whether it cancelled.
    """
    return (await _end_orphan(rt, state)) is _CANCELLED


_CANCELLED = "cancelled"
_LEFT, _LEFT_LAPSED = "left", "left lapsed"
"""`_end_orphan`'s ends: the turn cancelled, or one to cancel left to a process that has its
agent (`_LEFT_LAPSED`: ended by a passed TTL above it)."""


async def _end_orphan(rt: Runtime, state: SessionState) -> str | None:
    """`cancel_orphan`: `_CANCELLED`, `_LEFT` or `_LEFT_LAPSED` where its turn is to end, None
    where it is left alone. A turn below one left (its agent elsewhere) is ended here all the
    same: the process lacking the middle agent must not take an answer for the tree's end."""
    turn = state.turn
    if state.parent is None or turn is None or turn.status not in ("running", "waiting"):
        return None
    first = (await first_turn(rt, state)).turn
    if first is None or first.id != turn.id:  # a turn a message to the child started: its own
        return None
    try:
        parent = await rt._state(state.parent)
    except UnknownSession:
        return None
    above = None if parent.expired(rt.now()) else await _end_orphan(rt, parent)
    if above is _CANCELLED:
        # The parent's own delegated turn ended (a session above it passed its TTL, say), which
        # ends this one: its parent's expiry cancels the whole chain below it.
        parent = await rt._state(state.parent)
    if parent.expired(rt.now()) and parent.agent in rt.agents:
        with contextlib.suppress(SessionExpired):  # recorded first: its mirrors read expired
            await rt._checked(parent.id)
    held = await rt._held_past_ttl(parent)  # its TTL passed, but a live drive runs it on
    if above in (_LEFT, _LEFT_LAPSED):
        # The parent's delegated turn is to end, as above, but its agent is elsewhere: the
        # parent is left to that process's orphan sweep, and this turn ends here all the same.
        lapsed = above is _LEFT_LAPSED
    elif _takes_results(parent, rt.now(), held=held) and (
        state.id in _journaled(parent, done=True)
        # Created (its turn started with it) by a call of the parent's turn that has yet to
        # journal it and has no result: that call journals it still, or its retry does.
        or state.id in unjournaled(parent)
    ):
        return None
    else:
        # Ended by a passed TTL, the parent's or one above it that cancelled the parent's turn
        # (a process without this agent recorded it): no activity.
        lapsed = _lapsed_turn(parent, rt.now(), held=held) or await _ended_by_expiry(
            rt, parent, state
        )
    cancelled = True
    reset = expiring.set(expiring.get() | ({state.id} if lapsed else set()))
    try:
        with contextlib.suppress(SessionExpired):  # its expiry is recorded instead: as good
            cancelled = await _cancel_child(rt, state, "the parent turn ended", None)
    finally:
        expiring.reset(reset)
    await count_spent(rt, state.id)
    if cancelled:
        return _CANCELLED
    return _LEFT_LAPSED if lapsed else _LEFT


def _lapsed_turn(parent: SessionState, now: float, *, held: bool) -> bool:
    """Whether the parent's TTL ended its turn: its expiry recorded, or its TTL passed with the
    turn unfinished and no live drive running it on (`held`)."""
    turn = parent.turn
    if held or not parent.expired(now):
        return False
    return parent.lapsed or (turn is not None and turn.status in ("running", "waiting"))


async def _ended_by_expiry(rt: Runtime, parent: SessionState, child: SessionState) -> bool:
    """Whether the parent's turn that created `child` was cancelled because a session above it
    passed its TTL (`expiry`): that ends the child's delegated turn by time too, however deep."""
    turn = parent.turn
    if turn is None or turn.status != "cancelled":
        return False
    if child.id not in _journaled(parent, done=True) and child.id not in unjournaled(parent):
        return False  # a child of an earlier turn: the parent moved on since
    return await cancelled_for_expiry(rt.store, parent.id, turn.id, turn.first_seq)


async def refuse_orphaned_retry(rt: Runtime, session_id: str) -> None:
    """Refuse (`SubagentOrphaned`) a retry of a child's failed delegated turn that its parent no
    longer waits on: its delegate call read the failure as its result, counting what the child
    had spent, or the parent's turn ended. Run again, it would spend against its parent's
    headroom without the parent ever reading its result or counting its spend."""
    state = await rt._state(session_id)
    turn = state.turn
    if state.parent is None or turn is None or turn.status != "failed" or not turn.retryable:
        return
    first = (await first_turn(rt, state)).turn
    if first is None or first.id != turn.id:  # a turn a message to the child started: its own
        return
    try:
        parent = await rt._state(state.parent)
    except UnknownSession:
        return
    if _takes_results(parent, rt.now()) and (
        session_id in delegated(parent) or session_id in unjournaled(parent)
    ):
        return  # the call still waits on it: a retry's result is the call's
    raise SubagentOrphaned(session_id, parent.id)


async def orphaned_retry(rt: Runtime, session_id: str) -> bool:
    """Whether a retry of the session's failed turn would be refused (`refuse_orphaned_retry`):
    then no retry will come, and a message sent to it starts a turn of its own."""
    try:
        await refuse_orphaned_retry(rt, session_id)
    except SubagentOrphaned:
        return True
    return False


def _takes_results(parent: SessionState, now: float, *, held: bool = False) -> bool:
    """Whether the parent's turn may still take its delegate calls' results: it runs or waits,
    or failed in a way a retry resumes, and its session has not passed its TTL (or has, with a
    live drive running it on: `held`, no expiry)."""
    turn = parent.turn
    if turn is None or (parent.expired(now) and not held):
        return False
    return turn.status in ("running", "waiting") or (turn.status == "failed" and turn.retryable)


def awaited(state: SessionState) -> list[str]:
    """The child sessions an unfinished turn waits on (its mirrors' and its delegate calls'
    without a result): none once the turn ended."""
    turn = state.turn
    if turn is None or turn.status not in ("running", "waiting"):
        return []
    return list(dict.fromkeys([*children(state.pending_requests()), *delegated(state)]))


async def cancel_expired(rt: Runtime, kids: Iterable[str], parent: str) -> None:
    """Cancel the delegated turns of `kids`, which `parent`, a session whose TTL passed, waited
    on (`awaited`): its delegate calls can never take their results, so a child waiting on a
    person is not left open for ever, nor run once answered. Time did that, not anyone: no
    activity of theirs (`expiring`)."""
    kids = list(kids)
    reset = expiring.set(expiring.get() | set(kids))
    try:
        for child in kids:
            try:
                await cancel_delegated(rt, parent, child, "the parent session expired", None)
            except (UnknownSession, SessionExpired):
                pass
            except SignoffError as exc:  # the parent's expiry is what its caller must hear of
                log.warning("subagent session %s is left to the orphan sweep: %s", child, exc)
    finally:
        expiring.reset(reset)


async def cancel_delegated(
    rt: Runtime, parent: str, child: str, reason: str | None, principal: Principal | None
) -> None:
    """Cancel the child's delegated turn for its `parent`'s cancel; a later turn, which a message
    sent to the child started, is the child's own and is left alone, as is a session whose
    creation named another parent (or none): it is no child of this one, to cancel or count."""
    state = await rt._state(child)
    if state.parent != parent:
        return
    if state.turn is None and state.parent is not None:
        state = await _start_unstarted(rt, state)
    first = (await first_turn(rt, state)).turn
    if state.turn is not None and first is not None and first.id == state.turn.id:
        with contextlib.suppress(SessionExpired):  # its expiry is recorded: its turn ended
            await _cancel_child(rt, state, reason, principal)
    await count_spent(rt, child)


async def _start_unstarted(rt: Runtime, state: SessionState) -> SessionState:
    """Start, for its parent's cancel to cancel, the delegated turn of a child whose delegate
    call (an older signoff's, in two steps) journaled its session and died before it started
    the turn: left without one, the child read as an empty session, and a message to it was
    refused as busy for ever (`_start_turn`: the delegated task must start first). Its task is
    the call's `message`."""
    assert state.parent is not None
    parent = await rt._state(state.parent)
    turn = parent.turn
    calls = [] if turn is None else [c for c in turn.calls.values() if state.id in c.subagents()]
    given = [c.input if c.edited_input is None else c.edited_input for c in calls]
    tasks = [
        g["message"] for g in given if isinstance(g, dict) and isinstance(g.get("message"), str)
    ]
    if turn is None or len(tasks) != 1:
        return state
    source = "schedule" if turn.source == "schedule" else "message"
    # A process taking the call up again may start it at the same moment: its turn is as good.
    with contextlib.suppress(SignoffError):
        await rt._start_turn(state.id, tasks[0], turn.principal, source=source, delegated=True)
    return await rt._state(state.id)


async def _cancel_child(
    rt: Runtime, state: SessionState, reason: str | None, principal: Principal | None
) -> bool:
    """Cancel the child's turn that its caller checked (`state.turn`) for its parent; whether
    that turn is over now (cancelled, or it ended meanwhile). A turn a message to the child
    started since is the child's own and left alone. A runtime lacking the child's agent logs
    that it leaves the child to one that has it (its orphan sweep cancels it)."""
    turn_id = None if state.turn is None else state.turn.id
    try:
        await rt.cancel(state.id, reason, principal=principal, turn_id=turn_id)
    except UnknownAgent:
        why = "is left to a process that has its agent (its orphan sweep cancels it)"
        log.warning("subagent session %s of agent %r %s", state.id, state.agent, why)
        return False
    return True


async def first_turn(rt: Runtime, state: SessionState) -> SessionState:
    """The child session as it was up to its first turn's end: that turn is the one its
    delegate call started; a later one was started by a message sent to the child."""
    if state.turn is None or state.turn.first_seq <= 2:  # 1: session.created, 2: the first
        return state
    events: list[Event] = []
    started = False
    async for e in rt.events(state.id, follow=False):
        if e.type == "turn.started":
            if started:
                break
            started = True
        events.append(e)
    return fold(events)


def _journaled(state: SessionState, *, done: bool) -> list[str]:
    """The child sessions the turn's delegate calls journaled (`done`: calls with a result
    too), once each."""
    turn = state.turn
    out: list[str] = []
    for c in [] if turn is None else turn.calls.values():
        if c.status == "done" and not done:
            continue
        out += [child for child in c.subagents() if child not in out]
    return out


async def with_spend(
    rt: Runtime, parent: str, call: CallState, specs: list[EventSpec]
) -> list[EventSpec]:
    """`specs` ending `call` (of session `parent`), its `tool.completed` carrying as `delegated`
    what the call's child (a session whose creation names `parent`) spent through the turn the
    call started (its own usage and its children's, which its own delegate calls recorded): the
    parent's budgets count it. A call ended again after a failure to record it (a replay, a
    restart) reads the same figure from the child's log. A child that failed on its share of
    the parent's budgets is named (`share_spent`): the parent asks about them at its next model
    step."""
    kids = call.subagents()
    if not kids or any(kind == "tool.completed" and "delegated" in d for kind, d in specs):
        return specs
    spent = Usage()
    short: dict[str, Any] = {}
    stopped: list[str] = []
    for child in dict.fromkeys(kids):
        with contextlib.suppress(UnknownSession):
            if (await rt._state(child)).parent != parent:
                continue
            settled = await _settle(rt, child)
            if settled is None:  # not ended: what it spent so far
                first = await first_turn(rt, await rt._state(child))
                settled = first.usage + first.delegated, False
            spent = spent + settled[0]
            if not settled[1]:  # a child of its spends on elsewhere: the rest counted later
                short[child] = settled[0].model_dump()
            if await _on_share(rt, child):
                stopped.append(child)
    if spent == Usage() and not short and not stopped:
        return specs
    more = {
        "delegated": spent.model_dump(),
        **({"short": short} if short else {}),
        **({"share_spent": stopped[0]} if stopped else {}),
    }
    return [(kind, {**d, **more}) if kind == "tool.completed" else (kind, d) for kind, d in specs]


async def _on_share(rt: Runtime, child: str) -> bool:
    """Whether the child's delegated turn failed on its share of its parent's budgets (its
    `turn.failed` says `share`)."""
    turn = (await first_turn(rt, await rt._state(child))).turn
    if turn is None or turn.status != "failed" or turn.error is None:
        return False
    if turn.error.get("code") != "session_limit_reached":
        return False
    ends = await rt.store.read_events(child, turn.first_seq, types=["turn.failed"])
    return any(e.turn_id == turn.id and e.data.get("share") is True for e in ends)


async def _settle(rt: Runtime, child: str) -> tuple[Usage, bool] | None:
    """What the child spent through its delegated (first) turn once that turn ended (None while
    it runs or waits, or while a drive still holds it cancelled, whose model call in flight may
    yet be billed), its usage and its children's, and whether every child of that turn is
    counted in it. The ones that turn left owed are counted first (those still live cancelled:
    their parent's turn ended), so a grandchild's spend is in the child's figure before the top
    counts it, even where a process died between the child's cancel and the grandchild's
    count; one counted after a later turn of the child started is that turn's figure too."""
    state = await rt._state(child)
    first = await first_turn(rt, state)
    turn = first.turn
    if turn is not None and turn.status in ("running", "waiting"):
        return None
    if turn is None:
        return first.usage + first.delegated, True
    if turn.status == "cancelled" and state.turn is not None and state.turn.id == turn.id:
        if await rt._busy(child):
            return None  # its drive goes on: counted once it stopped (`after_drive`)
        state = await rt._state(child)  # read after: a bill recorded before it stopped is in it
        first = await first_turn(rt, state)
    if any(t == turn.id for t in state.owed.values()):
        for kid in [k for k, t in state.owed.items() if t == turn.id]:
            with contextlib.suppress(UnknownSession, SessionExpired):
                await cancel_orphan(rt, await rt._state(kid))  # a live one: cancelled, counted
            await count_spent(rt, kid)
        state = await rt._state(child)
        first = await first_turn(rt, state)
    spent = first.usage + first.delegated
    late = {k for k, t in first.owed.items() if t == turn.id} | _short(first, turn.id)
    if late and first.seq < state.seq:  # counted in the child after its next turn started
        async for e in rt.events(child, after=first.seq, follow=False):
            if e.type == "subagent.spent" and e.data["session_id"] in late:
                late.discard(e.data["session_id"])
                spent = spent + Usage(**e.data["delegated"])
    whole = not any(t == turn.id for t in state.owed.values()) and not _short(state, turn.id)
    return spent, whole


def _short(state: SessionState, turn: str) -> set[str]:
    """The children whose delegate calls of `turn` counted them short of their own children."""
    return {k for k, (t, _) in state.short.items() if t == turn}


async def after_drive(rt: Runtime, session_id: str) -> None:
    """`_child_closes.after_drive`, then what the child spent counted in a parent that owes it
    (`counted_once_stopped`)."""
    await _after_drive(rt, session_id)
    await counted_once_stopped(rt, session_id)


async def counted_once_stopped(rt: Runtime, session_id: str) -> None:
    """What a child spent through its delegated turn, cancelled, counted in a parent that owes
    it (`count_spent`): a drive at that turn as its parent's cancel cancelled it (its model call
    in flight) may record what the reply was billed (`model.spent`) before it stops, so the
    cancel left the count to the end of that drive (`_settle`), also when the drive went on to a
    message queued behind the turn."""
    state = rt._cache.get(session_id)
    if state is None:
        try:
            state = await rt._state(session_id)
        except UnknownSession:  # deleted with its tree meanwhile: nothing owes it
            return
    if state.parent is None or state.turn is None:
        return
    try:
        parent = await rt._state(state.parent)
    except UnknownSession:
        return
    if session_id not in parent.owed and session_id not in parent.short:
        return  # the common case: its parent counted it, or its call is still at it
    first = (await first_turn(rt, state)).turn
    if first is not None and first.status == "cancelled":  # its delegated turn, `_settle` left
        await count_spent(rt, session_id)


async def after_close(rt: Runtime, state: SessionState) -> None:
    """`_child_closes.after_close`, then what the child spent counted in a parent that owes it
    (`count_spent`): a parent cancelled by a process without the child's agent waits for the
    child's turn to end on its own, cancelled or expired, which nothing else tells it."""
    await _after_close(rt, state)
    if state.parent is not None:
        await count_spent(rt, state.id)


async def count_spent(rt: Runtime, child: str) -> bool:
    """Count in the child's parent what the child spent through its delegated turn (its usage
    and its own `delegated`), once that turn ended, no drive is at it (`_settle`) and its own
    children are counted in it, if the parent owes it: the parent's turn ended before the
    delegate call did. A count reaches on up, to a grandparent that owes the parent. Whether it
    recorded; safe to repeat, anywhere."""
    try:
        state = await rt._state(child)
        if state.parent is None:
            return False
        parent = await rt._state(state.parent)
    except UnknownSession:
        return False
    turn = parent.owed.get(child)
    short = parent.short.get(child)
    if turn is None and short is None:  # its call counted it whole, or it is counted already
        return False
    try:
        settled = await _settle(rt, child)
    except UnknownSession:  # its tree deleted meanwhile (a prune, once its turn ended)?
        if await rt.store.head(child) is not None:
            raise
        return False  # nothing is owed it; and the session found gone is not one asked about
    if settled is None or not settled[1]:
        return False  # it (or a child of its) spends on: counted once its turn ends
    whole = turn is not None
    figure: dict[str, Any] = settled[0].model_dump()
    data: dict[str, Any] = {"session_id": child, "delegated": figure}
    if short is not None and turn is None:  # its call's end counted part of it: the rest now
        turn, counted = short[0], short[1]
        # `counted` says it is the rest, and of what: a trace tells it from a whole count.
        data["delegated"] = {k: max(v - counted.get(k, 0), 0) for k, v in figure.items()}
        data["counted"] = counted

    def build(current: SessionState) -> list[EventSpec]:
        owing = current.owed if whole else current.short
        return [("subagent.spent", data)] if child in owing else []

    try:
        recorded = bool(await rt._append(parent.id, build, turn_id=turn))
    except UnknownSession:  # the parent deleted with its tree since it was read
        if await rt.store.head(child) is not None:
            raise
        return False
    if recorded:  # the parent, a subagent counted late in its own parent, may be owed on up
        await count_spent(rt, parent.id)
    return recorded


async def count_owed(rt: Runtime, state: SessionState) -> bool:
    """`count_spent` for each child the session owes (a process died between cancelling the
    child and counting it, or it was left to a process that has its agent); whether any was
    recorded."""
    recorded = False
    for child in [*state.owed, *state.short]:
        recorded = await count_spent(rt, child) or recorded
    return recorded


async def cancel_for_expiry(rt: Runtime, kids: list[str], parent: str) -> list[EventSpec]:
    """Before `parent`'s expiry is recorded: cancel the delegated turns of `kids`, which it
    waited on (`awaited`; those whose creation named it: `cancel_delegated`), and give a
    `subagent.spent` for each whose turn ended, to commit with the expiry. A process dying in
    between leaves the expiry unrecorded, for the next look (a sweep) to record with the spend;
    nothing is left owed that no one would count."""
    if not kids:
        return []
    reset = delegating.set(delegating.get() | set(kids))  # the expiry closes the mirrors
    try:
        await cancel_expired(rt, kids, parent)  # counts nothing yet: owed at its expiry
    finally:
        delegating.reset(reset)
    specs: list[EventSpec] = []
    for child in kids:
        try:
            if (await rt._state(child)).parent != parent:
                continue
            settled = await _settle(rt, child)
        except (UnknownSession, SessionExpired):
            continue
        except SignoffError as exc:  # counted after the expiry, as a child left running is
            log.warning("subagent session %s is counted later: %s", child, exc)
            continue
        if settled is not None and settled[1]:
            spent = settled[0].model_dump()
            specs.append(("subagent.spent", {"session_id": child, "delegated": spent}))
    return specs
