"""Tools whose approvals each take another step a person does not: a deadline's escalation, a
deadline's approval or denial, a quorum's vote, a response policy's refusal; for the tests of
what each surface says of those steps (`signoff events`, the dashboard)."""

from __future__ import annotations

import signoff as so


def _finance_only(ctx: so.ResponseContext) -> so.Rejected:
    return so.Rejected("only finance approves payouts")


@so.tool(approval=so.always(expires_in=60, on_timeout="escalate", escalate_to="finance"))
async def escalated(x: str) -> str:
    """Handed to finance when no one decides in time."""
    return "ran"


@so.tool(approval=so.always(expires_in=60, on_timeout="approve"))
async def lapsed(x: str) -> str:
    """Approved when no one decides in time."""
    return "ran"


@so.tool(approval=so.always(expires_in=60))
async def refused(x: str) -> str:
    """Denied when no one decides in time."""
    return "ran"


@so.tool(approval=so.always(approvers=2))
async def paired(x: str) -> str:
    """Needs two approvals."""
    return "ran"


@so.tool(approval=so.ApprovalSpec(request=so.always(), response=_finance_only))
async def guarded(x: str) -> str:
    """Only finance may approve it."""
    return "ran"
