"""A channel held back (waiting for its retry: a rate limit, `ChannelUnreachable`, a failure's
backoff) does not make the hub's polls read what was written since it stopped: the trail is read
from the lowest position of the channels not held. Before, every poll read it all again for the
others (at 8,000 sessions behind, an idle poll took 131 ms, growing with each). Once its hold
ends, the held channel reads from its own position: it is told of every entry, none twice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import ChannelHub, ChannelUnreachable, _hub, _retries

from ._channel_state import Seen, erased, gated, open_one
from ._channels import frozen_monotonic, manual

HOLD = 60.0  # seconds the held channel's service says to come back after


class Held(Seen):
    """Records the requests it is told opened, but raises `ChannelUnreachable` while `held`."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.held = True

    async def on_requested(self, request: so.InputRequest) -> None:
        if self.held:
            raise ChannelUnreachable("the bot was removed from its channel", HOLD)
        await super().on_requested(request)


def _counting(rt: so.Runtime) -> list[int]:
    """The rows each read of the audit trail returns from now on, in order."""
    real, rows = rt.store.audit, []

    async def audit(**kwargs: Any) -> list[Any]:
        found = await real(**kwargs)
        rows.append(len(found))
        return found

    rt.store.audit = audit  # type: ignore[method-assign]
    return rows


async def test_an_idle_poll_does_not_read_what_a_held_channel_has_yet_to_be_told(
    store_url: str, tmp_path: Path
) -> None:
    async with gated(tmp_path, store_url) as rt:
        held, steady = Held("held"), Seen("steady")
        async with manual(ChannelHub(rt, [held, steady])) as hub:
            await open_one(rt)
            await hub.poll()  # held from there on
            opened = [await open_one(rt) for _ in range(30)]
            await hub.poll()
            assert steady.opened[1:] == opened and held.opened == []
            rows = _counting(rt)
            assert await hub.poll() == 0
            assert sum(rows) == 0  # before, the 30 sessions' entries, at each poll
            latest = await open_one(rt)
            rows.clear()
            await hub.poll()
            assert steady.opened[-1] == latest
            assert rows == [1]  # the new entry alone


async def test_a_held_channel_is_told_every_entry_once_its_hold_ends(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held below a deleted session's hole (which the steady channel passes meanwhile, its
    `gap_timeout` over), the channel's position stays where it stopped, the ids past it unread
    and not taken for holes; its hold over, it is told every request since, in order, once."""
    clock = frozen_monotonic(monkeypatch, _hub, _retries)
    async with gated(tmp_path, store_url) as rt:
        held, steady = Held("held"), Seen("steady")
        async with manual(ChannelHub(rt, [held, steady], gap_timeout=10)) as hub:
            first = await open_one(rt)
            await hub.poll()
            stopped = hub.position(held)
            await erased(rt)
            later = [await open_one(rt) for _ in range(3)]
            for _ in range(3):
                await hub.poll()
                clock.now += 15  # the hole's wait over, the hold's not
            assert hub.position(held) == stopped and held.opened == []
            assert steady.opened == [first, *later]
            end = hub.position(steady)
            assert end == (await rt.store.audit())[-1].id  # past the hole
            held.held = False
            await hub.poll()  # still held: its retry is not due
            assert held.opened == []
            clock.now += HOLD
            await hub.poll()
            assert held.opened == [first, *later]
            assert hub.position(held) == end
            await hub.poll()
            assert held.opened == steady.opened == [first, *later]  # none twice
