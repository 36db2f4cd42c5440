"""Child for the crash test of a reply billed after its parent's cancel: this process drives the
parent's turn, cancels it while its subagent's model call is in flight, lets the reply come, and
is SIGKILLed right after the commit that records what it was billed on the child (`model.spent`),
before that is counted in the parent.

`python -m tests._late_bill_child` serves `[STORE_URL, NOW, SESSION_ID]` commands
(`tests._forks`): the runtime's clock reads NOW; SESSION_ID is the parent's (created already).
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import signoff as so
from signoff.stores import Commit
from signoff.testing import ManualClock

from ._forks import serve
from ._subagents import ALICE
from .test_subagents_spend import Slow, support

__all__ = ["agents", "run"]


def agents(model: Any = None) -> list[so.Agent]:
    """A parent of max_tokens=300 (its step 10 tokens) delegating to a child on `model`."""
    return [support(max_tokens=300), so.Agent(name="orders", model=model or Slow())]


async def run(args: list[str]) -> dict[str, Any]:
    url, now, sid = args
    model = Slow()
    async with so.Runtime(agents(model), store=url, clock=ManualClock(float(now))) as rt:
        commit = rt.store.commit

        async def killed(c: Commit) -> None:
            await commit(c)
            if any(e.type == "model.spent" for e in c.events):
                os.kill(os.getpid(), signal.SIGKILL)

        setattr(rt.store, "commit", killed)  # noqa: B010 (a method)
        running = asyncio.create_task(rt.generate(session_id=sid, prompt="refund", auth=ALICE))
        await asyncio.wait_for(model.started.wait(), 10)
        await rt.cancel(sid, principal=ALICE)
        model.release.set()
        result = await running
        return {"status": result.status}


if __name__ == "__main__":
    serve(run)
