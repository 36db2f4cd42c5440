"""Every tool-approval example of the three seeds (eve, helix, anvil), translated to Python."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

import signoff as so
from signoff.server import TokenAuth, create_app
from signoff.testing import (
    Capture,
    ExecutionLog,
    ManualClock,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    store_contents,
    tool_results,
)

ALICE = so.Principal(authenticator="test", principal_id="alice", attributes={"tenant_id": "t1"})
MALLORY = so.Principal(authenticator="test", principal_id="mallory", attributes={"tenant_id": "t2"})


async def event_types(rt: so.Runtime, session_id: str) -> list[str]:
    return [e.type async for e in rt.events(session_id, follow=False)]


# -- eve: a policy that denies cross-tenant calls and gates large amounts -----------------------


def tenant_policy(ctx: so.ApprovalContext) -> so.ApprovalStatus:
    current = ctx.session.auth.current
    caller_tenant = None if current is None else current.attributes.get("tenant_id")
    if caller_tenant is None or caller_tenant != getattr(ctx.tool_input, "tenant_id", None):
        return so.Denied("Caller cannot access this tenant.")
    return "user-approval" if getattr(ctx.tool_input, "amount", 0) > 1000 else "not-applicable"


def eve_dict_policy(ctx: so.ApprovalContext) -> Any:
    """The seed's literal form: `{type: "denied", reason}` as a plain dict."""
    current = ctx.session.auth.current
    caller_tenant = None if current is None else current.attributes.get("tenant_id")
    if caller_tenant is None or caller_tenant != getattr(ctx.tool_input, "tenant_id", None):
        return {"type": "denied", "reason": "Caller cannot access this tenant."}
    return "user-approval" if getattr(ctx.tool_input, "amount", 0) > 1000 else "not-applicable"


def refund_charge_tool(log: ExecutionLog, approval: Any) -> so.Tool:
    @log.tool(approval=approval)
    async def refund_charge(tenant_id: str, charge_id: str, amount: float) -> dict[str, Any]:
        """Refund a charge."""
        return {"refunded": amount, "charge": charge_id}

    return refund_charge


@pytest.mark.parametrize("policy", [tenant_policy, eve_dict_policy])
async def test_eve_tenant_policy_denies_cross_tenant_call_with_reason(
    tmp_path: Path, policy: Any
) -> None:
    log = ExecutionLog()
    seen = Capture(reply("I cannot refund that charge."))
    agent = scripted_agent(
        "billing",
        [call_tools(call("refund_charge", tenant_id="t1", charge_id="ch_1", amount=50)), seen],
        tools=[refund_charge_tool(log, policy)],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("billing", prompt="refund ch_1", auth=MALLORY)
        assert r.status == "completed"
        assert r.pending == []
        assert log.count() == 0
        (result,) = tool_results(seen.last)
        assert result.is_error
        assert result.content["denied"] is True
        assert result.content["reason"] == "Caller cannot access this tenant."
        assert "input.requested" not in await event_types(rt, r.session_id)


async def test_eve_tenant_policy_denies_anonymous_caller(tmp_path: Path) -> None:
    log = ExecutionLog()
    seen = Capture()
    agent = scripted_agent(
        "billing",
        [call_tools(call("refund_charge", tenant_id="t1", charge_id="ch_1", amount=5)), seen],
        tools=[refund_charge_tool(log, tenant_policy)],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("billing", prompt="refund ch_1")
        assert r.status == "completed"
        assert log.count() == 0
        assert tool_results(seen.last)[0].content["reason"] == "Caller cannot access this tenant."


async def test_eve_tenant_policy_asks_a_person_above_the_threshold(tmp_path: Path) -> None:
    log = ExecutionLog()
    seen = Capture(reply("Refunded."))
    agent = scripted_agent(
        "billing",
        [call_tools(call("refund_charge", tenant_id="t1", charge_id="ch_9", amount=2500)), seen],
        tools=[refund_charge_tool(log, tenant_policy)],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("billing", prompt="refund ch_9", auth=ALICE)
        assert r.status == "waiting"
        (req,) = r.pending
        assert req.kind == "tool-approval"
        assert req.tool_name == "refund_charge"
        assert req.input == {"tenant_id": "t1", "charge_id": "ch_9", "amount": 2500.0}
        assert req.requested_by is not None and req.requested_by.same_as(ALICE)
        assert log.count() == 0
        r = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=req.id, approved=True)], auth=ALICE
        )
        assert r.status == "completed"
        assert r.text == "Refunded."
        assert log.count("refund_charge") == 1
        assert tool_results(seen.last)[0].content == {"refunded": 2500.0, "charge": "ch_9"}


