"""The channel hub's wait on the holes in the audit trail's ids (`_hub_holes`): a hole is waited
for `gap_timeout` from the poll that first read past it, as a whole, not one id after another."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from signoff.channels import ChannelHub, _hub

from ._channel_state import Seen, erased, gated, open_one
from ._channels import frozen_monotonic, manual


async def test_a_deleted_sessions_ids_are_passed_together_after_one_gap_timeout(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deleted session leaves a hole of several ids: the position (and the claim's) passes
    it once `gap_timeout` has passed since the poll that read past it. Before, each missing id
    waited `gap_timeout` from when the position reached it: one id per 10 s, the saved position
    below the hole for minutes (hours after a prune)."""
    clock = frozen_monotonic(monkeypatch, _hub)
    async with gated(tmp_path, store_url) as rt:
        seen = Seen()
        async with manual(ChannelHub(rt, [seen], gap_timeout=60)) as hub:
            start = hub.position(seen)
            await erased(rt)
            kept = await open_one(rt)
            trail = [e.id for e in await rt.store.audit(after_id=start)]
            assert trail[0] - start == 7  # a hole of six ids
            await hub.poll()
            assert seen.opened == [kept]  # above the hole: delivered
            assert hub.position(seen) == start  # held below it
            clock.now += 59
            await hub.poll()
            assert hub.position(seen) == start
            clock.now += 1
            await hub.poll()
            assert hub.position(seen) == trail[-1]
            assert seen.opened == [kept]


async def test_each_hole_waits_from_the_poll_that_first_read_past_it(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hole read later than another waits its own `gap_timeout` (a transaction that took its
    id and commits late is waited for), however soon the one before it passed."""
    clock = frozen_monotonic(monkeypatch, _hub)
    async with gated(tmp_path, store_url) as rt:
        seen = Seen()
        async with manual(ChannelHub(rt, [seen], gap_timeout=60)) as hub:
            start = hub.position(seen)
            await erased(rt)
            await open_one(rt)
            await hub.poll()  # the first hole, read at 0 s
            first_end = (await rt.store.audit())[-1].id
            real = rt.store.audit
            clock.now += 30
            late = await open_one(rt)
            above = await open_one(rt)
            (hidden,) = [
                e.id
                for e in await real(after_id=first_end)
                if e.type == "input.requested" and e.data["requests"][0]["id"] == late
            ]

            async def committing(**kwargs: Any) -> list[Any]:
                return [e for e in await real(**kwargs) if e.id != hidden]

            rt.store.audit = committing  # type: ignore[method-assign]
            await hub.poll()  # the second hole, read at 30 s
            assert seen.opened[-1] == above and late not in seen.opened
            assert hub.position(seen) == start
            clock.now += 30
            await hub.poll()
            assert hub.position(seen) == hidden - 1  # past the first hole, below the second
            clock.now += 29
            await hub.poll()
            assert hub.position(seen) == hidden - 1
            rt.store.audit = real  # type: ignore[method-assign]
            await hub.poll()  # it commits: delivered, not skipped
            assert late in seen.opened
            assert hub.position(seen) == (await real())[-1].id
