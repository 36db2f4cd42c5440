"""A refusal repeated: the same person's answer that a response policy refuses again for the
same reason adds nothing to the log, so repeated clicks cannot grow a session without bound."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

import signoff as so
from signoff.testing import ExecutionLog, call, call_tools, reply, scripted_agent

from ._response_policies import (
    ALICE,
    BOB,
    MALLORY,
    REFUSED,
    asked,
    events_of,
    lines,
    refund_agent,
    tenant_guard,
)
from ._server_api import in_process

REPEATS = 12


def approve(req: so.InputRequest) -> list[so.InputResponse]:
    return [so.InputResponse(request_id=req.id, option_id="approve")]


async def test_a_refusal_repeated_is_recorded_once_per_person_and_reason(store_url: str) -> None:
    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=tenant_guard)
    async with so.Runtime([refund_agent(log, spec)], store=store_url) as rt:
        sid, req, head = await asked(rt, ALICE)
        for _ in range(REPEATS):
            r = await rt.respond(sid, approve(req), principal=MALLORY)
            assert (r.status, r.outcomes[0].outcome, r.outcomes[0].applied) == (
                "waiting",
                "rejected",
                False,
            )
            assert r.outcomes[0].reason == "Responder cannot act for this tenant."
        assert lines(await events_of(rt, sid, head)) == REFUSED
        # Another person (anonymous), or a deny, is a refusal of its own, recorded once too.
        for _ in range(3):
            await rt.respond(sid, approve(req), principal=None)
            await rt.respond(
                sid, [so.InputResponse(request_id=req.id, option_id="cancel")], principal=MALLORY
            )
        assert lines(await events_of(rt, sid, head)) == REFUSED * 3
        assert await rt.verify_audit() == []
        # Someone the policy allows still settles it, after all those refusals.
        r = await rt.respond(sid, approve(req), principal=BOB)
        assert r.status == "completed" and log.executions


class Changing:
    """A response policy whose reason changes between calls: each reason is recorded once."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, ctx: so.ResponseContext) -> so.Rejected:
        self.calls += 1
        return so.Rejected(f"not today ({min(self.calls, 2)})")


async def test_a_refusal_for_a_new_reason_is_recorded(store_url: str) -> None:
    log = ExecutionLog()
    policy = Changing()
    spec = so.ApprovalSpec(request=so.always(), response=policy)
    async with so.Runtime([refund_agent(log, spec)], store=store_url) as rt:
        sid, req, head = await asked(rt, ALICE)
        reasons = [(await rt.respond(sid, approve(req), principal=BOB)).outcomes[0].reason]
        for _ in range(4):
            reasons.append((await rt.respond(sid, approve(req), principal=BOB)).outcomes[0].reason)
        assert reasons == ["not today (1)", *["not today (2)"] * 4]
        assert lines(await events_of(rt, sid, head)) == REFUSED * 2
        assert policy.calls == 5  # each answer judged once: a new verdict is not judged again


def _refuse_all(ctx: so.ResponseContext) -> so.Rejected:
    return so.Rejected("frozen")


async def test_a_refusal_repeated_over_http_adds_no_events(store_url: str) -> None:
    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=_refuse_all)
    async with so.Runtime([refund_agent(log, spec)], store=store_url) as rt:
        async with in_process(rt) as http:
            r = await http.post("/v1/sessions", json={"agent": "billing", "message": "refund"})
            assert r.status_code == 201, r.text
            sid = r.json()["session_id"]
            (req,) = r.json()["pending"]
            head = await rt.store.head(sid)
            answer = {"inputResponses": [{"requestId": req["id"], "optionId": "approve"}]}
            sizes = []
            for _ in range(REPEATS):
                got: httpx.Response = await http.post(f"/v1/sessions/{sid}/responses", json=answer)
                assert got.status_code == 200, got.text
                assert got.json()["outcomes"][0]["outcome"] == "rejected"
                sizes.append(await rt.store.head(sid))
        assert lines(await events_of(rt, sid, head or 0)) == REFUSED
        assert len(set(sizes)) == 1
        assert log.executions == []


