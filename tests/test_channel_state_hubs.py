"""One hub delivers per state file, the others stand by: two hubs on one file deliver each
request once, and so do hubs on memory states sharing a store, names that would collide are
refused, and a standby takes over when the delivering process is killed.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import Channel, ChannelHub, ChannelState

from ._channel_state import (
    Seen,
    gated,
    open_one,
)


async def test_two_hubs_on_one_state_file_deliver_each_request_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "channels.db"
    async with gated(tmp_path) as rt:
        first, second = Seen(), Seen()
        one = ChannelHub(rt, [first], state=state)
        two = ChannelHub(rt, [second], state=state)
        await one.start(follow=False)
        with caplog.at_level(logging.WARNING, logger="signoff.channels"):
            await two.start(follow=False)
        try:
            r1 = await open_one(rt)
            for _ in range(3):
                await two.poll()
                await one.poll()
            assert first.opened == [r1] and second.opened == []
            assert one.active and not two.active
            standby = [r for r in caplog.records if "stands by" in r.getMessage()]
            assert len(standby) == 1  # said once, not on every poll
            await one.stop()  # the first lets go: the second delivers from where it stopped
            r2 = await open_one(rt)
            await two.poll()
            assert two.active and second.opened == [r2]
            await one.start(follow=False)  # back again, it is now the standby
            await one.poll()
            assert not one.active and first.opened == [r1]
            # another hub name, or another channel, has its own position and its own lock
            other = ChannelHub(rt, [Seen()], state=state, name="other")
            await other.start(follow=False)
            assert other.active
            await other.stop()
            hooks, again = Seen("hooks"), Seen()
            both = ChannelHub(rt, [again, hooks], state=state)
            await both.start(follow=False)
            r3 = await open_one(rt)
            await both.poll()
            await two.poll()
            assert not both.active  # it delivers to hooks, and stands by for seen
            assert hooks.opened == [r3] and again.opened == [] and second.opened == [r2, r3]
            await two.stop()
            await both.poll()
            assert both.active and again.opened == []  # r3 was delivered already
            r4 = await open_one(rt)
            await both.poll()
            assert again.opened == hooks.opened[1:] == [r4]
            await both.stop()
        finally:
            await one.stop()
            await two.stop()


async def test_hubs_on_memory_states_on_one_store_deliver_once(tmp_path: Path) -> None:
    """Hubs on memory states shared nothing and each delivered everything (two `serve`
    processes on one store each posted every request); the claim in the store lets one
    deliver (`tests/test_channel_claims.py`)."""
    async with gated(tmp_path) as rt:
        first, second = Seen(), Seen()
        async with ChannelHub(rt, [first]) as one, ChannelHub(rt, [second]) as two:
            assert one.active and not two.active


async def test_names_that_would_share_a_position_or_a_lock_are_refused(tmp_path: Path) -> None:
    """A channel's position is kept under `<hub>:<channel>` and its lock under `<hub>.<channel>`:
    hub `a:b` with channel `c` and hub `a` with channel `b:c` would share a position, and one
    hub would skip what it never delivered. Names with `:` or `.` are refused at once."""

    class Dotted(Channel):
        name = "b.c"  # a subclass's name set on the class, not through __init__

    async with gated(tmp_path) as rt:
        for hub, channel in (("a:b", "c"), ("a", "b:c"), ("a.b", "c"), ("a", "b.c")):
            with pytest.raises(so.UsageError, match="':' or '.'"):
                ChannelHub(rt, [Seen(channel)], state=tmp_path / "hub.db", name=hub)
        with pytest.raises(so.UsageError, match="':' or '.'"):
            ChannelHub(rt, [Dotted()], state=tmp_path / "hub.db", name="a")
        assert not (tmp_path / "hub.db").exists()  # nothing was opened or written
        # what the names keep apart still works: another hub's channel of the same name
        first, second = Seen("c"), Seen("c")
        one = ChannelHub(rt, [first], state=tmp_path / "hub.db", name="a-b")
        two = ChannelHub(rt, [second], state=tmp_path / "hub.db", name="a_b")
        await one.start(follow=False)
        await two.start(follow=False)
        try:
            assert one.active and two.active
            r1 = await open_one(rt)
            await one.poll()
            await two.poll()
            assert first.opened == second.opened == [r1]
        finally:
            await one.stop()
            await two.stop()


_HUB = """
import asyncio, sys
import signoff as so
from signoff.channels import Channel, ChannelHub

class Log(Channel):
    name = "seen"

    async def on_requested(self, request):
        with open(sys.argv[3], "a") as out:
            out.write(request.id + "\\n")

async def main():
    async with so.Runtime([], store=sys.argv[1]) as rt:
        async with ChannelHub(rt, [Log()], state=sys.argv[2], poll_interval=0.05) as hub:
            print("active" if hub.active else "standby", flush=True)
            await asyncio.Event().wait()

asyncio.run(main())
"""


async def until(check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_a_standby_hub_takes_over_when_the_delivering_process_is_killed(
    tmp_path: Path,
) -> None:
    # As two `signoff serve --channel-state` on one file: the first delivers, then dies.
    state, log = tmp_path / "channels.db", tmp_path / "delivered.txt"
    log.touch()
    async with gated(tmp_path) as rt:
        proc = subprocess.Popen(
            [sys.executable, "-c", _HUB, str(rt.store.url), str(state), str(log)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "active"
            seen = Seen()
            async with ChannelHub(rt, [seen], state=state, poll_interval=0.05) as hub:
                assert not hub.active
                reader = ChannelState(state)
                start = reader.position("hub:seen")
                assert start is not None
                r1 = await open_one(rt)
                await until(lambda: (reader.position("hub:seen") or 0) > start)
                assert log.read_text().split() == [r1]
                proc.kill()  # SIGKILL: no goodbye, the OS lets go of its lock
                proc.wait()
                await until(lambda: hub.active, timeout=5)
                r2 = await open_one(rt)
                await until(lambda: seen.opened == [r2])
                await asyncio.sleep(0.2)
                assert seen.opened == [r2] and log.read_text().split() == [r1]
                reader.close()
        finally:
            proc.kill()
            proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()


async def test_a_standby_whose_state_fails_logs_taking_over_once_it_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The delivering hub stops while the state file fails (damaged, locked): the standby tries
    to take over at every poll. It said it "took over" at each try, every `poll_interval`, though
    it had not; it says so once, when it has, and the failure once (by its poll)."""
    state = tmp_path / "channels.db"
    async with gated(tmp_path) as rt:
        first, second = Seen(), Seen()
        one = ChannelHub(rt, [first], state=state)
        two = ChannelHub(rt, [second], state=state)
        await one.start(follow=False)
        await two.start(follow=False)
        try:
            await one.stop()
            read = two.state.position

            def position(name: str) -> int | None:
                raise so.StoreError("channel state: database disk image is malformed")

            monkeypatch.setattr(two.state, "position", position)
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="signoff.channels"):
                for _ in range(5):
                    with pytest.raises(so.StoreError, match="malformed"):
                        await two.poll()
                assert "took over" not in caplog.text
                monkeypatch.setattr(two.state, "position", read)
                rid = await open_one(rt)
                await two.poll()
                await two.poll()
            assert second.opened == [rid]
            assert caplog.text.count("took over delivery to seen") == 1
        finally:
            await two.stop()
