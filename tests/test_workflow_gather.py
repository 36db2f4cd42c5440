"""Workflow tools that ask or step in `asyncio.gather` branches: answered in any order, replayed
in the order each branch reaches the journal."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

import signoff as so
from signoff import _tool_context
from signoff.testing import (
    Capture,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    timeline,
    tool_results,
)

from .test_workflow import ALICE, events


async def test_two_asks_in_gather_are_answered_one_message_each_in_order(
    tmp_path: Path,
) -> None:
    bodies = 0

    @so.tool
    async def book(ctx: so.ToolContext) -> dict[str, str]:
        """Ask for the date and the party size at once."""
        nonlocal bodies
        bodies += 1
        date, seats = await asyncio.gather(
            ctx.ask("Which date?"), ctx.ask("How many seats?", options=["two", "four", "six"])
        )
        return {"date": date.value, "seats": seats.value}

    seen = Capture(reply("Booked."))
    agent = scripted_agent("host", [call_tools(call("book", call_id="b1")), seen], tools=[book])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("host", prompt="book a table", auth=ALICE)
        sid = r.session_id
        assert r.status == "waiting"
        assert [p.question for p in r.pending] == ["Which date?", "How many seats?"]
        date_req, seats_req = r.pending

        # "four" names an option of the second question, but a message answers the first
        r = await rt.send(sid, "four", principal=ALICE)
        assert r.status == "waiting"
        assert [p.id for p in r.pending] == [seats_req.id]
        assert bodies == 1  # still waiting on the second: the body does not re-run yet

        r = await rt.send(sid, "3", principal=ALICE)  # the 1-based index of "six"
        assert r.status == "completed"
        assert bodies == 2
        [result] = tool_results(seen.last)
        assert result.content == {"date": "four", "seats": "six"}

        log = await events(rt, sid)
        assert timeline(log)[3:] == [
            "tool.started book",
            "input.requested question:Which date?",
            "input.requested question:How many seats?",
            "turn.waiting",
            "input.resolved answered",
            "input.resolved answered",
            "tool.completed book ok",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        waiting = next(e for e in log if e.type == "turn.waiting")
        assert waiting.data["request_ids"] == [date_req.id, seats_req.id]
        resolved = [e.data for e in log if e.type == "input.resolved"]
        assert [d["request_id"] for d in resolved] == [date_req.id, seats_req.id]
        assert resolved[0]["answer"] == {"value": "four", "option_id": None, "text": "four"}
        assert resolved[1]["answer"] == {"value": "six", "option_id": "six", "text": None}


async def test_gather_answers_by_id_in_any_order_land_where_they_belong(tmp_path: Path) -> None:
    @so.tool
    async def book(ctx: so.ToolContext) -> dict[str, str]:
        """Ask for the date and the party size at once."""
        date, seats = await asyncio.gather(ctx.ask("Which date?"), ctx.ask("How many seats?"))
        return {"date": date.value, "seats": seats.value}

    seen = Capture(reply("Booked."))
    agent = scripted_agent("host", [call_tools(call("book")), seen], tools=[book])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("host", prompt="book a table", auth=ALICE)
        date_req, seats_req = r.pending
        r = await rt.respond(
            r.session_id, [so.InputResponse(request_id=seats_req.id, text="5")], principal=ALICE
        )
        assert [p.id for p in r.pending] == [date_req.id]
        r = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=date_req.id, text="Friday")],
            principal=ALICE,
        )
        assert r.status == "completed"
        assert tool_results(seen.last)[0].content == {"date": "Friday", "seats": "5"}


async def test_gather_answers_in_one_respond_call_rerun_the_body_once(tmp_path: Path) -> None:
    bodies = 0

    @so.tool
    async def book(ctx: so.ToolContext) -> dict[str, str]:
        """Ask for the date and the party size at once."""
        nonlocal bodies
        bodies += 1
        date, seats = await asyncio.gather(ctx.ask("Which date?"), ctx.ask("How many seats?"))
        return {"date": date.value, "seats": seats.value}

    seen = Capture(reply("Booked."))
    agent = scripted_agent("host", [call_tools(call("book")), seen], tools=[book])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("host", prompt="book a table", auth=ALICE)
        date_req, seats_req = r.pending
        r = await rt.respond(
            r.session_id,
            [
                so.InputResponse(request_id=seats_req.id, text="2"),
                so.InputResponse(request_id=date_req.id, text="Sunday"),
            ],
            principal=ALICE,
        )
        assert r.status == "completed"
        assert bodies == 2
        assert tool_results(seen.last)[0].content == {"date": "Sunday", "seats": "2"}
        tl = timeline(await events(rt, r.session_id))
        assert tl.count("turn.waiting") == 1
        assert tl.count("input.resolved answered") == 2


async def test_a_question_a_gather_branch_asks_as_its_sibling_fails_is_withdrawn(
    tmp_path: Path,
) -> None:
    """One branch of a gather fails while its sibling asks: the call ends with the error, and
    the sibling's question is withdrawn with it instead of staying open in a finished turn
    (where it blocked every later message with PartialAnswer)."""

    @so.tool
    async def reserve(ctx: so.ToolContext) -> list[str]:
        """Check stock and ask for a colour at once."""

        async def stock() -> str:
            raise ValueError("out of stock")

        async def colour() -> str:
            return (await ctx.ask("Which colour?")).value

        return list(await asyncio.gather(stock(), colour()))

    seen = Capture(reply("Sorry, it is out of stock."))
    agent = scripted_agent(
        "shop", [call_tools(call("reserve", call_id="r1")), seen, reply("Hello.")], tools=[reserve]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("shop", prompt="reserve a shirt", auth=ALICE)
        assert r.status == "completed"
        assert r.pending == []
        assert await rt.pending() == []
        [result] = tool_results(seen.last)
        assert result.is_error is True
        assert result.content == {"error": "ValueError: out of stock"}
        log = await events(rt, r.session_id)
        tl = timeline(log)
        assert tl.index("input.resolved cancelled") < tl.index("tool.completed reserve error")
        resolved = next(e.data for e in log if e.type == "input.resolved")
        assert resolved["status"] == "withdrawn"
        r = await rt.send(r.session_id, "hi", principal=ALICE)  # the session is not stuck
        assert r.status == "completed"
        assert r.text == "Hello."


async def test_gather_branches_that_go_on_after_a_replayed_ask_replay_in_order(
    tmp_path: Path,
) -> None:
    """A branch whose answered ask replays goes on (here to a step) only after its siblings
    reached their own asks, as on the first run: it must not take a sibling's journal place."""
    sent: list[str] = []

    def send(value: str) -> str:
        sent.append(value)
        return "sent"

    @so.tool
    async def transfer(ctx: so.ToolContext) -> dict[str, str]:
        """Confirm and send, while asking for a memo."""

        async def confirm_and_send() -> str:
            answer = await ctx.ask("Send it?", options=["yes", "no"])
            return str(await ctx.step("send", send, answer.value))

        async def memo() -> str:
            return (await ctx.ask("Memo?")).value

        done, note = await asyncio.gather(confirm_and_send(), memo())
        return {"send": done, "memo": note}

    seen = Capture(reply("Done."))
    agent = scripted_agent(
        "bank", [call_tools(call("transfer", call_id="t1")), seen], tools=[transfer]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("bank", prompt="pay rent", auth=ALICE)
        confirm, memo = r.pending
        r = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=confirm.id, option_id="yes")],
            principal=ALICE,
        )
        assert [p.id for p in r.pending] == [memo.id]
        r = await rt.respond(
            r.session_id, [so.InputResponse(request_id=memo.id, text="rent")], principal=ALICE
        )
        assert r.status == "completed"
        [result] = tool_results(seen.last)
        assert result.is_error is False
        assert result.content == {"send": "sent", "memo": "rent"}
        assert sent == ["yes"]
        assert await rt.pending() == []


