"""Questions over their bounds: `ctx.ask()`'s question and options are part of its tool's output
(`max_result_bytes`, at most `MAX_OPTIONS` options) and the model's `ask_question` text has a
length of its own; over them nothing is stored, as every pending request is listed for all."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff._types import MAX_OPTIONS
from signoff.cli._app import NoModel
from signoff.testing import (
    Capture,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    tool_results,
)

from ._seeds import ALICE

BIG = "x" * 2_000_000  # over the default max_result_bytes of 1 MiB


def _asking(**ask: Any) -> so.Tool:
    @so.tool(name="pick")
    async def pick(ctx: so.ToolContext, q: str) -> str:
        """Ask which."""
        return str((await ctx.ask(**ask)).value)

    return pick


@pytest.mark.parametrize(
    "ask",
    [
        {"question": BIG},
        {"question": "Which?", "options": [{"label": "a", "description": BIG}, "b"]},
        {"question": "Which?", "options": ["x" * 1200 + str(i) for i in range(900)]},
    ],
    ids=["question", "description", "many-labels"],
)
async def test_a_question_over_its_tools_result_bound_is_a_tool_error_not_stored(
    store_url: str, ask: dict[str, Any]
) -> None:
    """A question of megabytes was stored, listed by `rt.pending()`, the API, the dashboard and
    Slack for everyone: over the tool's `max_result_bytes` `ctx.ask()` raises `TooLarge`,
    which uncaught is a tool error the model reads, and nothing is asked."""
    seen = Capture(reply("asking less"))
    agent = scripted_agent("a", [call_tools(call("pick", q="go")), seen], tools=[_asking(**ask)])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        assert (r.status, r.pending) == ("completed", [])
        events = [e async for e in rt.events(r.session_id, follow=False)]
        assert await rt.pending() == []
    (result,) = tool_results(seen.last)
    assert result.is_error
    assert "TooLarge" in result.content["error"]
    assert "over the limit of 1048576 bytes (max_result_bytes of pick)" in result.content["error"]
    assert "input.requested" not in [e.type for e in events]
    assert max(len(json.dumps(e.data)) for e in events) < 10_000


async def test_a_tool_may_catch_too_large_and_ask_less(store_url: str) -> None:
    """The bound is the tool's own `max_result_bytes`; `TooLarge` is the tool's to catch."""
    caught: list[str] = []

    @so.tool(max_result_bytes=500)
    async def pick(ctx: so.ToolContext, q: str) -> str:
        """Ask which."""
        try:
            await ctx.ask("Which? " + "context " * 100, options=["yes", "no"])
        except so.TooLarge as exc:
            caught.append(str(exc))
        return str((await ctx.ask("Which?", options=["yes", "no"])).value)

    seen = Capture(reply("done"))
    agent = scripted_agent("a", [call_tools(call("pick", q="go")), seen], tools=[pick])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        (asked,) = r.pending
        assert asked.question == "Which?"
        answer = so.InputResponse(request_id=asked.id, option_id="yes")
        r = await rt.respond(r.session_id, [answer], principal=ALICE)
        assert r.status == "completed"
    assert len(caught) == 2  # on the first run and on the replay after the answer
    assert "over the limit of 500 bytes (max_result_bytes of pick)" in caught[0]
    (result,) = tool_results(seen.last)
    assert result.content == "yes"


async def test_more_options_than_max_options_is_too_large(tmp_path: Path) -> None:
    """No person picks among thousands (Slack shows at most 10,000, the dashboard a button
    each): over `MAX_OPTIONS` options, however short, nothing is asked."""
    assert MAX_OPTIONS == 1000
    seen = Capture(reply("fewer"))
    many = _asking(question="Which?", options=[str(i) for i in range(MAX_OPTIONS + 1)])
    most = _asking(question="Which?", options=[str(i) for i in range(MAX_OPTIONS)])
    most.name = "most"
    script: list[Any] = [call_tools(call("pick", q="go")), seen, call_tools(call("most", q="go"))]
    agent = scripted_agent("a", script, tools=[many, most])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        assert (r.status, r.pending) == ("completed", [])
        (result,) = tool_results(seen.last)
        assert result.is_error
        assert (
            f"{MAX_OPTIONS + 1} options, over the limit of {MAX_OPTIONS}"
            in (result.content["error"])
        )
        r = await rt.generate(session_id=r.session_id, prompt="again", auth=ALICE)
        (asked,) = r.pending
        assert len(asked.options) == MAX_OPTIONS


async def test_the_models_question_over_its_length_is_invalid_input(tmp_path: Path) -> None:
    """`ask_question`'s options were bounded (two or three, short labels and descriptions), its
    question was not: a model could open a request of a megabyte. Over 2,000 characters it is
    the model's invalid input, which it reads and can ask again from."""
    seen = Capture(reply("shorter"))
    long = call_tools(call("ask_question", question="Which? " + "x" * 1994))
    at_most = call_tools(call("ask_question", question="Which? " + "x" * 1993))
    agent = scripted_agent("bot", [long, seen, at_most], tools=[so.ask_question()])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("bot", prompt="hi", auth=ALICE)
        assert (r.status, r.pending) == ("completed", [])
        (result,) = tool_results(seen.last)
        assert result.is_error and result.content["error"] == "invalid input"
        assert "2000 characters" in str(result.content["details"])
        types = [e.type async for e in rt.events(r.session_id, follow=False)]
        assert "input.requested" not in types
        r = await rt.generate(session_id=r.session_id, prompt="again", auth=ALICE)
        (asked,) = r.pending
        assert len(asked.question or "") == 2000


