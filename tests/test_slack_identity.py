"""`SlackChannel(identify=...)`: a Slack user acts as the principal they are on the dashboard,
the API or SSO (here `by_email("sso")`, by their confirmed Slack email), so four eyes and a
distinct quorum see one person wherever they answer, and a request only that identity may
answer can be answered from Slack. Without the mapping each person was `slack:<team>:<user>`
too: alice approved her own call from Slack, and one person counted twice."""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import pytest

import signoff as so
from signoff.channels import ChannelHub
from signoff.channels.slack import SlackChannel, SlackUserUnknown, by_email
from signoff.channels.slack._blocks import DENY_VIEW
from signoff.testing import call, call_tools, reply, scripted_agent

from ._slack import TEAM, FakeSlack, channel, click, fake, manual, sign, submission
from ._slack_replies import deliver, event, events_of

__all__ = ["fake"]  # the fixture, used by name

CORP = "corp.example"
ALICE = so.Principal(authenticator="sso", principal_id=f"alice@{CORP}")
BOB = so.Principal(authenticator="sso", principal_id=f"bob@{CORP}")
CAROL = so.Principal(authenticator="sso", principal_id=f"carol@{CORP}")
U_ALICE, U_BOB, U_CAROL, U_EVE = "U0ALICE", "U0BOB", "U0CAROL", "U0EVE"
APPROVE = {"action_id": "signoff.approve", "type": "button"}


def person(user_id: str, email: str | None, *, confirmed: bool = True) -> dict[str, Any]:
    """users.info's user object, as Slack gives it to a bot with `users:read.email`."""
    profile: dict[str, Any] = {"real_name": user_id, "display_name": user_id.lower()}
    if email is not None:
        profile["email"] = email
    return {
        "id": user_id,
        "team_id": TEAM,
        "name": user_id.lower(),
        "deleted": False,
        "is_bot": False,
        "is_email_confirmed": confirmed,
        "profile": profile,
    }


@pytest.fixture(autouse=True)
def people(fake: FakeSlack) -> None:
    fake.users.update(
        {
            U_ALICE: person(U_ALICE, f"Alice@{CORP}"),
            U_BOB: person(U_BOB, f"bob@{CORP}"),
            U_CAROL: person(U_CAROL, f"carol@{CORP}"),
            U_EVE: person(U_EVE, f"eve@{CORP}", confirmed=False),
        }
    )


def deploy_agent(runs: list[str], approval: Any) -> so.Agent:
    @so.tool(approval=approval)
    async def deploy(env: str) -> str:
        """Deploy to an environment."""
        runs.append(env)
        return "deployed"

    return scripted_agent(
        "ops", [call_tools(call("deploy", env="prod")), reply("Deployed.")], tools=[deploy]
    )


@asynccontextmanager
async def asked(
    store_url: str, tmp_path: Path, fake: FakeSlack, runs: list[str], approval: Any, **kw: Any
) -> AsyncIterator[tuple[so.Runtime, so.InputRequest, SlackChannel, ChannelHub]]:
    """Alice (on the dashboard, `sso:alice@corp.example`) asked for a deploy; its message is
    posted by a channel mapping Slack users by email (or by `kw`'s `identify`)."""
    kw.setdefault("identify", by_email("sso"))
    async with so.Runtime([deploy_agent(runs, approval)], store=store_url) as rt:
        r = await rt.generate("ops", prompt="Deploy prod", auth=ALICE)
        (req,) = r.pending
        slack = channel(fake, **kw)
        async with manual(ChannelHub(rt, [slack], state=tmp_path / "hub.db")) as hub:
            await hub.poll()
            yield rt, req, slack, hub


async def press(slack: SlackChannel, rid: str, user: str, **action: Any) -> None:
    trigger = action.pop("trigger", "13345224609.738474920.8088930838d88f008e0")
    body = click({**APPROVE, "value": rid, **action}, user=user, trigger=trigger)
    assert await slack.handle(body, sign(body, int(time.time()))) is None
    await slack.idle()


def notes(fake: FakeSlack) -> list[str]:
    return [e["text"] for e in fake.of("chat.postEphemeral")]


