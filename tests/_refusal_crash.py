"""The children of `tests/test_refusal_crash.py`: Mallory's approval, which the response policy
refuses (she is of another tenant), SIGKILLed right before or right after one of its commits.

`main(argv)` runs `[STORE_URL, RECORDS, SESSION, REQUEST, WHEN, POINT, LABELS]` in a forked
child (`Scripts.run`), on a `ManualClock` at `START`: Mallory approves REQUEST, and the store's
fault hook SIGKILLs the child right WHEN (before or after) its POINT-th commit, once it wrote
that commit's label to LABELS. With POINT 0 it is never killed and writes the labels of every
commit the answer made (exit code 3: POINT was past them).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import signoff as so
from signoff.stores._base import LEASE_RENEWED
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from ._procs import record_execution
from ._response_policies import MALLORY, tenant_guard

__all__ = ["LATER", "REASON", "START", "approve", "main", "runtime"]

START = 1_700_000_000.0
POLICY_TIMEOUT = 1.0
LATER = START + 60.0
"""The time of every process after the kill: past the policy's timeout and `RECOVERY_GRACE`, so
a candidate the killed child left pending is taken for lost (its judging died with it)."""
REASON = "Responder cannot act for this tenant."
"""What `tenant_guard` refuses Mallory's answer with."""


def make_agent(records: str) -> so.Agent:
    """One refund gated by an approval that `tenant_guard` judges, then a text; each run of the
    refund's body is appended to `records`."""
    spec = so.ApprovalSpec(request=so.always(), response=tenant_guard, timeout=POLICY_TIMEOUT)

    @so.tool(approval=spec)
    async def refund_charge(
        ctx: so.ToolContext, tenant_id: str, charge_id: str, amount: float
    ) -> dict[str, Any]:
        """Refund a charge."""
        record_execution(records, ctx.idempotency_key(), os.getpid())
        return {"refunded": amount, "charge": charge_id}

    ask = call_tools(call("refund_charge", tenant_id="t1", charge_id="ch_1", amount=50))
    return scripted_agent("billing", [ask, reply("done")], tools=[refund_charge])


def runtime(url: str, records: str, at: float) -> so.Runtime:
    return so.Runtime([make_agent(records)], store=url, lease_ttl=5.0, clock=ManualClock(at))


def approve(request_id: str) -> list[so.InputResponse]:
    return [so.InputResponse(request_id=request_id, option_id="approve")]


async def _main(
    url: str, records: str, sid: str, rid: str, when: str, point: str, labels: str
) -> int:
    seen: list[str] = []

    def hook(at: str, label: str) -> None:
        if at != when or label == LEASE_RENEWED:  # a timer's write: at no fixed place
            return
        seen.append(label)
        if len(seen) == int(point):
            Path(labels).write_text(json.dumps(seen))
            os.kill(os.getpid(), signal.SIGKILL)

    async with runtime(url, records, START) as rt:
        rt.store.set_fault_hook(hook)
        r = await rt.respond(sid, approve(rid), principal=MALLORY)
        rt.store.set_fault_hook(None)
        (outcome,) = r.outcomes
        assert (r.status, outcome.outcome, outcome.reason) == ("waiting", "rejected", REASON), r
    Path(labels).write_text(json.dumps(seen))
    return 3 if int(point) else 0


def main(argv: list[str]) -> None:
    raise SystemExit(asyncio.run(_main(*argv)))
