"""The child process of `test_close_processes`: a runtime drives one turn until a call is in
flight (an async tool body, a plain step's thread, a model call), then closes while it runs,
says what the call raised, and stays alive (its lease, had it been kept, would then be live).

Run as `python -m tests._close_child STORE RECORDS WHAT`; it prints JSON lines."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from typing import Any

import signoff as so
from signoff.testing import call, call_tools, reply, scripted_agent

from ._procs import record_execution

__all__ = ["WHAT", "make_agent"]

WHAT = ("tool", "step", "model")
"""What is in flight when the runtime closes."""


def make_agent(records: str, what: str, entered: Any = None) -> so.Agent:
    """An agent whose turn has `what` in flight: a tool body (async), a plain step, or its
    second model call; each run is recorded, then (given `entered`) waits until the runtime
    closes. Without `entered` (the resumer) each returns at once."""

    def mark(key: str) -> None:
        record_execution(records, key, os.getpid())

    def charge(card: str) -> str:
        mark("step")
        if entered is not None:
            entered.set()
            time.sleep(0.5)  # a blocking client's call, still under way as the runtime closes
        return f"charged {card}"

    @so.tool
    async def pay(ctx: so.ToolContext, card: str) -> str:
        """Charge the card."""
        if what == "step":
            return str(await ctx.step("charge", charge, card))
        mark("tool " + ctx.idempotency_key())
        if entered is not None and what == "tool":
            entered.set()
            await asyncio.Event().wait()
        return f"charged {card}"

    async def last(conversation: list[so.Message]) -> so.ModelResponse:
        mark("model")
        if entered is not None and what == "model":
            entered.set()
            await asyncio.Event().wait()
        return reply("Paid.")

    return scripted_agent("shop", [call_tools(call("pay", card="4242")), last], tools=[pay])


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def _main(url: str, records: str, what: str) -> None:
    entered = threading.Event()
    rt = so.Runtime([make_agent(records, what, entered)], store=url, lease_ttl=600)
    turn = asyncio.create_task(rt.generate("shop", "pay"))
    await asyncio.to_thread(entered.wait, 30)
    [sid] = [s.id for s in await rt.sessions()]
    began = time.monotonic()
    await rt.close()
    took = time.monotonic() - began
    try:
        await turn
        raised = None
    except so.SignoffError as exc:
        raised = f"{type(exc).__name__}: {exc}"
    try:
        await rt.state(sid)
        after = None
    except so.SignoffError as exc:  # pragma: no cover - a later call opens it again
        after = f"{type(exc).__name__}: {exc}"
    await rt.close()
    emit({"event": "closed", "session_id": sid, "raised": raised, "took": took, "after": after})
    while True:  # alive: a lease not given back would be live for 600 s
        time.sleep(3600)


if __name__ == "__main__":
    asyncio.run(_main(*sys.argv[1:4]))
