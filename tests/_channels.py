"""The channel tests' helpers: a text channel that keeps what it sends, agents asking for three
refunds or for one that escalates to finance, a hub read by hand, and a request's status.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import signoff as so
from signoff.channels import (
    ChannelHub,
    TextChannel,
)
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

__all__ = [
    "BOB",
    "caught_up",
    "escalating_refund",
    "frozen_monotonic",
    "manual",
    "Monotonic",
    "runtime",
    "slowly_escalating_refund",
    "status",
    "Texts",
    "three_refunds",
]


@asynccontextmanager
async def manual(hub: ChannelHub) -> AsyncIterator[ChannelHub]:
    """A started hub that reads the trail only when the test calls `poll()`."""
    await hub.start(follow=False)
    try:
        yield hub
    finally:
        await hub.stop()


class Monotonic:
    """The `time` module with a `monotonic()` that stands still until the test moves it on
    (`now`): a wait for a Retry-After or a backoff is judged by it, not by the machine's speed."""

    def __init__(self) -> None:
        # A whole number of seconds: waits of whole seconds added and taken away stay exact
        # (3600, not 3600.0000000000073, as the machine's uptime's fraction made them).
        self.now = float(int(time.monotonic()))

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def monotonic(self) -> float:
        return self.now


def frozen_monotonic(monkeypatch: pytest.MonkeyPatch, *modules: ModuleType) -> Monotonic:
    """One `Monotonic` clock put in place of `time` in each of `modules`."""
    clock = Monotonic()
    for module in modules:
        monkeypatch.setattr(module, "time", clock)
    return clock


BOB = so.Principal(authenticator="sms", principal_id="sms:+15550100")


class Texts(TextChannel):
    """A text channel that keeps what it sends (an SMS thread, say)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sent: list[str] = []

    async def send_text(self, text: str) -> None:
        self.sent.append(text)


def three_refunds(runs: list[str]) -> so.Agent:
    @so.tool(approval=so.always())
    async def issue_refund(order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        runs.append(order_id)
        return {"refunded": amount}

    return scripted_agent(
        "support",
        [
            call_tools(
                call("issue_refund", order_id="A-1", amount=10),
                call("issue_refund", order_id="B-2", amount=20),
                call("issue_refund", order_id="C-3", amount=30),
            ),
            reply("Done."),
        ],
        tools=[issue_refund],
    )


def runtime(tmp_path: Path, *agents: so.Agent) -> so.Runtime:
    return so.Runtime(list(agents), store=f"sqlite:///{tmp_path / 'state.db'}")


async def status(rt: so.Runtime, rid: str) -> tuple[str, str | None]:
    stored = await rt.store.get_request(rid)
    assert stored is not None
    return stored.status, stored.outcome


def escalating_refund(name: str = "support", limits: so.Limits | None = None) -> so.Agent:
    def finance(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
        who = ctx.response.principal
        allowed = ctx.request.escalated_to == "finance" and who is not None and who == BOB
        return so.Allowed() if allowed else so.Rejected("not finance")

    return _escalating(finance, name, repeat_last=True, limits=limits)


def slowly_escalating_refund(clock: ManualClock, name: str = "support") -> so.Agent:
    """`escalating_refund` whose response policy, judging an answer before the escalation,
    takes past the deadline (it moves `clock` on 61 s) and allows it, and allows any answer
    once the request is escalated: the first answer is spent as the deadline escalates it."""

    def finance(ctx: so.ResponseContext) -> so.Allowed:
        if ctx.request.escalated_to is None:
            clock.advance(61)
        return so.Allowed()

    return _escalating(finance, name)


def _escalating(
    policy: Any, name: str, repeat_last: bool = False, limits: so.Limits | None = None
) -> so.Agent:
    """An agent whose refund asks for an approval `policy` judges, escalated to finance when no
    one decides within 60 s (its session's `limits`, a TTL say, if given)."""
    spec = so.ApprovalSpec(
        request=so.always(),
        response=policy,
        expires_in=60,
        on_timeout="escalate",
        escalate_to="finance",
    )

    @so.tool(approval=spec)
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    return scripted_agent(
        name,
        [call_tools(call("issue_refund", order_id="A-1")), reply("Done.")],
        tools=[issue_refund],
        repeat_last=repeat_last,
        limits=limits,
    )


async def caught_up(h: ChannelHub, claim_ttl: float) -> None:
    """Poll until the hub delivers (a claim a killed hub held lapses first, `claim_ttl`), then
    twice more: every entry past its position is dispatched, those it had delivered again."""
    deadline = time.monotonic() + 10 * claim_ttl + 20
    while not h.active:
        assert time.monotonic() < deadline, "the hub never took the channel's claim"
        await h.poll()
        await asyncio.sleep(0.05)
    for _ in range(2):
        await h.poll()
