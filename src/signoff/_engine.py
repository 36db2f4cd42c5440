"""The engine: runs one turn forward from a state, one recorded step at a time.

Each step decides the next action from the state alone, does it, and appends the events that
record it. Whatever is recorded is never done again: a replay reads the record instead.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from ._agent import Agent
from ._approval import ApprovalContext, SessionAuth, SessionInfo, Verdict
from ._events import Event, EventType
from ._exceptions import AppendConflict, ModelError, SignoffError, UnknownSession
from ._state import MESSAGE_EVENT_TYPES, CallState, SessionState, conversation, fold
from ._tools import ApprovalRequired, Tool, ToolContext
from ._types import (
    APPROVAL_OPTIONS,
    Action,
    InputRequest,
    Message,
    ModelResponse,
    Principal,
    ToolResultMessage,
    input_hash,
)
from .models import ModelRequest, ToolSpec
from .stores import Commit, Resolve, Store

__all__ = ["Driver", "TurnStopped", "load_state", "new_id", "runnable"]

PARK_TYPES = frozenset({"turn.waiting", "turn.completed", "turn.failed", "turn.cancelled"})
SNAPSHOT_EVERY = 64


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


async def load_state(store: Store, session_id: str) -> SessionState:
    """One snapshot plus the tail; the conversation is left out until the model needs it."""
    loaded = await store.load(session_id)
    if loaded is None:
        raise UnknownSession(session_id)
    state = None if loaded.snapshot is None else SessionState.from_snapshot(loaded.snapshot)
    if state is None and not loaded.events:
        raise UnknownSession(session_id)
    if state is None:
        return fold(loaded.events)
    return fold(loaded.events, state)


class TurnStopped(Exception):
    """Internal: the turn ended under us (cancelled elsewhere); stop driving."""


def runnable(state: SessionState, *, retry: bool = False) -> bool:
    """Whether the session's turn has something to do now (as opposed to waiting or over)."""
    turn = state.turn
    if turn is None or turn.status in ("completed", "cancelled"):
        return False
    if turn.status == "failed" and not retry:
        return False
    statuses = {c.status for c in turn.calls.values()}
    if statuses & {"proposed", "approved", "denied", "decided", "running"}:
        return True
    if statuses & {"requested", "awaiting"}:
        return turn.status != "waiting"
    return True


