"""The clock state machine's agent (tools that wait on people with deadlines, a quorum, a response
policy), its people, its model of requests, and the check of every request's log against its
deadline (tests/test_properties_time.py and its regressions).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, TypeVar

import signoff as so
from signoff._deadlines import TIMED_OUT
from signoff._types import Message
from signoff.testing import ManualClock, call, call_tools, reply

__all__ = [
    "AGENT",
    "ALICE",
    "ALICE_LOCAL",
    "BOB",
    "CAROL",
    "DEADLINES",
    "EXPIRED",
    "FIONA",
    "PEOPLE",
    "Request",
    "Runs",
    "STEPS",
    "Slow",
    "T",
    "TOOLS",
    "TTL",
    "_expiry",
    "check_requests",
    "make_agent",
    "prompt",
]


T = TypeVar("T")

AGENT = "desk"
TTL = 200.0
EXPIRED = "session expired"
TOOLS = ("pay", "ship", "deploy", "wire", "note")
ALICE = so.Principal(authenticator="sso", principal_id="alice")  # starts every session
BOB = so.Principal(authenticator="sso", principal_id="bob")
CAROL = so.Principal(authenticator="sso", principal_id="carol")
ALICE_LOCAL = so.Principal(authenticator="local", principal_id="alice")  # alice, elsewhere
FIONA = so.Principal(authenticator="sso", principal_id="fiona", attributes={"groups": ["finance"]})
PEOPLE: dict[str, so.Principal | None] = {
    "alice": ALICE,
    "alice@local": ALICE_LOCAL,
    "bob": BOB,
    "carol": CAROL,
    "fiona": FIONA,
    "nobody": None,
}
# tool -> (expires_in, on_timeout); `note` asks nobody.
DEADLINES = {"pay": (60.0, "deny"), "ship": (90.0, "approve"), "deploy": (120.0, "deny")}
DEADLINES["wire"] = (60.0, "escalate")
STEPS = [0.5, 1.0, 30.0, 59.0, 60.0, 61.0, 119.0, 120.0, 199.0, 200.0, 201.0, 400.0]


@dataclass
class Runs:
    """How many times each tool body ran, by idempotency key."""

    count: Counter[str] = field(default_factory=Counter)
    where: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> session, call id


@dataclass
class Slow:
    """Seconds the response policy takes (it moves the clock while it decides)."""

    seconds: float = 0.0


def make_agent(runs: Runs, clock: ManualClock, slow: Slow) -> so.Agent:
    def ran(ctx: so.ToolContext) -> dict[str, str]:
        key = ctx.idempotency_key()
        runs.count[key] += 1
        runs.where[key] = (ctx.session.id, ctx.call_id)
        return {"ran": ctx.tool_name}

    @so.tool(approval=so.always(expires_in=60))
    async def pay(ctx: so.ToolContext, order: str) -> dict[str, str]:
        """Pay an invoice."""
        return ran(ctx)

    @so.tool(approval=so.always(expires_in=90, on_timeout="approve"))
    async def ship(ctx: so.ToolContext, order: str) -> dict[str, str]:
        """Ship an order."""
        return ran(ctx)

    @so.tool(approval=so.always(approvers=2, exclude_requester=True, expires_in=120))
    async def deploy(ctx: so.ToolContext, order: str) -> dict[str, str]:
        """Deploy a release."""
        return ran(ctx)

    async def finance(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
        """The requester may answer; once escalated, members of the group may too."""
        clock.advance(slow.seconds)  # a slow policy: the deadline may pass while it decides
        who = ctx.response.principal
        if who is not None and who.same_as(ctx.request.principal):
            return so.Allowed()
        group = ctx.request.escalated_to
        if group is not None and who is not None and group in who.attributes.get("groups", []):
            return so.Allowed()
        return so.Rejected("not the requester nor in the group it was escalated to")

    spec = so.ApprovalSpec(
        request=so.always(),
        response=finance,
        expires_in=60,
        on_timeout="escalate",
        escalate_to="finance",
    )

    @so.tool(approval=spec)
    async def wire(ctx: so.ToolContext, order: str) -> dict[str, str]:
        """Wire money."""
        return ran(ctx)

    @so.tool
    async def note(ctx: so.ToolContext, order: str) -> dict[str, str]:
        """Write a note."""
        return ran(ctx)

    def brain(messages: list[Message]) -> so.ModelResponse:
        last = messages[-1]
        if isinstance(last, so.UserMessage):
            turn = sum(isinstance(m, so.UserMessage) for m in messages)
            if not last.text.startswith("plan:"):
                return reply("noted")
            plan = last.text.split(":", 1)[1].split()
            calls = [call(n, call_id=f"t{turn}c{i}", order=str(turn)) for i, n in enumerate(plan)]
            return call_tools(*calls) if calls else reply("nothing to do")
        return reply("done")

    return so.Agent(
        name=AGENT,
        model=so.models.Scripted([brain], repeat_last=True),
        tools=[pay, ship, deploy, wire, note],
        limits=so.Limits(ttl=TTL),
    )


def prompt(plan: list[str]) -> str:
    return "plan:" + " ".join(plan)


@dataclass
class Request:
    """What the machine knows of a request: where it is, which tool asked."""

    id: str
    session_id: str
    tool: str


def _expiry(e: dict[str, Any]) -> bool:
    """Whether `e` records a session's TTL passing."""
    return e["type"] in ("input.resolved", "turn.failed") and e["data"].get("reason") == EXPIRED


