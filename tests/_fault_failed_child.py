"""Child process for the crash test of a turn that fails for good with a message queued behind
it: runs (or resumes) one scenario to its end.

`python -m tests._fault_failed_child` serves `[STORE_URL, RECORDS, SESSION_FILE, KILL_AT, WHEN,
BY]` commands as `tests._fault_child` does. Alice's turn calls two gated tools (one with a long
input), which the child approves one at a time; its agent allows one model step a turn, so once
their results are in the turn fails for good (`max_steps`). While it waits, Bob sends a message,
queued for the turn's end: it starts after the failure and is answered in a turn of its own.
With KILL_AT N (0: never) the store's fault hook SIGKILLs the child right WHEN (before or
after) its N-th commit point. A restarted child that finds Alice's turn failed and Bob's not
started (the kill fell between those two commits) resumes it BY a `call` (the default) or a
`worker` first. A child that ends gives the turns, texts and errors the store holds, and the
labels of the commit points it saw.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import signoff as so

from ._fault_child import (
    BOB,
    BOB_MESSAGE,
    NOTE,
    PEOPLE,
    PROMPT,
    TIMED,
    answer_bob,
    gated_tools,
    killed,
    sent,
)
from ._forks import serve

__all__ = ["make_agent", "run"]


def make_agent(records: str) -> so.Agent:
    """Alice's one model step calls `refund` and `ship`, both gated; a second step would pass
    `max_steps=1`, so her turn fails there. Bob's turn takes the script's second response."""

    refund, ship = gated_tools(records)

    model = so.models.Scripted(
        [
            so.ModelResponse(
                tool_calls=[
                    so.ToolCall(name="refund", input={"order_id": "7", "amount": 30, "note": NOTE}),
                    so.ToolCall(name="ship", input={"order_id": "7"}),
                ]
            ),
            answer_bob,
        ]
    )
    return so.Agent(
        name="support", model=model, tools=[refund, ship], limits=so.Limits(max_steps=1)
    )


def answered(state: so.SessionState) -> bool:
    """Whether the scenario is over: a turn completed (only Bob's can) and nothing queued."""
    return state.turn is not None and state.turn.status == "completed" and not state.queued


async def between(rt: so.Runtime, sid: str) -> list[str] | None:
    """When the kill left Alice's failure committed and Bob's turn not started, the sessions'
    statuses as the store lists them (what a worker claims by); else None."""
    state = await rt.state(sid)
    turn = state.turn
    if turn is None or turn.status != "failed" or turn.retryable or not state.queued:
        return None
    return [s.status for s in await rt.store.sessions()]


async def resumed(rt: so.Runtime, sid: str, by: str) -> str:
    """Resume the session `by` a `call` (`generate` with no prompt, which runs the turn Bob's
    message starts and returns it; retried while the dead process's lease lasts), or by a
    `worker` (`Runtime.work`, as if nobody called again) until Bob's turn is answered or 5 s
    have passed: what the call returned, or whether the worker answered Bob."""
    if by == "call":
        for _ in range(20):
            r = await rt.generate(session_id=sid)
            if r.status != "running":
                break
            await asyncio.sleep(0.1)
        return r.status
    stop = asyncio.Event()
    working = asyncio.create_task(rt.work(stop=stop, idle_wait=0.05))
    try:
        for _ in range(100):
            if answered(await rt.state(sid)):
                return "answered"
            await asyncio.sleep(0.05)
        return "not answered"
    finally:
        stop.set()
        await asyncio.wait_for(working, timeout=10)


async def run(argv: list[str]) -> dict[str, Any]:
    store, records, session_path, kill_at, at = argv[0], argv[1], argv[2], int(argv[3]), argv[4]
    by = argv[5] if len(argv) > 5 else "call"
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
        window: dict[str, Any] | None = None
        if session_file.exists():
            sid = session_file.read_text().strip()
            stored = await between(rt, sid)
            if stored is not None:
                window = {"stored": stored, by: await resumed(rt, sid, by)}
            r = await rt.generate(session_id=sid)  # resume whatever the crash interrupted
            if r.status == "idle":  # the prompt was never acknowledged: the client resends it
                r = await rt.generate(session_id=sid, prompt=PROMPT, auth=PEOPLE)
        else:
            sid = await rt.create_session("support", auth=PEOPLE)
            session_file.write_text(sid)
            r = await rt.generate(session_id=sid, prompt=PROMPT, auth=PEOPLE)
        calls = [r.status]
        for _ in range(40):
            if answered(await rt.state(sid)):
                break
            # running: the dead process's lease is still live; failed: Alice's turn, with Bob's
            # message left to start (a resume starts it) unless it already has
            if r.status in ("running", "completed", "failed"):
                await asyncio.sleep(0.1)
                r = await rt.generate(session_id=sid)
            elif not await sent(rt, sid):  # resent only when the store does not hold it
                assert r.status == "waiting", r
                r = await rt.send(sid, BOB_MESSAGE, principal=BOB)
            else:
                assert r.status == "waiting", r
                first = r.pending[0]
                reply = so.InputResponse(request_id=first.id, option_id="approve")
                r = await rt.respond(sid, [reply], principal=PEOPLE)
            calls.append(r.status)
        state = await rt.state(sid)
        events = [e async for e in rt.events(sid, follow=False)]
        return {
            "status": None if state.turn is None else state.turn.status,
            "session_status": state.status,
            "stored": [s.status for s in await rt.store.sessions()],
            "text": None if state.turn is None else state.turn.text,
            "queued": len(state.queued),
            "turns": [
                (e.data.get("message"), e.data.get("principal", {}).get("principal_id"))
                for e in events
                if e.type == "turn.started"
            ],
            "ends": [
                (e.type, e.data.get("error"), e.data.get("retryable"))
                for e in events
                if e.type in ("turn.completed", "turn.failed", "turn.cancelled")
            ],
            "texts": [e.data.get("text", "") for e in events if e.type == "model.completed"],
            "calls": calls,
            "window": window,
            "labels": labels,
            "points": len(labels),
            "session": sid,
        }


if __name__ == "__main__":
    serve(run)
