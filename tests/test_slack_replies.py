"""Replies typed in the thread of a request's Slack message (the Events API endpoint).

Requests are posted to the loopback fake Slack of `_slack` through the real `slack_sdk`
client; events are signed like Slack signs them and sent to the endpoint the channel mounts on
the signoff server, or handed to `SlackChannel.handle_event`.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest

import signoff as so
from signoff.channels import ChannelHub, InvalidSignature
from signoff.channels._base import QUEUED_NOTE
from signoff.channels.slack import SlackChannel, SlackPayloadError
from signoff.channels.slack._inbox import ACK_WITHIN
from signoff.channels.slack._replies import KEEP_THREADS, RETRY_WINDOW
from signoff.server import create_app
from signoff.testing import call, call_tools, reply, scripted_agent

from ._slack import (
    ALICE,
    APPROVERS,
    SECRET,
    TEAM,
    FakeSlack,
    channel,
    manual,
    refund_runtime,
    serving,
    sign,
)

EVENTS = "/channels/slack/events"
BOT = "U0BOT"
ALLOWED = "U045EF6GH"  # on refund_runtime's allow list
FIRST_TS = "1700000000.000001"  # the fake's first post


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    slack = FakeSlack()
    await slack.start()
    try:
        yield slack
    finally:
        await slack.stop()


def event(
    text: str,
    *,
    thread: str | None = FIRST_TS,
    user: str = ALLOWED,
    event_id: str = "Ev01",
    **fields: Any,
) -> bytes:
    """An Events API `message` callback as Slack sends it: a reply in the thread `thread`."""
    message: dict[str, Any] = {
        "type": "message",
        "channel": "C42",
        "user": user,
        "text": text,
        "ts": "1700000500.000100",
        "team": TEAM,
        "channel_type": "channel",
        "event_ts": "1700000500.000100",
    }
    if thread is not None:
        message["thread_ts"] = thread
    message.update(fields)
    envelope = {
        "token": "unused",
        "team_id": TEAM,
        "api_app_id": "A0APP",
        "event": message,
        "type": "event_callback",
        "event_id": event_id,
        "event_time": 1700000500,
        "authorizations": [
            {"team_id": TEAM, "user_id": BOT, "is_bot": True, "is_enterprise_install": False}
        ],
    }
    return json.dumps(envelope).encode()


def signed(body: bytes, at: float | None = None, **extra: str) -> dict[str, str]:
    headers = sign(body, int(time.time() if at is None else at))
    return {**headers, "Content-Type": "application/json", **extra}


async def deliver(
    slack: SlackChannel, body: bytes, *, at: float | None = None, **extra: str
) -> dict[str, Any] | None:
    """Hand one signed event to the channel and wait for what it does in the background."""
    answer = await slack.handle_event(body, signed(body, at, **extra))
    await slack.idle()
    return answer


def choices(*labels: str) -> list[dict[str, str]]:
    return [{"label": label, "description": f"The {label.lower()} one."} for label in labels]


def shop_agent() -> so.Agent:
    """Asks two questions in one step (both open at once), then answers a follow-up."""
    size = call("ask_question", question="Which size?", options=choices("Small", "Large"))
    scent = call("ask_question", question="Which scent?", options=choices("Lemon", "Mint"))
    return scripted_agent(
        "shop",
        [call_tools(size, scent), reply("Reordered."), reply("Noted: I will tell the team.")],
        tools=[so.ask_question()],
    )


def two_refunds_runtime(tmp_path: Path, log: list[Any]) -> so.Runtime:
    """Two approvals open at once: a refund tool whose policy allow-lists ALLOWED, called twice
    in one step."""

    async def allow_listed(ctx: so.ResponseContext) -> Literal["allowed", "rejected"]:
        who = ctx.response.principal
        return "allowed" if who is not None and who.principal_id in APPROVERS else "rejected"

    @so.tool(approval=so.ApprovalSpec(request=so.always(), response=allow_listed))
    async def issue_refund(order_id: str, amount: float, reason: str) -> dict[str, Any]:
        """Refund an order."""
        log.append((order_id, amount))
        return {"refunded": amount}

    twice = call_tools(
        call("issue_refund", order_id="1042", amount=180, reason="arrived broken"),
        call("issue_refund", order_id="1043", amount=20, reason="late"),
    )
    agent = scripted_agent("support", [twice, reply("Done.")], tools=[issue_refund])
    return so.Runtime([agent], store=f"sqlite:///{tmp_path / 'state.db'}")


def default_policy_runtime(tmp_path: Path) -> so.Runtime:
    """An approval only the person whose turn asked (alice) may settle: the default policy."""

    @so.tool(approval=so.ApprovalSpec(request=so.always()))
    async def delete_branch(name: str) -> str:
        """Delete a branch."""
        return name

    agent = scripted_agent(
        "git",
        [call_tools(call("delete_branch", name="main")), reply("Gone.")],
        tools=[delete_branch],
    )
    return so.Runtime([agent], store=f"sqlite:///{tmp_path / 'state.db'}")


async def events_of(rt: so.Runtime, session_id: str) -> list[so.Event]:
    return [e async for e in rt.events(session_id, follow=False)]


async def test_a_typed_reply_answers_the_first_open_question_whichever_thread_it_is_in(
    store_url: str, tmp_path: Path, fake: FakeSlack
) -> None:
    async with so.Runtime([shop_agent()], store=store_url) as rt:
        r = await rt.generate("shop", prompt="Reorder the soap")  # no principal: anyone answers
        size, scent = r.pending
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack], state=tmp_path / "hub.db")) as hub:
            await hub.poll()
            assert len(fake.of("chat.postMessage")) == 2
            second_ts = "1700000000.000002"
            # In the second question's thread, mentioning the bot, with Slack's escapes: it
            # still answers the first open question, as free text, as the person who typed it.
            body = event(f"<@{BOT}> 1 l &amp; no &lt;pump&gt;", thread=second_ts, user="U5")
            assert await deliver(slack, body) is None
            stored = await rt.store.get_request(size.id)
            assert stored is not None and stored.status == "settled"
            assert stored.resolution is not None
            assert stored.resolution["answer"] == {
                "value": "1 l & no <pump>",
                "option_id": None,
                "text": "1 l & no <pump>",
            }
            assert stored.resolution["by"]["principal_id"] == f"slack:{TEAM}:U5"
            still = await rt.store.get_request(scent.id)
            assert still is not None and still.status == "pending"
            # An option's label answers the next one; a reply broadcast to the channel counts.
            body = event("mint", event_id="Ev02", subtype="thread_broadcast", user="U5")
            await deliver(slack, body)
            await hub.poll()
        stored = await rt.store.get_request(scent.id)
        assert stored is not None and stored.resolution is not None
        assert stored.resolution["answer"]["value"] == "Mint"
        state = await rt.state(r.session_id)
        assert state.turn is not None and state.turn.status == "completed"
        assert state.turn.text == "Reordered."
        # Both messages were updated in place as answered; nobody was told anything else.
        assert len(fake.of("chat.update")) == 2
        assert fake.of("chat.postEphemeral") == []


async def test_typed_approve_and_deny_settle_approvals_in_order_as_the_policy_allows(
    tmp_path: Path, fake: FakeSlack
) -> None:
    log: list[Any] = []
    async with two_refunds_runtime(tmp_path, log) as rt:
        r = await rt.generate("support", prompt="Refund both orders", auth=ALICE)
        first, second = r.pending
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            # "approve" in the second request's thread approves the first one (asked first).
            await deliver(slack, event("Approve", thread="1700000000.000002"))
            one = await rt.store.get_request(first.id)
            two = await rt.store.get_request(second.id)
            assert one is not None and one.outcome == "approved"
            assert one.resolution is not None
            assert one.resolution["by"]["principal_id"] == f"slack:{TEAM}:{ALLOWED}"
            assert two is not None and two.status == "pending"
            await deliver(slack, event("deny", event_id="Ev02"))  # the label Deny, any case
            await hub.poll()
        two = await rt.store.get_request(second.id)
        assert two is not None and two.outcome == "cancelled"
        assert log == [("1042", 180)]
        turn = (await rt.state(r.session_id)).turn
        assert turn is not None and turn.status == "completed"
        assert fake.of("chat.postEphemeral") == []


async def test_a_reply_the_response_policy_refuses_changes_nothing_and_is_told(
    tmp_path: Path, fake: FakeSlack
) -> None:
    log: list[Any] = []
    async with refund_runtime(tmp_path, log) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        (req,) = r.pending
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            await deliver(slack, event("approve", user="U999MALLORY"))
            await hub.poll()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"
        kinds = [e.type for e in await events_of(rt, r.session_id)]
        assert "turn.message" not in kinds
        assert fake.of("chat.postEphemeral") == [
            {
                "channel": "C42",
                "user": "U999MALLORY",
                "text": "Your answer was not accepted (rejected).",
                "thread_ts": FIRST_TS,
            }
        ]
        assert fake.of("chat.update") == []
        assert log == []


async def test_a_reply_from_someone_the_default_policy_refuses_sends_nothing(
    tmp_path: Path, fake: FakeSlack
) -> None:
    async with default_policy_runtime(tmp_path) as rt:
        r = await rt.generate("git", prompt="Delete main", auth=ALICE)
        (req,) = r.pending
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            before = await events_of(rt, r.session_id)
            # Neither an answer nor a message: as a message it would wait for the turn's end.
            await deliver(slack, event("approve"))
            await deliver(slack, event("please keep main", event_id="Ev02"))
            await hub.poll()
        assert await events_of(rt, r.session_id) == before
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"
        note = f"You may not answer request {req.id}: nothing was sent."
        assert [e["text"] for e in fake.of("chat.postEphemeral")] == [note, note]
        assert {e["thread_ts"] for e in fake.of("chat.postEphemeral")} == {FIRST_TS}


async def test_a_reply_after_the_request_closed_is_an_ordinary_message_to_the_session(
    tmp_path: Path, fake: FakeSlack
) -> None:
    async with so.Runtime([shop_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("shop", prompt="Reorder the soap")
        size, scent = r.pending
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            await rt.respond(
                r.session_id,
                [
                    so.InputResponse(request_id=size.id, text="Large"),
                    so.InputResponse(request_id=scent.id, text="Mint"),
                ],
            )
            await hub.poll()  # both messages updated as answered: the threads stay open
            assert len(fake.of("chat.update")) == 2
            await deliver(slack, event("Also tell the team, please", user="U5"))
        state = await rt.state(r.session_id)
        assert state.turn is not None and state.turn.status == "completed"
        assert state.turn.text == "Noted: I will tell the team."
        assert state.turn.principal is not None
        assert state.turn.principal.principal_id == f"slack:{TEAM}:U5"
        assert fake.of("chat.postEphemeral") == []


async def test_a_reply_from_someone_the_waiting_turn_does_not_serve_is_told_it_waits(
    tmp_path: Path, fake: FakeSlack
) -> None:
    """A reply that answers nothing, from an approver other than the person the turn serves, is
    queued for the turn's end (it neither answers nor steers): an ephemeral note in the thread
    tells them so, once, also when Slack's retry of the event is sent again."""
    log: list[Any] = []
    async with refund_runtime(tmp_path, log) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        (req,) = r.pending
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack], state=tmp_path / "hub.db")) as hub:
            await hub.poll()
            body = event("Is the customer on the premium plan?")
            await deliver(slack, body)
            await deliver(slack, body, at=time.time() + 1, **{"X-Slack-Retry-Num": "1"})
            await hub.poll()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"
        state = await rt.state(r.session_id)
        assert [m["message"] for m in state.queued] == ["Is the customer on the premium plan?"]
        assert fake.of("chat.postEphemeral") == [
            {"channel": "C42", "user": ALLOWED, "text": QUEUED_NOTE, "thread_ts": FIRST_TS}
        ]
        assert log == []


