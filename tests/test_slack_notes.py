"""The notes only the person who acted sees (`chat.postEphemeral`) against Slack's refusals: a
rate limit (429) is waited out for a while, bounded, and a note Slack will not take is logged
and given up on, holding back nothing."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

import signoff as so
from signoff.channels import ChannelHub
from signoff.channels.slack import SlackChannel

from ._slack import ALICE, FakeSlack, channel, click, fake, manual, question_agent, sign

__all__ = ["fake"]  # the fixture, used by name

NOTE = "chat.postEphemeral"


def _choose(request_id: str) -> bytes:
    """A Slack user's choice on Alice's question: theirs to refuse, so a note tells them."""
    return click(
        {
            "type": "static_select",
            "action_id": "signoff.option",
            "block_id": f"signoff:{request_id}",
            "selected_option": {"value": "2"},
        }
    )


@asynccontextmanager
async def _asked(
    tmp_path: Path, fake: FakeSlack
) -> AsyncIterator[tuple[so.Runtime, SlackChannel, ChannelHub, str]]:
    async with so.Runtime([question_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("shop", prompt="Reorder the soap", auth=ALICE)
        (req,) = r.pending
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack], state=tmp_path / "hub.db")) as hub:
            await hub.poll()
            yield rt, slack, hub, req.id


async def _refused_note(slack: SlackChannel, request_id: str) -> float:
    """Press as someone who may not answer; how long the note took (seconds)."""
    body = _choose(request_id)
    began = time.monotonic()
    await slack.handle(body, sign(body, int(time.time())))
    await slack.idle()
    return time.monotonic() - began


async def test_a_note_refused_with_a_429_is_sent_again_after_its_retry_after(
    tmp_path: Path, fake: FakeSlack
) -> None:
    """Slack did not take the note (a 429 takes nothing): it is sent again once its
    Retry-After has passed, and reaches the person once."""
    async with _asked(tmp_path, fake) as (_, slack, _hub, rid):
        fake.limited[NOTE] = 1
        fake.retry_after = "1"
        took = await _refused_note(slack, rid)
    first, second = fake.of(NOTE)
    assert first == second and second["text"].startswith("You may not answer this request: ")
    assert fake.limited[NOTE] == 0  # the first was refused, the second taken
    assert took >= 1.0


async def test_a_note_rate_limited_again_and_again_is_given_up_after_a_few_tries(
    tmp_path: Path, fake: FakeSlack, caplog: pytest.LogCaptureFixture
) -> None:
    """Each 429 is waited out, but not for ever: after a few tries the note is logged as not
    delivered and the interaction's work ends."""
    async with _asked(tmp_path, fake) as (rt, slack, _hub, rid):
        fake.limited[NOTE] = 100
        fake.retry_after = "0"
        with caplog.at_level(logging.WARNING, logger="signoff.channels"):
            took = await _refused_note(slack, rid)
        stored = await rt.store.get_request(rid)
        assert stored is not None and stored.status == "pending"
    assert 1 < len(fake.of(NOTE)) <= 5 and took < 5
    (line,) = [r.getMessage() for r in caplog.records if "note" in r.getMessage()]
    assert "U045EF6GH" in line and "rate limited" in line, line


async def test_a_long_retry_after_is_not_waited_for(
    tmp_path: Path, fake: FakeSlack, caplog: pytest.LogCaptureFixture
) -> None:
    """A Retry-After of an hour would hold the note's work (and the hub's stop) that long, for
    a note the person no longer expects: it is given up at once, logged, and the channel goes
    on (the next press's note is sent)."""
    async with _asked(tmp_path, fake) as (_, slack, hub, rid):
        fake.limited[NOTE] = 1
        fake.retry_after = "3600"
        with caplog.at_level(logging.WARNING, logger="signoff.channels"):
            took = await _refused_note(slack, rid)
        assert took < 5
        assert len(fake.of(NOTE)) == 1
        (line,) = [r.getMessage() for r in caplog.records if "note" in r.getMessage()]
        assert "3600" in line, line
        fake.retry_after = "1"
        await hub.poll()
        body = click(
            {
                "type": "static_select",
                "action_id": "signoff.option",
                "block_id": f"signoff:{rid}",
                "selected_option": {"value": "1"},
            }
        )
        await slack.handle(body, sign(body, int(time.time())))
        await slack.idle()
    assert len(fake.of(NOTE)) == 2