async def test_eve_tenant_policy_runs_small_same_tenant_refund(tmp_path: Path) -> None:
    log = ExecutionLog()
    agent = scripted_agent(
        "billing",
        [
            call_tools(call("refund_charge", tenant_id="t1", charge_id="ch_2", amount=1000)),
            reply("ok"),
        ],
        tools=[refund_charge_tool(log, tenant_policy)],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("billing", prompt="refund ch_2", auth=ALICE)
        assert r.status == "completed"
        assert log.count() == 1
        assert log.executions[0].principal_id == "alice"
        assert "input.requested" not in await event_types(rt, r.session_id)


# -- helix: issue_refund with needsApproval: amount > 100 ----------------------------------------


def helix_refund(log: ExecutionLog) -> so.Tool:
    @log.tool(approval=lambda input: input.amount > 100)
    async def issue_refund(order_id: str, amount: float, reason: str) -> dict[str, float]:
        """Refund an order in full or in part. Amounts over 100 need a human to approve."""
        return {"refunded": amount}

    return issue_refund


REFUND_180 = call("issue_refund", order_id="1042", amount=180, reason="Item arrived broken")


async def test_helix_pause_then_approve(tmp_path: Path) -> None:
    log = ExecutionLog()
    seen = Capture(reply("Done. I've refunded 180.00 to the original payment method."))
    agent = scripted_agent(
        "support-agent",
        [call_tools(REFUND_180, text="Let me get that approved."), seen],
        tools=[helix_refund(log)],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support-agent", prompt="Refund order 1042, the item arrived broken.")
        assert r.status == "waiting"
        assert r.text == "Let me get that approved."  # what the model said before it asked
        (pending,) = r.pending
        assert pending.id.startswith("req_")
        assert pending.tool_name == "issue_refund"
        assert pending.call_id is not None
        # the validated input the tool would run with
        assert pending.input == {
            "order_id": "1042",
            "amount": 180.0,
            "reason": "Item arrived broken",
        }
        assert log.count() == 0
        resumed = await rt.generate(
            session_id=r.session_id,
            approvals=[so.Decision(id=pending.id, approved=True, reason="ok")],
        )
        assert resumed.status == "completed"
        assert resumed.text.endswith("Done. I've refunded 180.00 to the original payment method.")
        assert [e.input for e in log.executions] == [pending.input]
        (result,) = tool_results(seen.last)
        assert result.call_id == pending.call_id
        # helix: the approval's optional reason reaches the model beside the result.
        assert result.content == {
            "result": {"refunded": 180.0},
            "approval": {"approved": True, "by": None, "reason": "ok"},
        }
        assert not result.is_error


async def test_helix_deny_with_reason_reaches_the_model(tmp_path: Path) -> None:
    log = ExecutionLog()
    seen = Capture(reply("Sorry, I could not refund that."))
    agent = scripted_agent(
        "support-agent", [call_tools(REFUND_180), seen], tools=[helix_refund(log)]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support-agent", prompt="Refund order 1042")
        resumed = await rt.generate(
            session_id=r.session_id,
            approvals=[so.Decision(id=r.pending[0].id, approved=False, reason="Only the 3-pack.")],
        )
        assert resumed.status == "completed"
        assert log.count() == 0  # a denied tool never runs
        (result,) = tool_results(seen.last)
        assert result.is_error
        assert result.call_id == r.pending[0].call_id
        assert result.content["denied"] is True
        assert result.content["reason"] == "Only the 3-pack."


async def test_helix_small_amount_runs_without_approval(tmp_path: Path) -> None:
    log = ExecutionLog()
    agent = scripted_agent(
        "support-agent",
        [call_tools(call("issue_refund", order_id="7", amount=40, reason="late")), reply("Done.")],
        tools=[helix_refund(log)],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support-agent", prompt="Refund order 7")
        assert r.status == "completed"
        assert r.text == "Done."
        assert log.count() == 1
        assert await rt.pending() == []
        types = await event_types(rt, r.session_id)
        assert "input.requested" not in types
        assert "turn.waiting" not in types


async def test_helix_several_gated_calls_in_one_step_each_get_an_entry(tmp_path: Path) -> None:
    log = ExecutionLog()
    seen = Capture(reply("Both handled."))
    a = call("issue_refund", order_id="1", amount=150, reason="a")
    b = call("issue_refund", order_id="2", amount=40, reason="b")  # small: runs now
    c = call("issue_refund", order_id="3", amount=900, reason="c")
    agent = scripted_agent("support-agent", [call_tools(a, b, c), seen], tools=[helix_refund(log)])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support-agent", prompt="Refund 1, 2 and 3")
        assert r.status == "waiting"
        assert [p.input["order_id"] for p in r.pending] == ["1", "3"]
        assert len({p.id for p in r.pending}) == 2
        assert len({p.call_id for p in r.pending}) == 2
        assert [e.input["order_id"] for e in log.executions] == ["2"]
        # one call must decide all of them
        with pytest.raises(so.PartialAnswer) as info:
            await rt.generate(
                session_id=r.session_id, approvals=[so.Decision(id=r.pending[0].id, approved=True)]
            )
        assert info.value.request_ids == [r.pending[1].id]
        resumed = await rt.generate(
            session_id=r.session_id,
            approvals=[
                so.Decision(id=r.pending[0].id, approved=True),
                so.Decision(id=r.pending[1].id, approved=False, reason="too much"),
            ],
        )
        assert resumed.status == "completed"
        assert sorted(e.input["order_id"] for e in log.executions) == ["1", "2"]
        results = {
            m.content.get("refunded", m.content.get("reason")) for m in tool_results(seen.last)
        }
        assert results == {150.0, 40.0, "too much"}


async def test_helix_async_predicate(tmp_path: Path) -> None:
    log = ExecutionLog()
    seen_inputs: list[Any] = []

    async def needs_approval(input: Any) -> bool:
        seen_inputs.append(input)
        return bool(input.amount > 100)

    @log.tool(approval=needs_approval)
    async def issue_refund(order_id: str, amount: float, reason: str) -> dict[str, float]:
        """Refund an order."""
        return {"refunded": amount}

    agent = scripted_agent(
        "support-agent",
        [
            call_tools(REFUND_180, call("issue_refund", order_id="5", amount="20", reason="x")),
            reply("ok"),
        ],
        tools=[issue_refund],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support-agent", prompt="two refunds")
        assert r.status == "waiting"
        assert [p.input["order_id"] for p in r.pending] == ["1042"]
        # the predicate saw validated input: "20" became the float 20.0
        assert [i.amount for i in seen_inputs] == [180.0, 20.0]
        assert all(isinstance(i.amount, float) for i in seen_inputs)
        assert log.count() == 1


# -- anvil: requestApproval inside the tool; the decision becomes the call's result ----------------


def anvil_refund(log: ExecutionLog, *, raise_directly: bool = False) -> so.Tool:
    @log.tool
    async def issue_refund(ctx: so.ToolContext, order_id: str, amount: float) -> str:
        """Issue a refund for an order."""
        if raise_directly:
            raise so.ApprovalRequired({"action": "refund", "order_id": order_id, "amount": amount})
        ctx.request_approval({"action": "refund", "order_id": order_id, "amount": amount})

    return issue_refund


@pytest.mark.parametrize("raise_directly", [False, True])
async def test_anvil_request_approval_approved(tmp_path: Path, raise_directly: bool) -> None:
    log = ExecutionLog()
    seen = Capture(reply("Refund approved and issued."))
    agent = scripted_agent(
        "anvil",
        [call_tools(call("issue_refund", order_id="order-99", amount=42.5)), seen],
        tools=[anvil_refund(log, raise_directly=raise_directly)],
    )
    reviewer = so.Principal(authenticator="test", principal_id="alice@example.com")
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("anvil", prompt="refund order-99", auth=reviewer)
        assert r.status == "waiting"
        (req,) = r.pending
        assert req.source == "tool"
        assert req.payload == {"action": "refund", "order_id": "order-99", "amount": 42.5}
        assert log.count() == 1  # the body ran up to request_approval
        resumed = await rt.respond(
            r.session_id,
            [
                so.InputResponse(
                    request_id=req.id,
                    option_id="approve",
                    text="Verified with customer. Proceed.",
                    value={"reviewer": "alice@example.com"},
                )
            ],
            principal=reviewer,
        )
        assert resumed.status == "completed"
        assert log.count() == 1  # the tool body is not re-run
        (result,) = tool_results(seen.last)
        assert not result.is_error
        assert result.call_id == req.call_id
        assert result.content["approved"] is True
        assert result.content["reason"] == "Verified with customer. Proceed."
        assert result.content["value"] == {"reviewer": "alice@example.com"}
        assert result.content["by"]["principal_id"] == "alice@example.com"


async def test_anvil_request_approval_rejected(tmp_path: Path) -> None:
    log = ExecutionLog()
    seen = Capture(reply("The refund was rejected: amount exceeds policy limit."))
    agent = scripted_agent(
        "anvil",
        [call_tools(call("issue_refund", order_id="order-99", amount=5000)), seen],
        tools=[anvil_refund(log)],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("anvil", prompt="refund order-99")
        resumed = await rt.generate(
            session_id=r.session_id,
            approvals=[
                so.Decision(
                    id=r.pending[0].id, approved=False, reason="Amount exceeds policy limit."
                )
            ],
        )
        assert resumed.status == "completed"
        assert log.count() == 1
        (result,) = tool_results(seen.last)
        # the model receives {approved: false, reason} as the tool result
        assert result.content["approved"] is False
        assert result.content["reason"] == "Amount exceeds policy limit."
        assert "seq" not in result.content


async def test_anvil_suspended_run_resumes_in_a_new_runtime(tmp_path: Path) -> None:
    log = ExecutionLog()

    def make_agent() -> so.Agent:
        return scripted_agent(
            "anvil",
            [call_tools(call("issue_refund", order_id="o1", amount=1)), reply("done")],
            tools=[anvil_refund(log)],
        )

    async with sqlite_runtime(tmp_path, make_agent()) as rt:
        r = await rt.generate("anvil", prompt="refund o1")
        assert r.status == "waiting"
    async with sqlite_runtime(tmp_path, make_agent()) as rt2:
        (req,) = await rt2.pending()
        resumed = await rt2.generate(
            session_id=r.session_id, approvals=[so.Decision(id=req.id, approved=True)]
        )
        assert resumed.status == "completed"
        assert log.count() == 1


# -- anvil: toolPolicy as a guardrail for tools you cannot modify --------------------------------


async def test_anvil_tool_policy_guardrail(tmp_path: Path) -> None:
    log = ExecutionLog()

    @log.tool
    async def lookup_order(order_id: str) -> dict[str, str]:
        """Look up an order."""
        return {"order_id": order_id, "status": "delivered"}

    @log.tool
    async def issue_refund(order_id: str, amount: float) -> dict[str, float]:
        """Issue a refund for an order."""
        return {"refunded": amount}

    @log.tool
    async def delete_account(user_id: str) -> str:
        """Delete an account."""
        return "deleted"

    seen = Capture(reply("done"))
    agent = scripted_agent(
        "anvil",
        [
            call_tools(
                call("lookup_order", order_id="o1"),
                call("issue_refund", order_id="o1", amount=10),
                call("delete_account", user_id="u1"),
            ),
            seen,
        ],
        tools=[lookup_order, issue_refund, delete_account],
        guardrails=[so.tool_policy(require_approval=["issue_refund", "delete_account"])],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("anvil", prompt="refund o1 and delete u1")
        assert r.status == "waiting"
        assert [p.tool_name for p in r.pending] == ["issue_refund", "delete_account"]
        assert {p.source for p in r.pending} == {"guardrail"}
        assert [e.tool_name for e in log.executions] == ["lookup_order"]
        resumed = await rt.generate(
            session_id=r.session_id,
            approvals=[
                so.Decision(id=r.pending[0].id, approved=True),
                so.Decision(id=r.pending[1].id, approved=False, reason="not today"),
            ],
        )
        assert resumed.status == "completed"
        assert [e.tool_name for e in log.executions] == ["lookup_order", "issue_refund"]
        by_tool = {m.tool_name: m for m in tool_results(seen.last)}
        assert by_tool["delete_account"].content["reason"] == "not today"
        assert by_tool["issue_refund"].content == {"refunded": 10.0}


async def test_tool_policy_deny_list(tmp_path: Path) -> None:
    log = ExecutionLog()

    @log.tool
    async def drop_table(name: str) -> str:
        """Drop a table."""
        return "dropped"

    seen = Capture()
    agent = scripted_agent(
        "dba",
        [call_tools(call("drop_table", name="users")), seen],
        tools=[drop_table],
        guardrails=[so.tool_policy(deny=["drop_table"])],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("dba", prompt="drop users")
        assert r.status == "completed"
        assert log.count() == 0
        assert (
            tool_results(seen.last)[0].content["reason"]
            == "drop_table is not allowed for this agent"
        )


async def test_guardrail_is_stricter_than_tool_policy(tmp_path: Path) -> None:
    """A guardrail asks even when the tool's own policy would approve automatically."""
    log = ExecutionLog()

    @log.tool(approval=lambda ctx: so.Approved("fine by the tool"))
    async def issue_refund(order_id: str) -> str:
        """Refund."""
        return "ok"

    agent = scripted_agent(
        "a",
        [call_tools(call("issue_refund", order_id="1")), reply("ok")],
        tools=[issue_refund],
        guardrails=[so.tool_policy(require_approval=["issue_refund"])],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert r.status == "waiting"
        assert log.count() == 0


# -- eve: skip approval for schedule-dispatched turns (the app principal) --------------------------


def schedule_skip(ctx: so.ApprovalContext) -> so.ApprovalStatus:
    auth = ctx.session.auth.current
    if (
        auth is not None
        and auth.authenticator == so.APP_PRINCIPAL.authenticator
        and auth.principal_id == so.APP_PRINCIPAL.principal_id
        and auth.principal_type == so.APP_PRINCIPAL.principal_type
    ):
        return "not-applicable"
    return "user-approval"


async def test_eve_schedule_turn_skips_approval_but_a_person_is_asked(tmp_path: Path) -> None:
    log = ExecutionLog()
    contexts: list[so.ApprovalContext] = []

    def policy(ctx: so.ApprovalContext) -> so.ApprovalStatus:
        contexts.append(ctx)
        return schedule_skip(ctx)

    @log.tool(approval=policy)
    async def refund_charge(charge_id: str, amount: float) -> str:
        """Refund a charge."""
        return "refunded"

    agent = scripted_agent(
        "billing",
        [
            call_tools(call("refund_charge", charge_id="c1", amount=5)),
            reply("scheduled refund done"),
            call_tools(call("refund_charge", charge_id="c2", amount=5)),
            reply("manual refund done"),
        ],
        tools=[refund_charge],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("billing", prompt="nightly refunds", auth=so.APP_PRINCIPAL)
        assert r.status == "completed"
        assert log.count() == 1
        assert log.executions[0].principal_id == so.APP_PRINCIPAL.principal_id
        # a person later resumes the schedule-started session: current changes, initiator stays
        r = await rt.generate(session_id=r.session_id, prompt="refund c2 too", auth=ALICE)
        assert r.status == "waiting"
        assert log.count() == 1
        first, second = contexts
        assert first.session.auth.current == so.APP_PRINCIPAL
        assert second.session.auth.current == ALICE
        assert second.session.auth.initiator == so.APP_PRINCIPAL
        r = await rt.generate(
            session_id=r.session_id,
            approvals=[so.Decision(id=r.pending[0].id, approved=True)],
            auth=ALICE,
        )
        assert r.status == "completed"
        assert [e.principal_id for e in log.executions] == ["signoff:app", "alice"]


async def test_app_principal_lookalike_is_still_asked(tmp_path: Path) -> None:
    log = ExecutionLog()

    @log.tool(approval=schedule_skip)
    async def refund_charge(charge_id: str) -> str:
        """Refund a charge."""
        return "refunded"

    impostor = so.Principal(authenticator="app", principal_id="signoff:app", principal_type="user")
    agent = scripted_agent(
        "billing",
        [call_tools(call("refund_charge", charge_id="c1")), reply("x")],
        tools=[refund_charge],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("billing", prompt="refund", auth=impostor)
        assert r.status == "waiting"
        before = await store_contents(rt.store, r.session_id)
        assert before.pending == [r.pending[0].id]
        assert log.count() == 0


# -- eve seed audit (seeds/000_0fe8bf378df9c307.txt): statements not covered above ---------------


def _alice_only(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
    who = ctx.response.principal
    if who is not None and who.same_as(ALICE):
        return so.Allowed()
    return so.Rejected("Only Alice may settle refunds.")


async def test_eve_a_refused_response_keeps_the_turn_held_on_input(store_url: str) -> None:
    """ "When the policy refuses a response ... `approval.candidate` with `outcome: "pending"`,
    then ... `"rejected"` and the policy's `reason`, then `turn.waiting` with `on: "input"` for
    the same `turnId`. It does not emit `session.waiting`"; an allowed one then settles."""
    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=_alice_only)
    agent = scripted_agent(
        "billing",
        [call_tools(call("refund_charge", tenant_id="t1", charge_id="c", amount=5)), reply("ok")],
        tools=[refund_charge_tool(log, spec)],
    )
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund", auth=ALICE)
        (req,) = r.pending
        head = await rt.store.head(r.session_id) or 0
        refused = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=req.id, option_id="approve")],
            principal=MALLORY,
        )
        assert refused.status == "waiting" and [p.id for p in refused.pending] == [req.id]
        after = [e async for e in rt.events(r.session_id, head, follow=False)]
        assert [(e.type, e.data.get("outcome"), e.data.get("on")) for e in after] == [
            ("approval.candidate", "pending", None),
            ("approval.candidate", "rejected", None),
            ("turn.waiting", None, "input"),
        ]
        assert after[1].data["reason"] == "Only Alice may settle refunds."
        assert {e.turn_id for e in after} == {req.turn_id}
        assert log.count() == 0
        # the prompt stays answerable: submitting is not settling, the settlement is recorded
        head = await rt.store.head(r.session_id) or 0
        done = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=req.id, option_id="approve")],
            principal=ALICE,
        )
        assert done.status == "completed"
        assert done.turn_id == req.turn_id  # the turn resumed under the same id
        types = [e.type async for e in rt.events(r.session_id, head, follow=False)]
        assert types[:3] == ["approval.candidate", "approval.settled", "input.resolved"]
        assert log.count() == 1


async def test_eve_cancelling_the_turn_stops_a_policys_async_work(tmp_path: Path) -> None:
    """ "Use `abortSignal` for asynchronous policy work so cancellation stops it with the turn":
    a policy waiting on slow work sees the signal when the turn is cancelled, and the call it
    was deciding never runs."""
    log = ExecutionLog()
    started = asyncio.Event()
    saw_abort: list[bool] = []

    async def slow_policy(ctx: so.ApprovalContext) -> so.ApprovalStatus:
        started.set()
        try:
            await asyncio.wait_for(ctx.abort_signal.wait(), timeout=5)
        except TimeoutError:
            saw_abort.append(False)
            return "not-applicable"
        saw_abort.append(True)
        return "not-applicable"  # would run the call, were the turn not cancelled

    seen = Capture(reply("never read"))
    agent = scripted_agent(
        "billing",
        [call_tools(call("refund_charge", tenant_id="t1", charge_id="c", amount=5)), seen],
        tools=[refund_charge_tool(log, slow_policy)],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid = await rt.create_session("billing", auth=ALICE)
        turn = asyncio.create_task(rt.send(sid, "refund c", principal=ALICE))
        await asyncio.wait_for(started.wait(), timeout=5)
        cancelled = await rt.cancel(sid, principal=ALICE)
        assert cancelled.status == "cancelled"
        assert (await asyncio.wait_for(turn, timeout=5)).status == "cancelled"
        assert saw_abort == [True]
        assert log.count() == 0
        assert seen.conversations == []
        types = [e.type async for e in rt.events(sid, follow=False)]
        assert "tool.started" not in types and types[-2:] == ["turn.cancelled", "session.waiting"]


async def test_eve_a_message_answers_a_runtime_limit_prompt_before_earlier_requests(
    store_url: str,
) -> None:
    """ "A follow-up message answers only the first open request: a runtime limit continuation
    prompt if one is open, and otherwise the request eve asked for first"."""
    log = ExecutionLog()

    @log.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    @log.tool
    async def lookup(order_id: str) -> str:
        """Look an order up."""
        return "shipped"

    billing = scripted_agent(
        "billing",
        [call_tools(call("issue_refund", order_id="1")), reply("Refunded.")],
        tools=[issue_refund],
    )
    spent = so.Usage(input_tokens=50, output_tokens=0)
    orders = scripted_agent(
        "orders",
        [call_tools(call("lookup", order_id="3"), usage=spent), reply("Order 3 shipped.")],
        tools=[lookup],
        limits=so.Limits(max_tokens=40),
    )
    parent = scripted_agent(
        "support",
        [
            call_tools(
                call("billing", id="d1", message="refund 1"),
                call("orders", id="d2", message="where is 3?"),
            ),
            reply("All done."),
        ],
        tools=[so.delegate("billing"), so.delegate("orders")],
        limits=so.Limits(max_tokens=1000),
    )
    async with so.Runtime([parent, billing, orders], store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 1, and where is 3?", auth=ALICE)
        assert r.status == "waiting"
        approval, limit = r.pending  # in the order they were asked
        assert (approval.kind, limit.kind) == ("tool-approval", "session-limit")
        # "continue" is no option of the approval (asked first): it answers the limit prompt
        r = await rt.send(r.session_id, "continue", principal=ALICE)
        assert [p.id for p in r.pending] == [approval.id]
        assert log.count("lookup") == 1 and log.count("issue_refund") == 0
        # with the limit prompt answered, the approval is the first open request
        r = await rt.send(r.session_id, "approve", principal=ALICE)
        assert r.status == "completed" and r.text == "All done."
        assert log.count("issue_refund") == 1


@pytest.mark.parametrize("approved", [True, False])
async def test_eve_a_gated_workflow_tool_does_not_start_its_workflow_while_it_waits(
    tmp_path: Path, approved: bool
) -> None:
    """ "A call waiting for approval does not start its workflow, and a call denied by a policy
    or person never runs": no journaled step of a gated workflow tool runs before its approval."""
    steps: list[str] = []

    def charge(amount: float) -> str:
        steps.append("charge")
        return f"charged {amount}"

    @so.tool(approval=so.always())
    async def checkout(ctx: so.ToolContext, amount: float) -> str:
        """Charge the card, then confirm."""
        receipt = await ctx.step("charge", charge, amount)
        answer = await ctx.ask("Email the receipt?", options=["yes", "no"])
        return f"{receipt}, email: {answer.value}"

    agent = scripted_agent(
        "shop", [call_tools(call("checkout", amount=12)), reply("ok")], tools=[checkout]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("shop", prompt="check out", auth=ALICE)
        (req,) = r.pending
        assert req.kind == "tool-approval" and steps == []
        types = [e.type async for e in rt.events(r.session_id, follow=False)]
        assert "tool.started" not in types and "tool.step" not in types
        option = "approve" if approved else "cancel"
        r = await rt.respond(
            r.session_id, [so.InputResponse(request_id=req.id, option_id=option)], principal=ALICE
        )
        if not approved:
            assert r.status == "completed" and steps == []
            return
        assert r.status == "waiting" and steps == ["charge"]
        (question,) = r.pending
        assert question.kind == "question"
        r = await rt.send(r.session_id, "yes", principal=ALICE)
        assert r.status == "completed" and steps == ["charge"]  # the step replayed, not re-run


async def test_eve_a_policy_sees_the_session_a_tool_body_sees(tmp_path: Path) -> None:
    """ "`session` in `approval` has the same shape as `ctx.session` in `execute`: `id`, `auth`,
    `turn`, and an optional `parent`"."""
    from_policy: list[so.SessionInfo] = []
    from_body: list[so.SessionInfo] = []

    def policy(ctx: so.ApprovalContext) -> so.ApprovalStatus:
        from_policy.append(ctx.session)
        return "not-applicable"

    @so.tool(approval=policy)
    async def refund_charge(ctx: so.ToolContext, charge_id: str) -> str:
        """Refund a charge."""
        from_body.append(ctx.session)
        return "refunded"

    agent = scripted_agent(
        "billing",
        [call_tools(call("refund_charge", charge_id="c1")), reply("ok")],
        tools=[refund_charge],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("billing", prompt="refund", auth=ALICE)
        assert r.status == "completed"
    (seen_by_policy,) = from_policy
    assert from_body == [seen_by_policy]
    assert (seen_by_policy.id, seen_by_policy.turn) == (r.session_id, r.turn_id)
    assert seen_by_policy.auth == so.SessionAuth(current=ALICE, initiator=ALICE)
    assert seen_by_policy.parent is None


@pytest.mark.parametrize("resume", [False, True])
async def test_eve_the_next_approval_of_a_batch_is_answerable_while_the_first_runs(
    tmp_path: Path, resume: bool
) -> None:
    """ "You can answer while a turn is running, such as the second approval of a batch while
    the first answer is still settling": the answer is accepted at once; a call that would also
    drive the turn gives up waiting for the busy drive after `lease_wait` and says `running`."""
    running = asyncio.Event()
    release = asyncio.Event()
    ran: list[str] = []

    @so.tool(approval=so.always())
    async def refund(order_id: str) -> str:
        """Refund an order."""
        ran.append(order_id)
        if order_id == "1":
            running.set()
            await asyncio.wait_for(release.wait(), timeout=5)
        return f"refunded {order_id}"

    seen = Capture(reply("Both refunded."))
    agent = scripted_agent(
        "billing",
        [call_tools(call("refund", order_id="1"), call("refund", order_id="2")), seen],
        tools=[refund],
    )
    async with sqlite_runtime(tmp_path, agent, lease_wait=0.2) as rt:
        r = await rt.generate("billing", prompt="refund 1 and 2", auth=ALICE)
        first, second = r.pending
        sid = r.session_id
        answering_first = asyncio.create_task(
            rt.respond(
                sid, [so.InputResponse(request_id=first.id, option_id="approve")], principal=ALICE
            )
        )
        await asyncio.wait_for(running.wait(), timeout=5)  # the first approved call is running
        answered = await asyncio.wait_for(
            rt.respond(
                sid,
                [so.InputResponse(request_id=second.id, option_id="approve")],
                principal=ALICE,
                resume=resume,
            ),
            timeout=5,
        )
        assert answered.status == "running"  # the first approved call is still running
        assert (await rt.state(sid)).pending_requests() == []
        assert answered.outcomes == [
            so.Outcome(request_id=second.id, outcome="approved", applied=True)
        ]
        release.set()
        # the drive the first answer started picks up the second one: no call needed to resume
        done = await asyncio.wait_for(answering_first, timeout=5)
        assert done.status == "completed" and done.text == "Both refunded."
        assert sorted(ran) == ["1", "2"]
        assert sorted(m.content for m in tool_results(seen.last)) == ["refunded 1", "refunded 2"]


# -- helix (002): the tool-approval guide, statement by statement ---------------------------------


async def test_helix_an_approval_waits_as_long_as_its_session_is_kept(store_url: str) -> None:
    """helix: "Approvals have no time limit of their own, so on a session with no `ttl` a pending
    approval never lapses"; "Sessions do not expire unless the agent sets a `ttl`"."""
    log = ExecutionLog()
    clock = ManualClock()

    def make_agent() -> so.Agent:
        return scripted_agent(
            "support-agent", [call_tools(REFUND_180), reply("Refunded.")], tools=[helix_refund(log)]
        )

    async with so.Runtime([make_agent()], store=store_url, clock=clock) as rt:
        r = await rt.generate("support-agent", prompt="Refund order 1042")
        (req,) = r.pending
        assert req.expires_at is None
    clock.advance(400 * 86_400.0)  # over a year, the platform store's 30 days long past
    async with so.Runtime([make_agent()], store=store_url, clock=clock) as rt2:
        assert await rt2.expire_due() == 0
        assert [p.id for p in await rt2.pending()] == [req.id]
        assert (await rt2.state(r.session_id)).status == "waiting"
        done = await rt2.generate(
            session_id=r.session_id, approvals=[so.Decision(id=req.id, approved=True)]
        )
        assert done.status == "completed" and done.text == "Refunded."
        assert log.count("issue_refund") == 1


async def test_helix_the_persons_note_goes_as_the_next_calls_prompt(tmp_path: Path) -> None:
    """helix: "If the person also has something to say, send it as the next call's `prompt`":
    the model reads the denial with its reason, then the note."""
    log = ExecutionLog()
    told = Capture(reply("I could not refund it."))
    noted = Capture(reply("Understood, a replacement then."))
    agent = scripted_agent(
        "support-agent", [call_tools(REFUND_180), told, noted], tools=[helix_refund(log)]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support-agent", prompt="Refund order 1042")
        resumed = await rt.generate(
            session_id=r.session_id,
            approvals=[so.Decision(id=r.pending[0].id, approved=False, reason="policy")],
        )
        assert resumed.status == "completed" and resumed.text == "I could not refund it."
        after = await rt.generate(session_id=r.session_id, prompt="Send a replacement instead.")
        assert after.status == "completed"
        assert after.text == "Understood, a replacement then."
        assert log.count() == 0
        conversation = noted.last
        assert conversation[-1] == so.UserMessage(text="Send a replacement instead.")
        (denial,) = tool_results(conversation)
        assert denial.content["denied"] is True and denial.content["reason"] == "policy"


def helix_app(store_url: str, *agents: so.Agent) -> Any:
    alice = so.Principal(authenticator="token", principal_id="alice")
    runtime = so.Runtime(list(agents), store=store_url)
    return create_app(
        runtime, auth=TokenAuth({"alice-token": alice}), sweep_every=None, close_runtime=True
    )


async def test_helix_a_complete_approval_endpoint(store_url: str) -> None:
    """helix: "Two functions: one to chat, one to decide": the chat call answers `sessionId`,
    `status`, `text` and the pending approvals; the decide call takes at least one decision
    `{id, approved, reason?}`, and the same decision again (a double click) is a no-op."""
    log = ExecutionLog()
    agent = scripted_agent(
        "support-agent",
        [call_tools(REFUND_180, text="Let me get that approved."), reply("Done.")],
        tools=[helix_refund(log)],
    )
    app = helix_app(store_url, agent)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://t",
            headers={"Authorization": "Bearer alice-token"},
        ) as c:
            chat = await c.post(
                "/v1/sessions", json={"agent": "support-agent", "message": "Refund order 1042"}
            )
            assert chat.status_code == 201, chat.text
            body = chat.json()
            sid = body["session_id"]
            assert (body["status"], body["text"]) == ("waiting", "Let me get that approved.")
            (pending,) = body["pending"]
            action = pending["action"]
            assert action["tool_name"] == "issue_refund" and action["call_id"]
            assert action["input"] == {
                "order_id": "1042",
                "amount": 180.0,
                "reason": "Item arrived broken",
            }
            url = f"/v1/sessions/{sid}/approvals"
            empty = await c.post(url, json={"approvals": []})
            assert empty.status_code == 422, empty.text
            assert empty.json()["error"]["code"] == "invalid_request"
            assert (await c.get(f"/v1/sessions/{sid}")).json()["status"] == "waiting"
            decision = {"approvals": [{"id": pending["id"], "approved": True, "reason": "ok"}]}
            decided = await c.post(url, json=decision)
            assert decided.status_code == 200, decided.text
            assert decided.json()["session_id"] == sid
            assert decided.json()["status"] == "completed"
            assert decided.json()["text"].endswith("Done.")
            assert decided.json()["pending"] == []
            again = await c.post(url, json=decision)
            assert again.status_code == 200, again.text
            assert [o["applied"] for o in again.json()["outcomes"]] == [False]
            assert again.json()["status"] == "completed"
    assert log.count("issue_refund") == 1


async def test_helix_dashboard_tools_view_shows_each_approval_setting(tmp_path: Path) -> None:
    """helix: "The Tools view ... shows each tool's approval setting: Always, Conditional, or
    Never"."""

    @so.tool(approval=True)
    async def close_account(account_id: str) -> str:
        """Close an account."""
        return "closed"

    @so.tool
    async def lookup_order(order_id: str) -> str:
        """Look up an order."""
        return "delivered"

    agent = scripted_agent(
        "support-agent",
        [reply("hi")],
        tools=[helix_refund(ExecutionLog()), close_account, lookup_order],
    )
    app = helix_app(f"sqlite:///{tmp_path / 'state.db'}", agent)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://t",
            headers={"Authorization": "Bearer alice-token"},
        ) as c:
            page = await c.get("/_signoff/tools")
            assert page.status_code == 200
    badges = {
        name: label
        for label, name in (
            ("Always", "close_account"),
            ("Conditional", "issue_refund"),
            ("Never", "lookup_order"),
        )
    }
    rows = page.text.split('<td class="mono">')[1:]
    shown = {row.split("</td>", 1)[0]: row for row in rows}
    for name, label in badges.items():
        assert f">{label}</span>" in shown[name], name


async def test_helix_a_run_waiting_on_approval_shows_as_awaiting_approval(tmp_path: Path) -> None:
    """helix: "A run waiting on approval shows as awaiting approval in its execution trace"."""
    agent = scripted_agent(
        "support-agent",
        [call_tools(REFUND_180), reply("Done.")],
        tools=[helix_refund(ExecutionLog())],
    )
    app = helix_app(f"sqlite:///{tmp_path / 'state.db'}", agent)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://t",
            headers={"Authorization": "Bearer alice-token"},
        ) as c:
            chat = await c.post(
                "/v1/sessions", json={"agent": "support-agent", "message": "Refund order 1042"}
            )
            sid = chat.json()["session_id"]
            page = (await c.get(f"/_signoff/sessions/{sid}")).text
            assert "Awaiting approval: issue_refund" in page
            fragment = (await c.get(f"/_signoff/fragments/sessions/{sid}?after=1")).json()
            assert "Awaiting approval: issue_refund" in fragment["rows"]


async def test_helix_the_same_id_twice_in_one_call_is_refused_by_name(tmp_path: Path) -> None:
    """helix: "Each approval resolves once": one call naming an id twice (approving and denying
    it, or twice alike) decides nothing and names the id; store and tool are untouched."""
    log = ExecutionLog()
    agent = scripted_agent(
        "support-agent", [call_tools(REFUND_180), reply("Refunded.")], tools=[helix_refund(log)]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support-agent", prompt="Refund order 1042")
        rid = r.pending[0].id
        before = await store_contents(rt.store, r.session_id)
        for second in (True, False):
            with pytest.raises(so.InvalidAnswer) as info:
                await rt.generate(
                    session_id=r.session_id,
                    approvals=[
                        so.Decision(id=rid, approved=True),
                        so.Decision(id=rid, approved=second),
                    ],
                )
            assert info.value.request_ids == [rid]
            assert rid in str(info.value)
        assert await store_contents(rt.store, r.session_id) == before
        assert log.count() == 0
        done = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=rid, approved=True)]
        )
        assert done.status == "completed"
        assert log.count() == 1


# -- anvil (003): each behavioural statement of the seed -------------------------------------------


def anvil_agent(tool: so.Tool, *, usage: so.Usage | None = None, done: Any = None) -> so.Agent:
    """The seed's agent: the model calls issueRefund for order-99, then answers."""
    first = call_tools(call("issue_refund", order_id="order-99", amount=42.5), usage=usage)
    return scripted_agent("anvil", [first, done or reply("done")], tools=[tool])


async def test_anvil_suspension_is_checkpointed_and_emitted_on_the_stream(tmp_path: Path) -> None:
    """Seed: "saves an AgentCheckpoint with status: 'suspended' and the pending payload, and
    emits a suspended event to the response stream"."""
    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, anvil_agent(anvil_refund(log))) as rt:
        r = await rt.generate("anvil", prompt="refund order-99")
        assert r.status == "waiting"
        (req,) = r.pending
        assert (await rt.state(r.session_id)).status == "waiting"
        events = [e async for e in rt.events(r.session_id, follow=False)]
        asked = next(e for e in events if e.type == "input.requested")
        (stored,) = asked.data["requests"]
        assert stored["id"] == req.id
        assert stored["source"] == "tool"
        assert stored["action"]["call_id"] == req.call_id
        assert stored["payload"] == {"action": "refund", "order_id": "order-99", "amount": 42.5}
        waiting = next(e for e in events if e.type == "turn.waiting")
        assert waiting.seq > asked.seq and waiting.data["on"] == "input"
        assert (await store_contents(rt.store, r.session_id)).pending == [req.id]


async def test_anvil_code_after_request_approval_never_runs(tmp_path: Path) -> None:
    """Seed: "meta.requestApproval() is typed as never ... Any code written after it ... will
    not run on the initial invocation or on resume"."""
    import typing

    assert typing.get_type_hints(so.ToolContext.request_approval)["return"] is typing.NoReturn
    after: list[str] = []
    log = ExecutionLog()

    @log.tool
    async def issue_refund(ctx: so.ToolContext, order_id: str, amount: float) -> str:
        """Issue a refund for an order."""
        ctx.request_approval({"action": "refund", "order_id": order_id, "amount": amount})
        after.append("refunded")  # unreachable
        return "refunded"

    for approved in (True, False):
        seen = Capture(reply("ok"))
        async with sqlite_runtime(
            tmp_path / str(approved), anvil_agent(issue_refund, done=seen)
        ) as rt:
            r = await rt.generate("anvil", prompt="refund order-99")
            assert after == []
            r = await rt.generate(
                session_id=r.session_id,
                approvals=[so.Decision(id=r.pending[0].id, approved=approved)],
            )
            assert r.status == "completed"
            assert after == []
            assert tool_results(seen.last)[0].content["approved"] is approved
    assert log.count() == 2  # once per run: the suspending invocation, never on resume


async def test_anvil_approval_required_names_its_call(tmp_path: Path) -> None:
    """Seed: "ApprovalRequiredError fields: callId — The tool call ID that triggered the
    suspension". `ctx.request_approval` fills it in; raised directly, it may name the call."""
    raised: list[so.ApprovalRequired] = []
    log = ExecutionLog()

    @log.tool
    async def issue_refund(ctx: so.ToolContext, order_id: str, amount: float) -> str:
        """Issue a refund for an order."""
        try:
            ctx.request_approval({"action": "refund", "order_id": order_id})
        except so.ApprovalRequired as signal:
            raised.append(signal)
        raise so.ApprovalRequired({"action": "refund", "amount": amount}, call_id=ctx.call_id)

    seen = Capture(reply("ok"))
    async with sqlite_runtime(tmp_path, anvil_agent(issue_refund, done=seen)) as rt:
        r = await rt.generate("anvil", prompt="refund order-99")
        (req,) = r.pending
        (signal,) = raised
        assert signal.call_id == req.call_id is not None
        assert signal.payload == {"action": "refund", "order_id": "order-99"}
        assert req.payload == {"action": "refund", "amount": 42.5}
        r = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=req.id, approved=True)]
        )
        (result,) = tool_results(seen.last)
        assert result.call_id == req.call_id  # the decision is injected as that call's result
        assert result.content["approved"] is True
    assert so.ApprovalRequired({"a": 1}).call_id is None
    with pytest.raises(so.UsageError, match="call_id"):
        so.ApprovalRequired({"a": 1}, call_id=7)  # type: ignore[arg-type]
    import pickle

    copy = pickle.loads(pickle.dumps(so.ApprovalRequired({"a": 1}, call_id="call_1")))
    assert (copy.payload, copy.call_id) == ({"a": 1}, "call_1")


async def test_anvil_approval_required_for_another_call_is_refused(tmp_path: Path) -> None:
    """An `ApprovalRequired` naming a call other than the running one opens no request: an
    approval is bound to the exact call, so the call ends with an error the model reads."""
    log = ExecutionLog()

    @log.tool
    async def issue_refund(ctx: so.ToolContext, order_id: str, amount: float) -> str:
        """Issue a refund for an order."""
        raise so.ApprovalRequired({"action": "refund"}, call_id="call_someone_else")

    seen = Capture(reply("could not ask"))
    async with sqlite_runtime(tmp_path, anvil_agent(issue_refund, done=seen)) as rt:
        r = await rt.generate("anvil", prompt="refund order-99")
        assert r.status == "completed"
        assert r.pending == [] and await rt.pending() == []
        (result,) = tool_results(seen.last)
        assert result.is_error
        assert "call_someone_else" in result.content["error"]
        assert "input.requested" not in await event_types(rt, r.session_id)


async def test_anvil_reviewer_object_is_injected_as_the_tool_result(tmp_path: Path) -> None:
    """Seed: "approval: { approved: true, reviewer: 'alice@example.com', note: '...' }" is
    "injected as the result of the tool call that was pending when the run suspended"."""
    log = ExecutionLog()
    seen = Capture(reply("Run completed."))
    async with sqlite_runtime(tmp_path, anvil_agent(anvil_refund(log), done=seen)) as rt:
        r = await rt.generate("anvil", prompt="refund order-99")
        reviewer = {"reviewer": "alice@example.com", "note": "Verified with customer. Proceed."}
        r = await rt.generate(
            session_id=r.session_id,
            approvals=[so.Decision(id=r.pending[0].id, approved=True, value=reviewer)],
        )
        assert (r.status, r.text) == ("completed", "Run completed.")
        (result,) = tool_results(seen.last)
        assert not result.is_error
        assert result.content["approved"] is True
        assert result.content["value"] == reviewer
        assert log.count() == 1


async def test_anvil_review_can_happen_days_later(tmp_path: Path) -> None:
    """Seed: "the review can happen seconds or days later without losing any context" (no TTL
    by default)."""
    log = ExecutionLog()
    clock = ManualClock()
    seen = Capture(reply("done"))
    agent = anvil_agent(anvil_refund(log), done=seen)
    async with sqlite_runtime(tmp_path, agent, clock=clock) as rt:
        r = await rt.generate("anvil", prompt="refund order-99, it arrived broken")
    clock.advance(30 * 86_400)
    async with sqlite_runtime(tmp_path, agent, clock=clock) as rt:
        (req,) = await rt.pending()
        assert req.expires_at is None
        r = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=req.id, approved=True)]
        )
        assert r.status == "completed"
        # the whole conversation is still there for the model
        assert [m.kind for m in seen.last] == ["user", "assistant", "tool"]
        assert "arrived broken" in str(seen.last[0])
        assert log.count() == 1


