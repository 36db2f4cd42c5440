"""A channel hub whose position waits below a hole in the audit ids (`gap_timeout`) keeps the
entries it delivered above it (and those there before it started from the end) beside its claim
in the store, with the position, so the hub taking the claim over on another state (memory, or
another machine's file) delivers none of them again. Both are written together, and only while
the claim still names the hub writing them: one that stalled past its claim writes nothing
over what the hub that took it over keeps there."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import ChannelHub, _claims

from ._channel_state import Seen, erased, gated, open_one
from ._channels import manual

TTL = 0.5


async def test_a_hub_on_another_state_taking_over_below_a_hole_delivers_nothing_twice(
    store_url: str, tmp_path: Path
) -> None:
    """A hub on memory starts from now below a hole (a deleted session's entries, waited for
    `gap_timeout`): the requests open then are not delivered, one opened after is; it stops
    with its position (and its claim's) still below the hole. Another on memory takes the claim
    over and delivers neither those nor that one, only what comes next. Before, it went on from
    the claim's position with nothing else and delivered them all."""
    async with gated(tmp_path, store_url) as rt:
        low = max((e.id for e in await rt.store.audit()), default=0)
        await erased(rt)
        before = [await open_one(rt), await open_one(rt)]
        first, second = Seen(), Seen()
        async with manual(ChannelHub(rt, [first], gap_timeout=60)) as one:
            r1 = await open_one(rt)
            await one.poll()
            assert first.opened == [r1]
            assert one.position(first) == low  # below the hole
        async with manual(ChannelHub(rt, [second], gap_timeout=60)) as two:
            await two.poll()
            assert second.opened == []
            r2 = await open_one(rt)
            await two.poll()
            assert second.opened == [r2]
            two.gap_timeout = 0  # the hole passed: nothing of it delivered either
            await two.poll()
            assert second.opened == [r2]
            assert two.position(second) == (await rt.store.audit())[-1].id
        assert not set(before) & {*first.opened, *second.opened}


@pytest.mark.parametrize("memo", ['"7"', "[7, true]", '{"ids": [7]}'])
async def test_a_memo_of_delivered_ids_that_is_none_is_logged_and_passed_over(
    store_url: str, tmp_path: Path, memo: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The store's memo of the ids delivered past the claim's position, edited into what is
    no list of ids: the hub taking the claim logs it and delivers as without it."""
    async with gated(tmp_path, store_url) as rt:
        await rt.open()
        name = f"hub.seen:{_claims.DELIVERED}"
        memos: Any = rt.store  # both stores have them; the Store protocol does not name them
        await memos.keep_channel_memos({name: memo}, rt.now())
        seen = Seen()
        async with manual(ChannelHub(rt, [seen])) as hub:
            r1 = await open_one(rt)
            await hub.poll()
        assert seen.opened == [r1]
        assert f"the channel memo {name} in the store is unreadable" in caplog.text


_BELOW_A_HOLE = """
import asyncio, sys
import signoff as so
from signoff.channels import Channel, ChannelHub

class Log(Channel):
    name = "seen"
    told = []

    async def on_requested(self, request):
        self.told.append(request.id)

async def main():
    async with so.Runtime([], store=sys.argv[1]) as rt:
        log = Log()
        hub = ChannelHub(rt, [log], claim_ttl=1.0, gap_timeout=60)
        await hub.start(follow=False)
        print("active" if hub.active else "standby", flush=True)
        while True:  # a poll done, then what it delivered said
            await hub.poll()
            if log.told:
                print(" ".join(log.told), flush=True)
                log.told.clear()
            await asyncio.sleep(0.05)

asyncio.run(main())
"""


async def test_a_hub_killed_below_a_hole_leaves_the_next_what_it_delivered_past_it(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, but the first hub's process (on memory) is SIGKILLed while the hole holds
    its position: the standby that takes the lapsed claim delivers neither the requests open
    when the first started nor the one it delivered past the hole."""
    monkeypatch.setattr(_claims, "TRY_EVERY", 0.0)  # a standby tries at every poll
    async with gated(tmp_path, store_url) as rt:
        await erased(rt)
        before = [await open_one(rt), await open_one(rt)]
        proc = subprocess.Popen(
            [sys.executable, "-c", _BELOW_A_HOLE, store_url],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "active"
            seen = Seen()
            async with manual(ChannelHub(rt, [seen], claim_ttl=1.0, gap_timeout=60)) as hub:
                assert not hub.active
                r1 = await open_one(rt)
                told = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
                assert told.split() == [r1]  # its first delivery: not those open at its start
                proc.kill()
                proc.wait()
                deadline = time.monotonic() + 15
                while not hub.active:
                    assert time.monotonic() < deadline, "timed out"
                    await hub.poll()
                    await asyncio.sleep(0.05)
                assert seen.opened == []
                r2 = await open_one(rt)
                await hub.poll()
                assert seen.opened == [r2] and not set(before) & set(seen.opened)
        finally:
            proc.kill()
            proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()


@pytest.mark.parametrize("then", ["holds it", "gives it back"])
async def test_a_hub_that_stalled_below_a_hole_writes_nothing_into_a_claim_taken_over(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, then: str
) -> None:
    """Hub one stalls past its claim's time delivering a request above a hole (its renewals
    held off, as a hook blocking the event loop holds them); hub two takes the claim over,
    delivers that request again (the one in flight) and the next, and keeps both beside the
    claim. One wakes: it wrote its own ids over two's there (it took the claim for its own
    until a renewal failed), so the hub taking over after two delivered that next request
    again; and had two given the claim back meanwhile, one's renewal took the claim back (its
    older position with it) and one delivered it again itself. Now it writes nothing into a
    claim another hub took."""
    monkeypatch.setattr(_claims, "TRY_EVERY", 0.0)  # a standby tries at every poll
    async with gated(tmp_path, store_url) as rt:
        await erased(rt)
        second, third = Seen(), Seen()
        two = ChannelHub(rt, [second], claim_ttl=TTL, gap_timeout=60)
        later: list[str] = []

        class Stalling(Seen):
            async def on_requested(self, request: so.InputRequest) -> None:
                await super().on_requested(request)
                if len(self.opened) != 2:
                    return
                await asyncio.sleep(TTL * 1.2)  # its claim lapses
                later.append(await open_one(rt))
                await two.poll()  # takes the claim over
                assert two.active and second.opened == [request.id, later[0]]
                if then == "gives it back":
                    await two.stop()

        first = Stalling()
        one = ChannelHub(rt, [first], claim_ttl=TTL, gap_timeout=60)
        monkeypatch.setattr(one, "_to_renew", lambda: [])  # its keeper never gets to renew
        await one.start(follow=False)
        await two.start(follow=False)
        try:
            r1 = await open_one(rt)
            await one.poll()
            r2 = await open_one(rt)
            await one.poll()  # stalls delivering r2
            await one.poll()
            assert first.opened == [r1, r2]  # r3 is two's
        finally:
            await one.stop()
            await two.stop()
        async with manual(ChannelHub(rt, [third], gap_timeout=60)) as three:
            await three.poll()
            assert third.opened == []
            r4 = await open_one(rt)
            await three.poll()
        assert second.opened == [r2, *later] and third.opened == [r4]


_KILLED_AT_ITS_START = """
import asyncio, os, signal, sys
import signoff as so
from signoff.channels import Channel, ChannelHub
from signoff.stores._base import CHANNEL_CLAIMED

class Log(Channel):
    name = "seen"

async def main():
    async with so.Runtime([], store=sys.argv[1]) as rt:
        writes = []

        def hook(phase, label):
            if phase == "after" and label == CHANNEL_CLAIMED:
                writes.append(label)
                if len(writes) == 2:  # its take, then the write of where it starts
                    os.kill(os.getpid(), signal.SIGKILL)

        rt.store.set_fault_hook(hook)
        await ChannelHub(rt, [Log()], claim_ttl=1.0, gap_timeout=60).start(follow=False)

asyncio.run(main())
"""


async def test_a_hub_killed_as_it_saves_its_first_start_below_a_hole_leaves_it_whole(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hub (on memory) starts for the first time from now, below a hole among the last ids,
    and is SIGKILLed right after the store write that saves where it starts in its claim.
    That write saved the position below the hole before the ids present above it (which the
    start passes over) were kept beside it, so the hub taking the claim over went on from
    there with nothing to skip: it delivered the requests open before either started (a
    first hub that died before saving anything leaves none, and the next starts from now).
    Now both are one write."""
    monkeypatch.setattr(_claims, "TRY_EVERY", 0.0)
    async with gated(tmp_path, store_url) as rt:
        await erased(rt)
        before = [await open_one(rt), await open_one(rt)]
        proc = subprocess.run(
            [sys.executable, "-c", _KILLED_AT_ITS_START, store_url], timeout=60, check=False
        )
        assert proc.returncode == -signal.SIGKILL
        seen = Seen()
        async with manual(ChannelHub(rt, [seen], claim_ttl=1.0, gap_timeout=60)) as hub:
            deadline = time.monotonic() + 15
            while not hub.active:  # once the dead hub's claim lapsed
                assert time.monotonic() < deadline, "timed out"
                await hub.poll()
                await asyncio.sleep(0.05)
            assert seen.opened == []
            r1 = await open_one(rt)
            await hub.poll()
        assert seen.opened == [r1] and not set(before) & set(seen.opened)


async def test_a_renewal_keeps_only_a_claim_that_still_names_its_owner(store_url: str) -> None:
    """The store's side: a renewal (`renewing`) keeps a claim its owner holds, or held and let
    lapse with nobody taking it since, and writes its memos with it in one transaction; a claim
    another owner took, even one given back since, it neither takes back nor writes into. A
    memo that is not JSON text is refused before anything is written."""
    pg = store_url.startswith("postgres")
    ttl = 0.3
    async with so.Runtime([], store=store_url) as rt:
        await rt.open()
        s: Any = rt.store  # the Store protocol does not name the memos
        now = time.time() if pg else 1000.0

        async def later(seconds: float) -> float:
            nonlocal now
            if pg:
                await asyncio.sleep(seconds)
            now += seconds
            return now

        memo = "hub.slack:hub:delivered"
        assert await s.claim_channel("hub.slack", "a", ttl, now, renewing=True) == (
            False,
            None,
            None,
        )  # never taken: nothing to renew
        assert (await s.claim_channel("hub.slack", "a", ttl, now))[0]
        held, saved, _ = await s.claim_channel(
            "hub.slack", "a", ttl, now, after_id=5, renewing=True, memos={memo: "[7]"}
        )
        assert held and saved == 5 and await s.channel_memo(memo) == "[7]"
        with pytest.raises(so.UsageError, match="must be JSON text"):
            await s.claim_channel(
                "hub.slack", "a", ttl, now, after_id=9, renewing=True, memos={memo: "[8"}
            )
        assert await s.channel_memo(memo) == "[7]"
        held, saved, _ = await s.claim_channel(
            "hub.slack", "a", ttl, await later(ttl + 0.1), renewing=True
        )
        assert held and saved == 5  # lapsed, nobody took it: still a's
        await later(ttl + 0.1)
        held, saved, _ = await s.claim_channel("hub.slack", "b", ttl, now, after_id=6)
        assert held and saved == 6
        await s.claim_channel("hub.slack", "b", ttl, now, renewing=True, memos={memo: "[7,8]"})
        assert await s.claim_channel(
            "hub.slack", "a", ttl, now, after_id=5, renewing=True, memos={memo: "[7]"}
        ) == (False, None, None)
        await s.release_channel("hub.slack", "b", now)
        assert await s.claim_channel(
            "hub.slack", "a", ttl, now, after_id=5, renewing=True, memos={memo: None}
        ) == (False, None, None)
        assert await s.channel_memo(memo) == "[7,8]"
        held, saved, _ = await s.claim_channel("hub.slack", "c", ttl, now)
        assert held and saved == 6  # b's position, given back


async def test_a_store_class_whose_claim_channel_predates_renewing_still_runs_a_hub(
    tmp_path: Path,
) -> None:
    """A store class of an application's own, with `claim_channel` as the Store protocol had it
    before `renewing` and `memos`: the hub's renewals leave them out (as then) rather than fail
    its start with a TypeError, and it delivers."""
    from signoff.stores.sqlite import SQLiteStore
    from signoff.testing import call, call_tools, scripted_agent

    class OwnStore(SQLiteStore):
        async def claim_channel(  # type: ignore[override]
            self,
            name: str,
            owner: str,
            ttl: float,
            now: float,
            *,
            after_id: int | None = None,
            succeeds: str | None = None,
        ) -> Any:
            return await super().claim_channel(
                name, owner, ttl, now, after_id=after_id, succeeds=succeeds
            )

    @so.tool(approval=so.always())
    async def deploy(env: str) -> str:
        """Deploy."""
        return env

    agent = scripted_agent(
        "ops", [call_tools(call("deploy", env="prod"))], tools=[deploy], repeat_last=True
    )
    seen = Seen()
    own: Any = OwnStore(f"sqlite:///{tmp_path / 's.db'}")  # not the Store protocol's any more
    async with so.Runtime([agent], store=own) as rt:
        hub = ChannelHub(rt, [seen], poll_interval=0.05)
        await hub.start()
        try:
            r = await rt.generate("ops", prompt="ship it")
            for _ in range(200):
                if seen.opened:
                    break
                await asyncio.sleep(0.02)
        finally:
            await hub.stop()
    assert seen.opened == [r.pending[0].id]
