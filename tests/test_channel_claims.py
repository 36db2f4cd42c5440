"""Channel hubs sharing a store deliver each entry to a channel once, whatever their channel
state: the delivering hub holds a claim in the store (an owner and an expiry, with the position
it reached), and the others stand by. Before, hubs on memory states or on different state files
(two `signoff serve` on one store, on one machine or two) each delivered every request: each
Slack message was posted twice. A hub that dies, even mid-delivery, leaves its claim to lapse,
and another takes over from the position it saved: nothing is lost."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import ChannelHub, _claims

from ._channel_state import Seen, gated, open_one
from ._channels import manual
from ._procs import query
from .test_store_edited_rows import edit


async def until(check: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("states", ["memory", "files"])
async def test_two_hubs_on_one_store_deliver_each_request_once(
    store_url: str, tmp_path: Path, states: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two hubs on one store, each on its own state (in memory, or a file of its own): one
    delivers, the other stands by, and once the first stops the second goes on from where it
    stopped (the position in the claim), delivering nothing twice and skipping nothing."""
    monkeypatch.setattr(_claims, "TRY_EVERY", 0.0)  # a standby tries at every poll
    paths = [None, None] if states == "memory" else [tmp_path / "a.db", tmp_path / "b.db"]
    async with gated(tmp_path, store_url) as rt:
        first, second = Seen(), Seen()
        one = ChannelHub(rt, [first], state=paths[0])
        two = ChannelHub(rt, [second], state=paths[1])
        await one.start(follow=False)
        await two.start(follow=False)
        try:
            assert one.active and not two.active
            r1 = await open_one(rt)
            for _ in range(3):
                await two.poll()
                await one.poll()
            assert first.opened == [r1] and second.opened == []
            await one.stop()
            r2 = await open_one(rt)
            await two.poll()
            assert two.active and second.opened == [r2]  # r1 was delivered: not again
            r3 = await open_one(rt)
            await two.poll()
            assert second.opened == [r2, r3] and first.opened == [r1]
        finally:
            await one.stop()
            await two.stop()


