"""Workflow tools: `ctx.ask()` parks the turn, `ctx.step()` journals, and a re-run replays both."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff._steps import raise_recorded
from signoff.stores import Commit, SQLiteStore
from signoff.testing import (
    Capture,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    store_contents,
    timeline,
    tool_results,
)

from ._replaced import assert_only_the_new_turn, replace_turn

ALICE = so.Principal(authenticator="okta", principal_id="alice", principal_type="user")
BOB = so.Principal(authenticator="sso", principal_id="bob", principal_type="service")


async def events(rt: so.Runtime, session_id: str) -> list[so.Event]:
    return [e async for e in rt.events(session_id, follow=False)]


def answer_dict(answer: so.Answer) -> dict[str, Any]:
    return {
        "value": answer.value,
        "option_id": answer.option_id,
        "text": answer.text,
        "authenticator": answer.authenticator,
        "principal_id": answer.principal_id,
        "principal_type": answer.principal_type,
    }


class Transfer:
    """A workflow tool that quotes (a journaled step), then asks twice; counts what really ran."""

    def __init__(self) -> None:
        self.quotes = 0
        self.bodies = 0
        self.keys: list[str] = []
        self.currents: list[so.Principal | None] = []

        @so.tool
        async def transfer(ctx: so.ToolContext, amount: float) -> dict[str, Any]:
            """Move money after the customer confirms the fee."""
            self.bodies += 1
            self.keys.append(ctx.idempotency_key("send"))
            self.currents.append(ctx.session.auth.current)
            quote = await ctx.step("quote", self.quote, amount)
            proceed = await ctx.ask(f"Fee is {quote['fee']}. Proceed?", options=["yes", "no"])
            account = await ctx.ask("Which account should it come from?")
            return {
                "quote": quote,
                "proceed": answer_dict(proceed),
                "account": answer_dict(account),
            }

        self.tool = transfer

    def quote(self, amount: float) -> dict[str, float]:
        self.quotes += 1
        return {"fee": round(amount * 0.025, 2)}


async def test_step_runs_once_and_answers_replay_in_order(tmp_path: Path) -> None:
    t = Transfer()
    seen = Capture(reply("Sent."))
    agent = scripted_agent(
        "bank", [call_tools(call("transfer", id="c1", amount=200)), seen], tools=[t.tool]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("bank", prompt="move 200", auth=ALICE)
        sid = r.session_id
        assert r.status == "waiting"
        [first] = r.pending
        assert first.kind == "question"
        assert first.question == "Fee is 5.0. Proceed?"
        assert [(o.id, o.label) for o in first.options] == [("yes", "yes"), ("no", "no")]
        assert first.allow_text is True
        assert first.call_id == "c1"
        assert first.requested_by == ALICE
        assert (t.quotes, t.bodies) == (1, 1)

        r = await rt.respond(
            sid, [so.InputResponse(request_id=first.id, option_id="yes")], principal=ALICE
        )
        assert r.status == "waiting"
        assert r.outcomes == [so.Outcome(request_id=first.id, outcome="answered", applied=True)]
        [second] = r.pending
        assert second.question == "Which account should it come from?"
        assert second.options == []
        assert (t.quotes, t.bodies) == (1, 2)  # the body re-ran; the step replayed

        r = await rt.send(sid, "savings", principal=ALICE)
        assert r.status == "completed"
        assert r.text == "Sent."
        assert (t.quotes, t.bodies) == (1, 3)
        log = await events(rt, sid)
        # stable across replays (the call's key, recorded once); the turn's auth never changes
        started = [e.data for e in log if e.type == "tool.started"]
        assert len(started) == 1
        key = started[0]["idempotency_key"]
        assert key.startswith(sid) and "c1" in key
        assert t.keys == [f"{key}:send"] * 3
        assert t.currents == [ALICE] * 3

        assert timeline(log) == [
            "session.created",
            "turn.started",
            "model.completed",
            "tool.started transfer",
            "tool.step transfer:quote",
            "input.requested question:Fee is 5.0. Proceed?",
            "turn.waiting",
            "input.resolved answered",
            "input.requested question:Which account should it come from?",
            "turn.waiting",
            "input.resolved answered",
            "tool.completed transfer ok",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        assert [e.seq for e in log] == list(range(1, len(log) + 1))
        waits = [e for e in log if e.type == "turn.waiting"]
        assert [w.data for w in waits] == [
            {"on": "input", "request_ids": [first.id]},
            {"on": "input", "request_ids": [second.id]},
        ]
        assert {e.turn_id for e in log[1:]} == {r.turn_id}  # one turn throughout
        step = next(e for e in log if e.type == "tool.step")
        assert step.data["result"] == {"fee": 5.0}
        resolved = [e.data for e in log if e.type == "input.resolved"]
        assert resolved[0]["answer"] == {"value": "yes", "option_id": "yes", "text": None}
        assert resolved[1]["answer"] == {"value": "savings", "option_id": None, "text": "savings"}

        who = {"authenticator": "okta", "principal_id": "alice", "principal_type": "user"}
        [result] = tool_results(seen.last)
        assert result.is_error is False
        assert result.content == {
            "quote": {"fee": 5.0},
            "proceed": {"value": "yes", "option_id": "yes", "text": None, **who},
            "account": {"value": "savings", "option_id": None, "text": "savings", **who},
        }
        # the model saw no extra user message: "savings" was an answer, not a message
        assert [m.kind for m in seen.last] == ["user", "assistant", "tool"]


async def test_answer_names_the_responder_not_the_turns_auth(tmp_path: Path) -> None:
    t = Transfer()
    agent = scripted_agent(
        "bank", [call_tools(call("transfer", amount=40)), reply("ok")], tools=[t.tool]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("bank", prompt="move 40")  # nobody in particular started it
        r = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=r.pending[0].id, text="Yes please")],
            principal=BOB,
        )
        r = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=r.pending[0].id, option_id=None, text="checking")],
            principal=ALICE,
        )
        assert r.status == "completed"
        assert t.currents == [None, None, None]  # ctx.session.auth.current stays the run's
        log = await events(rt, r.session_id)
        result = next(e for e in log if e.type == "tool.completed").data["result"]
        assert result["proceed"] == {
            "value": "Yes please",
            "option_id": None,
            "text": "Yes please",
            "authenticator": "sso",
            "principal_id": "bob",
            "principal_type": "service",
        }
        assert result["account"]["principal_id"] == "alice"
        assert result["account"]["authenticator"] == "okta"
        by = [e.data["by"]["principal_id"] for e in log if e.type == "input.resolved"]
        assert by == ["bob", "alice"]


async def test_asking_in_a_different_order_on_replay_is_a_replay_error(tmp_path: Path) -> None:
    bodies = 0

    @so.tool
    async def fickle(ctx: so.ToolContext) -> str:
        """Asks a different first question on every run: a bug replay must catch."""
        nonlocal bodies
        bodies += 1
        first = "Colour?" if bodies == 1 else "Size?"
        a = await ctx.ask(first)
        return a.value

    seen = Capture(reply("Something went wrong."))
    agent = scripted_agent("shop", [call_tools(call("fickle")), seen], tools=[fickle])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("shop", prompt="buy", auth=ALICE)
        r = await rt.send(r.session_id, "red", principal=ALICE)
        assert r.status == "completed"
        assert bodies == 2
        [result] = tool_results(seen.last)
        assert result.is_error is True
        error = result.content["error"]
        assert error.startswith("ReplayError: ")
        assert "replayed ask 'Size?' at position 1" in error
        assert "recorded ask 'Colour?'" in error
        assert timeline(await events(rt, r.session_id))[3:] == [
            "tool.started fickle",
            "input.requested question:Colour?",
            "turn.waiting",
            "input.resolved answered",
            "tool.completed fickle error",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]


async def test_a_step_where_an_ask_was_recorded_is_a_replay_error(tmp_path: Path) -> None:
    bodies = 0
    charged: list[int] = []

    @so.tool
    async def checkout(ctx: so.ToolContext) -> str:
        """Confirms, then charges; a second run skips the question by mistake."""
        nonlocal bodies
        bodies += 1
        if bodies == 1:
            await ctx.ask("Charge the card?", options=["yes", "no"], allow_text=False)
        await ctx.step("charge", charged.append, bodies)
        return "charged"

    seen = Capture(reply("Failed."))
    agent = scripted_agent("shop", [call_tools(call("checkout")), seen], tools=[checkout])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("shop", prompt="checkout", auth=ALICE)
        r = await rt.send(r.session_id, "yes", principal=ALICE)
        assert r.status == "completed"
        assert charged == []  # the mismatch is caught before the step's function runs
        [result] = tool_results(seen.last)
        assert result.is_error is True
        assert "replayed step 'charge' at position 1" in result.content["error"]
        assert "recorded ask 'Charge the card?'" in result.content["error"]
        log = await events(rt, r.session_id)
        assert "tool.step checkout:charge" not in timeline(log)


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
    agent = scripted_agent("host", [call_tools(call("book", id="b1")), seen], tools=[book])
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


async def test_a_withdrawn_question_that_propagates_cancels_the_call(tmp_path: Path) -> None:
    bodies = 0

    @so.tool
    async def pick(ctx: so.ToolContext) -> str:
        """Choose a plan; lets a withdrawal propagate."""
        nonlocal bodies
        bodies += 1
        a = await ctx.ask("Which plan?", options=["basic", "pro"], allow_text=False)
        return a.value

    seen = Capture(reply("Okay, I'll stop."))
    agent = scripted_agent("sales", [call_tools(call("pick", id="p1")), seen], tools=[pick])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("sales", prompt="upgrade me", auth=ALICE)
        [req] = r.pending
        r = await rt.send(r.session_id, "actually, cancel my account", principal=ALICE)
        assert r.status == "completed"
        assert bodies == 2  # re-ran once, and its ask raised QuestionWithdrawn
        log = await events(rt, r.session_id)
        assert timeline(log)[3:] == [
            "tool.started pick",
            "input.requested question:Which plan?",
            "turn.waiting",
            "input.resolved cancelled",
            "turn.message actually, cancel my account",
            "tool.completed pick cancelled",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        resolved = next(e for e in log if e.type == "input.resolved")
        assert resolved.data["request_id"] == req.id
        assert resolved.data["status"] == "withdrawn"
        # the model reads the message once the call settled: result first, then the message
        kinds = [(m.kind, getattr(m, "text", None)) for m in seen.last]
        assert kinds == [
            ("user", "upgrade me"),
            ("assistant", ""),
            ("tool", None),
            ("user", "actually, cancel my account"),
        ]
        [result] = tool_results(seen.last)
        assert result.is_error is True
        assert result.content["cancelled"] is True


async def test_steering_sets_the_abort_signal_of_a_running_workflow_call(
    tmp_path: Path,
) -> None:
    entered = asyncio.Event()

    @so.tool
    async def crawl(ctx: so.ToolContext) -> str:
        """A long task that stops when the turn is steered."""
        entered.set()
        await asyncio.wait_for(ctx.abort_signal.wait(), timeout=10)
        return "stopped early"

    seen = Capture(reply("Stopped; what next?"))
    agent = scripted_agent("bot", [call_tools(call("crawl")), seen], tools=[crawl])
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid = await rt.create_session("bot", auth=ALICE)
        running = asyncio.create_task(rt.generate(session_id=sid, prompt="crawl", auth=ALICE))
        await asyncio.wait_for(entered.wait(), timeout=10)
        steered = await rt.send(sid, "stop, I found it", principal=ALICE)
        r = await running
        assert r.status == "completed"
        assert steered.status == "completed"
        assert r.text == "Stopped; what next?"
        [result] = tool_results(seen.last)
        assert result.content == "stopped early"
        assert [getattr(m, "text", None) for m in seen.last][-1] == "stop, I found it"
        assert timeline(await events(rt, sid))[1:] == [
            "turn.started",
            "model.completed",
            "tool.started crawl",
            "turn.message stop, I found it",
            "tool.completed crawl ok",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]


async def test_cancelling_sets_the_abort_signal_and_calls_no_model(tmp_path: Path) -> None:
    entered = asyncio.Event()
    aborted = asyncio.Event()

    @so.tool
    async def crawl(ctx: so.ToolContext) -> str:
        """A long task that stops when the turn is cancelled."""
        entered.set()
        await asyncio.wait_for(ctx.abort_signal.wait(), timeout=10)
        aborted.set()
        return "stopped early"

    model_calls = 0

    def never(conversation: list[so.Message]) -> so.ModelResponse:
        nonlocal model_calls
        model_calls += 1
        return reply("should not be called")

    agent = scripted_agent("bot", [call_tools(call("crawl")), never], tools=[crawl])
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid = await rt.create_session("bot", auth=ALICE)
        running = asyncio.create_task(rt.generate(session_id=sid, prompt="crawl", auth=ALICE))
        await asyncio.wait_for(entered.wait(), timeout=10)
        c = await rt.cancel(sid, reason="user left")
        assert c.status == "cancelled"
        r = await running
        assert aborted.is_set()
        assert r.status == "cancelled"
        assert model_calls == 0
        tl = timeline(await events(rt, sid))
        assert tl[-2:] == ["turn.cancelled", "session.waiting"]
        assert "tool.completed crawl ok" not in tl


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"question": "  "}, "needs a non-empty question"),
        ({"question": "Pick", "options": [], "allow_text": False}, "must allow free text"),
        ({"question": "Pick", "options": ["a", "a"]}, "option ids must be distinct"),
        ({"question": "Pick", "options": [42]}, "option #1 must be"),
        # a string is not a list of options: it was split into one option per character
        ({"question": "Pick", "options": "yes"}, "options must be a list"),
        ({"question": "Pick", "options": {"yes": "Yes"}}, "options must be a list"),
        # a blank option cannot be picked on the dashboard, and Slack refuses its menu
        ({"question": "Pick", "options": ["", "b"]}, "option #1 has a blank label"),
        ({"question": "Pick", "options": ["a", {"label": "  "}]}, "option #2 has a blank label"),
        (
            {"question": "Pick", "options": [so.Option(id=" ", label="A"), "b"]},
            "option #1 has a blank id",
        ),
    ],
    ids=[
        "blank-question",
        "no-way-to-answer",
        "duplicate-options",
        "bad-option",
        "string-options",
        "mapping-options",
        "blank-label",
        "blank-dict-label",
        "blank-id",
    ],
)
async def test_a_malformed_ask_is_a_tool_error_and_asks_nobody(
    tmp_path: Path, kwargs: dict[str, Any], words: str
) -> None:
    @so.tool
    async def broken(ctx: so.ToolContext) -> str:
        """Asks badly."""
        a = await ctx.ask(**kwargs)
        return a.value

    seen = Capture(reply("Sorry."))
    agent = scripted_agent("bot", [call_tools(call("broken")), seen], tools=[broken])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("bot", prompt="go", auth=ALICE)
        assert r.status == "completed"
        [result] = tool_results(seen.last)
        assert result.is_error is True
        assert result.content["error"].startswith("UsageError: ctx.ask")
        assert words in result.content["error"]
        contents = await store_contents(rt.store, r.session_id)
        assert contents.requests == [] and contents.pending == []


async def test_step_awaits_async_functions_and_journals_json(tmp_path: Path) -> None:
    runs: list[str] = []

    async def fetch(order_id: str, *, full: bool) -> tuple[str, bool]:
        runs.append(order_id)
        return (order_id, full)

    @so.tool
    async def lookup(ctx: so.ToolContext) -> dict[str, Any]:
        """Fetch, then confirm."""
        got = await ctx.step("fetch", fetch, "1042", full=True)
        await ctx.ask("Is this your order?", options=["yes", "no"])
        return {"got": got}

    seen = Capture(reply("ok"))
    agent = scripted_agent("bot", [call_tools(call("lookup")), seen], tools=[lookup])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("bot", prompt="go", auth=ALICE)
        r = await rt.send(r.session_id, "yes", principal=ALICE)
        assert r.status == "completed"
        assert runs == ["1042"]
        # the first run and the replay both see the journaled (JSON) value
        assert tool_results(seen.last)[0].content == {"got": ["1042", True]}


async def test_ask_and_step_need_the_engine() -> None:
    ctx = so.ToolContext(
        session=so.SessionInfo(
            id="s", agent="a", turn="t", auth=so.SessionAuth(current=None, initiator=None)
        ),
        call_id="c",
        tool_name="t",
        idempotency_key="k",
    )
    with pytest.raises(so.UsageError, match="needs a context given by the signoff engine"):
        await ctx.ask("Hello?")
    with pytest.raises(so.UsageError, match="needs a context given by the signoff engine"):
        await ctx.step("x", print)
    assert ctx.idempotency_key() == "k"
    assert ctx.idempotency_key("send") == "k:send"


async def test_abort_signal_is_set_for_steered_calls_and_clear_for_the_next_ones(
    tmp_path: Path,
) -> None:
    seen: list[tuple[str, bool]] = []

    @so.tool
    async def pick(ctx: so.ToolContext) -> str:
        """Choose a plan (options only); notes the abort signal on every run."""
        seen.append(("pick", ctx.abort_signal.is_set()))
        a = await ctx.ask("Which plan?", options=["basic", "pro"], allow_text=False)
        return a.value

    @so.tool
    async def probe(ctx: so.ToolContext) -> bool:
        """Reports whether its abort signal is set."""
        seen.append(("probe", ctx.abort_signal.is_set()))
        return ctx.abort_signal.is_set()

    agent = scripted_agent(
        "bot",
        [call_tools(call("pick")), call_tools(call("probe")), reply("ok")],
        tools=[pick, probe],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("bot", prompt="go", auth=ALICE)
        r = await rt.send(r.session_id, "something else", principal=ALICE)
        assert r.status == "completed"
        # the steered re-run sees it set; the model read the message; the next call starts clear
        assert seen == [("pick", False), ("pick", True), ("probe", False)]


async def test_a_call_proposed_after_a_steer_mid_run_starts_with_a_clear_signal(
    tmp_path: Path,
) -> None:
    entered = asyncio.Event()
    probes: list[bool] = []

    @so.tool
    async def crawl(ctx: so.ToolContext) -> str:
        """A long task that stops when the turn is steered."""
        entered.set()
        await asyncio.wait_for(ctx.abort_signal.wait(), timeout=10)
        return "stopped early"

    @so.tool
    async def probe(ctx: so.ToolContext) -> str:
        """Reports whether its abort signal is set."""
        probes.append(ctx.abort_signal.is_set())
        return "probed"

    agent = scripted_agent(
        "bot",
        [call_tools(call("crawl")), call_tools(call("probe")), reply("done")],
        tools=[crawl, probe],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid = await rt.create_session("bot", auth=ALICE)
        running = asyncio.create_task(rt.generate(session_id=sid, prompt="crawl", auth=ALICE))
        await asyncio.wait_for(entered.wait(), timeout=10)
        await rt.send(sid, "stop, probe instead", principal=ALICE)
        r = await asyncio.wait_for(running, timeout=10)
        assert r.status == "completed"
        assert probes == [False]  # the steer was for crawl, not for what the model did next


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


async def test_a_worker_resumes_a_workflow_call_after_each_answer(tmp_path: Path) -> None:
    """With `inline=False` answers are only recorded; a worker re-runs the body each time."""
    t = Transfer()
    seen = Capture(reply("Sent."))
    agent = scripted_agent(
        "bank", [call_tools(call("transfer", id="c1", amount=200)), seen], tools=[t.tool]
    )
    url = f"sqlite:///{tmp_path / 'state.db'}"
    async with (
        so.Runtime([agent], store=url, inline=False) as front,
        so.Runtime([agent], store=url, inline=False) as worker,
    ):
        stop = asyncio.Event()
        working = asyncio.create_task(worker.work(stop=stop, idle_wait=0.02))

        async def parked_on(question: str | None) -> so.SessionState:
            for _ in range(300):
                state = await front.state(sid)
                pending = state.pending_requests()
                if question is None and state.turn is not None and state.turn.status == "completed":
                    return state
                if question is not None and [p.question for p in pending] == [question]:
                    return state
                await asyncio.sleep(0.02)
            raise AssertionError(f"the worker never got to {question!r}")

        try:
            sid = await front.create_session("bank", auth=ALICE)
            await front.send(sid, "move 200", principal=ALICE)
            state = await parked_on("Fee is 5.0. Proceed?")
            [ask1] = state.pending_requests()
            await front.respond(
                sid, [so.InputResponse(request_id=ask1.id, option_id="yes")], principal=ALICE
            )
            await parked_on("Which account should it come from?")
            await front.send(sid, "savings", principal=ALICE)
            await parked_on(None)
        finally:
            stop.set()
            await asyncio.wait_for(working, timeout=10)
        assert (t.quotes, t.bodies) == (1, 3)
        [result] = tool_results(seen.last)
        assert result.content["proceed"]["value"] == "yes"
        assert result.content["account"]["value"] == "savings"


async def test_the_answer_names_the_responder_without_channel_attributes(tmp_path: Path) -> None:
    """Eve: the answer carries the responder's authenticator, principal id and type, not the
    channel attributes the principal arrived with (those stay in the audited event)."""
    answers: list[so.Answer] = []

    @so.tool
    async def confirm(ctx: so.ToolContext) -> str:
        """Confirm."""
        a = await ctx.ask("Go ahead?", options=["yes", "no"])
        answers.append(a)
        return a.value

    slack_alice = so.Principal(
        authenticator="slack",
        principal_id="U123",
        principal_type="user",
        issuer="T999",
        attributes={"channel": "C42", "thread_ts": "1700000000.1"},
    )
    agent = scripted_agent("bot", [call_tools(call("confirm")), reply("ok")], tools=[confirm])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("bot", prompt="go", auth=slack_alice)
        r = await rt.send(r.session_id, "yes", principal=slack_alice)
        assert r.status == "completed"
        [answer] = answers
        assert answer.responder == so.Principal(
            authenticator="slack", principal_id="U123", principal_type="user", issuer="T999"
        )
        assert answer.responder.attributes == {}
        assert (answer.authenticator, answer.principal_id, answer.principal_type) == (
            "slack",
            "U123",
            "user",
        )
        log = await events(rt, r.session_id)
        resolved = next(e.data for e in log if e.type == "input.resolved")
        assert resolved["by"]["attributes"] == {"channel": "C42", "thread_ts": "1700000000.1"}


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
        "shop", [call_tools(call("reserve", id="r1")), seen, reply("Hello.")], tools=[reserve]
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
    agent = scripted_agent("bank", [call_tools(call("transfer", id="t1")), seen], tools=[transfer])
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
    agent = scripted_agent("shop", [call_tools(call("order", id="o1")), seen], tools=[order])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("shop", prompt="order a shirt", auth=ALICE)
        assert r.status == "waiting"
        r = await rt.send(r.session_id, "red", principal=ALICE)
        assert r.status == "completed"
        [result] = tool_results(seen.last)
        assert result.is_error is False, result.content
        assert result.content == {"reserved": "reserved sku-1", "colour": "red"}
        assert sorted(ran) == ["lookup", "reserve"]  # each ran once, on the first run


class PositionalWriter(SQLiteStore):
    """Stores calls as a signoff before keyed journals did: no `keyed` mark on a call's entries,
    and each step or question's `index` its position in the call's journal."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.positions: dict[str, int] = {}

    def _position(self, call_id: str) -> int:
        at = self.positions.get(call_id, 0)
        self.positions[call_id] = at + 1
        return at

    async def commit(self, commit: Commit) -> None:
        events, requests = [], {r.id: r for r in commit.new_requests}
        for e in commit.events:
            data = dict(e.data)
            if e.type == "tool.step":
                data.pop("keyed", None)
                data["index"] = self._position(data["call_id"])
            elif e.type == "input.requested":
                data.pop("keyed", None)
                asked = []
                for raw in data["requests"]:
                    if raw.get("source") == "ask":
                        raw = {**raw, "index": self._position(raw["action"]["call_id"])}
                        requests[raw["id"]] = so.InputRequest.model_validate(raw)
                    asked.append(raw)
                data["requests"] = asked
            events.append(dataclasses.replace(e, data=data))
        await super().commit(
            dataclasses.replace(
                commit, events=events, new_requests=list(requests.values()), snapshot=None
            )
        )


