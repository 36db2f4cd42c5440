"""A parent's cancel that the parent's own drive learns of (in another process: at its lease
renewal) stops the child's turn with that cancel's reason and canceller, which the child's
audited `turn.cancelled` records, not as if a message had steered the parent; a steer still
stops it as steered. Run on both stores."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import signoff as so
from signoff import _child_sessions
from signoff.testing import call, call_tools, reply, scripted_agent

from ._subagents import ALICE


def _agents(entered: asyncio.Event) -> list[so.Agent]:
    """`support` delegates to `billing`, whose tool sets `entered` and runs until its abort
    signal is set (10 s at most)."""

    @so.tool
    async def reconcile(ctx: so.ToolContext) -> str:
        """Reconcile the accounts, a slow job that stops when aborted."""
        entered.set()
        try:
            await asyncio.wait_for(ctx.abort_signal.wait(), timeout=10)
        except TimeoutError:
            return "reconciled"
        return "stopped"

    child = scripted_agent(
        "billing", [call_tools(call("reconcile")), reply("Done.")], tools=[reconcile]
    )
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", call_id="d1", message="Reconcile acme")), reply("Stopped.")],
        tools=[so.delegate("billing")],
    )
    return [parent, child]


async def _child_cancels(rt: so.Runtime) -> list[dict[str, Any]]:
    [kid] = await rt.sessions(agent="billing")
    return [e.data for e in await rt.store.read_events(kid.id) if e.type == "turn.cancelled"]


@pytest.mark.parametrize("where", ["elsewhere", "here"])
async def test_a_parents_cancel_stops_its_running_child_with_its_reason_and_canceller(
    store_url: str, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """The cancel's own reach to the child (`cancel_delegated`) is held back, as when its
    process is slow or dies there: the parent's drive, which learns of the cancel (from its
    own process, or at a lease renewal from another), cancels the child. Its `turn.cancelled`
    used to say the parent was "steered by a new message", by no one."""
    entered = asyncio.Event()
    agents = _agents(entered)

    async def held_back(*args: Any) -> None:
        return None

    monkeypatch.setattr(_child_sessions, "cancel_delegated", held_back)
    async with (
        so.Runtime(agents, store=store_url, lease_ttl=0.6) as rt,
        so.Runtime(agents, store=store_url, lease_wait=0, inline=False) as server,
    ):
        sid = await rt.create_session("support", auth=ALICE)
        drive = asyncio.create_task(rt.generate(session_id=sid, prompt="go", auth=ALICE))
        await asyncio.wait_for(entered.wait(), timeout=10)
        canceller = server if where == "elsewhere" else rt
        cancelled = await canceller.cancel(sid, "customer changed their mind", principal=ALICE)
        assert cancelled.cancelled
        assert (await asyncio.wait_for(drive, timeout=20)).status == "cancelled"
        [data] = await _child_cancels(rt)
        assert data["reason"] == "customer changed their mind"
        assert data["by"] == ALICE.model_dump()


async def test_a_steer_made_elsewhere_stops_the_running_child_as_steered(store_url: str) -> None:
    """A message steering the parent from another process stops the child as steered, by no
    one: the parent's turn was not cancelled, and its model reads the message."""
    entered = asyncio.Event()
    agents = _agents(entered)
    async with (
        so.Runtime(agents, store=store_url, lease_ttl=0.6) as rt,
        so.Runtime(agents, store=store_url, lease_wait=0, inline=False) as server,
    ):
        sid = await rt.create_session("support", auth=ALICE)
        drive = asyncio.create_task(rt.generate(session_id=sid, prompt="go", auth=ALICE))
        await asyncio.wait_for(entered.wait(), timeout=10)
        await server.send(sid, "actually, leave it", principal=ALICE)
        r = await asyncio.wait_for(drive, timeout=20)
        assert (r.status, r.text) == ("completed", "Stopped.")
        [data] = await _child_cancels(rt)
        assert data == {"reason": "the parent turn was steered by a new message", "by": None}