async def test_an_edit_refused_is_recorded_once_and_not_shown_to_the_approval_policy(
    store_url: str,
) -> None:
    """The response policy judges an edited answer before the tool's approval policy sees the
    edit: one it refuses is refused as any answer is, once, whatever the edit. Before, the
    approval policy judged it first, and its denial came back to the person refused
    (`InvalidAnswer`), telling them what that policy says of the edit."""
    judged: list[float] = []

    def limit(ctx: so.ApprovalContext) -> Any:
        """Asks for a refund up to 1000, denies a bigger one; records the edits it judges."""
        if ctx.edited:
            judged.append(ctx.tool_input.amount)
        return (
            so.Denied("over the refund limit") if ctx.tool_input.amount > 1000 else "user-approval"
        )

    log = ExecutionLog()
    spec = so.ApprovalSpec(request=limit, response=tenant_guard)

    def edit(req: so.InputRequest, amount: float) -> list[so.InputResponse]:
        new = {"tenant_id": "t1", "charge_id": "ch_1", "amount": amount}
        return [so.InputResponse(request_id=req.id, option_id="approve", edited_input=new)]

    async with so.Runtime([refund_agent(log, spec)], store=store_url) as rt:
        sid, req, head = await asked(rt, ALICE)
        for amount in (5000, 20, 5000):
            r = await rt.respond(sid, edit(req, amount), principal=MALLORY)
            assert (r.outcomes[0].outcome, r.outcomes[0].reason) == (
                "rejected",
                "Responder cannot act for this tenant.",
            )
        assert lines(await events_of(rt, sid, head)) == REFUSED
        assert judged == []
        with pytest.raises(so.InvalidAnswer, match="over the refund limit"):
            await rt.respond(sid, edit(req, 5000), principal=BOB)
        r = await rt.respond(sid, edit(req, 20), principal=BOB)
        assert r.status == "completed"
    assert judged == [5000.0, 20.0]
    assert [e.input["amount"] for e in log.executions] == [20.0]


def turns_agent(log: ExecutionLog, turns: int) -> so.Agent:
    """The refund agent, asking for one approval in each of `turns` turns."""
    spec = so.ApprovalSpec(request=so.always(), response=tenant_guard)

    @log.tool(approval=spec)
    async def refund_charge(tenant_id: str, charge_id: str, amount: float) -> dict[str, float]:
        """Refund a charge."""
        return {"refunded": amount}

    ask = call_tools(call("refund_charge", tenant_id="t1", charge_id="ch_1", amount=50))
    return scripted_agent("billing", [ask, reply("done")] * turns, tools=[refund_charge])


async def test_a_refusal_reads_only_its_own_turn_of_the_log(store_url: str) -> None:
    """Judging a repeat read every `approval.candidate` of the session from its first event, so
    an answer cost more with each earlier turn (1,000 turns with a refusal each: 3,000 events
    read, 86 ms an answer on SQLite). It reads from its request's turn on."""
    log = ExecutionLog()
    earlier = 6
    async with so.Runtime([turns_agent(log, earlier + 1)], store=store_url) as rt:
        sid = None
        for _ in range(earlier):  # each turn: a refusal, then someone allowed approves
            r = await rt.generate("billing", prompt="refund", auth=ALICE, session_id=sid)
            sid, (req,) = r.session_id, r.pending
            assert (await rt.respond(sid, approve(req), principal=MALLORY)).status == "waiting"
            assert (await rt.respond(sid, approve(req), principal=BOB)).status == "completed"
        assert sid is not None
        r = await rt.generate("billing", prompt="refund", auth=ALICE, session_id=sid)
        (req,) = r.pending
        first = (await rt.state(sid)).turn
        assert first is not None
        read: list[int] = []
        real = rt.store.read_events

        async def counted(*args: Any, **kwargs: Any) -> list[so.Event]:
            events = await real(*args, **kwargs)
            read.extend(e.seq for e in events)
            return events

        rt.store.read_events = counted  # type: ignore[method-assign]
        for _ in range(3):  # a refusal, then repeats of it
            r = await rt.respond(sid, approve(req), principal=MALLORY)
            assert r.outcomes[0].outcome == "rejected"
        assert read and min(read) >= first.first_seq
        assert len(read) <= 3 * len(REFUSED)
        # Another turn's refusal by the same person does not count as this one's.
        assert (
            lines(await events_of(rt, sid, first.first_seq)).count("approval.candidate rejected")
            == 1
        )
