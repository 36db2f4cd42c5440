"""The Slack channel against a Slack-compatible Web API on loopback (slack_sdk with `base_url`).

The fake records every API call with its parsed body (JSON or form), so the tests assert the
exact Block Kit payloads posted and updated. Interactions are signed like Slack signs them and
sent to the endpoint the channel mounts on the signoff server.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import re
import signal
import socket
import sys
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import aiohttp
import httpx
import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult
from fastapi import FastAPI
from slack_sdk.web.async_client import AsyncWebClient

import signoff as so
from signoff.channels import Channel, ChannelHub, InvalidSignature
from signoff.channels.slack import SlackChannel, slack_principal
from signoff.channels.slack._adopt import retry_handlers
from signoff.server import create_app
from signoff.stores import promptly
from signoff.stores._prompt import is_prompt
from signoff.testing import call, call_tools, reply, scripted_agent

from ._procs import ROOT, make_agent, sqlite_url


@asynccontextmanager
async def manual(hub: ChannelHub) -> AsyncIterator[ChannelHub]:
    """A started hub that reads the trail only when the test calls `poll()`."""
    await hub.start(follow=False)
    try:
        yield hub
    finally:
        await hub.stop()


SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
TEAM = "T012AB3CD"
APPROVERS = ["slack:T012AB3CD:U045EF6GH", "slack:T012AB3CD:U078JK9LM"]
ALICE = so.Principal(authenticator="web", principal_id="alice")
PATH = "/channels/slack/interactivity"


class FakeSlack:
    """A Slack Web API on loopback: records calls, answers like Slack does."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.tokens: list[str | None] = []
        self._ts = 0
        self.runner: web.AppRunner | None = None
        self.url = ""
        self.deleted: set[str] = set()  # messages someone deleted in Slack
        self.limited: dict[str, int] = {}  # method -> how many calls to answer with 429
        self.retry_after = "1"
        self.failing: dict[str, str] = {}  # method -> the error it answers with
        self.slow: dict[str, float] = {}  # method -> seconds it takes to answer (once recorded)
        self.down: dict[str, int] = {}  # method -> how many calls to answer with an HTTP 503
        # method -> how many calls a gateway answers with a 504 after Slack carried them out
        self.lost: dict[str, int] = {}
        self.dropped: dict[str, int] = {}  # ... and closes the connection after carrying out
        # channel -> its messages, oldest first, as conversations.history returns them
        self.messages: dict[str, list[dict[str, Any]]] = {}
        self.real_ts = False  # message ts from the wall clock, as Slack's (else 1700000000.n)
        self.on_post: Callable[[dict[str, Any]], None] | None = None  # once Slack has a post
        self.triggers: set[str] = set()  # trigger ids views.open used

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/api/{method}", self.handle)
        app.router.add_get("/api/{method}", self.handle)  # e.g. conversations.history
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        await web.SockSite(self.runner, sock).start()
        self.url = f"http://127.0.0.1:{port}/api/"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def handle(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        raw = await request.read()
        if request.method == "GET":
            body = dict(request.query)
        elif request.content_type == "application/json":
            body = json.loads(raw)
        else:
            body = {k: v[0] for k, v in urllib.parse.parse_qs(raw.decode()).items()}
            for key in ("blocks", "view"):
                if isinstance(body.get(key), str):
                    body[key] = json.loads(body[key])
        self.calls.append((method, body))
        self.tokens.append(request.headers.get("Authorization"))
        if method in self.slow:
            await asyncio.sleep(self.slow[method])
        refused = (
            refusal(body.get("blocks")) if method in ("chat.postMessage", "chat.update") else None
        )
        if refused is not None:
            return web.json_response({"ok": False, "error": "invalid_blocks", "why": refused})
        if self.limited.get(method, 0) > 0:
            self.limited[method] -= 1
            return web.json_response(
                {"ok": False, "error": "ratelimited"},
                status=429,
                headers={"Retry-After": self.retry_after},
            )
        if self.down.get(method, 0) > 0:
            self.down[method] -= 1
            return web.Response(status=503, text="<html>upstream unavailable</html>")
        if method in self.failing:
            error = self.failing[method]
            needed = {"needed": HISTORY_SCOPE, "provided": "chat:write"}
            extra = needed if error == "missing_scope" and method == HISTORY else {}
            return web.json_response({"ok": False, "error": error, **extra})
        if method == "chat.postMessage":
            self._ts += 1
            ts = f"{time.time():.6f}" if self.real_ts else f"1700000000.{self._ts:06d}"
            message: dict[str, Any] = {"type": "message", "ts": ts, "text": body["text"]}
            message.update({k: body[k] for k in ("blocks", "metadata") if k in body})
            self.messages.setdefault(body["channel"], []).append(message)
            if self.on_post is not None:
                self.on_post(message)
            if self.lost.get(method, 0) > 0:
                self.lost[method] -= 1
                return web.Response(status=504, text="<html>gateway timeout</html>")
            if self.dropped.get(method, 0) > 0 and request.transport is not None:
                self.dropped[method] -= 1
                request.transport.abort()  # no answer at all: the client sees a disconnect
                return web.Response(status=200)
            return web.json_response({"ok": True, "channel": body["channel"], "ts": ts})
        if method == "chat.update" and body["ts"] in self.deleted:
            return web.json_response({"ok": False, "error": "message_not_found"})
        if method == "chat.update":
            for message in self.messages.get(body["channel"], []):
                if message["ts"] == body["ts"]:
                    message["text"], message["blocks"] = body["text"], body.get("blocks")
            return web.json_response({"ok": True, "channel": body["channel"], "ts": body["ts"]})
        if method == HISTORY:
            return web.json_response(self.history(body))
        if method == "chat.postEphemeral":
            return web.json_response({"ok": True, "message_ts": "1700000099.000001"})
        if method == "views.open":
            # A trigger opens one view: used again, Slack refuses it.
            if body["trigger_id"] in self.triggers:
                return web.json_response({"ok": False, "error": "invalid_trigger_id"})
            self.triggers.add(body["trigger_id"])
            if self.dropped.get(method, 0) > 0 and request.transport is not None:
                self.dropped[method] -= 1
                request.transport.abort()  # the form is open; the client sees a disconnect
                return web.Response(status=200)
            return web.json_response({"ok": True, "view": {"id": "V1"}})
        return web.json_response({"ok": False, "error": "unknown_method"})

    def of(self, method: str) -> list[dict[str, Any]]:
        return [body for m, body in self.calls if m == method]

    def history(self, query: dict[str, str]) -> dict[str, Any]:
        """conversations.history as Slack answers it: newest first, between `oldest` and
        `latest` (exclusive unless `inclusive`), `limit` a page with a cursor to the next, and
        message metadata only with `include_all_metadata`."""
        if query["channel"] not in self.messages:
            return {"ok": False, "error": "channel_not_found"}
        inclusive = query.get("inclusive") in ("1", "true")
        oldest, latest = float(query.get("oldest", 0)), float(query.get("latest", 1e11))
        found = [
            m
            for m in reversed(self.messages[query["channel"]])
            if m["ts"] not in self.deleted
            and (
                oldest <= float(m["ts"]) <= latest
                if inclusive
                else oldest < float(m["ts"]) < latest
            )
        ]
        start = int(query.get("cursor") or 0)
        limit = int(query.get("limit", 100))
        page = found[start : start + limit]
        if query.get("include_all_metadata") not in ("1", "true"):
            page = [{k: v for k, v in m.items() if k != "metadata"} for m in page]
        more = start + limit < len(found)
        return {
            "ok": True,
            "messages": page,
            "has_more": more,
            "response_metadata": {"next_cursor": str(start + limit) if more else ""},
        }


HISTORY = "conversations.history"
HISTORY_SCOPE = "channels:history,groups:history,mpim:history,im:history"


def refusal(blocks: Any) -> str | None:
    """Why Slack would refuse these blocks (`invalid_blocks`), or None: Block Kit's documented
    limits, and text that is not valid Unicode (a lone surrogate JSON escaped)."""
    if blocks is None:
        return None
    if len(blocks) > 50:
        return "more than 50 blocks"
    try:
        json.dumps(blocks, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return "text that is not valid Unicode"
    for block in blocks:
        texts = [block["text"]] if "text" in block else []
        texts += [e for e in block.get("elements", []) if e.get("type") in ("mrkdwn", "plain_text")]
        for text in texts:
            if not text["text"] or len(text["text"]) > 3000:
                return f"a text of {len(text['text'])} characters in {block['block_id']}"
        for element in block.get("elements", []) if block["type"] == "actions" else []:
            if element["type"] == "button" and (
                len(element["text"]["text"]) > 75 or len(element["value"]) > 2000
            ):
                return "a button's text over 75 or value over 2000 characters"
            groups = element.get("option_groups", [])
            if len(groups) > 100 or any(len(g["options"]) > 100 for g in groups):
                return "more than 100 option groups or options in a group"
            options = element.get("options", []) + [o for g in groups for o in g["options"]]
            if "options" in element and len(element["options"]) > 100:
                return "more than 100 options"
            for o in options:
                if not o["text"]["text"] or len(o["text"]["text"]) > 75 or len(o["value"]) > 150:
                    return f"an option's text over 75 or value over 150 characters: {o}"
    return None


@pytest.fixture
async def slack_api() -> AsyncIterator[FakeSlack]:
    fake = FakeSlack()
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


def sign(body: bytes, timestamp: int, secret: str = SECRET) -> dict[str, str]:
    base = f"v0:{timestamp}:".encode() + body
    digest = hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
    return {
        "X-Slack-Request-Timestamp": str(timestamp),
        "X-Slack-Signature": f"v0={digest}",
        "Content-Type": "application/x-www-form-urlencoded",
    }


def form(payload: dict[str, Any]) -> bytes:
    return urllib.parse.urlencode({"payload": json.dumps(payload)}).encode()


def click(
    action: dict[str, Any],
    user: str = "U045EF6GH",
    ts: str = "1700000000.000001",
    trigger: str = "13345224609.738474920.8088930838d88f008e0",
) -> bytes:
    return form(
        {
            "type": "block_actions",
            "user": {"id": user, "username": "someone", "team_id": TEAM},
            "team": {"id": TEAM, "domain": "acme"},
            "container": {"type": "message", "message_ts": ts, "channel_id": "C42"},
            "channel": {"id": "C42", "name": "approvals"},
            "trigger_id": trigger,
            "actions": [action],
        }
    )


def submission(
    callback_id: str, meta: dict[str, Any], values: dict[str, Any], user: str = "U045EF6GH"
) -> bytes:
    return form(
        {
            "type": "view_submission",
            "user": {"id": user, "team_id": TEAM},
            "team": {"id": TEAM},
            "view": {
                "id": "V1",
                "callback_id": callback_id,
                "private_metadata": json.dumps(meta),
                "state": {"values": values},
            },
        }
    )


def refund_runtime(tmp_path: Path, log: list[Any], gate: asyncio.Event | None = None) -> Any:
    async def allow_listed(ctx: so.ResponseContext) -> Literal["allowed", "rejected"]:
        if gate is not None:
            await gate.wait()
        who = ctx.response.principal
        return "allowed" if who is not None and who.principal_id in APPROVERS else "rejected"

    @so.tool(approval=so.ApprovalSpec(request=so.always(), response=allow_listed))
    async def issue_refund(order_id: str, amount: float, reason: str) -> dict[str, Any]:
        """Refund an order."""
        log.append((order_id, amount))
        return {"refunded": amount}

    agent = scripted_agent(
        "support",
        [
            call_tools(call("issue_refund", order_id="1042", amount=180, reason="arrived broken")),
            reply("Done."),
        ],
        tools=[issue_refund],
    )
    return so.Runtime([agent], store=f"sqlite:///{tmp_path / 'state.db'}")


@asynccontextmanager
async def refund_requested(
    tmp_path: Path, log: list[Any], gate: asyncio.Event | None = None
) -> AsyncIterator[tuple[so.Runtime, so.InputRequest]]:
    """`refund_runtime`, its agent having asked Alice's approval to refund order 1042: the
    runtime and the request."""
    async with refund_runtime(tmp_path, log, gate) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        (req,) = r.pending
        yield rt, req


def channel(fake: FakeSlack, **kwargs: Any) -> SlackChannel:
    return SlackChannel(
        "C42", token="xoxb-test", base_url=fake.url, signing_secret=SECRET, **kwargs
    )


@asynccontextmanager
async def serving(
    rt: so.Runtime, fake: FakeSlack, state: Path
) -> AsyncIterator[tuple[SlackChannel, ChannelHub, FastAPI]]:
    """The app of `rt` running a hub of one Slack channel on `fake` (its state in the file
    `state`), started and polled once: the channel, the hub and the app."""
    slack = channel(fake)
    hub = ChannelHub(rt, [slack], state=state)
    app = create_app(rt, dev=True, channels=hub)
    async with app.router.lifespan_context(app):
        await hub.poll()
        yield slack, hub, app


def approval_blocks(req: so.InputRequest) -> list[dict[str, Any]]:
    """The message of an open refund approval, written out as Slack receives it."""
    return [
        {
            "type": "section",
            "block_id": "signoff.summary",
            "text": {"type": "mrkdwn", "text": "*support* wants to run `issue_refund`"},
        },
        {
            "type": "section",
            "block_id": "signoff.input",
            "text": {
                "type": "mrkdwn",
                "text": '```{\n  "order_id": "1042",\n  "amount": 180.0,\n'
                '  "reason": "arrived broken"\n}```',
            },
        },
        {
            "type": "context",
            "block_id": "signoff.facts",
            "elements": [
                {
                    "type": "mrkdwn",
                    "text": f"request `{req.id}` · session `{req.session_id}`",
                }
            ],
        },
        {
            "type": "actions",
            "block_id": f"signoff:{req.id}",
            "elements": [
                {
                    "type": "button",
                    "action_id": "signoff.approve",
                    "text": {"type": "plain_text", "text": "Approve"},
                    "style": "primary",
                    "value": req.id,
                },
                {
                    "type": "button",
                    "action_id": "signoff.deny",
                    "text": {"type": "plain_text", "text": "Deny"},
                    "style": "danger",
                    "value": req.id,
                },
            ],
        },
    ]


def date(at: float) -> str:
    shown = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(at))
    return f"<!date^{int(at)}^{{date_short_pretty}} {{time}}|{shown}>"


async def resolved_at(rt: so.Runtime, request_id: str) -> float:
    entries = [e for e in await rt.audit() if e.type == "input.resolved"]
    (entry,) = [e for e in entries if e.data["request_id"] == request_id]
    return entry.at


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
                    }
                ],
            }
        ]
        assert updates == [
            {
                "channel": "C42",
                "ts": "1700000000.000001",
                "text": "support wants to run issue_refund: approve or deny",
                "blocks": blocks,
            }
        ]
        assert slack_api.of("chat.postEphemeral") == []


