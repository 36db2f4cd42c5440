"""What the Slack channel refuses and tells: a signed interaction of the wrong shape, or an
interaction or event naming an id no store can look up, is a `SlackPayloadError` (a 400) and
acts on nothing, a person who may not answer a request is told
exactly that, not that it can no longer be answered, and one whose answer was spent as the
request's deadline escalated it is told that, not that the request is closed."""

from __future__ import annotations

import time
import urllib.parse
from pathlib import Path
from typing import Any

import httpx
import pytest

import signoff as so
from signoff.channels import ChannelHub
from signoff.channels.slack import SlackPayloadError, slack_principal
from signoff.channels.slack._clicks import read
from signoff.server import create_app
from signoff.testing import ManualClock

from ._channels import slowly_escalating_refund
from ._slack import (
    ALICE,
    PATH,
    TEAM,
    FakeSlack,
    channel,
    click,
    fake,
    form,
    manual,
    question_agent,
    refund_requested,
    serving,
    sign,
    submission,
)
from ._slack_replies import EVENTS, FIRST_TS, deliver, event

__all__ = ["fake"]  # the fixture, used by name


def _press(user: Any, team: Any) -> dict[str, Any]:
    return {
        "type": "block_actions",
        "user": {"id": user, "team_id": team},
        "team": {"id": TEAM},
        "channel": {"id": "C42"},
        "actions": [{"action_id": "signoff.approve", "value": "req_1"}],
    }


@pytest.mark.parametrize(("user", "team"), [(12345, TEAM), ("U045EF6GH", 7)])
def test_an_interaction_whose_user_or_team_is_not_text_is_unreadable(user: Any, team: Any) -> None:
    """A number where Slack sends an id would become someone's principal (`slack:T:12345`)."""
    with pytest.raises(SlackPayloadError, match="must be strings"):
        read(_press(user, team))
    found, answer = read(_press("U045EF6GH", TEAM))
    assert found is not None and (found.user, found.team, answer) == ("U045EF6GH", TEAM, None)


async def test_a_person_who_may_not_answer_is_told_so(tmp_path: Path, fake: FakeSlack) -> None:
    """Alice's question is hers to answer: a Slack user's choice is refused as not theirs to
    make (`NotAllowed`), and the request stays open."""
    async with so.Runtime([question_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("shop", prompt="Reorder the soap", auth=ALICE)
        (req,) = r.pending
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            body = click(
                {
                    "type": "static_select",
                    "action_id": "signoff.option",
                    "block_id": f"signoff:{req.id}",
                    "selected_option": {"value": "2"},
                }
            )
            await slack.handle(body, sign(body, int(time.time())))
            await slack.idle()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"
        (note,) = fake.of("chat.postEphemeral")
        assert note["text"].startswith("You may not answer this request: "), note["text"]
        assert note["user"] == "U045EF6GH" and note["channel"] == "C42"


async def test_a_form_is_not_opened_for_a_request_closed_meanwhile(
    tmp_path: Path, fake: FakeSlack
) -> None:
    """Deny pressed on the message of a request approved elsewhere meanwhile: no reason form
    opens (its submission could only fail); the person is told the request is closed."""
    async with refund_requested(tmp_path, []) as (rt, req):
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            await rt.respond(
                req.session_id,
                [so.InputResponse(request_id=req.id, option_id="approve")],
                principal=slack_principal(TEAM, "U078JK9LM"),
            )
            body = click({"action_id": "signoff.deny", "value": req.id, "type": "button"})
            await slack.handle(body, sign(body, int(time.time())))
            await slack.idle()
        assert fake.of("views.open") == []
        (note,) = fake.of("chat.postEphemeral")
        assert note["text"] == f"Request {req.id} is no longer open."


async def test_a_request_closed_before_its_delayed_post_is_not_posted(
    tmp_path: Path, fake: FakeSlack
) -> None:
    """A request open at start whose post Slack rate-limited, and that closes before Slack
    allows posting again, is not posted then: a message with buttons for a closed request."""
    async with refund_requested(tmp_path, []) as (rt, req):
        fake.limited["chat.postMessage"] = 1
        fake.retry_after = "0"
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack])) as hub:
            assert len(fake.of("chat.postMessage")) == 1  # refused: 429
            await rt.respond(
                req.session_id,
                [so.InputResponse(request_id=req.id, option_id="approve")],
                principal=slack_principal(TEAM, "U078JK9LM"),
            )
            await hub.poll()
            await hub.poll()
            assert len(fake.of("chat.postMessage")) == 1
            assert slack.recall(f"msg:{req.id}") is None
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.outcome == "approved"


