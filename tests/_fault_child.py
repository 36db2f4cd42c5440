"""Child process for the fault-injection test: runs (or resumes) one scenario to its end.

`python -m tests._fault_child` serves `[STORE_URL, RECORDS, SESSION_FILE, KILL_AT, WHEN]`
commands, each in a child of its own (`_forks`, so the kills do not pay a Python start each).
The scenario is one turn in which the model calls two gated tools (one with a long input) and a
workflow tool (a journaled step, then a question); the child plays the people, answering
whatever is pending. While that turn waits, Bob sends a message, which is queued for the turn's
end and then answered in a turn of its own.
With KILL_AT N (0: never) the store's fault hook SIGKILLs the child right WHEN (before or
after) its N-th commit point. A child that ends gives the turn's final text and how many commit
points it saw.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import signoff as so
import signoff.stores.postgres
import signoff.stores.sqlite  # each store imported once here, not in each child
from signoff.stores._base import LEASE_RENEWED

from ._forks import serve

with contextlib.suppress(ImportError):  # what a runtime's first drive imports, if installed
    import opentelemetry.trace  # noqa: F401

PEOPLE = so.Principal(authenticator="test", principal_id="alice")
BOB = so.Principal(authenticator="test", principal_id="bob")
PROMPT = "order 7 arrived broken"
BOB_MESSAGE = "bob here: where is my parcel?"
NOTE = " ".join(
    f"the {i}th box of order 7 came crushed, item {i * 7 % 13} broken" for i in range(20)
)
"""A long tool input: the approval request repeating it is stored on the model's response, so
the kills also land around rows that need the one before them to be read."""


TIMED = {LEASE_RENEWED}
"""Writes a timer makes (a lease renewed while a drive runs long): not at a fixed place in a
run, so neither counted nor killed at (a loaded machine's stall would shift every later point)."""


def killed(records: str, label: str) -> None:
    """Note which write the kill lands at (in `killed` beside `records`), then SIGKILL."""
    Path(records).with_name("killed").write_text(label)
    os.kill(os.getpid(), signal.SIGKILL)


def record(path: str, kind: str, key: str) -> None:
    """Append one execution record and fsync it, so a SIGKILL right after cannot lose it."""
    line = json.dumps({"kind": kind, "key": key, "pid": os.getpid()}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def gated_tools(records: str) -> tuple[so.Tool, so.Tool]:
    """`refund` and `ship`, each gated by an approval, each recording its runs in `records`."""

    @so.tool(approval=so.always())
    async def refund(
        ctx: so.ToolContext, order_id: str, amount: float, note: str
    ) -> dict[str, Any]:
        """Refund an order."""
        record(records, "refund", ctx.idempotency_key())
        return {"refunded": amount, "order_id": order_id}

    @so.tool(approval=so.always())
    async def ship(ctx: so.ToolContext, order_id: str) -> str:
        """Ship a replacement."""
        record(records, "ship", ctx.idempotency_key())
        return f"shipped {order_id}"

    return refund, ship


def answer_bob(conversation: list[so.Message]) -> so.ModelResponse:
    """Bob's turn: the model answers his message."""
    last = conversation[-1]
    assert isinstance(last, so.UserMessage), last
    return so.ModelResponse(text=f"to bob: {last.text}")


def make_agent(records: str) -> so.Agent:
    refund, ship = gated_tools(records)

    @so.tool
    async def plan(ctx: so.ToolContext, order_id: str) -> str:
        """Plan the remedy with the customer."""

        def quote() -> float:
            record(records, "quote", ctx.idempotency_key("quote"))
            return 12.5

        fee = await ctx.step("quote", quote)
        answer = await ctx.ask(f"A fee of {fee} applies. Proceed?", options=["yes", "no"])
        return f"plan for {order_id}: fee {fee}, customer said {answer.value}"

    def finish(conversation: list[so.Message]) -> so.ModelResponse:
        results = sorted(
            json.dumps(m.content, sort_keys=True)
            for m in conversation
            if isinstance(m, so.ToolResultMessage)
        )
        return so.ModelResponse(text="done: " + " | ".join(results))

    model = so.models.Scripted(
        [
            so.ModelResponse(
                tool_calls=[
                    so.ToolCall(name="refund", input={"order_id": "7", "amount": 30, "note": NOTE}),
                    so.ToolCall(name="ship", input={"order_id": "7"}),
                    so.ToolCall(name="plan", input={"order_id": "7"}),
                ]
            ),
            finish,
            answer_bob,
        ]
    )
    return so.Agent(name="support", model=model, tools=[refund, ship, plan])


async def run(argv: list[str]) -> dict[str, Any]:
    store, records, session_path, kill_at, at = argv[0], argv[1], argv[2], int(argv[3]), argv[4]
    labels: list[str] = []

    def hook(when: str, label: str) -> None:
        if when != at or label in TIMED:
            return
        labels.append(label)
        if len(labels) == kill_at:
            killed(records, label)

    # A TTL a loaded machine's stalls cannot outlast (a drive waking past its lease's expiry
    # gives the renewal a tenth of it); the parent lapses a killed child's lease (`lapse_leases`).
    rt = so.Runtime([make_agent(records)], store=store, lease_ttl=5.0)
    async with rt:
        rt.store.set_fault_hook(hook)
        session_file = Path(session_path)
        if session_file.exists():
            sid = session_file.read_text().strip()
            r = await rt.generate(session_id=sid)  # resume whatever the crash interrupted
            if r.status == "idle":  # the prompt was never acknowledged: the client resends it
                r = await rt.generate(session_id=sid, prompt=PROMPT, auth=PEOPLE)
        else:
            sid = await rt.create_session("support", auth=PEOPLE)
            session_file.write_text(sid)
            r = await rt.generate(session_id=sid, prompt=PROMPT, auth=PEOPLE)
        for _ in range(40):
            if r.status == "completed" and not (await rt.state(sid)).queued:
                break
            if r.status in ("running", "completed"):  # the dead process's lease is still live
                await asyncio.sleep(0.1)
                r = await rt.generate(session_id=sid)
                continue
            assert r.status == "waiting", r
            if not await sent(rt, sid):  # resent only when the store does not hold it
                r = await rt.send(sid, BOB_MESSAGE, principal=BOB)
                continue
            first = r.pending[0]
            if first.kind == "question":
                reply = so.InputResponse(request_id=first.id, option_id="yes")
            else:
                reply = so.InputResponse(request_id=first.id, option_id="approve")
            r = await rt.respond(sid, [reply], principal=PEOPLE)
        turns = [
            (e.data.get("message"), e.data.get("principal", {}).get("principal_id"))
            async for e in rt.events(sid, follow=False)
            if e.type == "turn.started"
        ]
        texts = [
            e.data.get("text", "")
            async for e in rt.events(sid, follow=False)
            if e.type == "model.completed"
        ]
        # The session's last turn: Bob's, whichever call ran it (Alice's answer is told hers).
        last = (await rt.state(sid)).turn
        assert last is not None
        return {
            "status": last.status,
            "text": last.text,
            "turns": turns,
            "texts": texts,
            "points": len(labels),
            "labels": labels,
            "session": sid,
        }


async def sent(rt: so.Runtime, sid: str) -> bool:
    """Whether Bob's message is in the session's log."""
    return any(
        [
            e.type == "turn.message" and e.data.get("message") == BOB_MESSAGE
            async for e in rt.events(sid, follow=False)
        ]
    )


if __name__ == "__main__":
    serve(run)