async def test_only_a_validly_signed_fresh_interaction_acts(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    log: list[Any] = []
    async with refund_runtime(tmp_path, log) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        (req,) = r.pending
        now = 1_800_000_000
        slack = channel(slack_api, clock=lambda: float(now))
        hub = ChannelHub(rt, [slack])
        app = create_app(rt, dev=True, channels=hub)
        async with app.router.lifespan_context(app):
            await hub.poll()
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:

                async def post(body: bytes, headers: dict[str, str]) -> httpx.Response:
                    response = await http.post(PATH, content=body, headers=headers)
                    await slack.idle()
                    return response

                approve = click(
                    {
                        "action_id": "signoff.approve",
                        "block_id": f"signoff:{req.id}",
                        "value": req.id,
                        "type": "button",
                    }
                )
                deny = click(
                    {
                        "action_id": "signoff.deny",
                        "block_id": f"signoff:{req.id}",
                        "value": req.id,
                        "type": "button",
                    }
                )
                # invalid: signed with another secret; tampered: the body changed after signing
                bad = await post(approve, sign(approve, now, secret="not-the-secret"))
                tampered = await post(approve + b"x", sign(approve, now))
                unsigned = await post(
                    approve, {"Content-Type": "application/x-www-form-urlencoded"}
                )
                # expired: a correct signature, six minutes old (and one from the future)
                old = await post(approve, sign(approve, now - 360))
                future = await post(approve, sign(approve, now + 360))
                for response in (bad, tampered, unsigned, old, future):
                    assert response.status_code == 401
                    assert response.json()["error"]["code"] == "invalid_signature"
                stored = await rt.store.get_request(req.id)
                assert stored is not None and stored.status == "pending"
                assert slack_api.of("views.open") == []
                # valid: Deny opens the reason modal; the same request again is a replay
                headers = sign(deny, now - 10)
                assert (await post(deny, headers)).status_code == 200
                replay = await post(deny, headers)
                assert replay.status_code == 401
                assert "replay" in replay.json()["error"]["message"]
                assert len(slack_api.of("views.open")) == 1
                # a valid approval settles; its replay is refused before anything is read
                headers = sign(approve, now)
                assert (await post(approve, headers)).status_code == 200
                assert (await post(approve, headers)).status_code == 401
            stored = await rt.store.get_request(req.id)
            assert stored is not None and (stored.status, stored.outcome) == ("settled", "approved")
            assert len(log) == 1
            events = [e async for e in rt.events(r.session_id, follow=False)]
            assert [e.type for e in events].count(
                "approval.candidate"
            ) == 1  # one answer reached the policy


async def test_verify_refuses_replays_while_fresh_bad_timestamps_and_missing_headers(
    slack_api: FakeSlack,
) -> None:
    """A signed request seen once stays refused until its timestamp is too old anyway: a replay
    a minute later, inside the five minutes a fresh timestamp allows, must not act again. Each
    refusal says why: the timestamp (past or future), a replay, a missing header."""
    now = [1_800_000_000.0]
    slack = channel(slack_api, clock=lambda: now[0])
    body = click({"action_id": "signoff.approve", "block_id": "signoff:r", "value": "r"})
    headers = sign(body, int(now[0]))
    slack.verify(body, headers)
    for later in (1, 60, 299):
        now[0] = 1_800_000_000.0 + later
        with pytest.raises(InvalidSignature, match="replay"):
            slack.verify(body, headers)
    now[0] = 1_800_000_000.0 + 302  # too old now: refused for its age
    with pytest.raises(InvalidSignature, match="more than five minutes"):
        slack.verify(body, headers)
    # and one dated in the future is refused for its timestamp too, not as a bad signature
    with pytest.raises(InvalidSignature, match="more than five minutes"):
        slack.verify(body, sign(body, int(now[0]) + 360))
    # and one missing either header is refused as unsigned (not a TypeError, a 500)
    fresh = sign(body, int(now[0]))
    for missing in ("X-Slack-Request-Timestamp", "X-Slack-Signature"):
        partial = {k: v for k, v in fresh.items() if k != missing}
        with pytest.raises(InvalidSignature, match="missing"):
            slack.verify(body, partial)


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
                }
            ]
            assert slack_api.of("chat.update") == []
        assert len(log) == 0


