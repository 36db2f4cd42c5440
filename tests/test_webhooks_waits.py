"""What a webhook receiver asked with `Retry-After` outlives the hub that heard it: it is kept in
the runtime's store beside the outbox (the seconds asked, aged by the store's time of keeping
them), so a hub started again on the same state, or one taking over on another machine, waits
out the hour a receiver asked for instead of calling it at once. Before, it lived in the
process's memory only."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from signoff.channels import ChannelHub, WebhookChannel

from ._channel_state import gated, open_one
from .test_webhooks import SECRET, Receiver, manual
from .test_webhooks_machine_loss import until

_HUB = """
import asyncio, sys
import signoff as so
from signoff.channels import ChannelHub, WebhookChannel

async def main():
    async with so.Runtime([], store=sys.argv[1]) as rt:
        hooks = WebhookChannel(sys.argv[3], sys.argv[4], max_attempts=1)
        hub = ChannelHub(rt, [hooks], state=sys.argv[2], poll_interval=0.05, claim_ttl=1.0)
        async with hub:
            print("active" if hub.active else "standby", flush=True)
            while not hooks.memos("outbox:"):  # queued (kept in its state)
                await asyncio.sleep(0.02)
            print("kept", flush=True)
            await asyncio.Event().wait()

asyncio.run(main())
"""


@pytest.mark.parametrize("state", ["a.db", "b.db"])
async def test_a_retry_after_is_waited_out_by_the_hub_after_a_kill(
    store_url: str, tmp_path: Path, state: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A `serve` process (state a.db) delivers `request.opened` to a receiver answering 429
    with `Retry-After: 3600`, gives it up, and is SIGKILLed. The hub started next, on the same
    state (a restart) or on b.db (another machine), waits out the hour: in the 3 s it is given
    the receiver is not called again, and it logs the wait. Before, it called at once."""
    async with (
        Receiver([(429, {"Retry-After": "3600"})]) as receiver,
        gated(tmp_path, store_url) as rt,
    ):
        args = [sys.executable, "-c", _HUB, store_url, str(tmp_path / "a.db"), receiver.url]
        proc = subprocess.Popen([*args, SECRET], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "active"
            await open_one(rt)
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
            assert line.strip() == "kept"
            await until(lambda: len(receiver.attempts) > 0)
            # Killed once the store keeps what the 429 asked: the child keeps it after the
            # answer reached it, which a loaded machine delays past any fixed sleep.
            s: Any = rt.store
            async with asyncio.timeout(30):
                while not await s.channel_memos("hub.webhooks:asked:"):
                    await asyncio.sleep(0.02)
        finally:
            proc.kill()
            proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()
        caplog.set_level(logging.WARNING)
        hooks = WebhookChannel(receiver.url, SECRET, timeout=2)  # close() waits no longer
        hub = ChannelHub(rt, [hooks], state=tmp_path / state, poll_interval=0.05, claim_ttl=1.0)
        async with hub:
            await until(lambda: hub.active)
            # Its delivery reaches its wait (logged), however long a loaded machine takes.
            await until(lambda: "asked to be called no sooner (Retry-After)" in caplog.text)
            await asyncio.sleep(3.0)
            assert len(receiver.attempts) == 1  # the receiver is not called before its hour
            (memo,) = await s.channel_memos("hub.webhooks:asked:")
        assert "asked to be called no sooner (Retry-After)" in caplog.text
        waits = [float(w) for w in _waits(caplog.text)]
        assert waits and all(3590 <= w <= 3600 for w in waits)
    assert memo[1] == '{"seconds":3600.0}'


def _waits(text: str) -> list[str]:
    marker = " waits "
    return [
        line.split(marker)[-1].removesuffix("s")
        for line in text.splitlines()
        if "Retry-After" in line and marker in line
    ]


async def test_a_hub_started_again_waits_out_what_was_asked_then_lifts_it(
    store_url: str, tmp_path: Path
) -> None:
    """A hub in memory gives up a delivery its receiver answered `Retry-After: 3600`; the next
    hub (in memory too, on the same store) sleeps out that hour before its first try, and once
    the receiver takes it the store keeps nothing of the wait."""
    slept: list[float] = []
    now = [1_800_000_000.0]

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    async with (
        Receiver([(429, {"Retry-After": "3600"})]) as receiver,
        gated(tmp_path, store_url) as rt,
    ):
        hooks = WebhookChannel(
            receiver.url, SECRET, max_attempts=1, sleep=sleep, clock=lambda: now[0]
        )
        async with manual(ChannelHub(rt, [hooks])) as hub:
            await open_one(rt)
            await hub.poll()
            await hooks.drain()
        assert slept == [] and len(receiver.attempts) == 1
        again = WebhookChannel(receiver.url, SECRET, sleep=sleep, clock=lambda: now[0])
        async with manual(ChannelHub(rt, [again])) as hub:
            await hub.poll()
            await again.drain()
        s: Any = rt.store
        assert await s.channel_memos("hub.webhooks:asked:") == []
    assert len(slept) == 1 and 3590 <= slept[0] <= 3600
    assert len(receiver.accepted) == 1


async def test_a_wait_kept_in_the_state_is_honoured_on_a_store_without_memos(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a store that keeps no channel memos (one of your own) the wait is kept in the hub's
    state file, and a hub started again on it waits it out."""
    from signoff.channels import _shared

    monkeypatch.setattr(_shared.Shared, "kept", property(lambda self: False))
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    state = tmp_path / "hub.db"
    async with Receiver([(503, {"Retry-After": "600"})]) as receiver, gated(tmp_path) as rt:
        hooks = WebhookChannel(receiver.url, SECRET, max_attempts=1, sleep=sleep)
        async with manual(ChannelHub(rt, [hooks], state=state)) as hub:
            await open_one(rt)
            await hub.poll()
            await hooks.drain()
            assert [k for k, _ in hooks.memos("asked:")] == [f"asked:{receiver.url}"]
        again = WebhookChannel(receiver.url, SECRET, sleep=sleep)
        async with manual(ChannelHub(rt, [again], state=state)) as hub:
            await hub.poll()
            await again.drain()
            assert again.memos("asked:") == []  # lifted by the 2xx
    assert len(slept) == 1 and 590 <= slept[0] <= 600
    assert len(receiver.accepted) == 1


@pytest.mark.parametrize("step", [-86_400.0, 86_400.0], ids=["back", "forward"])
async def test_a_step_of_the_wall_clock_neither_lengthens_nor_lifts_a_wait(step: float) -> None:
    """The wait a receiver asked for was timed by the channel's wall clock: stepped back a day
    (NTP, a snapshot restored), the next delivery to it waited a day and 30 s, past the hour
    `MAX_WAIT` allows, holding every later one behind it; stepped forward, it was sent at once.
    It is timed by the process's monotonic clock, and waits what was asked."""
    now = [1_800_000_000.0]
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    async with Receiver([(429, {"Retry-After": "30"})]) as receiver:
        hooks = WebhookChannel(
            receiver.url, SECRET, max_attempts=1, sleep=sleep, clock=lambda: now[0]
        )
        assert await hooks.deliver(receiver.url, "whd_1", "request.opened", b"{}") is False
        now[0] += step
        assert await hooks.deliver(receiver.url, "whd_2", "request.opened", b"{}") is True
        await hooks.close()
    assert len(slept) == 1 and 29 <= slept[0] <= 30, slept


@pytest.mark.parametrize("asked", ["999999999", "1000000000", "86400000000", "9" * 5000])
def test_a_retry_after_of_many_digits_is_a_long_wait_not_none(asked: str) -> None:
    """A `Retry-After` of ten digits or more was read as no wait at all (only nine were taken
    as seconds, the rest failed as a date): the receiver was called again at once, and a wait
    an earlier answer asked for was forgotten. Any number of seconds is a wait, capped later."""
    import httpx

    from signoff.channels._webhook_posts import retry_after

    wait = retry_after(httpx.Headers({"retry-after": asked}), 0.0)
    assert wait is not None and wait >= 999_999_999


def test_a_retry_after_with_leading_zeros_is_its_number_of_seconds() -> None:
    """`0000000005` is five seconds: ten digits were taken for a wait of 31 years (capped)."""
    import httpx

    from signoff.channels._webhook_posts import retry_after

    assert retry_after(httpx.Headers({"retry-after": "0000000005"}), 0.0) == 5.0
