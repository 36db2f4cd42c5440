"""Slack Enterprise Grid: one person is one principal whether they press a button or reply in
a request's thread, though Grid's payloads name their team as the organization (`E...`) in one
place and as the workspace (`T...`) in another; a Slack Connect guest still answers as a member
of their own organization or workspace, never the host's."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest

import signoff as so
from signoff.channels import ChannelHub, ChannelState
from signoff.channels.slack import SlackChannel
from signoff.channels.slack._blocks import DENY_VIEW
from signoff.channels.slack._clicks import read
from signoff.channels.slack._replies import thread_key
from signoff.testing import call, call_tools, reply, scripted_agent

from ._slack import ALICE, TEAM, FakeSlack, channel, form, manual, sign, submission
from ._slack_replies import FIRST_TS, deliver, event, fake

__all__ = ["fake"]  # the fixture, used by name

ORG = "E0ACME"  # the organization the host workspace TEAM belongs to
PERSON = "W0ALEX"  # an org-wide user id, as Grid gives its members


def grid_click(
    rid: str, user: str = PERSON, user_team: str | None = ORG, team: str | None = TEAM
) -> dict[str, Any]:
    """A press of Approve as Grid sends it: `user.team_id` may be the organization's id (or a
    workspace's), `team` the workspace it came from (None for an org-wide install)."""
    who: dict[str, Any] = {"id": user, "username": "alex", "name": "alex"}
    if user_team is not None:
        who["team_id"] = user_team
    return {
        "type": "block_actions",
        "user": who,
        "team": None if team is None else {"id": team, "domain": "acme-eu"},
        "enterprise": {"id": ORG, "name": "Acme"},
        "is_enterprise_install": team is None,
        "container": {"type": "message", "message_ts": FIRST_TS, "channel_id": "C42"},
        "channel": {"id": "C42", "name": "approvals"},
        "trigger_id": "13345224609.738474920.8088930838d88f008e0",
        "actions": [{"action_id": "signoff.approve", "value": rid, "type": "button"}],
    }


def grid_event(text: str, user: str = PERSON, **fields: Any) -> bytes:
    """A reply in the thread as Grid's Events API sends it: the envelope and its authorization
    carry the organization's id; the event's `team` is the workspace, `user_team` may be set."""
    envelope = json.loads(event(text, user=user, **fields))
    envelope["enterprise_id"] = ORG
    envelope["authorizations"][0]["enterprise_id"] = ORG
    return json.dumps(envelope).encode()


@pytest.fixture
async def slack(tmp_path: Path) -> AsyncIterator[SlackChannel]:
    """A channel whose state knows the thread of request `req_1`."""
    ch = SlackChannel("C42", token="xoxb-test", signing_secret="secret")
    state = ChannelState(tmp_path / "hub.db")
    try:
        async with so.Runtime([], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
            ch.bind(rt, state)
            ch.remember(thread_key("C42", FIRST_TS), {"request_id": "req_1"})
            yield ch
    finally:
        state.close()


@pytest.mark.parametrize(
    ("user_team", "team"),
    [(ORG, TEAM), (TEAM, TEAM), (None, TEAM), (ORG, None)],
    ids=["org", "workspace", "no-user-team", "org-wide-install"],
)
def test_a_grid_members_click_names_the_organization(user_team: str | None, team: str) -> None:
    found, _ = read(grid_click("req_1", user_team=user_team, team=team))
    assert found is not None and (found.team, found.user) == (ORG, PERSON)


@pytest.mark.parametrize(
    "fields",
    [{}, {"user_team": ORG}, {"user_team": TEAM}, {"team": ORG, "user_team": ORG}],
    ids=["workspace", "user-team-org", "user-team-workspace", "all-org"],
)
async def test_a_grid_members_reply_names_the_organization(
    slack: SlackChannel, fields: dict[str, Any]
) -> None:
    found = slack.replies._reply(json.loads(grid_event("approve", **fields)))
    assert found is not None and (found.team, found.user) == (ORG, PERSON)


def test_a_grid_members_deny_form_names_the_organization() -> None:
    """A modal's submission carries the organization as its `team`'s `enterprise_id`."""
    meta = {"request_id": "req_1", "channel": "C42", "user": PERSON}
    values = {"signoff.reason": {"reason": {"type": "plain_text_input", "value": "no"}}}
    payload = json.loads(
        parse_qs(submission(DENY_VIEW, meta, values, PERSON).decode())["payload"][0]
    )
    payload["team"]["enterprise_id"] = ORG
    found, _ = read(payload)
    assert found is not None and (found.team, found.option_id) == (ORG, "cancel")


def test_a_guest_on_a_grid_host_still_answers_as_a_member_of_their_own() -> None:
    """In a Slack Connect channel of a Grid organization, a guest's payload still carries the
    host's `enterprise`: their own workspace (or organization) names them, not the host."""
    for own in ("T0GUEST", "E0OTHERORG"):
        found, _ = read(grid_click("req_1", user="U0GUEST", user_team=own))
        assert found is not None and found.team == own


async def test_a_guests_reply_on_a_grid_host_names_their_own_team(slack: SlackChannel) -> None:
    for own in ("T0GUEST", "E0OTHERORG"):
        body = grid_event("approve", user="U0GUEST", user_team=own, event_id=f"Ev{own}")
        found = slack.replies._reply(json.loads(body))
        assert found is not None and found.team == own


async def test_a_grid_member_who_clicks_and_replies_is_counted_once(
    tmp_path: Path, fake: FakeSlack
) -> None:
    """A two-person approval: a Grid member presses Approve (their payload names the
    organization) and then types "approve" in its thread (the event names the workspace).
    Both were counted, as `slack:E0ACME:W0ALEX` and `slack:T012AB3CD:W0ALEX`, and one person
    approved alone; now the reply is theirs again, counted once, and the request stays open."""
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
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack], state=tmp_path / "hub.db")) as hub:
            await hub.poll()
            assert slack.recall(f"msg:{req.id}")["ts"] == FIRST_TS
            body = form(grid_click(req.id))
            await slack.handle(body, sign(body, int(time.time())))
            await slack.idle()
            await deliver(slack, grid_event("approve"))
            await hub.poll()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"
        candidates = [e for e in await rt.audit() if e.type == "approval.candidate"]
        assert [c.data["by"]["principal_id"] for c in candidates] == [f"slack:{ORG}:{PERSON}"]
    assert runs == []
    assert [e["text"] for e in fake.of("chat.postEphemeral")] == [
        "Your approval was counted (1 of 2).",
        "You approved this request before (already counted: 1 of 2).",
    ]
