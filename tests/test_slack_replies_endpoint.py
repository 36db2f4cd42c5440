"""The Events API endpoint: Slack's challenge, unsigned or malformed deliveries, what is not a
person's reply, requests posted before threads were remembered, and the configurable path.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

import signoff as so
from signoff.channels import ChannelHub, InvalidSignature
from signoff.channels.slack import SlackChannel, SlackPayloadError
from signoff.server import create_app

from ._slack import (
    SECRET,
    TEAM,
    FakeSlack,
    channel,
    manual,
)
from ._slack_replies import (
    BOT,
    EVENTS,
    deliver,
    event,
    events_of,
    fake,
    shop_agent,
    signed,
)

__all__ = ["fake"]  # the fixture, used by name


async def test_what_is_not_a_persons_reply_in_a_request_thread_is_ignored(
    tmp_path: Path, fake: FakeSlack
) -> None:
    async with so.Runtime([shop_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("shop", prompt="Reorder the soap")
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            before = await events_of(rt, r.session_id)
            ignored = [
                event("Large", bot_id="B0BOT", subtype="bot_message"),  # a bot's post
                event("Large", user=BOT),  # the app's own bot user
                event("Large", subtype="message_changed"),  # an edit
                event("Large", subtype="message_deleted"),  # a deletion
                event("Large", subtype="channel_join"),
                event("Large", subtype=["file_share"]),  # not a subtype Slack sends
                event("Large", thread=None),  # not in a thread
                event("Large", thread="1700000500.000100"),  # starts a thread of its own
                event("Large", thread="1699999999.000001"),  # the thread of a message not ours
                event("Large", channel="C99"),  # the same ts in another channel
                event("   "),  # nothing typed
                json.dumps({"type": "app_rate_limited", "team_id": TEAM}).encode(),
            ]
            reaction = json.loads(event("x"))
            reaction["event"] = {"type": "reaction_added", "user": "U5", "reaction": "thumbsup"}
            ignored.append(json.dumps(reaction).encode())
            for n, body in enumerate(ignored):
                body = body.replace(b'"Ev01"', f'"Ev{n:03d}"'.encode())
                assert await deliver(slack, body) is None
            assert slack.memos("event:") == []
            assert await events_of(rt, r.session_id) == before
        assert fake.of("chat.postEphemeral") == []


async def test_the_endpoint_answers_slacks_challenge_and_refuses_what_is_not_signed(
    tmp_path: Path, fake: FakeSlack
) -> None:
    async with so.Runtime([shop_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("shop", prompt="Reorder the soap")
        now = 1_800_000_000
        slack = channel(fake, clock=lambda: float(now))
        hub = ChannelHub(rt, [slack], state=tmp_path / "hub.db")
        app = create_app(rt, dev=True, channels=hub)
        async with app.router.lifespan_context(app):
            await hub.poll()
            before = await events_of(rt, r.session_id)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:

                async def post(body: bytes, headers: dict[str, str]) -> httpx.Response:
                    response = await http.post(EVENTS, content=body, headers=headers)
                    await slack.idle()
                    return response

                challenge = json.dumps(
                    {"token": "unused", "challenge": "3eZbrw1aB", "type": "url_verification"}
                ).encode()
                ok = await post(challenge, signed(challenge, now))
                assert (ok.status_code, ok.json()) == (200, {"challenge": "3eZbrw1aB"})
                answer = event("Large")
                refused = [
                    await post(challenge, signed(challenge, now - 360)),  # stale
                    await post(answer, signed(answer, now - 360)),
                    await post(answer, signed(answer, now + 360)),  # from the future
                    await post(answer, {**signed(answer, now), "X-Slack-Signature": "v0=00"}),
                    await post(answer + b" ", signed(answer, now)),  # tampered
                    await post(answer, {"Content-Type": "application/json"}),  # unsigned
                ]
                for response in refused:
                    assert response.status_code == 401
                    assert response.json()["error"]["code"] == "invalid_signature"
                assert slack.memos("event:") == []
                assert await events_of(rt, r.session_id) == before
                # signed but unreadable: named, nothing taken
                for body in (
                    b"not json",
                    b"[1]",
                    json.dumps({"type": "event_callback", "event": "x", "event_id": "E"}).encode(),
                    json.dumps({"type": "event_callback", "event": {"type": "message"}}).encode(),
                    event("Large").replace(b'"text": "Large"', b'"text": 5'),
                    event("Large", event_id="Ev 1\u00e9"),
                    json.dumps({"type": "url_verification", "challenge": 7}).encode(),
                ):
                    response = await post(body, signed(body, now))
                    assert response.status_code == 400, body
                    assert response.json()["error"]["code"] == "invalid_payload"
                assert slack.memos("event:") == []
                assert await events_of(rt, r.session_id) == before
                # a reply in the thread of a message this channel did not post: 200, ignored
                stray = event("Large", thread="1699999999.000001", event_id="Ev00")
                response = await post(stray, signed(stray, now))
                assert (response.status_code, response.content) == (200, b"")
                assert slack.memos("event:") == []
                # the signed reply is taken; the same signed request again is a replay
                headers = signed(answer, now)
                assert (await post(answer, headers)).status_code == 200
                assert (await post(answer, headers)).status_code == 401
                # a reply that cannot be saved is not taken: Slack is asked to retry it
                hub.state.close()
                other = event("Mint", event_id="Ev02")
                response = await post(other, signed(other, now))
                assert response.status_code == 503
                assert response.json()["error"]["code"] == "store_error"
        size, scent = r.pending
        stored = await rt.store.get_request(size.id)
        assert stored is not None and stored.status == "settled"
        stored = await rt.store.get_request(scent.id)
        assert stored is not None and stored.status == "pending"


async def test_a_request_posted_before_threads_were_remembered_still_takes_replies(
    tmp_path: Path, fake: FakeSlack
) -> None:
    async with so.Runtime([shop_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("shop", prompt="Reorder the soap")
        size, _ = r.pending
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            for key, _ in slack.memos("thread:"):
                slack.forget(key)
            await deliver(slack, event("Small"))
        stored = await rt.store.get_request(size.id)
        assert stored is not None and stored.resolution is not None
        assert stored.resolution["answer"]["value"] == "Small"


async def test_the_events_path_is_configurable_or_off_and_checked(
    tmp_path: Path, fake: FakeSlack
) -> None:
    for bad in ("events", "", 5):
        with pytest.raises(so.UsageError, match="events path"):
            channel(fake, events_path=bad)
    with pytest.raises(so.UsageError, match="both"):
        channel(fake, events_path="/channels/slack/interactivity")
    async with so.Runtime([shop_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        off = channel(fake, events_path=None)
        moved = channel(
            fake, name="slack2", events_path="/hooks/slack-events", path="/hooks/slack-clicks"
        )
        hub = ChannelHub(rt, [off, moved])
        app = create_app(rt, dev=True, channels=hub)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                body = json.dumps({"type": "url_verification", "challenge": "c"}).encode()
                assert (await http.post(EVENTS, content=body)).status_code == 404
                response = await http.post(
                    "/hooks/slack-events", content=body, headers=signed(body)
                )
                assert response.json() == {"challenge": "c"}
    # used directly, without a server: the same checks
    slack = SlackChannel("C42", token="xoxb-test", signing_secret=SECRET)
    with pytest.raises(InvalidSignature):
        await slack.handle_event(b"{}", {})
    with pytest.raises(SlackPayloadError):
        await slack.handle_event(b"{", signed(b"{"))