@pytest.mark.parametrize("pauses", [0, 3])
async def test_gather_branches_replay_whatever_order_they_reach_the_journal(
    store_url: str, pauses: int
) -> None:
    """A branch that steps while its sibling asks may reach the journal in another order on
    replay (a step's function yields the first time, not when replayed; a PostgreSQL commit
    yields, a SQLite one does not): each branch still gets its own entries, nothing re-runs."""
    ran: list[str] = []

    async def lookup() -> str:
        for _ in range(pauses):
            await asyncio.sleep(0)  # a first run yields here; a replay does not run it
        ran.append("lookup")
        return "sku-1"

    def reserve(sku: str) -> str:
        ran.append("reserve")
        return f"reserved {sku}"

    @so.tool
    async def order(ctx: so.ToolContext) -> dict[str, str]:
        """Look up and reserve the item while asking for a colour."""

        async def stock() -> str:
            sku = await ctx.step("lookup", lookup)
            return str(await ctx.step("reserve", reserve, sku))

        async def colour() -> str:
            await asyncio.sleep(0)
            return (await ctx.ask("Which colour?")).value

        reserved, picked = await asyncio.gather(stock(), colour())
        return {"reserved": reserved, "colour": picked}

    seen = Capture(reply("Ordered."))
    agent = scripted_agent("shop", [call_tools(call("order", call_id="o1")), seen], tools=[order])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("shop", prompt="order a shirt", auth=ALICE)
        assert r.status == "waiting"
        r = await rt.send(r.session_id, "red", principal=ALICE)
        assert r.status == "completed"
        [result] = tool_results(seen.last)
        assert result.is_error is False, result.content
        assert result.content == {"reserved": "reserved sku-1", "colour": "red"}
        assert sorted(ran) == ["lookup", "reserve"]  # each ran once, on the first run


