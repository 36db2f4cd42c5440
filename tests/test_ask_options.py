"""`ctx.ask()`'s options: ones a person cannot tell apart or see are refused when asked, and a
question replayed with other options than it was answered with is a `ReplayError`."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import signoff as so
from signoff._types import _slug, make_options
from signoff.testing import (
    Capture,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    store_contents,
    tool_results,
)

from ._seeds import ALICE


async def _asked(tmp_path: Path, question: str, options: list[Any]) -> tuple[Any, Any, Any]:
    """Run a tool that asks `question` with `options`: the turn's result, what the model read
    of the call (None while it waits) and what the store holds of the session."""

    @so.tool
    async def pick(ctx: so.ToolContext) -> str:
        """Ask which."""
        return (await ctx.ask(question, options=options)).value

    seen = Capture(reply("Sorry."))
    agent = scripted_agent("bot", [call_tools(call("pick")), seen], tools=[pick])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("bot", prompt="go", auth=ALICE)
        contents = await store_contents(rt.store, r.session_id)
        return r, tool_results(seen.last) if r.status == "completed" else None, contents


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (["Yes", "yes"], "option labels must be distinct"),  # as a person types it
        (["Caf\u00e9", "Cafe\u0301"], "option labels must be distinct"),  # two buttons: Café
        (["ＲＥＤ", "red"], "option labels must be distinct"),  # full-width and not
        (
            [so.Option(id="r1", label="Red "), so.Option(id="r2", label=" red")],
            "option labels must be distinct",
        ),
    ],
    ids=["case", "combining-mark", "full-width", "spaces"],
)
async def test_options_a_person_cannot_tell_apart_are_refused_and_nothing_is_asked(
    tmp_path: Path, options: list[Any], words: str
) -> None:
    """Two options that read the same once compared as a reply is (case, width, accents
    composed or not, spaces) showed as two equal buttons, and a typed reply naming one was
    refused as naming both. `ask_question` refused these from the model; `ctx.ask` asked
    them: now a UsageError, the tool's error, and no request stored."""
    r, results, stored = await _asked(tmp_path, "Which?", options)
    assert r.status == "completed" and r.pending == []
    assert stored.requests == [] and stored.pending == []
    (result,) = results
    assert result.is_error is True
    assert result.content["error"].startswith("UsageError: ctx.ask(): ")
    assert words in result.content["error"]


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (["#2", "1", "b"], "option #1's label '#2' is how a person names option #2"),
        (["0", "1", "＃２"], "option #3's label '＃２' is how a person names option #2"),
        (
            [so.Option(id="z", label="zero"), so.Option(id="#1", label="one"), "1"],
            "option #2's id '#1' is how a person names option #1",
        ),
    ],
    ids=["label", "full-width", "id"],
)
async def test_a_label_that_is_another_options_hash_number_is_refused(
    tmp_path: Path, options: list[Any], words: str
) -> None:
    """Where a label is another option's number (`1` on the second), a person is told to reply
    `#` and a number (`#2` for the second): a label `#2` on the first took that reply, so the
    second option answered to no reply at all. Asked so, it is refused, and nothing is asked."""
    r, results, stored = await _asked(tmp_path, "Which?", options)
    assert r.status == "completed" and r.pending == []
    assert stored.requests == [] and stored.pending == []
    (result,) = results
    assert result.is_error is True
    assert result.content["error"].startswith("UsageError: ctx.ask(): ")
    assert words in result.content["error"]


async def test_a_hash_number_label_where_numbers_do_not_clash_is_that_label(
    store_url: str,
) -> None:
    """With no label another's number, `#` and a number is no reply of its own: a label `#2`
    is asked, and `#2` typed chooses it (an exact label wins), on either store."""

    @so.tool
    async def pick(ctx: so.ToolContext) -> str:
        """Ask which."""
        return (await ctx.ask("Which?", options=["#2", "a", "b"])).value

    seen = Capture(reply("ok"))
    agent = scripted_agent("bot", [call_tools(call("pick")), seen], tools=[pick])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("bot", prompt="go", auth=ALICE)
        assert r.status == "waiting"
        done = await rt.send(r.session_id, "#2", principal=ALICE)
        assert done.status == "completed"
        (result,) = tool_results(seen.last)
        assert result.is_error is False and result.content == "#2"