async def test_anvil_queue_entry_carries_cost_and_tokens_at_suspension(tmp_path: Path) -> None:
    """Seed: "The accumulated cost and token usage at suspension time" is on the queue entry."""
    log = ExecutionLog()

    @log.tool
    async def lookup_order(order_id: str) -> dict[str, str]:
        """Look up an order."""
        return {"order_id": order_id, "status": "delivered"}

    looked = so.Usage(input_tokens=600, output_tokens=80, cost_usd=0.0012)
    asked = so.Usage(input_tokens=400, output_tokens=200, cost_usd=0.003)
    agent = scripted_agent(
        "anvil",
        [
            call_tools(call("lookup_order", order_id="order-99"), usage=looked),
            call_tools(call("issue_refund", order_id="order-99", amount=42.5), usage=asked),
            reply("done", usage=so.Usage(input_tokens=5000, output_tokens=5000, cost_usd=1.0)),
        ],
        tools=[lookup_order, anvil_refund(log)],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("anvil", prompt="refund order-99")
        (req,) = await rt.pending()
        assert (req.usage.input_tokens, req.usage.output_tokens) == (1000, 280)
        assert req.usage.cost_usd == pytest.approx(0.0042)
        assert r.pending[0].usage == req.usage
        await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=req.id, approved=True)]
        )
        # the entry keeps what the run had spent when it suspended
        closed = await rt.store.get_request(req.id)
        assert closed is not None and closed.status == "settled"
        assert closed.request.usage == req.usage


