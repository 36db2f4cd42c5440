"""Workflow tools' `ctx.ask()`: asks replayed in order, malformed asks, answers that resume the
call in a worker and name who answered."""

from __future__ import annotations

import asyncio
import gc
import logging
from pathlib import Path
from typing import Any

import pytest

import signoff as so
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

from .test_workflow import ALICE, Transfer, events


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
        ({"question": "Pick", "options": 2}, "options must be a list"),  # was a TypeError
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
        "number-options",
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


async def test_a_worker_resumes_a_workflow_call_after_each_answer(tmp_path: Path) -> None:
    """With `inline=False` answers are only recorded; a worker re-runs the body each time."""
    t = Transfer()
    seen = Capture(reply("Sent."))
    agent = scripted_agent(
        "bank", [call_tools(call("transfer", call_id="c1", amount=200)), seen], tools=[t.tool]
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


async def test_a_task_group_branch_is_cancelled_as_its_body_parks_and_nothing_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A `TaskGroup` branch waiting on its question woke as the body parked, before the body's
    cancel reached it, and was told its question was withdrawn (with no request id) while it
    stayed open; the body then ended with that group, and asyncio logged it at ERROR as a task
    exception never retrieved. The branch is cancelled with the body, and nothing is logged."""
    caught: list[BaseException] = []

    @so.tool
    async def review(ctx: so.ToolContext, doc: str) -> str:
        """Ask whether to publish, from a branch."""

        async def confirm() -> str:
            try:
                return (await ctx.ask(f"Publish {doc}?", ["yes", "no"], allow_text=False)).value
            except BaseException as exc:
                caught.append(exc)
                raise

        async with asyncio.TaskGroup() as tg:
            answer = tg.create_task(confirm())
        return answer.result()

    seen = Capture(reply("Done."))
    agent = scripted_agent("docs", [call_tools(call("review", doc="faq")), seen], tools=[review])
    gc.collect()  # an earlier test's task, logged as it is collected, is not this one's
    caplog.clear()
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("docs", prompt="review", auth=ALICE)
        assert [(p.question, p.status) for p in r.pending] == [("Publish faq?", "pending")]
        gc.collect()  # a task whose exception nobody retrieved is logged as it is collected
        logged = [
            r.getMessage()
            for r in caplog.records
            if r.name == "asyncio" and r.levelno >= logging.ERROR
        ]
        assert ([type(exc) for exc in caught], logged) == ([asyncio.CancelledError], [])
        r = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=r.pending[0].id, option_id="yes")],
            principal=ALICE,
        )
        assert (r.status, r.text) == ("completed", "Done.")
    assert tool_results(seen.last)[0].content == "yes"


@pytest.mark.parametrize("depth", [1, 6])
async def test_a_task_group_branch_parked_is_cancelled_once_and_its_cleanup_runs(
    tmp_path: Path, depth: int
) -> None:
    """A branch waiting on its question as the body parks is cancelled as asyncio cancels a
    `TaskGroup`'s tasks: once, by its group, so its own async cleanup runs to its end, also
    under groups nested `depth` deep (each a loop turn later). It was thrown a cancel of its
    own first, and the group's came in the middle of that cleanup."""
    trace: list[str] = []

    @so.tool
    async def review(ctx: so.ToolContext, doc: str) -> str:
        """Ask whether to publish, from a branch that releases a lock as it ends."""

        async def confirm() -> str:
            try:
                return (await ctx.ask(f"Publish {doc}?", ["yes", "no"], allow_text=False)).value
            except asyncio.CancelledError:
                task = asyncio.current_task()
                trace.append(f"cancelled {task.cancelling() if task else None}")
                raise
            finally:
                try:
                    await asyncio.sleep(0.01)  # the lock's release
                    trace.append("released")
                except asyncio.CancelledError:
                    trace.append("release cut short")
                    raise

        async def nested(level: int) -> str:
            async with asyncio.TaskGroup() as tg:
                answer = tg.create_task(confirm() if level == 1 else nested(level - 1))
            return answer.result()

        return await nested(depth)

    seen = Capture(reply("Done."))
    agent = scripted_agent("docs", [call_tools(call("review", doc="faq")), seen], tools=[review])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("docs", prompt="review", auth=ALICE)
        assert [(p.question, p.status) for p in r.pending] == [("Publish faq?", "pending")]
        assert trace == ["cancelled 1", "released"]
        r = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=r.pending[0].id, option_id="yes")],
            principal=ALICE,
        )
        assert (r.status, r.text) == ("completed", "Done.")
    assert tool_results(seen.last)[0].content == "yes"
