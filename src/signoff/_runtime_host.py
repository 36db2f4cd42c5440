"""`RuntimeHost`: what a delegate call (`_subagents`) creates, starts, drives and cancels its
child session through, the runtime behind a few methods; and how deep children may nest."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from typing import TYPE_CHECKING, Any

from ._budgets import budget_left, by_budget
from ._cancellation import stop_calls
from ._child_closes import record_behind_mirrors
from ._child_sessions import cancel_orphan, child_id, delegating, first_turn
from ._creation import turn_events
from ._events import Event
from ._exceptions import ChildHeld, SessionExpired, StoreError
from ._prompts import check_prompt
from ._recording import new_id, runnable, stored_status
from ._results import GenerateResult
from ._state import SessionState, fold
from ._types import Principal

if TYPE_CHECKING:
    from ._runtime import Runtime

__all__ = ["MAX_DEPTH", "RuntimeHost", "SubagentFailed"]

MAX_DEPTH = 8
"""How deep subagents nest: a delegate call that would create a child further below its root
session fails instead, so an agent that delegates to itself (or two that delegate to each
other) cannot create sessions without end."""


class SubagentFailed(Exception):
    """The child's turn failed; the delegate call's result is this error."""


class RuntimeHost:
    """What the engine drives child sessions through: the runtime, behind a few methods."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def create_child(
        self,
        agent: str,
        parent: str,
        key: str,
        *,
        turn: str | None = None,
        task: tuple[str, dict[str, Any] | None, str] | None = None,
    ) -> str:
        """Create the child session once: its id derives from the call's idempotency key. Its
        `session.created` names the parent and the parent's `turn` that delegated to it, which
        may have ended as the child is created (the orphan sweep then lists the child). Given
        its `task` (message, principal, source), its delegated turn starts in the same write:
        no process dying between two writes can leave a child without the task it was made for."""
        rt = self.runtime
        spec = rt.agent(agent)
        child = child_id(key)
        if await rt.store.head(child) is not None:
            return child
        parent_state = await rt._state(parent)
        depth = await self._depth(parent_state.parent)
        if depth > MAX_DEPTH:
            # Raised inside the call's journaled step: a replay fails the same way.
            raise SubagentFailed(
                f"delegating to {agent!r} from session {parent} would nest subagents "
                f"{depth} deep; the limit is {MAX_DEPTH}"
            )
        now = rt.now()
        ttl = spec.limits.ttl_seconds
        initiator = parent_state.initiator
        # What the parent may still spend bounds the child while it runs: fixed here, in its
        # `session.created`, so a replay or a restart bounds it the same way.
        limits = rt.agent(parent_state.agent).limits
        left = budget_left(parent_state, limits.tokens_bound, limits.cost_bound)
        spent = parent_state.usage + parent_state.delegated
        event = Event(
            session_id=child,
            seq=1,
            type="session.created",
            at=now,
            data={
                "agent": spec.name,
                "initiator": None if initiator is None else initiator.model_dump(),
                "parent": parent,
                "parent_turn": turn,
                "ttl": ttl,
                **({"headroom": left} if left else {}),
                # What the parent had counted then: its other subagents' spend counted later
                # comes out of this child's share (`_child_headroom.headroom_now`).
                **({"parent_spent": by_budget(spent, left)} if left else {}),
            },
        )
        state = fold([event])
        events = [event]
        if task is not None:
            message, who, source = task
            check_prompt(message)
            events += turn_events(state, message, who, source, None, now)
        try:
            await rt.store.create_session(
                child,
                spec.name,
                events,
                None if ttl is None else now + ttl,
                status=stored_status(state),
            )
        except StoreError:
            if await rt.store.head(child) is None:
                raise
            return child  # created by a run that died before journaling it
        rt._remember(state)
        return child

    async def _depth(self, grandparent: str | None) -> int:
        """How deep a new child lies below its root session (1 for a child of a root), given its
        parent's own parent; counted no further than one past `MAX_DEPTH`."""
        depth = 1
        while grandparent is not None and depth <= MAX_DEPTH:
            depth += 1
            created = await self.runtime.store.read_events(grandparent, limit=1)
            grandparent = created[0].data.get("parent") if created else None
        return depth

    async def start_child(
        self, child: str, message: str, principal: dict[str, Any] | None, source: str
    ) -> bool:
        """Start the child's one turn, unless its creation or a run that died before journaling
        it did; whether this did. Either way, cancel it if its parent no longer waits on it."""
        rt = self.runtime
        state = await rt._state(child)
        started = state.turn is None
        if started:
            who = None if principal is None else Principal.model_validate(principal)
            await rt._start_turn(child, message, who, source=source, delegated=True)
            state = await rt._state(child)
        # The parent's cancel may have swept its children just before this turn started, or its
        # turn ended before the call journaled the child.
        await cancel_orphan(rt, state)
        return started

    async def behind_mirrors(self, state: SessionState) -> bool:
        """As the session's turn would park: record the passed deadlines and TTLs behind its
        open mirrors (its subagents', which a mirror shows but does not hold), closing the
        mirrors of what they closed, as a listing does; whether the session changed. A subagent
        another drive holds is not waited for here: its delegate call waits (`drive_child`)."""
        return await record_behind_mirrors(self.runtime, state, lease_wait=0.0)

    async def abandon_child(
        self,
        child: str,
        message: str,
        principal: dict[str, Any] | None,
        source: str,
        turn: str | None,
    ) -> None:
        """The parent's `turn` ended (or was replaced) before its delegate call recorded the
        child it had created: cancel the child's turn (started with it, or now for a child an
        older signoff created without), so no one runs a task its parent no longer waits on.
        Nothing while that turn goes on elsewhere."""
        rt = self.runtime
        if await rt.store.head(child) is None:
            return
        state = await rt._state(child)
        if state.parent is None:
            return
        parent = (await rt._state(state.parent)).turn
        if parent is not None and parent.id == turn and parent.status in ("running", "waiting"):
            return  # another drive took the turn over: its replay reuses the child
        await self.start_child(child, message, principal, source)

    async def drive_child(self, child: str, agent: str, parent: str) -> GenerateResult:
        """Run the child's turn (of `agent`, delegated to by `parent`) here, even under workers,
        until it ends or waits.

        While another drive holds the child (an answer given to it directly, a worker), a
        worker's drive waits for that drive to end: the child's result is this call's, never a
        busy error. A call's drive waits `lease_wait`, as for its own session, then stops,
        recording nothing (`ChildHeld`): its call answers `running`, and the parent's next drive
        takes the child's result. So does a runtime lacking the child's agent (`_undriven`).
        """
        rt = self.runtime
        ended = await self._delegated_turn(child)
        if ended is not None:
            return ended
        if agent not in rt.agents:
            return await self._undriven(child)
        while True:
            owner = f"{rt.owner}:{new_id('sub')}"
            token = await rt._acquire(child, owner)
            while token is None:
                state = await rt._state(child)
                if not runnable(state):  # the other drive ended or parked the turn
                    return await self._delegated_turn(child) or rt._result(state)
                if not rt._in_worker_drive():
                    raise ChildHeld(f"the subagent's session {child!r} is driven elsewhere")
                token = await rt._acquire(child, owner)
            reset = delegating.set(delegating.get() | {child})
            try:
                result = await rt._drive(child, claimed=(owner, token))
            except StoreError:
                if child in rt._kept_on_error and rt._owes_any(child):
                    # The store refused a tool's outcome, kept here: the child's lease is kept
                    # while it is recorded, so no other process runs it again, and so is the
                    # parent's; in a worker's drive, here (then the child is driven again).
                    if await rt._kept_child(child, parent):
                        continue
                    raise
                # A worker's failed drive keeps its lease until it lapses; this one is given
                # back (or kept to give back first here), so a retry of the parent need not
                # wait it out: under the owner of the pass that failed, which kept it.
                kept_owner, kept_token = rt._kept_on_error.pop(child, (owner, token))
                rt._kept_lapsing.discard(child)
                with contextlib.suppress(StoreError):
                    await rt._release(child, kept_owner, kept_token)
                raise
            finally:
                delegating.reset(reset)
            if result.status != "running":
                return await self._delegated_turn(child) or result
            # Its lease was lost (no renewal got through in time): the child is another
            # drive's now, or ours again once the lease lapses; waited for as above.

    async def _undriven(self, child: str) -> GenerateResult:
        """The child as it is, for a runtime lacking its agent: a turn ended or waiting on people
        needs no drive. One with work to do that another drive holds (a worker with its agent)
        is waited for as `drive_child` waits: a worker's drive until that drive ends or parks
        it, a call's `lease_wait`, then `ChildHeld`. One no drive holds is `UnknownAgent`, which
        fails the parent's drive: its work runs only where its agent is."""
        rt = self.runtime
        deadline = time.monotonic() + rt.lease_wait
        delay = 0.005
        while True:
            state = await rt._state(child)
            turn = state.turn
            if turn is not None and not (turn.status in ("running", "waiting") and runnable(state)):
                return await self._delegated_turn(child) or rt._result(state)
            if turn is None or not await rt._busy(child):
                # Read again: the drive that held it may have ended its turn since the read.
                state = await rt._state(child)
                turn = state.turn
                if turn is not None and not (
                    turn.status in ("running", "waiting") and runnable(state)
                ):
                    return await self._delegated_turn(child) or rt._result(state)
                rt.agent(state.agent)  # raises
            if not rt._in_worker_drive() and time.monotonic() >= deadline:
                raise ChildHeld(f"the subagent's session {child!r} is driven elsewhere")
            # Jitter, as `_acquire` waits: parents waiting together do not read in lockstep.
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 0.2)

    async def cancel_child(
        self, child: str, reason: str | None, principal: Principal | None = None
    ) -> GenerateResult:
        """Cancel the child's delegated turn from its parent's drive (the parent goes on by
        itself), by `principal`; returns that turn's result, which may have ended otherwise
        first. Only that turn: one a message to the child began since it was read is its own."""
        rt = self.runtime
        state = await rt._state(child)
        first = await first_turn(rt, state)
        if first.turn is not None and state.turn is not None and first.turn.id != state.turn.id:
            return rt._result(first)  # ended, and the child is on a turn of its own
        turn_id = None if state.turn is None else state.turn.id
        reset = delegating.set(delegating.get() | {child})
        try:
            try:
                result = await rt.cancel(child, reason, principal=principal, turn_id=turn_id)
            except SessionExpired:  # its expiry is recorded: nothing to stop
                result = self.runtime._result(await self.runtime._state(child))
        finally:
            delegating.reset(reset)
        if not result.cancelled and turn_id is not None and child in rt._holders:
            await self._stop_cancelled(child, turn_id)
        return await self._delegated_turn(child) or result

    async def _stop_cancelled(self, child: str, turn_id: str) -> None:
        """Stop the tool bodies of the child's drive here, whose turn another process cancelled
        first (the parent's cancel reaches its children): as this process's own cancel would,
        not only at that drive's next lease renewal. Not once a later turn of the child began."""
        rt = self.runtime
        state = await rt._state(child)
        if state.turn is not None and state.turn.id == turn_id and state.turn.status == "cancelled":
            abort = rt._aborts.pop(child, None)  # read just now: no later turn is driven yet
            if abort is not None:
                stop_calls(abort)

    async def _delegated_turn(self, child: str) -> GenerateResult | None:
        """The result of the child's first turn, the one its delegate call started, once a
        later turn (a message sent to the child afterwards) followed it; None while it is the
        child's current turn. The later turn's text is not the delegate call's result."""
        rt = self.runtime
        state = await rt._state(child)
        first = await first_turn(rt, state)
        if first.turn is None or state.turn is None or first.turn.id == state.turn.id:
            return None
        return rt._result(first)