async def test_a_call_journaled_by_position_replays_by_position(tmp_path: Path) -> None:
    """Entries stored before journals were keyed (by position, no `keyed` mark) still replay:
    the call goes on by position, and what it journals next is positional too."""
    ran: list[str] = []

    def run(what: str, result: str) -> str:
        ran.append(what)
        return result

    @so.tool
    async def transfer(ctx: so.ToolContext) -> dict[str, str]:
        """Quote, confirm, send, ask for a memo."""
        fee = await ctx.step("quote", run, "quote", "2.5%")
        proceed = await ctx.ask(f"Fee is {fee}. Proceed?", options=["yes", "no"])
        sent = await ctx.step("send", run, "send", "sent")
        memo = await ctx.ask("Memo?")
        return {"proceed": proceed.value, "sent": sent, "memo": memo.value}

    seen = Capture(reply("Done."))
    agent = scripted_agent("bank", [call_tools(call("transfer", id="t1")), seen], tools=[transfer])
    url = f"sqlite:///{tmp_path / 'state.db'}"
    async with so.Runtime([agent], store=PositionalWriter(url)) as old:
        r = await old.generate("bank", prompt="pay", auth=ALICE)
        assert [p.question for p in r.pending] == ["Fee is 2.5%. Proceed?"]
    async with so.Runtime([agent], store=url) as rt:
        assert [p.index for p in await rt.pending()] == [1]  # stored by position
        r = await rt.send(r.session_id, "yes", principal=ALICE)
        assert [(p.question, p.index) for p in r.pending] == [("Memo?", 3)]
        r = await rt.send(r.session_id, "rent", principal=ALICE)
        assert r.status == "completed"
        [result] = tool_results(seen.last)
        assert result.content == {"proceed": "yes", "sent": "sent", "memo": "rent"}
        assert ran == ["quote", "send"]
        log = await events(rt, r.session_id)
        assert [e.data["index"] for e in log if e.type == "tool.step"] == [0, 2]


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
    agent = scripted_agent("shop", [call_tools(call("order", id="o1")), seen], tools=[order])
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
    agent = scripted_agent("shop", [call_tools(call("checkout", id="c1")), seen], tools=[checkout])
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


