"""A webhook a receiver refuses (a redirect, or a 4xx other than 408, 425 and 429) is not sent
again, but it is not dropped unheard either: the error log says what to do, and the refusal is
recorded in the hub's state with its reason (`WebhookChannel.refusals()`). A receiver that asks
to be tried later (`Retry-After`) past the minute between rounds of deliveries given up on is
tried again no sooner than it asked, and so is the next delivery to it."""

from __future__ import annotations

import json
import logging
import time
import types
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff._exceptions import StoreUnavailable
from signoff.channels import (
    ChannelHub,
    WebhookChannel,
    _webhook_refusals,
    _webhook_rounds,
    _webhook_waits,
)
from signoff.channels import _given_up as given_up

from ._channels import frozen_monotonic
from .test_webhooks import SECRET, Receiver, manual, refund_agent


async def _instantly(seconds: float) -> None:
    return None


async def test_a_redirect_is_recorded_with_where_it_points_and_never_sent_again(
    store_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "hub.db"
    moved = {"Location": "https://hooks.example/new"}
    async with (
        Receiver([(301, moved)]) as receiver,
        so.Runtime([refund_agent()], store=store_url) as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET, sleep=_instantly)
        async with manual(ChannelHub(rt, [hooks], state=state)) as hub:
            r = await rt.generate("support", prompt="Refund 1042")
            await hub.poll()
            await hooks.drain()
            (refusal,) = await hooks.refusals()
        assert refusal["url"] == receiver.url and refusal["status"] == 301
        assert refusal["event"] == "request.opened"
        assert refusal["reason"] == "HTTP 301 to 'https://hooks.example/new'"
        assert refusal["delivery"] == hooks.payload("request.opened", r.pending[0])["id"]
        assert "configure the channel with the URL it points to" in caplog.text
        assert "see WebhookChannel.refusals()" in caplog.text
        again = WebhookChannel(receiver.url, SECRET, sleep=_instantly)
        async with manual(ChannelHub(rt, [again], state=state)) as hub:
            await hub.poll()
            await again.drain()
            assert await again.refusals() == [refusal]  # still there to be seen
        assert len(receiver.attempts) == 1  # never sent again


@pytest.mark.parametrize("status", [400, 401, 404, 410, 422])
async def test_a_final_4xx_is_recorded_with_its_status(tmp_path: Path, status: int) -> None:
    async with (
        Receiver([status]) as receiver,
        so.Runtime([refund_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET, sleep=_instantly)
        async with manual(ChannelHub(rt, [hooks], state=tmp_path / "hub.db")) as hub:
            await rt.generate("support", prompt="Refund 1042")
            await hub.poll()
            await hooks.drain()
            (refusal,) = await hooks.refusals()
    assert (refusal["status"], refusal["reason"]) == (status, f"HTTP {status}")
    assert (hooks.delivered, hooks.failed, len(receiver.attempts)) == (0, 1, 1)


@pytest.mark.parametrize("answer", [408, 425, (429, {"Retry-After": "2"})])
async def test_a_transient_4xx_is_retried_and_not_recorded(
    tmp_path: Path, answer: int | tuple[int, dict[str, str]]
) -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    async with (
        Receiver([answer]) as receiver,
        so.Runtime([refund_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET, backoff=0.5, sleep=sleep)
        async with manual(ChannelHub(rt, [hooks], state=tmp_path / "hub.db")) as hub:
            await rt.generate("support", prompt="Refund 1042")
            await hub.poll()
            await hooks.drain()
            assert await hooks.refusals() == []
    assert slept == [2.0 if isinstance(answer, tuple) else 0.5]  # Retry-After honoured
    assert (hooks.delivered, len(receiver.accepted)) == (1, 1)


async def test_refusals_kept_are_the_latest_of_each_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_webhook_refusals, "REFUSALS_KEPT", 2)
    async with (
        Receiver([404, 404, 404]) as receiver,
        so.Runtime([refund_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET, sleep=_instantly)
        async with manual(ChannelHub(rt, [hooks], state=tmp_path / "hub.db")) as hub:
            opened = []
            for n in range(3):
                opened += (await rt.generate("support", prompt=f"Refund {n}")).pending
                await hub.poll()
                await hooks.drain()
            refusals = await hooks.refusals()
    sent = [json.loads(body)["request"]["id"] for _, body in receiver.attempts]
    assert sent == [r.id for r in opened]
    kept = [hooks.payload("request.opened", r)["id"] for r in opened[1:]]
    assert [r["delivery"] for r in refusals] == kept


async def test_a_retry_after_past_the_next_round_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The receiver asks for ten minutes (429): the delivery given up on is not tried again at
    the next round a minute on, but once the ten minutes have passed."""
    offset = [0.0]
    fake = types.SimpleNamespace(monotonic=lambda: time.monotonic() + offset[0], time=time.time)
    monkeypatch.setattr(_webhook_rounds, "time", fake)
    async with (
        Receiver([(429, {"Retry-After": "600"})]) as receiver,
        so.Runtime([refund_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET, max_attempts=1, sleep=_instantly)
        async with manual(ChannelHub(rt, [hooks], state=tmp_path / "hub.db")) as hub:
            caplog.set_level(logging.ERROR)
            await rt.generate("support", prompt="Refund 1042")
            await hub.poll()
            await hooks.drain()
            assert "is sent again in 600s" in caplog.text
            offset[0] = given_up.REDO_EVERY + 1
            await hub.poll()
            await hooks.drain()
            assert len(receiver.attempts) == 1  # a minute on: not yet
            offset[0] = 601.0
            await hub.poll()
            await hooks.drain()
            assert await hooks.refusals() == []
    assert (len(receiver.attempts), len(receiver.accepted)) == (2, 1)


async def test_a_delivery_after_one_given_up_on_waits_out_the_receivers_retry_after(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The receiver asks for an hour (429, `Retry-After: 3600`) and the first delivery is
    given up on after its retries (at `max_backoff`); the next delivery to it waits out the
    hour before its first attempt, on frozen clocks that only the channel's sleeps move.
    Before, it was sent at once, as if the receiver had asked nothing."""
    now = [1_800_000_000.0]
    slept: list[float] = []
    monotonic = frozen_monotonic(monkeypatch, _webhook_waits)

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds
        monotonic.now += seconds

    answers: list[int | tuple[int, dict[str, str]]] = [
        (429, {"Retry-After": "3600"}),
        (429, {"Retry-After": "3600"}),
    ]
    async with Receiver(answers) as receiver:
        hooks = WebhookChannel(
            receiver.url,
            SECRET,
            max_attempts=2,
            backoff=1,
            max_backoff=30,
            sleep=sleep,
            clock=lambda: now[0],
        )
        assert await hooks.deliver(receiver.url, "whd_1", "request.opened", b"{}") is False
        assert slept == [30]  # its own retry: at max_backoff
        caplog.set_level(logging.WARNING)
        assert await hooks.deliver(receiver.url, "whd_2", "request.opened", b"{}") is True
        assert slept == [30, 3600]  # the hour asked at the last answer, 30 s on
        assert "waits 3600s" in caplog.text
        # Delivered: the receiver asks nothing now, and the next goes at once.
        assert await hooks.deliver(receiver.url, "whd_3", "request.opened", b"{}") is True
        await hooks.close()
    assert slept == [30, 3600]
    assert [h["Signoff-Delivery"] for h, _ in receiver.attempts] == [
        "whd_1",
        "whd_1",
        "whd_2",
        "whd_3",
    ]


async def test_an_answer_without_retry_after_lifts_what_an_earlier_one_asked() -> None:
    """A 503 with `Retry-After: 3600` and then, on the retry, a 503 without one: the receiver
    no longer asks to wait, so the next delivery goes at once (on the frozen clock)."""
    now = [1_800_000_000.0]
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    async with Receiver([(503, {"Retry-After": "3600"}), 503]) as receiver:
        hooks = WebhookChannel(
            receiver.url,
            SECRET,
            max_attempts=2,
            backoff=1,
            max_backoff=30,
            sleep=sleep,
            clock=lambda: now[0],
        )
        assert await hooks.deliver(receiver.url, "whd_1", "request.opened", b"{}") is False
        assert await hooks.deliver(receiver.url, "whd_2", "request.opened", b"{}") is True
        await hooks.close()
    assert slept == [30]


def _store_down_for_drops(rt: so.Runtime) -> tuple[Any, list[bool]]:
    """Make the store fail each write dropping a delivery's copy while `down[0]` is True (an
    outage that lets every other write through); returns the real write and `down`."""
    store: Any = rt.store
    real = store.keep_channel_memos
    down = [True]

    async def flaky(texts: dict[str, str | None], now: float, **kw: Any) -> None:
        if down[0] and any(":outbox:" in k and v is None for k, v in texts.items()):
            raise StoreUnavailable("the store is unreachable")
        await real(texts, now, **kw)

    store.keep_channel_memos = flaky
    return real, down


async def test_a_refusal_whose_store_copy_stays_is_not_sent_again_after_a_restart(
    store_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The store is down for the one write dropping a refused delivery's copy, and back only
    after the hub stopped: the hub started again on the same state does not send the delivery
    again (its refusal is recorded there) and drops the store's copy. Before, the copy read
    as unsent was sent again."""
    state = tmp_path / "hub.db"
    async with (
        Receiver([404]) as receiver,
        so.Runtime([refund_agent()], store=store_url) as rt,
    ):
        _, down = _store_down_for_drops(rt)
        hooks = WebhookChannel(receiver.url, SECRET, sleep=_instantly)
        async with manual(ChannelHub(rt, [hooks], state=state)) as hub:
            await rt.generate("support", prompt="Refund 1042")
            await hub.poll()
            await hooks.drain()
            (refusal,) = await hooks.refusals()
        down[0] = False  # the store is back
        again = WebhookChannel(receiver.url, SECRET, sleep=_instantly)
        async with manual(ChannelHub(rt, [again], state=state)) as hub:
            await hub.poll()
            await again.drain()
            assert await again.refusals() == [refusal]
            assert again.memos("outbox:") == [] and again.memos("dropping:") == []
        s: Any = rt.store
        assert await s.channel_memos("hub.webhooks:outbox:") == []
    assert [h["Signoff-Delivery"] for h, _ in receiver.attempts] == [refusal["delivery"]]
    assert "was refused, but the store's copy of it stays" in caplog.text


async def test_a_refused_deliverys_store_copy_is_dropped_once_the_store_is_back(
    store_url: str, tmp_path: Path
) -> None:
    """The store is down for the write dropping a refused delivery's copy: the running hub
    drops it at a poll once the store is back, so a hub on another state (which does not see
    this state's refusals) does not send it again. Before, the copy stayed in the store."""
    async with (
        Receiver([404]) as receiver,
        so.Runtime([refund_agent()], store=store_url) as rt,
    ):
        _, down = _store_down_for_drops(rt)
        s: Any = rt.store
        hooks = WebhookChannel(receiver.url, SECRET, sleep=_instantly)
        async with manual(ChannelHub(rt, [hooks], state=tmp_path / "a.db")) as hub:
            await rt.generate("support", prompt="Refund 1042")
            await hub.poll()
            await hooks.drain()
            assert len(await s.channel_memos("hub.webhooks:outbox:")) == 1
            await hub.poll()  # still down: tried again at the next poll
            down[0] = False
            await hub.poll()
            assert await s.channel_memos("hub.webhooks:outbox:") == []
            assert hooks.memos("dropping:") == []
        other = WebhookChannel(receiver.url, SECRET, sleep=_instantly)
        async with manual(ChannelHub(rt, [other], state=tmp_path / "b.db")) as hub:
            await hub.poll()
            await other.drain()
    assert len(receiver.attempts) == 1
