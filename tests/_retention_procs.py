"""The processes of the retention load test (`test_retention_load`): the runtime its two
`signoff worker`s load, and the pruner, a third process deleting as an operator's retention job
and an operator at the console would.

`runtime()` is the MODULE:RUNTIME target: the agent `desk`, whose first turn calls a gated
`refund` (prompt "approve"), a `confirm` tool asking a question (prompt "ask"), or both; a later
message parks on a question again ("park") or not; every turn ends with a `close` tool that
writes a record `closed <session> <turn>` (fsync'd, to the file named by `SIGNOFF_TEST_RECORDS`)
before the final text, so the test knows which turns ran to their end even once their session
is gone. The agent `boss` delegates its prompt to `desk` (a subagent's session), then closes;
`brief` is `desk` with a TTL of `BRIEF_TTL` seconds.

`python -m tests._retention_procs URL SECONDS LOG` is the pruner: for `SECONDS` it loops
`prune(older_than=PRUNE_AGE)` and `delete_session` of random listed sessions, and writes each
deletion (ids, time), refusal and unexpected error as a JSON line to `LOG`.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from typing import Any

import signoff as so
from signoff.testing import call, call_tools, reply, scripted_agent

from ._procs import record_execution

__all__ = [
    "AGENT",
    "ALICE",
    "BRIEF",
    "BRIEF_TTL",
    "OPS",
    "PARENT",
    "PRUNE_AGE",
    "make_agents",
    "runtime",
]

AGENT = "desk"
PARENT = "boss"
ALICE = so.Principal(authenticator="test", principal_id="alice")
OPS = so.Principal(authenticator="test", principal_id="ops")
BRIEF = "brief"
"""`desk` with a short TTL: a turn waiting on no one's answer expires, and is pruned then."""
BRIEF_TTL = 1.5
PRUNE_AGE = 0.3
"""Seconds a finished session stays before the pruner's `prune` may take it."""
REFUSED = (so.SessionBusy, so.SessionWaiting, so.SubagentSession, so.UnknownSession)
"""What `delete_session` may answer a live, subagent's or gone session: expected refusals."""


def _closer(records: str) -> so.Tool:
    """The `close` tool: writes `closed <session> <turn>`, so the test sees the turn ended."""

    @so.tool
    async def close(ctx: so.ToolContext) -> str:
        """Close the turn: recorded, so the test sees it ran to its end."""
        record_execution(records, f"closed {ctx.session.id} {ctx.session.turn}", os.getpid())
        return "closed"

    return close


def _desk(records: str, name: str = AGENT, ttl: float | None = None) -> so.Agent:
    @so.tool(approval=so.always())
    async def refund(ctx: so.ToolContext, order_id: str) -> str:
        """Refund an order."""
        record_execution(records, f"ran {ctx.session.id} {ctx.session.turn}", os.getpid())
        return f"refunded {order_id}"

    @so.tool
    async def confirm(ctx: so.ToolContext, order_id: str) -> str:
        """Ask the customer to confirm."""
        answer = await ctx.ask(f"Proceed with {order_id}?", options=["yes", "no"])
        return answer.value

    close = _closer(records)

    def step(conv: list[so.Message]) -> so.ModelResponse:
        last = conv[-1]
        if isinstance(last, so.ToolResultMessage):
            return reply("done") if last.tool_name == "close" else call_tools(call("close"))
        text = last.text if isinstance(last, so.UserMessage) else ""
        calls = []
        if text.startswith("order"):
            if "approve" in text:
                calls.append(call("refund", order_id=text.split()[1]))
            if "ask" in text:
                calls.append(call("confirm", order_id=text.split()[1]))
        elif "park" in text:
            calls.append(call("confirm", order_id="later"))
        return call_tools(*(calls or [call("close")]))

    return scripted_agent(
        name,
        [step],
        tools=[refund, confirm, close],
        limits=so.Limits(ttl=ttl),
        repeat_last=True,
    )


def _boss(records: str) -> so.Agent:
    close = _closer(records)

    def step(conv: list[so.Message]) -> so.ModelResponse:
        last = conv[-1]
        if isinstance(last, so.ToolResultMessage):
            return reply("done") if last.tool_name == "close" else call_tools(call("close"))
        text = last.text if isinstance(last, so.UserMessage) else ""
        if text.startswith("order"):
            return call_tools(call(AGENT, message=text))
        return call_tools(call("close"))

    return scripted_agent(PARENT, [step], tools=[so.delegate(AGENT), close], repeat_last=True)


def make_agents(records: str) -> list[so.Agent]:
    return [_desk(records), _boss(records), _desk(records, BRIEF, BRIEF_TTL)]


def runtime() -> so.Runtime:
    """The factory `signoff worker` loads; the store comes from `--store`."""
    return so.Runtime(make_agents(os.environ["SIGNOFF_TEST_RECORDS"]), store="sqlite:///:memory:")


async def prune_loop(url: str, seconds: float, log: str) -> None:
    """Prune and delete at random for `seconds`, writing what happened to `log`."""
    rng = random.Random()

    def write(**entry: Any) -> None:
        with open(log, "a") as f:
            f.write(json.dumps({**entry, "at": time.time()}) + "\n")

    async with so.Runtime(make_agents(os.devnull), store=url) as rt:
        write(op="ready")
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                ids = await rt.prune(older_than=PRUNE_AGE, by=OPS, reason="retention", limit=5)
                if ids:
                    write(op="prune", ids=ids)
                listed = await rt.sessions(limit=1000)
                for s in rng.sample(listed, min(2, len(listed))):
                    try:
                        gone = await rt.delete_session(s.id, by=OPS, reason="asked to")
                    except REFUSED as exc:
                        write(op="refused", id=s.id, error=type(exc).__name__)
                    else:
                        write(op="delete", ids=gone)
            except Exception as exc:  # the test fails on any
                write(op="error", error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(rng.uniform(0.01, 0.08))
        write(op="stopped")


if __name__ == "__main__":
    asyncio.run(prune_loop(sys.argv[1], float(sys.argv[2]), sys.argv[3]))
