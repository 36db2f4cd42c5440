"""The Slack channel's tests' loopback Slack and helpers: a Slack-compatible Web API that the
channel reaches through slack_sdk with `base_url`, interactions signed like Slack signs them,
and the refund and question agents the tests answer from Slack.

The fake records every API call with its parsed body (JSON or form), so the tests assert the
exact Block Kit payloads posted and updated.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sqlite3
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
from aiohttp import web
from fastapi import FastAPI

import signoff as so
from signoff.channels import ChannelHub, ChannelState
from signoff.channels.slack import SlackChannel
from signoff.server import create_app
from signoff.testing import call, call_tools, reply, scripted_agent

from ._slack_signing import SECRET, sign

__all__ = [
    "ALICE",
    "APPROVERS",
    "FakeSlack",
    "HISTORY",
    "HISTORY_SCOPE",
    "PATH",
    "SECRET",
    "TEAM",
    "approval_blocks",
    "asgi_client",
    "channel",
    "click",
    "date",
    "deleting_agent",
    "fake",
    "fake_slack",
    "form",
    "manual",
    "question_agent",
    "refund_requested",
    "refund_runtime",
    "refused_while_locked",
    "refusal",
    "resolved_at",
    "serving",
    "sign",
    "slack_api",
    "state_locked",
    "submission",
]


@asynccontextmanager
async def manual(hub: ChannelHub) -> AsyncIterator[ChannelHub]:
    """A started hub that reads the trail only when the test calls `poll()`."""
    await hub.start(follow=False)
    try:
        yield hub
    finally:
        await hub.stop()


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
        self.held: dict[str, asyncio.Event] = {}  # method -> answered once it is set (recorded)
        self.down: dict[str, int] = {}  # method -> how many calls to answer with an HTTP 503
        # method -> how many calls a gateway answers with a 504 after Slack carried them out
        self.lost: dict[str, int] = {}
        self.dropped: dict[str, int] = {}  # ... and closes the connection after carrying out
        # channel -> its messages, oldest first, as conversations.history returns them
        self.messages: dict[str, list[dict[str, Any]]] = {}
        self.real_ts = False  # message ts from the wall clock, as Slack's (else 1700000000.n)
        self.on_post: Callable[[dict[str, Any]], None] | None = None  # once Slack has a post
        self.triggers: set[str] = set()  # trigger ids views.open used
        self.users: dict[str, dict[str, Any]] = {}  # user id -> users.info's user object
        # auth.test's answer: the workspace (and Enterprise Grid organization) of the install
        self.team: str | None = TEAM  # None: an org-wide installation's
        self.enterprise: str | None = None
        self.called_at: list[float] = []  # monotonic time of each of `calls`, as it came
        # The most characters of text all of a message's blocks may hold together: past it
        # Slack answers `msg_blocks_too_long` (undocumented; Slack's staff say about 12,000).
        self.most_text = MOST_TEXT

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
        self.called_at.append(time.monotonic())
        self.tokens.append(request.headers.get("Authorization"))
        if method in self.slow:
            await asyncio.sleep(self.slow[method])
        if method in self.held:
            await self.held[method].wait()
        refused = (
            refusal(body.get("blocks")) if method in ("chat.postMessage", "chat.update") else None
        )
        if refused is not None:
            return web.json_response({"ok": False, "error": "invalid_blocks", "why": refused})
        if method in ("chat.postMessage", "chat.update") and texts(body.get("blocks")) > (
            self.most_text
        ):
            return web.json_response({"ok": False, "error": "msg_blocks_too_long"})
        if len(str(body.get("text", ""))) > MAX_MESSAGE:
            return web.json_response({"ok": False, "error": "msg_too_long"})
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
            needed = {"needed": NEEDED.get(method, "chat:write"), "provided": "chat:write"}
            extra = needed if error == "missing_scope" and method in NEEDED else {}
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
            if self.dropped.get(method, 0) > 0 and request.transport is not None:
                self.dropped[method] -= 1
                request.transport.abort()  # the note is sent; the client sees a disconnect
                return web.Response(status=200)
            return web.json_response({"ok": True, "message_ts": "1700000099.000001"})
        if method == "views.open":
            # A trigger opens one view: used again, Slack refuses it.
            if body["trigger_id"] in self.triggers:
                return web.json_response({"ok": False, "error": "invalid_trigger_id"})
            self.triggers.add(body["trigger_id"])
            if self.lost.get(method, 0) > 0:
                self.lost[method] -= 1
                return web.Response(status=504, text="<html>gateway timeout</html>")
            if self.dropped.get(method, 0) > 0 and request.transport is not None:
                self.dropped[method] -= 1
                request.transport.abort()  # the form is open; the client sees a disconnect
                return web.Response(status=200)
            return web.json_response({"ok": True, "view": {"id": "V1"}})
        if method == "views.update":
            return web.json_response({"ok": True, "view": {"id": body["view_id"]}})
        if method == "auth.test":
            ids = {"team_id": self.team, "enterprise_id": self.enterprise}
            ids = {k: v for k, v in ids.items() if v is not None}
            return web.json_response({"ok": True, "user_id": "U0BOT", "bot_id": "B0BOT", **ids})
        if method == "users.info":
            user = self.users.get(body.get("user", ""))
            if user is None:
                return web.json_response({"ok": False, "error": "user_not_found"})
            return web.json_response({"ok": True, "user": user})
        return web.json_response({"ok": False, "error": "unknown_method"})

    def of(self, method: str) -> list[dict[str, Any]]:
        return [body for m, body in self.calls if m == method]

    def history(self, query: dict[str, str]) -> dict[str, Any]:
        """conversations.history as Slack answers it: newest first, between `oldest` and
        `latest` (exclusive unless `inclusive`), `limit` a page with a cursor to the next, and
        message metadata only with `include_all_metadata`."""
        # A channel with no messages yet reads as empty, as Slack's does: `channel_not_found`
        # says the bot cannot reach it, which the channel waits out (`failing` gives it).
        inclusive = query.get("inclusive") in ("1", "true")
        oldest, latest = float(query.get("oldest", 0)), float(query.get("latest", 1e11))
        found = [
            m
            for m in reversed(self.messages.get(query["channel"], []))
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


MAX_MESSAGE = 40_000  # characters of a message's text past which Slack refuses it (msg_too_long)
MOST_TEXT = 12_000  # characters of text in all of a message's blocks (msg_blocks_too_long)


def texts(value: Any) -> int:
    """How many characters of text all the text objects (`{"type": ..., "text": "..."}`) of
    blocks hold together, an option's and a label's included."""
    if isinstance(value, dict):
        text = value.get("text")
        own = len(text) if isinstance(text, str) and "type" in value else 0
        return own + sum(texts(v) for v in value.values())
    if isinstance(value, list):
        return sum(texts(v) for v in value)
    return 0


HISTORY_SCOPE = "channels:history,groups:history,mpim:history,im:history"
# What a `missing_scope` names in `needed`, by method (Slack's answer has it).
NEEDED = {HISTORY: HISTORY_SCOPE, "chat.postMessage": "chat:write", "chat.update": "chat:write"}


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


@asynccontextmanager
async def fake_slack() -> AsyncIterator[FakeSlack]:
    """A started `FakeSlack`, stopped when the block ends: the one way every test runs it."""
    slack = FakeSlack()
    await slack.start()
    try:
        yield slack
    finally:
        await slack.stop()


@pytest.fixture
async def slack_api() -> AsyncIterator[FakeSlack]:
    async with fake_slack() as slack:
        yield slack


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    """`slack_api` under the name the click, refusal, retry and reply tests use."""
    async with fake_slack() as slack:
        yield slack


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
    rt: so.Runtime, fake: FakeSlack, state: Path | ChannelState
) -> AsyncIterator[tuple[SlackChannel, ChannelHub, FastAPI]]:
    """The app of `rt` running a hub of one Slack channel on `fake` (its state in the file
    `state`), started and polled once: the channel, the hub and the app."""
    slack = channel(fake)
    hub = ChannelHub(rt, [slack], state=state)
    app = create_app(rt, dev=True, channels=hub)
    async with app.router.lifespan_context(app):
        await hub.poll()
        yield slack, hub, app


@asynccontextmanager
async def asgi_client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A client of `app` in this process, seen as coming from 127.0.0.1."""
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 5000))
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        yield http


