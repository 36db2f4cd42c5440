"""What a request's Slack message offers and how it names people: a question without options
can always be answered in one's own words, and only a Slack principal is shown as a Slack
mention (another authenticator's id that looks like one is shown as text)."""

from __future__ import annotations

import signoff as so
from signoff.channels.slack._blocks import TEXT, request_blocks, slack_mention

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
