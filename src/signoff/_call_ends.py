"""How a tool call's body ended, recorded: its result, its error, the approval it asked for, or
nothing when the store refused a record of the body's; an outcome the store refuses is kept to
be recorded by the next drive here. A part of `Driver` (through `ToolCalls`), apart from
`_tool_calls` so that one keeps to deciding and running calls."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, TypeAlias

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

from ._child_sessions import with_spend
from ._error_text import error_message, error_text, readable
from ._exceptions import StoreError, UnknownAgent, UnknownSession, UsageError, record_fenced
from ._journal import CallJournal
from ._recording import (
    DriverPart,
    EventSpec,
    TurnStopped,
    denial,
    dump_request,
    new_id,
    own_cancel,
    tool_result,
)
from ._state import CallState
from ._subagents import STEERED, is_delegate
from ._sync import to_end
from ._text import cut
from ._tool_json import jsonable, over_limit, recorded_bound, result_bound
from ._tool_signals import ApprovalRequired, InputUnavailable, QuestionWithdrawn
from ._tools import Tool, Unshown
from ._trace_content import MASK
from ._types import APPROVAL_OPTIONS, Action, InputRequest, same_json

__all__ = ["IGNORED", "CallEnds", "Got", "asked_input", "form_before", "signal_in"]

Got: TypeAlias = "dict[str, Any] | PydanticSerializationError | None"
"""A call's validated input as JSON (`Tool.approved_form`) before its body ran, or why it has
no JSON form; None when none was taken (`Tool.holds_lazy`: taking it would use up an
iterator)."""

log = logging.getLogger("signoff.runtime")

IGNORED = {"reason": "the user sent a new message instead", "outcome": "ignored"}
"""The decision on an approval a message steered past before it was asked."""

UNRUN = "the parent's delegate call ended without its tool running"
"""The reason a delegated turn's `turn.cancelled` records when its call ended unrun."""


def signal_in(exc: BaseException) -> BaseException:
    """`exc`, or the signal an `asyncio.TaskGroup` wrapped in an exception group when every
    exception in it is that one kind of signal (a branch's `ctx.request_approval`, a question
    withdrawn): the group was taken for the tool's error, so nobody was asked. Approvals two
    branches asked for are a `UsageError`: the first alone was asked, the others dropped."""
    if not isinstance(exc, BaseExceptionGroup):
        return exc
    leaves: list[BaseException] = []

    def gather(group: BaseExceptionGroup[BaseException]) -> None:
        for inner in group.exceptions:
            if isinstance(inner, BaseExceptionGroup):
                gather(inner)
            else:
                leaves.append(inner)

    gather(exc)
    for kind in (TurnStopped, ApprovalRequired, QuestionWithdrawn, InputUnavailable):
        if leaves and all(isinstance(leaf, kind) for leaf in leaves):
            if kind is ApprovalRequired and len(leaves) > 1:
                return _approvals_at_once(leaves)
            return leaves[0]
    return exc


def _approvals_at_once(signals: list[BaseException]) -> UsageError:
    """The error of a body whose parallel branches each asked for approval: a call's approval
    is one decision, which becomes its result, so a reviewer deciding on one payload would
    seem to decide on all (an approved wire read as an approved deletion too)."""
    payloads = ", ".join(
        cut(readable(getattr(signal, "payload", None), "payload"), 200) for signal in signals
    )
    return UsageError(
        f"the tool asked for {len(signals)} approvals at once, from parallel branches (an "
        "asyncio.TaskGroup): a call asks for one approval, whose decision is its result, so "
        f"none was asked; ask once, with one payload naming every action (payloads: {payloads})"
    )


def form_before(tool: Tool, validated: BaseModel) -> Got:
    """The JSON form of `validated` taken before the body gets it: a body that changes its input
    in place (clears a list it was given) and then asks for approval would show the reviewer,
    and bind the approval to, input the model never sent. Only the form, as cheap as a dump: the
    checks of what a reviewer is shown run only if the body asks (`_shown_as_got`)."""
    if tool.holds_lazy(validated):
        return None
    try:
        return tool.approved_form(validated)
    except PydanticSerializationError as exc:
        return exc