async def test_a_delivery_slack_retries_acts_once(
    tmp_path: Path, fake: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with so.Runtime([shop_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("shop", prompt="Reorder the soap")
        sent: list[str] = []
        send = rt.send

        async def counted(session_id: str, message: str, **kwargs: Any) -> so.GenerateResult:
            sent.append(message)
            return await send(session_id, message, **kwargs)

        monkeypatch.setattr(rt, "send", counted)
        size, scent = r.pending
        state_file = tmp_path / "hub.db"
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack], state=state_file)) as hub:
            await hub.poll()
            body = event("Large")
            await deliver(slack, body)
            # Signed anew, with Slack's retry headers; and one reaching another process that
            # shares the channel state (a fresh channel here): none acts again.
            for retry in (1, 2):
                at = time.time() + retry
                await deliver(slack, body, at=at, **{"X-Slack-Retry-Num": str(retry)})
            other = channel(fake)
            other.bind(rt, hub.state, hub=hub.name)
            await deliver(other, body, at=time.time() + 3, **{"X-Slack-Retry-Num": "3"})
        one = await rt.store.get_request(size.id)
        two = await rt.store.get_request(scent.id)
        assert one is not None and one.resolution is not None
        assert one.resolution["answer"]["value"] == "Large"
        assert two is not None and two.status == "pending"  # "Large" is no scent, but text
        assert sent == ["Large"]  # the retries were not even sent with the same key