async def test_a_claim_given_back_long_ago_passes_no_position_on(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hub on a memory state taking a claim given back more than `FRESH` seconds ago (a
    `serve` without `--channel-state` restarted next month) starts at the end, as a first start
    does, rather than deliver everything since."""
    async with gated(tmp_path, store_url) as rt:
        first, second = Seen(), Seen()
        async with ChannelHub(rt, [first]) as one:
            r1 = await open_one(rt)
            await one.poll()
        await open_one(rt)  # while no hub runs
        monkeypatch.setattr(_claims, "FRESH", -1.0)  # as if long ago
        async with ChannelHub(rt, [second]) as two:
            r3 = await open_one(rt)
            await two.poll()
        assert first.opened == [r1] and second.opened == [r3]


async def test_a_hub_dead_before_its_first_poll_leaves_its_start_in_the_claim(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hub on memory that takes a claim given back long ago starts at the end (the request
    opened while no hub ran is not delivered) and saves that start in the claim at once: one
    that takes the claim over after it died before its first poll goes on from there, not
    from the old position the claim still held, which delivered that request after all."""
    async with gated(tmp_path, store_url) as rt:
        first, second, third = Seen(), Seen(), Seen()
        async with manual(ChannelHub(rt, [first])) as one:
            r1 = await open_one(rt)
            await one.poll()
        await open_one(rt)  # while no hub runs
        monkeypatch.setattr(_claims, "FRESH", -1.0)  # as if given back long ago
        two = ChannelHub(rt, [second], claim_ttl=0.5)
        await two.start(follow=False)
        monkeypatch.setattr(_claims, "FRESH", 600.0)
        two._claims.held.clear()  # dies: its claim is left to lapse
        await two.stop()
        await asyncio.sleep(0.6)
        async with manual(ChannelHub(rt, [third])) as three:
            r3 = await open_one(rt)
            await three.poll()
        assert first.opened == [r1] and second.opened == [] and third.opened == [r3]


async def test_a_hub_that_stalled_past_its_claim_stands_by_for_the_one_that_took_it(
    store_url: str, tmp_path: Path
) -> None:
    """The delivering hub stalls (a frozen process) past its claim's time: another takes the
    claim, and the first, at its next poll, finds it taken and delivers nothing more."""
    async with gated(tmp_path, store_url) as rt:
        first, second = Seen(), Seen()
        one = ChannelHub(rt, [first], claim_ttl=0.5)
        two = ChannelHub(rt, [second], claim_ttl=0.5)
        await one.start(follow=False)
        await two.start(follow=False)
        try:
            r1 = await open_one(rt)
            await one.poll()
            await asyncio.sleep(0.6)  # one is frozen: its claim lapses
            await two.poll()
            assert two.active and second.opened == []  # r1's position was in the claim
            r2 = await open_one(rt)
            await one.poll()  # wakes up: the claim is two's
            await two.poll()
            assert not one.active and first.opened == [r1] and second.opened == [r2]
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
        with open(sys.argv[2], "a") as out:
            out.write(request.id + "\\n")
        await asyncio.Event().wait()  # killed mid-delivery

async def main():
    async with so.Runtime([], store=sys.argv[1]) as rt:
        hub = ChannelHub(rt, [Log()], poll_interval=0.05, claim_ttl=1.0)
        async with hub:
            print("active" if hub.active else "standby", flush=True)
            await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_a_hub_killed_mid_delivery_loses_nothing(store_url: str, tmp_path: Path) -> None:
    """A `serve` process (memory state) delivering a request is SIGKILLed in the middle of
    it: its claim lapses, the standby in another process takes over from the claim's
    position and delivers that request, then the next."""
    log = tmp_path / "delivering.txt"
    log.touch()
    async with gated(tmp_path, store_url) as rt:
        proc = subprocess.Popen(
            [sys.executable, "-c", _HUB, store_url, str(log)], stdout=subprocess.PIPE, text=True
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "active"
            seen = Seen()
            hub = ChannelHub(rt, [seen], poll_interval=0.05, claim_ttl=1.0)
            async with hub:
                assert not hub.active
                r1 = await open_one(rt)
                await until(lambda: log.read_text().split() == [r1])
                await asyncio.sleep(0.3)
                assert seen.opened == []  # the standby delivers nothing while it lives
                proc.kill()
                proc.wait()
                await until(lambda: hub.active)
                await until(lambda: seen.opened == [r1])  # not lost
                r2 = await open_one(rt)
                await until(lambda: seen.opened == [r1, r2])
        finally:
            proc.kill()
            proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()


@pytest.mark.parametrize("ttl", [0, -1, float("nan"), float("inf"), True, "30"])
async def test_a_claim_time_that_is_not_positive_seconds_is_refused(
    tmp_path: Path, ttl: Any
) -> None:
    async with gated(tmp_path) as rt:
        with pytest.raises(so.UsageError, match="claim_ttl must be positive"):
            ChannelHub(rt, [Seen()], claim_ttl=ttl)


async def test_the_store_claims_are_atomic_with_an_owner_and_an_expiry(store_url: str) -> None:
    """The store's side: one owner at a time; the owner renews it and saves a position; a
    lapsed claim, one given back, or one whose owner is succeeded is taken, saying when the
    one before lapsed. SQLite times them by the `now` passed (the machine's clock, which every
    process on it shares); PostgreSQL by its own clock (`test_channel_claims_clock`), so there
    time passes for real here, and the times said are the database's."""
    pg = store_url.startswith("postgres")
    ttl = 3.0  # a live claim outlasts a loaded machine's next call; the test sleeps past it
    async with so.Runtime([], store=store_url) as rt:
        await rt.open()
        s, now = rt.store, time.time() if pg else 1000.0

        def clock() -> float:
            return time.time() if pg else now

        async def later(seconds: float) -> float:
            nonlocal now
            if pg:
                await asyncio.sleep(seconds)
            now = clock() if pg else now + seconds
            return now

        async def timed(call: Awaitable[Any]) -> tuple[Any, tuple[float, float]]:
            """What `call` returns, and the clock's times before and after it: on PostgreSQL
            the database's clock reads it in between."""
            before = clock()
            done = await call
            return done, (before, clock())

        def near(at: float | None, span: tuple[float, float], plus: float = 0.0) -> bool:
            """`at` is within `span` (shifted by `plus`): on PostgreSQL, give or take 10 ms
            of the clocks' rounding (the database's is this machine's)."""
            lo, hi = span
            return at is not None and lo + plus - 0.01 * pg <= at <= hi + plus + 0.01 * pg

        got, taken = await timed(s.claim_channel("hub.slack", "a", ttl, now))
        assert got == (True, None, None)
        assert await s.claim_channel("hub.slack", "b", ttl, now) == (False, None, None)
        (held, saved, until), renewed = await timed(
            s.claim_channel("hub.slack", "a", ttl, now, after_id=7)
        )
        assert held and saved == 7 and near(until, taken, ttl)
        assert await s.claim_channel("hub.slack", "b", ttl, await later(0.2)) == (False, None, None)
        lapses = renewed[1] + ttl
        held, saved, until = await s.claim_channel(
            "hub.slack", "b", ttl, await later(lapses - clock() + 0.05)
        )
        assert held and saved == 7 and near(until, renewed, ttl)  # lapsed then
        assert await s.claim_channel("hub.other", "a", ttl, now) == (True, None, None)
        await s.release_channel("hub.slack", "a", now)  # not a's: nothing
        assert await s.claim_channel("hub.slack", "a", ttl, now) == (False, None, None)
        _, given_back = await timed(s.release_channel("hub.slack", "b", await later(0.1)))
        held, saved, until = await s.claim_channel("hub.slack", "a", 30, await later(0.1))
        assert held and saved == 7 and near(until, given_back)  # given back then
        assert await s.claim_channel("hub.slack", "h|f|2", 30, now) == (False, None, None)
        held, saved, until = await s.claim_channel("hub.slack", "h|f|2", 30, now, succeeds="a")
        assert held and saved == 7 and until is not None
        results = await asyncio.gather(
            *(s.claim_channel("hub.race", f"o{n}", 30, now) for n in range(8))
        )
        assert sum(held for held, _, _ in results) == 1  # one winner


async def test_a_hub_on_another_file_at_the_same_path_takes_no_live_claim(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two hubs whose state files have one path on machines of one name (two containers with
    host networking, each with its own volume at /data/channels.db), as here one file, and
    its lock, moved aside while its hub runs and a new one made at the path. Each holds its
    own file's lock: the second took the first's live claim at once (the same machine's name
    and path said "the same file"), the first took it back, and both delivered. The file's own
    id tells them apart: the second stands by while the first lives."""
    monkeypatch.setattr(_claims, "TRY_EVERY", 0.0)  # a standby tries at every poll
    state = tmp_path / "data" / "channels.db"
    async with gated(tmp_path, store_url) as rt:
        first, second = Seen(), Seen()
        one = ChannelHub(rt, [first], state=state)
        await one.start(follow=False)
        elsewhere = tmp_path / "m1"
        elsewhere.mkdir()
        for path in state.parent.iterdir():  # the file, its WAL and its lock go on in use
            path.rename(elsewhere / path.name)
        two = ChannelHub(rt, [second], state=state)
        await two.start(follow=False)
        try:
            r1 = await open_one(rt)
            for _ in range(3):
                await two.poll()
                await one.poll()
            assert one.active and not two.active
            assert first.opened == [r1] and second.opened == []
            assert two.state.identity() != one.state.identity()
            await one.stop()
            r2 = await open_one(rt)
            await two.poll()
            assert two.active and second.opened == [r2]
        finally:
            await one.stop()
            await two.stop()


async def test_a_hub_on_the_same_file_succeeds_its_dead_predecessor_at_once(
    store_url: str, tmp_path: Path
) -> None:
    """A hub started again on the state file of one that died (its lock let go, its claim
    left to lapse in 30 s) takes the claim at once, in a process of its own or in this one,
    and goes on from the position it saved."""
    state = tmp_path / "channels.db"
    async with gated(tmp_path, store_url) as rt:
        first, second = Seen(), Seen()
        one = ChannelHub(rt, [first], state=state)
        await one.start(follow=False)
        r1 = await open_one(rt)
        await one.poll()
        one._leases["seen"].release()  # dies: the OS lets go of its lock, nothing more
        two = ChannelHub(rt, [second], state=state)
        await two.start(follow=False)
        try:
            assert two.active
            r2 = await open_one(rt)
            await two.poll()
            assert first.opened == [r1] and second.opened == [r2]
        finally:
            await two.stop()
            one._active.clear()
            one._claims.held.clear()
            await one.stop()


async def test_a_hub_on_the_same_file_by_another_path_takes_no_live_claim(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One state file reached by two paths (a symlink): each hub holds the lock next to its
    own path, which says nothing of the other, so neither succeeds the other's claim at once
    (the file's id alone would have let each take the other's live one)."""
    monkeypatch.setattr(_claims, "TRY_EVERY", 0.0)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    state, alias = tmp_path / "a" / "channels.db", tmp_path / "b" / "channels.db"
    async with gated(tmp_path, store_url) as rt:
        first, second = Seen(), Seen()
        one = ChannelHub(rt, [first], state=state)
        await one.start(follow=False)
        alias.symlink_to(state)
        two = ChannelHub(rt, [second], state=alias)
        await two.start(follow=False)
        try:
            r1 = await open_one(rt)
            for _ in range(3):
                await two.poll()
                await one.poll()
            assert one.active and not two.active
            assert first.opened == [r1] and second.opened == []
            assert two.state.identity() == one.state.identity()
        finally:
            await one.stop()
            await two.stop()


@pytest.mark.parametrize("column", ["expires_at", "after_id"])
async def test_a_claim_row_a_hand_edit_left_text_in_is_store_damaged(
    tmp_path: Path, column: str
) -> None:
    """SQLite keeps text where a hand edit puts it: such a claim row was a plain `StoreError`,
    which the docs call worth retrying, though reading it again gives the same; it is
    `StoreDamaged`, as every other row that does not read back, and nothing is written.
    (PostgreSQL's columns are typed: no such row can be kept there.)"""
    url = f"sqlite:///{tmp_path / 's.db'}"
    async with so.Runtime([], store=url) as rt:
        await rt.open()
        store: Any = rt.store
        assert (await store.claim_channel("hub.ch", "one", 30.0, 100.0, after_id=2))[0]
        edit(url, f"UPDATE {{t}}channel_claims SET {column} = 'x' WHERE name = {{p}}", "hub.ch")
        with pytest.raises(so.StoreDamaged, match="channel claim 'hub.ch' is damaged"):
            await store.claim_channel("hub.ch", "two", 30.0, 200.0)
        row = query(url, "SELECT owner FROM {t}channel_claims WHERE name = {p}", "hub.ch")
        assert row == [("one",)]