async def test_the_same_step_and_question_twice_replay_each_in_turn(tmp_path: Path) -> None:
    """A step name and a question asked again later in the call are told apart by occurrence:
    each replay returns the right one's result and answer, and no step runs twice."""
    rolls = iter(["4", "6"])
    ran: list[str] = []

    def roll() -> str:
        ran.append("roll")
        return next(rolls)

    @so.tool
    async def dice(ctx: so.ToolContext) -> list[str]:
        """Roll, ask whether to roll again, twice."""
        seen: list[str] = []
        for _ in range(2):
            seen.append(await ctx.step("roll", roll))
            seen.append((await ctx.ask("Again?", options=["yes", "no"])).value)
        return seen

    seen = Capture(reply("Rolled."))
    agent = scripted_agent("game", [call_tools(call("dice", id="d1")), seen], tools=[dice])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("game", prompt="roll", auth=ALICE)
        r = await rt.send(r.session_id, "yes", principal=ALICE)
        assert [p.question for p in r.pending] == ["Again?"]
        r = await rt.send(r.session_id, "no", principal=ALICE)
        assert r.status == "completed"
        assert tool_results(seen.last)[0].content == ["4", "yes", "6", "no"]
        assert ran == ["roll", "roll"]


async def test_a_snapshot_keeps_a_calls_journal_keyed(tmp_path: Path) -> None:
    """A session resumed from a snapshot taken while a call waits on its question still finds
    the call's entries by key (read as positional, they would replay as a different tool)."""

    @so.tool
    async def book(ctx: so.ToolContext) -> list[str]:
        """Hold a table and ask for a time."""
        held = await ctx.step("hold", lambda: "held")
        return [held, (await ctx.ask("What time?")).value]

    agent = scripted_agent("host", [call_tools(call("book", id="b1")), reply("ok")], tools=[book])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("host", prompt="book", auth=ALICE)
        state = await rt.state(r.session_id)
    restored = so.SessionState.from_snapshot(state.to_snapshot())
    assert restored.turn is not None and state.turn is not None
    call_state = restored.turn.calls["b1"]
    assert call_state.keyed is True
    assert call_state.journal == state.turn.calls["b1"].journal
    assert [(e["kind"], e["name"], e["n"]) for e in call_state.journal if e] == [
        ("step", "hold", 0),
        ("ask", "What time?", 0),
    ]


