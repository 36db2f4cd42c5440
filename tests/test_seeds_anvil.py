"""Every tool-approval example of the anvil seed, translated to Python: requestApproval inside
the tool, toolPolicy as a guardrail, and each behavioural statement of the seed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import signoff as so
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

from ._seeds import event_types

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


async def test_a_decision_on_a_tools_own_approval_is_its_result_value_and_all(
    tmp_path: Path,
) -> None:
    """The value is the call's result: another value again is another answer (it was a
    no-op), and the model reads who decided without their sign-in attributes."""
    log = ExecutionLog()
    seen = Capture(reply("Refund approved and issued."))
    agent = scripted_agent(
        "anvil",
        [call_tools(call("issue_refund", order_id="order-99", amount=42.5)), seen],
        tools=[anvil_refund(log)],
    )
    reviewer = so.Principal(
        authenticator="sso", principal_id="alice", attributes={"email": "alice@corp.example"}
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("anvil", prompt="refund order-99", auth=reviewer)
        (req,) = r.pending

        def approve(value: object) -> list[so.InputResponse]:
            return [so.InputResponse(request_id=req.id, option_id="approve", value=value)]

        await rt.respond(r.session_id, approve({"ref": "A"}), principal=reviewer, resume=False)
        before = await store_contents(rt.store, r.session_id)
        with pytest.raises(so.ConflictingAnswer, match="this answer has another value"):
            await rt.respond(r.session_id, approve({"ref": "B"}), principal=reviewer)
        with pytest.raises(so.ConflictingAnswer, match="this answer has another value"):
            await rt.respond(r.session_id, approve(None), principal=reviewer)
        assert await store_contents(rt.store, r.session_id) == before
        again = await rt.respond(r.session_id, approve({"ref": "A"}), principal=reviewer)
        assert again.status == "completed" and not again.outcomes[0].applied
        (result,) = tool_results(seen.last)
        assert result.content["value"] == {"ref": "A"}
        assert result.content["by"]["principal_id"] == "alice"
        assert "attributes" not in result.content["by"]
        assert "corp.example" not in str(seen.last)


async def test_a_voters_retry_of_their_own_answer_under_a_quorum_is_no_conflict(
    tmp_path: Path,
) -> None:
    """The settlement of a tool's own approval under `approvers=2` holds the last voter's
    value: the first voter's retry of their own answer (an HTTP retry) was refused as one with
    another value; it is a no-op."""
    log = ExecutionLog()

    @log.tool(approval=so.ApprovalSpec(so.never(), approvers=2))
    async def refund(ctx: so.ToolContext) -> str:
        """Refund, approved by two."""
        ctx.request_approval({"amount": 5})

    agent = scripted_agent("x", [call_tools(call("refund")), reply("ok")], tools=[refund])
    ana, ben = (so.Principal(authenticator="sso", principal_id=p) for p in ("ana", "ben"))
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("x", prompt="refund")
        (req,) = r.pending
        assert (req.source, req.approvers) == ("tool", 2)

        def approve(value: str) -> list[so.InputResponse]:
            return [so.InputResponse(request_id=req.id, option_id="approve", value=value)]

        await rt.respond(r.session_id, approve("from ana"), principal=ana, resume=False)
        await rt.respond(r.session_id, approve("from ben"), principal=ben, resume=False)
        again = await rt.respond(r.session_id, approve("from ana"), principal=ana)
        assert [(o.outcome, o.applied) for o in again.outcomes] == [("approved", False)]


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

    from ._dashboard import csrf_of, signed_in
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
