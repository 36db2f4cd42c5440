"""Child for the crash test of a parent whose TTL passed while its subagent waited: this process
records the parent's expiry (`rt.expire_due()`) and is SIGKILLed right after the commit that
cancels the child's turn, before what the child spent is counted in the parent.

`python -m tests._expired_spend_child` serves `[STORE_URL, NOW]` commands (`tests._forks`): the
runtime's clock reads NOW; a child that survives gives what `expire_due()` returned.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import signoff as so
from signoff.stores import Commit
from signoff.testing import ManualClock

from ._forks import serve
from .test_subagents_spend import orders, support, tokens

__all__ = ["agents", "run"]


def agents() -> list[so.Agent]:
    """A parent with a TTL of 60 s delegating a refund to a child that spent 40 tokens."""
    return [support(ttl=60), orders(tokens(40))]


async def run(args: list[str]) -> dict[str, Any]:
    url, now = args
    async with so.Runtime(agents(), store=url, clock=ManualClock(float(now))) as rt:
        commit = rt.store.commit

        async def killed(c: Commit) -> None:
            await commit(c)
            # The parent's expiry fails its turn: only the child's turn is cancelled.
            if any(e.type == "turn.cancelled" for e in c.events):
                os.kill(os.getpid(), signal.SIGKILL)

        setattr(rt.store, "commit", killed)  # noqa: B010 (a method)
        return {"expired": await rt.expire_due()}


if __name__ == "__main__":
    serve(run)
