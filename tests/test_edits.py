"""Edit before approve, and approvals bound to the exact call by its input hash.

An approver may send edited input: it is validated against the tool's schema, recorded beside the
original, the call runs with it and the model is told so. Every approval request carries a hash of
the tool name, call id and canonical input; an answer given for another hash is stale.
"""

from __future__ import annotations

import hashlib
import json
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
    timeline,
    tool_results,
)

ALICE = so.Principal(authenticator="sso", principal_id="alice")
BOB = so.Principal(authenticator="sso", principal_id="bob")
CAROL = so.Principal(authenticator="sso", principal_id="carol")


def refund_agent(
    log: ExecutionLog,
    approval: Any = None,
    *calls: so.ToolCall,
    seen: Capture | None = None,
) -> so.Agent:
    @log.tool(approval=approval if approval is not None else so.always())
    async def issue_refund(order_id: str, amount: float, note: str = "") -> dict[str, Any]:
        """Refund an order."""
        return {"refunded": amount, "order": order_id}

    if not calls:
        calls = (call("issue_refund", order_id="1042", amount=180),)
    return scripted_agent(
        "support", [call_tools(*calls), seen or reply("done")], tools=[issue_refund]
    )


async def asked(rt: so.Runtime, auth: so.Principal = ALICE) -> tuple[str, so.InputRequest, int]:
    r = await rt.generate("support", prompt="refund 1042", auth=auth)
    assert r.status == "waiting"
    req = r.pending[0]
    head = await rt.store.head(r.session_id)
    assert head is not None
    return r.session_id, req, head


async def events_of(rt: so.Runtime, session_id: str, after: int = 0) -> list[so.Event]:
    return [e async for e in rt.events(session_id, after, follow=False)]


# -- edit before approve --------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["respond", "generate"])
async def test_an_edited_approval_runs_with_the_edit_and_the_model_is_told(
    tmp_path: Path, path: str
) -> None:
    log = ExecutionLog()
    seen = Capture(reply("Refunded 150."))
    async with sqlite_runtime(tmp_path, refund_agent(log, seen=seen)) as rt:
        sid, req, head = await asked(rt)
        edit = {"order_id": "1042", "amount": 150}
        if path == "respond":
            r = await rt.respond(
                sid,
                [so.InputResponse(request_id=req.id, option_id="approve", edited_input=edit)],
                principal=ALICE,
            )
        else:
            r = await rt.generate(
                session_id=sid,
                approvals=[so.Decision(id=req.id, approved=True, edited_input=edit)],
                auth=ALICE,
            )
        assert r.status == "completed"
        # validated against the schema: the default filled in, the number coerced
        validated = {"order_id": "1042", "amount": 150.0, "note": ""}
        assert [e.input for e in log.executions] == [validated]
        events = await events_of(rt, sid, head)
        assert timeline(events)[:4] == [
            "approval.settled approve",
            "input.resolved approved",
            "tool.started issue_refund",
            "tool.completed issue_refund ok",
        ]
        settled = events[0].data
        assert settled["edited_input"] == validated
        # recorded beside the original, which stays the request's input
        stored = await rt.store.get_request(req.id)
        assert stored is not None
        assert stored.request.input == {"order_id": "1042", "amount": 180.0, "note": ""}
        assert stored.resolution is not None
        assert stored.resolution["edited_input"] == validated
        (result,) = tool_results(seen.last)
        assert result.content == {
            "result": {"refunded": 150.0, "order": "1042"},
            "note": "a reviewer edited the arguments before approving; the call ran with "
            "edited_input, not the arguments you proposed",
            "edited_input": validated,
        }
        assert not result.is_error