def test_a_select_outside_a_signoff_message_is_unreadable() -> None:
    """The request a select answers is named by its block (`signoff:<id>`): a block of another
    app's message names none, and must not answer request `<id>` all the same."""
    payload = _press("U045EF6GH", TEAM)
    payload["actions"] = [
        {
            "action_id": "signoff.option",
            "block_id": "other:req_1",
            "selected_option": {"value": "small"},
        }
    ]
    with pytest.raises(SlackPayloadError, match="not a signoff block"):
        read(payload)
    payload["actions"][0]["block_id"] = "signoff:req_1"
    found, _ = read(payload)
    assert found is not None and (found.request_id, found.option_id) == ("req_1", "small")


def test_another_apps_modal_submission_is_not_ours() -> None:
    """A view submission of a modal signoff did not open is acknowledged and ignored, whatever
    its metadata holds (here none)."""
    payload = {
        "type": "view_submission",
        "user": {"id": "U045EF6GH", "team_id": TEAM},
        "team": {"id": TEAM},
        "view": {"id": "V9", "callback_id": "acme.feedback", "state": {"values": {}}},
    }
    assert read(payload) == (None, None)


async def test_a_signed_payload_nested_too_deep_to_read_is_a_400_not_a_500(
    tmp_path: Path, fake: FakeSlack
) -> None:
    """JSON nested deeper than Python's parser goes (a RecursionError) in a correctly signed
    interaction, modal metadata or Events API request is a payload signoff cannot read: a 400
    `invalid_payload` on either endpoint, not a 500, and nothing is acted on."""
    deep = "[" * 100_000 + "]" * 100_000
    meta_deep = _press("U045EF6GH", TEAM) | {
        "type": "view_submission",
        "view": {"callback_id": "signoff.deny", "private_metadata": deep, "state": {}},
    }
    bodies = {
        PATH: [urllib.parse.urlencode({"payload": deep}).encode(), form(meta_deep)],
        "/channels/slack/events": [deep.encode()],
    }
    async with refund_requested(tmp_path, []) as (rt, req):
        slack = channel(fake)
        hub = ChannelHub(rt, [slack])
        app = create_app(rt, dev=True, channels=hub)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                for path, sent in bodies.items():
                    for body in sent:
                        headers = sign(body, int(time.time()))
                        response = await http.post(path, content=body, headers=headers)
                        assert response.status_code == 400, (path, response.text)
                        assert response.json()["error"]["code"] == "invalid_payload"
            await slack.idle()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"
        assert fake.of("chat.postEphemeral") == [] and fake.of("views.open") == []


async def test_a_form_naming_a_field_twice_or_not_utf8_is_a_400_and_acts_on_nothing(
    tmp_path: Path, fake: FakeSlack
) -> None:
    """`payload=<approve>&payload=<deny>` was read as its first payload (another parser, a
    gateway's or a log's, reads the last), so the approval was taken; a percent-escape that is
    not UTF-8 was read as U+FFFD. Slack sends each field once, in UTF-8: either is a 400
    `invalid_payload` and nothing is answered, posted or opened."""
    async with refund_requested(tmp_path, []) as (rt, req):
        approve = click({"action_id": "signoff.approve", "value": req.id, "type": "button"})
        deny = click({"action_id": "signoff.deny", "value": req.id, "type": "button"})
        named = click(
            {"action_id": "signoff.approve", "value": req.id, "type": "button"}, user="U078JK9LM"
        )
        assert b"%22someone%22" in named
        bodies = {
            "approve, then deny": approve + b"&" + deny,
            "deny, then approve": deny + b"&" + approve,
            "the same payload twice": approve + b"&" + approve,
            "an empty second": approve + b"&payload=",
            "an escape not UTF-8": named.replace(b"%22someone%22", b"%22some%E9one%22"),
        }
        slack = channel(fake)
        hub = ChannelHub(rt, [slack])
        app = create_app(rt, dev=True, channels=hub)
        async with app.router.lifespan_context(app):
            await hub.poll()
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                for name, body in bodies.items():
                    headers = sign(body, int(time.time()))
                    response = await http.post(PATH, content=body, headers=headers)
                    assert response.status_code == 400, (name, response.text)
                    error = response.json()["error"]
                    assert error["code"] == "invalid_payload", (name, error)
                    await slack.idle()
                    stored = await rt.store.get_request(req.id)
                    assert stored is not None and stored.status == "pending", name
                assert fake.of("chat.postEphemeral") == [] and fake.of("views.open") == []
                assert fake.of("chat.update") == []
                # each payload once, in UTF-8, is read
                response = await http.post(
                    PATH, content=approve, headers=sign(approve, int(time.time()))
                )
                assert response.status_code == 200, response.text
                await slack.idle()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.outcome == "approved"


