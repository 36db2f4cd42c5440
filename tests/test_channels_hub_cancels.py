"""A `CancelledError` a channel raises of its own (it awaited a task someone else cancelled), the
hub's task not being cancelled, is that channel's failure, retried and logged like any other
(`_stray_cancels`). Before, it went up through the hub's poll and ended its follow task: no
channel heard anything again, nothing was logged, and the hub still seemed started."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

import pytest

import signoff as so
from signoff.channels import Channel, ChannelHub

from ._channels import manual, three_refunds
from ._webhook_serve_child import refunder


async def _stray_cancel() -> None:
    """Await a helper task that was cancelled: its `CancelledError`, not the caller's task's."""
    helper = asyncio.ensure_future(asyncio.sleep(10))
    helper.cancel()
    await helper


class Odd(Channel):
    """Raises a stray `CancelledError` in the hooks named in `stray` (at most `times` times
    each, for the requests of `only` if given), and records the requests it is told of."""

    def __init__(
        self, name: str, stray: set[str], *, times: int = 1, only: set[str] | None = None
    ) -> None:
        super().__init__(name=name)
        self.stray, self.times, self.only = stray, times, only
        self.raised: dict[str, int] = {}
        self.seen: list[str] = []

    async def _maybe(self, hook: str) -> None:
        if hook in self.stray and self.raised.get(hook, 0) < self.times:
            self.raised[hook] = self.raised.get(hook, 0) + 1
            await _stray_cancel()

    async def start(self, open_requests: Sequence[so.InputRequest]) -> None:
        await self._maybe("start")

    async def tick(self, now: float) -> None:
        await self._maybe("tick")

    async def on_requested(self, request: so.InputRequest) -> None:
        order = request.action.input.get("order_id") if request.action else None
        if self.only is None or order in self.only:
            await self._maybe("on_requested")
        self.seen.append(request.id)


async def _until(check: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("hook", ["on_requested", "tick", "start"])
async def test_a_channels_own_cancel_is_its_failure_and_the_hub_goes_on(
    store_url: str, hook: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The hub follows (as `signoff serve`'s does) while one channel raises a stray
    `CancelledError` once: every channel is told of each of three requests, the odd one too
    (a delivery is retried), the follow task still runs, and the failure is logged."""
    async with so.Runtime([refunder], store=store_url) as rt:
        odd, hooks = Odd("odd", {hook}), Odd("hooks", set())
        hub = ChannelHub(rt, [odd, hooks], poll_interval=0.05, retry_backoff=0)
        with caplog.at_level(logging.WARNING, logger="signoff.channels"):
            await hub.start()
            try:
                opened = []
                for n in range(3):
                    r = await rt.generate("refunder", prompt=f"Refund order {n}")
                    opened.append(r.pending[0].id)
                await _until(lambda: hooks.seen == opened and odd.seen == opened)
                assert odd.raised == {hook: 1}
                assert hub._task is not None and not hub._task.done()
            finally:
                await hub.stop()
    assert "CancelledError of its own" in caplog.text


async def test_each_request_of_an_entry_is_told_past_one_cancelled_on_its_redelivery(
    store_url: str,
) -> None:
    """An entry opening three requests, the channel's own cancel on the second every time:
    given up on (one attempt), then delivered again by a round, which tells the third past
    the second, as for any failure."""
    async with so.Runtime([three_refunds([])], store=store_url) as rt:
        odd = Odd("odd", {"on_requested"}, times=10, only={"B-2"})
        hub = ChannelHub(rt, [odd], max_attempts=1)
        async with manual(hub):
            a, _, c = (await rt.generate("support", prompt="Refund A, B and C")).pending
            await hub.poll()  # A told, B fails: the entry is given up on
            assert odd.seen == [a.id]
            await hub._redeliver(odd)  # a round: C is told past B, A not again
            assert odd.seen == [a.id, c.id] and odd.raised == {"on_requested": 2}


async def test_a_cancel_of_the_hubs_own_task_still_stops_it(store_url: str) -> None:
    """A cancel of the follow task (not a stray one) ends it, also in a channel's hook."""
    async with so.Runtime([refunder], store=store_url) as rt:
        told = asyncio.Event()

        class Hanging(Channel):
            async def on_requested(self, request: so.InputRequest) -> None:
                told.set()
                await asyncio.Event().wait()

        hub = ChannelHub(rt, [Hanging(name="hanging")], poll_interval=0.05)
        await hub.start()
        try:
            await rt.generate("refunder", prompt="Refund order 1")
            await asyncio.wait_for(told.wait(), 15)
            task = hub._task
            assert task is not None
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            hub._task = None
            await hub.stop()


