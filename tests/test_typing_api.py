"""The public API as a typed user sees it: a program written under `mypy --strict` (the gate
checks this file with every strict flag, see pyproject.toml), with `assert_type` on what each
entry point returns and `# type: ignore[code]` on the wrong uses a type checker must reject
(`warn_unused_ignores`: a wrong use mypy accepts fails the gate).

The functions named `_typed_*` are read by mypy only; the tests below run a few of the same
calls, so that what the types say is what the calls do."""

from __future__ import annotations

import asyncio
import inspect
import io
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Annotated, Any, Literal, assert_type

import pytest
from pydantic import BaseModel, Field

import signoff as so
from signoff import testing
from signoff.models import Model, Scripted
from signoff.stores import PendingFilter, SessionSummary, SQLiteStore, Store

SessionStatus = Literal["idle", "running", "waiting", "failed", "cancelled"]
TurnStatus = Literal["running", "waiting", "completed", "failed", "cancelled"]

ALICE = so.Principal(authenticator="test", principal_id="alice")

# -- tools, as a user defines them -------------------------------------------------------------


class Address(BaseModel):
    street: str
    city: str = "Paris"


@so.tool
async def lookup_order(
    order_id: Annotated[str, Field(description="the order's id")],
) -> dict[str, str]:
    """Look an order up."""
    return {"order_id": order_id, "status": "shipped"}


@so.tool(approval=so.always(), description="Refund an order.")
def issue_refund(order_id: str, amount: float = 10.0, reason: str | None = None) -> str:
    """Refund an order in full or in part."""
    return f"refunded {amount:.2f} on {order_id}"


@so.tool(approval=lambda input: input.amount > 100)
async def refund_small(order_id: str, amount: float) -> dict[str, float]:
    """Refund a small amount."""
    return {"amount": amount}


def tenant_policy(ctx: so.ApprovalContext) -> so.ApprovalStatus:
    assert_type(ctx.abort_signal, asyncio.Event)
    assert_type(ctx.approved_tools, frozenset[str])
    if ctx.tool_name == "ship" and ctx.session.auth.current is not None:
        return "user-approval"
    return so.Approved("trusted") if ctx.edited else "not-applicable"


async def async_policy(ctx: so.ApprovalContext) -> so.ApprovalStatus:
    return so.Denied("never on a weekend") if ctx.call_id == "" else True


def fx_quote(src: str, dst: str) -> float:
    return 1.1 if src != dst else 1.0


@so.tool(approval=tenant_policy, run_as="approver", max_result_bytes=10_000)
async def ship(ctx: so.ToolContext, to: Address, express: bool = False) -> str:
    """Ship a parcel."""
    answer = await ctx.ask("Which carrier?", options=["ups", so.Option(id="dhl", label="DHL")])
    assert_type(answer, so.Answer)
    assert_type(answer.value, str)
    assert_type(answer.option_id, str | None)
    assert_type(answer.responder, so.Principal | None)
    quote = await ctx.step("quote", fx_quote, "EUR", "USD")  # the journaled JSON form
    assert_type(quote, Any)
    assert_type(ctx.idempotency_key("send"), str)
    assert_type(ctx.session, so.SessionInfo)
    assert_type(ctx.session.auth, so.SessionAuth)
    assert_type(ctx.call_id, str)
    assert_type(ctx.abort_signal, asyncio.Event)
    if not express:
        ctx.request_approval({"to": to.street})  # NoReturn: the code below is for an express
    return f"{answer.value} to {to.city} at {quote}"


@so.tool(approval=so.ApprovalSpec(async_policy, expires_in=3600, on_timeout="deny"))
async def wipe(customer: str) -> None:
    """Wipe a customer's data."""


def allow_anyone(ctx: so.ResponseContext) -> Literal["allowed", "rejected"]:
    assert_type(ctx.request, so.RequestInfo)
    assert_type(ctx.response, so.ResponseInfo)
    return "allowed" if ctx.response.principal is not None else "rejected"


class NoWeekends(so.Guardrail):
    async def decide(self, ctx: so.ApprovalContext) -> so.Verdict | None:
        return so.Verdict("deny", "closed") if ctx.tool_name == "wipe" else None


def _tools() -> list[so.Tool]:
    return [lookup_order, issue_refund, refund_small, ship, wipe, so.ask_question()]


# -- what mypy checks (never called) -------------------------------------------------------------


