"""Typed replies name an option however the keyboard wrote it: full-width letters (an input
method left in its wide mode), decomposed accents and characters that draw nothing (a zero-width
space, a right-to-left mark, a variation selector) name the option they read as."""

from __future__ import annotations

from pathlib import Path

import pytest

import signoff as so
from signoff._answers import Reply, match
from signoff._option_names import how_to_choose, match_option, named_options, twin_labels
from signoff._types import APPROVAL_OPTIONS, make_options
from signoff.channels import parse_reply
from signoff.testing import Capture, ExecutionLog, reply, sqlite_runtime, tool_results

from ._steer import ALICE, plan_agent, refund_agent


@pytest.mark.parametrize(
    ("text", "chosen"),
    [
        ("ａｐｐｒｏｖｅ", "approve"),  # full-width, as an input method in its wide mode types it
        ("Ａｐｐｒｏｖｅ", "approve"),
        ("ＤＥＮＹ", "cancel"),
        ("\u3000approve\u3000", "approve"),  # ideographic spaces around it
        ("１", "approve"),  # a full-width digit was taken already
        ("²", None),  # a superscript is still no index
        ("approve!", None),
    ],
)
def test_an_approval_option_is_named_in_any_width(text: str, chosen: str | None) -> None:
    option = match_option(APPROVAL_OPTIONS, text)
    assert (None if option is None else option.id) == chosen


def test_a_label_is_named_composed_or_decomposed() -> None:
    options = make_options([{"id": "cafe", "label": "Caf\u00e9"}, {"id": "tea", "label": "Tea"}])
    for typed in ("Cafe\u0301", "CAFE\u0301", "caf\u00e9"):
        assert match_option(options, typed) == options[0], typed
    ids = make_options([{"id": "r\u00e9sum\u00e9", "label": "CV"}, {"id": "x", "label": "Other"}])
    assert match_option(ids, "re\u0301sume\u0301") == ids[0]


async def test_a_full_width_approve_approves_and_is_not_a_steer(tmp_path: Path) -> None:
    """Typed in an input method's wide mode, "approve" withdrew the approval as a new message
    ('ignored'), and the model read it, instead of approving the call."""
    log = ExecutionLog()
    seen = Capture(reply("Done."))
    async with sqlite_runtime(tmp_path, refund_agent(log, seen)) as rt:
        r = await rt.generate("support", prompt="refund 1042", auth=ALICE)
        [req] = r.pending
        r = await rt.send(r.session_id, "ａｐｐｒｏｖｅ", principal=ALICE)
        assert r.status == "completed"
        assert r.outcomes == [so.Outcome(request_id=req.id, outcome="approved", applied=True)]
        assert log.count("issue_refund") == 1
        [result] = tool_results(seen.last)
        assert result.content == {"refunded": 180, "order_id": "1042"}


def test_a_text_channel_reads_a_yes_or_no_in_any_width() -> None:
    """The text channels' yes and no (the terminal's prompts, SMS-like channels) are read as
    typed replies name options: full-width, as an input method's wide mode types them."""
    approval = so.InputRequest(
        kind="tool-approval", id="req_1", session_id="s", turn_id="t", agent="a", created_at=0.0
    )
    approve = so.InputResponse(request_id="req_1", option_id="approve")
    assert parse_reply(approval, "ｙｅｓ") == approve
    assert parse_reply(approval, "１") == approve
    assert parse_reply(approval, "ＮＯ - too big") == so.InputResponse(
        request_id="req_1", option_id="cancel", text="too big"
    )
    assert parse_reply(approval, "ｍａｙｂｅ") is None


APPROVAL = so.InputRequest(
    kind="tool-approval", id="req_1", session_id="s", turn_id="t", agent="a", created_at=0.0
)
DRAWS_NOTHING = ["\u200b", "\u200d", "\u200f", "\u2066", "\ufe0f", "\ufeff", "\xad", "\U000e0020"]
"""A zero-width space and joiner, a right-to-left mark and isolate, a variation selector, a byte
order mark, a soft hyphen, a tag space: what a paste, an emoji or a keyboard may leave in."""


