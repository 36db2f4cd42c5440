"""The child of `tests/test_call_order_crash.py`: a turn whose model asks for three ungated calls
at once (`find`, `pack`, `ship`), SIGKILLed inside the second one's body.

`main(argv)` runs `[STORE_URL, RUNS]` in a forked child (`Scripts.run`): it starts the turn, and
`pack`'s body kills the process once it has noted its run in RUNS. `make_agent` is the agent the
parent resumes the turn with, and runs uninterrupted to compare.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import signoff as so
from signoff.testing import Capture, call, call_tools, scripted_agent

from ._procs import record_execution

__all__ = ["PROMPT", "main", "make_agent"]

PROMPT = "send order 7"


def make_agent(runs: str, answer: Capture, *, kill: bool = False) -> so.Agent:
    """The three calls in one response, then `answer`; each body notes its run in `runs`, and
    with `kill` the second one SIGKILLs the process as it runs."""

    @so.tool
    async def find(order_id: str) -> dict[str, Any]:
        """Find an order."""
        record_execution(runs, "find", os.getpid())
        return {"found": order_id}

    @so.tool
    async def pack(order_id: str) -> dict[str, Any]:
        """Pack an order."""
        record_execution(runs, "pack", os.getpid())
        if kill:
            os.kill(os.getpid(), signal.SIGKILL)
        return {"packed": order_id}

    @so.tool
    async def ship(order_id: str) -> dict[str, Any]:
        """Ship an order."""
        record_execution(runs, "ship", os.getpid())
        return {"shipped": order_id}

    calls = [
        call(name, call_id=f"c{i}", order_id="7")
        for i, name in enumerate(("find", "pack", "ship"), 1)
    ]
    return scripted_agent("shop", [call_tools(*calls), answer], tools=[find, pack, ship])


async def _main(url: str, runs: str) -> None:
    agent = make_agent(runs, Capture(), kill=True)
    async with so.Runtime([agent], store=url, lease_ttl=5.0) as rt:
        await rt.generate("shop", prompt=PROMPT)
    raise AssertionError("the turn ended: `pack` did not kill the process")


def main(argv: list[str]) -> None:
    asyncio.run(_main(*argv))