def _typed_definitions() -> None:
    assert_type(lookup_order, so.Tool)
    assert_type(so.tool(fx_quote), so.Tool)
    assert_type(so.tool(name="quote"), Callable[[Callable[..., Any]], so.Tool])
    assert_type(lookup_order.name, str)
    assert_type(lookup_order.json_schema(), dict[str, Any])
    assert_type(lookup_order.approval, so.ApprovalPolicy)
    for helper in (so.never(), so.once(), so.always(approvers=2), so.auto()):
        assert_type(helper, so.ApprovalPolicy)
    assert_type(so.policy(tenant_policy), so.ApprovalPolicy)
    assert_type(so.predicate(lambda input: input.amount > 5), so.ApprovalPolicy)
    assert_type(so.auto(criteria=so.Criteria(clear="reads only")), so.ApprovalPolicy)
    assert_type(so.tool_policy(require_approval=["wipe"], deny=["drop"]), so.Guardrail)
    assert_type(so.delegate("billing"), so.Tool)
    assert_type(so.ask_question(), so.Tool)
    assert_type(so.ApprovalSpec(so.once(), allow_anyone, approvers=2), so.ApprovalSpec)
    model = Scripted(
        [
            so.ModelResponse(
                tool_calls=[so.ToolCall(name="lookup_order", input={"order_id": "1"})]
            ),
            lambda conversation: so.ModelResponse(text=f"{len(conversation)} messages"),
            RuntimeError("the provider is down"),
        ]
    )
    assert_type(model, Scripted)
    as_model: Model = model
    agent = so.Agent(
        name="support",
        model=as_model,
        instructions="Help.",
        tools=_tools(),
        guardrails=[so.tool_policy(require_approval=["wipe"]), NoWeekends()],
        limits=so.Limits(max_tokens=200_000, max_cost_usd=2.0, ttl=None),
    )
    assert_type(agent.name, str)
    assert_type(testing.scripted_agent("a", [testing.reply("hi")], tools=_tools()), so.Agent)
    assert_type(testing.call("ship", to={"street": "x"}), so.ToolCall)
    assert_type(testing.call_tools(testing.call("ship")), so.ModelResponse)
    log = testing.ExecutionLog()
    assert_type(log.tool(fx_quote), testing.RecordingTool)
    assert_type(
        log.tool(approval=so.once(), run_as="requester"),
        Callable[[Callable[..., Any]], testing.RecordingTool],
    )
    assert_type(log.count("ship"), int)


def _typed_wrong_definitions() -> None:
    """Each of these raises `UsageError` when run; a type checker says so first."""
    so.tool(approval=so.always)(fx_quote)  # type: ignore[arg-type]  # not called
    so.tool(approval="sometimes")(fx_quote)  # type: ignore[call-overload]
    so.tool(approval=3)(fx_quote)  # type: ignore[call-overload]
    so.tool(fx_quote, approval=lambda: True)  # type: ignore[arg-type]  # no argument
    so.tool(run_as="root")(fx_quote)  # type: ignore[call-overload]
    so.Tool(fx_quote, run_as="admin")  # type: ignore[arg-type]
    so.Tool(fx_quote, approval=object())  # type: ignore[arg-type]
    so.ApprovalSpec(request="sometimes")  # type: ignore[arg-type]
    testing.ExecutionLog().tool(approval=2.5)  # type: ignore[call-overload]
    testing.ExecutionLog().tool(run_as="root")  # type: ignore[call-overload]
    so.always(on_timeout="maybe")  # type: ignore[arg-type]
    so.Verdict("allow")  # type: ignore[arg-type]
    so.Agent(name="a", model=Scripted([]), tools=[fx_quote])  # type: ignore[list-item]
    lookup_order("1042")  # type: ignore[operator]  # a Tool is run by the runtime


