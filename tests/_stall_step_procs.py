"""The runtime `test_leasing_frozen_step` runs in `signoff worker` processes: one workflow tool
whose body records that it began, waits until the file `SIGNOFF_TEST_HOLD` exists (polling
often, so woken it is the first to run), then runs a journaled step that records each run (key
and pid) in `SIGNOFF_TEST_RECORDS`."""

from __future__ import annotations

import asyncio
import os

import signoff as so
from signoff.testing import call, call_tools, reply, scripted_agent

from ._procs import record_execution

__all__ = ["AGENT", "make_agent", "runtime"]

AGENT = "planner"


def make_agent(records: str, hold: str) -> so.Agent:
    """The agent: one call of `plan`, then a text."""

    @so.tool
    async def plan(ctx: so.ToolContext) -> str:
        """Quote a fee, once the hold is lifted."""
        record_execution(records, f"enter {ctx.idempotency_key()}", os.getpid())
        while not os.path.exists(hold):
            await asyncio.sleep(0.01)

        async def quote() -> float:
            record_execution(records, f"step {ctx.idempotency_key('quote')}", os.getpid())
            return 12.5

        return f"fee {await ctx.step('quote', quote)}"

    return scripted_agent(AGENT, [call_tools(call("plan")), reply("Planned.")], tools=[plan])


def runtime() -> so.Runtime:
    """The factory `signoff worker` loads; the store comes from `--store`."""
    agent = make_agent(os.environ["SIGNOFF_TEST_RECORDS"], os.environ["SIGNOFF_TEST_HOLD"])
    return so.Runtime([agent], store="sqlite:///:memory:")