@asynccontextmanager
async def state_locked(path: Path) -> AsyncIterator[None]:
    """Another process holding the write lock of the channel state file `path` meanwhile."""
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        yield
        other.execute("ROLLBACK")
    finally:
        other.close()


async def refused_while_locked(
    http: httpx.AsyncClient,
    post: Callable[[], Coroutine[Any, Any, httpx.Response]],
    request_id: str,
) -> None:
    """`post` (Slack's) meeting a locked state file (`state_locked`): it waits for the lock off
    the event loop, so the request is read meanwhile (still pending), and gets a 503 in time."""
    began = time.monotonic()
    posting = asyncio.create_task(post())
    await asyncio.sleep(0.3)  # waiting for the lock by now
    looked = await http.get(f"/v1/requests/{request_id}")
    assert looked.status_code == 200 and looked.json()["status"] == "pending"
    assert not posting.done()  # answered while the post waits
    response = await posting
    took = time.monotonic() - began
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "store_error"
    assert took < 8  # the 2 s deadline, not the 30 s busy timeout (slack for load)


def approval_blocks(req: so.InputRequest) -> list[dict[str, Any]]:
    """The message of an open refund approval, written out as Slack receives it."""
    return [
        {
            "type": "section",
            "block_id": "signoff.summary",
            "text": {
                "type": "mrkdwn",
                "text": "*support* wants to run `issue_refund`",
                "verbatim": True,
            },
        },
        {
            "type": "section",
            "block_id": "signoff.input",
            "text": {
                "type": "mrkdwn",
                "text": '```{\n  "order_id": "1042",\n  "amount": 180.0,\n'
                '  "reason": "arrived broken"\n}```',
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


def deleting_agent(runs: list[str] | None = None) -> so.Agent:
    """`admin`, whose one call deletes `acct_7` once two people approve it (each run noted in
    `runs`), then replies "Gone."."""

    @so.tool(approval=so.always(approvers=2))
    async def delete_account(account_id: str) -> str:
        """Delete an account."""
        if runs is not None:
            runs.append(account_id)
        return "deleted"

    return scripted_agent(
        "admin",
        [call_tools(call("delete_account", account_id="acct_7")), reply("Gone.")],
        tools=[delete_account],
    )