@pytest.mark.parametrize(
    ("question", "options", "words"),
    [
        ("Which?", ["\u200b", "b"], "option #1 has a blank label"),
        ("Which?", ["a", {"label": "\u2060\u00ad "}], "option #2 has a blank label"),
        ("Which?", [so.Option(id="\ufeff", label="A"), "b"], "option #1 has a blank id"),
        ("\u200b\u200d", ["a", "b"], "needs a non-empty question"),
    ],
    ids=["zero-width-label", "invisible-label", "invisible-id", "invisible-question"],
)
async def test_an_invisible_option_or_question_is_refused_as_a_blank_one(
    tmp_path: Path, question: str, options: list[Any], words: str
) -> None:
    """Only a label of spaces was blank: one of zero-width or other invisible characters showed
    an empty button on the dashboard and in Slack, as a question of them showed nothing to
    answer. They say nothing, as `is_blank` has it for every reply and message."""
    r, results, stored = await _asked(tmp_path, question, options)
    assert r.status == "completed" and r.pending == []
    assert stored.requests == [] and stored.pending == []
    (result,) = results
    assert result.is_error is True
    assert result.content["error"].startswith("UsageError: ctx.ask")
    assert words in result.content["error"]


@pytest.mark.parametrize(
    ("question", "options", "words"),
    [
        ("Ship to Jos\udce9?", ["yes", "no"], "the question is not valid Unicode text"),
        (
            "Which?",
            [{"label": "Fast", "description": "by air \ud800"}, "Slow"],
            "option #1's description is not valid Unicode text",
        ),
        (
            "Which?",
            ["Fast", so.Option(id="slow", label="Slow", description="\udfff")],
            "option #2's description is not valid Unicode text",
        ),
    ],
    ids=["question", "dict-description", "option-description"],
)
async def test_a_question_or_description_that_is_not_valid_unicode_is_refused(
    tmp_path: Path, question: str, options: list[Any], words: str
) -> None:
    """A lone surrogate (a name read with `errors="surrogateescape"`) was refused in a label or
    id but asked in a question or an option's description, which no UTF-8 transport can send:
    a text channel failed to show it on every retry, and every request after it waited."""
    r, results, stored = await _asked(tmp_path, question, options)
    assert r.status == "completed" and r.pending == []
    assert stored.requests == [] and stored.pending == []
    (result,) = results
    assert result.is_error is True
    assert result.content["error"] == f"UsageError: ctx.ask(): {words}"


@pytest.mark.parametrize(
    "options",
    [
        ["1", "2"],  # each its own number
        ["5", "10", "1"],  # "1" names two, but "3" the third alone
        [so.Option(id="a", label="Apple"), so.Option(id="A", label="Avocado")],
    ],
)
async def test_options_each_named_alone_by_some_reply_are_asked(
    tmp_path: Path, options: list[Any]
) -> None:
    r, _, _ = await _asked(tmp_path, "Which?", options)
    assert r.status == "waiting"
    (request,) = r.pending
    assert len(request.options) == len(options)


@pytest.mark.parametrize(
    ("replayed", "allow_text"),
    [(["basic", "enterprise"], False), (["basic", "pro"], True)],
    ids=["other-option", "no-longer-free-text"],
)
async def test_a_question_replayed_with_other_options_is_a_replay_error(
    store_url: str, replayed: list[str], allow_text: bool
) -> None:
    """The person chose among the options the question was asked with: replayed with others
    (or no longer taking free text), the body would read an answer to a question nobody was asked
    (`pro`, no longer offered). It is a ReplayError, as a question asked in other words is,
    on either store."""
    runs: list[int] = []

    @so.tool
    async def plan(ctx: so.ToolContext) -> str:
        """Ask which plan."""
        first = not runs
        runs.append(1)
        options = ["basic", "pro"] if first else replayed
        answer = await ctx.ask("Which plan?", options=options, allow_text=first and allow_text)
        return f"{answer.value} ({answer.option_id})"

    seen = Capture(reply("ok"))
    agent = scripted_agent("bot", [call_tools(call("plan")), seen], tools=[plan])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("bot", prompt="go", auth=ALICE)
        (request,) = r.pending
        done = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=request.id, option_id="pro")],
            principal=ALICE,
        )
        assert done.status == "completed" and len(runs) == 2
        (result,) = tool_results(seen.last)
        assert result.is_error is True
        assert result.content["error"].startswith("ReplayError: ")
        assert "'Which plan?'" in result.content["error"]


async def test_a_question_replayed_as_asked_returns_its_answer(store_url: str) -> None:
    """The control: the same question and options replay the answer, rebuilt as dicts and in
    another order (options built from a set come in another order in another process)."""
    runs: list[int] = []

    @so.tool
    async def plan(ctx: so.ToolContext) -> str:
        """Ask which plan."""
        runs.append(1)
        options: list[Any] = ["basic", "pro"]
        if len(runs) > 1:
            options = [so.Option(id="pro", label="pro"), {"id": "basic", "label": "basic"}]
        answer = await ctx.ask("Which plan?", options=options)
        return f"{answer.value} ({answer.option_id})"

    seen = Capture(reply("ok"))
    agent = scripted_agent("bot", [call_tools(call("plan")), seen], tools=[plan])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("bot", prompt="go", auth=ALICE)
        (request,) = r.pending
        done = await rt.send(r.session_id, "PRO", principal=ALICE)
        assert done.status == "completed" and len(runs) == 2
        (result,) = tool_results(seen.last)
        assert result.is_error is False and result.content == "pro (pro)"


