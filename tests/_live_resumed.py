"""The ways a value reaches a run, each seen live and again by a new runtime that resumes the
session, as another process would (tests/test_live_resumed.py).

A `Probe` has one agent per way in, each of whose turns parks on a person: `live` runs them in
one runtime, `resume` answers them in another, and `outcomes` says, for each, what the run saw
both times, or the named error that refused the value where it entered.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import signoff as so
from signoff._recording import load_journal
from signoff.testing import call, call_tools, reply, scripted_agent, store_contents

__all__ = ["CHANNELS", "Outcome", "Probe", "is_json", "same"]

CHANNELS = ("result", "step", "input", "payload", "decision", "principal", "state")
"""A tool's result as the model reads it, a step's result as its tool does, a model's call
input as the tool does, an approval payload as a reviewer does, a decision's value as the model
reads the call's result, the caller's attributes as a tool does, and every session's state as
the runtime holds it (`SessionState.to_snapshot()`)."""

YES = "yes"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one way in came to: `refused` names the error, else the run saw `live`, then
    `resumed`."""

    refused: str | None = None
    live: Any = None
    resumed: Any = None


def same(a: Any, b: Any) -> bool:
    """Whether `a` and `b` are the same value to a program: equal, of the same types all the
    way down (a tuple is not a list, an IntEnum not an int), with dict keys in the same order,
    NaN equal to NaN and -0.0 not equal to 0.0."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        )
    return bool(a == b)


def is_json(value: Any) -> bool:
    """Whether `value` is made only of what JSON reads back: dicts with text keys, lists, text,
    ints, finite floats, booleans and None (of exactly those types)."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is dict:
            if not all(type(k) is str for k in item):
                return False
            stack.extend(item.values())
        elif kind is list:
            stack.extend(item)
        elif kind is float:
            if not math.isfinite(item):
                return False
        elif kind not in (str, int, bool, type(None)):
            return False
    return True


