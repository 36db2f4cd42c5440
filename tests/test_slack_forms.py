"""What the person who pressed a request's button is told: whether Deny's or free text's form
(`views.open`) opened when Slack's answer does not say, that they may not answer (or that the
request's session, or one above it, expired) before any form opens, and notes of any length,
clipped to what Slack takes."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

import signoff as so
from signoff.channels import ChannelHub
from signoff.channels.slack import _clicks as clicks
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from ._slack import (
    ALICE,
    FakeSlack,
    channel,
    click,
    fake,
    manual,
    question_agent,
    refund_requested,
    sign,
)

__all__ = ["fake"]  # the fixture, used by name

MAYBE = "Slack did not confirm that the form opened: if it did not, press the button again."


@pytest.mark.parametrize(
    ("answer", "told"),
    [
        ("lost", MAYBE),  # a gateway's 504 after Slack opened the form
        ("internal_error", MAYBE),  # Slack's own "some aspect may have succeeded"
        ("down", "Slack could not open the form: press the button again."),  # 503: not taken
        (
            "invalid_arguments",
            "Slack could not open the form (invalid_arguments): press the button again.",
        ),
    ],
)
async def test_a_form_slack_may_have_opened_is_never_said_to_have_failed(
    tmp_path: Path, fake: FakeSlack, answer: str, told: str
) -> None:
    """A gateway's 5xx (other than 503, which says the call was not taken) or Slack's
    `internal_error` can come after the form opened: the person is told to press again only if
    no form opened, as after a dropped connection, never that Slack could not open it."""
    async with refund_requested(tmp_path, []) as (rt, req):
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            if answer == "lost":
                fake.lost["views.open"] = 1
            elif answer == "down":
                fake.down["views.open"] = 1
            else:
                fake.failing["views.open"] = answer
            body = click({"action_id": "signoff.deny", "value": req.id, "type": "button"})
            assert await slack.handle(body, sign(body, int(time.time()))) is None
            await slack.idle()
        assert len(fake.of("views.open")) == 1
        assert [e["text"] for e in fake.of("chat.postEphemeral")] == [told]
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"


async def test_a_form_is_not_opened_for_a_person_who_may_not_answer(
    tmp_path: Path, fake: FakeSlack
) -> None:
    """Alice's question is hers to answer: a Slack user's press of "Answer in your own words"
    opens no form (its submission could only be refused, after they wrote their answer); they
    are told at once that they may not answer, and the request stays open. A question asked
    with no principal is anyone's: its form opens."""
    async with so.Runtime([question_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        (hers,) = (await rt.generate("shop", prompt="Reorder the soap", auth=ALICE)).pending
        (anyones,) = (await rt.generate("shop", prompt="Reorder the soap")).pending
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            for req, trigger in ((hers, "1.2.hers"), (anyones, "1.2.anyones")):
                press = {"action_id": "signoff.text", "value": req.id, "type": "button"}
                body = click(press, trigger=trigger)
                assert await slack.handle(body, sign(body, int(time.time()))) is None
                await slack.idle()
        assert [v["trigger_id"] for v in fake.of("views.open")] == ["1.2.anyones"]
        (note,) = fake.of("chat.postEphemeral")
        assert note["text"].startswith("You may not answer this request: "), note["text"]
        assert note["user"] == "U045EF6GH" and note["channel"] == "C42"
        for req in (hers, anyones):
            stored = await rt.store.get_request(req.id)
            assert stored is not None and stored.status == "pending"


async def test_a_person_who_may_not_answer_is_told_so_once_the_request_closed(
    tmp_path: Path, fake: FakeSlack
) -> None:
    """Alice answered her question: a Slack user who could not have answered it, pressing
    "Answer in your own words" on its message, was told it is no longer open, where while it
    was open they were told they may not answer it. They are told the same either way."""
    async with so.Runtime([question_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        (hers,) = (await rt.generate("shop", prompt="Reorder the soap", auth=ALICE)).pending
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            answer = so.InputResponse(request_id=hers.id, option_id="1")
            await rt.respond(hers.session_id, [answer], principal=ALICE, resume=False)
            press = {"action_id": "signoff.text", "value": hers.id, "type": "button"}
            body = click(press, trigger="1.2.closed")
            assert await slack.handle(body, sign(body, int(time.time()))) is None
            await slack.idle()
        assert fake.of("views.open") == []
        (note,) = fake.of("chat.postEphemeral")
        assert note["text"].startswith("You may not answer this request: "), note["text"]


async def test_a_note_too_long_for_slack_reaches_the_person_clipped(
    tmp_path: Path, fake: FakeSlack
) -> None:
    """The note a person is told (here a response policy's refusal, whose reason is the
    policy's own and can be any length) is clipped to what Slack takes: one past its limit
    would be refused (`msg_too_long`) and the person told nothing of why their answer did not
    count."""

    async def verbose(ctx: so.ResponseContext) -> so.Rejected:
        return so.Rejected(reason="not on the rota; " + "see the policy. " * 5000)

    @so.tool(approval=so.ApprovalSpec(request=so.always(), response=verbose))
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    agent = scripted_agent(
        "support",
        [call_tools(call("issue_refund", order_id="1042")), reply("Done.")],
        tools=[issue_refund],
    )
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        (req,) = (await rt.generate("support", prompt="Refund 1042")).pending
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            body = click({"action_id": "signoff.approve", "value": req.id, "type": "button"})
            assert await slack.handle(body, sign(body, int(time.time()))) is None
            await slack.idle()
        (note,) = fake.of("chat.postEphemeral")
        assert note["text"].startswith("Your answer was not accepted (rejected: not on the rota;")
        assert len(note["text"]) <= 3000 and note["text"].endswith("…")
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"


@pytest.mark.parametrize("slow", [False, True])
async def test_no_form_opens_for_a_request_whose_session_passed_its_ttl(
    tmp_path: Path, fake: FakeSlack, monkeypatch: pytest.MonkeyPatch, slow: bool
) -> None:
    """The session's TTL passed with nobody looking (its request still recorded open): Deny
    pressed on its message opens no reason form, whose submission could only be refused
    (`SessionExpired`) with the reason typed lost. As a press of Approve, the press records the
    expiry and the person is told at once; the hub's next poll shows the message expired. A
    check slower than `FORM_WAIT` (`slow`) turns the form it let open into the reason."""
    if slow:
        monkeypatch.setattr(clicks, "FORM_WAIT", 0.0)

    agent = _expiring_refunds()
    clock = ManualClock()
    store = f"sqlite:///{tmp_path / 's.db'}"
    async with so.Runtime([agent], store=store, clock=clock) as rt:
        (req,) = (await rt.generate("support", prompt="Refund 1042")).pending  # anyone's
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack], clock=clock)) as hub:
            await hub.poll()
            clock.advance(120)
            body = click({"action_id": "signoff.deny", "value": req.id, "type": "button"})
            assert await slack.handle(body, sign(body, int(time.time()))) is None
            await slack.idle()
            assert len(fake.of("views.open")) == (1 if slow else 0)
            stored = await rt.store.get_request(req.id)
            assert stored is not None and stored.status == "expired"
            await hub.poll()
        why = (
            "This request can no longer be answered: "
            f"session {req.session_id!r} expired with pending requests {req.id}"
        )
        told_instead_of_a_form(fake, why, slow, "Expired: ")


async def test_a_person_who_may_not_answer_is_told_so_once_the_session_passed_its_ttl(
    tmp_path: Path, fake: FakeSlack
) -> None:
    """Alice's approval, its session past its TTL: a Slack user who could not have answered it
    pressing Approve was told `Your answer was not accepted: session ... expired`, where Deny
    (its form) told them they may not answer it. Both now say so, as while it was open."""

    agent = _expiring_refunds()
    clock = ManualClock()
    store = f"sqlite:///{tmp_path / 's.db'}"
    async with so.Runtime([agent], store=store, clock=clock) as rt:
        (req,) = (await rt.generate("support", prompt="Refund 1042", auth=ALICE)).pending
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack], clock=clock)) as hub:
            await hub.poll()
            clock.advance(120)
            for action, trigger in (
                ("signoff.approve", "1.2.approve"),
                ("signoff.deny", "1.2.deny"),
            ):
                press = {"action_id": action, "value": req.id, "type": "button"}
                body = click(press, trigger=trigger)
                assert await slack.handle(body, sign(body, int(time.time()))) is None
                await slack.idle()
        assert fake.of("views.open") == []
        notes = [n["text"] for n in fake.of("chat.postEphemeral")]
        assert len(notes) == 2 and notes[0] == notes[1], notes
        assert notes[0].startswith("You may not answer this request: "), notes