@pytest.mark.parametrize("allow_text", [None, "no", "yes", 0, 1, 2.0])
@pytest.mark.parametrize("options", [[], ["a", "b"]], ids=["no-options", "options"])
async def test_allow_text_that_is_not_a_bool_is_a_usage_error_and_nothing_is_asked(
    tmp_path: Path, allow_text: Any, options: list[str]
) -> None:
    """`allow_text="no"` passed the check that a question without options takes free text
    (the string is true) and was stored as False (pydantic reads "no" so): a question nobody
    could answer, parked until steered. Others failed with pydantic's ValidationError, and a
    "yes" stored True replayed as other than it was asked. All are now a UsageError naming it."""

    @so.tool
    async def pick(ctx: so.ToolContext) -> str:
        """Ask which."""
        return (await ctx.ask("Which?", options=options, allow_text=allow_text)).value

    seen = Capture(reply("Sorry."))
    agent = scripted_agent("bot", [call_tools(call("pick")), seen], tools=[pick])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("bot", prompt="go", auth=ALICE)
        assert r.status == "completed" and r.pending == []
        stored = await store_contents(rt.store, r.session_id)
        assert stored.requests == [] and stored.pending == []
        (result,) = tool_results(seen.last)
        assert result.is_error is True
        assert result.content["error"].startswith("UsageError: ctx.ask(): allow_text must be")


async def test_an_option_id_given_as_a_number_is_that_number(tmp_path: Path) -> None:
    """`{"id": 0}` was asked as the option "zero", a slug of its label, because 0 read as no id;
    `{"id": 1}` stayed "1". A number is its own decimal text, so "0" answers it."""

    @so.tool
    async def pick(ctx: so.ToolContext) -> str:
        """Ask which."""
        options = [{"id": 0, "label": "Zero"}, {"id": 1, "label": "One"}]
        return (await ctx.ask("Which?", options=options)).option_id or ""

    seen = Capture(reply("Noted."))
    agent = scripted_agent("bot", [call_tools(call("pick")), seen], tools=[pick])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("bot", prompt="go", auth=ALICE)
        (asked,) = r.pending
        assert [(o.id, o.label) for o in asked.options] == [("0", "Zero"), ("1", "One")]
        answer = so.InputResponse(request_id=asked.id, option_id="0")
        done = await rt.respond(r.session_id, [answer], principal=ALICE)
        assert done.status == "completed"
        assert [c.content for c in tool_results(seen.last)] == ["0"]


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ("", "option #1 has a blank id"),
        (["x"], "option #1's id must be text, not list"),
        (True, "option #1's id must be text, not bool"),
        (1.5, "option #1's id must be text, not float"),
    ],
    ids=["empty", "list", "bool", "float"],
)
async def test_an_option_id_that_is_blank_or_not_text_is_refused(
    tmp_path: Path, given: Any, words: str
) -> None:
    """An empty id was replaced by a slug of the label, and any other value by its `str()`
    (`"['x']"`): an id the caller never gave. Both are refused, and nothing is asked."""
    r, results, stored = await _asked(tmp_path, "Which?", [{"id": given, "label": "A"}, "B"])
    assert r.status == "completed" and r.pending == []
    assert stored.requests == [] and stored.pending == []
    (result,) = results
    assert result.is_error is True
    assert result.content["error"] == f"UsageError: ctx.ask(): {words}"


