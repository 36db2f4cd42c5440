"""How a `ChannelHub` stops (`_hub_stop`): it lets a poll in progress finish (up to ten seconds),
except once a forced stop (`cut_short`, `serve`'s second signal) cut it short, also while it
waits; what the poll did not finish is delivered when the hub next starts."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

import signoff as so
from signoff.channels import Channel, ChannelHub

from ._channels import manual
from ._webhook_serve_child import refunder


class Stuck(Channel):
    """Hangs on each request it is told of while `stuck`, else records it."""

    name = "stuck"

    def __init__(self, stuck: bool) -> None:
        super().__init__()
        self.stuck = stuck
        self.told = asyncio.Event()
        self.seen: list[str] = []

    async def on_requested(self, request: so.InputRequest) -> None:
        self.told.set()
        if self.stuck:
            await asyncio.Event().wait()
        self.seen.append(request.id)


async def test_a_forced_stop_does_not_wait_for_the_poll_in_progress(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A channel hangs on a request as the hub stops: the stop waits for the poll until
    `cut_short`, which ends the wait at once. The request is told again at the next start."""
    state = tmp_path / "hub.db"
    async with so.Runtime([refunder], store=f"sqlite:///{tmp_path}/s.db") as rt:
        stuck = Stuck(stuck=True)
        hub = ChannelHub(rt, [stuck], state=state, poll_interval=0.05)
        await hub.start()
        parked = await rt.generate("refunder", prompt="Refund order 1042")
        await asyncio.wait_for(stuck.told.wait(), 30)
        stopping = asyncio.ensure_future(hub.stop())
        with caplog.at_level(logging.WARNING, logger="signoff.channels"):
            while not hub._stopping:  # the stop waits for the poll now
                await asyncio.sleep(0)
            hub.cut_short()
            await asyncio.wait_for(stopping, 5)  # else it waits ten seconds
        assert "channel hub hub: stopping in the middle of a delivery" in caplog.text
        again = Stuck(stuck=False)
        async with manual(ChannelHub(rt, [again], state=state)) as hub:
            await hub.poll()
        assert again.seen == [parked.pending[0].id]