class Probe:
    """One value sent into a run every way `CHANNELS` names."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.seen: dict[str, list[Any]] = defaultdict(list)
        self.refused: dict[str, str] = {}
        self.parked: dict[str, so.GenerateResult] = {}
        # Each session's state as the live runtime holds it, and as the next one loads it.
        self.states: list[dict[str, Any]] = []

    def principal(self) -> so.Principal:
        return so.Principal(authenticator="t", principal_id="ann", attributes={"v": self.value})

    def agents(self) -> list[so.Agent]:
        """The probe's agents, built anew for each runtime (a scripted model plays its steps
        from the response the session is at)."""
        value, seen = self.value, self.seen

        @so.tool
        async def confirm(ctx: so.ToolContext) -> str:
            """Ask a person to go on."""
            return (await ctx.ask("go on?", options=[YES, "no"])).value

        @so.tool
        async def give() -> Any:
            """Return the value."""
            return value

        @so.tool
        async def flow(ctx: so.ToolContext) -> str:
            """Step, then ask."""
            try:
                got = await ctx.step("value", lambda: value)
            except Exception as exc:
                got = ("raised", type(exc), str(exc))
            seen["step"].append(got)
            return (await ctx.ask("go on?", options=[YES, "no"])).value

        @so.tool
        async def take(ctx: so.ToolContext, v: Any) -> str:
            """Take the value as input, then ask."""
            seen["input"].append(v)
            return (await ctx.ask("go on?", options=[YES, "no"])).value

        @so.tool
        async def gate(ctx: so.ToolContext) -> None:
            """Ask approval with the value as payload."""
            ctx.request_approval({"v": value})

        @so.tool
        async def refund(ctx: so.ToolContext, amount: int) -> None:
            """Ask approval: the decision becomes the result."""
            ctx.request_approval({"amount": amount})

        @so.tool
        async def who(ctx: so.ToolContext) -> str:
            """Look at the caller's attributes, then ask."""
            current = ctx.session.auth.current
            seen["principal"].append(None if current is None else current.attributes)
            return (await ctx.ask("go on?", options=[YES, "no"])).value

        def reader(channel: str, then: so.ModelResponse) -> Any:
            def read(conversation: list[Any]) -> so.ModelResponse:
                first = next(m for m in conversation if isinstance(m, so.ToolResultMessage))
                seen[channel].append(first.content)
                return then

            return read

        done = reply("done")
        result_steps = [
            call_tools(call("give")),
            reader("result", call_tools(call("confirm"))),
            reader("result", done),
        ]
        take_call = so.ToolCall(name="take", input={"v": value})
        return [
            scripted_agent("result", result_steps, tools=[give, confirm]),
            scripted_agent("step", [call_tools(call("flow")), done], tools=[flow]),
            scripted_agent("input", [call_tools(take_call), done], tools=[take]),
            scripted_agent("payload", [call_tools(call("gate")), done], tools=[gate]),
            scripted_agent(
                "decision",
                [
                    call_tools(call("refund", amount=5)),
                    reader("decision", done),
                    reader("decision", done),
                ],
                tools=[refund],
            ),
            scripted_agent("principal", [call_tools(call("who")), done], tools=[who]),
        ]

    async def live(self, rt: so.Runtime) -> None:
        """Start every way in, as the process that first sees the value."""
        for channel in ("result", "step", "input", "payload", "decision"):
            self.parked[channel] = await rt.generate(channel, prompt="go")
        failed = self.parked["input"]
        if failed.status == "failed":
            assert failed.error is not None and failed.error["code"] == "model_error"
            self.refused["input"] = "ModelError"
        payload = self.parked["payload"]
        self.seen["payload"].append([r.payload for r in payload.pending])
        asked = self.parked["decision"]
        before = await store_contents(rt.store, asked.session_id)
        decision = so.Decision(id=asked.pending[0].id, approved=True, value=self.value)
        try:
            await rt.generate(session_id=asked.session_id, approvals=[decision])
        except so.InvalidAnswer:
            assert await store_contents(rt.store, asked.session_id) == before
            self.refused["decision"] = "InvalidAnswer"
        try:
            self.parked["principal"] = await rt.generate(
                "principal", prompt="go", auth=self.principal()
            )
        except so.UsageError:
            self.refused["principal"] = "UsageError"
        self.states.append(await self.snapshots(rt))

    async def snapshots(self, rt: so.Runtime) -> dict[str, Any]:
        """The state of each session the probe opened, in its snapshot form with its calls'
        journals (read back from the events where the state holds none)."""
        out: dict[str, Any] = {}
        for channel, parked in self.parked.items():
            state = await rt.state(parked.session_id)
            for c in [] if state.turn is None else list(state.turn.calls.values()):
                if c.journal is None:
                    await load_journal(rt.store, state, c)
            out[channel] = state.to_snapshot(journals=True)
        return out

    async def resume(self, rt: so.Runtime) -> None:
        """Go on with every way in from another runtime, as another process would."""
        self.states.append(await self.snapshots(rt))
        for channel in ("result", "step", "input", "principal"):
            parked = self.parked.get(channel)
            if channel in self.refused or parked is None:
                continue
            assert parked.status == "waiting", (channel, parked)
            answer = so.InputResponse(request_id=parked.pending[0].id, option_id=YES)
            who = self.principal() if channel == "principal" else None
            done = await rt.respond(parked.session_id, [answer], principal=who)
            assert done.status == "completed", (channel, done)
        payload = self.parked["payload"]
        pending = await rt.pending(session_id=payload.session_id)
        self.seen["payload"].append([r.payload for r in pending])
        if "decision" not in self.refused:
            await rt.generate(session_id=self.parked["decision"].session_id, prompt="again")

    def outcomes(self) -> dict[str, Outcome]:
        out: dict[str, Outcome] = {"state": Outcome(live=self.states[0], resumed=self.states[1])}
        for channel in CHANNELS[:-1]:
            if channel in self.refused:
                out[channel] = Outcome(refused=self.refused[channel])
                continue
            seen = self.seen[channel]
            assert len(seen) == 2, (channel, seen)
            out[channel] = Outcome(live=seen[0], resumed=seen[1])
        return out


async def probe(url: str, value: Any) -> dict[str, Outcome]:
    """What each way in came to for `value`, on the store at `url`."""
    p = Probe(value)
    async with so.Runtime(p.agents(), store=url) as rt:
        await p.live(rt)
    async with so.Runtime(p.agents(), store=url) as rt:
        await p.resume(rt)
    return p.outcomes()
