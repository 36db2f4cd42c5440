"""The response-policy tests' principals, refund agent and policies (tenant guard, requester only),
shared by every tests/test_response_policies*.py file.
"""

from __future__ import annotations

from typing import Any

import signoff as so
from signoff.testing import (
    ExecutionLog,
    call,
    call_tools,
    reply,
    scripted_agent,
    timeline,
)

__all__ = [
    "ALICE",
    "BOB",
    "CANDIDATE_THEN_RAN",
    "MALLORY",
    "PEOPLE",
    "POLICIES",
    "REFUSED",
    "asked",
    "events_of",
    "lines",
    "ran",
    "refund_agent",
    "requester_only",
    "same_principal",
    "tenant_guard",
]


ALICE = so.Principal(
    authenticator="slack", issuer="T01", principal_id="alice", attributes={"tenant_id": "t1"}
)
BOB = so.Principal(
    authenticator="slack", issuer="T01", principal_id="bob", attributes={"tenant_id": "t1"}
)
MALLORY = so.Principal(
    authenticator="slack", issuer="T99", principal_id="mallory", attributes={"tenant_id": "t2"}
)
PEOPLE: dict[str, so.Principal | None] = {
    "requester": ALICE,
    "another user": BOB,
    "other tenant": MALLORY,
    "anonymous": None,
    "app": so.APP_PRINCIPAL,
}


def lines(events: list[so.Event]) -> list[str]:
    """`timeline()`, with the outcome of each `approval.candidate`."""
    out = []
    for e, line in zip(events, timeline(events), strict=True):
        if e.type == "approval.candidate":
            line = f"approval.candidate {e.data['outcome']}"
        out.append(line)
    return out


async def events_of(rt: so.Runtime, session_id: str, after: int = 0) -> list[so.Event]:
    return [e async for e in rt.events(session_id, after, follow=False)]


def refund_agent(log: ExecutionLog, approval: Any, **kwargs: Any) -> so.Agent:
    @log.tool(approval=approval, **kwargs)
    async def refund_charge(tenant_id: str, charge_id: str, amount: float) -> dict[str, Any]:
        """Refund a charge."""
        return {"refunded": amount, "charge": charge_id}

    return scripted_agent(
        "billing",
        [
            call_tools(call("refund_charge", tenant_id="t1", charge_id="ch_1", amount=50)),
            reply("done"),
        ],
        tools=[refund_charge],
    )


async def asked(rt: so.Runtime, auth: so.Principal | None) -> tuple[str, so.InputRequest, int]:
    """Start a turn that waits on one approval; return the session, the request and the head."""
    r = await rt.generate("billing", prompt="refund ch_1", auth=auth)
    assert r.status == "waiting"
    (req,) = r.pending
    assert req.requested_by == auth
    head = await rt.store.head(r.session_id)
    assert head is not None
    return r.session_id, req, head


# -- response policies used below -----------------------------------------------------------------


def tenant_guard(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
    """Responders of the call's tenant (and the app itself) may settle; no one else."""
    who = ctx.response.principal
    if who is not None and who.same_as(so.APP_PRINCIPAL):
        return so.Allowed()
    tenant = None if who is None else who.attributes.get("tenant_id")
    if tenant is not None and tenant == ctx.request.tool_input.tenant_id:
        return so.Allowed()
    return so.Rejected("Responder cannot act for this tenant.")


def same_principal(a: so.Principal, b: so.Principal) -> bool:
    return (
        a.authenticator == b.authenticator
        and a.issuer == b.issuer
        and a.principal_type == b.principal_type
        and a.principal_id == b.principal_id
    )


def requester_only(ctx: so.ResponseContext) -> dict[str, Any]:
    """eve's publish_release policy: only the person who asked may respond."""
    asker, responder = ctx.request.principal, ctx.response.principal
    if asker is not None and responder is not None and same_principal(responder, asker):
        return {"status": "allowed"}
    return {
        "status": "rejected",
        "reason": "Only the person who asked for this release can respond.",
    }


POLICIES: dict[str, Any] = {"tenant guard": tenant_guard, "requester only": requester_only}


# -- the events an answer records ----------------------------------------------------------------


def ran(decision: str) -> list[str]:
    if decision == "approve":
        return [
            "approval.settled approve",
            "input.resolved approved",
            "tool.started refund_charge",
            "tool.completed refund_charge ok",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
    return [
        "approval.settled cancel",
        "input.resolved cancelled",
        "tool.completed refund_charge denied",
        "model.completed",
        "turn.completed",
        "session.waiting",
    ]


REFUSED = ["approval.candidate pending", "approval.candidate rejected", "turn.waiting"]


CANDIDATE_THEN_RAN = ["approval.candidate pending", *ran("approve")]
