"""A branch of a tool's body that outlives the body (an `asyncio.gather` whose other branch
failed, a task the body started): its `ctx.step` runs nothing once the call has ended."""

from __future__ import annotations

import asyncio

import signoff as so
from signoff.testing import Capture, call, call_tools, reply, scripted_agent


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
