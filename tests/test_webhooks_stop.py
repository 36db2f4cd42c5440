"""How a `WebhookChannel` stops (`_webhook_stop`): its close waits up to `timeout` for what is
queued, and a forced stop (`cut_short`, `serve`'s second signal) ends that wait at once, also
while it runs; what it left unsent is kept and sent when the hub next starts."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import ChannelHub, WebhookChannel, verify_webhook

from ._channels import manual
from ._hanging_receiver import receiving
from ._webhook_serve_child import refunder
from .test_webhooks import SECRET, Receiver


class Watched(WebhookChannel):
    """A webhook channel that says when its close begins to wait for its queues."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.draining = asyncio.Event()

    async def drain(self) -> None:
        self.draining.set()
        await super().drain()


async def test_a_cut_short_close_waits_no_longer_and_the_next_start_sends_what_it_left(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A delivery hangs at its receiver (an attempt bounded by a minute) as the hub stops: the
    close waits for it until `cut_short`, which ends the wait at once. The delivery, counted
    and logged as unsent, stays kept: the hub's next start on the state sends it, once."""
    state = tmp_path / "hub.db"
    async with (
        receiving() as receiver,
        so.Runtime([refunder], store=f"sqlite:///{tmp_path}/s.db") as rt,
    ):
        hooks = Watched(receiver.url, SECRET, timeout=60)
        hub = ChannelHub(rt, [hooks], state=state)
        await hub.start(follow=False)
        parked = await rt.generate("refunder", prompt="Refund order 1042")
        await hub.poll()
        await asyncio.wait_for(receiver.reached.wait(), 30)
        stopping = asyncio.ensure_future(hub.stop())
        await asyncio.wait_for(hooks.draining.wait(), 30)
        with caplog.at_level(logging.ERROR, logger="signoff.channels"):
            cut = hub.cut_short()
            await asyncio.wait_for(stopping, 5)  # else the close waits out the minute
        assert len(cut) == 1 and cut[0].cancelled()  # the close's wait
        assert (hooks.delivered, hooks.failed) == (0, 1)
        assert "1 deliveries were not sent as the stop was forced and are sent when the hub " in (
            caplog.text
        )
        receiver.hangs = False
        again = WebhookChannel(receiver.url, SECRET)
        async with manual(ChannelHub(rt, [again], state=state)):
            await asyncio.wait_for(again.drain(), 30)
    ((headers, body),) = receiver.accepted
    sent = verify_webhook(SECRET, headers, body)
    assert (sent["type"], sent["request"]["id"]) == ("request.opened", parked.pending[0].id)
    assert sent["id"] == receiver.hung[0]["signoff-delivery"]


async def test_a_channel_started_again_after_a_cut_waits_for_its_queues_again(
    tmp_path: Path,
) -> None:
    """A cut lasts until the channel starts again: a later stop waits for what is queued, here a
    delivery whose retry is let go only once that stop waits."""
    async with (
        Receiver([503]) as receiver,
        so.Runtime([refunder], store=f"sqlite:///{tmp_path}/s.db") as rt,
    ):

        async def sleep(seconds: float) -> None:
            await hooks.draining.wait()

        hooks = Watched(receiver.url, SECRET, sleep=sleep)
        hub = ChannelHub(rt, [hooks])
        async with manual(hub):
            hub.cut_short()
        async with manual(hub):
            await rt.generate("refunder", prompt="Refund order 1042")
            await hub.poll()
        assert (hooks.delivered, hooks.failed) == (1, 0)
        assert len(receiver.accepted) == 1
