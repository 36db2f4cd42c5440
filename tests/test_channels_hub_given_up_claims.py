"""A hub delivering again the entries it gave a channel up on (`_given_up`) does so under its
claim on the channel, as its polls deliver: once the claim is no longer live (not renewed in
time, another hub took it over) it delivers none of the rest, which stay kept for a later
round under a claim. Before, a round went on to its end however long it took (a slow or stalled
channel), beside the hub that had taken the channel over; and a start did the same."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import ChannelHub, _claims
from signoff.channels import _given_up as given_up

from ._channel_state import Seen, gated, open_one
from .test_channels_hub import Flaky

TTL = 1.0  # seconds: the claims' time here, which one redelivery round outlasts


class Lapsing(Flaky):
    """Fails at first (its entries are given up on); once `lapse` is set, its second delivery
    cuts the hub off from the store's claims (renewals fail, as on a lost connection) and
    waits until `taken` is set: the other hub took the channel over."""

    def __init__(self) -> None:
        super().__init__(10**6, name="seen")
        self.lapse: Callable[[], None] | None = None
        self.taken = asyncio.Event()

    async def on_requested(self, request: so.InputRequest) -> None:
        await super().on_requested(request)
        if self.lapse is not None and len(self.seen) == 2:
            self.lapse()
            await asyncio.wait_for(self.taken.wait(), timeout=10 * TTL)


async def _standing_by(two: ChannelHub, taken: asyncio.Event) -> None:
    """Poll `two` as `signoff serve` would, until it delivers to the channel."""
    while not two.active:
        await two.poll()
        await asyncio.sleep(0.05)
    taken.set()


@pytest.mark.parametrize("when", ["round", "start"])
async def test_a_redelivery_stops_once_the_claim_is_no_longer_live(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """Hub one gave four entries up on; delivering them again (in a round while it runs, or
    when it next starts on its state), its claim lapses after the second (its renewals fail)
    and hub two, on another state, takes the channel over. One delivers neither of the other
    two, which it keeps (to deliver when it holds the channel again), and stands by."""
    monkeypatch.setattr(_claims, "TRY_EVERY", 0.0)  # the standby tries at every poll
    state = tmp_path / "one.db"
    async with gated(tmp_path, store_url) as rt, so.Runtime([], store=store_url) as other:
        claim = rt.store.claim_channel

        async def failing(*args: object, **kwargs: object) -> object:
            raise so.StoreError("the store is unreachable")

        def lapse() -> None:
            monkeypatch.setattr(rt.store, "claim_channel", failing)

        down = Lapsing()
        one = ChannelHub(rt, [down], state=state, max_attempts=1, claim_ttl=TTL)
        await one.start(follow=False)
        ids = [await open_one(rt) for _ in range(4)]
        await one.poll()  # all four given up on
        assert down.seen == [] and down.attempts == 4
        down.fail, down.lapse = 0, lapse
        if when == "start":
            await one.stop()
            one = ChannelHub(rt, [down], state=state, max_attempts=1, claim_ttl=TTL)
            starting: asyncio.Task[Any] = asyncio.create_task(one.start(follow=False))
            while not one.active:  # its claim taken, delivering again what it gave up on
                await asyncio.sleep(0.01)
        else:
            monkeypatch.setattr(given_up, "REDO_EVERY", 0.0)
            starting = asyncio.create_task(one.poll())
        two = ChannelHub(other, [Seen()], claim_ttl=TTL)
        await two.start(follow=False)
        try:
            assert not two.active
            await _standing_by(two, down.taken)
            if when == "start":
                await starting
            else:
                with pytest.raises(so.StoreError, match="unreachable"):
                    await starting  # its renewal at the end fails too
            assert down.seen == [("requested", i) for i in ids[:2]]
            kept = await asyncio.to_thread(one.state.recall, "hub:seen", "skipped")
            assert isinstance(kept, list) and len(kept) == 2  # the last two, for later
            monkeypatch.setattr(rt.store, "claim_channel", claim)
            await one.poll()  # the claim is two's: one stands by
            assert not one.active and two.active
            assert down.seen == [("requested", i) for i in ids[:2]]
        finally:
            await one.stop()
            await two.stop()
