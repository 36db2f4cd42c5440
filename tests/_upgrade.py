"""Agents and scenarios for the upgrade fixtures: `tests/fixtures/upgrade/make.py` parks them with
an older signoff, `tests/test_upgrade.py` resumes them with this one. Only API that every signoff
since commit 2e32584 has is used here, so the same agents run under both."""

from __future__ import annotations

from typing import Any

import signoff as so
from signoff.testing import call, call_tools, reply, scripted_agent

RAN: list[str] = []
"""Every side effect the agents' tools performed in this process, in order."""

SCENARIOS = ["one", "two", "ask", "flow", "flow2", "pair", "quorum", "long", "boss"]
SCENARIOS += ["answered"]
"""Each scenario is a session of the agent of the same name (the child of `boss` is `worker`)."""

ANSWERS = {"Which colour?": "blue", "Which plan for C1?": "pro", "Which plan for K1?": "basic"}
ANSWERS["Gift wrap for K1?"] = "yes"
"""The option a person picks for each question."""

ALICE = so.Principal(authenticator="test", principal_id="alice")
BOB = so.Principal(authenticator="test", principal_id="bob")


def _final(messages: list[Any]) -> so.ModelResponse:
    """A final answer that sums up the whole conversation the model was shown (user messages,
    calls proposed, tool results), so a resumed turn gives the same only if it saw the same."""
    seen = []
    for m in messages:
        kind = getattr(m, "kind", "")
        if kind == "user":
            seen.append(f"user:{m.text}")
        elif kind == "assistant":
            seen.append(f"calls:{','.join(c.name for c in m.tool_calls)}")
        elif kind == "tool":
            seen.append(f"{m.tool_name}={m.content}")
    return reply(" | ".join(seen))


def agents() -> list[so.Agent]:
    """The agents of every scenario; their tools append what they do to `RAN`."""

    @so.tool(approval=so.always())
    async def refund(order_id: str) -> str:
        """Refund an order."""
        RAN.append(f"refund {order_id}")
        return f"refunded {order_id}"

    @so.tool(approval=so.always(approvers=2))
    async def wire(amount: int) -> str:
        """Wire money; two people must approve."""
        RAN.append(f"wire {amount}")
        return f"wired {amount}"

    @so.tool
    async def lookup(order_id: str) -> str:
        """Look an order up."""
        RAN.append(f"lookup {order_id}")
        return f"order {order_id} found"

    @so.tool
    async def plan(ctx: so.ToolContext, customer: str) -> str:
        """Charge a setup fee, then ask a person which plan the customer gets."""

        def charge() -> str:
            RAN.append(f"charge {customer}")
            return f"fee-{customer}"

        receipt = await ctx.step("charge", charge)
        answer = await ctx.ask(f"Which plan for {customer}?", options=["basic", "pro"])
        return f"{receipt} {answer.value}"

    @so.tool
    async def setup(ctx: so.ToolContext, customer: str) -> str:
        """Charge, ask for a plan, ship, ask about gift wrap: two steps and two questions."""

        def effect(what: str) -> str:
            RAN.append(f"{what} {customer}")
            return f"{what}-{customer}"

        fee = await ctx.step("charge", effect, "charge")
        chosen = await ctx.ask(f"Which plan for {customer}?", options=["basic", "pro"])
        parcel = await ctx.step("ship", effect, "ship")
        wrap = await ctx.ask(f"Gift wrap for {customer}?", options=["yes", "no"])
        return f"{fee} {chosen.value} {parcel} {wrap.value}"

    def agent(name: str, *steps: Any, tools: list[so.Tool] | None = None) -> so.Agent:
        return scripted_agent(name, [*steps, _final], tools=tools or [refund])

    colours = [
        {"label": "red", "description": "Warm."},
        {"label": "blue", "description": "Cool."},
    ]
    return [
        # A turn waiting on one approval.
        agent("one", call_tools(call("refund", order_id="A1"))),
        # A turn waiting on a second approval after its first tool ran.
        agent(
            "two",
            call_tools(call("refund", order_id="B1")),
            call_tools(call("refund", order_id="B2")),
        ),
        # A turn waiting on a question the model asked.
        agent(
            "ask",
            call_tools(call("ask_question", question="Which colour?", options=colours)),
            tools=[so.ask_question()],
        ),
        # A workflow tool whose step is journaled, waiting on its question.
        agent("flow", call_tools(call("plan", customer="C1")), tools=[plan]),
        # A workflow tool with a step and an answered question journaled, waiting on its second.
        agent("flow2", call_tools(call("setup", customer="K1")), tools=[setup]),
        # Two calls of one response: one that needs no approval, one waiting on its approval.
        agent(
            "pair",
            call_tools(call("lookup", order_id="G1"), call("refund", order_id="G2")),
            tools=[lookup, refund],
        ),
        # An approval two people must give, one of whom has.
        agent("quorum", call_tools(call("wire", amount=500)), tools=[wire]),
        # A long turn (a snapshot taken on the way), then waiting on an approval.
        agent(
            "long",
            *[call_tools(call("lookup", order_id=f"L{i}")) for i in range(24)],
            call_tools(call("refund", order_id="L24")),
            tools=[lookup, refund],
        ),
        # A subagent's child session parked on an approval, mirrored on its parent.
        agent(
            "boss", call_tools(call("worker", message="refund D1")), tools=[so.delegate("worker")]
        ),
        agent("worker", call_tools(call("refund", order_id="D1"))),
        # An approval answered without resuming the turn (respond(resume=False)).
        agent("answered", call_tools(call("refund", order_id="E1"))),
    ]


async def park(rt: so.Runtime) -> dict[str, str]:
    """Start every scenario and leave it parked; returns the session id of each."""
    sessions = {}
    for name in SCENARIOS:
        result = await rt.generate(name, prompt=f"go {name}")
        sid = result.session_id
        if name == "two":
            first = result.pending[0].id
            result = await rt.generate(
                session_id=sid, approvals=[so.Decision(id=first, approved=True)]
            )
        elif name == "flow2":
            question = result.pending[0]
            option = next(o for o in question.options if o.label == ANSWERS[str(question.question)])
            result = await rt.respond(sid, [{"request_id": question.id, "option_id": option.id}])
        elif name == "quorum":
            vote = {"request_id": result.pending[0].id, "option_id": "approve"}
            result = await rt.respond(sid, [vote], principal=ALICE)
        elif name == "answered":
            vote = {"request_id": result.pending[0].id, "option_id": "approve"}
            await rt.respond(sid, [vote], resume=False)
        assert result.status == "waiting", (name, result)
        sessions[name] = sid
    return sessions