def check_requests(log: list[dict[str, Any]]) -> None:
    """Walk one session's log: every request is decided by a person only before its deadline
    (or after its escalation, by the group), its on-timeout action is applied at most once and
    only once the deadline passed, and a quorum counts distinct eligible people."""
    asked: dict[str, dict[str, Any]] = {}
    escalated: dict[str, float] = {}
    votes: dict[str, list[str]] = {}
    resolved: dict[str, dict[str, Any]] = {}
    auto: set[str] = set()
    for e in log:
        d, at = e["data"], e["at"]
        if e["type"] == "input.requested":  # a request's defaults are left out of its data
            for r in d["requests"]:
                asked[r["id"]] = {"on_timeout": "deny", **r}
                votes[r["id"]] = []
            continue
        rid = d.get("request_id")
        if rid is None or rid not in asked:
            continue
        r = asked[rid]
        deadline = None if rid in escalated else r.get("expires_at")
        tool = (r.get("action") or {}).get("tool_name")
        if e["type"] == "approval.candidate":
            outcome = d["outcome"]
            if outcome in ("pending", "rejected", "stale", "failed", "timed-out"):
                continue
            assert rid not in resolved, f"{rid}: {outcome} after it closed"
            if outcome == "escalated":
                assert rid not in escalated and r["on_timeout"] == "escalate", d
                assert deadline is not None and at >= deadline, (at, deadline)
                escalated[rid] = at
                continue
            assert outcome == "counted", d
            assert deadline is None or at < deadline, f"{rid}: a vote counted after the deadline"
            who = d["by"]["principal_id"]
            assert who not in votes[rid], f"{rid}: {who} counted twice"
            assert who != "alice", f"{rid}: the requester counted"
            votes[rid].append(who)
        elif e["type"] == "approval.settled":
            assert rid not in resolved, f"{rid}: settled after it closed"
            if d.get("auto") == "timeout":
                assert d["by"] is None and r["on_timeout"] == "approve", d
                assert deadline is not None and at >= deadline, (at, deadline)
                assert rid not in auto, f"{rid}: approved twice on timeout"
                auto.add(rid)
                continue
            assert deadline is None or at < deadline, f"{rid}: settled by a person at {at}"
            who = (d.get("by") or {}).get("principal_id")
            if tool in ("pay", "ship"):
                assert who == "alice", d
            elif tool == "deploy":
                assert who not in (None, "alice"), d
                if d["decision"] == "approve":
                    by = d["approved_by"]
                    assert len(by) == 2 and len(set(by)) == 2 and "alice" not in by, d
            elif tool == "wire":
                assert who == "alice" or (who == "fiona" and rid in escalated), d
        elif e["type"] == "input.resolved":
            assert rid not in resolved, f"{rid} resolved twice"
            resolved[rid] = d
            if d["outcome"] != "expired":
                continue
            if d.get("reason") == EXPIRED:
                continue  # the session's TTL: checked with the log's times
            assert d.get("reason") == TIMED_OUT, d
            assert r["on_timeout"] in ("deny", "approve") and rid not in escalated, d
            assert deadline is not None and at >= deadline, (at, deadline)
            assert (rid in auto) == (r["on_timeout"] == "approve"), f"{rid}: on_timeout missed"
    assert auto <= set(resolved), "approved on timeout but never closed"
