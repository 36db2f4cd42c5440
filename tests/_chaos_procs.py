"""The runtime the chaos test's `signoff worker` and `signoff serve` processes load.

`runtime()` is the MODULE:RUNTIME target: one agent whose turn calls one or two gated tools
(`refund`, and `ship` when the prompt says "two") and a workflow tool (`plan`: a journaled
step, then a question); later messages get a text. A parent agent hands its prompt to a child
agent (the same tools and script as the first) with `so.delegate`. Every tool body and the step
write a `start` record (with their idempotency key and pid) before they sleep and a `done`
record after, fsync'd, to the file named by `SIGNOFF_TEST_RECORDS`, so the parent can count how
often each really ran.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal

import signoff as so

from ._procs import record_execution

__all__ = [
    "AGENT",
    "ALICE",
    "CHILD",
    "PARENT",
    "make_agent",
    "make_agents",
    "make_parent",
    "runtime",
]

AGENT = "chaos"
PARENT = "boss"
CHILD = "clerk"
ALICE = so.Principal(authenticator="token", principal_id="alice")
"""Who starts and answers every session: `signoff serve --token alice-token=alice` maps the
HTTP token to this principal, so answers from Python and over HTTP come from the same person."""


def make_agent(records: str, delay: float = 0.1, name: str = AGENT) -> so.Agent:
    """The chaos agent (or, named `CHILD`, the child agent); each tool body (and the step)
    takes `delay` seconds."""

    async def body(key: str, *, stall: bool = False) -> None:
        record_execution(records, f"start {key}", os.getpid())
        if stall:
            _stall_once()
        await asyncio.sleep(delay)
        record_execution(records, f"done {key}", os.getpid())

    @so.tool(approval=so.always())
    async def refund(ctx: so.ToolContext, order_id: str) -> str:
        """Refund an order."""
        await body(ctx.idempotency_key())
        return f"refunded {order_id}"

    @so.tool(approval=so.always())
    async def ship(ctx: so.ToolContext, order_id: str) -> str:
        """Ship a replacement."""
        await body(ctx.idempotency_key())
        return f"shipped {order_id}"

    @so.tool
    async def plan(ctx: so.ToolContext, order_id: str) -> str:
        """Quote a fee (a journaled step), then ask the customer."""

        async def quote() -> float:
            await body(ctx.idempotency_key("quote"), stall=True)
            return 12.5

        fee = await ctx.step("quote", quote)
        answer = await ctx.ask(f"A fee of {fee} applies. Proceed?", options=["yes", "no"])
        return f"plan {order_id}: {answer.value}"

    def first(conversation: list[so.Message]) -> so.ModelResponse:
        prompt = next(m.text for m in conversation if isinstance(m, so.UserMessage))
        order = {"order_id": prompt.split()[1]}
        calls = [so.ToolCall(id="call_refund", name="refund", input=order)]
        if "two" in prompt:
            calls.append(so.ToolCall(id="call_ship", name="ship", input=order))
        calls.append(so.ToolCall(id="call_plan", name="plan", input=order))
        return so.ModelResponse(tool_calls=calls)

    def finish(conversation: list[so.Message]) -> so.ModelResponse:
        results = sorted(
            json.dumps(m.content, sort_keys=True)
            for m in conversation
            if isinstance(m, so.ToolResultMessage)
        )
        return so.ModelResponse(text="done: " + " | ".join(results))

    def reply(conversation: list[so.Message]) -> so.ModelResponse:
        said = [m.text for m in conversation if isinstance(m, so.UserMessage)]
        return so.ModelResponse(text=f"noted: {said[-1]}")

    model = so.models.Scripted([first, finish, *[reply] * 100])
    return so.Agent(name=name, model=model, tools=[refund, ship, plan])


def _stall_once() -> None:
    """Stop this process (SIGSTOP) if it is the first to get here among those given the file
    `SIGNOFF_TEST_STALL_ONCE`, having written its pid there: the test wakes it once its lease
    lapsed, as a stall on an overloaded machine would."""
    path = os.environ.get("SIGNOFF_TEST_STALL_ONCE")
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    try:
        os.write(fd, str(os.getpid()).encode())
    finally:
        os.close(fd)
    os.kill(os.getpid(), signal.SIGSTOP)


def make_parent() -> so.Agent:
    """The parent agent: one delegate call hands its prompt to the child agent; then a text
    with the call's result; later messages get a text."""

    def first(conversation: list[so.Message]) -> so.ModelResponse:
        prompt = next(m.text for m in conversation if isinstance(m, so.UserMessage))
        call = so.ToolCall(id="call_delegate", name=CHILD, input={"message": prompt})
        return so.ModelResponse(tool_calls=[call])

    def finish(conversation: list[so.Message]) -> so.ModelResponse:
        results = [m.content for m in conversation if isinstance(m, so.ToolResultMessage)]
        return so.ModelResponse(text=f"delegated: {json.dumps(results, sort_keys=True)}")

    def reply(conversation: list[so.Message]) -> so.ModelResponse:
        said = [m.text for m in conversation if isinstance(m, so.UserMessage)]
        return so.ModelResponse(text=f"noted: {said[-1]}")

    model = so.models.Scripted([first, finish, *[reply] * 100])
    return so.Agent(name=PARENT, model=model, tools=[so.delegate(CHILD)])


def make_agents(records: str) -> list[so.Agent]:
    """The chaos agent, the parent agent and its child agent."""
    return [make_agent(records), make_parent(), make_agent(records, name=CHILD)]


def runtime() -> so.Runtime:
    """The factory `signoff worker` and `signoff serve` load; the store comes from `--store`."""
    records = os.environ["SIGNOFF_TEST_RECORDS"]
    return so.Runtime(make_agents(records), store="sqlite:///:memory:", lease_ttl=2.0)