async def test_an_answer_ask_question_could_not_return_is_refused(store_url: str) -> None:
    """`ask_question`'s result holds the answer whole, under the tool's `max_result_bytes`: an
    answer of 2,000,000 characters was taken (`answered`, applied) and the model read only the
    error "the result is 2000033 bytes, over the limit of 1048576 bytes ... return less", the
    answer lost. Refused now as an answer too large for it (`InvalidAnswer`), by id and by
    message, nothing recorded and the question still open; one that fits is answered."""
    seen = Capture(reply("ok"))
    ask = call_tools(call("ask_question", question="Paste the log?"))
    agent = scripted_agent("bot", [ask, seen], tools=[so.ask_question()])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("bot", prompt="go", auth=ALICE)
        (req,) = r.pending
        head = await rt.store.head(r.session_id)
        huge = "L" * 2_000_000
        with pytest.raises(so.InvalidAnswer, match="over the limit of 1048576 bytes"):
            await rt.respond(
                r.session_id, [so.InputResponse(request_id=req.id, text=huge)], principal=ALICE
            )
        with pytest.raises(so.InvalidAnswer, match="over the limit of 1048576 bytes"):
            await rt.send(r.session_id, huge, principal=ALICE)
        assert await rt.store.head(r.session_id) == head
        assert [q.id for q in await rt.pending(session_id=r.session_id)] == [req.id]
        fits = "L" * 1_000_000
        done = await rt.respond(
            r.session_id, [so.InputResponse(request_id=req.id, text=fits)], principal=ALICE
        )
        assert done.status == "completed"
    (result,) = tool_results(seen.last)
    assert not result.is_error and result.content["answer"] == fits