async def _typed_runtime(rt: so.Runtime, sid: str) -> None:
    r = await rt.generate("support", "Refund order 1042", auth=ALICE, idempotency_key="k1")
    assert_type(r, so.GenerateResult)
    assert_type(r.status, Literal["completed", "waiting", "failed", "cancelled", "running", "idle"])
    assert_type(r.session_id, str)
    assert_type(r.turn_id, str | None)
    assert_type(r.text, str)
    assert_type(r.pending, list[so.InputRequest])
    assert_type(r.outcomes, list[so.Outcome])
    assert_type(r.error, dict[str, Any] | None)
    request = r.pending[0]
    assert_type(request.kind, Literal["tool-approval", "question", "session-limit"])
    assert_type(request.status, Literal["pending", "settled", "expired", "withdrawn"])
    assert_type(request.action, so.Action | None)
    assert_type(request.options, list[so.Option])
    assert_type(request.child, so.ChildRef | None)
    r = await rt.generate(
        session_id=sid,
        approvals=[
            so.Decision(id=request.id, approved=True, reason="ok"),
            {"id": "req_2", "approved": False},
        ],
        auth=ALICE,
    )
    assert_type(r, so.GenerateResult)
    answer = so.InputResponse(request_id=request.id, option_id="approve")
    assert_type(await rt.respond(sid, [answer], principal=ALICE, resume=False), so.GenerateResult)
    assert_type(await rt.send(sid, "only the three-pack", turn_policy="queue"), so.GenerateResult)
    assert_type(await rt.schedule("support", "nightly report"), so.GenerateResult)
    assert_type(await rt.cancel(sid, "not needed", principal=ALICE), so.GenerateResult)
    assert_type(await rt.create_session("support", auth=ALICE), str)
    assert_type(await rt.pending(agent="support", kind="question", limit=10), list[so.InputRequest])
    assert_type(
        await rt.pending_page(PendingFilter(agent="support")), tuple[list[so.InputRequest], bool]
    )
    assert_type(await rt.sessions(agent="support"), list[SessionSummary])
    assert_type(await rt.expire_due(), int)
    assert_type(await rt.prune(older_than=90 * 86400.0, by=ALICE, limit=100), list[str])
    state = await rt.state(sid)
    assert_type(state, so.SessionState)
    assert_type(state.status, SessionStatus)
    assert_type(state.turn_status, TurnStatus | None)
    assert_type(state.usage, so.Usage)
    assert_type(state.pending_requests(), list[so.InputRequest])
    assert_type(
        state.messages, list[so.UserMessage | so.AssistantMessage | so.ToolResultMessage] | None
    )
    for message in state.messages or []:
        if message.kind == "tool":
            assert_type(message, so.ToolResultMessage)
        elif message.kind == "assistant":
            assert_type(message.tool_calls, list[so.ToolCall])
    assert_type(rt.events(sid, after=3), AsyncIterator[so.Event])
    async for event in rt.events(sid, follow=False):
        assert_type(event, so.Event)
        assert_type(event.seq, int)
        assert_type(event.data, dict[str, Any])
        if event.type == "turn.completed":
            pass
        if event.type == "turn.complete":  # type: ignore[comparison-overlap]  # misspelt
            pass
    assert_type(await rt.audit(sid), so.AuditEntries)
    assert_type((await rt.audit(sid))[0], so.AuditEntry)
    assert_type(await rt.verify_audit(), list[so.AuditProblem])
    assert_type(await rt.export_audit(io.StringIO()), int)
    assert_type(so.verify_audit_export(["{}"]), list[so.AuditProblem])
    assert_type(rt.now(), float)
    assert_type(rt.with_store("sqlite:///other.db"), so.Runtime)
    assert_type(await rt.work(concurrency=2), None)
    assert_type(await rt.open(), None)
    assert_type(await rt.close(), None)
    async with rt as opened:
        assert_type(opened, so.Runtime)
    await rt.send(sid, "x", turn_policy="later")  # type: ignore[arg-type]
    await rt.respond(sid, answer)  # type: ignore[arg-type]  # a list of them
    await rt.pending(kind="approval")  # type: ignore[arg-type]  # "tool-approval"