def _shown_as_got(tool: Tool, validated: BaseModel, got: Got, raw: Any) -> dict[str, Any]:
    """What a reviewer is shown of the input a body asking for approval got: `got`, checked as
    `Tool.shown_form` checks a form, and raising as it does. The input as the body holds it now
    is checked too, as a form that shows otherwise than a value (a serializer's mask) is one
    whatever the value; where the body changed it, `got` validated again must show as itself.
    A lazy input (`got` None) is shown validated anew from `raw`: the body used up its own."""
    if got is None:
        try:
            return tool.shown_form(tool.validate(raw))
        except ValidationError as exc:
            raise Unshown(f"validated again, the input is not valid now: {exc}") from None
    if isinstance(got, PydanticSerializationError):
        raise got
    if same_json(tool.shown_form(validated), got):
        return got
    try:
        again = tool.validate(got)
        same = same_json(tool.shown_form(again), got)
    except (ValidationError, Unshown):
        same = False
    if not same:
        raise Unshown(
            "the tool changed its input in place before asking for approval, and the input it "
            "got does not show as itself validated again: copy an argument before changing it"
        )
    return got


def asked_input(tool: Tool, got: Got, raw: Any) -> Any:
    """The call's input as a question its body asks (`ctx.ask`) shows it: its JSON form as the
    body got it (`got`, as an approval shows it: secrets masked, by alias), never the model's
    raw arguments; `MASK` whole where it has none. A lazy input (`got` None) is validated again
    from `raw`, the input the body got: its form would use up the iterator the body reads."""
    try:
        if got is None:
            return tool.approved_form(tool.validate(raw))
    except (PydanticSerializationError, ValidationError):
        return MASK
    return MASK if isinstance(got, PydanticSerializationError) else got