async def test_approving_again_with_another_edit_is_a_conflict(tmp_path: Path) -> None:
    """The same answer again is a no-op; an approval with other edited input is another answer."""
    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log)) as rt:
        sid, req, _ = await asked(rt)
        edit = {"order_id": "1042", "amount": 150}

        def approve(edited: dict[str, Any] | None) -> list[so.InputResponse]:
            return [so.InputResponse(request_id=req.id, option_id="approve", edited_input=edited)]

        await rt.respond(sid, approve(edit), principal=ALICE)
        before = await store_contents(rt.store, sid)
        again = await rt.respond(sid, approve(dict(edit)), principal=ALICE)
        assert again.outcomes == [so.Outcome(request_id=req.id, outcome="approved", applied=False)]
        for other in ({"order_id": "1042", "amount": 999}, None):
            with pytest.raises(so.ConflictingAnswer):
                await rt.respond(sid, approve(other), principal=ALICE)
        assert await store_contents(rt.store, sid) == before
        assert [e.input["amount"] for e in log.executions] == [150.0]


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        ({"order_id": "1042", "amount": "a lot"}, "amount: Input should be a valid number"),
        ({"order_id": "1042"}, "amount: Field required"),
        (
            {"order_id": "1042", "amount": 5, "bank_account": "evil"},
            "bank_account: Extra inputs are not permitted",
        ),
        ({"order_id": ["1042"], "amount": 5}, "order_id: Input should be a valid string"),
    ],
    ids=["wrong type", "missing field", "extra field", "wrong shape"],
)
async def test_an_invalid_edit_is_rejected_with_the_validation_errors(
    tmp_path: Path, edit: dict[str, Any], problem: str
) -> None:
    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log)) as rt:
        sid, req, _ = await asked(rt)
        before = await store_contents(rt.store, sid)
        with pytest.raises(so.InvalidAnswer) as info:
            await rt.respond(
                sid,
                [so.InputResponse(request_id=req.id, option_id="approve", edited_input=edit)],
                principal=ALICE,
            )
        message = str(info.value)
        assert f"request {req.id}: edited input does not fit issue_refund's schema" in message
        assert problem in message
        assert info.value.request_ids == [req.id]
        assert await store_contents(rt.store, sid) == before
        assert log.count() == 0
        # the request is still answerable, as proposed
        r = await rt.respond(
            sid, [so.InputResponse(request_id=req.id, option_id="approve")], principal=ALICE
        )
        assert r.status == "completed"
        assert [e.input["amount"] for e in log.executions] == [180.0]


async def test_an_edit_goes_only_with_approve(tmp_path: Path) -> None:
    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log)) as rt:
        sid, req, _ = await asked(rt)
        before = await store_contents(rt.store, sid)
        with pytest.raises(so.InvalidAnswer, match="edited input only goes with approve"):
            await rt.respond(
                sid,
                [
                    so.InputResponse(
                        request_id=req.id,
                        option_id="cancel",
                        edited_input={"order_id": "1042", "amount": 1},
                    )
                ],
                principal=ALICE,
            )
        assert await store_contents(rt.store, sid) == before


async def test_a_tool_raised_approval_takes_no_edit(tmp_path: Path) -> None:
    @so.tool
    async def wire(ctx: so.ToolContext, to: str, amount: float) -> str:
        """Wire money."""
        ctx.request_approval({"to": to, "amount": amount})

    agent = scripted_agent(
        "support", [call_tools(call("wire", to="acme", amount=10)), reply("ok")], tools=[wire]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support", prompt="wire", auth=ALICE)
        (req,) = r.pending
        assert req.source == "tool"
        before = await store_contents(rt.store, r.session_id)
        with pytest.raises(so.InvalidAnswer, match="this approval takes no edited input"):
            await rt.respond(
                r.session_id,
                [
                    so.InputResponse(
                        request_id=req.id,
                        option_id="approve",
                        edited_input={"to": "mallory", "amount": 10},
                    )
                ],
                principal=ALICE,
            )
        assert await store_contents(rt.store, r.session_id) == before


async def test_an_edit_through_a_response_policy(tmp_path: Path) -> None:
    seen_edits: list[Any] = []

    def anyone(ctx: so.ResponseContext) -> so.Allowed:
        seen_edits.append(ctx.response.edited_input)
        return so.Allowed()

    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=anyone)
    async with sqlite_runtime(tmp_path, refund_agent(log, spec)) as rt:
        sid, req, head = await asked(rt)
        edit = {"order_id": "1042", "amount": 99}
        r = await rt.respond(
            sid,
            [so.InputResponse(request_id=req.id, option_id="approve", edited_input=edit)],
            principal=BOB,
        )
        assert r.status == "completed"
        # the policy sees the edit it is approving (validated), not only the original input
        (edited,) = seen_edits
        assert edited is not None and edited.amount == 99.0
        assert [(e.input["amount"], e.principal_id) for e in log.executions] == [(99.0, "alice")]
        settled = next(e for e in await events_of(rt, sid, head) if e.type == "approval.settled")
        assert settled.data["edited_input"]["amount"] == 99.0


