"""The tool calls of a turn, as the engine moves them: a proposed call is decided by its tool's
policy and the agent's guardrails, a decided call runs (with its journal) or its outcome is
recorded. Apart from `_engine` so the `Driver` there keeps to its loop and its recording."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

from ._approval import ApprovalContext, SessionAuth, SessionInfo, Verdict
from ._bound_input import as_approved, as_started, binds, left_out
from ._call_ends import IGNORED, CallEnds, asked_input, form_before, signal_in
from ._exceptions import ChildHeld, LeaseLost, TooLarge
from ._journal import UNRECORDED_KEPT, CallJournal
from ._output_caps import spare
from ._recording import (
    Batch,
    EventSpec,
    TurnStopped,
    denial,
    dump_request,
    invalid_input,
    new_id,
    tool_result,
    waiting_after,
    with_usage,
)
from ._state import CallState, SessionState
from ._state_parts import call_key
from ._sync import outwaited, thread_unwound, to_end
from ._text import cut
from ._tool_context import ToolContext
from ._tool_json import over_limit, own_input
from ._tool_signals import ApprovalRequired, QuestionWithdrawn
from ._tools import Tool, Unshown
from ._tracing import ToolSpan
from ._types import APPROVAL_OPTIONS, Action, InputRequest, Principal, Usage, usage_fields
from ._verdicts import still_allowed, strictest

__all__ = ["UNRECORDED_KEPT", "ToolCalls"]


class ToolCalls(CallEnds):
    """Deciding and running a turn's tool calls: a part of `Driver`, mixed into it."""

    # -- approvals ----------------------------------------------------------------------------

    def session_info(self, principal: Principal | None = None) -> SessionInfo:
        s = self.state
        turn = s.turn
        assert turn is not None
        return SessionInfo(
            id=s.id,
            agent=s.agent,
            turn=turn.id,
            parent=s.parent,
            auth=SessionAuth(current=principal or turn.principal, initiator=s.initiator),
        )

    async def evaluate(self, calls: list[CallState]) -> int:
        """Decide each proposed call: open requests, record denials, run what may run.

        An approval is not requested while a workflow call of the same response is unfinished
        (the approved call could not run before it anyway): those calls stay proposed.
        Returns how many calls it moved forward.
        """
        s = self.state
        turn = s.turn
        assert turn is not None
        pending_tools = {r.tool_name for r in s.pending_requests() if r.tool_name}
        results: list[EventSpec] = []
        decided: list[tuple[CallState, Tool, BaseModel, Verdict]] = []
        left = await self.budget_left()  # what auto() reviews may spend, less each one's cost
        for call in calls:
            tool = self.agent.tools.get(call.tool_name)
            if tool is None:
                results.append(tool_result(call, "error", self.unknown_tool(call.tool_name)))
                continue
            try:
                validated = tool.validate(call.input)
            except ValidationError as exc:
                results.append(tool_result(call, "error", invalid_input(exc)))
                continue
            ctx = ApprovalContext(
                session=self.session_info(),
                tool_name=tool.name,
                tool_input=validated,
                approved_tools=frozenset(s.approved_tools),
                call_id=call.id,
                abort_signal=self.abort_signal,
                pending_tools=frozenset(pending_tools),
                budget_left=left,
            )
            held = self.deferred.pop(f"{s.model_responses}:{call.id}", None)
            if held is None and call.held is not None:  # held back by a drive gone since
                held = _unheld(call.held)
            verdict = held if held is not None else await self.verdict(tool, ctx, call.input)
            if verdict.usage is not None:
                left = spare(left, verdict.usage)
            if verdict.action == "ask":
                pending_tools.add(tool.name)
            decided.append((call, tool, validated, verdict))
        workflow_busy = any(
            (t := self.agent.tools.get(c.tool_name)) is not None
            and t.workflow
            and c.status in ("running", "asking", "approved")
            for c in turn.calls.values()
        ) or any(t.workflow and v.action == "run" for _, t, _, v in decided)
        requests: list[InputRequest] = []
        to_run: list[tuple[CallState, Tool, BaseModel, Verdict]] = []
        held_back: list[tuple[str, Verdict]] = []
        # The held-back verdicts the log does not have yet: recorded with the first event
        # recorded here (or the first call started), so a drive after this one (the workflow
        # call parked on a question) asks for them as decided, not reviewing them again.
        unrecorded: dict[str, dict[str, Any]] = {}
        # A request's usage is the run's at park time (its subagents' spend too): with what the
        # reviews that the batch opening it records cost (those of every call not run here).
        spent = Verdict.spent(v for _, _, _, v in decided if v.action != "run")
        run = s.usage + s.delegated
        at_park = run if spent is None else run + spent
        for call, tool, validated, verdict in decided:
            # The outcome of a call that does not run carries what reviewing it cost.
            billed = {"usage": verdict.usage}
            if verdict.action == "deny":
                by_policy = {"denied": True, "reason": verdict.reason, "by": "policy"}
                # The policy's reason is cut as a reviewer's is: the model reads it every call.
                results.append(tool_result(call, "denied", self._cut(call, by_policy), **billed))
            elif verdict.action == "ask":
                if workflow_busy and not tool.workflow:
                    held_back.append((f"{s.model_responses}:{call.id}", verdict))
                    if call.held is None:
                        unrecorded[call.id] = _held(verdict, self.max_result_bytes(tool) // 4)
                    continue
                if turn.steered:
                    # A steering message came while this approval waited to be asked: it is
                    # ignored like one already asked, and the model reads the message.
                    results.append(tool_result(call, "denied", denial(IGNORED), **billed))
                    continue
                try:
                    requests.append(self._approval_request(call, tool, validated, verdict, at_park))
                except PydanticSerializationError as exc:
                    # A validator made the input an object with no JSON form: there is nothing
                    # to show a reviewer, so the call cannot be approved.
                    shown = {
                        "error": f"the input of {tool.name} has no JSON form to show a "
                        f"reviewer, so it cannot be approved: {exc}"
                    }
                    results.append(tool_result(call, "error", shown, **billed))
                except (Unshown, ValidationError) as exc:
                    # Its form would not show what the tool gets: approving it would run unseen
                    # input (or a lazy one, validated again for the form, is not valid now).
                    shown = {
                        "error": f"the input of {tool.name} cannot be shown to a reviewer as "
                        f"the tool would get it, so it cannot be approved: {exc}"
                    }
                    results.append(tool_result(call, "error", shown, **billed))
            else:
                to_run.append((call, tool, validated, verdict))
        specs: list[EventSpec] = []
        if requests:
            asked: dict[str, Any] = {"requests": [dump_request(r) for r in requests]}
            ids = {r.call_id for r in requests}
            reviewed = Verdict.spent(v for c, _, _, v in decided if c.id in ids)
            if reviewed is not None:  # what auto() reviews cost: the session's usage counts it
                asked.update(usage_fields(reviewed))
            specs.append(("input.requested", asked))
        specs.extend(results)
        # The reviews of held-back calls are billed with the first event recorded here (or the
        # first call started), once: their kept verdicts are asked again without usage.
        unbilled = Verdict.spent(v for _, v in held_back)
        if unbilled is not None and specs:
            specs = with_usage(specs, unbilled)
            unbilled = None
        if unrecorded and specs:
            (kind, data), *rest = specs
            specs, unrecorded = [(kind, {**data, "held": unrecorded}), *rest], {}
        for key, verdict in held_back:
            keep = unbilled is not None and not to_run
            self.deferred[key] = verdict if keep else dataclasses.replace(verdict, usage=None)
        if specs and requests and not to_run:

            def parked(state: SessionState) -> Batch:
                return Batch(specs=specs + waiting_after(state, specs), new_requests=requests)

            await self.record(parked, billed=specs)
        elif specs:
            await self.record(specs, new_requests=requests)
        for call, tool, validated, verdict in to_run:
            current = self.state.turn.calls.get(call.id) if self.state.turn else None
            if current is None or current.status != "proposed":
                continue
            note = None
            # Why the policy let it run, in the trail (`tool.started`) whatever the call's end.
            ran_because: dict[str, Any] = {}
            if verdict.reason and verdict.auto is None:  # Approved(reason): the model hears why
                note = self._cut(call, {"approved": True, "by": "policy", "reason": verdict.reason})
                ran_because["policy_reason"] = note["reason"]
            elif verdict.auto is not None:  # an auto() review cleared it
                review = self._cut(call, {"reason": verdict.auto[1]})  # a reply of megabytes
                ran_because.update(auto_verdict=verdict.auto[0], auto_reason=review["reason"])
            filled = left_out(tool, call.input, validated)
            if filled is not None:  # a default_factory's id: a re-run of the body gets it again
                ran_because["filled"] = filled
            principal = self.state.turn.principal  # type: ignore[union-attr]
            paid, unbilled = _plus(unbilled, verdict.usage), None
            if unrecorded:
                ran_because["held"], unrecorded = unrecorded, {}
            ran = (current, tool, call.input, validated, principal)  # as the model proposed it
            await self.run_tool(*ran, approval=note, usage=paid, decided=ran_because)
        if unbilled is not None and to_run:  # no call started after all: asked with it later
            self.deferred.update(held_back)
        return len(requests) + len(results) + len(to_run)

    def _approval_request(
        self, call: CallState, tool: Tool, validated: BaseModel, verdict: Verdict, usage: Usage
    ) -> InputRequest:
        s = self.state
        turn = s.turn
        assert turn is not None
        dumped = tool.shown_form(own_input(tool, call.input, validated))  # the body's is untouched
        rules = tool.approval.rules
        guarded = verdict.reason == "guardrail"
        if guarded:
            rules = rules.guarded()
        now = self.clock()
        error = verdict.error  # a policy's message of megabytes is cut
        if error is not None:
            error = cut(error, self.max_result_bytes(tool) // 4)
        return InputRequest(
            kind="tool-approval",
            id=new_id("req"),
            session_id=s.id,
            turn_id=turn.id,
            agent=s.agent,
            action=Action.of(call.id, tool.name, dumped),
            options=list(APPROVAL_OPTIONS),
            source="guardrail" if guarded else "policy",
            requested_by=turn.principal,
            created_at=now,
            expires_at=None if rules.expires_in is None else now + rules.expires_in,
            policy_error=error,
            usage=usage,
            approvers=rules.approvers,
            distinct=rules.distinct,
            exclude_requester=rules.exclude_requester,
            on_timeout=rules.on_timeout,
            escalate_to=rules.escalate_to,
            auto_verdict=None if verdict.auto is None else verdict.auto[0],
            auto_reason=None if verdict.auto is None else verdict.auto[1],
            response_policy=tool.response_policy is not None,
        )

    async def verdict(self, tool: Tool, ctx: ApprovalContext, raw: Any) -> Verdict:
        """The strictest of the tool's policy and the agent's guardrails: deny > ask > run (of
        the call's `raw` input, `ctx.tool_input` validated)."""
        with self.tracing.reviews(self.state):  # an auto() review is a model call traced
            return await strictest(tool, ctx, self.agent.guardrails, raw)

    # -- tools --------------------------------------------------------------------------------

    async def execute(self, call: CallState) -> None:
        """Move one decided call forward: run it, or record its denial or decision."""
        s = self.state
        turn = s.turn
        assert turn is not None
        if call.status == "denied":
            decision = call.decision or {}
            if decision.get("outcome") == "expired":
                timed_out = {
                    "timed_out": True,
                    "ran": False,
                    "reason": "no one decided before the approval deadline",
                }
                await self.record([tool_result(call, "expired", timed_out)])
                return
            await self.record([tool_result(call, "denied", denial(self._cut(call, decision)))])
            return
        if call.status == "decided":
            decided = self._cut(call, call.decision or {"approved": False})
            by = decided.get("by")
            if isinstance(by, dict) and "attributes" in by:
                # Who decided, without the attributes they signed in with (as `ctx.ask` gives
                # its responder): those are the identity provider's, not the model's to read.
                decided = {**decided, "by": {k: v for k, v in by.items() if k != "attributes"}}
            await self.record([tool_result(call, "decided", decided)])
            return
        tool = self.agent.tools.get(call.tool_name)
        gone = self.gone(call, tool)  # from the agent (a new deploy) while the call waited
        if tool is None or gone is not None:
            await self.end_unrun(call, gone or self.unknown_tool(call.tool_name))
            return
        principal = turn.principal
        # The model's own input, validated again as when it was proposed (validating the form
        # the reviewer saw would mask secrets or run a value-changing validator twice), or an
        # edit; either way it must still be the input the approval is bound to. An ungated call
        # run before gets what validation filled in then (a default_factory's id), not anew.
        # `raw` is what the body's input is validated from: a lazy input's other readers (the
        # guardrails asked again, the trace, a question's form) validate it too.
        raw = call.input
        bound: Action | None = None
        validated: BaseModel | None = None
        if call.request_id is None and call.filled is not None:
            started = as_started(tool, raw, call.filled)
            if started is not None:
                raw, validated = started
        elif call.request_id is not None:
            req = s.requests[call.request_id].request
            if call.edited_input is not None:
                raw = call.edited_input
                bound = Action.of(call.id, call.tool_name, call.edited_input)
            else:
                bound = req.action
            by = (call.decision or {}).get("by")
            if tool.run_as == "approver" and by is not None:
                principal = Principal.model_validate(by)
        try:
            validated = tool.validate(raw) if validated is None else validated
        except ValidationError as exc:
            await self.end_unrun(call, invalid_input(exc))
            return
        unbound = bound is not None and not binds(bound, tool, raw, validated)
        if bound is not None and unbound and call.edited_input is None:
            approved = as_approved(bound, tool, raw)  # checked to be the input approved
            if approved is not None:
                (raw, validated), unbound = approved, False
        if unbound:
            unapproved = {
                "error": f"the input of {call.tool_name} validates now to other input than was "
                "approved (its parameters changed since, or a validator is not deterministic); "
                "the call was not run"
            }
            await self.end_unrun(call, unapproved)
            return
        checked = None
        if call.status == "approved" and self.agent.guardrails:
            # A guardrail deployed since the approval may deny the call: asked again before its
            # body first starts, their decision recorded with that start or as the denial.
            checked = await self._still_allowed(call, tool, raw, validated)
            if checked.action == "deny":
                by_policy = {"denied": True, "reason": checked.reason, "by": "policy"}
                shown = self._cut(call, by_policy)  # as a denial at proposal reads
                await self.record([tool_result(call, "denied", shown, usage=checked.usage)])
                return
        note = None
        # A person's reason, or a policy's `so.Approved` one (its `tool.started` records it when
        # the body first runs, and the fold makes it the call's decision): a re-run tells it too.
        decision = self._cut(call, call.decision or {})
        if decision.get("approved") and decision.get("reason"):
            by = decision.get("by")
            who = by.get("principal_id") if isinstance(by, dict) else by
            note = {"approved": True, "by": who, "reason": decision["reason"]}
        usage = None if checked is None else checked.usage
        await self.run_tool(call, tool, raw, validated, principal, approval=note, usage=usage)

    async def _still_allowed(
        self, call: CallState, tool: Tool, raw: Any, validated: BaseModel
    ) -> Verdict:
        """What the agent's guardrails make now of approved `call` (`still_allowed`): only they
        are asked again, not the tool's policy, whose question the approval answered."""
        s = self.state
        ctx = ApprovalContext(
            session=self.session_info(),
            tool_name=tool.name,
            tool_input=validated,
            approved_tools=frozenset(s.approved_tools),
            call_id=call.id,
            abort_signal=self.abort_signal,
            pending_tools=frozenset(r.tool_name for r in s.pending_requests() if r.tool_name),
            budget_left=await self.budget_left(),
            edited=call.edited_input is not None,
            approved=True,
        )
        asked = s.requests.get(call.request_id) if call.request_id is not None else None
        by_deadline = asked is not None and asked.outcome == "expired"
        with self.tracing.reviews(s):  # a review a guardrail makes is a model call traced
            return await still_allowed(
                tool, ctx, self.agent.guardrails, raw, by_deadline=by_deadline
            )

    async def run_tool(
        self,
        call: CallState,
        tool: Tool,
        raw: Any,
        validated: BaseModel,
        principal: Principal | None,
        *,
        approval: dict[str, Any] | None = None,
        usage: Usage | None = None,
        decided: dict[str, Any] | None = None,
    ) -> None:
        """Run `call`'s body on `validated`, its input validated from `raw` (which a lazy input's
        other readers, its trace and a question's form, validate anew)."""
        s = self.state
        # Models may reuse call ids across responses: the response number keeps keys unique. A
        # call started before keeps the key it was recorded with (an older signoff's form).
        key = call.idempotency_key or call_key(s.id, s.model_responses, call.id)
        if call.status != "running":
            await self.record(
                [
                    (
                        "tool.started",
                        {
                            "call_id": call.id,
                            "tool_name": call.tool_name,
                            "idempotency_key": key,
                            "principal": None if principal is None else principal.model_dump(),
                            **({} if usage is None else usage_fields(usage)),
                            # why a policy let it run without a person; what was `filled`
                            **(decided or {}),
                        },
                    )
                ]
            )
        got = form_before(tool, validated)  # what a request the body asks for shows
        journal = CallJournal(self, call.id, principal, lambda: asked_input(tool, got, raw))
        held = self.unrecorded.pop(key)
        if held is not None:  # the body ran in this process; only recording its outcome failed
            await self.end_call(key, journal, held)
            return
        await journal.read()  # the body reads it as it goes
        ctx = ToolContext(
            session=self.session_info(principal),
            call_id=call.id,
            tool_name=call.tool_name,
            idempotency_key=key,
            abort_signal=self.abort_signal,
            journal=journal,
        )
        # A lazy input is traced by a form of its own: the body's would have its iterators used up.
        traced = asked_input(tool, None, raw) if tool.holds_lazy(validated) else validated
        with self.tracing.tool(s, call.id, call.tool_name, traced) as span:
            if self.lease_check is not None:
                await self.lease_check()  # a drive that stalled past its lease runs no body
            task, stopped = await self._run_body(tool, ctx, validated, journal)
            too_large = _traced(span, task, self.max_result_bytes(tool))
        if task is None:
            journal.refused()  # a branch's record refused, which the body caught
            return  # parked on ctx.ask(): the call is "asking" now
        await self.body_ended(
            call, task, too_large, journal, tool, raw, validated, got, key, approval
        )
        if stopped:  # a plain body ran on to its end while its drive was cancelled
            raise asyncio.CancelledError

    async def _run_body(
        self, tool: Tool, ctx: ToolContext, validated: BaseModel, journal: CallJournal
    ) -> tuple[asyncio.Future[Any] | None, bool]:
        """Run the tool's body as the lease's `body`: its finished task, or None if it parked
        on `ctx.ask()` (the body is stopped then; it replays its journal once answered); and
        whether this drive was cancelled while a plain body ran on in its thread to an outcome,
        which is to be recorded before the cancel goes on (else a resume ran it again)."""
        task = asyncio.ensure_future(_replayed_whole(tool, ctx, validated))
        parked = asyncio.ensure_future(journal.parked.wait())
        lease = self.held
        if lease is not None:
            lease.body = task  # cancelled if the lease is lost while it runs
        try:
            await asyncio.wait({task, parked}, return_when=asyncio.FIRST_COMPLETED)
            if lease is not None and lease.lost:
                # Another process may be running this call now: this body's result (if it
                # ended anyway, or runs on in a thread) is discarded, and nothing is recorded.
                raise LeaseLost(
                    f"the lease on session {ctx.session.id!r} was lost while {ctx.call_id} ran"
                )
            if not task.done():
                await journal.settle()
                if lease is not None and lease.lost:  # meanwhile: as above
                    raise LeaseLost(
                        f"the lease on session {ctx.session.id!r} was lost while {ctx.call_id} ran"
                    )
            if not task.done():
                # Closed first: the body unwinding (a `finally`, an `except CancelledError`)
                # steps and asks no more, nor does a branch it left running. Nothing it did
                # now would be replayed as the first run did it: the resumed body runs that.
                journal.stop()
                # A plain body's thread, which no cancel stops, ends with its park first (an
                # ask on a loop of its own, `asyncio.run` in the thread, raises the cancel).
                cancelled = not tool.is_async and await thread_unwound(task)
                task.cancel()
                cancelled = await outwaited(task) or cancelled
                if not task.cancelled():
                    # What it raised as it unwound (a `finally`'s refused step) is no outcome:
                    # retrieved, so asyncio does not log it as never retrieved.
                    task.exception()
                if cancelled:
                    raise asyncio.CancelledError  # the drive was stopped as the body unwound
                await journal.quiet.wait()
                return None, False
            # Ended meanwhile: a sibling's step under way, waited for, failed and the gather
            # with it. Its outcome is recorded (withdrawing the question), not discarded.
        except BaseException as exc:
            # This drive is cancelled: the body stops with it rather than run on unseen and
            # journal after the lease is given back (a resume runs the call again). A plain one
            # cannot stop: its thread runs to an outcome, recorded while the lease is held.
            plain = not tool.is_async and not journal.stopped  # not stopped as it parked
            if isinstance(exc, asyncio.CancelledError) and plain:
                # Unless it parks meanwhile (on a loop of its own): it waits then for the stop.
                await outwaited(task, journal.parked)
                if task.done() and not task.cancelled() and not (lease is not None and lease.lost):
                    return task, True
            # Closed first, as when it parks: neither its unwinding nor a branch it left
            # running steps or asks now: a resume runs them. A step whose function ended, or a
            # plain step's thread, is journaled before the drive gives its lease back (a
            # `gather` whose other branch was cancelled ends the body while that record is on
            # its way); an async function still running (a task the body left) is not waited
            # for: it runs again on resume.
            journal.stop()
            if not tool.is_async and journal.parked.is_set():
                await thread_unwound(task)  # its park wakes; the drive's stop goes on after
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            try:
                if not (lease is not None and lease.lost):
                    await to_end(journal.recorded.wait(), journal.lost)
            finally:
                journal.over = True  # a branch's step returning later records nothing
            raise
        finally:
            parked.cancel()
            if lease is not None:
                lease.body = None
        return task, False


async def _replayed_whole(tool: Tool, ctx: ToolContext, validated: BaseModel) -> Any:
    """The body's result, once it has replayed every entry it recorded (`ReplayError` if it
    returned without reaching one)."""
    result = await tool.invoke(ctx, validated)
    ctx._reached_all()
    return result


def _traced(span: ToolSpan, task: asyncio.Future[Any] | None, bound: int) -> str | None:
    """Tell `span` how the body ended: a tool's error fails it, as a result over `bound` does
    (returned: why it is not stored; never put on the span); a question or approval it parks
    on, a question withdrawn, its turn stopped under it, or a subagent driven elsewhere, is an
    outcome."""
    if task is None:
        span.outcome("asking")
        return None
    if task.cancelled():
        span.fail(asyncio.CancelledError("the tool body was cancelled"))
        return None
    raised = task.exception()
    exc = None if raised is None else signal_in(raised)
    too_large = None if exc is not None else over_limit("the result is", task.result(), bound)
    if too_large is not None:
        span.fail(TooLarge(too_large))  # as the log records the call: the model reads this
    elif exc is None:
        span.outcome("ok", task.result())
    elif isinstance(exc, ApprovalRequired):
        span.outcome("approval_required")
    elif isinstance(exc, QuestionWithdrawn):
        span.outcome("withdrawn")
    elif isinstance(exc, TurnStopped):  # its turn was cancelled or replaced: not the tool's
        span.outcome("stopped")
    elif isinstance(exc, ChildHeld):  # a delegate call's subagent is driven elsewhere
        span.outcome("held")
    else:
        span.fail(exc)
    return too_large


def _held(verdict: Verdict, bound: int) -> dict[str, Any]:
    """An `ask` verdict held back behind a workflow call, as the log records it: its texts cut
    to `bound` characters, as its request would cut a policy's error of megabytes."""
    return {
        "reason": None if verdict.reason is None else cut(verdict.reason, bound),
        "error": None if verdict.error is None else cut(verdict.error, bound),
        "auto": None if verdict.auto is None else [verdict.auto[0], cut(verdict.auto[1], bound)],
    }


def _unheld(held: dict[str, Any]) -> Verdict:
    """The verdict `_held` recorded (its review paid when it was made)."""
    auto = held.get("auto")
    return Verdict(
        "ask",
        held.get("reason"),
        held.get("error"),
        auto=None if auto is None else (str(auto[0]), str(auto[1])),
    )


def _plus(a: Usage | None, b: Usage | None) -> Usage | None:
    return b if a is None else a if b is None else a + b