async def test_a_poll_cancelled_from_within_is_logged_and_the_hub_goes_on(
    store_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stray `CancelledError` out of a poll, not of a channel's hook (something the hub
    awaited), is logged and the next poll goes on, where it ended the follow task."""
    async with so.Runtime([refunder], store=store_url) as rt:
        hooks = Odd("hooks", set())
        hub = ChannelHub(rt, [hooks], poll_interval=0.05)
        polls, real = [], hub.poll

        async def poll() -> int:
            polls.append(1)
            if len(polls) == 1:
                await _stray_cancel()
            return await real()

        monkeypatch.setattr(hub, "poll", poll)
        with caplog.at_level(logging.WARNING, logger="signoff.channels"):
            await hub.start()
            try:
                r = await rt.generate("refunder", prompt="Refund order 1")
                await _until(lambda: hooks.seen == [r.pending[0].id])
            finally:
                await hub.stop()
    assert "channel hub hub: a poll was cancelled from within" in caplog.text


async def test_a_renewal_cancelled_from_within_between_polls_is_a_failed_one(
    store_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stray `CancelledError` out of the store as the hub renews its claims while it waits for
    its next poll is a failed renewal, logged and tried again; the hub goes on. Before, it ended
    the claims' keeper, then the wait and the follow task with it, silently: no channel heard
    anything again, the hub still seeming started."""
    async with so.Runtime([refunder], store=store_url) as rt:
        hooks = Odd("hooks", set())
        # Each wait (a second) outlasts a third of the claim's time: the keeper renews in it.
        hub = ChannelHub(rt, [hooks], claim_ttl=1.5, poll_interval=1.0)
        real, real_pause = rt.store.claim_channel, hub._pause
        strays: list[int] = []
        pausing: list[int] = []  # non-empty while the hub waits for its next poll

        async def claim_channel(*args: Any, **kwargs: Any) -> Any:
            task = asyncio.current_task()
            keeper = task is not None and task.get_name() == "signoff-hub-hub-claims"
            if pausing and keeper and not strays:  # the keeper's, as the hub waits
                strays.append(1)
                await _stray_cancel()
            return await real(*args, **kwargs)

        async def pause(*args: Any) -> None:
            pausing.append(1)
            try:
                await real_pause(*args)
            finally:
                pausing.pop()

        monkeypatch.setattr(rt.store, "claim_channel", claim_channel)
        monkeypatch.setattr(hub, "_pause", pause)
        with caplog.at_level(logging.WARNING, logger="signoff.channels"):
            await hub.start()
            try:
                await _until(lambda: bool(strays))
                r = await rt.generate("refunder", prompt="Refund order 1")
                await _until(lambda: hooks.seen == [r.pending[0].id], timeout=8.0)
                assert hub._task is not None and not hub._task.done()
                assert hub.active
            finally:
                await hub.stop()
    assert "channel hub hub: a renewal was cancelled from within" in caplog.text


async def test_a_wait_for_a_change_cancelled_from_within_is_a_plain_sleep(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The store's wait for word of a change (PostgreSQL's) raising a stray `CancelledError` of
    its own is a wait that failed: the hub sleeps instead and goes on, as for any other error
    of it. Before, the cancel ended the wait between polls, and the follow task with it."""
    async with so.Runtime([refunder], store=store_url) as rt:
        hub = ChannelHub(rt, [Odd("hooks", set())])
        waits: list[float] = []

        async def wait(_: None, seconds: float) -> None:
            waits.append(seconds)
            await _stray_cancel()

        async with manual(hub):
            started = time.monotonic()
            await hub._pause(0.2, wait)
            assert waits == [0.2] and time.monotonic() - started >= 0.2


@pytest.mark.parametrize("poll", [10.0, 0.6], ids=["in-the-wait", "after-the-wait"])
async def test_a_stop_does_not_wait_for_a_renewal_under_way_between_polls(
    store_url: str, monkeypatch: pytest.MonkeyPatch, poll: float
) -> None:
    """A stop while the hub renews its claims between polls, the store slow to answer, is
    prompt: the renewal is cut off, and writes nothing after the claim is given back (which
    waits for it, `Claims._writing`): another hub takes the channel at once. Before, the stop
    waited for the renewal (5 seconds here); and it still did when the wait between polls had
    ended while the renewal went on (`after-the-wait`, the likelier with short polls)."""
    async with so.Runtime([refunder], store=store_url) as rt:
        hub = ChannelHub(rt, [Odd("hooks", set())], claim_ttl=1.5, poll_interval=poll)
        real_claim, real_release = rt.store.claim_channel, rt.store.release_channel
        calls: list[str] = []
        slow = asyncio.Event()

        async def claim_channel(*args: Any, **kwargs: Any) -> Any:
            keeper = (task := asyncio.current_task()) is not None and task.get_name().endswith(
                "-claims"
            )
            if slow.is_set() and kwargs.get("renewing") and keeper and "slow" not in calls:
                calls.append("slow")
                await asyncio.sleep(5)
                calls.append("slow renewal wrote")
            return await real_claim(*args, **kwargs)

        async def release_channel(*args: Any, **kwargs: Any) -> Any:
            calls.append("released")
            return await real_release(*args, **kwargs)

        monkeypatch.setattr(rt.store, "claim_channel", claim_channel)
        monkeypatch.setattr(rt.store, "release_channel", release_channel)
        await hub.start()
        other = ChannelHub(rt, [Odd("hooks", set())], claim_ttl=1.5)
        try:
            await asyncio.sleep(0.2)  # its first poll done: waiting for the next
            slow.set()
            await _until(lambda: "slow" in calls)  # the keeper's renewal, under way
            await asyncio.sleep(0.7 if poll < 1 else 0)  # after-the-wait: that wait is over
            started = time.monotonic()
            await hub.stop()
            assert time.monotonic() - started < 2.0
            assert calls == ["slow", "released"]
            await other.start(follow=False)
            assert other.active  # given back: not left to lapse
            await asyncio.sleep(0.1)
            assert calls == ["slow", "released"]
        finally:
            await other.stop()
            await hub.stop()
