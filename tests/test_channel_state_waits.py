"""Channel-state calls wait for another process's lock on the state file off the event loop:
while they wait, the loop goes on serving (HTTP, SSE, lease renewals), and what they write is
saved once the lock is let go. Each test holds the lock from another process while a write
path runs, and lets it go from the event loop: a write that blocked the loop would fail first
(the lock held past its `busy_timeout`)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

import signoff as so
from signoff.channels import Channel, ChannelHub, ChannelState, WebhookChannel
from signoff.channels._base import off_loop
from signoff.channels._state import MOST_THREADS
from signoff.testing import ManualClock

from ._channel_state import Seen, gated, open_one
from ._channels import Texts
from ._locks import holding
from ._slack import channel, fake_slack, manual, refund_runtime, sign
from .test_slack_clicks import approve
from .test_webhooks import SECRET, Receiver, refund_agent

T = TypeVar("T")

PATIENCE = 3.0  # the state's busy_timeout: a write that blocks the loop fails after it


async def serves_while_locked(path: Path, action: Callable[[], Awaitable[T]]) -> T:
    """Run `action` while another process holds the write lock of the state file at `path`;
    the event loop ticks on while it waits, and lets the lock go after ten ticks."""
    with holding(path) as holder:
        task = asyncio.ensure_future(action())
        ticks = 0
        while ticks < 10:
            await asyncio.sleep(0.01)
            ticks += 1
        if task.done():
            error = task.exception()
            pytest.fail(f"the state was written on the event loop (or not at all): {error!r}")
        holder.release()
    return await asyncio.wait_for(task, 10 * PATIENCE)


def state_at(tmp_path: Path) -> tuple[Path, ChannelState]:
    path = tmp_path / "channels.db"
    return path, ChannelState(path, busy_timeout=PATIENCE)


async def test_a_cancelled_caller_goes_on_only_once_its_write_ended(tmp_path: Path) -> None:
    path, state = state_at(tmp_path)
    with holding(path) as holder:
        task = asyncio.ensure_future(off_loop(state.remember, "slack", "msg:r1", {"ts": "1.2"}))
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.sleep(0.05)
        assert not task.done()  # still waiting for its write, which must not land later
        holder.release()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert state.recall("slack", "msg:r1") == {"ts": "1.2"}  # saved before the caller went on
    state.close()


async def test_the_hubs_positions_and_skipped_entries_are_saved_off_the_loop(
    tmp_path: Path,
) -> None:
    path, state = state_at(tmp_path)

    class Down(Channel):
        """Fails on every opening while `down`."""

        def __init__(self) -> None:
            super().__init__(name="down")
            self.down = True
            self.opened: list[str] = []

        async def on_requested(self, request: so.InputRequest) -> None:
            if self.down:
                raise RuntimeError("the service is down")
            self.opened.append(request.id)

    async with gated(tmp_path) as rt:
        seen, down = Seen(), Down()
        hub = ChannelHub(rt, [seen, down], state=state, max_attempts=1, retry_backoff=0)
        await serves_while_locked(path, lambda: hub.start(follow=False))  # the start positions
        try:
            rid = await open_one(rt)
            await serves_while_locked(path, hub.poll)  # `down` gives up: kept for the next start
            assert seen.opened == [rid] and down.opened == []
            assert state.position(f"hub:{seen.name}") == hub.position(seen)
            assert state.recall("hub:down", "skipped") is not None
        finally:
            await hub.stop()
        down.down = False
        again = ChannelHub(rt, [Seen(), down], state=state)
        await serves_while_locked(path, lambda: again.start(follow=False))  # delivered again
        await again.stop()
        assert down.opened == [rid] and state.recall("hub:down", "skipped") is None
    state.close()


async def test_a_hub_made_on_the_event_loop_opens_its_state_file_when_it_starts(
    tmp_path: Path,
) -> None:
    """Made inside a running loop while another process holds the lock of a new file (one to
    set up): the hub's construction opened the file there and then, stalling the loop for the
    file's whole busy timeout (and failing after it)."""
    path = tmp_path / "channels.db"
    async with gated(tmp_path) as rt:
        seen = Seen()

        async def made_and_started() -> ChannelHub:
            hub = ChannelHub(rt, [seen], state=path)
            await hub.start(follow=False)
            return hub

        hub = await serves_while_locked(path, made_and_started)
        try:
            rid = await open_one(rt)
            await hub.poll()
            assert seen.opened == [rid]
            assert hub.state.position("hub:seen") == hub.position(seen)
        finally:
            await hub.stop()


