"""A webhook delivery given up on (its receiver failed `max_attempts` times: down for a deploy,
say) is sent again every `REDO_EVERY` seconds while the hub runs, not only when it next starts:
by default the attempts span under ten seconds, and a receiver down longer missed every event of
that while until a restart. Each round sends the oldest one kept for the URL first, and the
others only once it got through, so a receiver still down costs one delivery's attempts per
round, not all of them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from aiohttp import web

import signoff as so
from signoff.channels import ChannelHub, WebhookChannel
from signoff.channels import _given_up as given_up

from .test_webhooks import SECRET, Receiver, manual, refund_agent


async def _instantly(seconds: float) -> None:
    return None


def _requests(receiver: Receiver, accepted: bool = False) -> list[str]:
    sent = receiver.accepted if accepted else receiver.attempts
    return [json.loads(body)["request"]["id"] for _, body in sent]


async def test_a_delivery_given_up_on_is_sent_again_while_the_hub_runs(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "hub.db"
    async with (
        Receiver([503, 503, 503]) as receiver,
        so.Runtime([refund_agent()], store=store_url) as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET, max_attempts=1, sleep=_instantly)
        async with manual(ChannelHub(rt, [hooks], state=state)) as hub:
            a = (await rt.generate("support", prompt="Refund A")).pending[0]
            b = (await rt.generate("support", prompt="Refund B")).pending[0]
            await hub.poll()
            await hooks.drain()
            assert (_requests(receiver), hooks.failed) == ([a.id, b.id], 2)  # both given up
            await hub.poll()
            await hooks.drain()
            assert len(receiver.attempts) == 2  # not before `REDO_EVERY` has passed
            monkeypatch.setattr(given_up, "REDO_EVERY", 0.0)
            await hub.poll()
            await hooks.drain()
            # still down: the oldest alone was tried
            assert _requests(receiver) == [a.id, b.id, a.id]
            await hub.poll()
            await hooks.drain()
            await hub.poll()
            await hooks.drain()
            assert _requests(receiver, accepted=True) == [a.id, b.id]
            await hub.poll()
            await hooks.drain()
        assert len(receiver.attempts) == 5  # each delivered once
        again = WebhookChannel(receiver.url, SECRET, sleep=_instantly)
        async with manual(ChannelHub(rt, [again], state=state)) as hub:
            await hub.poll()
            await again.drain()
        assert len(receiver.attempts) == 5  # nothing kept for the next start either


class _Held(Receiver):
    """A receiver that answers 503 at first, then holds each request until `release` is set."""

    def __init__(self, fails: int) -> None:
        super().__init__([503] * fails)
        self.release = asyncio.Event()
        self.held = 0

    async def handle(self, request: web.Request) -> web.Response:
        if self.statuses:
            return await super().handle(request)
        self.held += 1
        await self.release.wait()
        return await super().handle(request)


async def test_a_receiver_that_hangs_holds_back_no_other_urls_redelivery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each URL has its own queue and worker, and a round only queues each URL's oldest kept
    delivery: while one receiver's redelivery hangs (up to the channel's `timeout`), another
    URL's round goes on, its oldest first and the others once it got through."""
    hanging = _Held(2)
    async with (
        Receiver([503, 503]) as back,
        hanging,
        so.Runtime([refund_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt,
    ):
        hooks = WebhookChannel(
            [hanging.url, back.url], SECRET, max_attempts=1, timeout=60, sleep=_instantly
        )
        async with manual(ChannelHub(rt, [hooks], state=tmp_path / "hub.db")) as hub:
            a = (await rt.generate("support", prompt="Refund A")).pending[0]
            b = (await rt.generate("support", prompt="Refund B")).pending[0]
            await hub.poll()
            await hooks.drain()
            assert hooks.failed == 4  # both given up on, at both URLs
            monkeypatch.setattr(given_up, "REDO_EVERY", 0.0)
            await hub.poll()  # the round: each URL's oldest
            async with asyncio.timeout(10):
                while hanging.held == 0 or len(back.accepted) < 1:
                    await asyncio.sleep(0.01)
                await hub.poll()
                while len(back.accepted) < 2:
                    await asyncio.sleep(0.01)
            assert _requests(back, accepted=True) == [a.id, b.id]
            assert hanging.held == 1 and hanging.accepted == []  # still hanging, alone
            hanging.release.set()
            async with asyncio.timeout(10):
                await hooks.drain()
                await hub.poll()
                await hooks.drain()
            assert _requests(hanging, accepted=True) == [a.id, b.id]


async def test_a_round_stops_at_a_delivery_given_up_on_again_and_keeps_their_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a round's oldest got through, the others kept for its URL follow; when one of them
    fails again (the receiver down once more), the ones behind it waited for the next round,
    which starts from it: they were each tried in turn (a receiver down again cost every kept
    delivery's attempts, and held the URL's new deliveries behind them), and one that got
    through arrived before the older one that had failed."""
    async with (
        Receiver([503, 503, 503, 204, 503]) as receiver,
        so.Runtime([refund_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET, max_attempts=1, sleep=_instantly)
        async with manual(ChannelHub(rt, [hooks], state=tmp_path / "hub.db")) as hub:
            a = (await rt.generate("support", prompt="Refund A")).pending[0]
            b = (await rt.generate("support", prompt="Refund B")).pending[0]
            c = (await rt.generate("support", prompt="Refund C")).pending[0]
            await hub.poll()
            await hooks.drain()
            assert hooks.failed == 3  # all given up on
            monkeypatch.setattr(given_up, "REDO_EVERY", 0.0)
            await hub.poll()  # a gets through; b fails again: c waits
            await hooks.drain()
            assert _requests(receiver) == [a.id, b.id, c.id, a.id, b.id]
            await hub.poll()  # the next round starts from b
            await hooks.drain()
            assert _requests(receiver) == [a.id, b.id, c.id, a.id, b.id, b.id, c.id]
            assert _requests(receiver, accepted=True) == [b.id, c.id]  # a's 204 was listed
            await hub.poll()
            await hooks.drain()
        assert len(receiver.attempts) == 7  # nothing left kept
