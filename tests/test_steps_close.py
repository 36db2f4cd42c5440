"""A journaled step still running when its drive stops (`Runtime.close`): what it did is not
lost, so the turn resumed elsewhere does not run it again."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import pytest

import signoff as so
from signoff.stores import Commit
from signoff.testing import Capture, call, call_tools, reply, scripted_agent, tool_results

from ._steps import HeldLock, closed_mid_call, resumed_to_the_end


def _until_cancelled(turn: list[asyncio.Task[so.GenerateResult]]) -> None:
    """In a step's thread: until `close` has cancelled the call, so the step's effect comes
    after it however busy the machine (a 0.3 s sleep here came after it, mostly)."""
    deadline = time.monotonic() + 10
    while not (turn and turn[0].cancelling()):
        assert time.monotonic() < deadline, "close did not cancel the call"
        time.sleep(0.01)


async def test_a_plain_step_running_at_close_is_journaled_and_not_run_again(
    store_url: str,
) -> None:
    """A plain function runs in a thread, which `close` cannot stop: its effect happened after
    the drive was cancelled and was thrown away, and the resumed turn charged the card again."""
    charges: list[str] = []
    started = threading.Event()
    turn: list[asyncio.Task[so.GenerateResult]] = []  # the call `close` cancels

    def charge(card: str) -> str:
        started.set()
        _until_cancelled(turn)  # a blocking client's call, under way when the runtime closes
        charges.append(card)
        return f"charged {card}"

    @so.tool
    async def pay(ctx: so.ToolContext, card: str) -> str:
        """Charge the card."""
        return str(await ctx.step("charge", charge, card))

    def agent() -> so.Agent:
        script = [call_tools(call("pay", card="4242")), reply("Paid.")]
        return scripted_agent("shop", script, tools=[pay])

    rt = so.Runtime([agent()], store=store_url, lease_ttl=600)
    sid = await closed_mid_call(rt, "pay", started, turn)
    await resumed_to_the_end(agent(), store_url, sid)
    assert charges == ["4242"]


async def test_a_plain_step_failing_after_close_journals_its_failure_and_the_body_stops(
    store_url: str,
) -> None:
    """The step's failure, once its thread ends, is journaled as any step's is, and the body
    stops there (its `except` does not go on to step again in a drive that was stopped): the
    resumed turn replays the failure and takes the `except` path once."""
    runs: list[str] = []
    started = threading.Event()
    turn: list[asyncio.Task[so.GenerateResult]] = []  # the call `close` cancels

    def charge(card: str) -> str:
        started.set()
        _until_cancelled(turn)
        runs.append("charge")
        raise ValueError(f"card {card} declined")

    def notify() -> str:
        runs.append("notify")
        return "sent"

    @so.tool
    async def pay(ctx: so.ToolContext, card: str) -> str:
        """Charge the card, or tell the customer it was declined."""
        try:
            return str(await ctx.step("charge", charge, card))
        except ValueError:
            return str(await ctx.step("notify", notify))

    def agent() -> so.Agent:
        script = [call_tools(call("pay", card="4242")), reply("Declined.")]
        return scripted_agent("shop", script, tools=[pay])

    rt = so.Runtime([agent()], store=store_url, lease_ttl=600)
    sid = await closed_mid_call(rt, "pay", started, turn)
    assert runs == ["charge"]
    await resumed_to_the_end(agent(), store_url, sid)
    assert runs == ["charge", "notify"]


async def test_a_plain_tool_running_at_close_has_its_result_recorded_and_does_not_run_again(
    store_url: str,
) -> None:
    """A plain (not `async`) tool's body runs in a thread too: `close` let it finish its
    refund unseen, and the resumed turn ran the body, and the refund, a second time."""
    refunds: list[str] = []
    started = threading.Event()
    turn: list[asyncio.Task[so.GenerateResult]] = []  # the call `close` cancels

    @so.tool
    def refund(order_id: str) -> str:
        """Refund the order."""
        started.set()
        _until_cancelled(turn)
        refunds.append(order_id)
        return f"refunded {order_id}"

    seen = Capture(reply("Refunded."))

    def agent() -> so.Agent:
        refunding = call_tools(call("refund", order_id="1"))
        return scripted_agent("shop", [refunding, seen], tools=[refund])

    rt = so.Runtime([agent()], store=store_url, lease_ttl=600)
    sid = await closed_mid_call(rt, "refund", started, turn)
    assert refunds == ["1"]
    await resumed_to_the_end(agent(), store_url, sid)
    assert refunds == ["1"]
    [result] = tool_results(seen.last)
    assert (result.is_error, result.content) == (False, "refunded 1")


async def test_an_async_step_whose_record_waits_at_close_is_journaled_and_not_run_again(
    store_url: str,
) -> None:
    """Two branches step together; as the first one's record is committed the runtime closes.
    The second's function had returned (its effect ran) and its record waited for the session's
    lock, which PostgreSQL's commit holds across its round trips: the close cancelled that wait,
    nothing was journaled, and the resumed turn charged the second card again. A step whose
    function returned is recorded before the cancel goes on."""
    charges: list[str] = []

    async def charge(card: str) -> str:
        charges.append(card)
        return f"charged {card}"

    @so.tool
    async def pay(ctx: so.ToolContext) -> list[str]:
        """Charge both cards."""
        both = await asyncio.gather(ctx.step("a", charge, "1111"), ctx.step("b", charge, "2222"))
        return [str(r) for r in both]

    def agent() -> so.Agent:
        script = [call_tools(call("pay")), reply("Paid.")]
        return scripted_agent("shop", script, tools=[pay])

    rt = so.Runtime([agent()], store=store_url, lease_ttl=600)
    closing: list[asyncio.Task[None]] = []

    def close_at_first_step(when: str, label: str) -> None:
        if (when, label) == ("before", "tool.step") and not closing:
            closing.append(asyncio.get_running_loop().create_task(rt.close()))

    async with rt:
        sid = await rt.create_session("shop")
        rt.store.set_fault_hook(close_at_first_step)
        turn = asyncio.create_task(rt.generate(session_id=sid, prompt="pay"))
        while not closing:
            await asyncio.sleep(0.01)
        await closing[0]
        with contextlib.suppress(so.UsageError):  # "closed while this call ran", if it was
            await turn
    await resumed_to_the_end(agent(), store_url, sid)
    assert sorted(charges) == ["1111", "2222"]


async def test_an_async_tool_whose_outcome_waits_at_close_is_recorded_and_not_run_again(
    store_url: str,
) -> None:
    """An async tool's body returned (its refund done) and the record of its result waited for
    the session's lock, held by another task across its round trips to the store (a state read
    or a steer, on PostgreSQL): the close cancelled that wait, nothing was recorded, and the
    resumed turn ran the refund again. The outcome of a body that ended is recorded before the
    cancel goes on."""
    refunds: list[str] = []
    rt = so.Runtime([], store=store_url, lease_ttl=600)
    locked = HeldLock(rt)

    @so.tool
    async def refund(ctx: so.ToolContext, order_id: str) -> str:
        """Refund the order."""
        refunds.append(order_id)
        locked.hold(ctx.session.id)  # as a commit of another task, mid-way
        await locked.held.wait()
        return f"refunded {order_id}"

    def agent() -> so.Agent:
        script = [call_tools(call("refund", order_id="1")), reply("Refunded.")]
        return scripted_agent("shop", script, tools=[refund])

    rt.agents["shop"] = agent()
    async with rt:
        sid = await rt.create_session("shop")
        turn = asyncio.create_task(rt.generate(session_id=sid, prompt="refund"))
        await locked.close_while_waited(sid, turn)  # the result's record waits for it
    await resumed_to_the_end(agent(), store_url, sid)
    assert refunds == ["1"]


async def test_a_task_its_body_started_steps_nothing_once_close_stopped_the_body(
    store_url: str,
) -> None:
    """A task the body started steps after `close` cancelled the body: its charge ran unseen
    (nothing could record it), and the resumed turn charged the card again. It is refused."""
    charges: list[str] = []
    refused: list[BaseException] = []
    started = threading.Event()
    turn: list[asyncio.Task[so.GenerateResult]] = []  # the call `close` cancels
    closed = asyncio.Event()
    bodies: list[str] = []

    async def charge() -> str:
        charges.append("charge")
        return "charged"

    async def later(ctx: so.ToolContext, first: bool) -> str:
        if first:
            await closed.wait()
        try:
            return str(await ctx.step("charge", charge))
        except BaseException as exc:
            refused.append(exc)
            raise

    @so.tool
    async def pay(ctx: so.ToolContext) -> str:
        """Charge the card in a task of its own."""
        bodies.append("pay")
        task = asyncio.create_task(later(ctx, first=len(bodies) == 1))
        if len(bodies) == 1:
            started.set()
            await asyncio.Event().wait()  # until `close` cancels the body
        return await task

    def agent() -> so.Agent:
        script = [call_tools(call("pay")), reply("Paid.")]
        return scripted_agent("shop", script, tools=[pay])

    rt = so.Runtime([agent()], store=store_url, lease_ttl=600)
    sid = await closed_mid_call(rt, "pay", started, turn)
    closed.set()
    for _ in range(20):
        await asyncio.sleep(0.01)
    assert charges == []
    [exc] = refused
    assert isinstance(exc, so.UsageError) and "stopped" in str(exc)
    await resumed_to_the_end(agent(), store_url, sid)
    assert charges == ["charge"]


async def test_a_finally_of_a_body_close_stopped_steps_nothing_and_the_resume_replays(
    store_url: str,
) -> None:
    """`close` cancelled the body while an async step ran, and the body's `finally` ran its
    release step then, journaled: the resumed body (unchanged) failed with a ReplayError at the
    step that had been cut short, "recorded step 'release' there". The journal is closed before
    the body is cancelled: the release is refused, and runs once, when the resumed body ends."""
    effects: list[str] = []
    started = threading.Event()
    turn: list[asyncio.Task[so.GenerateResult]] = []  # the call `close` cancels

    def effect(name: str) -> str:
        effects.append(name)
        return name

    async def slow() -> str:
        effects.append("slow")
        if effects.count("slow") == 1:
            started.set()
            await asyncio.Event().wait()  # until `close` cancels it
        return "slow"

    @so.tool
    async def locked(ctx: so.ToolContext) -> str:
        """Take the lock, work slowly and let the lock go."""
        await ctx.step("acquire", effect, "acquire")
        try:
            await ctx.step("slow", slow)
            return str(await ctx.step("work", effect, "work"))
        finally:
            await ctx.step("release", effect, "release")

    seen = Capture(reply("Done."))

    def agent() -> so.Agent:
        return scripted_agent("shop", [call_tools(call("locked")), seen], tools=[locked])

    rt = so.Runtime([agent()], store=store_url, lease_ttl=600)
    sid = await closed_mid_call(rt, "work", started, turn)
    assert effects == ["acquire", "slow"]
    await resumed_to_the_end(agent(), store_url, sid)
    assert effects == ["acquire", "slow", "slow", "work", "release"]
    [result] = tool_results(seen.last)
    assert (result.is_error, result.content) == (False, "work")


async def test_a_step_under_way_is_journaled_before_a_closed_drive_gives_its_lease_back(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One branch's step had returned and its record was on its way as `close` cancelled the
    body; the other branch, cancelled in its function, ended the `gather` at once, and with it
    the body: the drive gave its lease back before the record was committed, the record was
    refused (`LeaseLost`), and the resumed turn charged the first card again. A closed drive
    waits for the steps under way to be journaled before it lets the session go."""
    charges: list[str] = []
    resumed: list[bool] = []

    async def charge(card: str) -> str:
        charges.append(card)
        return f"charged {card}"

    async def slow_charge(card: str) -> str:
        if not resumed:
            await asyncio.sleep(30)  # cancelled by the close before it charges anything
        return await charge(card)

    @so.tool
    async def pay(ctx: so.ToolContext) -> list[str]:
        """Charge both cards."""
        both = await asyncio.gather(
            ctx.step("a", charge, "1111"), ctx.step("b", slow_charge, "2222")
        )
        return [str(r) for r in both]

    def agent() -> so.Agent:
        script = [call_tools(call("pay")), reply("Paid.")]
        return scripted_agent("shop", script, tools=[pay])

    rt = so.Runtime([agent()], store=store_url, lease_ttl=600)
    store = rt.store
    commit, release = store.commit, store.release_lease
    closing: list[asyncio.Task[None]] = []
    released = asyncio.Event()

    async def slow_step_record(c: Commit) -> None:
        # The step's record is slow to get through (a round trip to PostgreSQL): the close
        # starts meanwhile, and whatever gives the lease back is let go first, for a while.
        if any(e.type == "tool.step" for e in c.events) and not closing:
            closing.append(asyncio.create_task(rt.close()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(released.wait(), 1.0)
        await commit(c)

    async def release_lease(session_id: str, owner: str, token: int) -> None:
        released.set()
        await release(session_id, owner, token)

    monkeypatch.setattr(store, "commit", slow_step_record)
    monkeypatch.setattr(store, "release_lease", release_lease)
    async with rt:
        sid = await rt.create_session("shop")
        turn = asyncio.create_task(rt.generate(session_id=sid, prompt="pay"))
        while not closing:
            await asyncio.sleep(0.01)
        await closing[0]
        with pytest.raises(so.UsageError, match="closed while this call ran"):
            await turn
    assert charges == ["1111"]
    async with so.Runtime([], store=store_url) as reader:
        steps = await reader.store.read_events(sid, types=["tool.step"])
    assert [e.data["name"] for e in steps] == ["a"]
    resumed.append(True)
    await resumed_to_the_end(agent(), store_url, sid)
    assert charges == ["1111", "2222"]


async def test_a_step_still_running_in_a_task_the_body_left_does_not_hold_a_closed_drive(
    store_url: str,
) -> None:
    """A closed drive waited for every step under way, a task the body left too, whose function
    waited on what the body would have done next: `close` returned after its bound, the turn
    never ended and the process kept the session's lease (no other could resume it). Only a
    step whose function returned is waited for; this one runs again on resume."""
    runs: list[str] = []
    resumed: list[bool] = []
    waiting, charging = asyncio.Event(), asyncio.Event()
    left: set[asyncio.Task[str]] = set()

    @so.tool
    async def pay(ctx: so.ToolContext) -> str:
        """Charge, then confirm."""
        go = asyncio.Event()

        async def confirm() -> str:
            runs.append("confirm")
            waiting.set()
            await go.wait()  # set by the body once the charge is done
            return "confirmed"

        async def charge() -> str:
            runs.append("charge")
            charging.set()
            if not resumed:
                await asyncio.sleep(30)  # the close comes meanwhile
            return "charged"

        confirming = asyncio.create_task(ctx.step("confirm", confirm))
        left.add(confirming)
        charged = await ctx.step("charge", charge)
        go.set()
        return f"{charged} {await confirming}"

    def agent() -> so.Agent:
        return scripted_agent("shop", [call_tools(call("pay")), reply("Paid.")], tools=[pay])

    rt = so.Runtime([agent()], store=store_url, lease_ttl=600)
    async with rt:
        sid = await rt.create_session("shop")
        turn = asyncio.create_task(rt.generate(session_id=sid, prompt="pay"))
        # Both steps under way: the charge's start (a PostgreSQL read first) may come after the
        # confirm's, and a close before it ran no charge.
        await waiting.wait()
        await charging.wait()
        await rt.close()
        assert turn.done()  # not left waiting past the close's bound for the confirm
        with pytest.raises(so.UsageError, match="closed while this call ran"):
            await turn
    resumed.append(True)
    again = so.Runtime([agent()], store=store_url, lease_ttl=600, lease_wait=0)
    async with again:
        r = await again.generate(session_id=sid)  # the lease is free: no wait
        assert r.status == "completed", r
    assert sorted(runs) == ["charge", "charge", "confirm", "confirm"]
    for task in left:
        task.cancel()


async def test_a_close_while_a_parked_body_unwinds_stops_the_drive(store_url: str) -> None:
    """`close` came as a body parked on `ctx.ask` ran its `finally` (an HTTP client's
    `aclose`): the drive swallowed the cancel, cut the `finally` short, started the next call's
    body after the close and kept the lease. The body now unwinds to its end and the drive
    stops there: the turn raises `UsageError`, and the next call runs only on resume."""
    unwound: list[str] = []
    charged: list[str] = []
    unwinding = asyncio.Event()
    resumed: list[bool] = []

    @so.tool
    async def confirm(ctx: so.ToolContext) -> str:
        """Ask first."""
        try:
            return str(await ctx.ask("Go on?", options=["yes", "no"]))
        finally:
            if not resumed:
                unwinding.set()
                await asyncio.sleep(0.3)  # the close comes meanwhile
                unwound.append("confirm")

    @so.tool
    async def charge() -> str:
        """Charge."""
        charged.append("charge")
        return "charged"

    def agent() -> so.Agent:
        script = [call_tools(call("confirm"), call("charge")), reply("Done.")]
        return scripted_agent("shop", script, tools=[confirm, charge])

    rt = so.Runtime([agent()], store=store_url, lease_ttl=600)
    async with rt:
        sid = await rt.create_session("shop")
        turn = asyncio.create_task(rt.generate(session_id=sid, prompt="go"))
        await unwinding.wait()
        await rt.close()
        assert turn.done()
        with pytest.raises(so.UsageError, match="closed while this call ran"):
            await turn
    assert (unwound, charged) == (["confirm"], [])
    resumed.append(True)
    again = so.Runtime([agent()], store=store_url, lease_ttl=600, lease_wait=0)
    async with again:
        r = await again.generate(session_id=sid)
        assert r.status == "waiting" and len(r.pending) == 1, r
    assert charged == ["charge"]


async def test_plain_steps_gathered_at_a_close_are_each_journaled(store_url: str) -> None:
    """Two plain steps gathered, both threads running as `close` came: the first one's record
    ended the `gather` (cancelled), the drive waited only for records already on their way and
    gave its lease back while the second thread ran, so its record was refused and the resumed
    turn ran it again. A plain step counts as on its way from its thread's start."""
    runs: list[str] = []
    go = {"a": threading.Event(), "b": threading.Event()}
    both_running = threading.Barrier(3)

    def charge(card: str) -> str:
        runs.append(card)
        if len(runs) <= 2:  # the first run of each: held until the close is under way
            both_running.wait(timeout=10)
            go[card].wait(timeout=10)
        return f"charged {card}"

    @so.tool
    async def pay(ctx: so.ToolContext) -> list[str]:
        """Charge both cards."""
        both = await asyncio.gather(ctx.step("a", charge, "a"), ctx.step("b", charge, "b"))
        return [str(r) for r in both]

    def agent() -> so.Agent:
        return scripted_agent("shop", [call_tools(call("pay")), reply("Paid.")], tools=[pay])

    rt = so.Runtime([agent()], store=store_url, lease_ttl=600)
    async with rt:
        sid = await rt.create_session("shop")
        turn = asyncio.create_task(rt.generate(session_id=sid, prompt="pay"))
        await asyncio.to_thread(both_running.wait, 10)
        closing = asyncio.create_task(rt.close())
        await asyncio.sleep(0.05)  # the close cancels the body meanwhile
        go["a"].set()
        await asyncio.sleep(0.05)  # the first step is journaled, the gather ends
        go["b"].set()
        await closing
        with pytest.raises(so.UsageError, match="closed while this call ran"):
            await turn
    await resumed_to_the_end(agent(), store_url, sid)
    assert sorted(runs) == ["a", "b"]


async def test_a_step_returning_after_its_drive_stopped_writes_nothing(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step in a task the body left returned after `close` had stopped its drive and given
    the lease back: its record went to the store all the same, reopening it behind the close
    (and refused there). It is refused here (`UsageError`), and nothing reaches the store."""
    confirm_may_return = asyncio.Event()
    left: list[asyncio.Task[str]] = []
    resumed: list[bool] = []

    async def confirm() -> str:
        await confirm_may_return.wait()
        return "confirmed"

    async def charge() -> str:
        if not resumed:
            await asyncio.sleep(30)  # the close comes meanwhile
        return "charged"

    @so.tool
    async def pay(ctx: so.ToolContext) -> str:
        """Charge, then confirm."""
        left.append(asyncio.create_task(ctx.step("confirm", confirm)))
        return str(await ctx.step("charge", charge))

    def agent() -> so.Agent:
        return scripted_agent("shop", [call_tools(call("pay")), reply("Paid.")], tools=[pay])

    rt = so.Runtime([agent()], store=store_url, lease_ttl=600)
    commits_after_close: list[Commit] = []
    closed = asyncio.Event()
    commit = rt.store.commit

    async def watched(c: Commit) -> None:
        if closed.is_set():
            commits_after_close.append(c)
        await commit(c)

    monkeypatch.setattr(rt.store, "commit", watched)
    async with rt:
        sid = await rt.create_session("shop")
        turn = asyncio.create_task(rt.generate(session_id=sid, prompt="pay"))
        while not left:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # both steps under way
        await rt.close()
        closed.set()
        with pytest.raises(so.UsageError, match="closed while this call ran"):
            await turn
    confirm_may_return.set()
    with pytest.raises(so.UsageError, match="returned after its drive stopped"):
        await left[0]
    assert commits_after_close == []
    resumed.append(True)
    await resumed_to_the_end(agent(), store_url, sid)
