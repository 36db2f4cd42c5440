"""The engine's side of `ctx.ask()`, `ctx.step()` and subagent mirroring for one tool call."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from ._any_loop import AnyLoopEvent
from ._ask import echoes_answers
from ._events import Event
from ._exceptions import SignoffError, StoreError, TooLarge, UsageError, record_fenced
from ._recording import (
    Batch,
    EventSpec,
    TurnStopped,
    dump_request,
    load_journal,
    new_id,
    own_cancel,
)
from ._state import CallState, SessionState
from ._steps import failure_of, raise_recorded
from ._sync import to_end
from ._tool_json import jsonable, over_limit, recorded_bound, result_bound
from ._tool_signals import (
    ApprovalRequired,
    InputUnavailable,
    QuestionWithdrawn,
    refused_misuse,
)
from ._types import MAX_OPTIONS, Action, ChildRef, InputRequest, Option, Principal
from ._unrecorded import UNRECORDED_KEPT
from .stores import Resolve

if TYPE_CHECKING:
    from ._tool_calls import ToolCalls

__all__ = ["UNRECORDED_KEPT", "CallJournal"]

_CANCEL_YIELDS = 100
"""Loop turns a parked branch waits at most for the body's cancel to reach it through its groups
(one a group nested in the body); the cancel ends the wait at once."""

_NOT_THE_STEPS = (TurnStopped, ApprovalRequired, QuestionWithdrawn, InputUnavailable)
"""What a step may raise that is about the run, not the step's effect: never journaled, so the
step runs again on replay (as after a crash). The signals steer the call, not the step. Nor is
a failure of the runtime's own (`CallJournal.failed`: a delegate's step creating or starting its
child on this store, down a moment), after which the drive fails and a retry runs the step again
(the child is then created): journaled, the outage would be raised again on every replay. Nor
is signoff's refusal of the step's function stepping or asking (`misuse_in_step`): a bug in the
tool's code, which once fixed runs the step. Nor an exception group holding one of these (the
step's function ran an `asyncio.TaskGroup`). Any other exception is the step's own failure,
which the tool may catch and go on from: journaled, a `SignoffError` too, a `StoreError` of
the step's own code (another store's, a signoff server's it called): the journal's own record
fails apart from the step's function, never inside it; and a `CancelledError` the step's code
raised itself, its task not being cancelled (`own_cancel`: an inner future someone else
cancelled), unlike the body's cancel reaching the step where it awaits, which runs it again."""


