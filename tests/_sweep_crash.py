"""The children of `tests/test_sweep_crash.py`: a sweep SIGKILLed right after it recorded a
passed approval deadline, before it went on with the turn that deadline made runnable, or at
any write of its drive of that turn.

`main(argv)` runs `[STORE_URL, RECORDS, ON_TIMEOUT, MODE, SESSION]` in a forked child
(`Scripts.run`), on a `ManualClock` set past the deadline. MODE `sweep` is an inline runtime's
`expire_due()`, `listing` its `pending()` (which records the deadlines it meets, then goes on
with their turns), `worker-sweep` a worker's loop (`rt.work()`, whose sweep leaves the turn to its
claims): each dies at the deadline's commit (exit code 3 if it was never made). MODE `worker`
is a worker that runs until the session's turn has completed. MODE `sweep-at` and `listing-at`
take `[POINT, WHEN, LABELS, SHAPE]` more: the sweep (or listing) of SHAPE's agents (`agents`)
dies `WHEN` ("before" or "after") its POINT-th write, each write's label appended to the file
LABELS as it comes (POINT 0: never, exit code 0).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from typing import Any

import signoff as so
from signoff.stores import FaultHook
from signoff.stores._base import LEASE_RENEWED
from signoff.testing import ManualClock

from ._procs import record_execution

START = 1_700_000_000.0
DEADLINE = 60.0
PAST = START + 2 * DEADLINE  # the time of every process after the deadline
PROMPT = "Refund order 1042, it arrived broken"
DEADLINE_COMMITS = ("approval.settled", "input.resolved")
"""The labels of the deadline's commit (its first event's type): approved on timeout, denied."""


def make_agent(records: str, on_timeout: str, name: str = "support") -> so.Agent:
    """One gated refund whose approval nobody decides within `DEADLINE` seconds, then a text
    naming what became of the call (its result, or the timeout the model was told of)."""

    @so.tool(approval=so.always(expires_in=DEADLINE, on_timeout=on_timeout))  # type: ignore[arg-type]
    async def issue_refund(ctx: so.ToolContext, order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        record_execution(records, ctx.idempotency_key(), os.getpid())
        return {"refunded": amount, "order_id": order_id}

    def after(conversation: list[so.Message]) -> so.ModelResponse:
        last = conversation[-1]
        assert isinstance(last, so.ToolResultMessage), last
        return so.ModelResponse(text="after: " + json.dumps(last.content, sort_keys=True))

    call = so.ToolCall(
        id="call_refund", name="issue_refund", input={"order_id": "1042", "amount": 180.0}
    )
    model = so.models.Scripted([so.ModelResponse(tool_calls=[call]), after])
    return so.Agent(name=name, model=model, tools=[issue_refund])


def agents(records: str, on_timeout: str, shape: str = "plain") -> list[so.Agent]:
    """`plain`: the support agent of `make_agent`. `delegate`: a support agent that hands the
    prompt to a billing subagent (`make_agent`'s), then a text naming what it answered."""
    if shape == "plain":
        return [make_agent(records, on_timeout)]
    assert shape == "delegate", shape

    def after(conversation: list[so.Message]) -> so.ModelResponse:
        last = conversation[-1]
        assert isinstance(last, so.ToolResultMessage), last
        return so.ModelResponse(text="parent: " + json.dumps(last.content, sort_keys=True))

    call = so.ToolCall(id="call_billing", name="billing", input={"message": PROMPT})
    model = so.models.Scripted([so.ModelResponse(tool_calls=[call]), after])
    parent = so.Agent(name="support", model=model, tools=[so.delegate("billing")])
    return [parent, make_agent(records, on_timeout, "billing")]


def runtime(url: str, records: str, on_timeout: str, at: float, shape: str = "plain") -> so.Runtime:
    return so.Runtime(
        agents(records, on_timeout, shape), store=url, lease_ttl=2.0, clock=ManualClock(at)
    )


def _kill_after_deadline(when: str, label: str) -> None:
    if when == "after" and label in DEADLINE_COMMITS:
        os.kill(os.getpid(), signal.SIGKILL)


def _kill_at(point: int, when: str, labels: str) -> FaultHook:
    """A fault hook that appends each write's label to the file `labels` and dies `when` the
    `point`-th (0: never). Lease renewals, made on a timer, are not counted."""
    seen = 0

    def hook(at: str, label: str) -> None:
        nonlocal seen
        if at != when or label == LEASE_RENEWED:
            return
        seen += 1
        fd = os.open(labels, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (label + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        if seen == point:
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


async def _main(
    url: str,
    records: str,
    on_timeout: str,
    mode: str,
    sid: str,
    point: str = "0",
    when: str = "after",
    labels: str = "",
    shape: str = "plain",
) -> int:
    if mode in ("sweep-at", "listing-at"):
        async with runtime(url, records, on_timeout, PAST, shape) as rt:
            rt.store.set_fault_hook(_kill_at(int(point), when, labels))
            await (rt.expire_due() if mode == "sweep-at" else rt.pending())
            return 0
    async with runtime(url, records, on_timeout, PAST) as rt:
        if mode in ("sweep", "listing"):
            rt.store.set_fault_hook(_kill_after_deadline)
            await (rt.expire_due() if mode == "sweep" else rt.pending())
            return 3  # the deadline's commit was never made
        stop = asyncio.Event()
        if mode == "worker-sweep":
            rt.store.set_fault_hook(_kill_after_deadline)
            async with asyncio.timeout(20):
                await rt.work(stop=stop, idle_wait=0.05, sweep_every=0.05)
            return 3
        assert mode == "worker", mode
        worker = asyncio.create_task(rt.work(stop=stop, idle_wait=0.05, sweep_every=0.05))
        try:
            for _ in range(300):
                turn = (await rt.state(sid)).turn
                if turn is not None and turn.status == "completed":
                    return 0
                await asyncio.sleep(0.05)
            return 4  # the worker never finished the turn
        finally:
            stop.set()
            await worker


def main(argv: list[str]) -> None:
    raise SystemExit(asyncio.run(_main(*argv)))
