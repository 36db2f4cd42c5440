"""A request nearing its deadline is warned about (`request.expiring`) once: a hub started
again on the same state, the request still open, does not warn again."""

from __future__ import annotations

from pathlib import Path

import signoff as so
from signoff.channels import ChannelHub, WebhookChannel, verify_webhook
from signoff.testing import ManualClock

from .test_webhooks import SECRET, Receiver, manual, refund_agent


async def test_a_restarted_hub_does_not_warn_of_an_expiry_again(tmp_path: Path) -> None:
    clock = ManualClock()
    state = tmp_path / "hub.db"
    async with (
        Receiver([]) as receiver,
        so.Runtime(
            [refund_agent(expires_in=3600)], store=f"sqlite:///{tmp_path / 's.db'}", clock=clock
        ) as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET, expiring_within=600, clock=clock)
        async with manual(ChannelHub(rt, [hooks], state=state, clock=clock)) as hub:
            await rt.generate("support", prompt="Refund 1042")
            await hub.poll()
            clock.advance(3100)  # within 600 s of the deadline
            await hub.poll()
            await hooks.drain()
        clock.advance(60)
        again = WebhookChannel(receiver.url, SECRET, expiring_within=600, clock=clock)
        async with manual(ChannelHub(rt, [again], state=state, clock=clock)) as hub:
            await hub.poll()
            clock.advance(60)
            await hub.poll()
            await again.drain()
        payloads = [
            verify_webhook(SECRET, h, b, now=clock.now, tolerance=4000)
            for h, b in receiver.accepted
        ]
        assert [p["type"] for p in payloads] == ["request.opened", "request.expiring"]
