"""A Slack channel's secrets as given: a signing secret with blanks around it, which no click
Slack signs would match, is refused when the channel is made, never shown; a bot token with
them works, so it is taken."""

from __future__ import annotations

import pytest

import signoff as so
from signoff.channels.slack import SlackChannel

from ._slack import SECRET, FakeSlack, slack_api

__all__ = ["slack_api"]  # the fixture, used by name


@pytest.mark.parametrize("bad", [f"{SECRET}\n", f"{SECRET}\r\n", f" {SECRET}", f"\t{SECRET} "])
def test_a_signing_secret_with_blanks_around_it_is_refused_unshown(bad: str) -> None:
    """A signing secret read from a file written by `echo` (or an environment value) ends in a
    newline: it was taken, and every click Slack signed without it was refused (401, and a line
    logged once a minute), where a webhook secret with it is refused up front."""
    with pytest.raises(
        so.UsageError, match="the signing secret has spaces or a newline around it: drop them"
    ) as caught:
        SlackChannel("C42", token="xoxb-test", signing_secret=bad)
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize("token", ["xoxb-test\n", " xoxb-test"])
async def test_a_bot_token_with_blanks_around_it_reaches_slack_without_them(
    slack_api: FakeSlack, token: str
) -> None:
    """The HTTP client sends a header's value without blanks around it, so such a token works
    as Slack gave it: it is taken, where refusing it would stop a channel that works."""
    slack = SlackChannel("C42", token=token, base_url=slack_api.url, signing_secret=SECRET)
    await slack.client.auth_test()
    assert slack_api.tokens == ["Bearer xoxb-test"]