@pytest.mark.parametrize(
    ("asked", "slow"), [("approval", False), ("approval", True), ("question", False)]
)
async def test_no_form_opens_for_a_subagents_request_once_its_parents_ttl_passed(
    tmp_path: Path, fake: FakeSlack, monkeypatch: pytest.MonkeyPatch, asked: str, slow: bool
) -> None:
    """A subagent's request, its own session alive but its parent's past its TTL (with nobody
    looking): that ended the delegated turn that asked it, so Deny's form (or a question's
    "Answer in your own words") opened, and the reason or answer typed in it was refused
    (`withdrawn`) and lost. As a press of Approve does, the press records it (the parent's
    expiry, the request withdrawn) and the person is told at once, instead of a form; the
    request's message shows it withdrawn. A check slower than `FORM_WAIT` (`slow`) turns the
    form it let open into the reason."""
    if slow:
        monkeypatch.setattr(clicks, "FORM_WAIT", 0.0)
    child = question_agent() if asked == "question" else _expiring_refunds(ttl=None)
    parent = scripted_agent(
        "desk",
        [
            call_tools(call(child.name, call_id="d1", message="Go on")),
            reply("Done."),
        ],
        tools=[so.delegate(child.name)],
        limits=so.Limits(ttl=60),
    )
    clock = ManualClock()
    store = f"sqlite:///{tmp_path / 's.db'}"
    async with so.Runtime([parent, child], store=store, clock=clock) as rt:
        top = await rt.generate("desk", prompt="Handle it")
        (mirror,) = top.pending
        assert mirror.child is not None
        rid = mirror.child.request_id
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack], clock=clock)) as hub:
            await hub.poll()
            assert len(fake.of("chat.postMessage")) == 1  # the subagent's request, not its mirror
            clock.advance(61)
            press = "signoff.text" if asked == "question" else "signoff.deny"
            body = click({"action_id": press, "value": rid, "type": "button"})
            assert await slack.handle(body, sign(body, int(time.time()))) is None
            await slack.idle()
            assert len(fake.of("views.open")) == (1 if slow else 0)
            stored = await rt.store.get_request(rid)
            assert stored is not None and stored.status == "withdrawn"
            parents = await rt.store.get_request(mirror.id)
            assert parents is not None and parents.status == "expired"
            await hub.poll()
        why = (
            "This request can no longer be answered: "
            f"request {rid} is withdrawn (cancelled); it takes no answers"
        )
        told_instead_of_a_form(fake, why, slow, "Withdrawn: ")