class Declined(Exception):
    """A card payment the bank declined (a step's own failure, caught by the tool)."""


async def test_a_step_that_raises_is_journaled_and_raised_again_on_replay(store_url: str) -> None:
    """A step that raised is not run again on replay: the same exception is raised again, so a
    tool that catches it takes the same path (the card is charged once, not retried)."""
    charges: list[str] = []

    def charge(card: str) -> str:
        charges.append(card)
        raise Declined(f"card {card} declined")

    @so.tool
    async def pay(ctx: so.ToolContext) -> dict[str, str]:
        """Charge the card on file; if declined, ask for another."""
        try:
            return {"paid": await ctx.step("charge", charge, "4242")}
        except Declined as exc:
            other = await ctx.ask(f"{exc}. Try another card?", options=["yes", "no"])
            return {"declined": str(exc), "retry": other.value}

    seen = Capture(reply("Done."))
    agent = scripted_agent("shop", [call_tools(call("pay", id="p1")), seen], tools=[pay])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("shop", prompt="pay", auth=ALICE)
        assert [p.question for p in r.pending] == ["card 4242 declined. Try another card?"]
        r = await rt.send(r.session_id, "no", principal=ALICE)
        assert r.status == "completed"
        [result] = tool_results(seen.last)
        assert result.content == {"declined": "card 4242 declined", "retry": "no"}
        assert charges == ["4242"]  # charged once, though the body ran twice
        [step] = [e for e in await events(rt, r.session_id) if e.type == "tool.step"]
        assert step.data["error"]["type"] == "Declined"
        assert "result" not in step.data