async def test_webhook_deliveries_and_warnings_are_kept_off_the_loop(tmp_path: Path) -> None:
    path, state = state_at(tmp_path)
    clock = ManualClock()
    async with (
        Receiver([503]) as receiver,
        so.Runtime(
            [refund_agent(expires_in=3600)], store=f"sqlite:///{tmp_path / 's.db'}", clock=clock
        ) as rt,
    ):
        retry = asyncio.Event()

        async def sleep(_: float) -> None:
            await retry.wait()

        async def retried() -> None:
            retry.set()
            await hooks.drain()

        hooks = WebhookChannel(receiver.url, SECRET, expiring_within=600, clock=clock, sleep=sleep)
        async with manual(ChannelHub(rt, [hooks], state=state, clock=clock)) as hub:
            r = await rt.generate("support", prompt="Refund 1042")
            (req,) = r.pending
            await serves_while_locked(path, hub.poll)  # request.opened kept in the outbox
            assert len(hooks.memos("outbox:")) == 1  # a 503: waiting to retry
            await serves_while_locked(path, retried)  # sent: dropped from the outbox
            assert hooks.memos("outbox:") == []
            clock.advance(3100)
            await serves_while_locked(path, hub.poll)  # request.expiring, and the warned: memo
            assert hooks.recall(f"warned:{req.id}") is True
            await hooks.drain()  # sent before the close, or `still_due` drops it unsent
            await rt.respond(
                r.session_id,
                [so.InputResponse(request_id=req.id, option_id="cancel")],
                principal=so.Principal(authenticator="web", principal_id="bob"),
            )
            await serves_while_locked(path, hub.poll)  # the warned: memo goes
            assert hooks.recall(f"warned:{req.id}") is None
            await hooks.drain()
        assert [json.loads(b)["type"] for _, b in receiver.accepted] == [
            "request.opened",
            "request.expiring",
            "request.resolved",
        ]
    state.close()


async def test_a_text_channel_keeps_what_it_showed_off_the_loop(tmp_path: Path) -> None:
    path, state = state_at(tmp_path)
    async with gated(tmp_path) as rt:
        texts = Texts()
        async with manual(ChannelHub(rt, [texts], state=state)) as hub:
            rid = await open_one(rt)
            await serves_while_locked(path, hub.poll)
            assert texts.recall("shown") == rid and len(texts.sent) == 1
    state.close()


async def test_slack_memos_are_kept_off_the_loop(tmp_path: Path) -> None:
    path, state = state_at(tmp_path)
    async with fake_slack() as fake:
        async with refund_runtime(tmp_path, []) as rt:
            # to drop: a click memo of the slack channel of the hub named "hub"
            state.remember("slack", "click:old", {"state": "done", "until": 0}, hub="hub")
            slack = channel(fake)
            hub = ChannelHub(rt, [slack], state=state)
            await serves_while_locked(path, lambda: hub.start(follow=False))
            try:
                assert slack.recall("click:old") is None
                r = await rt.generate("support", prompt="Refund 1042")
                (req,) = r.pending
                await serves_while_locked(path, hub.poll)  # posted, where it is kept
                assert slack.recall(f"msg:{req.id}") is not None
                body = approve(req.id)
                await slack.handle(body, sign(body, int(time.time())))  # saved, acknowledged
                await serves_while_locked(path, slack.idle)  # settled in the background
                await serves_while_locked(path, hub.poll)  # the message shows who decided
                assert slack.recall(f"msg:{req.id}") is None
                (update,) = fake.of("chat.update")
                assert update["blocks"][-1]["block_id"] == "signoff.resolution"
            finally:
                await hub.stop()
    state.close()


async def test_off_loop_passes_on_what_the_call_raises(tmp_path: Path) -> None:
    state = ChannelState(tmp_path / "channels.db")
    state.close()
    with pytest.raises(so.StoreError, match="channel state"):
        await off_loop(state.recall, "slack", "msg:r1")


async def test_off_loop_runs_a_few_threads_at_once_however_many_calls_wait() -> None:
    """Each call had a thread of its own: a burst of deliveries while another hub held the
    state file started one per call (2,000 threads waiting on one lock)."""
    lock = threading.Lock()
    running, most = [0], [0]
    release = threading.Event()

    def call() -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        release.wait(5)
        with lock:
            running[0] -= 1

    calls = [asyncio.ensure_future(off_loop(call)) for _ in range(50)]
    await asyncio.sleep(0.3)
    release.set()
    await asyncio.gather(*calls)
    assert 1 <= most[0] <= MOST_THREADS