def question_agent() -> so.Agent:
    ask = call(
        "ask_question",
        question="Which size should I reorder?",
        options=[
            {"label": "Small", "description": "The 250 ml bottle."},
            {"label": "Large", "description": "The 1 l bottle."},
        ],
    )
    return scripted_agent(
        "shop",
        [call_tools(ask), call_tools(ask), reply("Reordered.")],
        tools=[so.ask_question()],
    )


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
                "blocks": [
                    {
                        "type": "section",
                        "block_id": "signoff.summary",
                        "text": {
                            "type": "mrkdwn",
                            "text": "*shop* asks: Which size should I reorder?\n"
                            "• *Small*: The 250 ml bottle.\n• *Large*: The 1 l bottle.",
                        },
                    },
                    {
                        "type": "context",
                        "block_id": "signoff.facts",
                        "elements": [
                            {
                                "type": "mrkdwn",
                                "text": f"request `{req.id}` · session `{req.session_id}`",
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


async def test_a_restarted_hub_does_not_post_again_and_updates_from_its_memo(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    log: list[Any] = []
    async with refund_runtime(tmp_path, log) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        (req,) = r.pending
        state = tmp_path / "hub.db"
        async with manual(ChannelHub(rt, [channel(slack_api)], state=state)) as hub:
            await hub.poll()
        assert len(slack_api.of("chat.postMessage")) == 1
        # answered elsewhere (the API, the CLI) while no hub ran
        await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=req.id, option_id="approve")],
            principal=slack_principal(TEAM, "U045EF6GH"),
        )
        async with manual(ChannelHub(rt, [channel(slack_api)], state=state)) as hub:
            await hub.poll()
            await hub.poll()
        assert len(slack_api.of("chat.postMessage")) == 1
        (update,) = slack_api.of("chat.update")
        assert update["ts"] == "1700000000.000001"
        assert update["blocks"][-1]["block_id"] == "signoff.resolution"


async def test_bad_payloads_and_configuration_are_named(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    slack = channel(slack_api)
    body = b"payload=%7Bnot-json"
    with pytest.raises(so.SignoffError, match="JSON payload"):
        await slack.handle(body, sign(body, int(time.time())))
    body = form({"type": "block_actions"})
    with pytest.raises(so.SignoffError, match="unreadable Slack interaction"):
        await slack.handle(body, sign(body, int(time.time())))
    with pytest.raises(so.UsageError, match="bot token"):
        SlackChannel("C1", signing_secret=SECRET)
    with pytest.raises(so.UsageError, match="signing secret"):
        SlackChannel("C1", signing_secret=" ", token="xoxb")
    # From an environment holding invalid UTF-8: refused now, not at every request.
    with pytest.raises(so.UsageError, match="signing secret is not ASCII") as caught:
        SlackChannel("C1", signing_secret="abc\udcff", token="xoxb")
    assert "abc" not in str(caught.value)
    with pytest.raises(so.UsageError, match="bot token is not ASCII"):
        SlackChannel("C1", signing_secret=SECRET, token="xoxb-\u00e9")
    with pytest.raises(so.UsageError, match="add it to a ChannelHub"):
        await slack.on_requested(
            so.InputRequest(
                kind="question", id="req_1", session_id="s", turn_id="t", agent="a", created_at=0.0
            )
        )


async def test_a_quorum_shows_its_progress_until_it_is_met(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    runs: list[str] = []

    @so.tool(approval=so.always(approvers=2))
    async def delete_account(account_id: str) -> str:
        """Delete an account."""
        runs.append(account_id)
        return "deleted"

    agent = scripted_agent(
        "admin",
        [call_tools(call("delete_account", account_id="acct_7")), reply("Gone.")],
        tools=[delete_account],
    )
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("admin", prompt="Delete acct_7", auth=ALICE)
        (req,) = r.pending
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            for i, user in enumerate(("U1", "U1", "U2")):  # the same person twice counts once
                body = click(
                    {
                        "action_id": "signoff.approve",
                        "block_id": f"signoff:{req.id}",
                        "value": req.id,
                        "type": "button",
                        "action_ts": f"1700000100.00000{i}",
                    },
                    user=user,
                )
                await slack.handle(body, sign(body, int(time.time())))
                await slack.idle()
                await hub.poll()
        first, last = slack_api.of("chat.update")
        assert first["blocks"][2]["elements"][0]["text"] == (
            f"request `{req.id}` · session `{req.session_id}` · "
            "needs 2 approvals (1 of 2: slack:T012AB3CD:U1)"
        )
        assert first["blocks"][3]["type"] == "actions"  # still open: the buttons stay
        assert last["blocks"][3]["block_id"] == "signoff.resolution"
        assert last["blocks"][3]["elements"][0]["text"].startswith(
            ":white_check_mark: *Approved* by <@U2> "
        )
        assert [e["text"] for e in slack_api.of("chat.postEphemeral")] == [
            "Your approval was counted (1 of 2).",
            "You approved this request before (already counted: 1 of 2).",
        ]
        assert runs == ["acct_7"]


async def test_the_endpoint_is_signed_by_slack_not_by_api_tokens(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    from signoff.server import TokenAuth

    log: list[Any] = []
    async with refund_requested(tmp_path, log) as (rt, req):
        slack = channel(slack_api)
        hub = ChannelHub(rt, [slack])
        app = create_app(rt, auth=TokenAuth({"s3cret": ALICE}), channels=hub)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                assert (await http.get("/v1/requests")).status_code == 401  # the API needs a token
                body = click(
                    {
                        "action_id": "signoff.approve",
                        "block_id": f"signoff:{req.id}",
                        "value": req.id,
                        "type": "button",
                    }
                )
                response = await http.post(PATH, content=body, headers=sign(body, int(time.time())))
                assert response.status_code == 200
                await slack.idle()
                # the API token does not stand in for Slack's signature
                body2 = body + b"&x=1"
                response = await http.post(
                    PATH, content=body2, headers={"Authorization": "Bearer s3cret"}
                )
                assert response.status_code == 401
        assert len(log) == 1
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.outcome == "approved"


async def test_bytes_slack_never_signs_are_refused_as_unsigned_not_500(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """Anyone can reach the endpoints: a body that is not UTF-8 (Slack signs text) or a
    signature header with bytes past ASCII is refused with a 401 on either endpoint, not a
    500 from deep in the check, and nothing is answered."""
    log: list[Any] = []
    async with refund_runtime(tmp_path, log) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        (req,) = r.pending
        slack = channel(slack_api)
        hub = ChannelHub(rt, [slack])
        app = create_app(rt, dev=True, channels=hub)
        approve = click({"action_id": "signoff.approve", "block_id": "signoff:r", "value": req.id})
        now = int(time.time())
        latin = {k.encode(): v.encode() for k, v in sign(approve, now).items()}
        latin[b"X-Slack-Signature"] = b"v0=\xe9" + b"0" * 63
        ascii_ = {k.encode(): v.encode() for k, v in sign(b"payload=\xff\xfe", now).items()}
        cases: list[tuple[bytes, dict[bytes, bytes]]] = [
            (b"payload=\xff\xfe", ascii_),  # signed, yet not text
            (b"\xff" * 64, {k.encode(): v.encode() for k, v in sign(approve, now).items()}),
            (approve, latin),
        ]
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                for path in (PATH, "/channels/slack/events"):
                    for body, headers in cases:
                        response = await http.post(path, content=body, headers=headers)
                        assert response.status_code == 401, (path, body[:20], response.text)
                        assert response.json()["error"]["code"] == "invalid_signature"
            await slack.idle()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"
        assert log == [] and slack_api.of("chat.postEphemeral") == []


async def test_expired_and_withdrawn_requests_stay_visible_as_records(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    from signoff.testing import ManualClock

    @so.tool(approval=so.always(expires_in=60))
    async def wipe_cache(region: str) -> str:
        """Wipe a cache."""
        return "wiped"

    agent = scripted_agent(
        "ops",
        [call_tools(call("wipe_cache", region="eu")), reply("Done.")],
        tools=[wipe_cache],
        repeat_last=True,
    )
    clock = ManualClock()
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}", clock=clock) as rt:
        first = await rt.generate("ops", prompt="Wipe eu")
        (expiring,) = first.pending
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack], clock=clock)) as hub:
            await hub.poll()
            posted = slack_api.of("chat.postMessage")[0]["blocks"]
            assert posted[2]["elements"][0]["text"].endswith(
                f" · expires {date(expiring.expires_at or 0)}"
            )
            clock.advance(61)
            assert await rt.expire_due() == 1
            second = await rt.generate("ops", prompt="Wipe eu again")
            (withdrawn,) = second.pending
            await hub.poll()
            await rt.cancel(second.session_id)
            await hub.poll()
        expired_at = await resolved_at(rt, expiring.id)
        cancelled_at = await resolved_at(rt, withdrawn.id)
        first_update, second_update = slack_api.of("chat.update")
        stored = await rt.store.get_request(expiring.id)
        assert stored is not None and stored.resolution is not None
        assert first_update["blocks"][-1]["elements"][0]["text"] == (
            f":hourglass: *Expired* {date(expired_at)}: “{stored.resolution['reason']}”"
        )
        assert second_update["blocks"][-1]["elements"][0]["text"] == (
            f":no_entry_sign: *Withdrawn* {date(cancelled_at)}: “turn cancelled”"
        )
        assert first_update["blocks"][1] == posted[1]  # the exact input is still shown


async def test_an_escalated_request_says_where_it_went_and_its_group_answers_from_slack(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """The deadline passed and a worker escalated the request: its message is updated in place
    (the group instead of the passed deadline, the buttons kept), and a click by a member of the
    group settles it; the closed message still says it was escalated."""
    from signoff.testing import ManualClock

    def finance_once_escalated(ctx: so.ResponseContext) -> Literal["allowed", "rejected"]:
        who = ctx.response.principal
        member = who is not None and who.principal_id in APPROVERS
        return "allowed" if ctx.request.escalated_to == "finance" and member else "rejected"

    spec = so.ApprovalSpec(
        request=so.always(),
        response=finance_once_escalated,
        expires_in=60,
        on_timeout="escalate",
        escalate_to="finance",
    )

    @so.tool(approval=spec)
    async def wipe_cache(region: str) -> str:
        """Wipe a cache."""
        return "wiped"

    agent = scripted_agent(
        "ops", [call_tools(call("wipe_cache", region="eu")), reply("Done.")], tools=[wipe_cache]
    )
    clock = ManualClock()
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}", clock=clock) as rt:
        r = await rt.generate("ops", prompt="Wipe eu", auth=ALICE)
        (req,) = r.pending
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack], clock=clock)) as hub:
            await hub.poll()
            (posted,) = slack_api.of("chat.postMessage")
            facts = f"request `{req.id}` · session `{req.session_id}`"
            assert posted["blocks"][2]["elements"][0]["text"] == (
                f"{facts} · expires {date(req.expires_at or 0)}"
            )
            clock.advance(61)
            assert await rt.expire_due() == 1
            await hub.poll()
            await hub.poll()
            (escalated,) = slack_api.of("chat.update")
            assert (escalated["channel"], escalated["ts"]) == ("C42", "1700000000.000001")
            assert escalated["blocks"][2]["elements"][0]["text"] == (
                f"{facts} · :arrow_up: escalated to *finance*: no one decided before the deadline"
            )
            assert escalated["blocks"][:2] == posted["blocks"][:2]
            assert escalated["blocks"][3] == posted["blocks"][3]  # Approve / Deny stay
            body = click(
                {
                    "action_id": "signoff.approve",
                    "block_id": f"signoff:{req.id}",
                    "value": req.id,
                    "type": "button",
                }
            )
            await slack.handle(body, sign(body, int(time.time())))
            await slack.idle()
            await hub.poll()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.outcome == "approved"
        _, closed = slack_api.of("chat.update")
        assert closed["blocks"][2] == escalated["blocks"][2]
        assert closed["blocks"][3]["elements"][0]["text"].startswith(
            ":white_check_mark: *Approved* by <@U045EF6GH> "
        )