def _typed_sync_twins(rt: so.Runtime, sid: str) -> None:
    assert_type(rt.generate_sync("support", "hi", auth=ALICE), so.GenerateResult)
    assert_type(rt.respond_sync(sid, [{"request_id": "req_1", "text": "yes"}]), so.GenerateResult)
    assert_type(rt.send_sync(sid, "hi", turn_policy="steer"), so.GenerateResult)
    assert_type(rt.schedule_sync("support", "hi"), so.GenerateResult)
    assert_type(rt.cancel_sync(sid), so.GenerateResult)
    assert_type(rt.cancel_sync(sid, "why", turn_id="trn_1"), so.GenerateResult)
    assert_type(rt.create_session_sync("support"), str)
    assert_type(rt.pending_sync(session_id=sid), list[so.InputRequest])
    assert_type(rt.pending_page_sync(PendingFilter()), tuple[list[so.InputRequest], bool])
    assert_type(rt.sessions_sync(status="waiting"), list[SessionSummary])
    rt.sessions_sync(status="asleep")  # type: ignore[arg-type]  # not a session's status
    assert_type(
        rt.sessions_sync()[0].status, Literal["idle", "running", "waiting", "failed", "cancelled"]
    )
    assert_type(rt.prune_sync(older_than=3600, agent="support", reason="retention"), list[str])
    assert_type(rt.expire_due_sync(), int)
    assert_type(rt.state_sync(sid), so.SessionState)
    assert_type(rt.events_sync(sid, 0), list[so.Event])
    assert_type(rt.audit_sync(sid, limit=5), so.AuditEntries)
    assert_type(rt.verify_audit_sync(sid), list[so.AuditProblem])
    assert_type(rt.export_audit_sync(io.StringIO(), sid), int)
    assert_type(rt.close_sync(), None)
    with rt as opened:
        assert_type(opened, so.Runtime)
    rt.generate_sync("support", prompt=3)  # type: ignore[arg-type]
    rt.send_sync(sid, "x", turn_policy="later")  # type: ignore[arg-type]
    rt.state_sync()  # type: ignore[call-arg]
    rt.work_sync()  # type: ignore[attr-defined]  # a worker's loop has no twin


def _typed_errors(exc: Exception) -> None:
    if isinstance(exc, so.SessionError):
        assert_type(exc.session_id, str)
    if isinstance(exc, so.AnswerError):
        assert_type(exc.request_ids, list[str])
    if isinstance(exc, so.ModelError):
        assert_type(exc.usage, so.Usage | None)
    if isinstance(exc, so.RemoteError):
        assert_type(exc.status, int)
        assert_type(exc.code, str)
    if isinstance(exc, so.SignoffError):
        assert_type(exc.idempotency_key, str | None)
    if isinstance(exc, so.ApprovalRequired):
        assert_type(exc.call_id, str | None)
    for kind in (
        so.UnknownRequest,
        so.PartialAnswer,
        so.ConflictingAnswer,
        so.RequestClosed,
        so.NotAllowed,
        so.StaleAnswer,
        so.InvalidAnswer,
    ):
        assert issubclass(kind, so.AnswerError)
    for error in (so.UnknownSession, so.SessionExpired, so.SessionBusy, so.SessionLimitReached):
        assert issubclass(error, so.SessionError)
    for store_error in (
        so.SchemaVersionError,
        so.StoreGone,
        so.AppendConflict,
        so.LeaseLost,
        so.StoreUnavailable,
        so.StoreBusy,
        so.StoreDamaged,
    ):
        assert issubclass(store_error, so.StoreError)


def _typed_client(client: so.Client, sid: str) -> None:
    r = client.generate("support", "hi", idempotency_key="k")
    assert_type(r.status, str)
    assert_type(r.session_id, str)
    assert_type(r.pending, list[so.InputRequest])
    assert_type(client.send(sid, "hi", turn_policy="queue").text, str)
    assert_type(
        client.respond(sid, [so.InputResponse(request_id="r", option_id="approve")]).session_id, str
    )
    assert_type(client.cancel(sid).session_id, str)
    assert_type(client.state(sid), dict[str, Any])
    assert_type(client.pending(kind="question"), tuple[list[so.InputRequest], int])
    assert_type(client.sessions(), tuple[list[SessionSummary], int])
    assert_type(client.events(sid), list[so.Event])
    with client as same:
        assert_type(same, so.Client)
    client.send(sid, "hi", turn_policy="later")  # type: ignore[arg-type]
    client.pending(kind="approval")  # type: ignore[arg-type]
    client.pending(status="open")  # type: ignore[arg-type]
    client.generate(prompt=b"hi")  # type: ignore[arg-type]


async def _typed_async_client(client: so.AsyncClient, sid: str) -> None:
    assert_type((await client.generate("support", "hi")).session_id, str)
    assert_type((await client.send(sid, "hi")).text, str)
    assert_type(await client.state(sid), dict[str, Any])
    async for event in client.events(sid, follow=False):
        assert_type(event, so.Event)
    live = await client.session(sid)
    assert_type(live, so.LiveSession)
    await client.send(sid, "hi", turn_policy="later")  # type: ignore[arg-type]


