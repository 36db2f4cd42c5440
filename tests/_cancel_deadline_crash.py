"""Child for the crash test of a cancel that records a passed deadline: `Runtime.cancel` of a
session whose approval's `on_timeout="approve"` deadline passed unrecorded, its own (`own`) or
its subagent's behind a mirror (`behind`), SIGKILLed right before or right after one of its
writes.

`python -m tests._cancel_deadline_crash` serves `[STORE_URL, SESSION, KIND, LOG, KILL_AT, WHEN]`
commands (`tests._forks`): the cancel's store fault hook SIGKILLs the child right `WHEN` (before
or after) its KILL_AT-th write (0: never; audit entries and lease renewals are not counted). The
refund tool records each run in the `ExecutionLog` at LOG. A child that ends gives the cancel's
status and the labels of the writes it saw.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import signoff as so
import signoff.stores.postgres
import signoff.stores.sqlite  # the stores imported once here, not again in each child
from signoff.stores._base import AUDIT_RECORDED, LEASE_RENEWED
from signoff.testing import ExecutionLog, ManualClock, call, call_tools, reply, scripted_agent

from ._forks import serve
from ._subagents import ALICE

__all__ = ["agents", "run", "waiting"]


def agents(kind: str, log: str) -> list[so.Agent]:
    """`support`, whose refund (its own for `own`, else `billing`'s, which it delegates to) asks
    for an approval that its deadline, 60 s on, approves; each refund run is recorded in `log`."""

    @so.tool(approval=so.always(expires_in=60, on_timeout="approve"))
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    tools: list[Any] = [ExecutionLog(log).tool(refund)]
    if kind == "own":
        return [
            scripted_agent(
                "support", [call_tools(call("refund", order_id="9")), reply("done")], tools=tools
            )
        ]
    child = scripted_agent(
        "billing", [call_tools(call("refund", order_id="9")), reply("refunded")], tools=tools
    )
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", message="refund 9")), reply("done")],
        tools=[so.delegate("billing")],
    )
    return [parent, child]


async def waiting(url: str, kind: str, log: str) -> str:
    """A session of `support` waiting on the refund's approval (a mirror of it for `behind`),
    asked an hour ago: its deadline passed, nothing recorded it."""
    clock = ManualClock(time.time() - 3600)
    async with so.Runtime(agents(kind, log), store=url, clock=clock) as rt:
        r = await rt.generate("support", "refund 9", auth=ALICE)
        assert r.status == "waiting" and len(r.pending) == 1, r
        assert (r.pending[0].child is None) == (kind == "own"), r
        return r.session_id


async def run(argv: list[str]) -> dict[str, Any]:
    url, sid, kind, log, kill_at, when = argv[0], argv[1], argv[2], argv[3], int(argv[4]), argv[5]
    labels: list[str] = []

    def hook(at: str, label: str) -> None:
        if at != when or label in (AUDIT_RECORDED, LEASE_RENEWED):  # a timer makes renewals
            return
        labels.append(label)
        if len(labels) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    async with so.Runtime(agents(kind, log), store=url, lease_ttl=5.0) as rt:
        rt.store.set_fault_hook(hook)
        r = await rt.cancel(sid, "never mind", principal=ALICE)
        rt.store.set_fault_hook(None)
        return {"status": r.status, "cancelled": r.cancelled, "labels": labels}


if __name__ == "__main__":
    serve(run)
