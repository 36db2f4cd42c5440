"""The Slack channel end to end: a request posted to a loopback Slack (`tests/_slack.py`),
answered with its buttons, menus and modals through the endpoint the channel mounts on the
signoff server, and its message updated in place; what the person who clicked is told when
the answer cannot count.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import signoff as so
from signoff.channels import ChannelHub
from signoff.channels.slack import slack_principal
from signoff.server import create_app
from signoff.testing import ManualClock

from ._slack import (
    ALICE,
    PATH,
    TEAM,
    FakeSlack,
    approval_blocks,
    channel,
    click,
    date,
    fake,
    manual,
    question_agent,
    refund_requested,
    refund_runtime,
    resolved_at,
    sign,
    slack_api,
    submission,
)

__all__ = ["fake", "slack_api"]  # the fixtures, used by name


async def test_approval_posted_approved_from_slack_and_updated_in_place(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    log: list[Any] = []
    gate = asyncio.Event()
    async with refund_runtime(tmp_path, log, gate) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        (req,) = r.pending
        slack = channel(slack_api)
        hub = ChannelHub(rt, [slack])
        app = create_app(rt, dev=True, channels=hub)
        async with app.router.lifespan_context(app):  # the app starts and stops the hub
            await hub.poll()
            # the metadata names the request and this post's delivery (see the crash tests)
            delivery = slack_api.of("chat.postMessage")[0]["metadata"]["event_payload"]["delivery"]
            assert re.fullmatch(r"[0-9a-f]{32}", delivery)
            assert slack_api.calls == [
                (
                    "chat.postMessage",
                    {
                        "channel": "C42",
                        "text": "support wants to run issue_refund: approve or deny",
                        "blocks": approval_blocks(req),
                        "parse": "none",
                        "link_names": False,
                        "metadata": {
                            "event_type": "signoff_request",
                            "event_payload": {"request_id": req.id, "delivery": delivery},
                        },
                    },
                )
            ]
            assert slack_api.tokens == ["Bearer xoxb-test"]
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                body = click(
                    {
                        "action_id": "signoff.approve",
                        "block_id": f"signoff:{req.id}",
                        "value": req.id,
                        "type": "button",
                    }
                )
                response = await http.post(PATH, content=body, headers=sign(body, int(time.time())))
                # Acknowledged while the response policy is still deciding: nothing settled yet.
                assert (response.status_code, response.content) == (200, b"")
                stored = await rt.store.get_request(req.id)
                assert stored is not None and stored.status == "pending"
                gate.set()
                await slack.idle()
            stored = await rt.store.get_request(req.id)
            assert stored is not None and stored.status == "settled"
            assert stored.outcome == "approved"
            assert stored.resolution is not None
            assert stored.resolution["by"]["principal_id"] == "slack:T012AB3CD:U045EF6GH"
            assert stored.resolution["by"]["authenticator"] == "slack"
            assert len(log) == 1
            assert (await rt.state(r.session_id)).turn.status == "completed"
            await hub.poll()
        at = await resolved_at(rt, req.id)
        updates = slack_api.of("chat.update")
        blocks = approval_blocks(req)[:3] + [
            {
                "type": "context",
                "block_id": "signoff.resolution",
                "elements": [
                    {
                        "type": "mrkdwn",
                        "text": f":white_check_mark: *Approved* by <@U045EF6GH> {date(at)}",
                        "verbatim": True,
                    }
                ],
            }
        ]
        assert updates == [
            {
                "channel": "C42",
                "ts": "1700000000.000001",
                "text": "Approved: support wants to run issue_refund",
                "blocks": blocks,
                "parse": "none",
                "link_names": False,
            }
        ]
        assert slack_api.of("chat.postEphemeral") == []


async def test_deny_opens_a_reason_modal_and_the_reason_is_recorded(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    log: list[Any] = []
    async with refund_requested(tmp_path, log) as (rt, req):
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            body = click(
                {
                    "action_id": "signoff.deny",
                    "block_id": f"signoff:{req.id}",
                    "value": req.id,
                    "type": "button",
                },
                user="U078JK9LM",
            )
            assert await slack.handle(body, sign(body, int(time.time()))) is None
            await slack.idle()
            (opened,) = slack_api.of("views.open")
            meta = {"request_id": req.id, "channel": "C42", "user": "U078JK9LM"}
            assert opened == {
                "trigger_id": "13345224609.738474920.8088930838d88f008e0",
                "view": {
                    "type": "modal",
                    "callback_id": "signoff.deny",
                    "private_metadata": json.dumps(meta, separators=(",", ":")),
                    "title": {"type": "plain_text", "text": "Deny the call"},
                    "submit": {"type": "plain_text", "text": "Deny"},
                    "close": {"type": "plain_text", "text": "Cancel"},
                    "blocks": [
                        {
                            "type": "input",
                            "block_id": "signoff.reason",
                            "optional": True,
                            "label": {"type": "plain_text", "text": "Why deny issue_refund?"},
                            "element": {
                                "type": "plain_text_input",
                                "action_id": "reason",
                                "multiline": True,
                            },
                        }
                    ],
                },
            }
            values = {
                "signoff.reason": {
                    "reason": {"type": "plain_text_input", "value": "  over the limit  "}
                }
            }
            body = submission("signoff.deny", meta, values, user="U078JK9LM")
            assert await slack.handle(body, sign(body, int(time.time()))) is None
            await slack.idle()
            stored = await rt.store.get_request(req.id)
            assert stored is not None and (stored.status, stored.outcome) == (
                "settled",
                "cancelled",
            )
            assert stored.resolution is not None
            assert stored.resolution["by"]["principal_id"] == "slack:T012AB3CD:U078JK9LM"
            await hub.poll()
        assert len(log) == 0
        at = await resolved_at(rt, req.id)
        (update,) = slack_api.of("chat.update")
        assert update["blocks"][-1] == {
            "type": "context",
            "block_id": "signoff.resolution",
            "elements": [
                {
                    "type": "mrkdwn",
                    "text": f":x: *Denied* by <@U078JK9LM> {date(at)}: “over the limit”",
                    "verbatim": True,
                }
            ],
        }
        assert update["blocks"][:3] == approval_blocks(req)[:3]  # the request stays readable


async def test_a_responder_the_policy_rejects_is_told_and_the_request_stays_open(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    log: list[Any] = []
    async with refund_requested(tmp_path, log) as (rt, req):
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            body = click(
                {
                    "action_id": "signoff.approve",
                    "block_id": f"signoff:{req.id}",
                    "value": req.id,
                    "type": "button",
                },
                user="U999MALLORY",
            )
            await slack.handle(body, sign(body, int(time.time())))
            await slack.idle()
            await hub.poll()
            stored = await rt.store.get_request(req.id)
            assert stored is not None and stored.status == "pending"
            assert slack_api.of("chat.postEphemeral") == [
                {
                    "channel": "C42",
                    "user": "U999MALLORY",
                    "text": "Your answer was not accepted (rejected).",
                    "parse": "none",
                    "link_names": False,
                }
            ]
            assert slack_api.of("chat.update") == []
        assert len(log) == 0


async def test_questions_use_a_select_menu_and_a_free_text_modal(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    async with so.Runtime([question_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("shop", prompt="Reorder the soap")  # no principal: anyone answers
        (req,) = r.pending
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            (posted,) = slack_api.of("chat.postMessage")
            assert posted.pop("metadata")["event_payload"]["request_id"] == req.id
            assert posted == {
                "channel": "C42",
                "text": "shop asks: Which size should I reorder?",
                "parse": "none",
                "link_names": False,
                "blocks": [
                    {
                        "type": "section",
                        "block_id": "signoff.summary",
                        "text": {
                            "type": "mrkdwn",
                            "text": "*shop* asks: Which size should I reorder?\n"
                            "• *Small*: The 250 ml bottle.\n• *Large*: The 1 l bottle.",
                            "verbatim": True,
                        },
                    },
                    {
                        "type": "context",
                        "block_id": "signoff.facts",
                        "elements": [
                            {
                                "type": "mrkdwn",
                                "text": f"request `{req.id}` · session `{req.session_id}`",
                                "verbatim": True,
                            }
                        ],
                    },
                    {
                        "type": "actions",
                        "block_id": f"signoff:{req.id}",
                        "elements": [
                            {
                                "type": "static_select",
                                "action_id": "signoff.option",
                                "placeholder": {"type": "plain_text", "text": "Choose an answer"},
                                "options": [
                                    {"text": {"type": "plain_text", "text": "Small"}, "value": "1"},
                                    {"text": {"type": "plain_text", "text": "Large"}, "value": "2"},
                                ],
                            },
                            {
                                "type": "button",
                                "action_id": "signoff.text",
                                "text": {"type": "plain_text", "text": "Answer in your own words"},
                                "value": req.id,
                            },
                        ],
                    },
                ],
            }
            body = click(
                {
                    "type": "static_select",
                    "action_id": "signoff.option",
                    "block_id": f"signoff:{req.id}",
                    "selected_option": {
                        "text": {"type": "plain_text", "text": "Large"},
                        "value": "2",
                    },
                },
                user="U5",
            )
            await slack.handle(body, sign(body, int(time.time())))
            await slack.idle()
            stored = await rt.store.get_request(req.id)
            assert stored is not None and stored.resolution is not None
            assert stored.resolution["answer"] == {"value": "Large", "option_id": "2", "text": None}
            await hub.poll()  # the first message is updated, the second question is posted
            at = await resolved_at(rt, req.id)
            (update,) = slack_api.of("chat.update")
            assert update["blocks"][-1]["elements"][0]["text"] == (
                f":speech_balloon: *Answered* “Large” by <@U5> {date(at)}"
            )
            assert update["text"] == "Answered: shop asks: Which size should I reorder?"
            (second,) = await rt.pending()
            body = click(
                {
                    "type": "button",
                    "action_id": "signoff.text",
                    "block_id": f"signoff:{second.id}",
                    "value": second.id,
                },
                user="U5",
            )
            await slack.handle(body, sign(body, int(time.time())))
            await slack.idle()
            (opened,) = slack_api.of("views.open")
            assert opened["view"]["callback_id"] == "signoff.text"
            assert opened["view"]["blocks"][0]["element"]["action_id"] == "answer"
            meta = json.loads(opened["view"]["private_metadata"])
            empty = submission("signoff.text", meta, {"signoff.answer": {"answer": {"value": " "}}})
            assert await slack.handle(empty, sign(empty, int(time.time()))) == {
                "response_action": "errors",
                "errors": {"signoff.answer": "Write an answer"},
            }
            body = submission(
                "signoff.text",
                meta,
                {"signoff.answer": {"answer": {"value": "the 500 ml one"}}},
                user="U5",
            )
            assert await slack.handle(body, sign(body, int(time.time()))) is None
            await slack.idle()
            await hub.poll()
        state = await rt.state(r.session_id)
        assert state.turn is not None and state.turn.status == "completed"
        stored = await rt.store.get_request(second.id)
        assert stored is not None and stored.resolution is not None
        assert stored.resolution["answer"]["text"] == "the 500 ml one"
        assert stored.resolution["by"]["principal_id"] == "slack:T012AB3CD:U5"
        assert len(slack_api.of("chat.update")) == 2


async def test_a_click_on_a_request_settled_elsewhere_says_it_is_closed(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    log: list[Any] = []
    async with refund_runtime(tmp_path, log) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        (req,) = r.pending
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            # approved from the API by another allowed approver, before the message is updated
            await rt.respond(
                r.session_id,
                [so.InputResponse(request_id=req.id, option_id="approve")],
                principal=slack_principal(TEAM, "U078JK9LM"),
            )
            body = click({"action_id": "signoff.approve", "value": req.id, "type": "button"})
            assert await slack.handle(body, sign(body, int(time.time()))) is None
            await slack.idle()
        assert len(log) == 1  # the call ran once
        (note,) = slack_api.of("chat.postEphemeral")
        assert note["user"] == "U045EF6GH"
        assert note["text"] == (
            f"Request {req.id} is already closed: approved by slack:T012AB3CD:U078JK9LM."
        )


async def test_an_answer_the_runtime_refuses_is_told_to_the_person(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    async with so.Runtime([question_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("shop", prompt="Reorder the soap")
        (req,) = r.pending
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            # an option the question does not have (say, the menu of an older version)
            body = click(
                {
                    "type": "static_select",
                    "action_id": "signoff.option",
                    "block_id": f"signoff:{req.id}",
                    "selected_option": {"value": "7"},
                }
            )
            await slack.handle(body, sign(body, int(time.time())))
            await slack.idle()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"
        (note,) = slack_api.of("chat.postEphemeral")
        assert note["text"].startswith("Your answer was not accepted: request ")
        assert "has no option '7'" in note["text"]


async def test_a_modal_slack_will_not_open_is_told_to_the_person_who_clicked(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """Deny's reason modal not opened (the click's trigger expired, say): the person is told to
    press again rather than the click doing nothing at all; the request stays open."""
    log: list[Any] = []
    async with refund_requested(tmp_path, log) as (rt, req):
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            slack_api.failing["views.open"] = "expired_trigger_id"
            body = click({"action_id": "signoff.deny", "value": req.id, "type": "button"})
            assert await slack.handle(body, sign(body, int(time.time()))) is None
            await slack.idle()
        assert slack_api.of("chat.postEphemeral") == [
            {
                "channel": "C42",
                "user": "U045EF6GH",
                "text": "Slack could not open the form (expired_trigger_id): press the button "
                "again.",
                "parse": "none",
                "link_names": False,
            }
        ]
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"


async def test_a_late_answer_that_differs_from_the_decision_made_elsewhere_is_told_who_decided(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """Deny's modal submitted after someone approved elsewhere: the person is told the request
    is closed, how and by whom (as for a late Approve), and nothing changes."""
    log: list[Any] = []
    async with refund_runtime(tmp_path, log) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        (req,) = r.pending
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            await rt.respond(
                r.session_id,
                [so.InputResponse(request_id=req.id, option_id="approve")],
                principal=slack_principal(TEAM, "U078JK9LM"),
            )
            await hub.poll()
            audit = len(await rt.audit())
            meta = {"request_id": req.id, "channel": "C42", "user": "U045EF6GH"}
            values = {"signoff.reason": {"reason": {"value": "too much"}}}
            body = submission("signoff.deny", meta, values)
            assert await slack.handle(body, sign(body, int(time.time()))) is None
            await slack.idle()
            assert len(await rt.audit()) == audit
        assert slack_api.of("chat.postEphemeral") == [
            {
                "channel": "C42",
                "user": "U045EF6GH",
                "text": f"Request {req.id} is already closed: "
                "approved by slack:T012AB3CD:U078JK9LM.",
                "parse": "none",
                "link_names": False,
            }
        ]
        assert log == [("1042", 180.0)]


def test_an_async_or_class_clock_is_refused_when_the_channel_is_made(fake: FakeSlack) -> None:
    """The channel reads its clock without awaiting it (each request's signature age): an async
    clock's coroutine, or a `ManualClock` made of each call, was the time, and every request
    from Slack failed. Refused when the channel is made, as `Runtime` refuses them."""

    async def now() -> float:
        return time.time()

    with pytest.raises(so.UsageError, match="SlackChannel: clock must be a plain function"):
        channel(fake, clock=now)
    with pytest.raises(so.UsageError, match="SlackChannel: clock is the class ManualClock"):
        channel(fake, clock=ManualClock)
