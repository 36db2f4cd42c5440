"""`ask_question()`: the opt-in tool through which the model asks the user one question."""

from __future__ import annotations

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
    tool_results,
)

from ._seeds import ALICE


def _options(*labels: str) -> list[dict[str, str]]:
    return [{"label": label, "description": f"Choose {label}."} for label in labels]


@pytest.mark.parametrize(
    "labels",
    [
        ("Yes", "yes"),  # one label twice, as a person types it
        (" Red", "Red "),
        ("Caf\u00e9", "Cafe\u0301"),  # one label, its accent composed and decomposed
        ("ＲＥＤ", "red"),  # full-width and not: a reply names both
        ("2", "1"),  # each label is the other's number: no reply names either alone
        ("1", "3", "2"),  # "2" and "3" each name two options
    ],
)
async def test_options_a_reply_cannot_tell_apart_are_the_models_invalid_input(
    tmp_path: Path, labels: tuple[str, ...]
) -> None:
    """The seed's options are "two or three mutually exclusive choices": ones a person cannot
    tell apart (two buttons saying Yes) or cannot choose by any reply (every reply that names
    one names another too, and is refused) are the model's invalid input, so it can ask again,
    not a question parked for good on a text channel."""
    seen = Capture(reply("I'll ask differently."))
    asked = call_tools(call("ask_question", question="Which?", options=_options(*labels)))
    agent = scripted_agent("bot", [asked, seen], tools=[so.ask_question()])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("bot", prompt="hi", auth=ALICE)
        assert r.status == "completed" and r.pending == []
        (result,) = tool_results(seen.last)
        assert result.is_error
        assert result.content["error"] == "invalid input"
        assert "label" in str(result.content["details"])
        types = [e.type async for e in rt.events(r.session_id, follow=False)]
        assert "input.requested" not in types


@pytest.mark.parametrize(
    ("question", "options", "loc"),
    [
        ("Ship to Jos\udce9?", None, ["question"]),
        ("Which?", [{"label": "A", "description": "d\ud800"}, *_options("B")], ["options", 0]),
        ("Which?", [*_options("A"), {"label": "B\udfff", "description": "d"}], ["options", 1]),
    ],
    ids=["question", "description", "label"],
)
async def test_text_that_is_not_valid_unicode_is_the_models_invalid_input(
    tmp_path: Path, question: str, options: list[dict[str, str]] | None, loc: list[Any]
) -> None:
    """A lone surrogate in what the model asks (a JSON `\\udce9` escape) is its invalid input,
    which it reads and can ask again: no UTF-8 transport could show such a question."""
    seen = Capture(reply("I'll ask differently."))
    given = (
        {"question": question} if options is None else {"question": question, "options": options}
    )
    agent = scripted_agent(
        "bot", [call_tools(call("ask_question", **given)), seen], tools=[so.ask_question()]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("bot", prompt="hi", auth=ALICE)
        assert r.status == "completed" and r.pending == []
        (result,) = tool_results(seen.last)
        assert result.is_error and result.content["error"] == "invalid input"
        (detail,) = result.content["details"]
        assert detail["loc"][: len(loc)] == loc and detail["type"] == "string_unicode"
        assert await rt.pending() == []


@pytest.mark.parametrize(
    ("labels", "reply_text", "answer"),
    [
        (("Red", "Blue"), "blue", "Blue"),
        (("1", "2"), "2", "2"),  # a label that is its own number names that option alone
        (("5", "10", "1"), "3", "1"),  # "1" names two options, but "3" the third alone
        (("Red", "Blue", "Green"), "3", "Green"),
        (("Red", "Blue"), "purple", "purple"),  # the user's own words
    ],
)
async def test_a_reply_answers_with_the_chosen_label_or_the_users_words(
    tmp_path: Path, labels: tuple[str, ...], reply_text: str, answer: Any
) -> None:
    seen = Capture(reply("ok"))
    asked = call_tools(call("ask_question", question="Which?", options=_options(*labels)))
    agent = scripted_agent("bot", [asked, seen], tools=[so.ask_question()])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("bot", prompt="hi", auth=ALICE)
        assert r.status == "waiting"
        done = await rt.send(r.session_id, reply_text, principal=ALICE)
        assert done.status == "completed"
        (result,) = tool_results(seen.last)
        assert result.content == {"status": "answered", "answer": answer}
