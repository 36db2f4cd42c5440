"""What reaches the Slack channel's endpoints (`_routes`, `_payloads`): only fresh interactions
signed with the signing secret act, replays and Slack's retries act once, and malformed
payloads or settings are named, never a 500.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
from starlette.testclient import TestClient

import signoff as so
from signoff.channels import ChannelHub, InvalidSignature
from signoff.channels.slack import SlackChannel, _routes
from signoff.server import create_app
from signoff.stores import promptly
from signoff.stores._prompt import is_prompt
from signoff.testing import call, call_tools, reply, scripted_agent

from ._slack import (
    ALICE,
    PATH,
    SECRET,
    TEAM,
    FakeSlack,
    channel,
    click,
    form,
    manual,
    refund_requested,
    refund_runtime,
    sign,
    slack_api,
    submission,
)

__all__ = ["slack_api"]  # the fixture, used by name


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


@pytest.mark.parametrize("given", ["#approvals", "approvals", "c0123abcd", " C0123ABCD", "C01\n"])
def test_a_channel_name_is_refused_for_its_id(given: str) -> None:
    """chat.postMessage takes a channel's name too, so `#approvals` posted, but the history a
    post whose answer was lost (a crash, a gateway's 5xx) is looked for in takes only the id:
    Slack answers `channel_not_found`, and the channel waited for ever telling the operator to
    invite the bot; a removed bot's refusals were not recognised either (Slack's answers name
    the id). A name, or anything else than an id, is refused when the channel is made."""
    with pytest.raises(so.UsageError, match="the Slack channel's id") as caught:
        SlackChannel(given, signing_secret=SECRET, token="xoxb-test")
    assert repr(given) in str(caught.value)
    for good in ("C0123ABCD", "G024BE91L", "D024BE91L"):
        assert SlackChannel(good, signing_secret=SECRET, token="xoxb-test").channel == good


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


async def test_a_payload_error_does_not_send_the_body_back(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """A signed body the endpoint cannot read gets a 400 `invalid_payload` whose message is
    a few hundred characters, whatever the body's size: a parser's error quotes the field it
    could not read, and the 400 sent back 3 MB of a 3 MB body. Nothing is answered."""
    log: list[Any] = []
    async with refund_runtime(tmp_path, log) as rt:
        (req,) = (await rt.generate("support", prompt="Refund order 1042", auth=ALICE)).pending
        slack = channel(slack_api)
        hub = ChannelHub(rt, [slack])
        app = create_app(rt, dev=True, channels=hub)
        unreadable = b'{"type":"block_actions","note":"' + b"x" * 1_000_000 + b'"}'
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                now = int(time.time())
                response = await http.post(PATH, content=unreadable, headers=sign(unreadable, now))
            await slack.idle()
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "invalid_payload"
        assert len(response.content) < 500
        assert response.json()["error"]["message"].startswith("expected a form with a JSON")
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"
        assert log == [] and slack_api.of("chat.postEphemeral") == []


async def test_refused_signatures_are_logged_for_the_operator_without_secrets(
    tmp_path: Path,
    slack_api: FakeSlack,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A wrong signing secret (the app's client secret given for it, say) refuses every click
    Slack sends with a 401, and Slack only shows the person an error: the server logs that
    an endpoint refused requests for their signature and what to check, naming neither the
    secret nor the signature. A flood is logged once a `REFUSED_LOGGED_EVERY`, with its count;
    nothing is answered."""
    log: list[Any] = []
    async with refund_requested(tmp_path, log) as (rt, req):
        slack = SlackChannel(
            "C42", token="xoxb-test", base_url=slack_api.url, signing_secret="the-client-secret"
        )
        hub = ChannelHub(rt, [slack])
        app = create_app(rt, dev=True, channels=hub)
        body = click({"action_id": "signoff.approve", "block_id": "signoff:r", "value": req.id})
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:

                async def refused(path: str) -> list[str]:
                    caplog.clear()
                    with caplog.at_level("WARNING", logger="signoff.channels"):
                        headers = sign(body, int(time.time()))  # signed with Slack's SECRET
                        response = await http.post(path, content=body, headers=headers)
                    assert response.status_code == 401
                    for record in caplog.records:
                        message = record.getMessage()
                        assert SECRET not in message and "the-client-secret" not in message
                        assert headers["X-Slack-Signature"][3:] not in message
                    return [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]

                (line,) = await refused(PATH)
                assert f"{PATH} refused 1 request(s)" in line
                assert "signature does not match" in line
                assert "Signing Secret" in line and "--slack-signing-secret" in line
                assert await refused(PATH) == []  # within the minute: counted, not logged
                (events,) = await refused("/channels/slack/events")  # each endpoint its own
                assert "/channels/slack/events refused 1 request(s)" in events
                monkeypatch.setattr(_routes, "REFUSED_LOGGED_EVERY", 0.0)
                (again,) = await refused(PATH)
                assert f"{PATH} refused 2 request(s)" in again
            await slack.idle()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"
        assert log == [] and slack_api.of("chat.postEphemeral") == []


