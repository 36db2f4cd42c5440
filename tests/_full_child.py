"""Child process for the store-failure tests: the disk fills while an approved tool runs.

`python -m tests._full_child STORE_URL RECORDS` parks a turn on a gated tool, approves it, and
in the tool's body caps this process's file size (`RLIMIT_FSIZE`, SIGXFSZ ignored) at the
store's files as they are, so the commit of the tool's result cannot grow them: SQLite fails as
on a full disk. The child prints the error the answer got, lifts the cap and answers again,
then prints the result: one JSON line each.
"""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import sys
from typing import Any

import signoff as so

from ._procs import emit, record_execution

UNLIMITED = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
FILLED: list[bool] = []


def fill_disk(db: str) -> None:
    """Cap the size of every file this process writes at the store's largest file now (the
    first time only: the disk fills once)."""
    if FILLED:
        return
    FILLED.append(True)
    sizes = [os.path.getsize(p) for p in (db, f"{db}-wal") if os.path.exists(p)]
    resource.setrlimit(resource.RLIMIT_FSIZE, (max(sizes), resource.RLIM_INFINITY))


def make_agent(records: str, db: str) -> so.Agent:
    @so.tool(approval=so.always())
    async def export_report(ctx: so.ToolContext, order_id: str) -> dict[str, Any]:
        """Send an order's report out: a side effect, and a large result to store."""
        record_execution(records, ctx.idempotency_key(), os.getpid())
        fill_disk(db)
        return {"order_id": order_id, "report": os.urandom(64 * 1024).hex()}

    model = so.models.Scripted(
        [
            so.ModelResponse(
                tool_calls=[so.ToolCall(id="call_1", name="export_report", input={"order_id": "7"})]
            ),
            so.ModelResponse(text="Report sent."),
        ]
    )
    return so.Agent(name="support", model=model, tools=[export_report])


async def main(url: str, records: str) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the cap fails, not kills
    db = url[len("sqlite:///") :]
    async with so.Runtime([make_agent(records, db)], store=url) as rt:
        r = await rt.generate("support", prompt="send the report of order 7")
        answer = [so.InputResponse(request_id=r.pending[0].id, option_id="approve")]
        try:
            await rt.respond(r.session_id, answer)
            emit({"event": "error", "type": None})
        except so.SignoffError as exc:
            emit({"event": "error", "type": type(exc).__name__, "message": str(exc)})
        resource.setrlimit(resource.RLIMIT_FSIZE, UNLIMITED)  # space again
        done = await rt.respond(r.session_id, answer)
        emit(
            {
                "event": "result",
                "session_id": r.session_id,
                "status": done.status,
                "text": done.text,
            }
        )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
