"""What a request's Slack message offers and how it names people: a question without options
can always be answered in one's own words, and only a Slack principal is shown as a Slack
mention (another authenticator's id that looks like one is shown as text); each option of a
menu has a value that names it alone."""

from __future__ import annotations

import pytest

import signoff as so
from signoff.channels.slack._blocks import (
    TEXT,
    _choices,
    chosen_option,
    request_blocks,
    slack_mention,
)

BASE = {"kind": "question", "id": "req_1", "session_id": "s", "turn_id": "t"}


def _controls(request: so.InputRequest) -> list[str]:
    (actions,) = [b for b in request_blocks(request) if b["type"] == "actions"]
    return [e["action_id"] for e in actions["elements"]]


def test_a_question_without_options_offers_an_answer_in_ones_own_words() -> None:
    request = so.InputRequest(**BASE, agent="a", created_at=0.0, question="Why?")
    assert not request.options and not request.allow_text
    assert _controls(request) == [TEXT]


def test_only_a_slack_principal_is_shown_as_a_mention() -> None:
    slack = so.Principal(authenticator="slack", principal_id="slack:T1:U1")
    lookalike = so.Principal(authenticator="web", principal_id="slack:T1:U1")
    assert slack_mention(slack) == "<@U1>"
    assert slack_mention(lookalike) == "`slack:T1:U1`"
    assert slack_mention(None) == "the policy"


def _asking(*ids: str) -> so.InputRequest:
    options = [so.Option(id=i, label=f"Option {n}") for n, i in enumerate(ids)]
    return so.InputRequest(**BASE, agent="a", created_at=0.0, question="Which?", options=options)


@pytest.mark.parametrize(
    "ids",
    [
        ("x" * 200, "signoff.option#0"),
        ("signoff.option#1", "signoff.option#0", "plain"),
        ("signoff.option#", "signoff.option#01", "\ud800", "signoff.option#2", "signoff.option#3"),
        ("a", "b"),
    ],
    ids=["too-long-and-lookalike", "swapped", "lookalikes", "plain"],
)
def test_each_option_of_a_menu_has_a_value_that_names_it_alone(ids: tuple[str, ...]) -> None:
    """A value that reads as a position (`signoff.option#0`) named the option there and also the
    one whose id it is; now every value of the menu answers with its own option's id."""
    request = _asking(*ids)
    values = [o["value"] for o in _choices(request)["options"]]
    assert len(set(values)) == len(values)
    assert [chosen_option(request, v) for v in values] == list(ids)


@pytest.mark.parametrize(
    ("ids", "value", "chosen"),
    [
        (("signoff.option#1", "Basic"), "signoff.option#1", "signoff.option#1"),
        (("signoff.option#0", "Basic"), "signoff.option#0", "signoff.option#0"),
        (("signoff.option#x", "Basic"), "signoff.option#x", "signoff.option#x"),
        (("Basic", "signoff.option#01"), "signoff.option#01", "signoff.option#01"),
        (("Basic", "signoff.option#5"), "signoff.option#5", "signoff.option#5"),
    ],
    ids=["names-a-plain-one", "its-own-place", "no-number", "not-as-a-position", "past-the-end"],
)
def test_an_older_messages_id_that_reads_as_a_position_still_chooses_it(
    ids: tuple[str, ...], value: str, chosen: str
) -> None:
    """A message posted before such ids were sent as positions carries them as they are: one
    reads as the id unless the option at its number is sent as its position too."""
    assert chosen_option(_asking(*ids), value) == chosen