async def test_interactions_sent_to_the_events_url_are_logged_with_the_urls_to_set(
    tmp_path: Path, slack_api: FakeSlack, caplog: pytest.LogCaptureFixture
) -> None:
    """An app whose Interactivity Request URL was set to the events path (Slack checks only the
    events one when it is set) has every click refused with a 400, Slack showing the person
    an error: the server logs it, with the URLs the app must name; nothing is answered."""
    log: list[Any] = []
    async with refund_requested(tmp_path, log) as (rt, req):
        slack = channel(slack_api)
        hub = ChannelHub(rt, [slack])
        app = create_app(rt, dev=True, channels=hub)
        body = click({"action_id": "signoff.approve", "block_id": "signoff:r", "value": req.id})
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                # Two clicks, signed at two times (no replay): the same time when the second
                # read the clock a second after the first did, so it was refused as a replay.
                now = int(time.time())
                with caplog.at_level("WARNING", logger="signoff.channels"):
                    for n in range(2):
                        response = await http.post(
                            "/channels/slack/events", content=body, headers=sign(body, now - n)
                        )
                        assert response.status_code == 400
            await slack.idle()
        lines = [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()]
        assert len(lines) == 1  # the second within the minute is counted, not logged
        (line,) = lines
        assert "/channels/slack/events refused 1 request(s) as unreadable" in line
        assert f"Interactivity Request URL ends in {PATH}" in line
        assert "Event Subscriptions Request URL in /channels/slack/events" in line
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"
        assert log == [] and slack_api.of("chat.postEphemeral") == []


def test_two_channels_on_one_path_are_refused_when_the_app_is_made(tmp_path: Path) -> None:
    """Two `SlackChannel`s in one hub on the default paths: Starlette served only the first's
    routes, so a reply in the second's thread reached the first, which did not know its thread,
    and Slack was answered 200 with nothing done. Refused when the app is made; channels on
    paths of their own (each its own Slack app) are served, each at its own."""
    rt = so.Runtime([], store=f"sqlite:///{tmp_path}/s.db")
    first = SlackChannel("C1", token="x", signing_secret=SECRET, name="first")
    second = SlackChannel("C2", token="x", signing_secret=SECRET, name="second")
    hub = ChannelHub(rt, [first, second], state=tmp_path / "hub.db")
    with pytest.raises(so.UsageError, match=r"POST /channels/slack/interactivity is served al"):
        create_app(rt, dev=True, channels=hub)
    apart = SlackChannel(
        "C2",
        token="x",
        signing_secret=SECRET,
        name="second",
        path="/channels/slack2/interactivity",
        events_path="/channels/slack2/events",
    )
    half = SlackChannel(
        "C3",
        token="x",
        signing_secret=SECRET,
        name="third",
        path="/channels/slack3/interactivity",
        events_path="/channels/slack/events",
    )
    with pytest.raises(so.UsageError, match=r"POST /channels/slack/events is served already"):
        create_app(rt, dev=True, channels=ChannelHub(rt, [first, half], state=tmp_path / "h.db"))
    taken = SlackChannel("C4", token="x", signing_secret=SECRET, name="api", path="/v1/sessions")
    with pytest.raises(so.UsageError, match=r"POST /v1/sessions is served already"):
        create_app(rt, dev=True, channels=ChannelHub(rt, [taken], state=tmp_path / "t.db"))
    app = create_app(rt, dev=True, channels=ChannelHub(rt, [first, apart], state=tmp_path / "a.db"))
    client = TestClient(app)  # no lifespan: the hub, which would call Slack, is not started
    for path in ("/channels/slack/events", "/channels/slack2/events"):
        refused = client.post(path, content=b"{}", headers={"Content-Type": "application/json"})
        assert refused.status_code == 401, (path, refused.text)  # unsigned: each one's check
    rt.close_sync()