async def test_four_eyes_holds_across_the_dashboard_and_slack(
    store_url: str, tmp_path: Path, fake: FakeSlack
) -> None:
    """Alice asked from the dashboard; her Approve in Slack is hers, so it is refused."""
    runs: list[str] = []
    async with asked(store_url, tmp_path, fake, runs, so.always(exclude_requester=True)) as (
        rt,
        req,
        slack,
        hub,
    ):
        before = len(await rt.audit())
        await press(slack, req.id, U_ALICE)
        assert len(await rt.audit()) == before  # nothing written
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"
        assert notes(fake) == [
            f"You may not answer this request: request {req.id}: the requester may not approve "
            "their own call"
        ]
        await press(slack, req.id, U_BOB)
        await hub.poll()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "settled"
        assert stored.resolution is not None and stored.resolution["by"]["principal_id"] == (
            BOB.principal_id
        )
    assert runs == ["prod"]


async def test_a_distinct_quorum_counts_one_person_once_across_the_dashboard_and_slack(
    store_url: str, tmp_path: Path, fake: FakeSlack
) -> None:
    """Bob approves on the dashboard and again in Slack: one vote; Carol's is the second."""
    runs: list[str] = []
    async with asked(store_url, tmp_path, fake, runs, so.always(approvers=2)) as (
        rt,
        req,
        slack,
        hub,
    ):
        answer = so.InputResponse(request_id=req.id, option_id="approve")
        await rt.respond(req.session_id, [answer], principal=BOB, resume=False)
        await press(slack, req.id, U_BOB)
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"
        assert stored.request.approved_by == [BOB.principal_id]
        assert runs == []
        await press(slack, req.id, U_CAROL)
        await hub.poll()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "settled"
    assert runs == ["prod"]
    assert notes(fake) == ["You approved this request before (already counted: 1 of 2)."]


async def test_a_request_only_the_mapped_identity_may_answer_is_answered_from_slack(
    store_url: str, tmp_path: Path, fake: FakeSlack
) -> None:
    """A response policy naming carol@corp.example: her Slack press settles it; bob's is
    refused with the policy's reason."""

    async def carol_only(ctx: so.ResponseContext) -> Literal["allowed", "rejected"]:
        who = ctx.response.principal
        return "allowed" if who is not None and who.same_as(CAROL) else "rejected"

    runs: list[str] = []
    spec = so.ApprovalSpec(request=so.always(), response=carol_only)
    async with asked(store_url, tmp_path, fake, runs, spec) as (rt, req, slack, hub):
        await press(slack, req.id, U_BOB)
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"
        await press(slack, req.id, U_CAROL)
        await hub.poll()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "settled"
    assert runs == ["prod"]
    assert notes(fake)[0].startswith("Your answer was not accepted (rejected")


async def test_the_asker_answers_their_own_request_from_a_thread_reply(
    store_url: str, tmp_path: Path, fake: FakeSlack
) -> None:
    """The default policy (only whoever asked): alice's "approve" typed in the thread (a
    mention of the bot first) is hers; bob's is refused and nothing reaches the session."""
    runs: list[str] = []
    async with asked(store_url, tmp_path, fake, runs, so.always()) as (rt, req, slack, hub):
        before = await events_of(rt, req.session_id)
        await deliver(slack, event("<@U0BOT> approve", user=U_BOB, event_id="Ev1"))
        assert await events_of(rt, req.session_id) == before
        assert notes(fake) == [f"You may not answer request {req.id}: nothing was sent."]
        await deliver(slack, event("<@U0BOT> approve", user=U_ALICE, event_id="Ev2"))
        await hub.poll()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "settled"
        assert stored.resolution is not None and stored.resolution["by"]["principal_id"] == (
            ALICE.principal_id
        )
    assert runs == ["prod"]


def refusing(team_id: str, user_id: str, user: Any) -> so.Principal | None:
    return None if user_id == U_EVE else by_email("sso")(team_id, user_id, user)


