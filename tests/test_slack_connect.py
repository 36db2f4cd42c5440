"""Slack Connect guests under `SlackChannel(identify=...)`: another organization's admin can give
a user of theirs any email, ours included, so `identify` is asked only about members of the
workspace (or Enterprise Grid organization) the app is installed in and of `external_teams`.
Before, a partner's user whose confirmed email was carol@corp.example pressed Approve (or
replied in the thread) and acted as carol, `domains=[...]` notwithstanding."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Literal

import pytest

import signoff as so
from signoff import UsageError
from signoff.channels.slack import SlackChannel, SlackUserUnknown, by_email

from ._slack import TEAM, FakeSlack, channel, fake, form, sign
from ._slack_replies import FIRST_TS, deliver, event, events_of
from .test_slack_identity import ALICE, CAROL, CORP, U_CAROL, asked, notes, person

__all__ = ["fake"]  # the fixture, used by name

PARTNER = "T0PARTNER"  # a Slack Connect partner's workspace
ORG = "E0ACME"  # our Enterprise Grid organization, when the install is in one
U_MALLORY = "U0MALLORY"  # the partner's user their admin gave carol's (or alice's) email
IDENTIFY = by_email("sso", domains=[CORP])


async def carol_only(ctx: so.ResponseContext) -> Literal["allowed", "rejected"]:
    who = ctx.response.principal
    return "allowed" if who is not None and who.same_as(CAROL) else "rejected"


CAROL_ONLY = so.ApprovalSpec(request=so.always(), response=carol_only)


@pytest.fixture(autouse=True)
def members(fake: FakeSlack) -> None:
    fake.users[U_CAROL] = person(U_CAROL, f"carol@{CORP}")


def guest(user_id: str, email: str, team: str = PARTNER, **fields: Any) -> dict[str, Any]:
    """users.info's object for a user of another team, as Slack gives it for Slack Connect."""
    return {**person(user_id, email), "team_id": team, **fields}


async def press(slack: SlackChannel, rid: str, user: str, team: str) -> None:
    """Approve pressed in the shared channel by `user` of `team` (the host's `team`)."""
    payload = {
        "type": "block_actions",
        "user": {"id": user, "username": user.lower(), "team_id": team},
        "team": {"id": TEAM, "domain": "acme"},
        "container": {"type": "message", "message_ts": FIRST_TS, "channel_id": "C42"},
        "channel": {"id": "C42", "name": "approvals"},
        "trigger_id": "13345224609.738474920.8088930838d88f008e0",
        "actions": [{"action_id": "signoff.approve", "value": rid, "type": "button"}],
    }
    body = form(payload)
    assert await slack.handle(body, sign(body, int(time.time()))) is None
    await slack.idle()


@pytest.mark.parametrize("external", [False, True], ids=["guest", "external-team"])
async def test_a_guest_with_our_email_is_not_mapped_unless_their_team_is_listed(
    store_url: str, tmp_path: Path, fake: FakeSlack, external: bool
) -> None:
    """Mallory, of the partner's workspace, has the confirmed email carol@corp.example: her
    press acts as `slack:T0PARTNER:U0MALLORY` and is rejected, nothing applied; with
    `external_teams=[PARTNER]` it is carol's and settles the request."""
    fake.users[U_MALLORY] = guest(U_MALLORY, f"carol@{CORP}")
    runs: list[str] = []
    kw = {"external_teams": [PARTNER]} if external else {}
    async with asked(store_url, tmp_path, fake, runs, CAROL_ONLY, identify=IDENTIFY, **kw) as (
        rt,
        req,
        slack,
        hub,
    ):
        await press(slack, req.id, U_MALLORY, PARTNER)
        await hub.poll()
        stored = await rt.store.get_request(req.id)
        assert stored is not None
        if external:
            assert stored.status == "settled" and stored.resolution is not None
            assert stored.resolution["by"]["principal_id"] == CAROL.principal_id
            assert runs == ["prod"]
            return
        assert stored.status == "pending" and stored.request.approved_by == []
    assert runs == []
    assert notes(fake)[0].startswith("Your answer was not accepted (rejected")
    assert fake.of("users.info") == []  # not even looked up