async def test_anvil_dashboard_queue_shows_the_suspended_run(tmp_path: Path) -> None:
    """Seed: "All runs with status: 'suspended' appear in the /_anvil dashboard approval queue.
    Each entry shows: the runId and the trace name; the pending.payload; the accumulated cost and
    token usage at suspension time; controls to approve or reject, which call resumeAgent on
    your behalf." Parked by one runtime, shown by another on the same SQLite file."""
    from signoff.server import TokenAuth, create_app

    from .test_dashboard import csrf_of, signed_in
    from .test_server_common import TOKENS, running

    log = ExecutionLog()
    seen = Capture(reply("Refund issued."))
    spent = so.Usage(input_tokens=1000, output_tokens=280, cost_usd=0.0042)
    agent = anvil_agent(anvil_refund(log), usage=spent, done=seen)
    alice = so.Principal(authenticator="token", principal_id="alice", attributes={"tenant": "acme"})
    async with sqlite_runtime(tmp_path, agent) as embedded:
        r = await embedded.generate("anvil", prompt="refund order-99", auth=alice)
    assert r.status == "waiting"
    (req,) = r.pending
    dashboard = sqlite_runtime(tmp_path, agent)
    with running(create_app(dashboard, auth=TokenAuth(TOKENS))) as base, signed_in(base) as c:
        queue = c.get("/_signoff/")
        card = queue.text[queue.text.index(f'id="{req.id}"') :]
        card = card[: card.index("</article>")]
        assert r.session_id in card and ">anvil<" in card  # the run and its agent
        assert 'aria-label="Payload"' in card
        assert "&#34;action&#34;: &#34;refund&#34;" in card  # the payload, escaped
        assert "&#34;order_id&#34;: &#34;order-99&#34;" in card
        assert "1,280 tokens · $0.0042" in card
        assert 'value="approve"' in card and 'value="cancel"' in card
        posted = c.post(
            f"/_signoff/requests/{req.id}/respond",
            data={"option": "approve", "text": "Proceed.", "csrf": csrf_of(queue.text)},
            headers={"Accept": "application/json"},
        )
        assert posted.json()["outcome"] == "approved"
        trace = c.get(f"/_signoff/sessions/{r.session_id}").text
        assert "turn.completed" in trace
    (result,) = tool_results(seen.last)
    assert result.content["approved"] is True
    assert result.content["reason"] == "Proceed."
    assert log.count() == 1


