"""Which Events API messages the Slack channel reads as a person's reply in a request's thread,
and as whom: not a bot's post (its own or another app's), a person from another workspace
(Slack Connect) as a member of their own, with only a mention of the bot dropped; and how long
the thread of a closed request still takes replies."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import ChannelState
from signoff.channels.slack import SlackChannel, SlackPayloadError
from signoff.channels.slack._replies import KEEP_THREADS, TypedReply, thread_key

from ._slack import TEAM
from ._slack_replies import ALLOWED, BOT, FIRST_TS, event


@pytest.fixture
async def slack(tmp_path: Path) -> AsyncIterator[SlackChannel]:
    """A channel whose state knows the thread of request `req_1` (its message at FIRST_TS)."""
    channel = SlackChannel("C42", token="xoxb-test", signing_secret="secret")
    state = ChannelState(tmp_path / "hub.db")
    try:
        async with so.Runtime([], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
            channel.bind(rt, state)
            channel.remember(thread_key("C42", FIRST_TS), {"request_id": "req_1"})
            yield channel
    finally:
        state.close()


def _read(slack: SlackChannel, text: str, **fields: Any) -> TypedReply | None:
    return slack.replies._reply(json.loads(event(text, **fields)))


async def test_a_persons_reply_in_the_thread_is_read(slack: SlackChannel) -> None:
    found = _read(slack, "Large")
    assert found is not None
    assert (found.request_id, found.user, found.team, found.text) == (
        "req_1",
        ALLOWED,
        TEAM,
        "Large",
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"bot_id": "B0OTHER", "user": "U0OTHERAPP"},  # another app's bot, posting as a user
        {"user": BOT},  # this app's own bot user
        {"subtype": "message_changed"},
        {"subtype": ["file_share"]},  # not a subtype Slack sends
        {"ts": FIRST_TS},  # the thread's parent, not a reply in it
        # a file another app uploaded with its bot token: its bot user, no bot_id
        {"subtype": "file_share", "user": "U0OTHERAPP", "bot_profile": {"id": "B0OTHER"}},
        {"subtype": "file_share", "user": "U0OTHERAPP", "display_as_bot": True},
    ],
    ids=["another-bot", "own-bot", "edit", "subtype-list", "parent", "app-file", "as-bot"],
)
async def test_posts_of_bots_and_edits_are_not_replies(
    slack: SlackChannel, fields: dict[str, Any]
) -> None:
    assert _read(slack, "Large", **fields) is None


_PHOTO = [{"id": "F0PHOTO", "name": "photo.jpg", "mimetype": "image/jpeg"}]


@pytest.mark.parametrize(
    "fields",
    [{"subtype": "file_share", "files": _PHOTO, "upload": True}, {"subtype": "me_message"}],
    ids=["file-attached", "me"],
)
async def test_a_reply_with_a_file_or_by_me_is_read_by_its_text(
    slack: SlackChannel, fields: dict[str, Any]
) -> None:
    """Slack sends a message with a file attached as subtype `file_share` (the typed text in
    `text`): an approver's "deny" with a screenshot was acknowledged and dropped. It counts by
    its text, as does a `/me` message; a file sent with no text is ignored as an empty reply."""
    found = _read(slack, "deny", **fields)
    assert found is not None and (found.request_id, found.user, found.text) == (
        "req_1",
        ALLOWED,
        "deny",
    )
    assert _read(slack, "", **fields) is None
    assert _read(slack, "deny", bot_id="B0OTHER", **fields) is None  # a bot's, still not


@pytest.mark.parametrize("field", ["thread_ts", "channel", "user", "user_team"])
async def test_a_reply_naming_an_id_with_a_lone_surrogate_is_unreadable(
    slack: SlackChannel, field: str
) -> None:
    """JSON can escape a lone surrogate (`"\\ud800"`), which no store can look up: such an id
    is a `SlackPayloadError` (a 400), not an error of the store (a 500) or a reply that fails
    later."""
    envelope = json.loads(event("deny"))
    envelope["event"][field] = "\ud800"
    with pytest.raises(SlackPayloadError, match=r"not valid Unicode text"):
        slack.replies._reply(envelope)


async def test_a_person_of_another_workspace_replies_as_a_member_of_their_own(
    slack: SlackChannel,
) -> None:
    """In a Slack Connect channel the event's `team` (and the envelope's) is the host's; the
    person's own workspace is `user_team`, which their principal must name."""
    found = _read(slack, "Large", user_team="T0GUEST")
    assert found is not None and found.team == "T0GUEST"


