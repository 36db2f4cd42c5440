"""Options whose labels are numbers (`ctx.ask("How many bags?", options=["0", "1", "2"])`): a
typed `1` names option `1` by label and option `0` by number, so it names none; `#2`, a number
after `#`, names the second option by its number alone, so a person can choose every option."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

import signoff as so
from signoff._option_names import how_to_choose, match_option
from signoff._types import APPROVAL_OPTIONS, make_options
from signoff.channels import TerminalChannel
from signoff.channels.text import parse_reply
from signoff.testing import call, call_tools, reply, scripted_agent, store_contents

from . import _proof

ALICE = so.Principal(authenticator="okta", principal_id="alice")
BAGS = ["0", "1", "2"]


def _question(options: list[str], allow_text: bool = True) -> so.InputRequest:
    return so.InputRequest(
        kind="question",
        id="req_1",
        session_id="ses_1",
        turn_id="trn_1",
        agent="shop",
        question="How many bags?",
        options=make_options(options),
        allow_text=allow_text,
        created_at=0.0,
    )


def test_a_number_after_a_hash_names_the_option_at_that_number() -> None:
    options = make_options(BAGS)
    assert match_option(options, "1") is None  # option 1's label, option 0's number
    assert match_option(options, "2") is None  # option 2's label, option 1's number
    assert match_option(options, "0") is options[0]  # a label, and no option's number
    assert match_option(options, " 3 ") is options[2]  # a number, and no option's label
    for typed, i in (("#1", 0), (" #2 ", 1), ("# 3", 2), ("＃２", 1)):  # full-width as well
        assert match_option(options, typed) is options[i], typed
    assert match_option(options, "#4") is None and match_option(options, "#0") is None
    named = [options[1], options[0]]  # what `1` names: option 1 by label, option 0 by number
    assert how_to_choose(options, named) == (
        "That could mean more than one option: to choose 1, reply #2; to choose 0, reply 0."
    )


def test_a_label_that_reads_like_a_hash_number_is_still_that_label() -> None:
    """`#N` names by number only what no option's id or label names: a label `#1` is that
    option's, as it always was."""
    options = make_options(["#2", "1", "2"])
    assert match_option(options, "#2") is options[0]
    assert match_option(options, "#3") is options[2]


@pytest.mark.parametrize("typed", ["#1", "#2", " # 1 "])
def test_a_hash_number_names_nothing_where_numbers_do_not_clash(typed: str) -> None:
    """Where no label or id is another option's number, a number names one option and needs no
    `#`: `#1` says no yes or no to an approval, and is free text to a question that takes it
    (the model's questions, whose ids are their own numbers, among them)."""
    assert match_option(APPROVAL_OPTIONS, typed) is None
    assert match_option(make_options(["red", "blue"]), typed) is None
    assert match_option(make_options(["1", "2"]), typed) is None
    own = [so.Option(id="1", label="Small"), so.Option(id="2", label="Large")]
    assert match_option(own, typed) is None


@given(numbers=st.lists(st.integers(0, 12), min_size=1, max_size=8, unique=True))
@settings(deadline=None)
def test_every_option_labelled_with_a_number_is_named_alone_by_some_reply(
    numbers: list[int],
) -> None:
    """Whatever numbers label the options, each option is named alone by a reply, and a reply
    naming several tells, for each, one that does."""
    _proof.record("hypothesis:test_number_labels:examples")
    options = make_options([str(n) for n in numbers])
    clash = any(1 <= n <= len(numbers) and n != i for i, n in enumerate(numbers, 1))
    for i, option in enumerate(options, 1):
        assert match_option(options, f"#{i}") is (option if clash else None)
        told = how_to_choose(options, [option])
        assert "no reply names one alone" not in told
        way = told.split(", reply ")[1].rstrip(".")
        assert match_option(options, way) is option, (numbers, option, told)


def test_the_text_channel_takes_a_hash_number_and_says_so() -> None:
    request = _question(BAGS)
    assert parse_reply(request, "1") is None  # two options: neither, nor free text
    assert parse_reply(request, "#2") == so.InputResponse(request_id="req_1", option_id="1")
    assert parse_reply(_question(["red", "blue"]), "#2") == so.InputResponse(
        request_id="req_1", text="#2"
    )
    from signoff.channels import TextChannel

    class Quiet(TextChannel):
        async def send_text(self, text: str) -> None:
            """Sends nothing: only the rendering is read."""

    shown = Quiet().render(request)
    assert "#1-#3" in shown
    assert "#1" not in Quiet().render(_question(["red", "blue"]))


def test_the_terminal_takes_a_hash_number() -> None:
    console = Console(record=True, width=120, file=open(os.devnull, "w"))
    answers = ["2", "#2"]
    prompts: list[str] = []

    def read(prompt: str) -> str | None:
        prompts.append(prompt)
        return answers.pop(0)

    try:
        answer = TerminalChannel(console, read=read).ask(_question(BAGS))
        assert answer == so.InputResponse(request_id="req_1", option_id="1")
        assert "to choose 1, reply #2" in console.export_text()
        assert "#1-#3" in prompts[0]
    finally:
        console.file.close()


async def test_a_follow_up_message_chooses_a_number_label_with_a_hash(store_url: str) -> None:
    """On either store: `1` is refused as naming two options, saying to reply `#2` for the
    option labelled 1, and `#2` answers it."""

    @so.tool
    async def bags(ctx: so.ToolContext) -> str:
        """Ask how many bags."""
        return (await ctx.ask("How many bags?", options=BAGS)).value

    agent = scripted_agent(
        "shop", [call_tools(call("bags", call_id="b1")), reply("ok")], tools=[bags]
    )
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("shop", prompt="pack", auth=ALICE)
        (q,) = r.pending
        before = await store_contents(rt.store, r.session_id)
        with pytest.raises(so.InvalidAnswer, match="to choose 1, reply #2; to choose 0, reply 0"):
            await rt.send(r.session_id, "1", principal=ALICE)
        assert await store_contents(rt.store, r.session_id) == before
        done = await rt.send(r.session_id, "#2", principal=ALICE)
        assert done.status == "completed"
        stored = await rt.store.get_request(q.id)
        assert stored is not None and stored.resolution is not None
        assert stored.resolution["answer"]["option_id"] == "1"
        assert stored.resolution["answer"]["value"] == "1"