EventSpec = tuple[EventType, dict[str, Any]]


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
    ) -> None:
        self.store = store
        self.agent = agent
        self.state = state
        self.lease_token = lease_token
        self.clock = clock
        self.abort_signal = abort_signal or asyncio.Event()

    # -- recording ----------------------------------------------------------------------------

    async def record(
        self,
        specs: Sequence[EventSpec],
        *,
        new_requests: Sequence[InputRequest] = (),
        resolve: Sequence[Resolve] = (),
        durable: bool = False,
        turn_id: str | None = None,
    ) -> list[Event]:
        """Append events for the current turn, retrying on a concurrent append by someone else."""
        for _ in range(20):
            state = self.state
            tid = turn_id or (state.turn.id if state.turn else None)
            now = self.clock()
            events = [
                Event(
                    session_id=state.id, seq=state.seq + i + 1, type=t, at=now, turn_id=tid, data=d
                )
                for i, (t, d) in enumerate(specs)
            ]
            snapshot = None
            before = state.seq
            for e in events:
                state.apply(e)
            last = state.seq
            if any(e.type in PARK_TYPES for e in events) or before // SNAPSHOT_EVERY != (
                last // SNAPSHOT_EVERY
            ):
                snapshot = state.to_snapshot()
            try:
                await self.store.commit(
                    Commit(
                        session_id=state.id,
                        expected_seq=before,
                        events=events,
                        lease_token=self.lease_token,
                        new_requests=new_requests,
                        resolve=resolve,
                        snapshot=snapshot,
                        durable=durable,
                        status=state.status,
                        expires_at=state.expires_at,
                    )
                )
            except AppendConflict:
                await self.reload()
                if state.turn is None or (turn_id is None and state.turn.id != tid):
                    raise TurnStopped from None
                if self.state.turn is not None and self.state.turn.status == "cancelled":
                    raise TurnStopped from None
                continue
            except BaseException:
                await self.reload()
                raise
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
                if turn is None or turn.status in ("completed", "cancelled"):
                    return self.state
                if turn.status == "failed" and not retry:
                    return self.state
                retry = False
                calls = list(turn.calls.values())
                proposed = [c for c in calls if c.status == "proposed"]
                if proposed:
                    await self.evaluate(proposed)
                    continue
                ready = next(
                    (c for c in calls if c.status in ("approved", "denied", "decided", "running")),
                    None,
                )
                if ready is not None:
                    await self.execute(ready)
                    continue
                if any(c.status in ("requested", "awaiting") for c in calls):
                    if turn.status != "waiting":
                        ids = [r.id for r in self.state.pending_requests()]
                        await self.record([("turn.waiting", {"on": "input", "request_ids": ids})])
                    return self.state
                await self.step_model()
        except TurnStopped:
            return self.state

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

    async def evaluate(self, calls: list[CallState]) -> None:
        """Decide each proposed call: open requests, record denials, run what may run."""
        s = self.state
        turn = s.turn
        assert turn is not None
        pending_tools = {r.tool_name for r in s.pending_requests() if r.tool_name}
        requests: list[InputRequest] = []
        results: list[EventSpec] = []
        to_run: list[tuple[CallState, Tool, BaseModel]] = []
        for call in calls:
            tool = self.agent.tools.get(call.tool_name)
            if tool is None:
                known = ", ".join(self.agent.tools) or "none"
                results.append(
                    _result(
                        call,
                        "error",
                        {"error": f"unknown tool {call.tool_name!r}; available: {known}"},
                    )
                )
                continue
            try:
                validated = tool.validate(call.input)
            except ValidationError as exc:
                results.append(_result(call, "error", _invalid_input(exc)))
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
            if verdict.action == "deny":
                denial = {"denied": True, "reason": verdict.reason, "by": "policy"}
                results.append(_result(call, "denied", denial))
            elif verdict.action == "ask":
                dumped = validated.model_dump(mode="json")
                requests.append(
                    InputRequest(
                        kind="tool-approval",
                        id=new_id("req"),
                        session_id=s.id,
                        turn_id=turn.id,
                        agent=s.agent,
                        action=Action(
                            call_id=call.id,
                            tool_name=tool.name,
                            input=dumped,
                            input_hash=input_hash(dumped),
                        ),
                        options=list(APPROVAL_OPTIONS),
                        source="guardrail" if verdict.reason == "guardrail" else "policy",
                        requested_by=turn.principal,
                        created_at=self.clock(),
                        policy_error=verdict.error,
                        usage=s.usage,
                    )
                )
                pending_tools.add(tool.name)
            else:
                to_run.append((call, tool, validated))
        specs: list[EventSpec] = []
        if requests:
            specs.append(("input.requested", {"requests": [_dump_request(r) for r in requests]}))
        specs.extend(results)
        if specs:
            await self.record(specs, new_requests=requests)
        for call, tool, validated in to_run:
            await self.run_tool(call, tool, validated, self.state.turn.principal)  # type: ignore[union-attr]

    async def verdict(self, tool: Tool, ctx: ApprovalContext) -> Verdict:
        """The strictest of the tool's policy and the agent's guardrails: deny > ask > run."""
        verdicts = [await tool.approval.decide(ctx)]
        for guardrail in self.agent.guardrails:
            v = await guardrail.decide(ctx)
            if v is not None:
                verdicts.append(v if v.action != "ask" else Verdict("ask", "guardrail"))
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
            d = call.decision or {}
            await self.record(
                [
                    _result(
                        call,
                        "denied",
                        {"denied": True, "reason": d.get("reason"), "by": d.get("by")},
                    )
                ]
            )
            return
        if call.status == "decided":
            await self.record([_result(call, "decided", call.decision or {"approved": False})])
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
            await self.record([_result(call, "error", _invalid_input(exc))])
            return
        await self.run_tool(call, tool, validated, principal)

    async def run_tool(
        self, call: CallState, tool: Tool, validated: BaseModel, principal: Principal | None
    ) -> None:
        s = self.state
        key = call.idempotency_key or f"{s.id}:{call.id}"
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
        ctx = ToolContext(
            session=self.session_info(principal),
            call_id=call.id,
            tool_name=call.tool_name,
            idempotency_key=key,
            abort_signal=self.abort_signal,
        )
        try:
            result = await tool.invoke(ctx, validated)
        except ApprovalRequired as signal:
            await self.request_from_tool(call, signal.payload)
            return
        except Exception as exc:
            await self.record([_result(call, "error", {"error": f"{type(exc).__name__}: {exc}"})])
            return
        await self.record([_result(call, "ok", result)])

    async def request_from_tool(self, call: CallState, payload: Any) -> None:
        s = self.state
        turn = s.turn
        assert turn is not None
        try:
            from pydantic_core import to_jsonable_python

            payload = to_jsonable_python(payload)
        except Exception as exc:
            await self.record(
                [_result(call, "error", {"error": f"approval payload is not JSON-able: {exc}"})]
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
                input_hash=input_hash(call.input),
            ),
            options=list(APPROVAL_OPTIONS),
            payload=payload,
            source="tool",
            requested_by=turn.principal,
            created_at=self.clock(),
            usage=s.usage,
        )
        await self.record(
            [("input.requested", {"requests": [_dump_request(request)]})], new_requests=[request]
        )

    # -- the model ----------------------------------------------------------------------------

    async def conversation(self) -> list[Message]:
        s = self.state
        if s.messages is None:
            events = await self.store.read_events(s.id, types=MESSAGE_EVENT_TYPES)
            s.messages = conversation(e for e in events if e.seq <= s.seq)
        return s.messages

    async def window(self) -> list[Message]:
        """The messages sent to the model: the last `max_messages`, never cutting this turn."""
        messages = await self.conversation()
        limit = self.agent.limits.max_messages
        if limit is None or len(messages) <= limit:
            return list(messages)
        start = len(messages) - limit
        turn_start = self._turn_start_index(messages)
        start = min(start, turn_start)
        while start > 0 and isinstance(messages[start], ToolResultMessage):
            start -= 1  # never begin with results whose calls were cut off
        return list(messages[start:])

    def _turn_start_index(self, messages: list[Message]) -> int:
        # The current turn's first message is the last user message (or its first response).
        from ._types import UserMessage

        for i in range(len(messages) - 1, -1, -1):
            if isinstance(messages[i], UserMessage):
                return i
        return 0

    async def step_model(self) -> None:
        s = self.state
        turn = s.turn
        assert turn is not None
        limits = self.agent.limits
        problem = None
        if turn.steps >= limits.max_steps:
            problem = f"the turn reached max_steps={limits.max_steps}"
        elif limits.max_tokens is not None and s.usage.total_tokens >= limits.max_tokens:
            problem = f"the session used {s.usage.total_tokens} of max_tokens={limits.max_tokens}"
        elif limits.max_cost_usd is not None and s.usage.cost_usd >= limits.max_cost_usd:
            problem = (
                f"the session cost {s.usage.cost_usd:.4f} of max_cost_usd={limits.max_cost_usd}"
            )
        if problem is not None:
            await self.record(
                [
                    (
                        "turn.failed",
                        {
                            "error": {"code": "session_limit_reached", "message": problem},
                            "retryable": False,
                        },
                    ),
                    ("session.waiting", {}),
                ]
            )
            return
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
            return
        seen: set[str] = set()
        calls = []
        for i, c in enumerate(response.tool_calls):
            cid = c.id if c.id and c.id not in seen else f"call_{s.seq + 1}_{i}"
            seen.add(cid)
            calls.append({"id": cid, "name": c.name, "input": c.input})
        specs: list[EventSpec] = [
            (
                "model.completed",
                {"text": response.text, "tool_calls": calls, "usage": response.usage.model_dump()},
            )
        ]
        if not calls:
            specs.append(("turn.completed", {"text": response.text}))
            specs.append(("session.waiting", {}))
        await self.record(specs)


def _result(call: CallState, status: str, result: Any) -> EventSpec:
    return (
        "tool.completed",
        {"call_id": call.id, "tool_name": call.tool_name, "status": status, "result": result},
    )


def _invalid_input(exc: ValidationError) -> dict[str, Any]:
    return {
        "error": "invalid input",
        "details": [
            {"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]}
            for e in exc.errors(include_url=False)
        ],
    }


def _dump_request(request: InputRequest) -> dict[str, Any]:
    return request.model_dump(mode="json", exclude_defaults=True)
