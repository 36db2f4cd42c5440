"""Edit before approve: an approver may send edited input; it is validated against the tool's
schema, recorded beside the original, the call runs with it and the model is told so. The
binding of approvals to the exact call by its input hash: test_edits_binding.py.
"""

from __future__ import annotations

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

from ._edits import (
    ALICE,
    BOB,
    CAROL,
    asked,
    events_of,
    refund_agent,
)

HUGE = 10**5000

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


class _NoBigRefunds(so.Guardrail):
    """Denies a refund over 1000, giving no reason."""

    async def decide(self, ctx: so.ApprovalContext) -> so.Verdict | None:
        return so.Verdict("deny") if ctx.tool_input.amount > 1000 else None


@pytest.mark.parametrize("guarded", [False, True], ids=["policy", "guardrail"])
async def test_an_edit_denied_without_a_reason_names_no_reason(
    tmp_path: Path, guarded: bool
) -> None:
    # It said "... approval policy denies the edited input: None", a guardrail's denial too.
    def no_big_refunds(ctx: so.ApprovalContext) -> Any:
        return "denied" if ctx.tool_input.amount > 1000 else "user-approval"

    log = ExecutionLog()

    @log.tool(approval=so.always() if guarded else no_big_refunds)
    async def refund_charge(charge_id: str, amount: float) -> str:
        """Refund a charge."""
        return "refunded"

    agent = scripted_agent(
        "support",
        [call_tools(call("refund_charge", charge_id="c", amount=5)), reply("x")],
        tools=[refund_charge],
        guardrails=[_NoBigRefunds()] if guarded else [],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support", prompt="refund")
        (req,) = r.pending
        edit = {"charge_id": "c", "amount": 5000}
        answer = so.InputResponse(request_id=req.id, option_id="approve", edited_input=edit)
        with pytest.raises(so.InvalidAnswer) as info:
            await rt.respond(r.session_id, [answer])
        whose = "approval policy or a guardrail" if guarded else "approval policy"
        said = f"request {req.id}: refund_charge's {whose} denies the edited input"
        assert str(info.value) == said
        assert log.count() == 0


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
        with pytest.raises(so.InvalidAnswer, match=r"key '\\ud800' is not valid Unicode text"):
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


async def test_an_edit_holding_an_integer_too_long_for_json_is_refused(store_url: str) -> None:
    """An edited argument of more than 4,300 digits validates (an int) but cannot be written as
    JSON: it was a bare ValueError out of `respond`; it is `InvalidAnswer`, nothing recorded."""
    log = ExecutionLog()

    @log.tool(approval=so.always())
    async def pay(amount: int) -> str:
        """Pay an amount."""
        return "paid"

    agent = scripted_agent("support", [call_tools(call("pay", amount=5)), reply("ok")], tools=[pay])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("support", prompt="pay it", auth=ALICE)
        (req,) = r.pending
        before = await store_contents(rt.store, r.session_id)
        for answer in [
            so.InputResponse(request_id=req.id, option_id="approve", edited_input={"amount": HUGE}),
            so.InputResponse(request_id=req.id, option_id="approve", value=[HUGE]),
        ]:
            with pytest.raises(so.InvalidAnswer, match="not plain JSON text.*4300 digits"):
                await rt.respond(r.session_id, [answer], principal=ALICE)
            assert await store_contents(rt.store, r.session_id) == before
        assert log.count() == 0
        r = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=req.id, option_id="approve", edited_input={"amount": 7})],
            principal=ALICE,
        )
        assert r.status == "completed"
    assert log.count() == 1


def _flag_agent(log: ExecutionLog) -> so.Agent:
    @log.tool(approval=so.always())
    async def set_flag(name: str, value: int | bool) -> str:
        """Set a flag."""
        return f"{name}={value!r}"

    return scripted_agent(
        "flags", [call_tools(call("set_flag", name="beta", value=1)), reply("ok")], tools=[set_flag]
    )


async def test_an_edit_from_1_to_true_is_another_answer_than_1(tmp_path: Path) -> None:
    """A second approval was compared with the first by `==`, for which `true` is `1`: approving
    again with `{"value": true}` after `{"value": 1}` was taken as the same answer, a no-op. It
    approves another call, a `ConflictingAnswer`; `1.0` is the same JSON number as `1`."""
    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, _flag_agent(log)) as rt:
        r = await rt.generate("flags", prompt="go", auth=ALICE)
        (req,) = r.pending

        def approve(value: object) -> list[so.InputResponse]:
            edit = {"name": "beta", "value": value}
            return [so.InputResponse(request_id=req.id, option_id="approve", edited_input=edit)]

        await rt.respond(r.session_id, approve(1), principal=ALICE)
        before = await store_contents(rt.store, r.session_id)
        again = await rt.respond(r.session_id, approve(1.0), principal=ALICE)
        assert again.outcomes == [so.Outcome(request_id=req.id, outcome="approved", applied=False)]
        with pytest.raises(so.ConflictingAnswer):
            await rt.respond(r.session_id, approve(True), principal=ALICE)
        assert await store_contents(rt.store, r.session_id) == before
        assert [e.input for e in log.executions] == [{"name": "beta", "value": 1}]


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ({"v": 1}, {"v": True}, False),
        (0, False, False),
        ([True], [1], False),
        (1, 1.0, True),
        ({"a": [1, {"b": None}]}, {"a": [1.0, {"b": None}]}, True),
        ({"a": 1}, {"a": 1, "b": 1}, False),
        ([1], {"0": 1}, False),
        ("1", 1, False),
    ],
)
def test_same_json_tells_booleans_from_numbers(a: object, b: object, same: bool) -> None:
    from signoff._types import same_json

    assert same_json(a, b) is same and same_json(b, a) is same