async def test_an_answer_over_a_custom_asks_result_bound_is_refused(store_url: str) -> None:
    """A free-text answer to a tool's own `ctx.ask()` that returns it whole: an answer of
    2,000,000 characters under the default 1 MiB was taken, and the model read only the tool
    error "... over the limit of 1048576 bytes (max_result_bytes); return less", the answer
    lost. An answer is bounded by its tool's `max_result_bytes` as the question is: refused
    (`InvalidAnswer`), by id and by message, nothing recorded, the question still open."""

    @so.tool(name="paste", max_result_bytes=100_000)
    async def paste(ctx: so.ToolContext) -> str:
        """Ask for the log."""
        return str((await ctx.ask("Paste the log?")).value)

    seen = Capture(reply("ok"))
    agent = scripted_agent("bot", [call_tools(call("paste")), seen], tools=[paste])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("bot", prompt="go", auth=ALICE)
        (req,) = r.pending
        head = await rt.store.head(r.session_id)
        over = "L" * 100_000  # 100,002 bytes as JSON
        with pytest.raises(so.InvalidAnswer, match="over the limit of 100000 bytes") as caught:
            await rt.respond(
                r.session_id, [so.InputResponse(request_id=req.id, text=over)], principal=ALICE
            )
        assert caught.value.request_ids == [req.id]
        with pytest.raises(so.InvalidAnswer, match="over the limit of 100000 bytes"):
            await rt.send(r.session_id, over, principal=ALICE)
        assert await rt.store.head(r.session_id) == head
        assert [q.id for q in await rt.pending(session_id=r.session_id)] == [req.id]
        fits = "L" * 99_998
        done = await rt.respond(
            r.session_id, [so.InputResponse(request_id=req.id, text=fits)], principal=ALICE
        )
        assert done.status == "completed"
    (result,) = tool_results(seen.last)
    assert not result.is_error and result.content == fits


def _record_only(name: str, store_url: str) -> so.Runtime:
    """A runtime without the asking tool, as `signoff answer REQ --store URL` settles through:
    its agent stands in for the real one (`NoModel`), whose tools it does not know, so an
    answer is not refused as asked by a tool a deploy removed."""
    return so.Runtime([so.Agent(name=name, model=NoModel(name))], store=store_url)


@so.tool(max_result_bytes=500)
async def asker(ctx: so.ToolContext) -> str:
    """Ask a name."""
    return str((await ctx.ask("Your name?", allow_text=True)).value)


@pytest.mark.parametrize(
    ("tools", "limits", "fits"),
    [([asker], None, 498), ([so.ask_question()], so.Limits(max_result_bytes=500), 467)],
    ids=["ctx.ask", "ask_question"],
)
async def test_an_answer_over_the_askers_bound_is_refused_without_the_tool(
    store_url: str, tools: list[so.Tool], limits: so.Limits | None, fits: int
) -> None:
    """A runtime without the asking tool (`signoff answer` without MODULE:RUNTIME, as
    Scale-out advises) took an answer over the tool's `max_result_bytes`, and the resumed call
    ended in the error "the result is ... over the limit of 500 bytes", the answer lost. The
    bound is recorded on the question as it is asked: refused there too, by id and by message,
    nothing recorded and the question still open; one that fits (as `ask_question` returns it,
    whole, for its question) is answered and reaches the model."""
    ask = call("asker") if tools[0] is asker else call("ask_question", question="Your name?")
    seen = Capture(reply("ok"))
    agent = scripted_agent("bot", [call_tools(ask), seen], tools=tools, limits=limits)
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("bot", prompt="go", auth=ALICE)
        (req,) = r.pending
        head = await rt.store.head(r.session_id)
        over = "N" * (fits + 1)
        async with _record_only("bot", store_url) as settler:
            with pytest.raises(so.InvalidAnswer, match="over the limit of 500 bytes") as caught:
                answer = so.InputResponse(request_id=req.id, text=over)
                await settler.respond(r.session_id, [answer], principal=ALICE, resume=False)
            assert caught.value.request_ids == [req.id]
            with pytest.raises(so.InvalidAnswer, match="over the limit of 500 bytes"):
                await settler.send(r.session_id, over, principal=ALICE)
            assert await settler.store.head(r.session_id) == head
            assert [q.id for q in await settler.pending(session_id=r.session_id)] == [req.id]
            answer = so.InputResponse(request_id=req.id, text="N" * fits)
            await settler.respond(r.session_id, [answer], principal=ALICE, resume=False)
        done = await rt.generate(session_id=r.session_id, auth=ALICE)
        assert done.status == "completed", done.error
    (result,) = tool_results(seen.last)
    assert not result.is_error, result.content
    assert "N" * fits in str(result.content)


