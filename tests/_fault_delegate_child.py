"""Child process for the crash suite's delegation scenario: runs (or resumes) it to its end.

`python -m tests._fault_delegate_child` serves `[STORE_URL, RECORDS, DIR, KILL_AT, WHEN]`
commands, each in a forked child (`_forks`). The scenario is one turn of `support` that
delegates a refund to `billing` (a child session, whose refund needs a quorum of two, answered
on the parent's mirror), asks a quorum of two itself for `notify`, and waits on `hold`, whose
deadline passes unanswered and approves it (a sweep, `expire_due`, fires it). The child plays
the people and the clock (a `ManualClock` kept in DIR, so a restart goes on at the time the
dead process had reached). With KILL_AT N (0: never) the store's fault hook SIGKILLs the child
right WHEN (before or after) its N-th write; a child that ends gives the turn's final text,
how many writes it saw and their labels.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import signoff as so
import signoff.stores.postgres
import signoff.stores.sqlite  # each store imported once here, not in each child
from signoff.testing import ManualClock

from ._fault_child import TIMED, killed, record
from ._forks import serve

with contextlib.suppress(ImportError):  # what a runtime's first drive imports, if installed
    import opentelemetry.trace  # noqa: F401

ALICE = so.Principal(authenticator="test", principal_id="alice")
CAROL = so.Principal(authenticator="test", principal_id="carol")
PROMPT = "order 9 was charged twice"
START = 1_700_000_000.0
DEADLINE = 60.0


def make_agents(records: str) -> list[so.Agent]:
    @so.tool(approval=so.always(approvers=2))
    async def issue_refund(ctx: so.ToolContext, order_id: str, amount: float) -> str:
        """Refund an order."""
        record(records, "refund", ctx.idempotency_key())
        return f"refunded {amount} on {order_id}"

    @so.tool(approval=so.always(approvers=2))
    async def notify(ctx: so.ToolContext, order_id: str) -> str:
        """Tell the customer."""
        record(records, "notify", ctx.idempotency_key())
        return f"notified {order_id}"

    @so.tool(approval=so.always(expires_in=DEADLINE, on_timeout="approve"))
    async def hold(ctx: so.ToolContext, order_id: str) -> str:
        """Hold the order's next charge."""
        record(records, "hold", ctx.idempotency_key())
        return f"held {order_id}"

    def refunded(conversation: list[so.Message]) -> so.ModelResponse:
        last = conversation[-1]
        assert isinstance(last, so.ToolResultMessage), last
        return so.ModelResponse(text=f"billing: {last.content}")

    billing = so.Agent(
        name="billing",
        model=so.models.Scripted(
            [
                so.ModelResponse(
                    tool_calls=[
                        so.ToolCall(name="issue_refund", input={"order_id": "9", "amount": 20})
                    ]
                ),
                refunded,
            ]
        ),
        tools=[issue_refund],
    )

    def finish(conversation: list[so.Message]) -> so.ModelResponse:
        results = sorted(
            json.dumps(m.content, sort_keys=True)
            for m in conversation
            if isinstance(m, so.ToolResultMessage)
        )
        return so.ModelResponse(text="done: " + " | ".join(results))

    support = so.Agent(
        name="support",
        model=so.models.Scripted(
            [
                so.ModelResponse(
                    tool_calls=[
                        so.ToolCall(name="billing", input={"message": "refund order 9"}),
                        so.ToolCall(name="notify", input={"order_id": "9"}),
                        so.ToolCall(name="hold", input={"order_id": "9"}),
                    ]
                ),
                finish,
            ]
        ),
        tools=[so.delegate("billing"), notify, hold],
    )
    return [support, billing]


class Clock(ManualClock):
    """A manual clock whose time is kept in a file, so a restarted child resumes at it."""

    def __init__(self, path: Path) -> None:
        super().__init__(float(path.read_text()) if path.exists() else START)
        self.path = path

    def advance(self, seconds: float) -> float:
        now = super().advance(seconds)
        self.path.write_text(repr(now))
        return now


async def play(rt: so.Runtime, sid: str, clock: Clock) -> so.GenerateResult:
    """Answer what is pending until the turn ends: both quorums as Alice then Carol, and the
    hold left to its deadline, which the clock passes and a sweep applies."""
    r = await rt.generate(session_id=sid)  # resume whatever the crash interrupted
    for _ in range(60):
        if r.status == "completed":
            return r
        if r.status == "running":  # the dead process's lease is still live
            await asyncio.sleep(0.1)
            r = await rt.generate(session_id=sid)
            continue
        assert r.status == "waiting", r
        people = [p for p in r.pending if p.tool_name != "hold"]
        if not people:
            if clock.now < START + DEADLINE:
                clock.advance(2 * DEADLINE)
            await rt.expire_due()
            r = await rt.generate(session_id=sid)
            continue
        first = people[0]
        who = CAROL if any("alice" in by for by in first.approved_by) else ALICE
        reply = so.InputResponse(request_id=first.id, option_id="approve")
        r = await rt.respond(sid, [reply], principal=who)
    raise AssertionError(f"the turn did not end: {r}")


async def run(argv: list[str]) -> dict[str, Any]:
    store, records, where, kill_at, at = argv[0], argv[1], Path(argv[2]), int(argv[3]), argv[4]
    labels: list[str] = []

    def hook(when: str, label: str) -> None:
        if when != at or label in TIMED:
            return
        labels.append(label)
        if len(labels) == kill_at:
            killed(records, label)

    clock = Clock(where / "clock")
    rt = so.Runtime(make_agents(records), store=store, lease_ttl=5.0, clock=clock)
    async with rt:
        rt.store.set_fault_hook(hook)
        session_file = where / "session"
        if session_file.exists():
            sid = session_file.read_text().strip()
            if (await rt.state(sid)).seq <= 1:  # the prompt was never acknowledged: resent
                await rt.generate(session_id=sid, prompt=PROMPT, auth=ALICE)
        else:
            sid = await rt.create_session("support", auth=ALICE)
            session_file.write_text(sid)
            await rt.generate(session_id=sid, prompt=PROMPT, auth=ALICE)
        r = await play(rt, sid, clock)
        texts = [
            e.data.get("text", "")
            async for e in rt.events(sid, follow=False)
            if e.type == "model.completed"
        ]
        return {
            "status": r.status,
            "text": r.text,
            "texts": texts,
            "points": len(labels),
            "labels": labels,
            "session": sid,
        }


if __name__ == "__main__":
    serve(run)