async def test_anvil_payload_is_what_the_approval_handler_receives(tmp_path: Path) -> None:
    """Seed: the payload "is what appears in the /_anvil dashboard and what your approval
    handler receives to make its decision"; the handler resumes the run with its decision."""
    from signoff.channels import ChannelHub, WebhookChannel, verify_webhook

    from .test_webhooks import SECRET, Receiver, manual

    log = ExecutionLog()
    seen = Capture(reply("Refund issued."))
    async with (
        Receiver([]) as receiver,
        sqlite_runtime(tmp_path, anvil_agent(anvil_refund(log), done=seen)) as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET)
        async with manual(ChannelHub(rt, [hooks])) as hub:
            r = await rt.generate("anvil", prompt="refund order-99")
            await hub.poll()
            await hooks.drain()
        ((headers, body),) = receiver.accepted
        delivered = verify_webhook(SECRET, headers, body)["request"]
        assert delivered["source"] == "tool"
        assert delivered["payload"] == {"action": "refund", "order_id": "order-99", "amount": 42.5}
        approve = delivered["payload"]["amount"] < 100  # the handler decides from the payload
        resumed = await rt.generate(
            session_id=r.session_id,
            approvals=[so.Decision(id=delivered["id"], approved=approve, reason="under 100")],
        )
        assert resumed.status == "completed"
        assert tool_results(seen.last)[0].content["approved"] is True