async def test_stopping_the_hub_ends_a_note_waiting_out_a_rate_limit(
    tmp_path: Path, fake: FakeSlack, caplog: pytest.LogCaptureFixture
) -> None:
    """A note waiting out a Retry-After does not hold up the hub's stop: it is given up."""
    async with so.Runtime([question_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("shop", prompt="Reorder the soap", auth=ALICE)
        (req,) = r.pending
        slack = channel(fake)
        hub = ChannelHub(rt, [slack], state=tmp_path / "hub.db")
        await hub.start(follow=False)
        try:
            await hub.poll()
            fake.limited[NOTE] = 100
            fake.retry_after = "20"
            body = _choose(req.id)
            await slack.handle(body, sign(body, int(time.time())))
            for _ in range(100):  # until the note was refused once and is waiting
                if fake.of(NOTE):
                    break
                await asyncio.sleep(0.05)
        finally:
            began = time.monotonic()
            with caplog.at_level(logging.WARNING, logger="signoff.channels"):
                await hub.stop()
            stopped = time.monotonic() - began
    assert stopped < 5
    assert len(fake.of(NOTE)) == 1
    assert any("note" in r.getMessage() for r in caplog.records)


async def test_a_note_to_someone_no_longer_in_the_channel_is_logged_as_such(
    tmp_path: Path, fake: FakeSlack, caplog: pytest.LogCaptureFixture
) -> None:
    """Slack refuses a note to a person who left the channel (`user_not_in_channel`): it is
    logged as a note not delivered, naming Slack's error, not as the interaction failing."""
    async with _asked(tmp_path, fake) as (_, slack, _hub, rid):
        fake.failing[NOTE] = "user_not_in_channel"
        with caplog.at_level(logging.WARNING, logger="signoff.channels"):
            await _refused_note(slack, rid)
    assert len(fake.of(NOTE)) == 1
    lines = [r.getMessage() for r in caplog.records]
    assert not [line for line in lines if "failed" in line], lines
    (line,) = [line for line in lines if "note" in line]
    assert "user_not_in_channel" in line and "U045EF6GH" in line, line


async def test_a_note_a_standby_took_gives_up_when_the_hub_that_took_over_stops(
    tmp_path: Path, fake: FakeSlack
) -> None:
    """A standby hub's channel (not started) takes a press whose note waits out a rate limit;
    that hub then takes over delivery (its channel starts) and stops: the note gives up then,
    it does not hold the stop for its Retry-After."""
    async with so.Runtime([question_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("shop", prompt="Reorder the soap", auth=ALICE)
        (req,) = r.pending
        state = tmp_path / "hub.db"
        slacks = [channel(fake) for _ in range(2)]
        one, two = (ChannelHub(rt, [s], state=state) for s in slacks)
        for hub in (one, two):
            await hub.start(follow=False)
        try:
            await one.poll()
            assert one.active and not two.active
            fake.limited[NOTE] = 100
            fake.retry_after = "20"
            body = _choose(req.id)
            await slacks[1].handle(body, sign(body, int(time.time())))
            async with asyncio.timeout(10):
                while not fake.of(NOTE):  # refused once: the note waits
                    await asyncio.sleep(0.01)
            await one.stop()
            await two.poll()
            assert two.active
        finally:
            began = time.monotonic()
            for hub in (one, two):
                await hub.stop()
            stopped = time.monotonic() - began
    assert stopped < 5
    assert len(fake.of(NOTE)) == 1
