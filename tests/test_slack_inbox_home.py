"""The home a Slack inbox names in the store for the work it saves there (`SlackChannel.home`):
the state file's own id, so another file at the same path (a container's of the same hostname,
each with its own volume at /data) is another home, and one file by two paths is one. Before,
it was the machine's name and the file's absolute path: such a container took the work the
other had taken up for its own and ran it again. The name an older signoff gave still counts
for the work this state took under it."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import ChannelState
from signoff.channels.slack import SlackChannel, _inbox
from signoff.channels.slack._inbox import RETRY_WINDOW, Inbox


@dataclass
class Note:
    text: str


@asynccontextmanager
async def runtime(tmp_path: Path) -> AsyncIterator[so.Runtime]:
    """The store every state shares."""
    async with so.Runtime([], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        yield rt


@asynccontextmanager
async def on_file(
    rt: so.Runtime,
    path: Path,
    ran: list[tuple[str, bool]],
    gate: tuple[asyncio.Event, asyncio.Event] | None = None,
) -> AsyncIterator[tuple[SlackChannel, Inbox[Note]]]:
    """A process's channel on the state file at `path` with an inbox of notes, whose work
    appends `(text, again)` to `ran` (given `gate`, setting its first event when it begins and
    waiting for its second); stopped on leaving."""

    async def run(note: Note, again: bool) -> None:
        if gate is not None:
            gate[0].set()
            await gate[1].wait()
        ran.append((note.text, again))

    slack = SlackChannel("C42", token="xoxb-test", signing_secret="secret")
    state = ChannelState(path)
    try:
        slack.bind(rt, state, hub="hub")
        yield slack, Inbox(slack, "note:", Note, run, "note")
        await slack.idle()
        await slack.close()
    finally:
        state.close()


def swap(tmp_path: Path, out: str, into: str | None) -> None:
    """Put the volume mounted at `data` away as `out` and mount `into` (or a new one) there."""
    (tmp_path / "data").rename(tmp_path / out)
    if into is not None:
        (tmp_path / into).rename(tmp_path / "data")


async def saved(inbox: Inbox[Note], work_id: str = "n1") -> None:
    """Save a note as Slack's 200 would have it saved, the process stopping before it runs."""
    assert await inbox._save(lambda: (work_id, Note("hello")), time.monotonic() + 5) is not None


async def test_work_another_file_at_the_same_path_took_up_is_not_run_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Containers A and B of one hostname, each with its own file at /data/hub.db: A saves a
    note and stops; B takes it up (past `ADOPT_AFTER`) and runs it, the store refusing the
    drop of its copy. A, back, resumes the note: the store names B's file, so A runs nothing
    (before: A's name and B's were one, and A ran it a second time). B's scan drops the copy."""
    monkeypatch.setattr(_inbox, "ADOPT_AFTER", 0.0)
    ran: list[tuple[str, bool]] = []
    path = tmp_path / "data" / "hub.db"
    async with runtime(tmp_path) as rt:
        async with on_file(rt, path, ran) as (_, inbox):
            await saved(inbox)
        swap(tmp_path, "volume-a", None)
        async with on_file(rt, path, ran) as (_, inbox):
            keep = inbox.shared.keep

            async def refusing(memos: dict[str, Any], **how: Any) -> None:
                if None in memos.values():
                    raise so.StoreError("the store is down")
                await keep(memos, **how)

            monkeypatch.setattr(inbox.shared, "keep", refusing)
            await inbox.adopt()
            await inbox.channel.idle()
            assert ran == [("hello", True)]
        swap(tmp_path, "volume-b", "volume-a")
        async with on_file(rt, path, ran) as (a, inbox):
            await inbox.resume()
            await a.idle()
            assert ran == [("hello", True)]  # B's run alone
            assert a.recall("note:n1")["state"] == "done"
            assert await inbox.shared.recall("note:n1") is not None  # B's, to drop
        swap(tmp_path, "volume-a", "volume-b")
        async with on_file(rt, path, ran) as (_, inbox):
            await inbox.adopt()  # finished here, its drop failed: dropped now
            assert await inbox.shared.recall("note:n1") is None
    assert ran == [("hello", True)]