async def test_a_response_policy_can_refuse_an_edit(tmp_path: Path) -> None:
    def no_bigger_edits(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
        edit = ctx.response.edited_input
        if edit is not None and edit.amount > ctx.request.tool_input.amount:
            return so.Rejected("an edit may only lower the amount")
        return so.Allowed()

    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=no_bigger_edits)
    async with sqlite_runtime(tmp_path, refund_agent(log, spec)) as rt:
        sid, req, _ = await asked(rt)
        r = await rt.respond(
            sid,
            [
                so.InputResponse(
                    request_id=req.id,
                    option_id="approve",
                    edited_input={"order_id": "1042", "amount": 5000},
                )
            ],
            principal=BOB,
        )
        assert r.outcomes[0].reason == "an edit may only lower the amount"
        assert log.count() == 0
        r = await rt.respond(
            sid,
            [
                so.InputResponse(
                    request_id=req.id,
                    option_id="approve",
                    edited_input={"order_id": "1042", "amount": 100},
                )
            ],
            principal=BOB,
        )
        assert r.status == "completed"
        assert [e.input["amount"] for e in log.executions] == [100.0]


async def test_a_quorum_approval_cannot_be_edited(tmp_path: Path) -> None:
    """Every approver of a quorum must have approved the same call: no one may edit it alone."""
    log = ExecutionLog()
    agent = refund_agent(log, so.always(approvers=2, exclude_requester=True))
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid, req, _ = await asked(rt)
        await rt.respond(
            sid, [so.InputResponse(request_id=req.id, option_id="approve")], principal=BOB
        )
        before = await store_contents(rt.store, sid)
        with pytest.raises(so.InvalidAnswer, match="needs 2 approvers"):
            await rt.respond(
                sid,
                [
                    so.InputResponse(
                        request_id=req.id,
                        option_id="approve",
                        edited_input={"order_id": "1042", "amount": 9999},
                    )
                ],
                principal=CAROL,
            )
        assert await store_contents(rt.store, sid) == before
        r = await rt.respond(
            sid, [so.InputResponse(request_id=req.id, option_id="approve")], principal=CAROL
        )
        assert r.status == "completed"
        assert [e.input["amount"] for e in log.executions] == [180.0]


# -- binding: the input hash ----------------------------------------------------------------------


def expected_hash(tool_name: str, call_id: str, tool_input: Any) -> str:
    canonical = json.dumps(
        {"tool": tool_name, "call_id": call_id, "input": tool_input},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


async def test_each_request_carries_the_hash_of_its_exact_call(tmp_path: Path) -> None:
    log = ExecutionLog()
    agent = refund_agent(
        log,
        None,
        call("issue_refund", id="call_a", order_id="1042", amount=180),
        call("issue_refund", id="call_b", order_id="1042", amount=180),
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support", prompt="refund twice", auth=ALICE)
        a, b = r.pending
        for req in (a, b):
            assert req.action is not None
            assert req.action.input_hash == expected_hash(
                "issue_refund", req.action.call_id, req.action.input
            )
        # identical input, different calls: different hashes
        assert a.action is not None and b.action is not None
        assert a.action.input_hash != b.action.input_hash
        # the stored request and the event carry the same hash
        events = await events_of(rt, r.session_id)
        requested = next(e for e in events if e.type == "input.requested")
        hashes = [q["action"]["input_hash"] for q in requested.data["requests"]]
        assert hashes == [a.action.input_hash, b.action.input_hash]


@pytest.mark.parametrize("path", ["respond", "generate"])
async def test_an_answer_for_the_right_hash_settles(tmp_path: Path, path: str) -> None:
    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log)) as rt:
        sid, req, _ = await asked(rt)
        assert req.action is not None
        h = req.action.input_hash
        if path == "respond":
            r = await rt.respond(
                sid,
                [so.InputResponse(request_id=req.id, option_id="approve", input_hash=h)],
                principal=ALICE,
            )
        else:
            r = await rt.generate(
                session_id=sid,
                approvals=[so.Decision(id=req.id, approved=True, input_hash=h)],
                auth=ALICE,
            )
        assert r.status == "completed"
        assert log.count() == 1