async def test_our_own_member_is_mapped_as_before(
    store_url: str, tmp_path: Path, fake: FakeSlack
) -> None:
    runs: list[str] = []
    async with asked(
        store_url, tmp_path, fake, runs, CAROL_ONLY, identify=IDENTIFY, external_teams=[PARTNER]
    ) as (rt, req, slack, hub):
        await press(slack, req.id, U_CAROL, TEAM)
        await hub.poll()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "settled"
    assert runs == ["prod"]
    assert len(fake.of("auth.test")) == 1


@pytest.mark.parametrize("external", [False, True], ids=["guest", "external-team"])
async def test_a_guests_reply_in_the_thread_is_not_mapped_unless_their_team_is_listed(
    store_url: str, tmp_path: Path, fake: FakeSlack, external: bool
) -> None:
    """Alice asked (only she may answer); Mallory, whose email is alice's, types "approve" in
    the thread: nothing reaches the session, unless her team is in `external_teams`."""
    fake.users[U_MALLORY] = guest(U_MALLORY, f"alice@{CORP}")
    runs: list[str] = []
    kw = {"external_teams": [PARTNER]} if external else {}
    async with asked(store_url, tmp_path, fake, runs, so.always(), identify=IDENTIFY, **kw) as (
        rt,
        req,
        slack,
        hub,
    ):
        before = await events_of(rt, req.session_id)
        body = event("approve", user=U_MALLORY, user_team=PARTNER, team=PARTNER)
        await deliver(slack, body)
        await hub.poll()
        stored = await rt.store.get_request(req.id)
        assert stored is not None
        if external:
            assert stored.status == "settled" and stored.resolution is not None
            assert stored.resolution["by"]["principal_id"] == ALICE.principal_id
            return
        assert stored.status == "pending"
        assert await events_of(rt, req.session_id) == before
    assert runs == []
    assert notes(fake) == [f"You may not answer request {req.id}: nothing was sent."]


async def test_a_guests_saved_click_is_checked_when_resumed(
    store_url: str, tmp_path: Path, fake: FakeSlack
) -> None:
    """A guest's press acknowledged and saved (by this or an older signoff: its fields are the
    same) and taken up after a restart is checked as a new one: not mapped."""
    fake.users[U_MALLORY] = guest(U_MALLORY, f"carol@{CORP}")
    runs: list[str] = []
    async with asked(store_url, tmp_path, fake, runs, CAROL_ONLY, identify=IDENTIFY) as (
        rt,
        req,
        slack,
        _hub,
    ):
        saved: dict[str, Any] = {
            "does": "answer",
            "request_id": req.id,
            "team": PARTNER,
            "user": U_MALLORY,
        }
        saved |= {"channel": "C42", "option_id": "approve", "text": None, "trigger_id": None}
        slack.remember("click:" + "ab" * 32, {"state": "pending", "at": 0.0, "tries": 0, **saved})
        await slack.clicks.resume()
        await slack.idle()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"
    assert runs == []
    assert notes(fake)[0].startswith("Your answer was not accepted (rejected")


@pytest.mark.parametrize(
    ("team", "user", "mapped"),
    [
        ("T0EUROPE", {"enterprise_user": {"enterprise_id": ORG, "teams": ["T0EUROPE"]}}, True),
        (ORG, {"team_id": ORG}, True),
        ("T0GUEST", {"enterprise_user": {"enterprise_id": "E0OTHER"}}, False),
        ("T0GUEST", {}, False),
    ],
    ids=["another-of-our-workspaces", "org", "another-org", "another-workspace"],
)
async def test_on_enterprise_grid_a_member_of_the_organization_is_mapped(
    fake: FakeSlack, team: str, user: dict[str, Any], mapped: bool
) -> None:
    """Installed in TEAM of the organization ORG: a member from another of its workspaces
    (whose payload names that workspace) is told apart from a guest by `users.info`'s
    `enterprise_user`."""
    fake.enterprise = ORG
    fake.users["W0ALEX"] = guest("W0ALEX", f"alex@{CORP}", team=team, **user)
    slack = channel(fake, identify=IDENTIFY)
    found = await slack.identities.principal(team, "W0ALEX")
    expected = f"alex@{CORP}" if mapped else f"slack:{team}:W0ALEX"
    assert found.principal_id == expected


