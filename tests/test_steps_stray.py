"""A branch of a tool's body that outlives the body (an `asyncio.gather` whose other branch
failed, a task the body started): its `ctx.step` runs nothing once the call has ended."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

import signoff as so
from signoff.testing import Capture, call, call_tools, reply, scripted_agent, tool_results


async def test_a_step_of_a_branch_left_running_after_its_call_ended_runs_nothing(
    store_url: str,
) -> None:
    """The call's result was recorded (its gather failed), then the branch still running went
    on to charge the card, unseen by the model, and journaled the step into a call that had
    ended, in the middle of the next call's events."""
    charges: list[str] = []
    refused: list[BaseException] = []

    def charge() -> str:
        charges.append("charge")
        return "charged"

    @so.tool
    async def pay(ctx: so.ToolContext) -> str:
        """Check the cart and charge the card at once."""

        async def check() -> None:
            raise ValueError("the cart is empty")

        async def pay_late() -> None:
            await asyncio.sleep(0.2)
            try:
                await ctx.step("charge", charge)
            except BaseException as exc:
                refused.append(exc)
                raise

        await asyncio.gather(check(), pay_late())
        return "paid"  # pragma: no cover

    @so.tool
    async def ship() -> str:
        """Ship the order (slowly: the turn goes on while the stray branch wakes)."""
        await asyncio.sleep(0.6)
        return "shipped"

    seen = Capture(reply("Done."))
    agent = scripted_agent("shop", [call_tools(call("pay"), call("ship")), seen], tools=[pay, ship])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("shop", prompt="pay and ship")
        assert r.status == "completed", r
        types = [e.type async for e in rt.events(r.session_id, 0, follow=False)]
    assert charges == []
    assert "tool.step" not in types
    [exc] = refused
    assert isinstance(exc, so.UsageError)
    assert "after call" in str(exc) and "ended" in str(exc)


async def test_a_step_under_way_when_its_body_fails_is_journaled_before_the_calls_end(
    store_url: str,
) -> None:
    """A gather's branch fails while its sibling's step is under way: the call's error was
    recorded at once, and the charge, done a moment later, was journaled into the ended call
    after it, in the middle of the next call's events. Steps under way are journaled first."""
    charges: list[str] = []

    async def charge() -> str:
        await asyncio.sleep(0.2)
        charges.append("charge")
        return "charged"

    @so.tool
    async def pay(ctx: so.ToolContext) -> str:
        """Check the cart and charge the card at once."""

        async def check() -> None:
            await asyncio.sleep(0.05)
            raise ValueError("the cart is empty")

        await asyncio.gather(check(), ctx.step("charge", charge))
        return "paid"  # pragma: no cover

    @so.tool
    async def ship() -> str:
        """Ship the order (slowly: the turn goes on while the step is under way)."""
        await asyncio.sleep(0.6)
        return "shipped"

    seen = Capture(reply("Done."))
    agent = scripted_agent("shop", [call_tools(call("pay"), call("ship")), seen], tools=[pay, ship])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("shop", prompt="pay and ship")
        assert r.status == "completed", r
        events = [e async for e in rt.events(r.session_id, 0, follow=False)]
    pay_id = next(e.data["call_id"] for e in events if e.data.get("tool_name") == "pay")
    of_pay = [(e.type, e.data.get("status")) for e in events if e.data.get("call_id") == pay_id]
    assert of_pay == [("tool.started", None), ("tool.step", None), ("tool.completed", "error")]
    assert charges == ["charge"]


