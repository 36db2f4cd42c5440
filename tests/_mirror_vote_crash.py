"""Child for the keyed-vote-through-a-mirror crash test: Bob's "approve", sent with an
idempotency key to a parent whose subagent's refund needs two approvers, SIGKILLed right after
the subagent's session committed his vote (its `approval.candidate`), before the parent kept
the key.

`python -m tests._mirror_vote_crash` serves `[STORE_URL, PARENT]` commands (`tests._forks`). A
child that is not killed (its vote made no such commit) gives the send's status and the labels
of the writes it saw.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import signoff as so
import signoff.stores.postgres
import signoff.stores.sqlite  # the stores imported once here, not again in each child
from signoff.stores._base import AUDIT_RECORDED, LEASE_RENEWED
from signoff.testing import call, call_tools, reply, scripted_agent

from ._forks import serve
from ._subagents import Counted

__all__ = ["BOB", "CAROL", "KEY", "agents", "run"]

BOB = so.Principal(authenticator="okta", principal_id="bob")
CAROL = so.Principal(authenticator="okta", principal_id="carol")
KEY = "vote-1"


def agents(ran: list[str], after: Counted, distinct: bool = True) -> list[so.Agent]:
    """A support agent delegating refund 1042 to billing, whose refund two people approve (two
    approvals by one person when not `distinct`); the support agent's model, once the delegate
    call ends (or a message steers it), is `after`."""

    @so.tool(approval=so.always(approvers=2, distinct=distinct))
    async def refund(order_id: str) -> str:
        """Refund an order."""
        ran.append(order_id)
        return "refunded"

    child = scripted_agent(
        "billing",
        [call_tools(call("refund", call_id="c1", order_id="1042")), reply("done")],
        tools=[refund],
        repeat_last=True,
    )
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", call_id="d1", message="Refund 1042")), after],
        tools=[so.delegate("billing", description="Billing specialist.")],
        repeat_last=True,
    )
    return [parent, child]


async def run(argv: list[str]) -> dict[str, Any]:
    url, parent = argv
    labels: list[str] = []

    def hook(at: str, label: str) -> None:
        if at != "after" or label in (AUDIT_RECORDED, LEASE_RENEWED):  # a timer makes renewals
            return
        labels.append(label)
        if label == "approval.candidate":
            os.kill(os.getpid(), signal.SIGKILL)

    async with so.Runtime(agents([], Counted("Done.")), store=url, lease_ttl=5.0) as rt:
        rt.store.set_fault_hook(hook)
        r = await rt.send(parent, "approve", principal=BOB, idempotency_key=KEY)
        rt.store.set_fault_hook(None)
        return {"status": r.status, "labels": labels}


if __name__ == "__main__":
    serve(run)