async def test_a_reply_meeting_a_locked_state_file_gets_a_503_in_time_and_stalls_nothing(
    tmp_path: Path, fake: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process holding the channel state's write lock: the event waits for it off the
    event loop (another request is answered meanwhile) and gets a 503 before Slack's 3 s, with
    nothing saved or sent; once the lock is gone, Slack's retry is sent, once."""
    async with so.Runtime([shop_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("shop", prompt="Reorder the soap")
        sent: list[str] = []
        send = rt.send

        async def counted(session_id: str, message: str, **kwargs: Any) -> so.GenerateResult:
            sent.append(message)
            return await send(session_id, message, **kwargs)

        monkeypatch.setattr(rt, "send", counted)
        size, _ = r.pending
        async with serving(rt, fake, tmp_path / "hub.db") as (slack, hub, app):
            assert slack.replies.inbox.ack_within == ACK_WITHIN < 3
            transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 5000))
            async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
                other = sqlite3.connect(tmp_path / "hub.db", isolation_level=None)
                other.execute("BEGIN IMMEDIATE")
                body = event("Large")

                async def post() -> tuple[httpx.Response, float]:
                    began = time.monotonic()
                    response = await http.post(EVENTS, content=body, headers=signed(body))
                    return response, time.monotonic() - began

                posting = asyncio.create_task(post())
                await asyncio.sleep(0.3)  # the event is waiting for the lock by now
                looked = await http.get(f"/v1/requests/{size.id}")
                assert looked.status_code == 200 and looked.json()["status"] == "pending"
                assert not posting.done()  # answered while the event waits
                response, took = await posting
                assert response.status_code == 503
                assert response.json()["error"]["code"] == "store_error"
                assert took < 4.5  # the 2 s deadline, not the 5 s busy timeout (slack for load)
                await slack.idle()
                assert slack.memos("event:") == []
                assert sent == []
                other.execute("ROLLBACK")
                other.close()
                for retry in (1, 2):  # Slack's retries, signed anew
                    headers = signed(body, time.time() + retry, **{"X-Slack-Retry-Num": str(retry)})
                    response = await http.post(EVENTS, content=body, headers=headers)
                    assert (response.status_code, response.content) == (200, b"")
                    await slack.idle()
        stored = await rt.store.get_request(size.id)
        assert stored is not None and stored.resolution is not None
        assert stored.resolution["answer"]["value"] == "Large"
        assert sent == ["Large"]


async def test_a_retry_signed_as_the_reply_that_got_a_503_is_taken_not_refused_as_a_replay(
    tmp_path: Path, fake: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slack may retry a delivery it had a 503 for with the same signature: a request that
    failed after it verified (nothing was taken) leaves no trace in the replay check, so that
    retry is taken, once; a request that got its 200 stays refused as a replay."""
    async with so.Runtime([shop_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("shop", prompt="Reorder the soap")
        size, _ = r.pending
        async with serving(rt, fake, tmp_path / "hub.db") as (slack, hub, app):
            remember = hub.state.remember

            def refusing(channel_name: str, key: str, value: Any, **hub: str) -> None:
                if key.startswith("event:"):
                    raise so.StoreError("channel state: cannot save a memo: disk I/O error")
                remember(channel_name, key, value, **hub)

            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                body = event("Large")
                headers = signed(body)
                monkeypatch.setattr(hub.state, "remember", refusing)
                assert (await http.post(EVENTS, content=body, headers=headers)).status_code == 503
                monkeypatch.setattr(hub.state, "remember", remember)
                response = await http.post(EVENTS, content=body, headers=headers)
                assert (response.status_code, response.content) == (200, b"")
                await slack.idle()
                again = await http.post(EVENTS, content=body, headers=headers)
                assert again.status_code == 401
                assert again.json()["error"]["code"] == "invalid_signature"
            assert len(slack.memos("event:")) == 1
            await hub.poll()
        stored = await rt.store.get_request(size.id)
        assert stored is not None and stored.resolution is not None
        assert stored.resolution["answer"]["value"] == "Large"


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


async def test_a_reply_acknowledged_before_a_crash_is_sent_by_the_next_start_once(
    store_url: str, tmp_path: Path, fake: FakeSlack
) -> None:
    async with so.Runtime([shop_agent()], store=store_url) as rt:
        r = await rt.generate("shop", prompt="Reorder the soap")
        size, scent = r.pending
        state_file = tmp_path / "hub.db"
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack], state=state_file)) as hub:
            await hub.poll()
            await slack.handle_event(event("Large"), signed(event("Large")))
            # The process dies once Slack has its 200: the work it spawned never runs.
            for task in list(slack._tasks):
                task.cancel()
            await asyncio.gather(*slack._tasks, return_exceptions=True)
            (saved,) = slack.memos("event:")
            assert saved[1]["state"] == "pending"
        stored = await rt.store.get_request(size.id)
        assert stored is not None and stored.status == "pending"
        again = channel(fake)
        async with manual(ChannelHub(rt, [again], state=state_file)):
            await again.idle()  # the start resumed it
            ((_, memo),) = again.memos("event:")
            assert memo["state"] == "done"
            # Killed after sending and before marking it done: the next start sends it again,
            # and its idempotency key (the event id) keeps it from answering twice.
            again.remember("event:Ev01", saved[1])
        stored = await rt.store.get_request(size.id)
        assert stored is not None and stored.resolution is not None
        assert stored.resolution["answer"]["value"] == "Large"
        third = channel(fake)
        async with manual(ChannelHub(rt, [third], state=state_file)):
            await third.idle()
        still = await rt.store.get_request(scent.id)
        assert still is not None and still.status == "pending"
        messages = [e for e in await events_of(rt, r.session_id) if e.type == "input.resolved"]
        assert len(messages) == 1


async def test_old_events_and_threads_are_forgotten_and_lost_replies_resumed_on_ticks(
    tmp_path: Path, fake: FakeSlack
) -> None:
    clock = [1_800_000_000.0]
    async with so.Runtime([shop_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("shop", prompt="Reorder the soap")
        size, scent = r.pending
        slack = channel(fake, clock=lambda: clock[0])
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            threads = dict(slack.memos("thread:"))
            assert threads == {
                "thread:C42:1700000000.000001": {"request_id": size.id},
                "thread:C42:1700000000.000002": {"request_id": scent.id},
            }
            await deliver(slack, event("Large"), at=clock[0])
            await hub.poll()  # the first request closed: its thread is kept, marked closed
            threads = dict(slack.memos("thread:"))
            assert threads["thread:C42:1700000000.000001"]["closed_at"] > 0
            # Another process took a reply and died (its memo is pending, its task gone).
            lost = {
                "state": "pending",
                "at": clock[0],
                "tries": 1,
                "event_id": "EvLost",
                "request_id": scent.id,
                "team": TEAM,
                "user": "U5",
                "channel": "C42",
                "thread": "1700000000.000002",
                "text": "Mint",
            }
            slack.remember("event:EvLost", lost)
            clock[0] += RETRY_WINDOW + 1
            await hub.poll()
            await slack.idle()
            # the handled event is forgotten; the lost one was sent
            (memo,) = slack.memos("event:")
            assert memo[0] == "event:EvLost" and memo[1]["state"] == "done"
            stored = await rt.store.get_request(scent.id)
            assert stored is not None and stored.resolution is not None
            assert stored.resolution["answer"]["value"] == "Mint"
            await hub.poll()
            clock[0] += KEEP_THREADS
            await hub.poll()
            assert slack.memos("thread:") == []
            # a reply in a thread forgotten is ignored
            await deliver(slack, event("More", event_id="Ev09"), at=clock[0])
            assert slack.memos("event:") == []


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
        moved = channel(fake, name="slack2", events_path="/hooks/slack-events")
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
