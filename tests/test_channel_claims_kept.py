"""A channel hub keeps its claims while it delivers, however long a poll (or a start) takes: it
renews them in the background as they fall due. Before, it renewed them only between polls, so
a poll longer than `claim_ttl` (a backlog through a slow channel, one delivery that took long, a
channel's start with many open requests) let a standby take the claims mid-poll, and both hubs
delivered the same requests. A claim taken by another hub meanwhile (or not renewed in time)
stops the deliveries under it at once, not at the end of the poll."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import Channel, ChannelHub, _claims

from ._channel_state import gated, open_one

TTL = 1.0  # seconds: the claims' time in the tests of a claim lost, which they wait out
# Seconds: the claims' time in the tests of a claim kept, whose poll (or start) outlasts it twice
# over. Its renewal falls due every third of it, so a stall of the test process past about half
# of it (a loaded machine) lets the claim lapse as documented: it must be long beside such stalls.
KEPT_TTL = 3.0


class Slow(Channel):
    """A channel whose deliveries take time: `each` seconds a request (`first` for the first),
    and `start` seconds to start with open requests (posting each, say)."""

    def __init__(self, *, each: float = 0.0, first: float | None = None, start: float = 0.0):
        super().__init__(name="slow")
        self.each, self.first, self.starting = each, first, start
        self.opened: list[str] = []
        self.shown: list[str] = []  # the open requests it was started with

    async def start(self, open_requests: Sequence[so.InputRequest]) -> None:
        if open_requests:
            await asyncio.sleep(self.starting)
        self.shown += [r.id for r in open_requests]

    async def on_requested(self, request: so.InputRequest) -> None:
        wait = self.first if self.first is not None and not self.opened else self.each
        await asyncio.sleep(wait)
        self.opened.append(request.id)


async def _standing_by(standby: ChannelHub, work: asyncio.Task[object]) -> list[bool]:
    """Poll `standby` as `signoff serve` would while `work` (the other hub's) runs; whether it
    was active at each poll."""
    seen = []
    while not work.done():
        await standby.poll()
        seen.append(standby.active)
        await asyncio.sleep(0.05)
    await work
    return seen


@pytest.mark.parametrize("shape", ["backlog", "one-long-delivery"])
async def test_a_poll_longer_than_the_claim_keeps_it(
    store_url: str, tmp_path: Path, shape: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hub one (a state in memory) works through requests for more than twice `claim_ttl`:
    22 of a tenth of it each, or 3 of which the first takes 2.2 times it. Hub two stands by,
    polling all the while: it never takes the claim, and every request is delivered once, by
    one, in order."""
    monkeypatch.setattr(_claims, "TRY_EVERY", 0.0)  # the standby tries at every poll
    async with gated(tmp_path, store_url) as rt:
        if shape == "backlog":
            first, second = Slow(each=KEPT_TTL / 10), Slow(each=KEPT_TTL / 10)
        else:
            first, second = Slow(first=KEPT_TTL * 2.2), Slow(first=KEPT_TTL * 2.2)
        one = ChannelHub(rt, [first], claim_ttl=KEPT_TTL)
        two = ChannelHub(rt, [second], claim_ttl=KEPT_TTL)
        await one.start(follow=False)
        await two.start(follow=False)
        try:
            assert one.active and not two.active
            ids = [await open_one(rt) for _ in range(22 if shape == "backlog" else 3)]
            began = time.monotonic()
            seen = await _standing_by(two, asyncio.create_task(one.poll()))
            assert time.monotonic() - began > 2 * KEPT_TTL  # the poll outlasted the claim's time
            await one.poll()  # (one late renewal stops the poll: the next one goes on)
            await two.poll()
            assert not any(seen) and not two.active and one.active
            assert first.opened == ids and second.opened == []
        finally:
            await one.stop()
            await two.stop()


async def test_a_long_start_keeps_the_claim(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hub one starts with open requests that its channel takes 2.2 times `claim_ttl` to show:
    hub two, started beside it and polling, stands by all the while and shows none of them."""
    monkeypatch.setattr(_claims, "TRY_EVERY", 0.0)
    async with gated(tmp_path, store_url) as rt:
        ids = [await open_one(rt) for _ in range(2)]
        first, second = Slow(start=KEPT_TTL * 2.2), Slow(start=KEPT_TTL * 2.2)
        one = ChannelHub(rt, [first], claim_ttl=KEPT_TTL)
        two = ChannelHub(rt, [second], claim_ttl=KEPT_TTL)
        starting = asyncio.create_task(one.start(follow=False))
        while not one.active:  # its claim taken, its channel starting
            await asyncio.sleep(0.01)
        try:
            await two.start(follow=False)
            seen = await _standing_by(two, starting)
            await two.poll()
            assert not any(seen) and not two.active and one.active
            assert sorted(first.shown) == sorted(ids) and second.shown == []
        finally:
            await one.stop()
            await two.stop()


async def test_a_claim_taken_mid_poll_stops_the_deliveries_under_it(
    store_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Another hub takes the claim while hub one delivers a backlog (as it may once one stalled
    past it): one learns it at its next renewal, in the background, and delivers nothing more
    under it, rather than the rest of the backlog; at the poll's end it stands by."""
    async with gated(tmp_path, store_url) as rt:
        hub: ChannelHub | None = None

        class Taken(Slow):
            async def on_requested(self, request: so.InputRequest) -> None:
                await super().on_requested(request)
                if len(self.opened) == 3:
                    assert hub is not None
                    held, _, _ = await rt.store.claim_channel(
                        "hub.slow", "another", 30, rt.now(), succeeds=hub._claims.owner
                    )
                    assert held
                    deadline = time.monotonic() + 5 * TTL
                    while "slow" in hub._claims.held and time.monotonic() < deadline:
                        await asyncio.sleep(0.02)

        seen = Taken()
        hub = ChannelHub(rt, [seen], claim_ttl=TTL)
        await hub.start(follow=False)
        try:
            ids = [await open_one(rt) for _ in range(6)]
            with caplog.at_level(logging.WARNING, logger="signoff.channels"):
                await hub.poll()
            assert seen.opened == ids[:3] and not hub.active
            assert "its claim on slow lapsed and another hub took it" in caplog.text
        finally:
            await hub.stop()


async def test_a_claim_not_renewed_in_time_stops_the_deliveries_until_it_is(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store fails the renewals while hub one delivers (a connection lost): past most of
    `claim_ttl` since the last one got through, another hub may have taken the claim, so one
    delivers nothing more under it; once a renewal gets through, it goes on from there."""
    async with gated(tmp_path, store_url) as rt:
        claim = rt.store.claim_channel

        async def failing(*args: object, **kwargs: object) -> object:
            raise so.StoreError("the store is unreachable")

        class Cut(Slow):
            async def on_requested(self, request: so.InputRequest) -> None:
                await super().on_requested(request)
                if len(self.opened) == 2:
                    monkeypatch.setattr(rt.store, "claim_channel", failing)
                    await asyncio.sleep(TTL)

        seen = Cut()
        hub = ChannelHub(rt, [seen], claim_ttl=TTL)
        await hub.start(follow=False)
        try:
            ids = [await open_one(rt) for _ in range(5)]
            with pytest.raises(so.StoreError, match="unreachable"):
                await hub.poll()  # its renewal at the end fails too
            assert seen.opened == ids[:2]
            monkeypatch.setattr(rt.store, "claim_channel", claim)
            await hub.poll()
            assert seen.opened == ids and hub.active
        finally:
            await hub.stop()


async def test_a_channel_whose_claim_lapsed_while_another_started_is_started_later(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store fails the renewals while the hub's first channel starts, past the claim's
    time: the second channel's start was skipped, yet it stayed delivered to, so once the
    renewals got through it was told of new requests without ever being started (a Slack
    backlog never posted, the open requests never handed to it). Now it stands by and a later
    poll takes it over, starting it first."""
    async with gated(tmp_path, store_url) as rt:
        claim = rt.store.claim_channel

        async def failing(*args: object, **kwargs: object) -> object:
            raise so.StoreError("the store is unreachable")

        class Cutting(Channel):
            async def start(self, open_requests: Sequence[so.InputRequest]) -> None:
                monkeypatch.setattr(rt.store, "claim_channel", failing)
                await asyncio.sleep(TTL * 1.5)
                monkeypatch.setattr(rt.store, "claim_channel", claim)  # nobody took the claims

        told: list[tuple[str, list[str]]] = []

        class Recording(Channel):
            async def start(self, open_requests: Sequence[so.InputRequest]) -> None:
                told.append(("start", [r.id for r in open_requests]))

            async def on_requested(self, request: so.InputRequest) -> None:
                told.append(("requested", [request.id]))

        first = await open_one(rt)
        hub = ChannelHub(rt, [Cutting(name="a"), Recording(name="b")], claim_ttl=TTL)
        await hub.start(follow=False)
        try:
            second = await open_one(rt)
            for _ in range(3):
                await hub.poll()
            assert hub.active
            assert told and told[0][0] == "start", told  # nothing told before its start
            assert first in told[0][1]
            assert ("requested", [second]) in told or second in told[0][1]
        finally:
            await hub.stop()


async def test_a_hub_polling_less_often_than_its_claim_lapses_keeps_it(
    store_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Hub one follows with a `poll_interval` past `claim_ttl` (a minute's beside 30 s): it
    renews its claims between its polls too. Renewed only at the polls, they lapsed between two
    and the standby took the channel (the hubs then took it from each other in turn, each start
    of it posting the open requests again)."""
    monkeypatch.setattr(_claims, "TRY_EVERY", 0.0)
    async with gated(tmp_path, store_url) as rt:
        first, second = Slow(), Slow()
        one = ChannelHub(rt, [first], claim_ttl=KEPT_TTL, poll_interval=KEPT_TTL * 5)
        two = ChannelHub(rt, [second], claim_ttl=KEPT_TTL)
        with caplog.at_level(logging.WARNING, logger="signoff.channels"):
            await one.start()
            await two.start(follow=False)
            try:
                assert one.active and not two.active
                waiting = asyncio.create_task(asyncio.sleep(KEPT_TTL * 1.5))
                seen = await _standing_by(two, waiting)  # one sleeps past its claim's time
                assert not any(seen) and one.active
            finally:
                await two.stop()
                await one.stop()
    assert "took over" not in caplog.text and "lapsed" not in caplog.text


async def test_a_give_back_waits_for_a_renewal_under_way_and_one_cut_off_writes_nothing(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop between polls cuts off the keeper's renewal under way, the store slow to answer
    (`Standby._keeping`): the give-back after it waits for it (`Claims._writing`), so the
    renewal cut off writes nothing once the claim is given back, and another hub takes it at
    once, from the position the give-back saved."""
    async with gated(tmp_path, store_url) as rt:
        claims = _claims.Claims(rt, "hub", KEPT_TTL)
        assert await claims.take("seen", locked=False)
        real_claim, real_release = rt.store.claim_channel, rt.store.release_channel
        calls: list[str] = []
        slow = asyncio.Event()

        async def claim_channel(*args: Any, **kwargs: Any) -> Any:
            if not slow.is_set():
                slow.set()
                calls.append(f"renewing at {kwargs['after_id']}")
                await asyncio.sleep(30)
            found = await real_claim(*args, **kwargs)
            calls.append(f"wrote {kwargs['after_id']}")
            return found

        async def release_channel(*args: Any, **kwargs: Any) -> None:
            await real_release(*args, **kwargs)
            calls.append("given back")

        monkeypatch.setattr(rt.store, "claim_channel", claim_channel)
        monkeypatch.setattr(rt.store, "release_channel", release_channel)
        renewal = asyncio.create_task(claims.renew("seen", 5, force=True))
        await slow.wait()
        release = asyncio.create_task(claims.release("seen", 7))
        await asyncio.sleep(0.2)
        assert not release.done() and calls == ["renewing at 5"]  # it waits for the renewal
        renewal.cancel()
        with pytest.raises(asyncio.CancelledError):
            await renewal
        await asyncio.wait_for(release, 10)
        await asyncio.sleep(0.1)
        assert calls == ["renewing at 5", "wrote 7", "given back"]
        monkeypatch.undo()
        other = _claims.Claims(rt, "hub", KEPT_TTL)
        assert await other.take("seen", locked=False)
        assert other.saved["seen"] == 7
