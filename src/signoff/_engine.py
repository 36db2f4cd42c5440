"""The engine: runs one turn forward from a state, one recorded step at a time.

Each step decides the next action from the state alone, does it, and appends the events that
record it. Whatever is recorded is never done again: a replay reads the record instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from ._agent import Agent
from ._approval import ApprovalContext, SessionAuth, SessionInfo, Verdict
from ._events import Event
from ._exceptions import AppendConflict, ModelError, SignoffError
from ._journal import CallJournal
from ._recording import (
    Batch,
    EventSpec,
    TurnStopped,
    denial,
    dump_request,
    ends_drive,
    invalid_input,
    load_state,
    new_id,
    shadow,
    snapshot_due,
    stored_status,
    tool_result,
    waiting_after,
)
from ._state import (
    MESSAGE_EVENT_TYPES,
    CallState,
    Conversation,
    SessionState,
    conversation,
)
from ._tools import (
    ApprovalRequired,
    InputUnavailable,
    QuestionWithdrawn,
    Tool,
    ToolContext,
)
from ._types import (
    APPROVAL_OPTIONS,
    Action,
    InputRequest,
    Message,
    ModelResponse,
    Option,
    Principal,
    ToolResultMessage,
    input_hash,
)
from .models import ModelRequest, ToolSpec
from .stores import Commit, Resolve, Store

__all__ = ["Driver"]


class Driver:
    """Drives one session's current turn while holding its lease."""

    def __init__(
        self,
        *,
        store: Store,
        agent: Agent,
        state: SessionState,
        lease_token: int | None,
        clock: Callable[[], float] = time.time,
        abort_signal: asyncio.Event | None = None,
        lock: asyncio.Lock | None = None,
    ) -> None:
        self.lock = lock or asyncio.Lock()
        self.store = store
        self.agent = agent
        self.state = state
        self.lease_token = lease_token
        self.clock = clock
        self.abort_signal = abort_signal or asyncio.Event()
        # What delegate tools drive subagents through; the runtime sets it (see _subagents).
        self.host: Any = None
        # Set by whoever holds the lease for one drive: the commit that parks or ends the turn
        # also frees the lease (`released`), sparing a transaction; nothing is recorded after.
        self.release_at_end = False
        self.released = False

    # -- recording ----------------------------------------------------------------------------

    async def record(
        self,
        specs: Sequence[EventSpec] | Callable[[SessionState], Sequence[EventSpec] | Batch],
        *,
        new_requests: Sequence[InputRequest] = (),
        resolve: Sequence[Resolve] = (),
        durable: bool = False,
        turn_id: str | None = None,
    ) -> list[Event]:
        """Append events for the current turn, retrying on a concurrent append by someone else.

        `specs` may be a function of the state, re-evaluated after a concurrent append.
        """
        tid = turn_id or (self.state.turn.id if self.state.turn else None)
        async with self.lock:
            if self.released:
                raise TurnStopped  # this drive gave its lease back with its last commit
            for _ in range(20):
                state = self.state
                turn = state.turn
                if turn_id is None and (
                    turn is None or turn.id != tid or turn.status == "cancelled"
                ):
                    raise TurnStopped  # cancelled or replaced under us: record nothing more
                now = self.clock()
                made = specs(state) if callable(specs) else specs
                if isinstance(made, Batch):
                    batch, resolve, new_requests = made.specs, made.resolve, made.new_requests
                    updated = made.updated_requests
                else:
                    batch, updated = made, ()
                if not batch:
                    return []
                events = [
                    Event(
                        session_id=state.id,
                        seq=state.seq + i + 1,
                        type=t,
                        at=now,
                        turn_id=tid,
                        data=d,
                    )
                    for i, (t, d) in enumerate(batch)
                ]
                before = state.seq
                after = shadow(state, events, before)
                release = (
                    self.release_at_end
                    and self.lease_token is not None
                    and after is not None
                    and ends_drive(events, after)
                )
                try:
                    await self.store.commit(
                        Commit(
                            session_id=state.id,
                            expected_seq=before,
                            events=events,
                            lease_token=self.lease_token,
                            new_requests=new_requests,
                            updated_requests=updated,
                            resolve=resolve,
                            snapshot=after.to_snapshot()
                            if after is not None and snapshot_due(before, len(events))
                            else None,
                            durable=durable,
                            status=None if after is None else stored_status(after),
                            expires_at=None if state.ttl is None else now + state.ttl,
                            release_lease=release,
                        )
                    )
                except AppendConflict:
                    await self.reload()
                    continue
                # Applied only once committed, so a state object is never ahead of the store.
                for e in events:
                    state.apply(e)
                self.released = release
                return events
        raise AppendConflict(f"session {self.state.id!r}: too many concurrent appends")

    async def reload(self) -> None:
        """Rebuild the state from the store (snapshot plus tail) after a failed append."""
        self.state = await load_state(self.store, self.state.id)

    # -- the loop -----------------------------------------------------------------------------

    async def drive(self, *, retry: bool = False) -> SessionState:
        """Run the turn until it completes, fails, is cancelled or waits for a person."""
        try:
            while True:
                turn = self.state.turn
                ended = turn is not None and turn.status in ("completed", "cancelled")
                if ended and self.state.queued:
                    await self.start_queued()
                    continue
                if turn is None or turn.status in ("completed", "cancelled"):
                    return self.state
                if turn.status == "failed" and not retry:
                    return self.state
                retry = False
                calls = list(turn.calls.values())
                proposed = [c for c in calls if c.status == "proposed"]
                if proposed and await self.evaluate(proposed):
                    continue
                ready = next(
                    (c for c in calls if c.status in ("approved", "denied", "decided", "running")),
                    None,
                )
                if ready is not None:
                    await self.execute(ready)
                    continue
                if any(c.status in ("requested", "awaiting", "asking", "proposed") for c in calls):
                    if turn.status != "waiting":
                        ids = [r.id for r in self.state.pending_requests()]
                        await self.record([("turn.waiting", {"on": "input", "request_ids": ids})])
                    return self.state
                if await self.step_model():
                    return self.state
        except TurnStopped:
            return self.state

    async def start_queued(self) -> None:
        """A message kept for after the turn starts the next turn."""
        queued = self.state.queued[0]
        spec: EventSpec = (
            "turn.started",
            {
                "message": queued["message"],
                "principal": queued.get("principal"),
                "source": "message",
                "dequeued": True,
            },
        )
        await self.record([spec], turn_id=new_id("trn"))

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
        for call in calls:
            tool = self.agent.tools.get(call.tool_name)
            if tool is None:
                known = ", ".join(self.agent.tools) or "none"
                error = {"error": f"unknown tool {call.tool_name!r}; available: {known}"}
                results.append(tool_result(call, "error", error))
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
            )
            verdict = await self.verdict(tool, ctx)
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
        for call, tool, validated, verdict in decided:
            if verdict.action == "deny":
                by_policy = {"denied": True, "reason": verdict.reason, "by": "policy"}
                results.append(tool_result(call, "denied", by_policy))
            elif verdict.action == "ask":
                if workflow_busy and not tool.workflow:
                    continue
                if turn.steered:
                    # A steering message came while this approval waited to be asked: it is
                    # ignored like one already asked, and the model reads the message.
                    why = {"reason": "the user sent a new message instead", "outcome": "ignored"}
                    results.append(tool_result(call, "denied", denial(why)))
                    continue
                requests.append(self._approval_request(call, tool, validated, verdict))
            else:
                to_run.append((call, tool, validated, verdict))
        specs: list[EventSpec] = []
        if requests:
            specs.append(("input.requested", {"requests": [dump_request(r) for r in requests]}))
        specs.extend(results)
        if specs and requests and not to_run:

            def parked(state: SessionState) -> Batch:
                return Batch(specs=specs + waiting_after(state, specs), new_requests=requests)

            await self.record(parked)
        elif specs:
            await self.record(specs, new_requests=requests)
        for call, tool, validated, verdict in to_run:
            current = self.state.turn.calls.get(call.id) if self.state.turn else None
            if current is None or current.status != "proposed":
                continue
            note = None
            if verdict.reason and verdict.auto is None:  # Approved(reason): the model hears why
                note = {"approved": True, "by": "policy", "reason": verdict.reason}
            principal = self.state.turn.principal  # type: ignore[union-attr]
            await self.run_tool(current, tool, validated, principal, approval=note)
        return len(requests) + len(results) + len(to_run)

    def _approval_request(
        self, call: CallState, tool: Tool, validated: BaseModel, verdict: Verdict
    ) -> InputRequest:
        s = self.state
        turn = s.turn
        assert turn is not None
        dumped = validated.model_dump(mode="json")
        rules = tool.approval.rules
        now = self.clock()
        return InputRequest(
            kind="tool-approval",
            id=new_id("req"),
            session_id=s.id,
            turn_id=turn.id,
            agent=s.agent,
            action=Action(
                call_id=call.id,
                tool_name=tool.name,
                input=dumped,
                input_hash=input_hash(dumped, tool_name=tool.name, call_id=call.id),
            ),
            options=list(APPROVAL_OPTIONS),
            source="guardrail" if verdict.reason == "guardrail" else "policy",
            requested_by=turn.principal,
            created_at=now,
            expires_at=None if rules.expires_in is None else now + rules.expires_in,
            policy_error=verdict.error,
            usage=s.usage,
            approvers=rules.approvers,
            distinct=rules.distinct,
            exclude_requester=rules.exclude_requester,
            on_timeout=rules.on_timeout,
            escalate_to=rules.escalate_to,
            auto_verdict=None if verdict.auto is None else verdict.auto[0],
            auto_reason=None if verdict.auto is None else verdict.auto[1],
        )

    async def verdict(self, tool: Tool, ctx: ApprovalContext) -> Verdict:
        """The strictest of the tool's policy and the agent's guardrails: deny > ask > run."""
        verdicts = [await tool.approval.decide(ctx)]
        for guardrail in self.agent.guardrails:
            try:
                v = await guardrail.decide(ctx)
            except Exception as exc:  # fail closed, like a broken policy: ask a person
                v = Verdict("ask", error=f"guardrail raised {type(exc).__name__}: {exc}")
            if v is not None:
                verdicts.append(v if v.action != "ask" else Verdict("ask", "guardrail", v.error))
        for action in ("deny", "ask"):
            for v in verdicts:
                if v.action == action:
                    return v
        return verdicts[0]

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
            await self.record([tool_result(call, "denied", denial(decision))])
            return
        if call.status == "decided":
            await self.record([tool_result(call, "decided", call.decision or {"approved": False})])
            return
        tool = self.agent.tools[call.tool_name]
        principal = turn.principal
        raw = call.input
        if call.request_id is not None:
            req = s.requests[call.request_id].request
            raw = call.edited_input if call.edited_input is not None else req.input
            by = (call.decision or {}).get("by")
            if tool.run_as == "approver" and by is not None:
                principal = Principal.model_validate(by)
        try:
            validated = tool.validate(raw)
        except ValidationError as exc:
            await self.record([tool_result(call, "error", invalid_input(exc))])
            return
        note = None
        decision = call.decision or {}
        if decision.get("approved") and decision.get("reason"):
            by = decision.get("by")
            who = by.get("principal_id") if isinstance(by, dict) else by
            note = {"approved": True, "by": who, "reason": decision["reason"]}
        await self.run_tool(call, tool, validated, principal, approval=note)

    async def run_tool(
        self,
        call: CallState,
        tool: Tool,
        validated: BaseModel,
        principal: Principal | None,
        *,
        approval: dict[str, Any] | None = None,
    ) -> None:
        s = self.state
        # Models may reuse call ids across responses: the response number keeps keys unique.
        key = call.idempotency_key or f"{s.id}:{s.model_responses}:{call.id}"
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
                        },
                    )
                ]
            )
        journal = CallJournal(self, call.id, principal)
        ctx = ToolContext(
            session=self.session_info(principal),
            call_id=call.id,
            tool_name=call.tool_name,
            idempotency_key=key,
            abort_signal=self.abort_signal,
            journal=journal,
        )
        task = asyncio.ensure_future(tool.invoke(ctx, validated))
        parked = asyncio.ensure_future(journal.parked.wait())
        try:
            await asyncio.wait({task, parked}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                await journal.settle()
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
                return  # parked on ctx.ask(): the call is "asking" now
        finally:
            parked.cancel()
        try:
            result = task.result()
        except ApprovalRequired as signal:
            await self.request_from_tool(call, signal.payload)
            return
        except QuestionWithdrawn as exc:
            await self.record(
                [tool_result(call, "cancelled", {"cancelled": True, "reason": str(exc)})]
            )
            return
        except InputUnavailable as exc:
            await self.record([tool_result(call, "error", {"error": f"unavailable: {exc}"})])
            return
        except Exception as exc:
            await self.record(
                [tool_result(call, "error", {"error": f"{type(exc).__name__}: {exc}"})]
            )
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
        await self.record([tool_result(call, "ok", result)])

    async def request_from_tool(self, call: CallState, payload: Any) -> None:
        s = self.state
        turn = s.turn
        assert turn is not None
        try:
            from pydantic_core import to_jsonable_python

            payload = to_jsonable_python(payload)
        except Exception as exc:
            await self.record(
                [tool_result(call, "error", {"error": f"approval payload is not JSON-able: {exc}"})]
            )
            return
        request = InputRequest(
            kind="tool-approval",
            id=new_id("req"),
            session_id=s.id,
            turn_id=turn.id,
            agent=s.agent,
            action=Action(
                call_id=call.id,
                tool_name=call.tool_name,
                input=call.input,
                input_hash=input_hash(call.input, tool_name=call.tool_name, call_id=call.id),
            ),
            options=list(APPROVAL_OPTIONS),
            payload=payload,
            source="tool",
            requested_by=turn.principal,
            created_at=self.clock(),
            usage=s.usage,
        )
        await self.record(
            [("input.requested", {"requests": [dump_request(request)]})], new_requests=[request]
        )

    # -- the model ----------------------------------------------------------------------------

    async def conversation(self) -> list[Message]:
        s = self.state
        if s.conversation is None:
            s.conversation = await self._windowed() or conversation(
                e
                for e in await self.store.read_events(s.id, types=MESSAGE_EVENT_TYPES)
                if e.seq <= s.seq
            )
        return s.conversation.messages

    async def _windowed(self) -> Conversation | None:
        """With a message window, the conversation from a recent turn on, read from the newest
        message events only: loading a long session then costs the window, not the history.
        None when the window may reach further back (the caller reads everything)."""
        limit = self.agent.limits.max_messages
        if limit is None:
            return None
        want = 2 * limit + 8
        s = self.state
        tail = await self.store.read_events(s.id, types=MESSAGE_EVENT_TYPES, newest=want)
        whole = len(tail) < want
        tail = [e for e in tail if e.seq <= s.seq]
        if whole:
            return conversation(tail)  # that was the whole log
        start = next((i for i, e in enumerate(tail) if e.type == "turn.started"), None)
        if start is None:
            return None
        conv = conversation(tail[start:], partial=True)
        # `window()` keeps the last `limit` messages and the current turn, which started at or
        # after tail[start]: exactly what the whole log would give once there are that many.
        return conv if len(conv.messages) >= limit else None

    async def window(self) -> list[Message]:
        """The messages sent to the model: the last `max_messages`, never cutting this turn."""
        messages = await self.conversation()
        limit = self.agent.limits.max_messages
        if limit is None or len(messages) <= limit:
            return list(messages)
        assert self.state.conversation is not None
        start = min(len(messages) - limit, self.state.conversation.turn_start)
        while start > 0 and isinstance(messages[start], ToolResultMessage):
            start -= 1  # never begin with results whose calls were cut off
        return list(messages[start:])

    async def step_model(self) -> bool:
        """Call the model once and record its response; True when the turn parked or ended."""
        s = self.state
        turn = s.turn
        assert turn is not None
        limits = self.agent.limits
        if turn.steps >= limits.max_steps:
            await self._fail_limit(f"the turn reached max_steps={limits.max_steps}")
            return True
        budget = _over_budget(s, limits.max_tokens, limits.max_cost_usd)
        if budget is not None:
            return await self._session_limit(budget)
        read_through = s.seq
        request = ModelRequest(
            session_id=s.id,
            agent=s.agent,
            instructions=self.agent.instructions,
            messages=await self.window(),
            tools=[
                ToolSpec(name=t.name, description=t.description, input_schema=t.json_schema())
                for t in self.agent.tools.values()
            ],
            response_index=s.model_responses,
        )
        # The model reads every message now: the calls it proposes start un-aborted.
        self.abort_signal.clear()
        try:
            response = await self.agent.model.complete(request)
            if not isinstance(response, ModelResponse):
                raise ModelError(f"model returned {type(response).__name__}, not ModelResponse")
        except Exception as exc:
            code = exc.code if isinstance(exc, SignoffError) else "model_error"
            await self.record(
                [
                    (
                        "turn.failed",
                        {
                            "error": {"code": code, "message": f"{type(exc).__name__}: {exc}"},
                            "retryable": True,
                        },
                    )
                ]
            )
            return True
        seen: set[str] = set()
        calls = []
        for i, c in enumerate(response.tool_calls):
            cid = c.id if c.id and c.id not in seen else f"call_{s.seq + 1}_{i}"
            seen.add(cid)
            calls.append({"id": cid, "name": c.name, "input": c.input})
        completed: EventSpec = (
            "model.completed",
            {"text": response.text, "tool_calls": calls, "usage": response.usage.model_dump()},
        )

        def specs(state: SessionState) -> list[EventSpec]:
            # A message that arrived while the model was thinking keeps the turn open.
            unread = state.turn is not None and state.turn.last_message_seq > read_through
            if calls or unread:
                return [completed]
            # The answer is the `model.completed` just before: `turn.completed` does not repeat it.
            return [completed, ("turn.completed", {}), ("session.waiting", {})]

        await self.record(specs)
        return False

    async def _fail_limit(self, problem: str) -> None:
        error = {"code": "session_limit_reached", "message": problem}
        await self.record(
            [("turn.failed", {"error": error, "retryable": False}), ("session.waiting", {})]
        )

    async def _session_limit(self, problem: str) -> bool:
        """A budget is spent: ask the person to continue (raising it) or stop; with nobody to
        ask, fail with `session_limit_reached`."""
        s = self.state
        turn = s.turn
        assert turn is not None
        asked = [
            r
            for r in s.requests.values()
            if r.request.kind == "session-limit" and r.request.child is None  # not a subagent's
        ]
        last = asked[-1] if asked else None
        if last is not None and last.status == "pending":
            if turn.status != "waiting":
                waiting = {"on": "input", "request_ids": [last.request.id]}
                await self.record([("turn.waiting", waiting)])
            return True
        if last is not None and last.outcome == "answered":
            choice = ((last.resolution or {}).get("answer") or {}).get("option_id")
            if choice == "stop":
                await self._fail_limit(f"{problem}; the person chose to stop")
                return True
        principal = turn.principal
        if turn.source == "schedule" or (
            principal is not None and principal.principal_type == "runtime"
        ):
            await self._fail_limit(f"{problem}; nobody can raise the budget of this session")
            return True
        request = InputRequest(
            kind="session-limit",
            id=new_id("req"),
            session_id=s.id,
            turn_id=turn.id,
            agent=s.agent,
            question=f"{problem}. Continue with a raised budget, or stop?",
            options=list(LIMIT_OPTIONS),
            requested_by=principal,
            created_at=self.clock(),
            usage=s.usage,
        )
        await self.record(
            [
                ("input.requested", {"requests": [dump_request(request)]}),
                ("turn.waiting", {"on": "input", "request_ids": [request.id]}),
            ],
            new_requests=[request],
        )
        return True


LIMIT_OPTIONS = [
    Option(id="continue", label="Continue", description="Raise the budget by its size again."),
    Option(id="stop", label="Stop", description="End this turn here."),
]


def _over_budget(s: SessionState, max_tokens: int | None, max_cost: float | None) -> str | None:
    """Which budget the session has spent, each raised once per `continue` answered."""
    times = 1 + s.limit_grants
    if max_tokens is not None and s.usage.total_tokens >= max_tokens * times:
        return f"the session used {s.usage.total_tokens} of max_tokens={max_tokens * times}"
    if max_cost is not None and s.usage.cost_usd >= max_cost * times:
        return f"the session cost {s.usage.cost_usd:.4f} of max_cost_usd={max_cost * times:g}"
    return None