async def test_a_value_over_the_tools_bound_is_refused_without_the_tool(store_url: str) -> None:
    """The decision on a tool's own approval is its call's result, value and all: a runtime
    without the tool bounded the value by its own agent's 1 MiB instead of the tool's
    `max_result_bytes`. The tool's bound is recorded on the request: refused there too."""

    @so.tool(max_result_bytes=500)
    def gate(ctx: so.ToolContext) -> str:
        """Gate."""
        ctx.request_approval({"what": "go"})
        return "unreached"

    agent = scripted_agent("bot", [call_tools(call("gate")), reply("ok")], tools=[gate])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("bot", prompt="go", auth=ALICE)
        (req,) = r.pending
        async with _record_only("bot", store_url) as settler:
            over = so.InputResponse(request_id=req.id, option_id="approve", value="v" * 600)
            with pytest.raises(so.InvalidAnswer, match=r"over the limit of 500 bytes \(max_"):
                await settler.respond(r.session_id, [over], principal=ALICE, resume=False)
            assert [q.id for q in await settler.pending(session_id=r.session_id)] == [req.id]


@so.tool
async def default_asker(ctx: so.ToolContext) -> str:
    """Ask a name, under the default bound."""
    return str((await ctx.ask("Your name?", allow_text=True)).value)


@pytest.mark.parametrize("tool", [default_asker, so.ask_question()], ids=["ctx.ask", "ask"])
async def test_a_question_under_the_default_bound_records_none(
    tmp_path: Path, tool: so.Tool
) -> None:
    """Every runtime applies the default bound: recording it on each question only made every
    question unreadable to an older signoff beside this one (its requests forbid unknown
    fields)."""
    ask = call("default_asker") if tool is default_asker else call("ask_question", question="?")
    agent = scripted_agent("bot", [call_tools(ask), reply("ok")], tools=[tool])
    async with sqlite_runtime(tmp_path, agent) as rt:
        (req,) = (await rt.generate("bot", prompt="go")).pending
        assert (req.max_result_bytes, req.echoes_answer) == (None, False)
        assert "max_result_bytes" not in json.dumps(req.model_dump(exclude_defaults=True))


@pytest.mark.parametrize("tool", [default_asker, so.ask_question()], ids=["ctx.ask", "ask"])
async def test_an_answer_over_the_default_bound_is_refused_without_the_tool(
    store_url: str, tool: so.Tool
) -> None:
    """The default bound is recorded on no question, and a runtime without the tool checked a
    free-text answer only against a recorded one: an answer over 1 MiB was taken, the resumed
    call failed with "over the limit" and the answer was lost. It is checked against the
    default, as `ask_question` returns it (the stricter, as the question does not say)."""
    ask = call("default_asker") if tool is default_asker else call("ask_question", question="?")
    agent = scripted_agent("bot", [call_tools(ask), reply("ok")], tools=[tool])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("bot", prompt="go", auth=ALICE)
        (req,) = r.pending
        head = await rt.store.head(r.session_id)
        async with _record_only("bot", store_url) as settler:
            over = so.InputResponse(request_id=req.id, text="N" * ((1 << 20) - 10))
            with pytest.raises(so.InvalidAnswer, match="over the limit of 1048576 bytes"):
                await settler.respond(r.session_id, [over], principal=ALICE, resume=False)
            assert await settler.store.head(r.session_id) == head
            fits = so.InputResponse(request_id=req.id, text="N" * 1000)
            await settler.respond(r.session_id, [fits], principal=ALICE, resume=False)
        assert (await rt.generate(session_id=r.session_id, auth=ALICE)).status == "completed"
