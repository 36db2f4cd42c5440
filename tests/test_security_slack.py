"""What a Slack message shows of ids and principals: mrkdwn reads `<!channel>`, `<@U…>` and
`<https://…|…>` wherever they stand, so nothing but Slack's own user id becomes a mention, and
an id (a store's row, a custom authenticator's principal) is shown as text, never as markup.
"""

from __future__ import annotations

import signoff as so
from signoff.channels import Resolution
from signoff.channels.slack._blocks import describe, request_blocks, slack_mention

EVIL = "x`<!channel>|<https://evil.example|click>"


def test_ids_in_the_facts_line_are_text() -> None:
    request = so.InputRequest(
        kind="question",
        id="req_" + EVIL,
        session_id="ses_" + EVIL,
        turn_id="t",
        agent="a",
        created_at=0.0,
    )
    (facts,) = [b for b in request_blocks(request) if b["block_id"] == "signoff.facts"]
    text = facts["elements"][0]["text"]
    assert "<!channel>" not in text and "<https" not in text, text
    assert "&lt;!channel&gt;" in text
    assert text.count("`") % 2 == 0, text  # no id ends its code span early


def test_only_a_slack_user_id_is_a_mention() -> None:
    me = so.Principal(authenticator="slack", principal_id="slack:T0:U123ABC")
    assert slack_mention(me) == "<@U123ABC>"
    for principal_id in ("slack:T0:U1>|<!channel", "slack:T0:<!here>", "slack:T0:"):
        forged = so.Principal(authenticator="slack", principal_id=principal_id)
        shown = slack_mention(forged)
        assert "<!" not in shown and "<@" not in shown, shown
        request = so.InputRequest(
            kind="question", id="req_1", session_id="s", turn_id="t", agent="a", created_at=0.0
        )
        closed = Resolution(
            request_id="req_1", outcome="answered", status="settled", at=0.0, by=forged
        )
        assert "<!" not in describe(request, closed).replace("<!date^", "")
