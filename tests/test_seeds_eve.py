"""Every tool-approval example of the eve seed, translated to Python: tenant policies,
schedule-dispatched turns, and the statements of the seed audit."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.testing import (
    Capture,
    ExecutionLog,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    store_contents,
    tool_results,
)

from ._seeds import ALICE, MALLORY, event_types

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
    spent = so.Usage(input_tokens=0, output_tokens=50)
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
                call("billing", call_id="d1", message="refund 1"),
                call("orders", call_id="d2", message="where is 3?"),
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