class CallEnds(DriverPart):
    """Recording how a call's body ended: a part of `Driver`, mixed into it with `ToolCalls`."""

    async def body_ended(
        self,
        call: CallState,
        task: asyncio.Future[Any],
        too_large: str | None,
        journal: CallJournal,
        tool: Tool,
        raw: Any,
        validated: BaseModel,
        got: Got,
        key: str,
        approval: dict[str, Any] | None,
    ) -> None:
        """Record how the body of `call` ended: its result, its error, or what it asked for;
        none of them if the store refused a record of the body's, whatever it made of that.
        `validated` is the body's input, validated from `raw`."""
        try:
            result = task.result()
        except (Exception, asyncio.CancelledError) as raised:
            if not isinstance(raised, Exception) and not own_cancel(raised):
                raise  # this drive is being cancelled, not failed by the tool
            exc = signal_in(raised)
            if isinstance(exc, TurnStopped):
                # A step or question found the turn cancelled or replaced: not the tool's.
                raise exc from (None if exc is raised else raised)
            journal.refused()  # the store refused a step, or a child its drive: not the tool's
            if isinstance(exc, ApprovalRequired):
                await self.request_from_tool(call, exc, journal, tool, raw, validated, got, key)
                return
            if isinstance(exc, QuestionWithdrawn):
                cancelled = {"cancelled": True, "reason": str(exc)}
                await self.end_call(key, journal, [tool_result(call, "cancelled", cancelled)])
            elif isinstance(exc, InputUnavailable):
                unavailable = {"error": f"unavailable: {exc}"}
                await self.end_call(key, journal, [tool_result(call, "error", unavailable)])
            else:  # a message of megabytes is cut, not stored whole
                error = cut(error_text(exc), self.max_result_bytes(tool) // 4)
                await self.end_call(key, journal, [tool_result(call, "error", {"error": error})])
            return
        journal.refused()  # caught by the body, which went on
        if too_large is not None:
            await self.end_call(key, journal, [tool_result(call, "error", {"error": too_large})])
            return
        if call.edited_input is not None or approval is not None:
            wrapped: dict[str, Any] = {"result": result}
            if call.edited_input is not None:
                # The model proposed other arguments: say so, beside the result.
                wrapped["note"] = (
                    "a reviewer edited the arguments before approving; the call ran with "
                    "edited_input, not the arguments you proposed"
                )
                wrapped["edited_input"] = call.edited_input
            if approval is not None:
                wrapped["approval"] = approval  # the reason given for approving reaches the model
            result = wrapped
        await self.end_call(key, journal, [tool_result(call, "ok", result)])

    def unknown_tool(self, name: str, *, started: bool = False) -> dict[str, Any]:
        """The result of a call of a tool the agent does not have; one whose body had `started`
        (its tool removed since) says so, and that what it did ran: the model would otherwise
        take it for a call that did nothing, and do that work again with another tool."""
        known = ", ".join(self.agent.tools) or "none"
        # Cut: the model reads the result on every later call, and a name it made up has no bound
        # but the response's.
        said = f"unknown tool {cut(name, 100)!r}"
        if started:
            said += (
                ": it was removed from the agent (or renamed) after this call started, so the "
                "call cannot finish; what the call did before that (the steps it recorded) ran "
                "and is not undone"
            )
        return {"error": f"{said}; available: {known}"}

    def gone(self, call: CallState, tool: Tool | None) -> dict[str, Any] | None:
        """The result of `call` if its tool is gone from the agent since it started (a deploy
        removed or renamed it), or is no longer the delegate tool whose child it journaled (a
        plain tool of its name now: run, its body would meet the child's step, a ReplayError,
        the child's approved work never done); None if it may run."""
        if tool is None:
            # Its body began (`tool.started`), or journaled a step or question: not an approved
            # call that never ran, of which "unknown tool" alone says all.
            started = call.idempotency_key is not None or call.journaled
            return self.unknown_tool(call.tool_name, started=started)
        if call.subagents() and not is_delegate(tool):
            name = cut(call.tool_name, 100)
            return {"error": f"tool {name!r} is no longer the delegate tool this call started"}
        return None

    async def end_unrun(self, call: CallState, error: dict[str, Any]) -> None:
        """Record `error` as the result of `call`, ended without its tool run (gone from the
        agent since the call started, its input no longer valid or approved). A delegate call's
        child is cancelled first, as a steer cancels it (nothing else would drive it on, and a
        turn left live would never be counted), and its spend counted in this end."""
        specs = [tool_result(call, "error", error)]
        kids = call.subagents()
        if kids and self.host is not None:
            turn = self.state.turn
            why = STEERED if turn is not None and turn.steered else UNRUN
            for child in dict.fromkeys(kids):
                try:
                    if (await self.host.runtime._state(child)).parent == self.state.id:
                        await self.host.cancel_child(child, why)
                except UnknownSession:
                    continue
                except UnknownAgent:  # its spend so far is counted, the rest once it ends
                    left = "is left to a process that has its agent (its orphan sweep cancels it)"
                    log.warning("subagent session %s %s", child, left)
            specs = await with_spend(self.host.runtime, self.state.id, call, specs)
        await self.record(specs)

    async def end_call(self, key: str, journal: CallJournal, specs: list[EventSpec]) -> None:
        """Record the outcome of a call whose body ran, whatever cancels the drive meanwhile
        (a close while the record waits for the session's lock): the body would run again on
        resume. If the store fails to take it (a full disk, a lost database), keep it: a later
        drive in this process records it instead of running the body, and its side effects,
        again. An approval the body asked for is such an outcome too: its request is opened
        from the `input.requested` kept, unless a message steered the turn meanwhile."""
        await to_end(self._end_call(key, journal, specs), journal.lost)

    async def _end_call(self, key: str, journal: CallJournal, specs: list[EventSpec]) -> None:
        # A branch the body left running (a gather whose other branch failed) steps no more,
        # and its steps under way are journaled into the call before its end, not after it.
        journal.closed.set()
        await journal.quiet.wait()
        journal.refused()  # one of them refused by the store: the drive fails, as in the body
        requests = [
            InputRequest.model_validate(r)
            for kind, data in specs
            if kind == "input.requested"
            for r in data["requests"]
        ]
        turn = self.state.turn
        call = (
            None if turn is None or turn.id != journal.turn_id else turn.calls.get(journal.call_id)
        )
        if call is not None and self.host is not None:  # a delegate call: what its child spent
            specs = await with_spend(self.host.runtime, self.state.id, call, specs)
        steered = None
        if call is not None and requests:
            # A message that steered the turn while the body ran ignores the approval it asked
            # for, as one already asked: the model reads the message, not a request opened.
            steered = [tool_result(call, "denied", denial(IGNORED))]
        try:
            await self.record(journal.ending(specs, requests, steered))
        except StoreError as exc:
            ran = f"call {journal.call_id}" if call is None else f"{call.tool_name} call {call.id}"
            fenced = record_fenced(exc)  # left to the drive that goes on with the session
            self.unrecorded.keep(self.state.id, key, specs, ran, fenced=fenced)
            raise

    def _cut(self, call: CallState, decision: dict[str, Any]) -> dict[str, Any]:
        """`decision` with a reason of megabytes (a reviewer's, as an answer may hold 4 MiB, or a
        policy's) cut to an eighth of the call's result bound: the model reads it with the
        result, or twice in a denial, in every later call of the session."""
        reason = decision.get("reason")
        cap = result_bound(self.agent.tools.get(call.tool_name), self.agent.limits) // 8
        if not isinstance(reason, str) or len(reason) <= cap:
            return decision
        return {**decision, "reason": cut(reason, cap)}

    def max_result_bytes(self, tool: Tool) -> int:
        """The bound on `tool`'s results: its own, or its agent's `Limits.max_result_bytes`."""
        return result_bound(tool, self.agent.limits)

    async def request_from_tool(
        self,
        call: CallState,
        signal: ApprovalRequired,
        journal: CallJournal,
        tool: Tool,
        raw: Any,
        validated: BaseModel,
        got: Got,
        key: str,
    ) -> None:
        """Ask for the approval `tool` raised, showing the reviewer its validated input as a
        policy's approval shows it (a secret masked, not the model's raw arguments), as the body
        got it (`got`, its form before the body ran; a lazy input's, `raw` validated anew). The
        body ran: what ends the call is kept if the store fails to take it (`end_call`)."""
        s = self.state
        turn = s.turn
        assert turn is not None
        if signal.call_id is not None and signal.call_id != call.id:
            named = signal.call_id if len(signal.call_id) <= 200 else signal.call_id[:200] + "…"
            error = {
                "error": f"ApprovalRequired names call {named!r}, not this call {call.id!r}: "
                "an approval is bound to the call that asks for it"
            }
            await self.end_call(key, journal, [tool_result(call, "error", error)])
            return
        try:
            payload = jsonable(signal.payload)
        except Exception as exc:
            error = {"error": f"approval payload is not JSON-able: {error_message(exc)}"}
            await self.end_call(key, journal, [tool_result(call, "error", error)])
            return
        limit = self.max_result_bytes(tool)
        too_large = over_limit("the approval payload is", payload, limit)
        if too_large is not None:
            await self.end_call(key, journal, [tool_result(call, "error", {"error": too_large})])
            return
        try:
            shown = _shown_as_got(tool, validated, got, raw)
        except PydanticSerializationError as exc:
            error = {"error": f"the input has no JSON form to show a reviewer: {exc}"}
            await self.end_call(key, journal, [tool_result(call, "error", error)])
            return
        except Unshown as exc:
            error = {"error": f"the input cannot be shown to a reviewer as the tool got it: {exc}"}
            await self.end_call(key, journal, [tool_result(call, "error", error)])
            return
        rules, now = tool.approval.rules, self.clock()
        request = InputRequest(
            kind="tool-approval",
            id=new_id("req"),
            session_id=s.id,
            turn_id=turn.id,
            agent=s.agent,
            action=Action.of(call.id, call.tool_name, shown),
            options=list(APPROVAL_OPTIONS),
            payload=payload,
            source="tool",
            requested_by=turn.principal,
            created_at=now,
            usage=s.usage + s.delegated,  # what the run spent, its subagents too
            # The tool's rules, whoever asks: without them the requester alone settled a
            # payload under `approvers=2, exclude_requester=True`, and it never expired.
            approvers=rules.approvers,
            distinct=rules.distinct,
            exclude_requester=rules.exclude_requester,
            expires_at=None if rules.expires_in is None else now + rules.expires_in,
            on_timeout=rules.on_timeout,
            escalate_to=rules.escalate_to,
            response_policy=tool.response_policy is not None,
            max_result_bytes=recorded_bound(limit),  # the decision's value is the call's result
        )
        await self.end_call(
            key, journal, [("input.requested", {"requests": [dump_request(request)]})]
        )
