"""once() remembers only a person's approval: a deadline that approves (`on_timeout="approve"`)
or the app (`so.APP_PRINCIPAL`, answering a scheduled turn's request) runs that one call, but
neither is a grant, so the tool's next call asks a person again (both stores)."""

from __future__ import annotations

from typing import Any

import pytest

import signoff as so
from signoff._events import EventType
from signoff.testing import ExecutionLog, ManualClock, call, call_tools, reply, scripted_agent

ALICE = so.Principal(authenticator="sso", principal_id="alice")


def once_agent(log: ExecutionLog) -> so.Agent:
    @log.tool(approval=so.ApprovalSpec(so.once(), expires_in=60, on_timeout="approve"))
    async def pay_invoice(invoice: str) -> dict[str, Any]:
        """Pay an invoice."""
        return {"paid": invoice}

    return scripted_agent(
        "pay",
        [
            call_tools(call("pay_invoice", invoice="INV-1")),
            call_tools(call("pay_invoice", invoice="INV-2")),
            call_tools(call("pay_invoice", invoice="INV-3")),
            reply("done"),
        ],
        tools=[pay_invoice],
    )


async def test_a_timeout_approval_is_not_remembered_as_a_once_grant(store_url: str) -> None:
    clock = ManualClock()
    log = ExecutionLog()
    async with so.Runtime([once_agent(log)], store=store_url, clock=clock) as rt:
        r = await rt.generate("pay", prompt="pay", auth=ALICE)
        assert r.status == "waiting"
        clock.advance(60)
        assert await rt.expire_due() == 1
        # the deadline approved INV-1; INV-2 asks a person, as no one granted the tool
        assert [e.input["invoice"] for e in log.executions] == ["INV-1"]
        state = await rt.state(r.session_id)
        assert state.approved_tools == set()
        (second,) = [p for p in await rt.pending() if p.session_id == r.session_id]
        assert second.tool_name == "pay_invoice"
        # a person's approval is the grant: INV-3 then runs without asking
        r = await rt.generate(
            session_id=r.session_id,
            approvals=[so.Decision(id=second.id, approved=True)],
            auth=ALICE,
        )
        assert r.status == "completed"
        assert [e.input["invoice"] for e in log.executions] == ["INV-1", "INV-2", "INV-3"]
        assert (await rt.state(r.session_id)).approved_tools == {"pay_invoice"}


def once_refund(log: ExecutionLog) -> so.Agent:
    @log.tool(approval=so.once())
    async def refund(order: str) -> str:
        """Refund an order."""
        return f"refunded {order}"

    script = [call_tools(call("refund", order="1")), reply("nightly done")]
    script += [call_tools(call("refund", order="2")), reply("alice done")]
    return scripted_agent("a", script, tools=[refund])


async def test_the_apps_approval_of_a_scheduled_turn_is_not_remembered_as_a_once_grant(
    store_url: str,
) -> None:
    """The app approving its scheduled turn's request (`principal=so.APP_PRINCIPAL`) was taken
    for once()'s grant: Alice's later turn ran the tool without asking anyone."""
    log = ExecutionLog()
    async with so.Runtime([once_refund(log)], store=store_url) as rt:
        r = await rt.schedule("a", "nightly")
        (asked,) = r.pending
        assert asked.requested_by == so.APP_PRINCIPAL
        answer = so.InputResponse(request_id=asked.id, option_id="approve")
        r = await rt.respond(r.session_id, [answer], principal=so.APP_PRINCIPAL)
        assert (r.status, r.text) == ("completed", "nightly done")
        assert (await rt.state(r.session_id)).approved_tools == set()
        r = await rt.generate(session_id=r.session_id, prompt="refund 2", auth=ALICE)
        assert r.status == "waiting", r.text
        (second,) = r.pending
        assert second.requested_by == ALICE
        assert [e.input["order"] for e in log.executions] == ["1"]
        # Alice's own approval is the grant
        answer = so.InputResponse(request_id=second.id, option_id="approve")
        r = await rt.respond(r.session_id, [answer], principal=ALICE)
        assert (r.status, [e.input["order"] for e in log.executions]) == ("completed", ["1", "2"])
        assert (await rt.state(r.session_id)).approved_tools == {"refund"}


@pytest.mark.parametrize(
    ("by", "granted"),
    [
        (so.APP_PRINCIPAL.model_dump(), False),
        ({**so.APP_PRINCIPAL.model_dump(), "principal_id": "nightly"}, False),  # any runtime
        (ALICE.model_dump(), True),
        (None, True),  # a turn with no principal: anyone who reaches it settles it
    ],
)
def test_a_logged_approval_folds_to_a_grant_only_when_a_person_gave_it(
    by: dict[str, Any] | None, granted: bool
) -> None:
    """An approval recorded before, by an older signoff, folds the same way: the app's grants
    nothing now (FOLD_VERSION 5 folds a session such a snapshot granted again, without it)."""
    state = so.SessionState(id="ses_1")
    action = so.Action(call_id="c1", tool_name="refund", input={"order": "1"}, input_hash="h")
    request = so.InputRequest(
        kind="tool-approval",
        id="req_1",
        session_id="ses_1",
        turn_id="trn_1",
        agent="a",
        action=action,
        created_at=1.0,
    )
    events: list[tuple[EventType, dict[str, Any]]] = [
        ("session.created", {"agent": "a"}),
        ("turn.started", {"message": "go", "principal": by, "source": "message"}),
        ("input.requested", {"requests": [request.model_dump(mode="json")]}),
        ("approval.settled", {"request_id": "req_1", "call_id": "c1", "decision": "approve"}),
    ]
    events[-1][1]["by"] = by
    for seq, (type, data) in enumerate(events, 1):
        turn = None if seq == 1 else "trn_1"
        state.apply(
            so.Event(session_id="ses_1", seq=seq, type=type, at=seq, turn_id=turn, data=data)
        )
    assert state.approved_tools == ({"refund"} if granted else set())
