"""docs/events.md against what the runtime writes: a turn with two approvals, a question, a
journaled step and a subagent, then a denied and a cancelled call, is run, and every event type
and `data` field it records must be in the page, as every field of a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from pathlib import Path
from typing import Any, Literal

import signoff as so

from ._docs import blocks_text


def rows() -> dict[str, str]:
    """docs/events.md's table of types: each type's row, by type."""
    found = re.findall(r"^\| `([a-z]+\.[a-z]+)` \|(.*)\|$", blocks_text("events"), re.M)
    return {kind: row for kind, row in found}


def requests_section() -> str:
    text = blocks_text("events")
    return text[text.index("## Requests") :]


@so.tool(approval=so.always())
async def refund(order_id: str) -> dict[str, str]:
    """Refund an order."""
    return {"refunded": order_id}


@so.tool(approval=so.always())
async def delete_account(email: str) -> dict[str, str]:
    """Delete an account."""
    return {"deleted": email}


@so.tool()
async def confirm(ctx: so.ToolContext, order_id: str) -> dict[str, Any]:
    """Quote, then ask before going on."""
    quote = await ctx.step("quote", lambda: 42)
    answer = await ctx.ask("Proceed?", options=["yes", "no"])
    return {"quote": quote, "answer": answer.value}


def agents() -> list[so.Agent]:
    calls = [
        so.ToolCall(id="c1", name="refund", input={"order_id": "1"}),
        so.ToolCall(id="c2", name="delete_account", input={"email": "a@example.com"}),
        so.ToolCall(id="c3", name="confirm", input={"order_id": "1"}),
    ]
    model = so.models.Scripted(
        [
            so.ModelResponse(tool_calls=calls),
            so.ModelResponse(
                tool_calls=[so.ToolCall(id="c4", name="billing", input={"message": "bill"})]
            ),
            so.ModelResponse(text="Done."),
            so.ModelResponse(
                tool_calls=[so.ToolCall(id="c5", name="refund", input={"order_id": "2"})]
            ),
            so.ModelResponse(text="Not refunded."),
            so.ModelResponse(
                tool_calls=[so.ToolCall(id="c6", name="refund", input={"order_id": "3"})]
            ),
        ]
    )
    billing = so.Agent(name="billing", model=so.models.Scripted([so.ModelResponse(text="Billed.")]))
    tools = [refund, delete_account, confirm, so.delegate("billing")]
    return [so.Agent(name="support", model=model, tools=tools), billing]


def recorded(tmp_path: Path) -> dict[str, set[str]]:
    """The event types the scenario records, each with the `data` fields seen on it; requests'
    fields under `request`. The drives are traced, as `turn.waiting` then keeps their context."""
    from opentelemetry.sdk.trace import TracerProvider

    fields: dict[str, set[str]] = {}
    store = f"sqlite:///{tmp_path}/events.db"
    with so.Runtime(agents(), store=store, tracer_provider=TracerProvider()) as rt:
        r = rt.generate_sync("support", prompt="refund order 1 and delete my account")
        while r.status == "waiting":
            first = r.pending[0]
            option = "yes" if first.kind == "question" else "approve"
            answer = so.InputResponse(request_id=first.id, option_id=option)
            r = rt.respond_sync(r.session_id, [answer])
        assert (r.status, r.text) == ("completed", "Done."), r
        r = rt.generate_sync(session_id=r.session_id, prompt="refund order 2")
        denial = so.InputResponse(request_id=r.pending[0].id, option_id="cancel", text="no")
        r = rt.respond_sync(r.session_id, [denial])
        assert (r.status, r.text) == ("completed", "Not refunded."), r
        r = rt.generate_sync(session_id=r.session_id, prompt="refund order 3")
        rt.cancel_sync(r.session_id, reason="changed my mind")
        sessions = rt.sessions_sync(limit=10)
        assert sorted(s.agent for s in sessions) == ["billing", "support"]
        for session in sessions:
            for event in rt.events_sync(session.id):
                fields.setdefault(event.type, set()).update(event.data)
                for request in event.data.get("requests", []):
                    fields.setdefault("request", set()).update(request)
    return fields


def deadline(on_timeout: Literal["deny", "approve", "escalate"]) -> so.ApprovalSpec:
    group = "finance" if on_timeout == "escalate" else None
    return so.ApprovalSpec(so.always(), expires_in=10, on_timeout=on_timeout, escalate_to=group)


@so.tool(approval=deadline("approve"))
async def export_report(order_id: str) -> str:
    """Approved when no one answers."""
    return order_id


@so.tool(approval=deadline("deny"))
async def close_account(order_id: str) -> str:
    """Denied when no one answers."""
    return order_id


@so.tool(approval=deadline("escalate"))
async def wire_money(order_id: str) -> str:
    """Passed to finance when no one answers."""
    return order_id


@so.tool(approval=so.always(approvers=2))
async def pay_out(order_id: str) -> str:
    """Two people approve."""
    return order_id


def people(name: str) -> so.Principal:
    return so.Principal(authenticator="web", principal_id=name)


def recorded_around_people(tmp_path: Path) -> dict[str, set[str]]:
    """What a keyed session records with a quorum, a message from someone else queued behind
    the turn, three deadlines (approve, deny, escalate) and a passed TTL."""
    from signoff.testing import ManualClock

    def calls(*names: str) -> so.ModelResponse:
        return so.ModelResponse(
            tool_calls=[so.ToolCall(id=f"c_{n}", name=n, input={"order_id": "1"}) for n in names]
        )

    script = [
        calls("pay_out"),
        so.ModelResponse(text="Paid."),
        calls("export_report", "close_account", "wire_money"),
        so.ModelResponse(text="Done."),
        calls("close_account"),
    ]
    tools = [pay_out, export_report, close_account, wire_money]
    agent = so.Agent(
        name="support",
        model=so.models.Scripted(script),
        tools=tools,
        limits=so.Limits(ttl=1000),
    )
    clock = ManualClock()
    fields: dict[str, set[str]] = {}
    store = f"sqlite:///{tmp_path}/people.db"
    with so.Runtime([agent], store=store, clock=clock) as rt:
        alice, bob, carol = people("alice"), people("bob"), people("carol")
        r = rt.generate_sync("support", prompt="pay", auth=alice, idempotency_key="k1")
        sid, rid = r.session_id, r.pending[0].id
        queued = rt.send_sync(sid, "and the report", principal=people("dave"))
        assert queued.queued
        for person in (bob, carol):
            vote = so.InputResponse(request_id=rid, option_id="approve")
            r = rt.respond_sync(sid, [vote], principal=person)
        # Carol's vote completes Alice's turn, which she is told; Dave's starts and waits.
        assert (r.status, r.text) == ("completed", "Paid."), r
        daves = rt.state_sync(sid)
        assert daves.turn is not None and daves.turn.id != r.turn_id
        assert daves.turn.status == "waiting" and len(daves.pending_requests()) == 3
        clock.advance(11)
        rt.pending_sync()  # the deadlines pass: approved, denied, escalated
        r = rt.generate_sync(session_id=sid)
        (escalated,) = r.pending
        approve = so.InputResponse(request_id=escalated.id, option_id="approve")
        r = rt.respond_sync(sid, [approve], principal=people("dave"))
        assert (r.status, r.text) == ("completed", "Done."), r
        r = rt.generate_sync(session_id=sid, prompt="close it", auth=alice)
        clock.advance(2000)
        with contextlib.suppress(so.SessionExpired):
            rt.state_sync(sid)
        for event in rt.events_sync(sid):
            fields.setdefault(event.type, set()).update(event.data)
    return fields


def test_every_event_type_and_field_the_runtime_records_is_in_docs_events_md(
    tmp_path: Path,
) -> None:
    """A consumer reading docs/events.md knows every type and `data` field a turn with
    approvals, a question, a step, a subagent, a denial and a cancel records, and those of a
    quorum, a queued message, deadlines and a passed TTL (`turn.waiting`'s `traceparent` was
    named only in docs/tracing.md; `session.created`'s `idem`, `approval.settled`'s `auto`,
    `input.resolved`'s `on_timeout` and `turn.failed`'s `reason` nowhere)."""
    fields = recorded(tmp_path)
    for kind, seen in recorded_around_people(tmp_path).items():
        fields.setdefault(kind, set()).update(seen)
    table = rows()
    for kind in [
        "session.created",
        "turn.started",
        "model.completed",
        "tool.started",
        "tool.step",
        "tool.completed",
        "input.requested",
        "turn.waiting",
        "approval.settled",
        "input.resolved",
        "turn.completed",
        "turn.cancelled",
        "turn.failed",
        "turn.message",
        "approval.candidate",
        "session.waiting",
    ]:
        assert kind in fields, kind
    for kind, seen in fields.items():
        if kind == "request":
            continue
        assert kind in table, kind
        missing = {name for name in seen if f"`{name}`" not in table[kind]}
        assert missing == set(), (kind, sorted(missing))
    assert "traceparent" in fields["turn.waiting"]
    section = requests_section()
    assert {name for name in fields["request"] if f"`{name}`" not in section} == set()


def test_docs_events_md_names_every_field_of_a_request() -> None:
    """Each field of `so.InputRequest` (quorum settings, escalation, a subagent's `child`...) is
    named in the page's *Requests*, not only the few an approval shows."""
    section = requests_section()
    fields = set(so.InputRequest.model_fields)
    assert len(fields) >= 20
    assert {name for name in fields if f"`{name}`" not in section} == set()


@so.tool()
async def look_up(order_id: str) -> str:
    """Read an order."""
    return f"order {order_id}: shipped"


async def test_a_replys_reasoning_and_what_it_read_through_are_in_docs_events_md(
    tmp_path: Path,
) -> None:
    """A reply with reasoning and a call, a message steered in while the model wrote it: its
    `model.completed` keeps the reasoning to replay and the last event the model read, fields
    docs/events.md named only on `model.paused` or nowhere."""
    asked, go = asyncio.Event(), asyncio.Event()
    thought = {"type": "thinking", "thinking": "check the order", "signature": "SIG"}

    async def slow(messages: list[so.Message]) -> so.ModelResponse:
        asked.set()
        await go.wait()
        call = so.ToolCall(id="c1", name="look_up", input={"order_id": "1"})
        return so.ModelResponse(text="Looking.", tool_calls=[call], reasoning=[thought])

    model = so.models.Scripted([slow, so.ModelResponse(text="Both shipped.")])
    agent = so.Agent(name="a", model=model, tools=[look_up])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/mid.db") as rt:
        turn = asyncio.create_task(rt.generate("a", prompt="where is order 1?"))
        await asyncio.wait_for(asked.wait(), 10)
        sid = (await rt.sessions(limit=1))[0].id
        steer = asyncio.create_task(rt.send(sid, "and order 2?", turn_policy="steer"))
        while not [e async for e in rt.events(sid, follow=False) if e.type == "turn.message"]:
            await asyncio.sleep(0.01)  # the message is in the log; `send` waits for the turn
        go.set()
        assert (await asyncio.wait_for(turn, 10)).text.endswith("Both shipped.")
        await asyncio.wait_for(steer, 10)
        completed = [e.data async for e in rt.events(sid, follow=False)]
    replies = [data for data in completed if "tool_calls" in data and data["tool_calls"]]
    assert replies[0]["reasoning"] == [thought] and replies[0]["read_through"] >= 1, replies
    row = rows()["model.completed"]
    assert {name for name in replies[0] if f"`{name}`" not in row} == set()
