"""Webhook deliveries not yet sent survive the loss of the machine whose hub queued them: each
is kept in the store too (a memo beside the channel's claim) before it is queued, and the hub
that takes over on another state file sends it. Before, it lived only in the lost machine's
state: the new hub went on past its entry (the claim's position) and the receiver never heard
of it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from signoff.channels import ChannelHub, WebhookChannel

from ._channel_state import gated, open_one
from .test_webhooks import SECRET, Receiver, manual

_HUB = """
import asyncio, sys
import signoff as so
from signoff.channels import ChannelHub, WebhookChannel

async def main():
    async with so.Runtime([], store=sys.argv[1]) as rt:
        hooks = WebhookChannel(
            sys.argv[3], sys.argv[4], max_attempts=10**6, backoff=0.05, max_backoff=0.1
        )
        hub = ChannelHub(rt, [hooks], state=sys.argv[2], poll_interval=0.05, claim_ttl=1.0)
        async with hub:
            print("active" if hub.active else "standby", flush=True)
            while not hooks.memos("outbox:"):  # queued (kept in its state)
                await asyncio.sleep(0.02)
            entries = await rt.store.audit(after_id=0, limit=10**6)
            while hub.position(hooks) < entries[-1].id:
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.3)  # the poll that moved it saved it in the claim too
            print("kept", flush=True)
            await asyncio.Event().wait()

asyncio.run(main())
"""


async def until(check: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_a_delivery_queued_by_a_machine_lost_is_sent_by_a_hub_on_another_state(
    store_url: str, tmp_path: Path
) -> None:
    """A `serve` process (state a.db) queues `request.opened` for a receiver answering 503,
    saves its position past the entry, and is SIGKILLed; a hub on b.db sharing only the store
    takes the lapsed claim and sends the delivery (same id), after which the store keeps no
    copy of it."""
    async with Receiver([503] * 100_000) as receiver, gated(tmp_path, store_url) as rt:
        args = [sys.executable, "-c", _HUB, store_url, str(tmp_path / "a.db"), receiver.url]
        proc = subprocess.Popen([*args, SECRET], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "active"
            rid = await open_one(rt)
            # In a thread: the receiver the child posts to answers on this loop.
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
            assert line.strip() == "kept"
            await until(lambda: len(receiver.attempts) > 0)
            proc.kill()
            proc.wait()
        finally:
            proc.kill()
            proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()
        tried = {h["Signoff-Delivery"] for h, _ in receiver.attempts}
        receiver.statuses.clear()  # the receiver is back
        hooks = WebhookChannel(receiver.url, SECRET, backoff=0.05)
        hub = ChannelHub(rt, [hooks], state=tmp_path / "b.db", poll_interval=0.05, claim_ttl=1.0)
        async with hub:
            # Hub B's own sending, not an acceptance: the dead hub's last retry, in the socket
            # when it was killed, may be answered after the 503s are cleared (it counts in
            # `accepted`, and its hub never drops the store's copy).
            await until(lambda: hooks.delivered > 0)
            await hooks.drain()
        s: Any = rt.store
        assert await s.channel_memos("hub.webhooks:outbox:") == []
    assert hooks.delivered == 1
    assert len(receiver.accepted) in (1, 2)  # hub B's, and perhaps the dead hub's last retry
    for headers, body in receiver.accepted:
        sent = json.loads(body)
        assert (sent["type"], sent["request"]["id"]) == ("request.opened", rid)
        assert {headers["Signoff-Delivery"]} == tried  # the delivery the dead hub was trying


async def test_a_hub_in_memory_started_again_sends_what_it_left_unsent(
    store_url: str, tmp_path: Path
) -> None:
    """A hub whose state is in memory stops with a delivery its receiver answered with 503s
    (given up on); the next hub in memory, going on from the claim's position past its entry,
    sends it from the store's copy. Before, it was lost with the memory."""
    async with Receiver([503] * 3) as receiver, gated(tmp_path, store_url) as rt:
        hooks = WebhookChannel(receiver.url, SECRET, max_attempts=3, sleep=_instantly)
        async with manual(ChannelHub(rt, [hooks])) as hub:
            rid = await open_one(rt)
            await hub.poll()
            await hooks.drain()
        assert receiver.accepted == [] and len(receiver.attempts) == 3
        again = WebhookChannel(receiver.url, SECRET, sleep=_instantly)
        async with manual(ChannelHub(rt, [again])) as hub:
            await hub.poll()
            await again.drain()
        s: Any = rt.store
        assert await s.channel_memos("hub.webhooks:outbox:") == []
    ((_, body),) = receiver.accepted
    assert json.loads(body)["request"]["id"] == rid


async def _instantly(seconds: float) -> None:
    return None