@pytest.mark.parametrize("identify", [by_email("sso"), refusing], ids=["unconfirmed", "none"])
async def test_a_refused_user_is_told_and_nothing_is_written(
    store_url: str, tmp_path: Path, fake: FakeSlack, identify: Any
) -> None:
    """Eve (an unconfirmed email, or a mapping returning None) presses Approve, opens Deny's
    form, submits it and replies in the thread: each gets a note, and nothing is written."""
    runs: list[str] = []
    async with asked(store_url, tmp_path, fake, runs, so.always(), identify=identify) as (
        rt,
        req,
        slack,
        _hub,
    ):
        before = (len(await rt.audit()), await events_of(rt, req.session_id))
        await press(slack, req.id, U_EVE)
        await press(slack, req.id, U_EVE, action_id="signoff.deny", trigger="t1")
        meta = {"request_id": req.id, "channel": "C42", "user": U_EVE}
        values = {"signoff.reason": {"reason": {"type": "plain_text_input", "value": "no"}}}
        body = submission(DENY_VIEW, meta, values, U_EVE)
        await slack.handle(body, sign(body, int(time.time())))
        await slack.idle()
        await deliver(slack, event("approve", user=U_EVE))
        assert (len(await rt.audit()), await events_of(rt, req.session_id)) == before
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"
    assert runs == [] and fake.of("views.open") == []
    why = (
        f"the email of Slack user {U_EVE} is not confirmed"
        if identify is not refusing
        else "your Slack account is not mapped to a signoff identity"
    )
    assert notes(fake) == [f"Your answer was not taken: {why}."] * 3 + [
        f"Your reply was not sent: {why}."
    ]


@pytest.mark.parametrize(
    ("user", "failing", "why"),
    [
        ("U0GONE", None, "signoff could not tell who you are (Slack answered user_not_found)"),
        (
            U_BOB,
            "missing_scope",
            "signoff could not look you up: the Slack app lacks the users:read scope",
        ),
        (
            "U0NOMAIL",
            None,
            "Slack gave no email for user U0NOMAIL: the Slack app needs the users:read.email "
            "scope (and the user an email)",
        ),
    ],
    ids=["unknown-user", "no-users-read", "no-email-scope"],
)
async def test_a_failed_lookup_is_told_and_nothing_is_written(
    store_url: str, tmp_path: Path, fake: FakeSlack, user: str, failing: str | None, why: str
) -> None:
    fake.users["U0NOMAIL"] = person("U0NOMAIL", None)  # what users:read alone gives
    runs: list[str] = []
    async with asked(store_url, tmp_path, fake, runs, so.always()) as (rt, req, slack, _hub):
        if failing is not None:
            fake.failing["users.info"] = failing
        before = len(await rt.audit())
        await press(slack, req.id, user)
        await deliver(slack, event("approve", user=user))
        assert len(await rt.audit()) == before
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"
    assert runs == []
    assert notes(fake) == [f"Your answer was not taken: {why}.", f"Your reply was not sent: {why}."]


async def test_a_slow_lookup_does_not_hold_slacks_acknowledgement(
    tmp_path: Path, fake: FakeSlack
) -> None:
    """users.info answering only when the test says: Slack hears back meanwhile, and the answer
    settles after."""
    runs: list[str] = []
    url = f"sqlite:///{tmp_path / 'state.db'}"
    async with asked(url, tmp_path, fake, runs, so.always()) as (rt, req, slack, _hub):
        looked_up = fake.held["users.info"] = asyncio.Event()
        body = click({**APPROVE, "value": req.id}, user=U_ALICE)
        try:
            handled = slack.handle(body, sign(body, int(time.time())))
            assert await asyncio.wait_for(handled, 10) is None  # the lookup still held
            stored = await rt.store.get_request(req.id)
            assert stored is not None and stored.status == "pending"
        finally:
            looked_up.set()
        await slack.idle()
        assert len(fake.of("users.info")) == 1
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "settled"
    assert runs == ["prod"]


async def test_a_lookup_past_its_time_is_told_and_nothing_is_written(
    tmp_path: Path, fake: FakeSlack
) -> None:
    runs: list[str] = []
    url = f"sqlite:///{tmp_path / 'state.db'}"
    async with asked(url, tmp_path, fake, runs, so.always()) as (rt, req, slack, _hub):
        slack.identities.within = 0.3
        fake.slow["users.info"] = 1.0
        await press(slack, req.id, U_ALICE)
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"
    assert runs == []
    assert notes(fake) == [
        "Your answer was not taken: signoff could not tell who you are in time: try again in "
        "a moment."
    ]