class NeedsTwo(Exception):
    """An exception whose arguments are not what its constructor takes."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"{code}: {detail}")


async def test_a_step_exception_that_cannot_be_rebuilt_replays_as_step_failed(
    tmp_path: Path,
) -> None:
    """An exception signoff cannot build again as it was (its class is local to a function, or
    its args are not what it takes) is raised on replay as `StepFailed`, naming it: never by
    running the step again."""
    ran: list[str] = []

    class Local(Exception):
        pass

    def fail(kind: str) -> str:
        ran.append(kind)
        raise (Local("local failure") if kind == "local" else NeedsTwo(7, "two args"))

    caught: list[tuple[str, str]] = []

    @so.tool
    async def flaky(ctx: so.ToolContext) -> list[str]:
        """Two steps that fail, then a question."""
        for kind in ("local", "two"):
            try:
                await ctx.step(kind, fail, kind)
            except Exception as exc:
                caught.append((type(exc).__name__, str(exc)))
        return [(await ctx.ask("Go on?")).value]

    agent = scripted_agent("ops", [call_tools(call("flaky", id="f1")), reply("ok")], tools=[flaky])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("ops", prompt="go", auth=ALICE)
        r = await rt.send(r.session_id, "yes", principal=ALICE)
        assert r.status == "completed"
    assert ran == ["local", "two"]
    qualname = "test_a_step_exception_that_cannot_be_rebuilt_replays_as_step_failed.<locals>.Local"
    where = "tests.test_workflow"
    assert caught == [
        ("Local", "local failure"),
        ("NeedsTwo", "7: two args"),
        ("StepFailed", f"step 'local' raised {where}.{qualname}: local failure"),
        ("StepFailed", f"step 'two' raised {where}.NeedsTwo: 7: two args"),
    ]


async def test_a_step_failure_is_never_built_from_a_class_not_already_imported(
    tmp_path: Path,
) -> None:
    """The journal names an exception class by module; replay raises it only from a module
    already imported, so a tampered journal cannot make signoff import code."""
    error = {"module": "antigravity", "type": "Exception", "message": "boom", "args": ["boom"]}
    assert "antigravity" not in sys.modules
    with pytest.raises(so.StepFailed, match="antigravity.Exception: boom"):
        raise_recorded("s", error)
    assert "antigravity" not in sys.modules
    with pytest.raises(ValueError, match="^bad$"):
        raise_recorded(
            "s", {"module": "builtins", "type": "ValueError", "message": "bad", "args": ["bad"]}
        )
    with pytest.raises(so.StepFailed, match="step 's' raised SystemExit: 3"):
        raise_recorded(
            "s", {"module": "builtins", "type": "SystemExit", "message": "3", "args": [3]}
        )


async def test_a_step_whose_turn_was_replaced_meanwhile_records_nothing_into_the_new_one(
    store_url: str,
) -> None:
    """While a step's function runs, another process cancels the turn and starts a new one
    (left running: this process holds the lease). The step's record finds its turn replaced:
    nothing of it lands in the new turn, a body that catches that runs no further step, and
    the new turn runs normally."""
    charged: list[str] = []
    sent: list[str] = []
    caught: list[str] = []
    new_turn: list[str] = []
    sid = ""

    @so.tool
    async def checkout(ctx: so.ToolContext) -> str:
        """Charge, then send the receipt."""

        async def charge() -> str:
            new_turn.append(await replace_turn(other, sid))
            charged.append("card")
            return "charged"

        try:
            await ctx.step("charge", charge)
        except Exception as exc:  # a body that catches too much goes on
            caught.append(type(exc).__name__)
        await ctx.step("receipt", sent.append, "receipt")
        return "done"

    def agent() -> so.Agent:
        script = [call_tools(call("checkout", id="c1")), reply("Tried again.")]
        return scripted_agent("shop", script, tools=[checkout])

    async with (
        so.Runtime([agent()], store=store_url) as rt,
        so.Runtime([agent()], store=store_url, lease_wait=0) as other,
    ):
        sid = await rt.create_session("shop", auth=ALICE)
        first = await rt.generate(session_id=sid, prompt="Check out", auth=ALICE)
        # This process drove the new turn once its own stopped: it is the session's turn now.
        assert (first.status, first.turn_id, first.text) == ("completed", *new_turn, "Tried again.")
        assert (charged, caught, sent) == (["card"], ["TurnStopped"], [])
        await assert_only_the_new_turn(rt, sid, new_turn[0])
        assert "tool.step checkout:charge" not in timeline(await events(rt, sid))


async def test_a_body_that_goes_on_after_its_turn_was_cancelled_runs_no_further_step(
    store_url: str,
) -> None:
    """Another process cancels the turn while a step's function runs; the body catches what its
    step raises and goes on to the next step. That step's function never runs: its effect could
    not be recorded on a cancelled turn, and would be run again by nobody."""
    sent: list[str] = []
    caught: list[str] = []
    sid = ""

    @so.tool
    async def checkout(ctx: so.ToolContext) -> str:
        """Charge, then send the receipt."""

        async def charge() -> str:
            assert (await other.cancel(sid, "changed my mind")).status == "cancelled"
            return "charged"

        try:
            await ctx.step("charge", charge)
        except Exception as exc:  # a body that catches too much goes on
            caught.append(type(exc).__name__)
        await ctx.step("receipt", sent.append, "receipt")
        return "done"

    agent = scripted_agent("shop", [call_tools(call("checkout", id="c1"))], tools=[checkout])
    async with (
        so.Runtime([agent], store=store_url) as rt,
        so.Runtime([agent], store=store_url, lease_wait=0) as other,
    ):
        sid = await rt.create_session("shop", auth=ALICE)
        first = await rt.generate(session_id=sid, prompt="Check out", auth=ALICE)
        assert first.status == "cancelled"
        assert (caught, sent) == (["TurnStopped"], [])
        log = timeline(await events(rt, sid))
        assert log[-2:] == ["turn.cancelled", "session.waiting"], log
        assert await rt.verify_audit(sid) == []