async def test_wrongly_typed_fields_and_absurd_timestamps_are_named_not_500(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    log: list[Any] = []
    async with refund_requested(tmp_path, log) as (rt, req):
        slack = channel(slack_api)
        hub = ChannelHub(rt, [slack])
        app = create_app(rt, dev=True, channels=hub)
        user = {"id": "U045EF6GH", "team_id": TEAM}
        meta = json.dumps({"request_id": req.id, "channel": "C42"})
        payloads: list[dict[str, Any]] = [
            {"type": "block_actions", "user": user, "team": "T1", "actions": []},
            {
                "type": "block_actions",
                "user": user,
                "team": {"id": TEAM},
                "channel": "C42",
                "actions": [{"action_id": "signoff.approve", "value": req.id}],
            },
            {
                "type": "view_submission",
                "user": user,
                "team": {"id": TEAM},
                "view": {
                    "callback_id": "signoff.deny",
                    "private_metadata": meta,
                    "state": {"values": []},
                },
            },
            {
                "type": "view_submission",
                "user": user,
                "team": {"id": TEAM},
                "view": {
                    "callback_id": "signoff.deny",
                    "private_metadata": meta,
                    "state": {"values": {"signoff.reason": {"reason": {"value": 5}}}},
                },
            },
        ]
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                for payload in payloads:
                    body = form(payload)
                    response = await http.post(
                        PATH, content=body, headers=sign(body, int(time.time()))
                    )
                    assert response.status_code == 400, (payload, response.text)
                    assert response.json()["error"]["code"] == "invalid_payload"
                # a timestamp too large for a float is refused like any other stale one
                body = click({"action_id": "signoff.approve", "value": req.id})
                huge = {**sign(body, int(time.time())), "X-Slack-Request-Timestamp": "9" * 400}
                response = await http.post(PATH, content=body, headers=huge)
                assert response.status_code == 401
                assert response.json()["error"]["code"] == "invalid_signature"
            await slack.idle()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"
        assert log == []


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


async def test_a_message_deleted_in_slack_does_not_stall_the_channel(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    # Someone deletes a request's message in Slack: updating it can never succeed, and retrying
    # for minutes must not hold back the requests that open meanwhile.
    log: list[Any] = []
    async with refund_runtime(tmp_path, log) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        (req,) = r.pending
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack], retry_backoff=3600)) as hub:
            await hub.poll()
            (posted,) = slack_api.of("chat.postMessage")
            slack_api.deleted.add("1700000000.000001")
            await rt.respond(
                r.session_id,
                [so.InputResponse(request_id=req.id, option_id="cancel")],
                principal=slack_principal(TEAM, "U078JK9LM"),
            )
            other = await rt.generate("support", prompt="Refund order 1042 again", auth=ALICE)
            await hub.poll()
            assert len(slack_api.of("chat.update")) == 1  # tried once, not retried
            assert slack.recall(f"msg:{req.id}") is None  # nothing left to update
            second = slack_api.of("chat.postMessage")[1]
            assert other.pending[0].id in json.dumps(second["blocks"])
        assert posted["channel"] == "C42"


