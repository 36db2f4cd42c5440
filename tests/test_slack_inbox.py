"""The exact boundary of the Slack inbox's acknowledgement deadline (`ACK_WITHIN`), on an event
loop whose clock the test moves: a delivery saved one tick before it is taken; one saved at or
after it gets a `StoreError` (Slack's 503), and its work still runs, once, however often Slack
sends it again."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

import signoff as so
from signoff.channels import ChannelState
from signoff.channels.slack import SlackChannel, _inbox
from signoff.channels.slack._inbox import ACK_WITHIN, Inbox

TICK = 0.001  # well above the loop's clock resolution, which lets a timer fire that early


@dataclass
class Note:
    text: str


@contextmanager
def loop_clock(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> Iterator[list[float]]:
    """Freeze the loop's clock (its timers: `asyncio.wait_for`) and the inbox's own reading of
    `time.monotonic()` (its deadline) at one value; the test moves both by setting the list's one
    item. With the inbox's reading left running, a stall of a millisecond between its two
    readings (CI's loaded machine) moved the timer before the save."""
    now = [loop.time()]
    setattr(loop, "time", lambda: now[0])  # noqa: B010 (mypy refuses `loop.time = ...`)
    monkeypatch.setattr(_inbox, "time", SimpleNamespace(monotonic=lambda: now[0]))
    try:
        yield now
    finally:
        delattr(loop, "time")
        monkeypatch.undo()


@pytest.mark.parametrize(
    ("offset", "taken"), [(-TICK, True), (0.0, False), (TICK, False)], ids=["before", "at", "after"]
)
async def test_a_delivery_is_taken_only_if_saved_before_the_ack_deadline(
    tmp_path: Path, offset: float, taken: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[tuple[str, bool]] = []

    async def run(note: Note, again: bool) -> None:
        ran.append((note.text, again))

    slack = SlackChannel("C42", token="xoxb-test", signing_secret="secret")
    state = ChannelState(tmp_path / "hub.db")
    async with so.Runtime([], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        slack.bind(rt, state)
        inbox = Inbox(slack, "note:", Note, run, "note")
        assert inbox.ack_within == ACK_WITHIN
        loop = asyncio.get_running_loop()

        def saved_at(now: list[float], at: float) -> Callable[[], tuple[str, Note]]:
            def pick() -> tuple[str, Note]:
                now[0] = at  # the save ends at this time of the loop's clock
                return "n1", Note("hello")

            return pick

        with loop_clock(loop, monkeypatch) as now:
            deadline = now[0] + ACK_WITHIN
            if taken:
                await inbox.admit(saved_at(now, deadline + offset))
            else:
                with pytest.raises(so.StoreError, match=r"not saved within 2s"):
                    await inbox.admit(saved_at(now, deadline + offset))
        await slack.idle()
        assert ran == [("hello", False)]  # a save that ended late starts its work all the same
        assert inbox.seen("n1") and slack.recall("note:n1")["state"] == "done"
        await inbox.admit(lambda: ("n1", Note("hello")))  # Slack sends it again: nothing runs
        await slack.idle()
        assert ran == [("hello", False)]
    state.close()


def test_a_step_back_of_the_wall_clock_holds_off_no_scan() -> None:
    """The every-`TIDY_EVERY` scan (resuming answers whose settling failed) was paced by the
    wall clock alone: stepped back an hour, no scan ran for an hour and five minutes. It now
    counts from the step."""
    from slack_sdk.web.async_client import AsyncWebClient

    wall = [1_800_000_000.0]
    client = AsyncWebClient(token="xoxb-test")
    slack = SlackChannel("C0123ABCD", signing_secret="x", client=client, clock=lambda: wall[0])
    inbox = slack.clicks.inbox
    assert inbox.due() and not inbox.due()
    wall[0] -= 3600
    assert not inbox.due()
    wall[0] += _inbox.TIDY_EVERY - 1
    assert not inbox.due()
    wall[0] += 1
    assert inbox.due()
