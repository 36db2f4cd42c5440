"""`ctx.ask()`'s options replayed in another order: those given no id take the ids they were
asked with, matched by what they show, as ids made from labels follow the order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff._types import make_options
from signoff.testing import (
    Capture,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    tool_results,
)

from ._cli import ROOT
from ._seeds import ALICE


@pytest.mark.parametrize(
    ("options", "chosen", "result"),
    [
        ([{"label": "C++"}, {"label": "C#"}, {"label": "Go"}], "c-2", "C# (c-2)"),
        ([{"label": "👍"}, {"label": "👎"}], "2", "👎 (2)"),  # ids by place
        (
            [{"id": "c", "label": "Cee"}, {"label": "C++"}, {"label": "C#"}],
            "c-3",
            "C# (c-3)",
        ),
        (
            [{"label": "?", "description": "Unsure"}, {"label": "!", "description": "Sure"}],
            "1",
            "? (1)",
        ),
    ],
    ids=["slug-clash", "by-place", "given-and-made", "by-place-described"],
)
async def test_options_made_ids_replayed_in_another_order_answer_the_same_option(
    store_url: str, options: list[Any], chosen: str, result: str
) -> None:
    """Ids made from labels depend on the order: a clash is suffixed in it (`C++`, `C#` are
    `c`, `c-2`), a label of no letters or digits is numbered by its place. Replayed in another
    order (a set's, in a worker that resumes the turn), the same options had other ids and were
    a ReplayError, the person's answer lost. Those given no id take the ids they were asked with
    by what they show, and the answer is to the option chosen, on either store."""
    runs: list[int] = []

    @so.tool
    async def pick(ctx: so.ToolContext) -> str:
        """Ask which."""
        runs.append(1)
        answer = await ctx.ask("Which?", options=options[:: -1 if len(runs) > 1 else 1])
        return f"{answer.value} ({answer.option_id})"

    seen = Capture(reply("ok"))
    agent = scripted_agent("bot", [call_tools(call("pick")), seen], tools=[pick])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("bot", prompt="go", auth=ALICE)
        (asked,) = r.pending
        assert chosen in [o.id for o in asked.options]
    async with so.Runtime([agent], store=store_url) as rt:  # another runtime resumes it
        answer = so.InputResponse(request_id=asked.id, option_id=chosen)
        done = await rt.respond(r.session_id, [answer], principal=ALICE)
        assert done.status == "completed" and len(runs) == 2
    [called] = tool_results(seen.last)
    assert (called.is_error, called.content) == (False, result)


@pytest.mark.parametrize(
    "replayed",
    [
        [{"label": "C#"}, {"label": "C"}],  # a label changed
        [{"label": "C#", "description": "Sharp"}, {"label": "C++"}],  # a description added
        [{"label": "C#"}, {"id": "c-2", "label": "C++"}],  # given the other's id
        [{"label": "C#"}, {"label": "C++"}, {"label": "C++"}],  # one more
    ],
    ids=["label", "description", "given-id", "twice"],
)
async def test_options_made_ids_replayed_as_other_options_are_still_a_replay_error(
    tmp_path: Path, replayed: list[Any]
) -> None:
    """Matched by what they show, options without ids still replay only as the same: one that
    shows as none asked did, or one given an id (matched by it) that another was asked with."""
    runs: list[int] = []

    @so.tool
    async def pick(ctx: so.ToolContext) -> str:
        """Ask which."""
        runs.append(1)
        options = replayed if len(runs) > 1 else [{"label": "C++"}, {"label": "C#"}]
        return (await ctx.ask("Which?", options=options)).value

    seen = Capture(reply("ok"))
    agent = scripted_agent("bot", [call_tools(call("pick")), seen], tools=[pick])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("bot", prompt="go", auth=ALICE)
        (asked,) = r.pending
        answer = so.InputResponse(request_id=asked.id, option_id="c-2")
        done = await rt.respond(r.session_id, [answer], principal=ALICE)
        assert done.status == "completed" and len(runs) == 2
    [called] = tool_results(seen.last)
    assert called.is_error is True
    assert called.content["error"].startswith("ReplayError: ")


def test_options_without_ids_take_the_ids_asked_of_those_that_show_the_same() -> None:
    """Two that show the same (asked before such were refused) take theirs in order; a given
    id keeps the one asked with it from those made from labels."""
    asked = [
        so.Option(id="b", label="A"),
        so.Option(id="a", label="A"),
        so.Option(id="x", label="X"),
    ]
    again = make_options([{"label": "X"}, {"label": "A"}, {"label": "A"}], asked=asked)
    assert [o.id for o in again] == ["x", "b", "a"]
    given = make_options([{"id": "b", "label": "A"}, {"label": "X"}, {"label": "A"}], asked=asked)
    assert [o.id for o in given] == ["b", "x", "a"]
    unknown = make_options([{"label": "X"}, {"label": "Y"}], asked=asked)
    assert [o.id for o in unknown] == ["x", "y"]  # as made: not the same options


_ASK_FROM_A_SET = """
import asyncio, json, sys
import signoff as so
from signoff._types import make_options
from signoff.testing import call, call_tools, reply, scripted_agent

THUMBS = {"\\N{THUMBS UP SIGN}", "\\N{THUMBS DOWN SIGN}"}
LABELS = [{"label": label} for label in {"C++", "C#", "Go", *THUMBS}]

@so.tool
async def pick(ctx: so.ToolContext) -> str:
    \"\"\"Ask which.\"\"\"
    answer = await ctx.ask("Which?", options=LABELS)
    return f"{answer.value} ({answer.option_id})"

async def main(url, session_id="", label=""):
    agent = scripted_agent("bot", [call_tools(call("pick")), reply("ok")], tools=[pick])
    alice = so.Principal(authenticator="test", principal_id="alice")
    made = {o.label: o.id for o in make_options(LABELS)}  # in this process's order
    async with so.Runtime([agent], store=url) as rt:
        if not session_id:
            r = await rt.generate("bot", prompt="go", auth=alice)
            print(json.dumps([r.session_id, made]))
            return
        await rt.send(session_id, label, principal=alice)
        events = [e async for e in rt.events(session_id, follow=False)]
        [done] = [e.data for e in events if e.type == "tool.completed"]
        print(json.dumps([done["status"], done["result"], made]))

asyncio.run(main(*sys.argv[1:]))
"""


@pytest.mark.parametrize("label", ["C#", "C++", "\N{THUMBS DOWN SIGN}"])
def test_options_from_a_set_answered_in_another_process_answer_the_same_option(
    tmp_path: Path, label: str
) -> None:
    """A set of labels comes in an order of its own in each process (hash randomization), and
    with it the ids made from them (`c` or `c-2`, `1` or `2`): a question asked by one process
    and answered in another (a worker) was a ReplayError. The answer is to the option chosen."""
    url = f"sqlite:///{tmp_path}/state.db"
    src = Path(so.__file__).parents[1]  # the signoff under test, in each process

    def run(seed: str, *args: str) -> Any:
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": f"{src}:{ROOT}"}
        code = [sys.executable, "-c", _ASK_FROM_A_SET, url, *args]
        done = subprocess.run(code, env=env, cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    session_id, asked = run("1")
    status, result, made = run("4", session_id, label)
    assert made[label] != asked[label]  # the other process made it another id
    assert (status, result) == ("ok", f"{label} ({asked[label]})")


async def test_a_question_an_older_signoff_asked_replays_in_another_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older signoff made an option given the id "" one of its label, here numbered by its
    place: replayed after the upgrade in another order, it takes the id it was asked with."""
    from signoff import _tool_context, _types

    runs: list[int] = []

    @so.tool
    async def pick(ctx: so.ToolContext) -> str:
        """Ask which."""
        runs.append(1)
        options: list[Any] = [{"id": "", "label": "?"}, {"label": "!"}]
        answer = await ctx.ask("Which?", options=options[:: -1 if len(runs) > 1 else 1])
        return f"{answer.value} ({answer.option_id})"

    seen = Capture(reply("Noted."))
    agent = scripted_agent("bot", [call_tools(call("pick")), seen], tools=[pick])
    older = partial(_types.make_options, before_ids_checked=True)
    with monkeypatch.context() as before_the_upgrade:
        before_the_upgrade.setattr(_tool_context, "make_options", older)
        async with sqlite_runtime(tmp_path, agent) as rt:
            r = await rt.generate("bot", prompt="go", auth=ALICE)
            (asked,) = r.pending
    assert [(o.id, o.label) for o in asked.options] == [("1", "?"), ("2", "!")]
    async with sqlite_runtime(tmp_path, agent) as rt:
        answer = so.InputResponse(request_id=asked.id, option_id="1")
        done = await rt.respond(r.session_id, [answer], principal=ALICE)
        assert done.status == "completed"
    [result] = tool_results(seen.last)
    assert (result.is_error, result.content) == (False, "? (1)")


@pytest.mark.parametrize(
    ("options", "older"),
    [
        ([{"label": "\N{THUMBS UP SIGN}"}, {"label": "\N{THUMBS DOWN SIGN}"}], False),
        ([{"id": "", "label": "?"}, {"label": "!"}], True),  # asked with an older signoff's ids
    ],
    ids=["by-place", "older-signoff"],
)
async def test_options_given_as_a_generator_replay_in_another_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: list[Any], older: bool
) -> None:
    """Options from a generator (`({"label": r} for r in REACTIONS)`, over a set) were used up
    by the first reading: replayed in another order, the ids asked with were looked for in an
    empty generator, and the answer was lost to a ReplayError. It is read once, as a list."""
    from signoff import _tool_context, _types

    runs: list[int] = []

    @so.tool
    async def pick(ctx: so.ToolContext) -> str:
        """Ask which."""
        runs.append(1)
        shown = (dict(o) for o in options[:: -1 if len(runs) > 1 else 1])
        answer = await ctx.ask("Which?", options=shown, allow_text=False)
        return f"{answer.value} ({answer.option_id})"

    seen = Capture(reply("Noted."))
    agent = scripted_agent("bot", [call_tools(call("pick")), seen], tools=[pick])
    with monkeypatch.context() as before_the_upgrade:
        if older:
            made = partial(_types.make_options, before_ids_checked=True)
            before_the_upgrade.setattr(_tool_context, "make_options", made)
        async with sqlite_runtime(tmp_path, agent) as rt:
            r = await rt.generate("bot", prompt="go", auth=ALICE)
            (asked,) = r.pending
    first = asked.options[0]
    assert first.id == "1"
    async with sqlite_runtime(tmp_path, agent) as rt:
        answer = so.InputResponse(request_id=asked.id, option_id=first.id)
        done = await rt.respond(r.session_id, [answer], principal=ALICE)
        assert done.status == "completed" and len(runs) == 2
    [result] = tool_results(seen.last)
    assert (result.is_error, result.content) == (False, f"{first.label} (1)")
