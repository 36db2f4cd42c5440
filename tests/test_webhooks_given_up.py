"""A webhook delivery given up on (its receiver failed `max_attempts` times: down for a deploy,
say) is sent again every `REDO_EVERY` seconds while the hub runs, not only when it next starts:
by default the attempts span under ten seconds, and a receiver down longer missed every event of
that while until a restart. Each round sends the oldest one kept for the URL first, and the
others only once it got through, so a receiver still down costs one delivery's attempts per
round, not all of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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
