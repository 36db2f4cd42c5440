"""The Slack reply tests' signed Events API deliveries and their agents and runtimes (shared
by the tests/test_slack_replies*.py files and test_slack_retries.py), and `_slack`'s fake Slack
fixture under the name they use.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Literal

import signoff as so
from signoff.channels.slack import SlackChannel
from signoff.testing import call, call_tools, reply, scripted_agent

from ._slack import (
    APPROVERS,
    TEAM,
    fake,
    sign,
)

__all__ = [
    "ALLOWED",
    "BOT",
    "EVENTS",
    "FIRST_TS",
    "choices",
    "default_policy_runtime",
    "deliver",
    "event",
    "events_of",
    "fake",
    "shop_agent",
    "signed",
    "two_refunds_runtime",
]


EVENTS = "/channels/slack/events"
BOT = "U0BOT"
ALLOWED = "U045EF6GH"  # on refund_runtime's allow list
FIRST_TS = "1700000000.000001"  # the fake's first post


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
