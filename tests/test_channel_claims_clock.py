"""On PostgreSQL a channel hub's claim is timed by the database's clock at each statement, not by
the hub process's reckoning of it: that reckoning is measured once, when the hub's runtime
opens, and goes stale when the database's clock steps (a failover to a server whose clock
differs) or this machine's drifts. Before, a hub whose reckoning was off by more than
`claim_ttl` took a claim another hub held (ahead), or had its own taken (behind): both
delivered. On SQLite every process shares the machine's clock, as its session leases do."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

import signoff as so
from signoff.channels import ChannelHub, _claims

from ._channel_state import Seen, gated, open_one

OFF = 120.0  # seconds: four times the default `claim_ttl`


def _off(rt: so.Runtime, seconds: float) -> None:
    """Make the opened `rt` reckon the database's clock `seconds` off (as if the database's
    clock stepped since it measured it, or its machine's drifted), and its wall clock too."""
    rt._lease_offset += seconds
    rt.clock = lambda: time.time() + seconds


@pytest.mark.parametrize(
    "skewed", ["standby-ahead", "holder-behind"], ids=["standby-ahead", "holder-behind"]
)
async def test_a_process_off_the_database_clock_takes_no_live_claim(
    pg_store_url: str, tmp_path: Path, skewed: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes share a PostgreSQL store, one of them two minutes off the database's
    clock: the standby ahead of it, or the holder behind it. The standby never takes the claim
    the live holder renews (each request is delivered once, by the holder), and it takes over
    once the holder stops, going on from the position it reached."""
    monkeypatch.setattr(_claims, "TRY_EVERY", 0.0)  # a standby tries at every poll
    async with gated(tmp_path, pg_store_url) as rt, so.Runtime([], store=pg_store_url) as other:
        _off(other if skewed == "standby-ahead" else rt, OFF if skewed == "standby-ahead" else -OFF)
        first, second = Seen(), Seen()
        holder = ChannelHub(rt, [first], state=tmp_path / "a.db")
        standby = ChannelHub(other, [second], state=tmp_path / "b.db")
        await holder.start(follow=False)
        await standby.start(follow=False)
        try:
            assert holder.active and not standby.active
            r1 = await open_one(rt)
            for _ in range(3):
                await holder.poll()
                await standby.poll()
            assert not standby.active
            assert first.opened == [r1] and second.opened == []
            await holder.stop()
            r2 = await open_one(rt)
            await standby.poll()
            assert standby.active and second.opened == [r2]
        finally:
            await holder.stop()
            await standby.stop()


async def test_a_claim_lapses_by_the_database_clock(pg_store_url: str) -> None:
    """The store's side on PostgreSQL: the time a caller passes does not time a claim (a caller
    an hour ahead takes no live claim, one an hour behind keeps none past its time); the
    database's clock does, so one lapses `ttl` seconds after it was taken or renewed."""
    async with so.Runtime([], store=pg_store_url) as rt:
        s, now = rt.store, time.time()
        assert (await s.claim_channel("hub.slack", "a", 0.5, now - 3600))[0]
        assert await s.claim_channel("hub.slack", "b", 0.5, now + 3600) == (False, None, None)
        await asyncio.sleep(0.6)
        held, _, since = await s.claim_channel("hub.slack", "b", 30, now - 3600)
        assert held and since is not None and abs(since - time.time()) < 5
        await s.release_channel("hub.slack", "b", now - 3600)
        held, _, since = await s.claim_channel("hub.slack", "a", 30, now)
        assert held and since is not None and abs(since - time.time()) < 5  # given back now
