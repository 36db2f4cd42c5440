"""A turn cancelled from another process (the server, say) runs no further `ctx.step` in the
process still driving it, as when the cancel is made in that process: the step's function, its
side effect, never runs. A renewal that read the cancel marks it, and a step reads the session's
head before it runs, so a cancel made before the drive's first renewal stops it too. Run on
both stores."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import signoff as so
from signoff.stores import Store
from signoff.testing import call, call_tools, reply, scripted_agent

from ._leasing import event_types
from ._steer import ALICE, BOB


class _Payer:
    """`pay`: a tool body that sets `entered`, waits for `go` (or, if `on_abort`, its abort
    signal), then sends money in a step, noting what happened in `seen`."""

    def __init__(self, *, on_abort: bool) -> None:
        self.entered = asyncio.Event()
        self.go = asyncio.Event()
        self.effects: list[str] = []
        self.seen: dict[str, Any] = {}
        self.reads = 0  # the store's head reads a test counts (`counting_heads`)

        @so.tool
        async def pay(ctx: so.ToolContext) -> str:
            """Send the money."""
            self.entered.set()
            await asyncio.wait_for((ctx.abort_signal if on_abort else self.go).wait(), 10)
            self.seen["abort_before_step"] = ctx.abort_signal.is_set()
            reads = self.reads
            try:
                return str(await ctx.step("send", self.send))
            except Exception as exc:
                self.seen["step_raised"] = type(exc).__name__
                self.seen["head_reads"] = self.reads - reads
                raise

        self.tool = pay

    async def send(self) -> str:
        self.effects.append("sent")
        return "ok"

    def counting_heads(self, store: Store) -> None:
        """Count the store's head reads in `reads`."""
        head = store.head

        async def counted(session_id: str, *, shown: so.Event | None = None) -> int | None:
            self.reads += 1
            return await head(session_id, shown=shown)

        store.head = counted  # type: ignore[method-assign]

    def agent(self) -> so.Agent:
        return scripted_agent(
            "bot", [call_tools(call("pay")), reply("Paid."), reply("Next.")], tools=[self.tool]
        )


async def test_a_step_after_a_renewal_read_a_cancel_made_elsewhere_runs_nothing(
    store_url: str,
) -> None:
    """Another process cancels the turn; the drive's renewal reads the cancel and sets the
    abort signal, and the body then steps. The step refuses before anything runs, with no
    read of the store: its function used to run (money sent) and its record was refused, so
    the effect was in neither the log nor the audit trail."""
    payer = _Payer(on_abort=True)
    agent = payer.agent()
    async with (
        so.Runtime([agent], store=store_url, lease_ttl=0.6) as rt,
        so.Runtime([agent], store=store_url, lease_wait=0, inline=False) as server,
    ):
        payer.counting_heads(rt.store)
        sid = await rt.create_session("bot", auth=ALICE)
        drive = asyncio.create_task(rt.generate(session_id=sid, prompt="pay", auth=ALICE))
        await asyncio.wait_for(payer.entered.wait(), timeout=10)
        cancelled = await server.cancel(sid, "customer changed their mind", principal=BOB)
        assert cancelled.cancelled
        r = await asyncio.wait_for(drive, timeout=20)
        # Refused on what the renewal read, before reading anything itself.
        assert payer.seen == {
            "abort_before_step": True,
            "step_raised": "TurnStopped",
            "head_reads": 0,
        }
        assert payer.effects == []
        assert r.status == "cancelled"
        types = await event_types(rt, sid)
        assert "tool.step" not in types and types[-2:] == ["turn.cancelled", "session.waiting"]


async def test_a_step_before_any_renewal_runs_nothing_of_a_turn_cancelled_elsewhere(
    store_url: str,
) -> None:
    """The drive's lease is long, so no renewal reads the cancel another process made before
    the body steps: the step reads the session's head, finds the log moved on, reads the cancel
    and refuses before its function runs (and sets the abort signal). It used to run."""
    payer = _Payer(on_abort=False)
    agent = payer.agent()
    async with (
        so.Runtime([agent], store=store_url, lease_ttl=60) as rt,
        so.Runtime([agent], store=store_url, lease_wait=0, inline=False) as server,
    ):
        sid = await rt.create_session("bot", auth=ALICE)
        drive = asyncio.create_task(rt.generate(session_id=sid, prompt="pay", auth=ALICE))
        await asyncio.wait_for(payer.entered.wait(), timeout=10)
        assert (await server.cancel(sid, "stop", principal=BOB)).cancelled
        payer.go.set()
        r = await asyncio.wait_for(drive, timeout=20)
        assert payer.seen["abort_before_step"] is False
        assert payer.seen["step_raised"] == "TurnStopped"
        assert payer.effects == []
        assert r.status == "cancelled"
        assert "tool.step" not in await event_types(rt, sid)