async def test_a_gather_branch_that_changed_between_runs_is_a_replay_error(
    tmp_path: Path,
) -> None:
    """Keyed replay forgives another interleaving, not another tool: a branch that steps under
    another name on replay, leaving its recorded step unreached, is a ReplayError."""
    bodies = 0
    ran: list[str] = []

    @so.tool
    async def order(ctx: so.ToolContext) -> list[str]:
        """Reserve while asking for a colour; the step is renamed on the second run."""
        nonlocal bodies
        bodies += 1
        name = "reserve" if bodies == 1 else "hold"

        async def stock() -> str:
            return str(await ctx.step(name, ran.append, name))

        async def colour() -> str:
            return (await ctx.ask("Which colour?")).value

        return list(await asyncio.gather(stock(), colour()))

    seen = Capture(reply("Failed."))
    agent = scripted_agent("shop", [call_tools(call("order", call_id="o1")), seen], tools=[order])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("shop", prompt="order", auth=ALICE)
        r = await rt.send(r.session_id, "red", principal=ALICE)
        assert r.status == "completed"
        [result] = tool_results(seen.last)
        assert result.is_error is True
        assert result.content["error"].startswith("ReplayError: ")
        assert "replayed step 'hold'" in result.content["error"]
        assert "recorded step 'reserve'" in result.content["error"]
        assert ran == ["reserve"]  # the renamed step never ran


async def test_a_step_under_way_when_a_sibling_parks_finishes_and_is_journaled(
    store_url: str,
) -> None:
    """A gather branch's step still running when its sibling's question parks the turn is not
    cancelled halfway (its effect done, its record not): it ends, is journaled, and a replay
    returns it instead of running it again."""
    ran: list[str] = []

    async def charge() -> str:
        await asyncio.sleep(0.05)  # an HTTP call, say
        ran.append("charge")
        return "charged"

    @so.tool
    async def checkout(ctx: so.ToolContext) -> list[str]:
        """Charge while asking for a delivery slot."""

        async def slot() -> str:
            return (await ctx.ask("Which slot?")).value

        return list(await asyncio.gather(ctx.step("charge", charge), slot()))

    seen = Capture(reply("Done."))
    agent = scripted_agent(
        "shop", [call_tools(call("checkout", call_id="c1")), seen], tools=[checkout]
    )
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("shop", prompt="checkout", auth=ALICE)
        assert r.status == "waiting"
        assert ran == ["charge"]
        log = await events(rt, r.session_id)
        assert "tool.step checkout:charge" in timeline(log)
        r = await rt.send(r.session_id, "morning", principal=ALICE)
        assert r.status == "completed"
        assert tool_results(seen.last)[0].content == ["charged", "morning"]
        assert ran == ["charge"]