@pytest.mark.parametrize("hidden", DRAWS_NOTHING)
def test_a_reply_is_read_as_it_shows_whatever_draws_nothing_in_it(hidden: str) -> None:
    """`yes` + a zero-width space, or a right-to-left mark before `Yes`, shows as the word or
    label and named nothing: the text channels sent the yes on as a message (withdrawing the
    approval it gave) and took the label as free text rather than the option."""
    approve = so.InputResponse(request_id="req_1", option_id="approve")
    for typed in (f"yes{hidden}", f"{hidden}yes", f"y{hidden}es", f"{hidden}１{hidden}"):
        assert parse_reply(APPROVAL, typed) == approve, typed
    assert parse_reply(APPROVAL, f"no{hidden}: too big") == so.InputResponse(
        request_id="req_1", option_id="cancel", text="too big"
    )
    assert match_option(APPROVAL_OPTIONS, f"{hidden}approve{hidden}") == APPROVAL_OPTIONS[0]
    options = make_options(["Yes", "No"])
    assert match_option(options, f"{hidden}Yes") == options[0]
    assert match_option(options, f"2{hidden}") == options[1]  # its number, as it shows
    assert match_option(options, f"{hidden}") is None


def test_an_option_that_holds_what_draws_nothing_is_named_with_or_without_it() -> None:
    """`❤` was not the label `❤️` (U+2764 U+FE0F), nor `👍` + U+FE0F the label `👍`: with
    free text off the person was told to reply with an option's name, which they had typed."""
    hearts = make_options(["\u2764\ufe0f", "\U0001f494"])
    assert match_option(hearts, "\u2764") == hearts[0]
    assert match_option(hearts, "\u2764\ufe0f") == hearts[0]
    thumbs = make_options(["\U0001f44d", "\U0001f44e"])
    assert match_option(thumbs, "\U0001f44d\ufe0f") == thumbs[0]
    assert match_option(thumbs, "\U0001f44d\U0001f3fd") is None  # a skin tone shows: another
    ids = make_options([{"id": "ok\u200b", "label": "Fine"}, {"id": "x", "label": "Other"}])
    assert match_option(ids, "OK") == ids[0]
    assert match_option(ids, "ok\u200b") == ids[0]


def test_labels_that_differ_only_by_what_draws_nothing_are_asked_and_a_reply_names_both() -> None:
    """`❤` and `❤️` were two labels a reply told apart; a question recorded with them (a model's
    `ask_question`) must replay, so they are still asked, and a reply naming both is refused
    with how to choose each, as for a label that is another's number."""
    options = make_options(["\u2764", "\u2764\ufe0f"])
    assert twin_labels(options) is None
    assert named_options(options, "\u2764\ufe0f") == options
    assert how_to_choose(options, options).endswith(
        "to choose \u2764, reply 1; to choose \u2764\ufe0f, reply 2."
    )
    assert twin_labels(make_options(["\u2764\ufe0f", "\u2764\ufe0f "])) is not None


def test_free_text_and_a_reason_keep_what_draws_nothing() -> None:
    """Only the reading of a reply passes over invisible characters: what is stored, free text
    naming no option or a deny's reason, is as the person typed it."""
    question = so.InputRequest(
        kind="question",
        id="req_1",
        session_id="s",
        turn_id="t",
        agent="a",
        created_at=0.0,
        options=make_options(["Yes", "No"]),
        allow_text=True,
    )
    for typed in ("ma\u200bybe", "\u200f\u0646\u0639\u0645"):
        assert match(question, typed) == Reply("req_1", None, typed)
        assert parse_reply(question, typed) == so.InputResponse(request_id="req_1", text=typed)
    assert parse_reply(APPROVAL, "no: \u200f\u0644\u0627") == so.InputResponse(
        request_id="req_1", option_id="cancel", text="\u200f\u0644\u0627"
    )
    # what follows the word shows nothing: no reason
    assert parse_reply(APPROVAL, "no\u200b") == so.InputResponse(
        request_id="req_1", option_id="cancel"
    )


async def test_an_approve_with_a_zero_width_space_approves_and_is_not_a_steer(
    tmp_path: Path,
) -> None:
    """`approve` + U+200B withdrew the approval as a new message ('ignored'), and the model
    read it, instead of approving the call; an option typed after a right-to-left mark too."""
    log = ExecutionLog()
    seen = Capture(reply("Done."))
    async with sqlite_runtime(tmp_path, refund_agent(log, seen)) as rt:
        r = await rt.generate("support", prompt="refund 1042", auth=ALICE)
        [req] = r.pending
        r = await rt.send(r.session_id, "approve\u200b", principal=ALICE)
        assert r.outcomes == [so.Outcome(request_id=req.id, outcome="approved", applied=True)]
        assert log.count("issue_refund") == 1
    picked = Capture(reply("Done."))
    async with sqlite_runtime(tmp_path / "plan", plan_agent(picked)) as rt:
        r = await rt.generate("sales", prompt="upgrade", auth=ALICE)
        [req] = r.pending
        r = await rt.send(r.session_id, "\u200fPro", principal=ALICE)
        assert r.outcomes == [so.Outcome(request_id=req.id, outcome="answered", applied=True)]
        [result] = tool_results(picked.last)
        assert result.content == "pro"