@pytest.mark.parametrize(
    ("options", "first"),
    [
        ([{"id": 0, "label": "None"}, {"id": 1, "label": "One"}], ("none", "None")),
        ([{"id": "", "label": "Yes"}, {"id": "no", "label": "No"}], ("yes", "Yes")),
    ],
    ids=["id-0", "empty-id"],
)
async def test_a_question_an_older_signoff_asked_replays_with_its_option_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: list[Any], first: tuple[str, str]
) -> None:
    """An older signoff made `{"id": 0}` and `{"id": ""}` options of the label ("none",
    "yes"); ids are checked now, so a question it parked replayed with other options
    (`ReplayError`) or was refused (`UsageError`) once answered after the upgrade. It replays
    as it was asked."""
    from signoff import _tool_context, _types

    @so.tool
    async def pick(ctx: so.ToolContext) -> str:
        """Ask how many."""
        return (await ctx.ask("How many?", options=options)).option_id or ""

    seen = Capture(reply("Noted."))
    agent = scripted_agent("bot", [call_tools(call("pick")), seen], tools=[pick])
    older = partial(_types.make_options, before_ids_checked=True)
    with monkeypatch.context() as before_the_upgrade:
        before_the_upgrade.setattr(_tool_context, "make_options", older)
        async with sqlite_runtime(tmp_path, agent) as rt:
            r = await rt.generate("bot", prompt="go", auth=ALICE)
            (asked,) = r.pending
    assert (asked.options[0].id, asked.options[0].label) == first
    async with sqlite_runtime(tmp_path, agent) as rt:
        answer = so.InputResponse(request_id=asked.id, option_id=first[0])
        done = await rt.respond(r.session_id, [answer], principal=ALICE)
        assert done.status == "completed"
    [result] = tool_results(seen.last)
    assert (result.is_error, result.content) == (False, first[0])


@pytest.mark.parametrize(
    ("options", "ids"),
    [
        ([{"label": "C++"}, {"label": "C#"}], ["c", "c-2"]),
        ([{"label": "?"}, {"label": "1"}], ["1", "1-2"]),  # "?" is numbered by its place
        ([{"label": "Yes"}, {"label": "Yes!"}], ["yes", "yes-2"]),
        ([{"label": "C++"}, {"id": "c", "label": "Cee"}], ["c-2", "c"]),  # given later
        ([{"label": "C++"}, {"label": "C#"}, {"label": "C 2"}], ["c", "c-3", "c-2"]),
        (["a", {"label": "A!"}, {"label": "a 2"}, "a-3"], ["a", "a-4", "a-2", "a-3"]),
    ],
    ids=["c++-c#", "numbered", "yes-yes!", "given-later", "slug-later", "given-and-slugs"],
)
async def test_option_ids_made_from_labels_that_clash_are_made_unique(
    tmp_path: Path, options: list[Any], ids: list[str]
) -> None:
    """Ids made from labels drop punctuation (`C++` and `C#` are both `c`), and a label of none
    is numbered by its place: `ctx.ask()` refused such labels, distinct as they are, naming ids
    the caller never gave ("option ids must be distinct: ['c', 'c']"). A made id that another
    has is suffixed, never taking an id given or made from a label anywhere in the list."""
    r, _, _ = await _asked(tmp_path, "Which?", options)
    assert r.status == "waiting"
    (request,) = r.pending
    assert [o.id for o in request.options] == ids


@pytest.mark.parametrize(
    "options",
    [
        [{"id": "c", "label": "C++"}, {"id": "c", "label": "C#"}],
        ["c", {"id": "c", "label": "Cee"}],
        [so.Option(id="c", label="Cee"), {"label": "C++"}, "c"],
    ],
    ids=["dicts", "string-and-dict", "option-and-string"],
)
def test_option_ids_given_twice_are_still_refused(options: list[Any]) -> None:
    with pytest.raises(ValueError, match="option ids must be distinct"):
        make_options(options)


@given(st.lists(st.sampled_from(["a", "A!", "a 2", "?", "1", "2", "b-2", "a-2"]), max_size=5))
def test_option_ids_made_from_labels_that_do_not_clash_are_as_before(labels: list[str]) -> None:
    """A question recorded before replays with the ids it was asked with: where all ids, given
    and made from labels, were distinct, they are unchanged (every third option here is given
    its label as its id)."""
    options: list[Any] = [
        {"label": label, "id": label} if i % 3 == 2 else {"label": label}
        for i, label in enumerate(labels)
    ]
    before = [o.get("id") or _slug(o["label"]) or str(i + 1) for i, o in enumerate(options)]
    if len(before) == len(set(before)):
        assert [o.id for o in make_options(options)] == before


async def test_an_option_id_made_unique_answers_it_when_the_question_replays(
    tmp_path: Path,
) -> None:
    @so.tool
    async def pick(ctx: so.ToolContext) -> str:
        """Ask which."""
        answer = await ctx.ask("Which?", options=[{"label": "C++"}, {"label": "C#"}])
        return f"{answer.value} ({answer.option_id})"

    seen = Capture(reply("Noted."))
    agent = scripted_agent("bot", [call_tools(call("pick")), seen], tools=[pick])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("bot", prompt="go", auth=ALICE)
        (asked,) = r.pending
        answer = so.InputResponse(request_id=asked.id, option_id="c-2")
        done = await rt.respond(r.session_id, [answer], principal=ALICE)
        assert done.status == "completed"
    [result] = tool_results(seen.last)
    assert (result.is_error, result.content) == (False, "C# (c-2)")