async def test_a_step_under_way_that_fails_as_a_sibling_parks_ends_the_call(
    store_url: str,
) -> None:
    """A gather branch's step still running when its sibling's question parks the turn is
    waited for; when it fails, the gather and the body fail with it. That failure was dropped
    and the turn parked on the question anyway: a person was asked, and only their answer ran
    the body again to the same error. Now the call ends with it and the question is withdrawn."""
    ran: list[str] = []

    async def charge() -> str:
        await asyncio.sleep(0.05)  # an HTTP call, say
        ran.append("charge")
        raise ValueError("card declined")

    @so.tool
    async def checkout(ctx: so.ToolContext) -> list[str]:
        """Charge while asking for a delivery slot."""

        async def slot() -> str:
            return (await ctx.ask("Which slot?")).value

        return list(await asyncio.gather(ctx.step("charge", charge), slot()))

    seen = Capture(reply("The card was declined."))
    agent = scripted_agent(
        "shop", [call_tools(call("checkout", call_id="c1")), seen], tools=[checkout]
    )
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("shop", prompt="checkout", auth=ALICE)
        assert (r.status, r.pending) == ("completed", [])
        assert await rt.pending() == []
        [result] = tool_results(seen.last)
        assert (result.is_error, result.content) == (True, {"error": "ValueError: card declined"})
        tl = timeline(await events(rt, r.session_id))
        assert tl.index("tool.step checkout:charge") < tl.index("input.resolved cancelled")
        assert tl.index("input.resolved cancelled") < tl.index("tool.completed checkout error")
        assert "turn.waiting" not in tl
    assert ran == ["charge"]


async def test_a_sibling_that_awaits_io_before_its_recorded_step_is_waited_for(
    store_url: str,
) -> None:
    """On replay a branch reaching a new step waits for its siblings to replay what they
    recorded: one that first awaits something else (a read, not a step) gets there later than a
    few loop passes, and is waited for rather than taken for a changed tool (a ReplayError that
    failed the call for good after the person had answered)."""
    ran: list[str] = []

    async def quote() -> float:
        await asyncio.sleep(0.3)  # slower than the sibling's read: recorded after its step
        ran.append("quote")
        return 2.5

    def reserve() -> str:
        ran.append("reserve")
        return "reserved"

    def send() -> str:
        ran.append("send")
        return "sent"

    @so.tool
    async def order(ctx: so.ToolContext) -> list[str]:
        """Quote, confirm and send, while reading the catalogue and reserving."""

        async def confirm_and_send() -> str:
            fee = await ctx.step("quote", quote)
            await ctx.ask(f"The fee is {fee}. Proceed?", options=["yes", "no"])
            return str(await ctx.step("send", send))

        async def read_and_reserve() -> str:
            await asyncio.sleep(0.02)  # a catalogue read: not a side effect, so not a step
            return str(await ctx.step("reserve", reserve))

        return list(await asyncio.gather(confirm_and_send(), read_and_reserve()))

    seen = Capture(reply("Done."))
    agent = scripted_agent("shop", [call_tools(call("order", call_id="o1")), seen], tools=[order])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("shop", prompt="order", auth=ALICE)
        assert [p.question for p in r.pending] == ["The fee is 2.5. Proceed?"]
        r = await rt.send(r.session_id, "yes", principal=ALICE)
        assert r.status == "completed"
        [result] = tool_results(seen.last)
        assert (result.is_error, result.content) == (False, ["sent", "reserved"])
        assert ran == ["reserve", "quote", "send"]  # each once


