"""A step whose record the store refuses (a full disk) while its tool's body goes on: the effect
that ran is recorded once the store takes writes, never forgotten, and never run again, on both
stores."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable

import pytest

import signoff as so

from ._disk_full import disk
from ._steps import HeldLock


def _echo(conversation: list[so.Message]) -> so.ModelResponse:
    last = conversation[-1]
    assert isinstance(last, so.ToolResultMessage)
    return so.ModelResponse(text=json.dumps(last.content))


def _agent(plan: so.Tool) -> so.Agent:
    model = so.models.Scripted(
        [so.ModelResponse(tool_calls=[so.ToolCall(name="plan", input={"order_id": "7"})]), _echo]
    )
    return so.Agent(name="support", model=model, tools=[plan])


def _quote(quotes: list[str], fill: Callable[[], None]) -> Callable[[], str]:
    """A step function with an effect (it counts its runs) that fills the disk on its first run,
    returning what needs new pages to store: its record is refused."""

    def quote() -> str:
        quotes.append("quote")
        if len(quotes) == 1:
            fill()
        return os.urandom(32 * 1024).hex()

    return quote


async def _ends_once(
    rt: so.Runtime, quotes: list[str], unfill: Callable[[], None]
) -> list[so.Event]:
    """The first drive fails with the store's error, whatever the body made of it; once there is
    room the call ends as an uninterrupted run would, its step journaled once and run once."""
    sid = await rt.create_session("support")
    with pytest.raises(so.StoreError):
        await rt.generate(session_id=sid, prompt="plan order 7")
    unfill()
    done = await rt.generate(session_id=sid)
    assert done.status == "completed", done
    events = [e async for e in rt.events(sid, follow=False)]
    assert [e.data["name"] for e in events if e.type == "tool.step"] == ["quote"]
    assert [e.data["status"] for e in events if e.type == "tool.completed"] == ["ok"]
    assert quotes == ["quote"]
    return events


async def test_a_body_that_catches_its_steps_refused_record_does_not_end_its_call(
    store_url: str,
) -> None:
    """The body catches the `StoreError` of its step's record and returns: that result was
    recorded as the call's, and the quote that ran was in no journal (the drive succeeded, the
    effect forgotten). The drive fails instead; the next one records the quote kept here."""
    quotes: list[str] = []
    rt = so.Runtime([], store=store_url)
    fill, unfill = disk(rt, store_url)

    @so.tool
    async def plan(ctx: so.ToolContext, order_id: str) -> str:
        """Plan a remedy with a journaled quote."""
        try:
            quote = await ctx.step("quote", _quote(quotes, fill))
        except so.StoreError:
            unfill()  # the store takes writes again: the body's result would be recorded
            return "no quote"
        return f"planned {order_id} at {len(quote)}"

    rt.agents["support"] = _agent(plan)
    async with rt:
        events = await _ends_once(rt, quotes, unfill)
    [completed] = [e for e in events if e.type == "tool.completed"]
    assert completed.data["result"] == "planned 7 at 65536"


async def test_a_body_that_retries_its_refused_step_does_not_run_it_again(store_url: str) -> None:
    """The body catches its step's refused record and steps again: the next occurrence ran the
    quote a second time. Once the journal failed, a step runs nothing in that drive."""
    quotes: list[str] = []
    rt = so.Runtime([], store=store_url)
    fill, unfill = disk(rt, store_url)

    @so.tool
    async def plan(ctx: so.ToolContext, order_id: str) -> str:
        """Plan a remedy with a journaled quote, trying twice."""
        for _ in range(2):
            try:
                quote = await ctx.step("quote", _quote(quotes, fill))
            except so.StoreError:
                unfill()
                continue
            return f"planned {order_id} at {len(quote)}"
        return "no quote"

    rt.agents["support"] = _agent(plan)
    async with rt:
        await _ends_once(rt, quotes, unfill)


async def test_a_body_that_asks_for_approval_after_a_refused_step_does_not_park(
    store_url: str,
) -> None:
    """The body catches its step's refused record and asks for an approval instead: the approval
    was asked and the quote left out of the journal. The drive fails instead."""
    quotes: list[str] = []
    rt = so.Runtime([], store=store_url)
    fill, unfill = disk(rt, store_url)

    @so.tool
    async def plan(ctx: so.ToolContext, order_id: str) -> str:
        """Plan a remedy with a journaled quote, or ask to plan it without one."""
        try:
            quote = await ctx.step("quote", _quote(quotes, fill))
        except so.StoreError:
            unfill()
            ctx.request_approval({"plan": order_id, "quote": None})
        return f"planned {order_id} at {len(quote)}"

    rt.agents["support"] = _agent(plan)
    async with rt:
        events = await _ends_once(rt, quotes, unfill)
    assert not [e for e in events if e.type == "input.requested"]


async def test_a_sibling_step_that_fails_as_the_journal_does_is_journaled_not_run_again(
    store_url: str,
) -> None:
    """Two branches step together; one's record is refused, and the other's step then fails on
    its own (a declined check): that failure is the step's, journaled (kept while the store is
    full, recorded by the next drive) like any other, not left out with the drive's failure
    (the check ran again on the retry)."""
    quotes: list[str] = []
    checks: list[str] = []
    rt = so.Runtime([], store=store_url)
    fill, unfill = disk(rt, store_url)

    @so.tool
    async def plan(ctx: so.ToolContext, order_id: str) -> list[object]:
        """Fetch a quote and check the order together."""
        quoted_or_refused = asyncio.Event()

        async def check() -> str:
            await quoted_or_refused.wait()
            checks.append("check")
            raise ValueError(f"order {order_id} declined")

        async def quoted() -> str:
            try:
                return str(await ctx.step("quote", _quote(quotes, fill)))
            finally:
                quoted_or_refused.set()

        both = await asyncio.gather(quoted(), ctx.step("check", check), return_exceptions=True)
        return [type(r).__name__ if isinstance(r, BaseException) else len(r) for r in both]

    rt.agents["support"] = _agent(plan)
    async with rt:
        sid = await rt.create_session("support")
        with pytest.raises(so.StoreError):
            await rt.generate(session_id=sid, prompt="plan order 7")
        unfill()
        done = await rt.generate(session_id=sid)
        assert done.status == "completed", done
        events = [e async for e in rt.events(sid, follow=False)]
    steps = {e.data["name"]: e.data for e in events if e.type == "tool.step"}
    assert sorted(steps) == ["check", "quote"] and len(steps) == 2
    assert steps["check"]["error"]["type"] == "ValueError"
    [completed] = [e for e in events if e.type == "tool.completed"]
    assert completed.data["result"] == [65536, "ValueError"]
    assert (quotes, checks) == (["quote"], ["check"])


async def test_a_kept_step_whose_record_waits_at_close_is_not_lost(store_url: str) -> None:
    """A step's record refused, it is kept in the process; the next drive records it from there,
    and that record waits for the session's lock (another task's commit under way) when the
    runtime closes: the kept step was taken out and the cancel threw it away, so the runtime,
    opened again, ran the quote a second time. It is recorded before the cancel goes on."""
    quotes: list[str] = []
    rt = so.Runtime([], store=store_url, lease_ttl=600)
    fill, unfill = disk(rt, store_url)

    @so.tool
    async def plan(ctx: so.ToolContext, order_id: str) -> str:
        """Plan a remedy with a journaled quote."""
        quote = await ctx.step("quote", _quote(quotes, fill))
        return f"planned {order_id} at {len(quote)}"

    rt.agents["support"] = _agent(plan)
    locked = HeldLock(rt)

    async with rt:
        sid = await rt.create_session("support")
        with pytest.raises(so.StoreError):
            await rt.generate(session_id=sid, prompt="plan order 7")
        unfill()
        locked.hold(sid)  # as a commit of another task, mid-way
        await locked.held.wait()
        turn = asyncio.create_task(rt.generate(session_id=sid))
        await locked.close_while_waited(sid, turn)  # the kept step's record waits for it
        done = await rt.generate(session_id=sid)  # the runtime opens its store again
        assert done.status == "completed", done
        events = [e async for e in rt.events(sid, follow=False)]
    assert [e.data["name"] for e in events if e.type == "tool.step"] == ["quote"]
    assert quotes == ["quote"]


async def test_a_body_parked_on_a_question_after_a_refused_step_fails_its_drive(
    store_url: str,
) -> None:
    """One branch asks a question, the other's step record is refused and caught: the turn
    parked on the question as if nothing had failed, the quote that ran kept only in this
    process's memory. The drive fails with the store's error instead; once the question is
    answered, the body goes on from the quote kept, not run again."""
    quotes: list[str] = []
    rt = so.Runtime([], store=store_url)
    fill, unfill = disk(rt, store_url)

    @so.tool
    async def plan(ctx: so.ToolContext, order_id: str) -> list[object]:
        """Fetch a quote while asking how to ship."""
        asked = asyncio.Event()
        quote = _quote(quotes, fill)

        async def once_asked() -> str:
            await asked.wait()  # under way as the question parks the body
            return quote()

        async def quoted() -> int | None:
            try:
                return len(str(await ctx.step("quote", once_asked)))
            except so.StoreError:
                return None

        async def how() -> str:
            ask = asyncio.ensure_future(ctx.ask("Ship how?", ["air", "sea"]))
            await asyncio.sleep(0.05)  # the question is recorded by now
            asked.set()
            return (await ask).value

        return list(await asyncio.gather(quoted(), how()))

    def room_to_park(when: str, label: str) -> None:
        if (when, label) == ("before", "turn.waiting"):
            unfill()  # the park itself is not refused: only the step was

    rt.agents["support"] = _agent(plan)
    async with rt:
        sid = await rt.create_session("support")
        rt.store.set_fault_hook(room_to_park)
        with pytest.raises(so.StoreError):
            await rt.generate(session_id=sid, prompt="plan order 7")
        unfill()
        r = await rt.generate(session_id=sid)
        assert [p.question for p in r.pending] == ["Ship how?"], r
        done = await rt.send(sid, "sea")
        assert done.status == "completed", done
        events = [e async for e in rt.events(sid, follow=False)]
    assert [e.data["name"] for e in events if e.type == "tool.step"] == ["quote"]
    [completed] = [e for e in events if e.type == "tool.completed"]
    assert completed.data["result"] == [65536, "sea"]
    assert quotes == ["quote"]