@pytest.mark.parametrize("path", ["respond", "generate"])
async def test_an_answer_for_another_call_is_stale_and_changes_nothing(
    tmp_path: Path, path: str
) -> None:
    log = ExecutionLog()
    agent = refund_agent(
        log,
        None,
        call("issue_refund", id="call_a", order_id="1042", amount=180),
        call("issue_refund", id="call_b", order_id="1042", amount=180),
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support", prompt="refund twice", auth=ALICE)
        sid = r.session_id
        a, b = r.pending
        assert a.action is not None and b.action is not None
        before = await store_contents(rt.store, sid)
        wrong = [
            b.action.input_hash,  # the reviewer looked at the other call
            expected_hash("issue_refund", a.action.call_id, {**a.action.input, "amount": 18.0}),
            expected_hash("other_tool", a.action.call_id, a.action.input),
            "sha256:" + "0" * 64,
        ]
        for h in wrong:
            with pytest.raises(so.StaleAnswer) as info:
                if path == "respond":
                    await rt.respond(
                        sid,
                        [so.InputResponse(request_id=a.id, option_id="approve", input_hash=h)],
                        principal=ALICE,
                    )
                else:
                    await rt.generate(
                        session_id=sid,
                        approvals=[
                            so.Decision(id=a.id, approved=True, input_hash=h),
                            so.Decision(id=b.id, approved=True),
                        ],
                        auth=ALICE,
                    )
            assert info.value.request_ids == [a.id]
            assert a.action.input_hash in str(info.value)
            assert isinstance(info.value, so.AnswerError)
        assert await store_contents(rt.store, sid) == before
        assert log.count() == 0


async def test_a_stale_cancel_is_refused_too(tmp_path: Path) -> None:
    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log)) as rt:
        sid, req, _ = await asked(rt)
        before = await store_contents(rt.store, sid)
        with pytest.raises(so.StaleAnswer):
            await rt.respond(
                sid,
                [so.InputResponse(request_id=req.id, option_id="cancel", input_hash="sha256:x")],
                principal=ALICE,
            )
        assert await store_contents(rt.store, sid) == before


async def test_an_edit_is_bound_to_the_call_it_edits(tmp_path: Path) -> None:
    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log)) as rt:
        sid, req, _ = await asked(rt)
        assert req.action is not None
        edit = {"order_id": "1042", "amount": 10}
        with pytest.raises(so.StaleAnswer):
            await rt.respond(
                sid,
                [
                    so.InputResponse(
                        request_id=req.id,
                        option_id="approve",
                        edited_input=edit,
                        input_hash=expected_hash("issue_refund", req.action.call_id, edit),
                    )
                ],
                principal=ALICE,
            )
        # the hash names the call as proposed; the edit goes beside it
        r = await rt.respond(
            sid,
            [
                so.InputResponse(
                    request_id=req.id,
                    option_id="approve",
                    edited_input=edit,
                    input_hash=req.action.input_hash,
                )
            ],
            principal=ALICE,
        )
        assert r.status == "completed"
        assert [e.input["amount"] for e in log.executions] == [10.0]


async def test_a_stale_answer_to_a_response_policy_tool_records_nothing(tmp_path: Path) -> None:
    calls: list[so.ResponseContext] = []

    def anyone(ctx: so.ResponseContext) -> so.Allowed:
        calls.append(ctx)
        return so.Allowed()

    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=anyone)
    async with sqlite_runtime(tmp_path, refund_agent(log, spec)) as rt:
        sid, req, _ = await asked(rt)
        before = await store_contents(rt.store, sid)
        with pytest.raises(so.StaleAnswer):
            await rt.respond(
                sid,
                [so.InputResponse(request_id=req.id, option_id="approve", input_hash="sha256:0")],
                principal=BOB,
            )
        assert await store_contents(rt.store, sid) == before
        assert calls == []  # refused before any candidate or policy