async def test_a_stalled_loop_does_not_turn_a_waited_for_sibling_into_a_replay_error(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The grace a branch at a new step gives its siblings is counted in time the loop ran, not
    on the wall clock alone: a stall of the whole loop (a busy machine, a blocking call), longer
    than `REPLAY_GRACE`, while a sibling awaits a short read before its recorded step, let the
    waiting branch wake past the grace before the sibling could run, and fail the call for good
    with a ReplayError of a tool that had not changed."""
    monkeypatch.setattr(_tool_context, "REPLAY_GRACE", 0.5)
    bodies = 0
    ran: list[str] = []

    async def quote() -> float:
        await asyncio.sleep(0.3)  # recorded after the sibling's step
        ran.append("quote")
        return 2.5

    def reserve() -> str:
        ran.append("reserve")
        return "reserved"

    def send() -> str:
        ran.append("send")
        return "sent"

    @so.tool
    async def order(ctx: so.ToolContext) -> list[str]:
        """Quote, confirm and send, while reading the catalogue and reserving."""
        nonlocal bodies
        bodies += 1

        async def confirm_and_send() -> str:
            fee = await ctx.step("quote", quote)
            await ctx.ask(f"The fee is {fee}. Proceed?", options=["yes", "no"])
            return str(await ctx.step("send", send))

        async def read_and_reserve() -> str:
            if bodies > 1:  # on replay, once the sibling waits at its new step "send"
                await asyncio.sleep(0.05)
                time.sleep(0.8)  # the loop stalls, past the grace
            await asyncio.sleep(0.02)  # a catalogue read: not a side effect, so not a step
            return str(await ctx.step("reserve", reserve))

        return list(await asyncio.gather(confirm_and_send(), read_and_reserve()))

    seen = Capture(reply("Done."))
    agent = scripted_agent("shop", [call_tools(call("order", call_id="o1")), seen], tools=[order])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("shop", prompt="order", auth=ALICE)
        assert [p.question for p in r.pending] == ["The fee is 2.5. Proceed?"]
        r = await rt.send(r.session_id, "yes", principal=ALICE)
        assert r.status == "completed"
        [result] = tool_results(seen.last)
        assert (result.is_error, result.content) == (False, ["sent", "reserved"])
        assert ran == ["reserve", "quote", "send"]  # each once
        assert bodies == 2


@pytest.mark.parametrize("branches", [False, True], ids=["plain", "gather"])
async def test_a_body_that_returns_without_replaying_what_it_recorded_is_a_replay_error(
    tmp_path: Path, branches: bool
) -> None:
    """On replay the body took another branch (on a read that is not journaled) and returned
    without reaching its recorded step and answered question: the call completed with its new
    result, though the debit had happened. It is a ReplayError, as stepping in another order
    is, and the step does not run again."""
    bodies = 0
    ran: list[str] = []

    @so.tool
    async def transfer(ctx: so.ToolContext) -> str:
        """Debit, then ask whether to credit; another path on the second run."""
        nonlocal bodies
        bodies += 1
        if bodies > 1:
            return "nothing done"

        async def debit() -> None:
            await ctx.step("debit", ran.append, "debit")

        async def credit() -> str:
            return (await ctx.ask("Credit the other account?", options=["yes", "no"])).value

        if branches:
            return str((await asyncio.gather(debit(), credit()))[1])
        await debit()
        return await credit()

    seen = Capture(reply("Failed."))
    agent = scripted_agent("bank", [call_tools(call("transfer")), seen], tools=[transfer])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("bank", prompt="move it", auth=ALICE)
        (asked,) = r.pending
        answer = so.InputResponse(request_id=asked.id, option_id="yes")
        r = await rt.respond(r.session_id, [answer], principal=ALICE)
        assert r.status == "completed"
    [result] = tool_results(seen.last)
    assert result.is_error is True
    error = result.content["error"]
    assert (
        error.startswith("ReplayError: tool 'transfer'") and "returned without replaying" in error
    )
    assert "step 'debit'" in error or "ask 'Credit the other account?'" in error
    assert ran == ["debit"]


async def test_a_signal_from_a_task_group_branch_is_the_calls_not_an_error(
    tmp_path: Path,
) -> None:
    """`asyncio.TaskGroup` wraps what a branch raises in an exception group: a branch's
    `ctx.request_approval` ended the call as the error 'unhandled errors in a TaskGroup',
    nobody asked, and a question a message steered past ended it as an error, not cancelled."""

    @so.tool
    async def wire(ctx: so.ToolContext) -> str:
        """Wire money, approved in a branch."""

        async def approve() -> None:
            ctx.request_approval({"amount": 900})

        async with asyncio.TaskGroup() as tg:
            tg.create_task(approve())
        return "unreachable"

    @so.tool
    async def pick(ctx: so.ToolContext) -> str:
        """Ask for the account in a branch."""

        async def ask() -> str:
            options = ["checking", "savings"]
            return (await ctx.ask("Which account?", options, allow_text=False)).value

        async with asyncio.TaskGroup() as tg:
            asked = tg.create_task(ask())
        return asked.result()

    agent = scripted_agent(
        "bank",
        [call_tools(call("wire")), reply("Wired."), call_tools(call("pick")), reply("Okay.")],
        tools=[wire, pick],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("bank", prompt="wire", auth=ALICE)
        assert (r.status, [p.kind for p in r.pending]) == ("waiting", ["tool-approval"])
        r = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=r.pending[0].id, option_id="approve")],
            principal=ALICE,
        )
        assert (r.status, r.text) == ("completed", "Wired.")
        r = await rt.generate(session_id=r.session_id, prompt="pick", auth=ALICE)
        assert r.status == "waiting"
        r = await rt.send(r.session_id, "never mind", principal=ALICE)
        assert (r.status, r.text) == ("completed", "Okay.")
        lines = timeline(await events(rt, r.session_id))
        assert "tool.completed wire decided" in lines
        assert "tool.completed pick cancelled" in lines