async def test_only_a_leading_mention_of_the_bot_is_dropped(slack: SlackChannel) -> None:
    """ "@bot Large" answers "Large"; "@bob Large" is a message that names Bob, kept whole."""
    to_bot = _read(slack, f"<@{BOT}> Large")
    to_bob = _read(slack, "<@U0BOB> Large")
    assert to_bot is not None and to_bot.text == "Large"
    assert to_bob is not None and to_bob.text == "<@U0BOB> Large"


async def test_the_thread_of_a_closed_request_takes_replies_for_a_while(
    slack: SlackChannel,
) -> None:
    """A thread closed `KEEP_THREADS` seconds ago is forgotten; one closed a minute ago, or
    still open, is kept (a reply in it still reaches the session)."""
    now = slack.clock()
    kept = {
        thread_key("C42", "1.1"): {"request_id": "req_2", "closed_at": now - 60},
        thread_key("C42", "1.2"): {"request_id": "req_3", "closed_at": None},
    }
    old = {thread_key("C42", "1.3"): {"request_id": "req_4", "closed_at": now - KEEP_THREADS - 1}}
    for key, memo in {**kept, **old}.items():
        slack.remember(key, memo)
    slack.replies._tidy_threads()
    for key, memo in kept.items():
        assert slack.recall(key) == memo
    assert all(slack.recall(key) is None for key in old)
    assert _read(slack, "Large", thread="1.1") is not None


async def test_a_reply_reads_as_typed_slacks_escapes_undone_once(slack: SlackChannel) -> None:
    """Slack sends `<`, `>` and `&` as `&lt;`, `&gt;` and `&amp;`: "a < b && c" arrives as
    such and reads as typed, and so does someone typing the entity "&lt;" itself."""
    typed = _read(slack, "a &lt; b &amp;&amp; c")
    entity = _read(slack, "write &amp;lt;b&amp;gt; for <b>")
    assert typed is not None and typed.text == "a < b && c"
    assert entity is not None and entity.text == "write &lt;b&gt; for <b>"


@pytest.mark.parametrize(
    ("sent", "typed"),
    [
        ("<http://acme.io|acme.io>", "acme.io"),
        ("ship to <https://acme.io/x?a=1&amp;b=2>", "ship to https://acme.io/x?a=1&b=2"),
        ("<mailto:bob@acme.com|bob@acme.com>", "bob@acme.com"),
        ("<mailto:bob@acme.com>", "bob@acme.com"),
        ("<HTTP://acme.io|acme.io>", "<HTTP://acme.io|acme.io>"),  # not Slack's: it writes http
        ("ask <@U0BOB> first", "ask <@U0BOB> first"),  # a mention names someone exactly
    ],
)
async def test_a_reply_reads_slacks_links_as_they_show(
    slack: SlackChannel, sent: str, typed: str
) -> None:
    """Slack sends a typed `acme.io` as `<http://acme.io|acme.io>`: the option `acme.io` was
    not matched (the question withdrawn, the model reading the markup), and free text was
    recorded with it. Mentions are kept as Slack writes them."""
    reply = _read(slack, sent)
    assert reply is not None and reply.text == typed


async def test_a_thread_closed_too_long_ago_takes_no_reply_before_it_is_tidied(
    slack: SlackChannel,
) -> None:
    """A thread memo closed more than `KEEP_THREADS` seconds ago that no sweep has dropped yet
    (a standby, whose state the delivering hub on another file never tidies, or a hub started
    again before its first sweep) takes no reply: the thread's time is over whoever tidies.
    Before, the reply was read and sent to the session, months on."""
    now = slack.clock()
    slack.remember(
        thread_key("C42", "1.3"), {"request_id": "req_4", "closed_at": now - KEEP_THREADS - 1}
    )
    assert _read(slack, "Large", thread="1.3") is None
    slack.remember(thread_key("C42", "1.3"), {"request_id": "req_4", "closed_at": now - 60})
    assert _read(slack, "Large", thread="1.3") is not None
