"""How often the Slack inbox runs a piece of saved work: once while it runs (a scan that finds
it pending meanwhile starts nothing), and never once it is done (by another process sharing the
channel state, say); a damaged memo beside it does not keep it from running."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import signoff as so
from signoff.channels import ChannelState
from signoff.channels._base import off_loop
from signoff.channels.slack import SlackChannel
from signoff.channels.slack._inbox import RETRY_WINDOW, Inbox

from ._channel_state import damage_memo


@dataclass
class Note:
    text: str


@asynccontextmanager
async def inbox_of(
    tmp_path: Path, ran: list[tuple[str, bool]], gate: asyncio.Event | None = None
) -> AsyncIterator[tuple[SlackChannel, Inbox[Note]]]:
    """An inbox of notes on a channel bound to a runtime and a state file; its work appends
    `(text, again)` to `ran`, after `gate` opens if one is given."""

    async def run(note: Note, again: bool) -> None:
        if gate is not None:
            await gate.wait()
        ran.append((note.text, again))

    slack = SlackChannel("C42", token="xoxb-test", signing_secret="secret")
    state = ChannelState(tmp_path / "hub.db")
    try:
        async with so.Runtime([], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
            slack.bind(rt, state)
            yield slack, Inbox(slack, "note:", Note, run, "note")
            await slack.idle()
    finally:
        state.close()


async def test_work_running_is_not_started_again_by_a_scan(tmp_path: Path) -> None:
    """The start's scan (or a tick's) finds the work of a delivery being run still pending: it
    is not run a second time beside the first."""
    ran: list[tuple[str, bool]] = []
    gate = asyncio.Event()
    async with inbox_of(tmp_path, ran, gate) as (slack, inbox):
        await inbox.admit(lambda: ("n1", Note("hello")))
        for _ in range(20):  # let the run begin and reach the gate
            await asyncio.sleep(0)
        await inbox.resume()
        gate.set()
        await slack.idle()
        assert ran == [("hello", False)]
        assert slack.recall("note:n1")["state"] == "done"


async def test_work_another_process_finished_is_not_run(tmp_path: Path) -> None:
    """Work found pending and finished by another process before this one counts its run is
    not run again: its memo says done."""
    ran: list[tuple[str, bool]] = []
    async with inbox_of(tmp_path, ran) as (slack, inbox):
        done = {"state": "done", "until": slack.clock() + RETRY_WINDOW}
        slack.remember("note:n1", done)
        inbox._start("n1", Note("hello"))  # as a scan that read it pending would
        await slack.idle()
        assert ran == []
        assert slack.recall("note:n1") == done


async def test_saved_work_is_resumed_and_threads_tidied_past_a_damaged_memo(
    tmp_path: Path,
) -> None:
    """One memo of the state file not JSON (damaged by hand or by a tool) failed each scan of
    saved work with a `JSONDecodeError`, so the work a dead process left was never resumed,
    nor old threads tidied, nor a reply's request found by its message."""
    ran: list[tuple[str, bool]] = []
    async with inbox_of(tmp_path, ran) as (slack, inbox):
        slack.remember("note:n1", {"state": "pending", "at": 0, "tries": 0, "text": "hello"})
        path = Path(slack.state.path)
        for key in ("note:n2", "thread:C42:1.1", "msg:r2"):
            damage_memo(path, slack._hub, slack.name, key, "{not json")
        slack.remember("thread:C42:2.2", {"request_id": "r3", "closed_at": 0})
        slack.remember("msg:r4", {"channel": "C42", "ts": "4.4"})
        await inbox.resume()
        await slack.idle()
        assert ran == [("hello", False)]
        await off_loop(slack.replies._tidy_threads)
        assert slack.recall("thread:C42:2.2") is None  # closed long ago: dropped
        assert slack.replies._request_of("C42", "1.1") is None
        assert slack.replies._request_of("C42", "4.4") == "r4"