class Recorder(Channel):
    """A channel that only notes the requests it is told about."""

    name = "recorder"

    def __init__(self) -> None:
        super().__init__()
        self.opened: list[str] = []

    async def on_requested(self, request: so.InputRequest) -> None:
        self.opened.append(request.id)


async def test_slack_rate_limits_wait_retry_after_without_holding_other_channels(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """A 429 is retried after Slack's Retry-After (not the hub's backoff, here an hour) and a
    burst of them never makes the hub give up the post; the other channels go on meanwhile."""
    log: list[Any] = []
    async with refund_runtime(tmp_path, log) as rt:
        slack, recorder = channel(slack_api), Recorder()
        hub = ChannelHub(rt, [slack, recorder], retry_backoff=3600, max_attempts=1)
        async with manual(hub):
            slack_api.limited["chat.postMessage"] = 2
            r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
            (req,) = r.pending
            await hub.poll()
            assert recorder.opened == [req.id]  # not held back by Slack's limit
            assert len(slack_api.of("chat.postMessage")) == 1
            await hub.poll()  # before Retry-After: Slack is not called again
            assert len(slack_api.of("chat.postMessage")) == 1
            for _ in range(2):
                await asyncio.sleep(1.05)
                await hub.poll()
            assert len(slack_api.of("chat.postMessage")) == 3
            assert slack.recall(f"msg:{req.id}") is not None
            await hub.poll()
            assert len(slack_api.of("chat.postMessage")) == 3 and recorder.opened == [req.id]


async def test_slack_rate_limited_at_start_posts_the_open_requests_later(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """Requests open when the hub starts are posted once Slack's Retry-After has passed, not
    left unposted until the next start because the first post was rate limited."""
    log: list[Any] = []
    async with refund_requested(tmp_path, log) as (rt, req):
        slack_api.limited["chat.postMessage"] = 1
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack])) as hub:
            assert (
                len(slack_api.of("chat.postMessage")) == 1 and slack.recall(f"msg:{req.id}") is None
            )
            await hub.poll()
            assert len(slack_api.of("chat.postMessage")) == 1
            await asyncio.sleep(1.05)
            await hub.poll()
            assert len(slack_api.of("chat.postMessage")) == 2
            assert slack.recall(f"msg:{req.id}") is not None


async def test_an_entry_the_hub_gave_up_on_is_logged_and_retried_on_the_next_start(
    tmp_path: Path, slack_api: FakeSlack, caplog: pytest.LogCaptureFixture
) -> None:
    """Slack failing on an update past `max_attempts`: the hub logs it at error level and
    delivers it again when it next starts, so the message stops offering Approve / Deny."""
    log: list[Any] = []
    state = tmp_path / "hub.db"
    async with refund_runtime(tmp_path, log) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        (req,) = r.pending
        async with manual(ChannelHub(rt, [channel(slack_api)], state=state, max_attempts=1)) as hub:
            await hub.poll()
            slack_api.failing["chat.update"] = "internal_error"
            await rt.respond(
                r.session_id,
                [so.InputResponse(request_id=req.id, option_id="approve")],
                principal=slack_principal(TEAM, "U045EF6GH"),
            )
            with caplog.at_level(logging.ERROR, logger="signoff.channels"):
                await hub.poll()
            assert any(
                rec.levelno == logging.ERROR and "gave up" in rec.getMessage()
                for rec in caplog.records
            )
            await hub.poll()
            assert len(slack_api.of("chat.update")) == 1  # given up for this run
        del slack_api.failing["chat.update"]
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack], state=state)) as hub:
            (_, update) = slack_api.of("chat.update")
            assert update["blocks"][-1]["block_id"] == "signoff.resolution"
            assert slack.recall(f"msg:{req.id}") is None
            await hub.poll()
        async with manual(ChannelHub(rt, [channel(slack_api)], state=state)):
            assert len(slack_api.of("chat.update")) == 2  # delivered once, then forgotten


async def test_options_longer_than_slack_allows_are_chosen_by_position(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """Slack refuses a select option whose value is over 150 characters (and text over 75): an
    option id that long is sent as its position, and choosing it answers with the real id."""
    plan = "Enterprise plan with " + "dedicated support, " * 10
    assert len(plan) > 150

    @so.tool
    async def choose_plan(ctx: so.ToolContext) -> str:
        """Ask which plan to buy."""
        answer = await ctx.ask("Which plan?", options=[plan, "Basic"], allow_text=False)
        return str(answer.option_id)

    agent = scripted_agent(
        "shop", [call_tools(call("choose_plan")), reply("Bought.")], tools=[choose_plan]
    )
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("shop", prompt="Buy a plan")
        (req,) = r.pending
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            (posted,) = slack_api.of("chat.postMessage")
            (select,) = [
                e
                for b in posted["blocks"]
                if b["type"] == "actions"
                for e in b["elements"]
                if e["type"] == "static_select"
            ]
            for o in select["options"]:
                assert len(o["value"]) <= 150 and len(o["text"]["text"]) <= 75, o
            long_one = select["options"][0]
            body = click(
                {
                    "type": "static_select",
                    "action_id": "signoff.option",
                    "block_id": f"signoff:{req.id}",
                    "selected_option": long_one,
                },
                user="U5",
            )
            await slack.handle(body, sign(body, int(time.time())))
            await slack.idle()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.resolution is not None
        assert stored.resolution["answer"]["option_id"] == plan


async def test_a_delivery_slack_retries_is_acknowledged_once_and_acted_on_once(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """Slack re-sends an interaction it got no timely answer for: the same body, signed anew
    with `X-Slack-Retry-Num`. The retry gets the first answer and does nothing: no second
    candidate, no second modal, no "already closed" note to the person who clicked."""
    log: list[Any] = []
    gate = asyncio.Event()
    async with refund_requested(tmp_path, log, gate) as (rt, req):
        slack = channel(slack_api)
        hub = ChannelHub(rt, [slack])
        app = create_app(rt, dev=True, channels=hub)
        async with app.router.lifespan_context(app):
            await hub.poll()
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:

                async def deliver(body: bytes) -> list[httpx.Response]:
                    now = int(time.time())
                    responses = [await http.post(PATH, content=body, headers=sign(body, now))]
                    for retry in (1, 2):
                        headers = {
                            **sign(body, now + retry),
                            "X-Slack-Retry-Num": str(retry),
                            "X-Slack-Retry-Reason": "http_timeout",
                        }
                        responses.append(await http.post(PATH, content=body, headers=headers))
                    return responses

                deny = click({"action_id": "signoff.deny", "value": req.id, "type": "button"})
                for response in await deliver(deny):
                    assert (response.status_code, response.content) == (200, b"")
                await slack.idle()
                assert len(slack_api.of("views.open")) == 1
                meta = {"request_id": req.id, "channel": "C42", "user": "U045EF6GH"}
                empty = submission("signoff.text", meta, {"signoff.answer": {"answer": {}}})
                for response in await deliver(empty):
                    assert response.json() == {
                        "response_action": "errors",
                        "errors": {"signoff.answer": "Write an answer"},
                    }
                approve = click({"action_id": "signoff.approve", "value": req.id, "type": "button"})
                for response in await deliver(approve):  # while the policy still decides
                    assert (response.status_code, response.content) == (200, b"")
                gate.set()
                await slack.idle()
            await hub.poll()
        assert len(log) == 1
        candidates = [e for e in await rt.audit() if e.type == "approval.candidate"]
        assert len(candidates) == 1
        assert slack_api.of("chat.postEphemeral") == []
        assert len(slack_api.of("chat.update")) == 1


async def test_a_hub_stopped_while_slack_posts_does_not_post_again_when_it_restarts(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """A server shutting down while Slack is answering a post (the message is in the channel,
    its ts not yet saved): the post is let finish and saved, so the next start does not post
    the request a second time."""
    log: list[Any] = []
    state = tmp_path / "hub.db"
    async with refund_runtime(tmp_path, log) as rt:
        hub = ChannelHub(rt, [channel(slack_api)], state=state, poll_interval=0.01)
        await hub.start()
        slack_api.slow["chat.postMessage"] = 0.3
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        (req,) = r.pending
        for _ in range(200):
            if slack_api.of("chat.postMessage"):
                break
            await asyncio.sleep(0.01)
        await hub.stop()  # Slack has the post, its answer is on the way
        del slack_api.slow["chat.postMessage"]
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack], state=state)) as again:
            await again.poll()
            assert slack.recall(f"msg:{req.id}") is not None
        assert len(slack_api.of("chat.postMessage")) == 1