async def test_a_signed_request_naming_an_id_with_a_lone_surrogate_is_a_400(
    tmp_path: Path, fake: FakeSlack
) -> None:
    """JSON can escape a lone surrogate (`"\\ud800"`), which no store can look up: a reply
    whose thread or channel held one was a 500 (`internal_error`, the store's
    UnicodeEncodeError), and a press whose request id held one was taken (a 200) and failed in
    the background. Either endpoint refuses such an id, a 400 `invalid_payload`, and nothing
    is saved, answered or told."""
    lone = "\ud800"
    async with refund_requested(tmp_path, []) as (rt, req):
        press = {"action_id": "signoff.approve", "value": req.id, "type": "button"}
        meta = {"request_id": req.id, "channel": "C42", "user": "U045EF6GH"}
        bodies = {
            "reply's thread": (EVENTS, event("deny", thread=lone)),
            "reply's channel": (EVENTS, event("deny", channel=lone)),
            "reply's author": (EVENTS, event("deny", user=lone)),
            "press's request": (PATH, click(press | {"value": lone})),
            "press's author": (PATH, click(press, user=lone)),
            "form's request": (PATH, submission("signoff.deny", meta | {"request_id": lone}, {})),
            "form's channel": (PATH, submission("signoff.deny", meta | {"channel": lone}, {})),
        }
        async with serving(rt, fake, tmp_path / "hub.db") as (slack, _, app):
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            answers = {}
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                for name, (path, body) in bodies.items():
                    headers = sign(body, int(time.time()))
                    response = await http.post(path, content=body, headers=headers)
                    await slack.idle()
                    error = response.json().get("error", {}) if response.content else {}
                    said = "lone surrogate" in error.get("message", "")
                    answers[name] = (response.status_code, error.get("code"), said)
            assert answers == dict.fromkeys(bodies, (400, "invalid_payload", True))
            assert slack.memos("event:") == [] and slack.memos("click:") == []
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"
        assert fake.of("chat.postEphemeral") == [] and fake.of("chat.update") == []


@pytest.mark.parametrize("how", ["click", "reply"])
async def test_an_answer_the_deadline_escalated_meanwhile_is_told_not_accepted(
    tmp_path: Path, fake: FakeSlack, how: str
) -> None:
    """Approve, pressed or typed in the thread, is spent as the deadline escalates the request
    while the policy judges it: the person is told their answer was not accepted and why; the
    request stays open to the group, its message updated with its buttons, and a second
    press settles it. A press was told "Request ... is already closed: settled by the
    policy.", a typed reply nothing."""
    clock = ManualClock()
    agent = slowly_escalating_refund(clock)
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}", clock=clock) as rt:
        (req,) = (await rt.generate("support", prompt="Refund A-1", auth=ALICE)).pending
        slack = channel(fake)
        approve = click({"action_id": "signoff.approve", "value": req.id, "type": "button"})
        async with manual(ChannelHub(rt, [slack], clock=clock)) as hub:
            await hub.poll()
            if how == "click":
                await slack.handle(approve, sign(approve, int(time.time())))
                await slack.idle()
            else:
                await deliver(slack, event("approve"))
            stored = await rt.store.get_request(req.id)
            assert stored is not None and stored.status == "pending"
            assert stored.request.escalated_to == "finance"
            (note,) = fake.of("chat.postEphemeral")
            assert note["text"] == (
                "Your answer was not accepted (stale: the deadline passed before this response"
                f" could settle it (request {req.id}); it was escalated to 'finance')."
            )
            assert note.get("thread_ts") == (None if how == "click" else FIRST_TS)
            await hub.poll()
            (posted,) = fake.of("chat.postMessage")
            (escalated,) = fake.of("chat.update")
            assert "escalated to *finance*" in escalated["blocks"][2]["elements"][0]["text"]
            assert escalated["blocks"][3] == posted["blocks"][3]  # Approve / Deny stay
            again = click(
                {"action_id": "signoff.approve", "value": req.id, "type": "button"},
                trigger="13345224609.738474920.8088930838d88f008e1",
            )
            await slack.handle(again, sign(again, int(time.time())))
            await slack.idle()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.outcome == "approved"
        assert len(fake.of("chat.postEphemeral")) == 1