async def test_an_edit_the_tools_approval_policy_would_deny_is_refused(tmp_path: Path) -> None:
    """An edit is a new call: it may not become one the tool's own policy denies outright."""

    def tenant_guard(ctx: so.ApprovalContext) -> Any:
        current = ctx.session.auth.current
        tenant = None if current is None else current.attributes.get("tenant_id")
        if tenant is None or tenant != ctx.tool_input.tenant_id:
            return so.Denied("Caller cannot access this tenant.")
        return "user-approval" if ctx.tool_input.amount > 1000 else "not-applicable"

    log = ExecutionLog()

    @log.tool(approval=tenant_guard)
    async def refund_charge(tenant_id: str, charge_id: str, amount: float) -> str:
        """Refund a charge."""
        return "refunded"

    agent = scripted_agent(
        "support",
        [call_tools(call("refund_charge", tenant_id="t1", charge_id="c", amount=5000)), reply("x")],
        tools=[refund_charge],
    )
    tenant_alice = so.Principal(
        authenticator="sso", principal_id="alice", attributes={"tenant_id": "t1"}
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support", prompt="refund", auth=tenant_alice)
        (req,) = r.pending
        before = await store_contents(rt.store, r.session_id)
        with pytest.raises(so.InvalidAnswer) as info:
            await rt.respond(
                r.session_id,
                [
                    so.InputResponse(
                        request_id=req.id,
                        option_id="approve",
                        edited_input={"tenant_id": "t2", "charge_id": "c", "amount": 5000},
                    )
                ],
                principal=tenant_alice,
            )
        assert "Caller cannot access this tenant." in str(info.value)
        assert info.value.request_ids == [req.id]
        assert await store_contents(rt.store, r.session_id) == before
        # an edit the policy accepts (here: would even run unasked) goes through
        r = await rt.respond(
            r.session_id,
            [
                so.InputResponse(
                    request_id=req.id,
                    option_id="approve",
                    edited_input={"tenant_id": "t1", "charge_id": "c", "amount": 500},
                )
            ],
            principal=tenant_alice,
        )
        assert r.status == "completed"
        assert [e.input for e in log.executions] == [
            {"tenant_id": "t1", "charge_id": "c", "amount": 500.0}
        ]


async def test_a_question_takes_no_edited_input(tmp_path: Path) -> None:
    agent = scripted_agent(
        "support",
        [call_tools(call("ask_question", question="Which order?")), reply("ok")],
        tools=[so.ask_question()],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support", prompt="refund", auth=ALICE)
        (req,) = r.pending
        assert req.kind == "question"
        before = await store_contents(rt.store, r.session_id)
        with pytest.raises(so.InvalidAnswer, match="edited input"):
            await rt.respond(
                r.session_id,
                [so.InputResponse(request_id=req.id, text="1042", edited_input={"x": 1})],
                principal=ALICE,
            )
        assert await store_contents(rt.store, r.session_id) == before


@pytest.mark.parametrize("depth", [150, 900])
async def test_an_edit_nested_too_deeply_is_an_invalid_answer(tmp_path: Path, depth: int) -> None:
    """An edit nested past the limit is refused by name before it is validated: 900 levels
    made pydantic's serializer raise a bare ValueError (a 500 from the dashboard's form)."""

    @so.tool(approval=so.always())
    async def upload(note: str, data: dict[str, Any]) -> str:
        """Upload a document."""
        return "stored"

    agent = scripted_agent(
        "support", [call_tools(call("upload", note="n", data={})), reply("ok")], tools=[upload]
    )
    edited: Any = 1
    for _ in range(depth):
        edited = {"k": edited}
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support", prompt="store it", auth=ALICE)
        (req,) = r.pending
        before = await store_contents(rt.store, r.session_id)
        with pytest.raises(so.InvalidAnswer, match="nests deeper than 100 levels"):
            await rt.respond(
                r.session_id,
                [
                    so.InputResponse(
                        request_id=req.id,
                        option_id="approve",
                        edited_input={"note": "n", "data": edited},
                    )
                ],
                principal=ALICE,
            )
        assert await store_contents(rt.store, r.session_id) == before


async def test_an_edit_with_a_lone_surrogate_in_a_key_is_refused(tmp_path: Path) -> None:
    """A key no UTF-8 text can hold was quietly replaced by pydantic (U+FFFD) and the call ran
    with a key the reviewer never typed; it is refused, as such a value is."""
    log = ExecutionLog()

    @log.tool(approval=so.always())
    async def upload(data: dict[str, Any]) -> str:
        """Upload a document."""
        return "stored"

    agent = scripted_agent(
        "support", [call_tools(call("upload", data={})), reply("ok")], tools=[upload]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support", prompt="store it", auth=ALICE)
        (req,) = r.pending
        before = await store_contents(rt.store, r.session_id)
        with pytest.raises(so.InvalidAnswer, match="not plain JSON text"):
            await rt.respond(
                r.session_id,
                [
                    so.InputResponse(
                        request_id=req.id, option_id="approve", edited_input={"data": {"\ud800": 1}}
                    )
                ],
                principal=ALICE,
            )
        assert await store_contents(rt.store, r.session_id) == before
        assert log.count() == 0
