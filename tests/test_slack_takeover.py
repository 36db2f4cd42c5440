"""A Slack hub taking over from a hub on another state (another machine, another state file)
updates the messages the first posted: where each request's message is lives in the store too
(rows of `channel_claims` beside the claim), not only in the first hub's state file. Before,
the second hub posted every open request again and left the first's messages showing their
buttons for ever (its updates and closes went to its own posts)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import ChannelHub

from ._channel_state import gated, open_one
from ._slack import FakeSlack, channel, fake, manual

__all__ = ["fake"]  # the fixture, used by name


async def until(check: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def _approve(rt: so.Runtime, request_id: str) -> None:
    stored = await rt.store.get_request(request_id)
    assert stored is not None
    approve = so.InputResponse(request_id=request_id, option_id="approve")
    await rt.respond(stored.request.session_id, [approve], resume=False)


def _closed(update: dict[str, Any]) -> bool:
    """Whether an update shows its request approved, with no buttons left."""
    return update["text"].startswith("Approved") and all(
        b["type"] != "actions" for b in update["blocks"]
    )


@pytest.mark.parametrize("answered", ["after-the-takeover", "while-no-hub-ran"])
async def test_a_hub_on_another_state_updates_the_messages_the_first_posted(
    store_url: str, tmp_path: Path, fake: FakeSlack, answered: str
) -> None:
    """Hub A (state a.db) posts a request and stops; hub B (state b.db) takes over, posts
    nothing again, and once the request is approved (after it took over, or before, while no
    hub ran) it updates A's message: `chat.update` on A's ts."""
    async with gated(tmp_path, store_url) as rt:
        async with manual(ChannelHub(rt, [channel(fake)], state=tmp_path / "a.db")) as a:
            rid = await open_one(rt)
            await a.poll()
        (posted,) = fake.messages["C42"]
        if answered == "while-no-hub-ran":
            await _approve(rt, rid)
        async with manual(ChannelHub(rt, [channel(fake)], state=tmp_path / "b.db")) as b:
            assert b.active
            await b.poll()
            if answered == "after-the-takeover":
                assert fake.of("chat.update") == []
                await _approve(rt, rid)
                await b.poll()
        assert len(fake.of("chat.postMessage")) == 1  # not posted again
        (update,) = fake.of("chat.update")
        assert update["ts"] == posted["ts"] and _closed(update)


_HUB = """
import asyncio, sys
import signoff as so
from signoff.channels import ChannelHub
from signoff.channels.slack import SlackChannel

async def main():
    async with so.Runtime([], store=sys.argv[1]) as rt:
        slack = SlackChannel("C42", token="xoxb-test", base_url=sys.argv[3], signing_secret="s")
        hub = ChannelHub(rt, [slack], state=sys.argv[2], poll_interval=0.05, claim_ttl=1.0)
        async with hub:
            print("active" if hub.active else "standby", flush=True)
            while not slack.memos("msg:"):
                await asyncio.sleep(0.02)
            (key, _), = slack.memos("msg:")
            shared = "hub.slack:post:" + key.removeprefix("msg:")
            while '"ts"' not in (await rt.store.channel_memo(shared) or ""):
                await asyncio.sleep(0.02)  # in the store too: a standby finds it there
            print("posted", flush=True)
            await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_a_standby_on_another_machine_updates_the_messages_of_a_hub_killed(
    store_url: str, tmp_path: Path, fake: FakeSlack
) -> None:
    """A `serve` process (its own state file) posts a request and is SIGKILLed; the standby
    on another state takes the claim once it lapses, and when the request is approved it
    updates the message the dead hub posted, posting none of its own."""
    async with gated(tmp_path, store_url) as rt:
        args = [sys.executable, "-c", _HUB, store_url, str(tmp_path / "a.db"), fake.url]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "active"
            standby = ChannelHub(
                rt, [channel(fake)], state=tmp_path / "b.db", poll_interval=0.05, claim_ttl=1.0
            )
            async with standby:
                assert not standby.active
                rid = await open_one(rt)
                # In a thread: the fake Slack the child posts to answers on this loop.
                line = await asyncio.to_thread(proc.stdout.readline)
                assert line.strip() == "posted"
                (posted,) = fake.messages["C42"]
                proc.kill()
                proc.wait()
                await until(lambda: standby.active)
                await _approve(rt, rid)
                await until(lambda: len(fake.of("chat.update")) == 1)
        finally:
            proc.kill()
            proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()
    assert len(fake.of("chat.postMessage")) == 1
    (update,) = fake.of("chat.update")
    assert update["ts"] == posted["ts"] and _closed(update)


async def test_a_standby_on_another_machine_adopts_the_post_a_hub_died_sending(
    store_url: str, tmp_path: Path, fake: FakeSlack
) -> None:
    """The `serve` process is SIGKILLed once Slack has its post and before it hears back (so
    no state has the message, only the post's attempt, saved before it was sent): the standby
    on another state finds the message by that attempt, kept in the store too, and updates it
    once the request is approved, posting nothing of its own."""
    async with gated(tmp_path, store_url) as rt:
        args = [sys.executable, "-c", _HUB, store_url, str(tmp_path / "a.db"), fake.url]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        fake.real_ts = True  # the history around the attempt's time holds it
        fake.on_post = lambda message: proc.kill()  # Slack has it; the poster is gone
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "active"
            standby = ChannelHub(
                rt, [channel(fake)], state=tmp_path / "b.db", poll_interval=0.05, claim_ttl=1.0
            )
            async with standby:
                rid = await open_one(rt)
                await until(lambda: proc.poll() is not None)
                (posted,) = fake.messages["C42"]
                await until(lambda: standby.active)
                await _approve(rt, rid)
                await until(lambda: len(fake.of("chat.update")) == 1)
        finally:
            proc.kill()
            proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()
    assert len(fake.of("chat.postMessage")) == 1
    (update,) = fake.of("chat.update")
    assert update["ts"] == posted["ts"] and _closed(update)


async def test_the_store_keeps_channel_memos_beside_the_claims(store_url: str) -> None:
    """The store's side: memos are kept, replaced and dropped by name, several at once, apart
    from the claim of their hub and channel; a name that could be a claim's is refused."""
    async with so.Runtime([], store=store_url) as rt:
        s: Any = rt.store  # the memos are no part of the `Store` protocol: a store may lack them
        now = rt.now()
        assert (await s.claim_channel("hub.slack", "a", 30, now))[0]
        await s.keep_channel_memos({"hub.slack:post:r1": '{"ts":"1"}', "hub.slack:x": "2"}, now)
        assert await s.channel_memo("hub.slack:post:r1") == '{"ts":"1"}'
        await s.keep_channel_memos({"hub.slack:post:r1": '{"ts":"3"}', "hub.slack:x": None}, now)
        assert await s.channel_memo("hub.slack:post:r1") == '{"ts":"3"}'
        assert await s.channel_memo("hub.slack:x") is None
        assert await s.claim_channel("hub.slack", "b", 30, now) == (False, None, None)
        assert (await s.claim_channel("hub.slack", "a", 30, now))[0]  # a's claim is intact
        with pytest.raises(so.UsageError, match="channel memo"):
            await s.keep_channel_memos({"hub.slack": "x"}, now)
        with pytest.raises(so.UsageError, match="channel memo"):
            await s.channel_memo("hub.slack")
        assert await s.claim_channel("hub.slack", "b", 30, now) == (False, None, None)