class CallJournal:
    """The engine's side of `ctx.ask()` / `ctx.step()` for one call: records and replays."""

    def __init__(
        self,
        driver: ToolCalls,
        call_id: str,
        principal: Principal | None,
        shown: Callable[[], Any],
    ) -> None:
        self.driver = driver
        self.call_id = call_id
        # The input the body's questions show (`asked_input`): taken at its first ask and kept,
        # so every ask of this run shows the same (a lazy input is validated again to take it).
        self._shown = shown
        self._shown_input: tuple[Any] | None = None
        # Events of any loop: a plain body may step and ask on a loop of its own, in its thread
        # (`asyncio.run(ctx.ask(...))`), which an `asyncio.Event` set on the drive's loop never
        # woke (nor the drive one set there until its loop next woke): it parked for ever.
        self.parked = AnyLoopEvent()
        self.closed = AnyLoopEvent()  # the body ended: a stray branch may ask no more
        self.stopped = False  # closed as the body parked (or its drive stopped), not at its end
        self._counts = threading.Lock()  # `inflight` and `recording` change on either loop
        self.inflight = 0  # questions being opened and steps under way
        self.quiet = AnyLoopEvent()  # set while nothing is in flight
        self.quiet.set()
        # Records of steps whose function ended (their effect ran), on their way to the store:
        # a drive stopped mid-body waits for these, not for a function still running.
        # A plain step's thread counts from its start: it cannot be cancelled, and runs on.
        self.recording = 0
        self.recorded = AnyLoopEvent()
        self.recorded.set()
        self.over = False  # its drive stopped and gave the lease back: nothing is recorded now
        # A record of the body's that the store refused, or a drive it could not make here (a
        # subagent's, whose agent this process lacks): the drive fails, the call goes on later.
        self.failed: SignoffError | None = None
        turn = driver.state.turn
        # The turn running the call: a reload after a concurrent append may show a later one.
        self.turn_id = driver.own_turn
        # The seq of that turn's `turn.started` (a delegate call reads its cancel from there).
        self.turn_seq = turn.first_seq if turn is not None and turn.id == self.turn_id else 0
        scheduled = turn is not None and turn.source == "schedule"
        self.can_ask = (
            not (principal is not None and principal.principal_type == "runtime") and not scheduled
        )
        # How the turn started (`message` or `schedule`): a subagent's turn takes it.
        self.turn_source = "schedule" if scheduled else "message"

    def _call(self) -> CallState:
        """The call as the state shows it; `TurnStopped` once its turn was cancelled or replaced
        (a reload showed it, or a read of the log found it cancelled in another process:
        `Held.cancelled`): the body then runs no further step, of another turn's call least."""
        turn = self.driver.state.turn
        held = self.driver.held
        if (
            (held is not None and held.cancelled == self.turn_id)
            or turn is None
            or turn.id != self.turn_id
            or turn.status == "cancelled"
            or self.call_id not in turn.calls
        ):
            raise TurnStopped
        return turn.calls[self.call_id]

    async def _record(self, specs: Any, **kwargs: Any) -> list[Event]:
        """`Driver.record`, remembering a failure of the store: what the body raises after it
        is not the call's outcome (`ToolCalls.run_tool`), the drive failed."""
        try:
            return await self.driver.record(specs, **kwargs)
        except StoreError as exc:
            self.failed = exc
            raise

    def refused(self) -> None:
        """Raise the failure of a record of the body's (`failed`): the drive fails, whatever the
        body made of it (caught, it went on as if the step had failed, though its effect ran),
        and a retry here records what was kept instead of running it again."""
        if self.failed is not None:
            raise self.failed from None

    async def read(self) -> None:
        """Read back the call's journal if the state holds none (one read from a snapshot), before
        the body runs: it reads the entries at any time. A reload keeps it (`Driver.reload`)."""
        while True:
            turn = self.driver.state.turn
            call = None if turn is None else turn.calls.get(self.call_id)
            if call is None or call.journal is not None:
                return
            await load_journal(self.driver.store, self.driver.state, call)

    def entries(self) -> Sequence[dict[str, Any] | None]:
        journal = self._call().journal
        assert journal is not None, "read() before the body runs"
        return journal

    def lookup(self, request_id: str) -> tuple[str, dict[str, Any] | None]:
        r = self.driver.state.requests.get(request_id)
        if r is None:
            return "withdrawn", {"outcome": "cancelled"}
        return r.status, r.resolution

    def asked(self, request_id: str) -> tuple[list[Option], bool] | None:
        r = self.driver.state.requests.get(request_id)
        return None if r is None else (r.request.options, r.request.allow_text)

    @property
    def keyed(self) -> bool:
        """A call journals by key unless it began journaling by position (an older version)."""
        call = self._call()
        return call.keyed or not call.journaled

    async def run_step(
        self,
        index: int,
        name: str,
        run: Callable[[], Awaitable[Any]],
        *,
        plain: bool = False,
        child: bool = False,
    ) -> Any:
        """Run a step's function and journal its result as JSON (`jsonable`). It counts as in
        flight meanwhile, so a body that parks waits for it instead of cancelling it between its
        effect and its record (a cancelled step runs again on replay); a `plain` one (a thread,
        which runs on whatever is cancelled) counts as on its way to its record from its start,
        so a drive that stops waits for it too. A `child` one is marked as a delegate call's
        creation of its child session (`_state_parts._child`)."""
        self._body_running(f"ctx.step({name!r})", "nothing ran")
        keyed = self.keyed  # as when `index` was claimed: empty only ever turns keyed
        self.refused()  # nothing more runs in a drive that failed to record: a retry steps
        self._busy(1)
        if plain:
            self._on_way(1)
        try:
            call = self._call()
            # In memory only; as a JSON list no part (a call id or name holding NUL) runs into
            # another, nor is it a call's own key (`Unrecorded` holds both, of every session).
            at = [self.driver.state.id, self.turn_id, call.idempotency_key or call.id]
            held_key = json.dumps(["step", *at, keyed, index, name])
            held = self.driver.unrecorded.pop(held_key)
            if held is not None:  # it ran in this process; only recording it failed
                await self._journaled_to_end(held_key, held[0][1])
                if held[0][1].get("error") is not None:
                    raise_recorded(name, held[0][1]["error"])
                return held[0][1]["result"]
            if self.driver.lease_check is not None:
                # A drive that stalled past its lease (frozen in the body before this step)
                # runs no step: the process that took the turn over may have run it already.
                # Its loss (or the store failing the check) fails the drive, not the step.
                try:
                    await self.driver.lease_check()
                except StoreError as exc:
                    self.failed = exc
                    raise
            if self.driver.cancel_check is not None:
                # Nor one of a turn another process cancelled (a read of the session's head,
                # and of its log only if others wrote to it): the effect would run unrecorded.
                # A renewal may not have read the cancel yet. The store failing fails the drive.
                try:
                    await self.driver.cancel_check()
                except StoreError as exc:
                    self.failed = exc
                    raise
                self._call()  # `TurnStopped` if it found the turn cancelled
            data: dict[str, Any] = {
                "call_id": call.id,
                "tool_name": call.tool_name,
                "index": index,
                "name": name,
            }
            if keyed:
                data["keyed"] = True
            if child:
                data["child"] = True
            returned = False  # once the function returned, its effect ran: never run again
            try:
                result = await run()
                returned = True
                # A result that has no JSON form (two keys written alike, an integer of too many
                # digits) or is too large fails the step, journaled: its effect ran.
                data["result"] = jsonable(result)
                too_large = over_limit(f"step {name!r} returned", data["result"], self._limit())
                if too_large is not None:
                    del data["result"]
                    raise TooLarge(too_large)
            except (Exception, asyncio.CancelledError) as exc:
                if not isinstance(exc, Exception) and not own_cancel(exc):
                    raise  # the body is cancelled where the step awaits: it runs again
                if not returned and (refused_misuse(exc) or self._about_the_run(exc)):
                    raise
                # The step's own failure, which the tool may catch and go on from: journaled,
                # so a replay takes the same path instead of running the step again.
                data["error"] = failure_of(exc)
                limit = self._limit()
                if over_limit("the step's failure", data["error"], limit) is not None:
                    # Attributes of megabytes (a response's body) are left out first: rebuilt
                    # from its arguments alone, it is still the same class on replay.
                    data["error"] = failure_of(exc, attributes=False)
                if over_limit("the step's failure", data["error"], limit) is not None:
                    # A message of megabytes is cut, as a tool's is: replayed as `StepFailed`.
                    data["error"] = failure_of(exc, cut=limit // 4)
                await self._journaled_to_end(held_key, data)
                raise
            await self._journaled_to_end(held_key, data)
            return data["result"]
        finally:
            if plain:
                self._on_way(-1)
            self._busy(-1)

    def _about_the_run(self, exc: BaseException) -> bool:
        """Whether `exc` is, or an exception group holds (the step's function ran a
        `TaskGroup`), this journal's own failure (`failed`: not a sibling's) or a signal
        (`_NOT_THE_STEPS`): about the run, not the step's effect."""
        if exc is self.failed or isinstance(exc, _NOT_THE_STEPS):
            return True
        if isinstance(exc, BaseExceptionGroup):
            return any(self._about_the_run(inner) for inner in exc.exceptions)
        return False

    def stop(self) -> None:
        """The body is cancelled without ending the call: parked on a question (it runs again
        once answered), or its drive stopped. Called before the cancel: neither its unwinding
        (a `finally`) nor a branch it left running (a task it started, a shielded one) steps or
        asks now: what it did would not be replayed, and the resumed body does it again."""
        self.stopped = True
        self.closed.set()

    def _body_running(self, what: str, nothing: str) -> None:
        """Refuse a step or question of a branch that outlived the body (`UsageError`), and one
        this drive could record nothing of: it gave its lease back with its last commit
        (`TurnStopped`, as its record would raise once the effect had run)."""
        if self.closed.is_set():
            # The call's outcome is recorded, or the body parked and replays once answered:
            # an effect now would go unseen, and the resumed body would run it again.
            when = (
                "stopped (it parked, or its drive was stopped: it runs again on resume)"
                if self.stopped
                else "ended"
            )
            task = asyncio.current_task()
            if self.stopped and task is not None and task.cancelling():
                why = (
                    "the body (or a branch cancelled with it) is unwinding, in a `finally` or an "
                    "`except asyncio.CancelledError`, and the resumed body runs this when it "
                    "gets there"
                )
            else:
                why = (
                    "a branch of its body outlived it (use asyncio.TaskGroup, which cancels its "
                    "tasks when one fails or the body is cancelled)"
                )
            raise UsageError(f"{what} after call {self.call_id} {when}: {why}; {nothing}")
        if self.driver.released:
            raise TurnStopped

    async def _journaled_to_end(self, held_key: str, data: dict[str, Any]) -> None:
        """`_journaled`, awaited to its end whatever cancels the body meanwhile (`Runtime.close`:
        the record may wait for the session's lock, which a sibling's commit holds across its
        round trips to PostgreSQL): the step's effect ran, so it is recorded and the cancel then
        goes on, rather than the step run again on resume. Not when the lease was lost: nothing
        can be recorded then, and another process may be running the call."""
        if self.over:
            # A branch's step that returned after its drive stopped: the lease is given back, and
            # a record would reopen a store closed behind it (or write beside another process).
            raise UsageError(
                f"ctx.step({data['name']!r}) of call {self.call_id} returned after its drive "
                "stopped (the runtime closed, or the turn was cancelled): nothing is recorded, "
                "and the resumed body runs it again"
            )
        self._on_way(1)
        try:
            await to_end(self._journaled(held_key, data), self.lost)
        finally:
            self._on_way(-1)

    def _on_way(self, change: int) -> None:
        with self._counts:
            self.recording += change
            if self.recording:
                self.recorded.clear()
            else:
                self.recorded.set()

    def lost(self) -> bool:
        """Whether the drive's lease was lost (another process may run the call now)."""
        lease = self.driver.held
        return lease is not None and lease.lost

    async def _journaled(self, held_key: str, data: dict[str, Any]) -> None:
        """Record a step that ran. If the store fails to take it (a full disk), keep it, as a
        call's outcome is kept: the next drive here records it instead of running it again."""
        try:
            await self._record([("tool.step", data)])
        except StoreError as exc:
            what = f"step {data['name']!r} of {data['tool_name']} call {data['call_id']}"
            fenced = record_fenced(exc)
            self.driver.unrecorded.keep(
                self.driver.state.id, held_key, [("tool.step", data)], what, fenced=fenced
            )
            raise

    def bound_question(self, question: str, options: list[Option]) -> None:
        """Refuse a question of more than `MAX_OPTIONS` options, or whose text and options are
        over the tool's `max_result_bytes` as JSON (they are its output, shown to everyone
        who lists pending requests): `TooLarge`, the tool's to catch, and nothing asked."""
        name = self._call().tool_name
        if len(options) > MAX_OPTIONS:
            raise TooLarge(
                f"the question has {len(options)} options, over the limit of {MAX_OPTIONS}; "
                "offer fewer (or let the person type their answer)"
            )
        asked = {"question": question, "options": [o.model_dump() for o in options]}
        tail = f"(max_result_bytes of {name}); ask less"
        too_large = over_limit("the question and its options are", asked, self._limit(), tail=tail)
        if too_large is not None:
            raise TooLarge(too_large)

    def _limit(self) -> int:
        tool = self.driver.agent.tools.get(self._call().tool_name)
        return result_bound(tool, self.driver.agent.limits)

    def _echoes(self) -> bool:
        tool = self.driver.agent.tools.get(self._call().tool_name)
        return tool is not None and echoes_answers(tool)

    def shown_input(self) -> Any:
        """The call's input as its questions show it (`asked_input`): its JSON form as the body
        got it, secrets masked, as an approval shows it; never as the model gave it."""
        if self._shown_input is None:
            self._shown_input = (self._shown(),)
        return self._shown_input[0]

    def _busy(self, change: int) -> None:
        with self._counts:
            self.inflight += change
            if self.inflight:
                self.quiet.clear()
            else:
                self.quiet.set()

    async def open_question(
        self, index: int, question: str, options: list[Option], allow_text: bool
    ) -> str:
        self._body_running("ctx.ask()", "nothing was asked")
        self.refused()  # a question asked as the drive fails would park the call unseen
        self._busy(1)
        try:
            call = self._call()
            keyed = self.keyed  # as when `index` was claimed: empty only ever turns keyed
            s = self.driver.state
            turn = s.turn
            assert turn is not None
            request = InputRequest(
                kind="question",
                id=new_id("req"),
                session_id=s.id,
                turn_id=turn.id,
                agent=s.agent,
                action=Action.of(call.id, call.tool_name, self.shown_input()),
                question=question,
                options=options,
                allow_text=allow_text,
                source="ask",
                index=index,
                requested_by=turn.principal,
                created_at=self.driver.clock(),
                usage=s.usage + s.delegated,  # what the run spent, its subagents too
                max_result_bytes=recorded_bound(self._limit()),
                echoes_answer=recorded_bound(self._limit()) is not None and self._echoes(),
            )

            def specs(state: SessionState) -> list[EventSpec]:
                # Steered while the body ran: its question is withdrawn before it is asked,
                # so the call settles and the model reads the message. A branch still asking
                # after the body ended (its gather failed) asks nothing either.
                if self.closed.is_set() or (state.turn is not None and state.turn.steered):
                    raise QuestionWithdrawn(request.id, "cancelled")
                data: dict[str, Any] = {"requests": [dump_request(request)]}
                if keyed:
                    data["keyed"] = True
                return [("input.requested", data)]

            await self._record(specs, new_requests=[request])
            return request.id
        finally:
            self._busy(-1)

    @property
    def host(self) -> Any:
        """The runtime's subagent host (None when the driver runs without a runtime)."""
        return self.driver.host

    @property
    def session_id(self) -> str:
        return self.driver.state.id

    def steered(self) -> bool:
        """A steering message arrived that the model has not read yet."""
        turn = self.driver.state.turn
        return turn is not None and turn.steered

    async def mirror(self, child: str, child_agent: str, requests: Sequence[InputRequest]) -> int:
        """Ask a subagent's open requests again on this session (`source="child"`), each under
        its own id with a `ChildRef` back to the child; returns how many it asked."""
        call = self._call()
        s = self.driver.state
        turn = s.turn
        assert turn is not None
        mirrored = {
            (r.request.child.session_id, r.request.child.request_id)
            for r in s.requests.values()
            if r.status == "pending" and r.request.child is not None
        }
        copies = [
            r.model_copy(
                update={
                    "id": new_id("req"),
                    "session_id": s.id,
                    "turn_id": turn.id,
                    "agent": s.agent,
                    "source": "child",
                    "expires_at": None,  # the child's own deadline decides
                    # A nested mirror points at the next session down: answers route hop by hop.
                    "child": ChildRef(
                        session_id=child, request_id=r.id, agent=child_agent, call_id=call.id
                    ),
                }
            )
            for r in requests
            if (child, r.id) not in mirrored
        ]
        if not copies:
            return 0

        def specs(state: SessionState) -> Batch:
            if state.turn is not None and state.turn.steered:
                return Batch(specs=[])  # steered meanwhile: the delegate stops its child instead
            asked = {"requests": [dump_request(c) for c in copies]}
            return Batch(specs=[("input.requested", asked)], new_requests=copies)

        recorded = await self._record(specs)
        return len(copies) if recorded else 0

    async def park(self) -> NoReturn:
        """Wait until the engine stops the body to park the call. Woken as the body is stopped,
        ahead of the cancel (a `TaskGroup`'s branch wakes before its body's cancel reaches it),
        it is cancelled like the body, its question still open; woken as the body ended (a
        gather's sibling failed), its question was withdrawn with the call's end. Stopped, it
        yields first: the group's own cancel then reaches it here, once, as asyncio's would, so
        its cleanup runs whole; a branch no one cancels ends after the yields all the same."""
        self.parked.set()
        await self.closed.wait()
        if self.stopped:
            for _ in range(_CANCEL_YIELDS):
                await asyncio.sleep(0)
            raise asyncio.CancelledError
        raise QuestionWithdrawn("", "cancelled")

    def ending(
        self,
        specs: Sequence[EventSpec],
        new_requests: Sequence[InputRequest] = (),
        steered: Sequence[EventSpec] | None = None,
    ) -> Callable[[SessionState], Batch]:
        """`specs` that end the call, first withdrawing any question its body left open: a
        gather branch that asked as its sibling failed leaves one nobody waits for. `steered`
        ends it instead when a message steered the turn meanwhile (an approval it asked for is
        then never opened)."""
        self.closed.set()

        def batch(state: SessionState) -> Batch:
            if steered is not None and state.turn is not None and state.turn.steered:
                return self.ending(steered)(state)
            reason = "the tool call ended before the question was answered"
            left = [
                r
                for r in state.pending_requests()
                if r.source == "ask" and r.action is not None and r.action.call_id == self.call_id
            ]
            withdrawn: list[EventSpec] = [
                (
                    "input.resolved",
                    {
                        "request_id": r.id,
                        "outcome": "cancelled",
                        "status": "withdrawn",
                        "reason": reason,
                    },
                )
                for r in left
            ]
            resolves = [
                Resolve(
                    request_id=r.id,
                    status="withdrawn",
                    outcome="cancelled",
                    resolution={"outcome": "cancelled", "reason": reason},
                )
                for r in left
            ]
            return Batch(specs=[*withdrawn, *specs], resolve=resolves, new_requests=new_requests)

        return batch

    async def settle(self) -> None:
        """Let sibling branches of the body (asyncio.gather) reach their own asks, and steps
        under way finish and be journaled."""
        idle = 0
        while idle < 5:
            if self.inflight:
                await self.quiet.wait()
                idle = 0
                continue
            await asyncio.sleep(0)
            idle += 1