async def test_a_step_after_a_message_queued_elsewhere_runs_and_is_journaled(
    store_url: str,
) -> None:
    """A message another process queued behind the turn moves the log on but cancels nothing:
    the step's read finds no cancel, runs its function once and journals it, and the turn
    completes before the queued message's turn runs. (It passed before the fix too: it holds
    that the read added to each step stops only a cancelled turn's.)"""
    payer = _Payer(on_abort=False)
    agent = payer.agent()
    async with (
        so.Runtime([agent], store=store_url, lease_ttl=60) as rt,
        so.Runtime([agent], store=store_url, lease_wait=0, inline=False) as server,
    ):
        sid = await rt.create_session("bot", auth=ALICE)
        drive = asyncio.create_task(rt.generate(session_id=sid, prompt="pay", auth=ALICE))
        await asyncio.wait_for(payer.entered.wait(), timeout=10)
        assert (await server.send(sid, "then this", principal=ALICE, turn_policy="queue")).queued
        payer.go.set()
        r = await asyncio.wait_for(drive, timeout=20)
        assert payer.seen == {"abort_before_step": False}
        assert payer.effects == ["sent"]
        assert r.status == "completed" and r.text == "Next."  # the queued message's turn
        types = await event_types(rt, sid)
        assert types.count("tool.step") == 1 and types.count("turn.completed") == 2
        assert types.index("tool.step") < types.index("turn.completed")


def _gated_renewals(store: Store, until: asyncio.Event, but: str | None = None) -> None:
    """Hold the store's lease renewals (of every session but `but`) until `until` is set: what
    a renewal reads of the log is read only after that."""
    renew = store.renew_lease

    async def gated(sid: str, owner: str, token: int, ttl: float, now: float) -> bool:
        if sid != but:
            await until.wait()
        return await renew(sid, owner, token, ttl, now)

    store.renew_lease = gated  # type: ignore[method-assign,assignment]


async def test_a_read_in_the_driving_process_does_not_hide_a_cancel_made_elsewhere(
    store_url: str,
) -> None:
    """Another process cancels the turn, then the driving process reads the session (a server
    or dashboard showing it), folding the cancel into the state its drive holds. The drive's
    next renewal still reads the cancel and sets the body's abort signal: it used to take that
    state's seq for the last event the drive knew of, read nothing and never set it."""
    payer = _Payer(on_abort=True)
    agent = payer.agent()
    read = asyncio.Event()
    async with (
        so.Runtime([agent], store=store_url, lease_ttl=1.5) as rt,
        so.Runtime([agent], store=store_url, lease_wait=0, inline=False) as server,
    ):
        _gated_renewals(rt.store, read)  # no renewal reads the cancel before the state does
        sid = await rt.create_session("bot", auth=ALICE)
        drive = asyncio.create_task(rt.generate(session_id=sid, prompt="pay", auth=ALICE))
        await asyncio.wait_for(payer.entered.wait(), timeout=10)
        assert (await server.cancel(sid, "stop", principal=BOB)).cancelled
        assert (await rt.state(sid)).turn_status == "cancelled"
        read.set()
        r = await asyncio.wait_for(drive, timeout=20)
        assert payer.seen.get("abort_before_step") is True
        assert payer.seen.get("step_raised") == "TurnStopped"
        assert payer.effects == []
        assert r.status == "cancelled"
        assert "tool.step" not in await event_types(rt, sid)


async def test_a_subagent_s_body_stops_when_its_parent_is_cancelled_elsewhere(
    store_url: str,
) -> None:
    """Another process cancels a parent turn whose delegate call drives its child here; the
    cancel reaches the child too. The parent's renewal reads it first and its delegate call
    cancels the child, finding it cancelled already: the child's body is stopped then, as its
    own process's cancel would stop it. Nothing set its abort signal: the body ran its full
    time (a renewal of the child's own is held back here, as when the parent's came first)."""
    stopped = asyncio.Event()
    seen: list[bool] = []

    @so.tool
    async def crawl(ctx: so.ToolContext) -> str:
        """A long task that stops when the turn is cancelled."""
        entered.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ctx.abort_signal.wait(), timeout=10)
        seen.append(ctx.abort_signal.is_set())
        stopped.set()
        return "stopped"

    entered = asyncio.Event()
    child = scripted_agent("crawler", [call_tools(call("crawl")), reply("Crawled.")], tools=[crawl])
    parent = scripted_agent(
        "lead",
        [call_tools(call("crawler", message="crawl")), reply("Done.")],
        tools=[so.delegate("crawler")],
    )
    async with (
        so.Runtime([parent, child], store=store_url, lease_ttl=3.0) as rt,
        so.Runtime([parent, child], store=store_url, lease_wait=0, inline=False) as server,
    ):
        sid = await rt.create_session("lead", auth=ALICE)
        _gated_renewals(rt.store, stopped, but=sid)  # the child's renewals wait for its body
        drive = asyncio.create_task(rt.generate(session_id=sid, prompt="go", auth=ALICE))
        await asyncio.wait_for(entered.wait(), timeout=10)
        assert (await server.cancel(sid, "stop", principal=BOB)).cancelled
        r = await asyncio.wait_for(drive, timeout=20)
        assert seen == [True]
        assert r.status == "cancelled"