async def test_slack_down_at_start_posts_the_open_requests_once_it_is_back(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """A 5xx from Slack while the hub posts the requests open at start: they are posted again
    after a backoff (not left unposted until the next start), once each."""
    log: list[Any] = []
    async with refund_requested(tmp_path, log) as (rt, req):
        slack_api.down["chat.postMessage"] = 2
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack])) as hub:
            assert len(slack_api.calls) == 1 and slack.recall(f"msg:{req.id}") is None
            await hub.poll()  # before the backoff: Slack is not called again
            assert len(slack_api.calls) == 1
            for _ in range(2):
                await asyncio.sleep(2.05)
                await hub.poll()
            assert slack.recall(f"msg:{req.id}") is not None
            await hub.poll()
        # two 503s, then the post (Slack's first "ts"), and nothing more
        assert [m for m, _ in slack_api.calls] == ["chat.postMessage"] * 3
        assert slack.recall(f"msg:{req.id}") == {"channel": "C42", "ts": "1700000000.000001"}


async def test_a_request_posted_late_shows_the_approvals_counted_meanwhile(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """An open request Slack's rate limit held back at start is posted as it is then, with
    the approvals counted while it waited, not as it was when the hub started."""

    @so.tool(approval=so.always(approvers=2))
    async def delete_account(account_id: str) -> str:
        """Delete an account."""
        return "deleted"

    agent = scripted_agent(
        "admin",
        [call_tools(call("delete_account", account_id="acct_7")), reply("Gone.")],
        tools=[delete_account],
    )
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("admin", prompt="Delete acct_7", auth=ALICE)
        (req,) = r.pending
        slack_api.limited["chat.postMessage"] = 1
        async with manual(ChannelHub(rt, [channel(slack_api)])) as hub:
            await rt.respond(
                r.session_id,
                [so.InputResponse(request_id=req.id, option_id="approve")],
                principal=slack_principal(TEAM, "U1"),
            )
            await asyncio.sleep(1.05)
            await hub.poll()
        _, posted = slack_api.of("chat.postMessage")
        assert posted["blocks"][-2]["elements"][0]["text"].endswith(
            "needs 2 approvals (1 of 2: slack:T012AB3CD:U1)"
        )


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
            }
        ]
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"


async def test_a_gateway_page_instead_of_slacks_json_is_read_as_a_failure_of_slack(
    tmp_path: Path, slack_api: FakeSlack, caplog: pytest.LogCaptureFixture
) -> None:
    """A 5xx whose body is a gateway's HTML page, not Slack's JSON: the person whose form did
    not open is told to press again, a history read that failed so is retried before posting
    again, and an update is retried as Slack's failure (the log names it, not an
    AttributeError)."""
    slack_api.real_ts = True
    log: list[Any] = []
    async with refund_runtime(tmp_path, log) as rt:
        slack = channel(slack_api)
        slack_api.lost["chat.postMessage"] = 1
        slack_api.down[HISTORY] = 1
        with caplog.at_level(logging.WARNING, logger="signoff.channels"):
            async with manual(ChannelHub(rt, [slack], retry_backoff=0)) as hub:
                r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
                (req,) = r.pending
                await hub.poll()  # the post's 504
                await hub.poll()  # the history's 503: no post yet
                assert slack.recall(f"msg:{req.id}") is None
                assert len(slack_api.of("chat.postMessage")) == 1
                await hub.poll()
                (message,) = slack_api.messages["C42"]
                assert slack.recall(f"msg:{req.id}") == {"channel": "C42", "ts": message["ts"]}
                slack_api.down["views.open"] = 1
                body = click({"action_id": "signoff.deny", "value": req.id, "type": "button"})
                assert await slack.handle(body, sign(body, int(time.time()))) is None
                await slack.idle()
                slack_api.down["chat.update"] = 1
                await rt.respond(
                    r.session_id,
                    [so.InputResponse(request_id=req.id, option_id="approve")],
                    principal=slack_principal(TEAM, "U045EF6GH"),
                )
                await hub.poll()  # the update's 503
                await hub.poll()
        assert slack_api.of("chat.postEphemeral") == [
            {
                "channel": "C42",
                "user": "U045EF6GH",
                "text": "Slack could not open the form: press the button again.",
            }
        ]
    assert len(slack_api.of("chat.postMessage")) == 1
    assert len(slack_api.of(HISTORY)) == 2
    assert len(slack_api.of("chat.update")) == 2
    assert slack_api.messages["C42"][0]["blocks"][-1]["block_id"] == "signoff.resolution"
    failures = [rec.exc_info[0] for rec in caplog.records if rec.exc_info]
    assert AttributeError not in failures and failures, failures


async def test_an_approval_with_edited_input_from_elsewhere_shows_the_input_that_ran(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """Approved elsewhere (the API, the dashboard) with edited input: the closed message shows
    the input the call ran with beside the proposed one, not only the proposal."""
    log: list[Any] = []
    async with refund_runtime(tmp_path, log) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        (req,) = r.pending
        async with manual(ChannelHub(rt, [channel(slack_api)])) as hub:
            await hub.poll()
            edit = {"order_id": "1042", "amount": 150, "reason": "arrived broken"}
            await rt.respond(
                r.session_id,
                [so.InputResponse(request_id=req.id, option_id="approve", edited_input=edit)],
                principal=slack_principal(TEAM, "U078JK9LM"),
            )
            await hub.poll()
        assert log == [("1042", 150.0)]
        (update,) = slack_api.of("chat.update")
        assert update["blocks"][:2] == approval_blocks(req)[:2]  # the proposal stays readable
        assert update["blocks"][3] == {
            "type": "section",
            "block_id": "signoff.edited",
            "text": {
                "type": "mrkdwn",
                "text": 'Approved with edited input:\n```{\n  "order_id": "1042",\n'
                '  "amount": 150.0,\n  "reason": "arrived broken"\n}```',
            },
        }
        assert update["blocks"][-1]["elements"][0]["text"].startswith(
            ":white_check_mark: *Approved* by <@U078JK9LM> "
        )


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
            }
        ]
        assert log == [("1042", 180.0)]