async def test_a_step_of_a_task_left_running_after_its_body_parked_runs_nothing(
    store_url: str,
) -> None:
    """A task the body started steps after the body parked on a question: its invoice was sent
    while the call was parked, its record refused (the drive had given its lease back), and the
    resumed body sent it again. It is refused now, and the resumed body sends it once."""
    sent: list[str] = []
    refused: list[BaseException] = []

    async def send_invoice() -> str:
        sent.append("invoice")
        return "sent"

    async def later(ctx: so.ToolContext) -> str:
        await asyncio.sleep(0.2)  # a read first, say: the body has parked meanwhile
        try:
            return str(await ctx.step("invoice", send_invoice))
        except BaseException as exc:
            refused.append(exc)
            raise

    @so.tool
    async def bill(ctx: so.ToolContext) -> str:
        """Send the invoice while asking whether to go on."""
        task = asyncio.create_task(later(ctx))
        answer = await ctx.ask("Go on?", options=["yes", "no"])
        return f"{answer.value} {await task}"

    seen = Capture(reply("Done."))
    agent = scripted_agent("shop", [call_tools(call("bill")), seen], tools=[bill])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("shop", prompt="bill")
        assert r.status == "waiting"
        await asyncio.sleep(0.4)
        assert sent == []
        [exc] = refused
        assert isinstance(exc, so.UsageError)
        assert "after call" in str(exc) and "stopped" in str(exc)
        r = await rt.send(r.session_id, "yes")
        assert r.status == "completed", r
        steps = [
            e.data["name"]
            async for e in rt.events(r.session_id, 0, follow=False)
            if e.type == "tool.step"
        ]
    assert sent == ["invoice"]
    assert steps == ["invoice"]
    assert tool_results(seen.last)[0].content == "yes sent"


async def test_a_shielded_branch_that_steps_after_its_body_parked_runs_nothing(
    store_url: str,
) -> None:
    """A shielded branch of a gather is not cancelled when its sibling's question parks the
    body: its step ran then, unrecorded, and again on resume. It is refused until the resume."""
    sent: list[str] = []

    async def send_invoice() -> str:
        sent.append("invoice")
        return "sent"

    @so.tool
    async def bill(ctx: so.ToolContext) -> str:
        """Send the invoice while asking whether to go on."""

        async def later() -> str:
            await asyncio.sleep(0.2)
            return str(await ctx.step("invoice", send_invoice))

        answer, invoice = await asyncio.gather(
            ctx.ask("Go on?", options=["yes", "no"]), asyncio.shield(later())
        )
        return f"{answer.value} {invoice}"

    agent = scripted_agent("shop", [call_tools(call("bill")), reply("Done.")], tools=[bill])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("shop", prompt="bill")
        assert r.status == "waiting"
        await asyncio.sleep(0.4)
        assert sent == []
        r = await rt.send(r.session_id, "yes")
        assert r.status == "completed", r
    assert sent == ["invoice"]


async def test_a_question_of_a_task_left_running_after_its_body_parked_asks_nothing(
    store_url: str,
) -> None:
    """A task the body started asks after the body parked: it is refused by name, not left to
    the internal signal its record raised, and nothing is asked."""
    refused: list[BaseException] = []

    async def later(ctx: so.ToolContext) -> str:
        await asyncio.sleep(0.2)
        try:
            return (await ctx.ask("And the address?")).value
        except BaseException as exc:
            refused.append(exc)
            raise

    @so.tool
    async def bill(ctx: so.ToolContext) -> str:
        """Ask whether to go on, and (later) for the address."""
        task = asyncio.create_task(later(ctx))
        answer = await ctx.ask("Go on?", options=["yes", "no"])
        task.cancel()
        return answer.value

    agent = scripted_agent("shop", [call_tools(call("bill")), reply("Done.")], tools=[bill])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("shop", prompt="bill")
        assert r.status == "waiting"
        await asyncio.sleep(0.4)
        [exc] = refused
        assert isinstance(exc, so.UsageError)
        assert "nothing was asked" in str(exc)
        assert [p.question for p in await rt.pending()] == ["Go on?"]