async def test_anvil_resume_needs_the_same_store_and_run(tmp_path: Path) -> None:
    """Seed: resumeAgent's "checkpoint.store: The same StateStore used when the run was
    originally started" and "checkpoint.runId: ... used to locate the saved checkpoint":
    another store or an unknown id is refused by name and nothing is stored."""
    log = ExecutionLog()
    agent = anvil_agent(anvil_refund(log))
    async with sqlite_runtime(tmp_path / "a", agent) as rt:
        r = await rt.generate("anvil", prompt="refund order-99")
        (req,) = r.pending
        before = await store_contents(rt.store, r.session_id)
        with pytest.raises(so.UnknownSession) as info:
            await rt.generate(
                session_id="ses_nope", approvals=[so.Decision(id=req.id, approved=True)]
            )
        assert "ses_nope" in str(info.value)
        assert await store_contents(rt.store, r.session_id) == before
    async with sqlite_runtime(tmp_path / "b", agent) as other:
        with pytest.raises(so.UnknownSession):
            await other.generate(
                session_id=r.session_id, approvals=[so.Decision(id=req.id, approved=True)]
            )
        assert await other.pending() == []
    assert log.count() == 1


async def test_anvil_callers_run_id_locates_the_suspended_run(tmp_path: Path) -> None:
    """Seed: `runId = refund:${orderId}:${Date.now()}`, "the stable run identifier used to
    locate the saved checkpoint". In signoff the caller's id is the `idempotency_key`: the
    session id derives from it, and a repeat finds the suspended run without running it."""
    log = ExecutionLog()
    run_id = "refund:order-99:1718000000"
    async with sqlite_runtime(tmp_path, anvil_agent(anvil_refund(log))) as rt:
        first = await rt.generate("anvil", prompt="refund order-99", idempotency_key=run_id)
        assert first.status == "waiting"
    async with sqlite_runtime(tmp_path, anvil_agent(anvil_refund(log))) as rt:
        again = await rt.generate("anvil", prompt="refund order-99", idempotency_key=run_id)
        assert again.replayed
        assert (again.session_id, again.status) == (first.session_id, "waiting")
        assert [p.id for p in again.pending] == [p.id for p in first.pending]
        assert log.count() == 1
        resumed = await rt.generate(
            session_id=again.session_id,
            approvals=[so.Decision(id=again.pending[0].id, approved=True)],
        )
        assert resumed.status == "completed"