async def test_a_post_whose_memo_cannot_be_saved_is_not_posted_again_on_retry(
    tmp_path: Path, slack_api: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The channel state refusing the memo of a message just posted (its file locked, a full
    disk): the hub retries, which saves the memo instead of posting the request again."""
    log: list[Any] = []
    async with refund_runtime(tmp_path, log) as rt:
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack], retry_backoff=0)) as hub:
            remember = hub.state.remember
            refusals = [so.StoreError("channel state: cannot save a memo: database is locked")]

            def flaky(channel_name: str, key: str, value: Any, **hub: str) -> None:
                if refusals and key.startswith("msg:"):  # the memo of the message posted
                    raise refusals.pop()
                remember(channel_name, key, value, **hub)

            monkeypatch.setattr(hub.state, "remember", flaky)
            r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
            (req,) = r.pending
            await hub.poll()
            assert refusals == []  # the message was posted, its memo refused
            await hub.poll()
            assert slack.recall(f"msg:{req.id}") == {"channel": "C42", "ts": "1700000000.000001"}
            await rt.respond(
                r.session_id,
                [so.InputResponse(request_id=req.id, option_id="approve")],
                principal=slack_principal(TEAM, "U045EF6GH"),
            )
            await hub.poll()
        assert len(slack_api.of("chat.postMessage")) == 1
        (update,) = slack_api.of("chat.update")
        assert update["ts"] == "1700000000.000001"


async def test_a_person_from_another_workspace_answers_as_a_member_of_their_own(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """In a Slack Connect channel `team` is the workspace the click came from, the host's; the
    principal names the person's own workspace (`user.team_id`), so a policy admitting the
    host's members does not admit a guest from another organization."""
    seen: list[str] = []

    def members_of_acme(ctx: so.ResponseContext) -> Literal["allowed", "rejected"]:
        who = ctx.response.principal
        seen.append(who.principal_id if who is not None else "")
        ok = who is not None and who.principal_id.startswith(f"slack:{TEAM}:")
        return "allowed" if ok else "rejected"

    @so.tool(approval=so.ApprovalSpec(request=so.always(), response=members_of_acme))
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    agent = scripted_agent(
        "support",
        [call_tools(call("issue_refund", order_id="1042")), reply("Done.")],
        tools=[issue_refund],
    )
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db") as rt:
        (req,) = (await rt.generate("support", prompt="Refund order 1042", auth=ALICE)).pending
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            payload = json.loads(
                urllib.parse.parse_qs(
                    click(
                        {"action_id": "signoff.approve", "value": req.id}, user="U0GUEST"
                    ).decode()
                )["payload"][0]
            )
            payload["user"]["team_id"] = "T0OTHERORG"  # a guest; `team` stays the host's
            body = form(payload)
            await slack.handle(body, sign(body, int(time.time())))
            await slack.idle()
            stored = await rt.store.get_request(req.id)
            assert stored is not None and stored.status == "pending"
            assert seen == ["slack:T0OTHERORG:U0GUEST"]


async def test_answers_settled_in_the_background_wait_for_a_busy_store_as_workers_do() -> None:
    """The endpoint settles an answer after Slack has had its reply: no one waits on that work,
    so its store calls keep the store's whole wait instead of the HTTP request's brief one
    (failing it soon would lose the person's click)."""
    slack = SlackChannel("C42", token="xoxb-test", signing_secret=SECRET)
    seen: list[bool] = []

    async def work() -> None:
        seen.append(is_prompt())

    with promptly():
        slack._spawn(work())
    await slack.idle()
    assert seen == [False]


async def crash_while_slack_posts(tmp_path: Path, slack_api: FakeSlack) -> str:
    """Open a request, then SIGKILL a hub process once Slack has its post and before the hub
    saves where the message is; the request's id."""
    slack_api.real_ts = True
    records = str(tmp_path / "runs.jsonl")
    async with so.Runtime([make_agent(records)], store=sqlite_url(tmp_path)) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        (req,) = r.pending
    argv = [sqlite_url(tmp_path), records, str(tmp_path / "hub.db"), slack_api.url]
    with (tmp_path / "child.err").open("w") as err:
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests._slack_child",
            *argv,
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
        )
        slack_api.on_post = lambda message: os.kill(child.pid, signal.SIGKILL)
        out, _ = await asyncio.wait_for(child.communicate(), 60)
    slack_api.on_post = None
    assert child.returncode == -signal.SIGKILL, (out, (tmp_path / "child.err").read_text())
    assert out == b""  # it died before saving anything
    (posted,) = slack_api.of("chat.postMessage")
    assert posted["metadata"]["event_payload"]["request_id"] == req.id
    return req.id


async def test_a_hub_killed_after_slack_took_the_post_adopts_it_when_it_restarts(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """A SIGKILL between Slack accepting chat.postMessage and the hub saving the message: the
    restarted hub finds the message in the channel's history by its metadata and adopts it
    (updating it when the request closes) instead of posting the request a second time."""
    rid = await crash_while_slack_posts(tmp_path, slack_api)
    (message,) = slack_api.messages["C42"]
    async with so.Runtime([make_agent(str(tmp_path / "r"))], store=sqlite_url(tmp_path)) as rt:
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack], state=tmp_path / "hub.db")) as hub:
            await hub.poll()
            assert slack.recall(f"msg:{rid}") == {"channel": "C42", "ts": message["ts"]}
            assert slack.recall(f"posting:{rid}") is None
            (session,) = {r.session_id for r in await rt.pending()}
            await rt.respond(
                session,
                [so.InputResponse(request_id=rid, option_id="approve")],
                principal=ALICE,
            )
            await hub.poll()
    assert len(slack_api.of("chat.postMessage")) == 1
    assert len(slack_api.messages["C42"]) == 1
    (lookup,) = slack_api.of(HISTORY)
    assert lookup["channel"] == "C42" and lookup["include_all_metadata"] == "1"
    assert float(lookup["oldest"]) < float(message["ts"]) < float(lookup["latest"])
    (update,) = slack_api.of("chat.update")
    assert update["ts"] == message["ts"]
    assert update["blocks"][-1]["block_id"] == "signoff.resolution"


async def test_a_restarted_hub_that_cannot_read_the_history_posts_again_and_says_why(
    tmp_path: Path, slack_api: FakeSlack, caplog: pytest.LogCaptureFixture
) -> None:
    """The same crash with a bot that lacks the history scope: the request is posted again, as
    before message metadata, and the warning names Slack's error and the scope it needs."""
    rid = await crash_while_slack_posts(tmp_path, slack_api)
    slack_api.failing[HISTORY] = "missing_scope"
    async with so.Runtime([make_agent(str(tmp_path / "r"))], store=sqlite_url(tmp_path)) as rt:
        slack = channel(slack_api)
        with caplog.at_level(logging.WARNING, logger="signoff.channels"):
            async with manual(ChannelHub(rt, [slack], state=tmp_path / "hub.db")) as hub:
                await hub.poll()
                second = slack_api.messages["C42"][-1]
                assert slack.recall(f"msg:{rid}") == {"channel": "C42", "ts": second["ts"]}
    assert len(slack_api.of("chat.postMessage")) == 2
    (warning,) = [r.getMessage() for r in caplog.records if "history" in r.getMessage()]
    assert "missing_scope" in warning and "channels:history" in warning
    assert rid in warning and "posting it again" in warning