async def test_a_finally_of_a_body_parked_on_a_question_steps_nothing_until_the_resume(
    store_url: str,
) -> None:
    """The body's `finally` ran its release step as the body was cancelled to park, and that
    step was journaled: the release happened while the lock was still needed, and the resumed
    body (unchanged) failed with a ReplayError at its next step, "recorded step 'release'
    there". The journal is closed before the body is cancelled: the `finally`'s step is refused
    (its `so.UsageError` is no outcome of the call), and runs once, when the resumed body ends."""
    effects: list[str] = []
    refused: list[BaseException] = []

    def effect(name: str) -> str:
        effects.append(name)
        return name

    @so.tool
    async def locked(ctx: so.ToolContext) -> str:
        """Take the lock, ask, work and let the lock go."""
        await ctx.step("acquire", effect, "acquire")
        try:
            answer = await ctx.ask("Go on?", options=["yes", "no"])
            await ctx.step("work", effect, "work")
            return f"worked: {answer.value}"
        finally:
            try:
                await ctx.step("release", effect, "release")
            except so.UsageError as exc:
                refused.append(exc)

    seen = Capture(reply("Done."))
    agent = scripted_agent("shop", [call_tools(call("locked")), seen], tools=[locked])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("shop", prompt="work")
        assert r.status == "waiting"
        assert [p.question for p in r.pending] == ["Go on?"]
        assert effects == ["acquire"]
        [exc] = refused
        assert "stopped" in str(exc) and "nothing ran" in str(exc)
        r = await rt.send(r.session_id, "yes")
        assert r.status == "completed", r
        steps = [
            e.data["name"]
            async for e in rt.events(r.session_id, 0, follow=False)
            if e.type == "tool.step"
        ]
    assert tool_results(seen.last)[0].content == "worked: yes"
    assert effects == ["acquire", "work", "release"]
    assert steps == ["acquire", "work", "release"]


async def test_a_finally_of_a_body_parked_on_a_question_asks_nothing(store_url: str) -> None:
    """A question the body's `finally` asked as the body was cancelled to park was opened: two
    questions waited where the body had asked one, the second of a body that was not running.
    It is refused, and only the body's own question waits."""
    refused: list[BaseException] = []

    @so.tool
    async def confirm(ctx: so.ToolContext) -> str:
        """Ask, and ask again on the way out."""
        try:
            return (await ctx.ask("Go on?", options=["yes", "no"])).value
        finally:
            try:
                await ctx.ask("Clean up?", options=["yes", "no"])
            except so.UsageError as exc:
                refused.append(exc)

    agent = scripted_agent("shop", [call_tools(call("confirm")), reply("Done.")], tools=[confirm])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await asyncio.wait_for(rt.generate("shop", prompt="confirm"), 10)
        assert r.status == "waiting"
        assert [p.question for p in r.pending] == ["Go on?"]
        assert [p.question for p in await rt.pending()] == ["Go on?"]
        [exc] = refused
        assert "nothing was asked" in str(exc)


async def test_a_finally_refused_a_step_as_its_body_parks_names_the_unwinding_and_logs_nothing(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The body's `finally` stepped as the body was cancelled to park, and let the refusal
    (`so.UsageError`, no outcome of the call) go: the body's task ended with it, never
    retrieved, and asyncio logged it at ERROR on every park, its message blaming "a branch of
    its body outlived it". The refusal is retrieved, and names the body's unwinding."""
    effects: list[str] = []
    refused: list[BaseException] = []

    def effect(name: str) -> str:
        effects.append(name)
        return name

    @so.tool
    async def confirm(ctx: so.ToolContext) -> str:
        """Ask, and clean up on the way out."""
        try:
            return (await ctx.ask("Go on?", options=["yes", "no"])).value
        finally:
            try:
                await ctx.step("cleanup", effect, "cleanup")
            except so.UsageError as exc:
                refused.append(exc)
                raise

    gc.collect()  # an earlier test's task, logged as it is collected, is not this one's
    caplog.clear()
    agent = scripted_agent("shop", [call_tools(call("confirm")), reply("Done.")], tools=[confirm])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("shop", prompt="confirm")
        assert r.status == "waiting"
        gc.collect()  # a task whose exception nobody retrieved is logged as it is collected
        logged = [
            r.getMessage()
            for r in caplog.records
            if r.name == "asyncio" and r.levelno >= logging.ERROR
        ]
        [exc] = refused
        assert (logged, "outlived" in str(exc), "unwinding" in str(exc)) == ([], False, True)
        assert "stopped" in str(exc) and "nothing ran" in str(exc)
        r = await rt.send(r.session_id, "yes")
        assert (r.status, r.text) == ("completed", "Done.")
    assert effects == ["cleanup"]