async def test_work_saved_by_one_path_is_resumed_by_another_to_the_same_file(
    tmp_path: Path,
) -> None:
    """A note saved on the state file by one path (`real/hub.db`) and resumed on it by another
    (a symlink's): one file, one home, so it runs, once, and leaves the store. Before, the home
    was the path, and the note was marked done unrun."""
    ran: list[tuple[str, bool]] = []
    (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    async with runtime(tmp_path) as rt:
        async with on_file(rt, tmp_path / "real" / "hub.db", ran) as (_, inbox):
            await saved(inbox)
        async with on_file(rt, tmp_path / "link" / "hub.db", ran) as (slack, inbox):
            await inbox.resume()
            await slack.idle()
            assert ran == [("hello", False)]
            assert await inbox.shared.recall("note:n1") is None


async def test_a_home_is_the_file_or_in_memory_the_channel_object(tmp_path: Path) -> None:
    """Channel objects on one state file share its home (its own id, not its path), those on
    two files at one path in turn do not; in memory, each object is a home of its own."""
    homes: list[str] = []
    async with runtime(tmp_path) as rt:
        for _ in range(2):
            async with on_file(rt, tmp_path / "data" / "hub.db", []) as (first, _):
                async with on_file(rt, tmp_path / "data" / "hub.db", []) as (second, _):
                    assert first.home == second.home == first.state.identity()
                    homes.append(first.home)
            swap(tmp_path, f"volume-{len(homes)}", None)
        assert homes[0] != homes[1]
        state = ChannelState()
        try:
            memory = [SlackChannel("C42", token="xoxb-test", signing_secret="s") for _ in "ab"]
            for slack in memory:
                slack.bind(rt, state)
            assert memory[0].home != memory[1].home
            assert memory[0].old_home is None
        finally:
            state.close()


def old_name(path: Path) -> str:
    """The home an older signoff named for the state file at `path`."""
    return f"{socket.gethostname()}|{os.path.abspath(path)}"


async def test_work_an_older_signoff_took_here_is_still_this_states(tmp_path: Path) -> None:
    """A note this state took under an older signoff (its memo names no home; the store names
    the machine and the path) is resumed and run, once, renamed in the store by this file's
    id while it runs (a container of the same hostname would no longer take it for its own),
    and leaves the store. Not lost in the upgrade."""
    ran: list[tuple[str, bool]] = []
    began, gate = asyncio.Event(), asyncio.Event()
    path = tmp_path / "data" / "hub.db"
    async with runtime(tmp_path) as rt:
        async with on_file(rt, path, ran, (began, gate)) as (slack, inbox):
            older = {"state": "pending", "at": slack.clock(), "tries": 0, "shared": True}
            slack.remember("note:n1", {**older, "text": "hello"})
            await inbox.shared.keep({"note:n1": {"text": "hello", "home": old_name(path)}})
            await inbox.resume()
            await asyncio.wait_for(began.wait(), 10)
            assert (await inbox.shared.recall("note:n1"))["home"] == slack.home
            gate.set()
            await slack.idle()
            assert ran == [("hello", False)]
            assert await inbox.shared.recall("note:n1") is None


async def test_work_an_older_signoffs_hub_took_up_from_here_is_left_to_it(
    tmp_path: Path,
) -> None:
    """A note this state took under this signoff, which the store says an older signoff's hub
    took up (naming the machine and the path: a container of the same hostname, on its own file
    there, in a rolling upgrade): resumed, it is not run here, and the store's copy is left to
    that hub. A copy the store keeps under that name of a note done here under the older
    signoff (its memo naming no home) is dropped as this state's, as that signoff did."""
    ran: list[tuple[str, bool]] = []
    path = tmp_path / "data" / "hub.db"
    async with runtime(tmp_path) as rt:
        async with on_file(rt, path, ran) as (slack, inbox):
            await saved(inbox)
            taken_up = {"text": "hello", "home": old_name(path)}
            await inbox.shared.keep({"note:n1": taken_up})
            await inbox.resume()
            await slack.idle()
            assert ran == []
            assert slack.recall("note:n1")["state"] == "done"
            done_before = {"state": "done", "until": slack.clock() + RETRY_WINDOW}
            slack.remember("note:n2", done_before)
            await inbox.shared.keep({"note:n2": taken_up})
            await inbox.adopt()
            assert await inbox.shared.recall("note:n1") == taken_up
            assert await inbox.shared.recall("note:n2") is None
