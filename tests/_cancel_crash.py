"""Child for the cancel crash test: `Runtime.cancel` of a parent whose subagent waits on an
approval, SIGKILLed right before or right after one of its writes.

`python -m tests._cancel_crash` serves `[STORE_URL, PARENT, KILL_AT, WHEN]` commands
(`tests._forks`): the cancel's store fault hook SIGKILLs the child right `WHEN` (before or after)
its KILL_AT-th write (0: never; audit entries and lease renewals are not counted). A child that
ends gives the cancel's status, how many writes it saw and their labels.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import signoff as so
import signoff.stores.postgres
import signoff.stores.sqlite  # the stores imported once here, not again in each child
from signoff.stores._base import AUDIT_RECORDED, LEASE_RENEWED

from ._forks import serve
from ._subagents import ALICE
from .test_subagents_spend import orders, support, tokens

__all__ = ["agents", "run"]


def agents() -> list[so.Agent]:
    """A parent delegating a refund to a child that spent 40 tokens and waits on its approval."""
    return [support(), orders(tokens(40))]


async def run(argv: list[str]) -> dict[str, Any]:
    url, parent, kill_at, when = argv[0], argv[1], int(argv[2]), argv[3]
    labels: list[str] = []

    def hook(at: str, label: str) -> None:
        if at != when or label in (AUDIT_RECORDED, LEASE_RENEWED):  # a timer makes renewals
            return
        labels.append(label)
        if len(labels) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    async with so.Runtime(agents(), store=url, lease_ttl=5.0) as rt:
        rt.store.set_fault_hook(hook)
        r = await rt.cancel(parent, principal=ALICE)
        rt.store.set_fault_hook(None)
        return {"status": r.status, "labels": labels}


if __name__ == "__main__":
    serve(run)