async def test_a_note_whose_connection_dropped_leaves_the_rest_of_the_press_done(
    tmp_path: Path,
    fake: FakeSlack,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The press's note (its session passed its TTL) sent, and its connection dropped before
    Slack answered (twice: slack_sdk sends it again once): `chat.postEphemeral` raised
    aiohttp's `ServerDisconnectedError`, which the note let out (only Slack's refusals were
    logged), and the press's work ended there, logged as failed, the form a slow check let
    open left with its submit button. The note is logged as unanswered instead, and the form
    still turned into the reason."""
    monkeypatch.setattr(clicks, "FORM_WAIT", 0.0)
    clock = ManualClock()
    store = f"sqlite:///{tmp_path / 's.db'}"
    async with so.Runtime([_expiring_refunds()], store=store, clock=clock) as rt:
        (req,) = (await rt.generate("support", prompt="Refund 1042")).pending
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack], clock=clock)) as hub:
            await hub.poll()
            clock.advance(120)
            fake.dropped["chat.postEphemeral"] = 2
            body = click({"action_id": "signoff.deny", "value": req.id, "type": "button"})
            with caplog.at_level(logging.WARNING, logger="signoff.channels"):
                assert await slack.handle(body, sign(body, int(time.time()))) is None
                await slack.idle()
    assert len(fake.of("chat.postEphemeral")) == 2 and fake.dropped["chat.postEphemeral"] == 0
    (form,) = fake.of("views.update")
    assert "submit" not in form["view"]
    assert form["view"]["blocks"][0]["text"]["text"].startswith(
        "This request can no longer be answered: "
    )
    lines = [r.getMessage() for r in caplog.records]
    assert not [line for line in lines if "failed" in line], lines
    (line,) = [line for line in lines if "note" in line]
    assert "went unanswered" in line and "ServerDisconnectedError" in line, line


def _expiring_refunds(ttl: float | None = 60) -> so.Agent:
    """`support`, whose refunds need approval and whose sessions expire after `ttl` seconds."""

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    return scripted_agent(
        "support",
        [call_tools(call("issue_refund", order_id="1042")), reply("Done.")],
        tools=[issue_refund],
        limits=so.Limits(ttl=ttl),
    )


def told_instead_of_a_form(fake: FakeSlack, why: str, slow: bool, shown: str) -> None:
    """The person was told `why` (a form a slow check let open turned into it, its submit
    button gone), and the message was shown closed, starting with `shown`."""
    (note,) = fake.of("chat.postEphemeral")
    assert note["text"] == why
    if slow:
        (form,) = fake.of("views.update")
        assert "submit" not in form["view"]
        assert form["view"]["blocks"][0]["text"]["text"] == why
    (update,) = fake.of("chat.update")
    assert update["text"].startswith(shown), update["text"]