def _typed_stores(url: str) -> None:
    assert_type(so.stores.open_store(url), Store)
    store: Store = SQLiteStore(url)
    assert_type(store, Store)
    assert_type(so.models.from_env(), Model)
    runtime = so.Runtime([], store=store, lease_ttl=30.0)
    assert_type(runtime, so.Runtime)
    assert_type(testing.sqlite_runtime(Path("."), testing.scripted_agent("a", [])), so.Runtime)
    assert_type(so.__version__, str)
    assert_type(so.SCHEMA_VERSION + 0, int)
    assert_type(so.MAX_TEXT_BYTES, int)
    assert_type(so.APP_PRINCIPAL, so.Principal)
    so.Runtime([], store=Path("x.db"))  # type: ignore[arg-type]
    testing.sqlite_runtime(Path("."), lease_tll=5.0)  # type: ignore[call-arg]  # misspelt
    testing.sqlite_runtime(Path("."), store="sqlite:///x.db")  # type: ignore[call-arg]
    testing.sqlite_runtime(Path("."), lease_ttl="30")  # type: ignore[arg-type]


_STATIC: tuple[Callable[..., object], ...] = (
    _typed_definitions,
    _typed_wrong_definitions,
    _typed_runtime,
    _typed_sync_twins,
    _typed_errors,
    _typed_client,
    _typed_async_client,
    _typed_stores,
)

# -- what runs -----------------------------------------------------------------------------------


def _refund_agent() -> so.Agent:
    return testing.scripted_agent(
        "support",
        [
            testing.call_tools(testing.call("issue_refund", order_id="1042", amount=5)),
            testing.reply("Refunded."),
        ],
        tools=[lookup_order, issue_refund],
    )


def test_the_typed_calls_return_what_their_types_say(tmp_path: Path) -> None:
    with testing.sqlite_runtime(tmp_path, _refund_agent()) as rt:
        r = rt.generate_sync("support", "Refund order 1042", auth=ALICE)
        assert isinstance(r, so.GenerateResult) and r.status == "waiting"
        (request,) = r.pending
        assert isinstance(request, so.InputRequest) and request.kind == "tool-approval"
        state = rt.state_sync(r.session_id)
        assert state.status == "waiting" and state.turn_status == "waiting"
        r = rt.respond_sync(
            r.session_id,
            [so.InputResponse(request_id=request.id, option_id="approve")],
            principal=ALICE,
        )
        assert r.status == "completed" and r.text == "Refunded."
        assert [type(o) for o in r.outcomes] == [so.Outcome]
        state = rt.state_sync(r.session_id)
        assert state.status == "idle" and state.turn_status == "completed"
        events = rt.events_sync(r.session_id)
        assert all(isinstance(e, so.Event) for e in events)
        assert events[-1].type == "session.waiting"
        assert rt.pending_sync() == [] and rt.expire_due_sync() == 0


async def test_the_async_calls_and_their_twins_agree(tmp_path: Path) -> None:
    async with testing.sqlite_runtime(tmp_path, _refund_agent()) as rt:
        r = await rt.generate("support", "Refund order 1042", auth=ALICE)
        assert r.status == "waiting"
        assert await rt.pending() == r.pending
        r = await rt.generate(
            session_id=r.session_id,
            approvals=[so.Decision(id=r.pending[0].id, approved=False)],
            auth=ALICE,
        )
        assert r.status == "completed"
        assert (await rt.state(r.session_id)).status == "idle"
        assert [e.seq async for e in rt.events(r.session_id, follow=False)][0] == 1


def test_sqlite_runtime_takes_the_keyword_arguments_of_runtime_but_store() -> None:
    """`testing.RuntimeOptions` types `sqlite_runtime`'s keyword arguments: they are all
    `Runtime`'s, so a new one of `Runtime` must be added there too."""
    taken = inspect.signature(so.Runtime).parameters.values()
    keywords = {p.name for p in taken if p.kind is p.KEYWORD_ONLY}
    assert set(testing.RuntimeOptions.__annotations__) == keywords


def test_the_wrong_uses_mypy_rejects_are_refused_when_run(tmp_path: Path) -> None:
    with pytest.raises(so.UsageError, match="not called"):
        so.tool(approval=so.always)(fx_quote)  # type: ignore[arg-type]
    with pytest.raises(so.UsageError, match="run_as"):
        so.tool(run_as="root")(fx_quote)  # type: ignore[call-overload]
    with pytest.raises(so.UsageError, match="approval must be"):
        so.ApprovalSpec(request="sometimes")  # type: ignore[arg-type]
    with testing.sqlite_runtime(tmp_path) as rt, pytest.raises(so.UsageError, match="kind must"):
        rt.pending_sync(kind="approval")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        lookup_order("1042")  # type: ignore[operator]
    assert len(_STATIC) == 8