@pytest.mark.parametrize(("user", "mapped"), [("W0ALEX", True), (U_MALLORY, False)])
async def test_an_org_wide_installation_maps_the_organizations_members(
    fake: FakeSlack, user: str, mapped: bool
) -> None:
    """Installed org-wide, `auth.test` names the organization and no workspace."""
    fake.team, fake.enterprise = None, ORG
    fake.users["W0ALEX"] = guest("W0ALEX", f"alex@{CORP}", team="T0EUROPE")
    fake.users["W0ALEX"]["enterprise_user"] = {"enterprise_id": ORG, "teams": ["T0EUROPE"]}
    fake.users[U_MALLORY] = guest(U_MALLORY, f"carol@{CORP}")
    slack = channel(fake, identify=IDENTIFY)
    team = ORG if mapped else PARTNER
    found = await slack.identities.principal(team, user)
    assert found.principal_id == (f"alex@{CORP}" if mapped else f"slack:{PARTNER}:{U_MALLORY}")


async def test_a_failing_auth_test_refuses_with_a_reason(fake: FakeSlack) -> None:
    fake.failing["auth.test"] = "invalid_auth"
    slack = channel(fake, identify=IDENTIFY)
    with pytest.raises(SlackUserUnknown, match="Slack answered invalid_auth"):
        await slack.identities.principal(TEAM, U_CAROL)
    del fake.failing["auth.test"]  # asked again: not kept until it answers
    assert (await slack.identities.principal(TEAM, U_CAROL)).principal_id == f"carol@{CORP}"


async def test_a_guest_is_logged_once(fake: FakeSlack, caplog: pytest.LogCaptureFixture) -> None:
    fake.users[U_MALLORY] = guest(U_MALLORY, f"carol@{CORP}")
    slack = channel(fake, identify=IDENTIFY)
    with caplog.at_level(logging.WARNING, logger="signoff"):
        for _ in range(3):
            found = await slack.identities.principal(PARTNER, U_MALLORY)
            assert found.principal_id == f"slack:{PARTNER}:{U_MALLORY}"
    logged = [r.getMessage() for r in caplog.records if "external_teams" in r.getMessage()]
    assert len(logged) == 1 and U_MALLORY in logged[0] and TEAM in logged[0]
    assert len(fake.of("auth.test")) == 1


async def test_a_user_slack_places_in_another_team_than_the_payload_is_not_mapped(
    fake: FakeSlack,
) -> None:
    """The payload names our team but `users.info` another's (or none): not mapped."""
    fake.users["U0ODD"] = guest("U0ODD", f"carol@{CORP}")
    fake.users["U0NONE"] = {
        k: v for k, v in person("U0NONE", f"c@{CORP}").items() if k != "team_id"
    }
    slack = channel(fake, identify=IDENTIFY)
    for user in ("U0ODD", "U0NONE"):
        assert (await slack.identities.principal(TEAM, user)).principal_id == f"slack:{TEAM}:{user}"


@pytest.mark.parametrize("teams", ["T0PARTNER", [""], [" T1"], [3]])
def test_external_teams_must_be_a_list_of_team_ids(fake: FakeSlack, teams: Any) -> None:
    with pytest.raises(UsageError, match="external_teams"):
        channel(fake, identify=IDENTIFY, external_teams=teams)


def test_external_teams_need_identify(fake: FakeSlack) -> None:
    with pytest.raises(UsageError, match="external_teams is for identify="):
        channel(fake, external_teams=[PARTNER])