async def test_an_unsaved_attempt_slack_never_got_or_another_delivery_is_not_adopted(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """A saved attempt whose post never reached Slack, while the channel holds an older message
    of the same request from another delivery (one given up on): that message is not adopted,
    the request is posted once, and only messages near the attempt's time were read."""
    slack_api.real_ts = True
    log: list[Any] = []
    async with refund_requested(tmp_path, log) as (rt, req):
        payload = {"request_id": req.id, "delivery": "0" * 32}
        old = {"event_type": "signoff_request", "event_payload": payload}
        slack_api.messages["C42"] = [
            {"type": "message", "ts": f"{time.time() - 3:.6f}", "text": "x", "metadata": old}
        ]
        slack = channel(slack_api)
        hub = ChannelHub(rt, [slack], state=tmp_path / "hub.db")
        at = time.time() - 1
        hub.state.remember(
            slack.name, f"posting:{req.id}", {"delivery": "f" * 32, "at": at}, hub=hub.name
        )
        async with manual(hub):
            await hub.poll()
            posted = slack_api.messages["C42"][-1]
            assert slack.recall(f"msg:{req.id}") == {"channel": "C42", "ts": posted["ts"]}
        assert len(slack_api.of("chat.postMessage")) == 1
        (lookup,) = slack_api.of(HISTORY)
        assert lookup["include_all_metadata"] == "1"  # the old message's metadata was read
        assert float(lookup["latest"]) < at + 3600  # the attempt's window only
        # a delivery of its own: the old message's is not reused
        delivery = posted["metadata"]["event_payload"]["delivery"]
        assert delivery not in ("0" * 32, "f" * 32)


@asynccontextmanager
async def _posting(
    tmp_path: Path, slack: SlackChannel
) -> AsyncIterator[tuple[ChannelHub, so.InputRequest]]:
    """A hub of `slack` alone that retries at once, polled by the test, and the refund request
    just opened (not yet delivered)."""
    log: list[Any] = []
    async with refund_runtime(tmp_path, log) as rt:
        async with manual(ChannelHub(rt, [slack], retry_backoff=0)) as hub:
            r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
            (req,) = r.pending
            yield hub, req


async def test_a_post_that_timed_out_after_slack_took_it_is_adopted_on_retry(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """chat.postMessage timing out while Slack still posts the message: the hub's retry finds
    the message by its metadata and saves it instead of posting the request a second time."""
    slack_api.real_ts = True
    slack_api.slow["chat.postMessage"] = 1.3
    client = AsyncWebClient(token="xoxb-test", base_url=slack_api.url, timeout=1)
    slack = SlackChannel("C42", client=client, signing_secret=SECRET)
    async with _posting(tmp_path, slack) as (hub, req):
        await hub.poll()  # times out
        assert slack.recall(f"msg:{req.id}") is None
        for _ in range(200):
            if "C42" in slack_api.messages:
                break
            await asyncio.sleep(0.01)
        (message,) = slack_api.messages["C42"]
        await hub.poll()
        assert slack.recall(f"msg:{req.id}") == {"channel": "C42", "ts": message["ts"]}
    assert len(slack_api.of("chat.postMessage")) == 1
    assert len(slack_api.of(HISTORY)) == 1


async def test_a_post_answered_with_a_5xx_after_slack_took_it_is_adopted_on_retry(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """A 5xx (a gateway's 504) does not say Slack posted nothing, as an `ok: false` answer
    does: the hub's retry looks for the message by its metadata before posting again."""
    slack_api.real_ts = True
    slack_api.lost["chat.postMessage"] = 1
    slack = channel(slack_api)
    async with _posting(tmp_path, slack) as (hub, req):
        await hub.poll()  # the 504
        assert slack.recall(f"msg:{req.id}") is None
        (message,) = slack_api.messages["C42"]
        await hub.poll()
        assert slack.recall(f"msg:{req.id}") == {"channel": "C42", "ts": message["ts"]}
        await hub.poll()
    assert len(slack_api.of("chat.postMessage")) == 1
    assert len(slack_api.messages["C42"]) == 1


async def test_a_post_whose_connection_drops_after_slack_took_it_is_adopted_not_resent(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """The connection closing after Slack took chat.postMessage and before it answered: the
    post is not sent again at once (slack_sdk's default retry of a dropped connection would
    post it twice); the hub's retry adopts the message by its metadata."""
    slack_api.real_ts = True
    slack_api.dropped["chat.postMessage"] = 1
    slack = channel(slack_api)
    async with _posting(tmp_path, slack) as (hub, req):
        await hub.poll()  # the dropped connection
        await hub.poll()
        (message,) = slack_api.messages["C42"]
        assert slack.recall(f"msg:{req.id}") == {"channel": "C42", "ts": message["ts"]}
    assert len(slack_api.of("chat.postMessage")) == 1


class _FailingOnce(AbstractResolver):
    """Resolves every host to loopback, after failing the first lookup: a call that made no
    connection, so nothing reached Slack."""

    def __init__(self) -> None:
        self.lookups = 0

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.lookups += 1
        if self.lookups == 1:
            raise OSError("name resolution failed")
        found: ResolveResult = {
            "hostname": host,
            "host": "127.0.0.1",
            "port": port,
            "family": family,
            "proto": 0,
            "flags": socket.AI_NUMERICHOST,
        }
        return [found]

    async def close(self) -> None:
        pass


async def test_a_post_that_never_reached_slack_is_sent_again_at_once(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """No connection made (a failed lookup): the channel's client posts again at once, so the
    message is not held until the hub's next retry, which would also first read the history
    for it; Slack has it once."""
    resolver = _FailingOnce()
    port = urllib.parse.urlsplit(slack_api.url).port
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(resolver=resolver)) as session:
        client = AsyncWebClient(
            token="xoxb-test",
            base_url=f"http://slack.test:{port}/api/",
            session=session,
            retry_handlers=retry_handlers(),
        )
        slack = SlackChannel("C42", client=client, signing_secret=SECRET)
        async with _posting(tmp_path, slack) as (hub, req):
            await hub.poll()
            (message,) = slack_api.messages["C42"]
            assert slack.recall(f"msg:{req.id}") == {"channel": "C42", "ts": message["ts"]}
    assert resolver.lookups == 2
    assert len(slack_api.of("chat.postMessage")) == 1
    assert slack_api.of(HISTORY) == []


async def test_a_request_closed_while_the_killed_hub_was_down_updates_its_unsaved_post(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """The same crash, then the request is answered elsewhere before the hub restarts: the
    message Slack took is found and shows the decision, rather than keeping live buttons."""
    rid = await crash_while_slack_posts(tmp_path, slack_api)
    (message,) = slack_api.messages["C42"]
    async with so.Runtime([make_agent(str(tmp_path / "r"))], store=sqlite_url(tmp_path)) as rt:
        (session,) = {r.session_id for r in await rt.pending()}
        await rt.respond(
            session, [so.InputResponse(request_id=rid, option_id="approve")], principal=ALICE
        )
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack], state=tmp_path / "hub.db")) as hub:
            await hub.poll()
            assert slack.recall(f"posting:{rid}") is None
            assert slack.recall(f"msg:{rid}") is None  # closed: nothing left to update
    assert len(slack_api.of("chat.postMessage")) == 1
    (update,) = slack_api.of("chat.update")
    assert update["ts"] == message["ts"]
    assert update["blocks"][-1]["block_id"] == "signoff.resolution"


async def test_an_unsaved_post_is_found_with_a_client_that_has_no_timeout(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """A client built without a timeout (`timeout=None`): the history is read up to now instead
    of failing on the window's end, so the message is adopted rather than never posted."""
    slack_api.real_ts = True
    log: list[Any] = []
    async with refund_requested(tmp_path, log) as (rt, req):
        payload = {"request_id": req.id, "delivery": "a" * 32}
        meta = {"event_type": "signoff_request", "event_payload": payload}
        ts = f"{time.time():.6f}"
        slack_api.messages["C42"] = [{"type": "message", "ts": ts, "text": "x", "metadata": meta}]
        client = AsyncWebClient(token="xoxb-test", base_url=slack_api.url)
        client.timeout = None  # type: ignore[assignment]
        slack = SlackChannel("C42", client=client, signing_secret=SECRET)
        hub = ChannelHub(rt, [slack], state=tmp_path / "hub.db")
        at = time.time() - 1
        hub.state.remember(
            slack.name, f"posting:{req.id}", {"delivery": "a" * 32, "at": at}, hub=hub.name
        )
        async with manual(hub):
            await hub.poll()
            assert slack.recall(f"msg:{req.id}") == {"channel": "C42", "ts": ts}
    assert slack_api.of("chat.postMessage") == []
    (lookup,) = slack_api.of(HISTORY)
    assert "latest" not in lookup


async def test_a_rate_limited_history_read_is_waited_out_not_answered_by_posting_again(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """Slack's 429 on conversations.history (new apps get one call a minute): the lookup is
    retried after Retry-After and the message adopted; the request is not posted meanwhile."""
    slack_api.real_ts = True
    slack_api.limited[HISTORY] = 1
    slack_api.retry_after = "0"
    log: list[Any] = []
    async with refund_requested(tmp_path, log) as (rt, req):
        payload = {"request_id": req.id, "delivery": "b" * 32}
        meta = {"event_type": "signoff_request", "event_payload": payload}
        ts = f"{time.time():.6f}"
        slack_api.messages["C42"] = [{"type": "message", "ts": ts, "text": "x", "metadata": meta}]
        slack = channel(slack_api)
        hub = ChannelHub(rt, [slack], state=tmp_path / "hub.db")
        at = time.time() - 1
        hub.state.remember(
            slack.name, f"posting:{req.id}", {"delivery": "b" * 32, "at": at}, hub=hub.name
        )
        async with manual(hub):
            assert slack.recall(f"msg:{req.id}") is None  # limited at start
            await hub.poll()
            assert slack.recall(f"msg:{req.id}") == {"channel": "C42", "ts": ts}
    assert slack_api.of("chat.postMessage") == []
    assert len(slack_api.of(HISTORY)) == 2


async def test_same_named_slack_channels_of_two_hubs_on_one_state_file_each_post(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """Two hubs (different names) on one state file, each posting to its own Slack channel
    through a channel named `slack`: the second took the first's `msg:` memo for its own post,
    so its people never saw the request."""
    state = tmp_path / "hub.db"
    async with refund_runtime(tmp_path, []) as rt:
        ours = SlackChannel("C1", token="xoxb-test", base_url=slack_api.url, signing_secret=SECRET)
        theirs = SlackChannel(
            "C2", token="xoxb-test", base_url=slack_api.url, signing_secret=SECRET
        )
        async with (
            manual(ChannelHub(rt, [ours], state=state, name="ops")) as one,
            manual(ChannelHub(rt, [theirs], state=state, name="finance")) as two,
        ):
            (req,) = (await rt.generate("support", prompt="Refund order 1042", auth=ALICE)).pending
            await one.poll()
            await two.poll()
            assert [p["channel"] for p in slack_api.of("chat.postMessage")] == ["C1", "C2"]
            assert ours.recall(f"msg:{req.id}")["channel"] == "C1"
            assert theirs.recall(f"msg:{req.id}")["channel"] == "C2"