async def test_users_are_looked_up_once_while_cached_and_the_cache_is_bounded(
    tmp_path: Path, fake: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    from signoff.channels.slack import _identity

    monkeypatch.setattr(_identity, "CACHED_USERS", 2)
    slack = channel(fake, identify=by_email("sso"))
    ids = slack.identities
    for user in (U_ALICE, U_ALICE, U_BOB, U_ALICE, U_CAROL, U_BOB):
        await ids.principal(TEAM, user)
    # Alice cached, Bob, Alice again (cached), Carol drops Bob (the least recently used).
    assert [c["user"] for c in fake.of("users.info")] == [U_ALICE, U_BOB, U_CAROL, U_BOB]
    # Bob's return dropped Alice: she is looked up again (her email lowercased).
    assert (await ids.principal(TEAM, U_ALICE)).same_as(ALICE)
    assert len(fake.of("users.info")) == 5
    monkeypatch.setattr(_identity, "CACHE_FOR", -1.0)  # what is cached from now on is stale
    await ids.principal(TEAM, U_CAROL)
    await ids.principal(TEAM, U_CAROL)
    assert len(fake.of("users.info")) == 7


async def test_a_sync_or_async_mapping_and_its_mistakes(fake: FakeSlack) -> None:
    from signoff.channels.slack import SlackUserUnknown

    async def by_name(team_id: str, user_id: str, user: Any) -> so.Principal:
        return so.Principal(authenticator="ldap", principal_id=user["name"])

    def wrong(team_id: str, user_id: str, user: Any) -> Any:
        return {"principal_id": "bob"}

    def raising(team_id: str, user_id: str, user: Any) -> Any:
        raise RuntimeError("the directory is down")

    found = await channel(fake, identify=by_name).identities.principal(TEAM, U_BOB)
    assert found == so.Principal(authenticator="ldap", principal_id="u0bob")
    for mapping, why in [
        (wrong, "signoff could not tell who you are (a mapping error)"),
        (raising, "signoff could not tell who you are (the lookup failed)"),
    ]:
        with pytest.raises(SlackUserUnknown) as caught:
            await channel(fake, identify=mapping).identities.principal(TEAM, U_BOB)
        assert str(caught.value) == why


def test_by_email_refuses_what_it_cannot_vouch_for() -> None:
    from signoff.channels.slack import SlackUserUnknown

    only_corp = by_email("sso", issuer="https://idp.corp.example", domains=["@Corp.Example"])
    found = only_corp(TEAM, U_BOB, person(U_BOB, f"Bob@{CORP}"))
    assert found == so.Principal(
        authenticator="sso", principal_id=f"bob@{CORP}", issuer="https://idp.corp.example"
    )
    for user in [
        person(U_BOB, "bob@elsewhere.example"),
        person(U_BOB, f"bob@{CORP}", confirmed=False),
        {**person(U_BOB, f"bob@{CORP}"), "deleted": True},
        {**person(U_BOB, f"bob@{CORP}"), "is_bot": True},
        {**person(U_BOB, f"bob@{CORP}"), "is_email_confirmed": None},
    ]:
        with pytest.raises(SlackUserUnknown):
            only_corp(TEAM, U_BOB, user)
    for bad in ({"authenticator": ""}, {"authenticator": "sso", "domains": [""]}):
        with pytest.raises(so.UsageError):
            by_email(**bad)
    with pytest.raises(so.UsageError):  # identify must be callable
        SlackChannel("C42", token="x", signing_secret="s", identify="sso")  # type: ignore[arg-type]


async def test_a_lookup_failing_on_a_second_run_says_the_answer_may_stand(
    tmp_path: Path, fake: FakeSlack
) -> None:
    """A click or reply run again after a crash (its first run may have answered) whose lookup
    now fails is not told its answer was not taken."""
    from signoff.channels.slack._clicks import ANSWER, Interaction
    from signoff.channels.slack._replies import TypedReply

    runs: list[str] = []
    url = f"sqlite:///{tmp_path / 'state.db'}"
    async with asked(url, tmp_path, fake, runs, so.always()) as (rt, req, slack, _hub):
        fake.failing["users.info"] = "fatal_error"
        pressed = Interaction(ANSWER, req.id, TEAM, U_ALICE, "C42", option_id="approve")
        await slack.clicks._settle(pressed, True)
        typed = TypedReply("Ev9", req.id, TEAM, U_ALICE, "C42", "1700000000.000001", "approve")
        await slack.replies._send(typed, True)
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"
    why = "signoff could not tell who you are (Slack answered fatal_error)"
    assert notes(fake) == [
        f"Your answer may not have been taken: {why}.",
        f"Your reply may not have been sent: {why}.",
    ]


@pytest.mark.parametrize(("retry_after", "settled"), [("1", True), ("60", False)])
async def test_a_rate_limited_lookup_waits_its_retry_after_only_within_its_time(
    tmp_path: Path, fake: FakeSlack, retry_after: str, settled: bool
) -> None:
    """users.info answered 429: looked up again after a Retry-After of 1 s; one of 60 s, past
    the ten seconds a lookup has, is told at once."""
    runs: list[str] = []
    url = f"sqlite:///{tmp_path / 'state.db'}"
    async with asked(url, tmp_path, fake, runs, so.always()) as (rt, req, slack, _hub):
        fake.limited["users.info"], fake.retry_after = 1, retry_after
        started = time.monotonic()
        await press(slack, req.id, U_ALICE)
        took = time.monotonic() - started
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == ("settled" if settled else "pending")
    assert runs == (["prod"] if settled else [])
    assert len(fake.of("users.info")) == (2 if settled else 1)
    if settled:
        assert took >= 1.0 and notes(fake) == []
    else:
        assert took < 5.0
        assert notes(fake) == [
            "Your answer was not taken: signoff could not tell who you are (Slack answered "
            "ratelimited)."
        ]


def _mail(email: str) -> dict[str, Any]:
    return {"id": "U1", "is_email_confirmed": True, "profile": {"email": email}}


def test_by_email_names_the_known_principal_in_its_own_case() -> None:
    """Given the principals the other surfaces know, an email names the one it matches in any
    case, spelled as they spell it: `Alice@Corp.example` asking from the API is the same person
    as her Slack account's `alice@corp.example` (four eyes compares ids exactly, and the
    lowercased id was someone else: she could approve her own call)."""
    identify = by_email("token", principals=["Alice@Corp.example", "bob@corp.example"])
    alice = so.Principal(authenticator="token", principal_id="Alice@Corp.example")
    assert identify("T1", "U1", _mail("alice@corp.example")).same_as(alice)
    assert identify("T1", "U1", _mail("ALICE@corp.EXAMPLE")).same_as(alice)
    found = identify("T1", "U1", _mail("Carol@Corp.example"))  # none known: lowercased
    assert found.principal_id == "carol@corp.example"


def test_by_email_never_gives_one_slack_user_either_of_two_principals_differing_in_case(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """RFC 5321 lets `Alice@x` and `alice@x` be two mailboxes: when both are principals, the
    Slack user whose email names them is refused, told why, and the error log names both."""
    identify = by_email("token", principals=["Alice@corp.example", "alice@corp.example"])
    with pytest.raises(SlackUserUnknown, match="2 signoff identities that differ only in case"):
        identify("T1", "U1", _mail("alice@corp.example"))
    assert "Alice@corp.example, alice@corp.example" in caplog.text
    assert identify("T1", "U2", _mail("bob@corp.example")).principal_id == "bob@corp.example"


@pytest.mark.parametrize("principals", ["alice@corp.example", [""], [None]])
def test_by_email_refuses_principals_that_are_not_a_list_of_ids(principals: Any) -> None:
    with pytest.raises(so.UsageError, match="by_email: "):
        by_email("token", principals=principals)


def test_a_mapping_that_exits_or_is_interrupted_fails_its_lookup(fake: FakeSlack) -> None:
    """A plain mapping's `sys.exit()` or `KeyboardInterrupt` crossed from its thread into the
    server's event loop and out of it: the server stopped. It is the lookup's failure now."""

    def exits(team_id: str, user_id: str, user: Any) -> Any:
        sys.exit(1)

    def interrupted(team_id: str, user_id: str, user: Any) -> Any:
        raise KeyboardInterrupt

    for mapping, why in [(exits, "SystemExit(1)"), (interrupted, "KeyboardInterrupt")]:
        ids = channel(fake, identify=mapping).identities

        def lookup(ids: Any = ids) -> BaseException | None:
            try:
                asyncio.run(ids._map(TEAM, U_BOB, person(U_BOB, f"bob@{CORP}")))
            except BaseException as exc:  # what the loop let out, in this thread's loop only
                return exc
            return None

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            raised = pool.submit(lookup).result(timeout=30)
        assert isinstance(raised, RuntimeError) and why in str(raised), repr(raised)


def test_identify_by_email_not_called_is_refused(fake: FakeSlack) -> None:
    """`identify=by_email` (for `by_email("sso")`) was asked as the mapping: every click failed
    with 'signoff could not tell who you are (TypeError)'."""
    with pytest.raises(
        so.UsageError, match=r'identify=by_email is not called: .*by_email\("sso"\)'
    ):
        channel(fake, identify=by_email)
