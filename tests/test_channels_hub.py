"""The channel hub (`_hub`): it follows the audit trail, remembers where each channel stopped,
waits out holes in the ids, retries and backs off from a failing channel, refuses bad options."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

import signoff as so
from signoff.channels import (
    Channel,
    ChannelHub,
    ChannelState,
    RateLimited,
    Resolution,
    TerminalChannel,
    TerminalTextChannel,
    WebhookChannel,
)
from signoff.testing import ManualClock

from ._channels import Texts, manual, runtime, three_refunds
from .test_webhooks import SECRET, Receiver


class Flaky(Channel):
    """Fails on its first `fail` deliveries, then records what it is told."""

    def __init__(self, fail: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fail = fail
        self.attempts = 0
        self.seen: list[tuple[str, str]] = []

    async def on_requested(self, request: so.InputRequest) -> None:
        self.attempts += 1
        if self.fail:
            self.fail -= 1
            raise ConnectionError("service down")
        self.seen.append(("requested", request.id))

    async def on_resolved(self, request: so.InputRequest, resolution: Resolution) -> None:
        self.seen.append((resolution.outcome, request.id))


async def test_a_failing_channel_retries_from_its_position_while_others_go_on(
    store_url: str,
) -> None:
    runs: list[str] = []
    async with so.Runtime([three_refunds(runs)], store=store_url) as rt:
        flaky, steady = Flaky(2, name="flaky"), Flaky(0, name="steady")
        async with manual(ChannelHub(rt, [flaky, steady], retry_backoff=0)) as hub:
            r = await rt.generate("support", prompt="Refund A, B and C")
            a, b, c = r.pending
            await hub.poll()
            assert flaky.seen == []
            assert steady.seen == [("requested", a.id), ("requested", b.id), ("requested", c.id)]
            assert hub.position(flaky) < hub.position(steady)
            await hub.poll()
            await hub.poll()
            assert flaky.seen == steady.seen
            await rt.respond(r.session_id, [so.InputResponse(request_id=a.id, option_id="approve")])
            await hub.poll()
            assert flaky.seen[-1] == steady.seen[-1] == ("approved", a.id)
            assert hub.position(flaky) == hub.position(steady)


async def test_a_new_hub_starts_at_the_end_and_hands_over_the_open_requests(
    tmp_path: Path,
) -> None:
    runs: list[str] = []
    async with runtime(tmp_path, three_refunds(runs)) as rt:
        r = await rt.generate("support", prompt="Refund A, B and C")
        a, b, c = r.pending
        await rt.respond(r.session_id, [so.InputResponse(request_id=a.id, option_id="approve")])

        class Opened(Flaky):
            async def start(self, open_requests: Any) -> None:
                self.seen += [("open", x.id) for x in open_requests]

        watcher = Opened(0)
        async with manual(ChannelHub(rt, [watcher])) as hub:
            assert await hub.poll() == 0  # nothing of the past is replayed
            assert watcher.seen == [("open", b.id), ("open", c.id)]


async def test_misuse_is_named(tmp_path: Path) -> None:
    async with runtime(tmp_path, three_refunds([])) as rt:
        with pytest.raises(so.UsageError, match="distinct"):
            ChannelHub(rt, [Texts(), Texts()])
        with pytest.raises(so.UsageError, match="Channel objects"):
            ChannelHub(rt, ["slack"])  # type: ignore[list-item]
        for name in ("", None):  # its name scopes what its channels keep
            with pytest.raises(so.UsageError, match="hub name"):
                ChannelHub(rt, [Texts()], name=name)  # type: ignore[arg-type]
        hub = ChannelHub(rt, [Texts()])
        with pytest.raises(so.UsageError, match="start the ChannelHub"):
            await hub.poll()
        with pytest.raises(so.UsageError, match="unmatched"):
            Texts(unmatched="shout")
        state = ChannelState()
        state.remember("c", "k", {"ts": "1.2"})
        assert state.recall("c", "k") == {"ts": "1.2"}
        state.forget("c", "k")
        assert state.recall("c", "k") is None
        state.close()
        # a state file that cannot be opened is a named error, not an OSError or sqlite3 error
        (tmp_path / "dir").write_text("a file where a directory should be")
        with pytest.raises(so.StoreError, match="channel state"):
            ChannelHub(rt, [Texts()], state=tmp_path / "dir" / "hub.db")
        (tmp_path / "junk-hub.db").write_bytes(b"not a database" * 100)
        junk = ChannelHub(rt, [Texts()], state=tmp_path / "junk-hub.db")  # opened at its start
        with pytest.raises(so.StoreError, match="channel state"):
            await junk.start()
        (tmp_path / "junk.db").write_bytes(b"not a database" * 100)
        with pytest.raises(so.StoreError, match="channel state"):
            ChannelState(tmp_path / "junk.db")


async def test_an_id_committed_late_is_not_skipped_and_a_lasting_hole_is_passed(
    store_url: str,
) -> None:
    """Audit ids are assigned before commit: on PostgreSQL a lower id can show up after a higher
    one. The hub holds its saved position at the hole until the entry appears (or times out),
    on both stores alike."""
    runs: list[str] = []
    async with so.Runtime([three_refunds(runs)], store=store_url) as rt:
        watcher = Flaky(0)
        state = ChannelState()
        async with manual(ChannelHub(rt, [watcher], state=state, gap_timeout=60)) as hub:
            r = await rt.generate("support", prompt="Refund A, B and C")
            a, b, c = r.pending
            entries = await rt.store.audit()
            (opened,) = [e.id for e in entries if e.type == "input.requested"]
            real = rt.store.audit
            hidden = {opened}

            async def late(**kwargs: Any) -> list[Any]:
                return [e for e in await real(**kwargs) if e.id not in hidden]

            rt.store.audit = late  # type: ignore[method-assign]
            await hub.poll()
            assert watcher.seen == []
            assert hub.position(watcher) == opened - 1  # held at the hole
            assert state.position("hub:channel") == opened - 1
            hidden.clear()  # the slow transaction commits
            await hub.poll()
            assert watcher.seen == [("requested", a.id), ("requested", b.id), ("requested", c.id)]
            assert hub.position(watcher) == entries[-1].id
            # a hole that never fills (a rolled-back transaction) is passed after gap_timeout
            await rt.respond(r.session_id, [so.InputResponse(request_id=a.id, option_id="approve")])
            newer = await real(after_id=entries[-1].id)
            hidden.add(newer[0].id)
            assert len(newer) > 1  # entries above the hole are visible
            await hub.poll()
            assert hub.position(watcher) == newer[0].id - 1  # held while within gap_timeout
            hub.gap_timeout = 0
            await hub.poll()
            assert hub.position(watcher) == newer[-1].id


async def test_a_hole_below_entries_already_visible_holds_the_position(store_url: str) -> None:
    """The hole that matters on PostgreSQL: a lower id not visible yet while higher ones are.
    The entries above it are delivered, the saved position stays below it, and the late entry
    is delivered once it shows up, not skipped for good; the hub reads both stores alike."""
    runs: list[str] = []
    async with so.Runtime([three_refunds(runs)], store=store_url) as rt:
        watcher = Flaky(0)
        state = ChannelState()
        async with manual(ChannelHub(rt, [watcher], state=state, gap_timeout=60)) as hub:
            r = await rt.generate("support", prompt="Refund A, B and C")
            a, b, c = r.pending
            await rt.respond(r.session_id, [so.InputResponse(request_id=a.id, option_id="approve")])
            entries = await rt.store.audit()
            (opened,) = [e.id for e in entries if e.type == "input.requested"]
            assert entries[-1].id > opened  # entries above the hole are visible
            real = rt.store.audit
            hidden = {opened}

            async def late(**kwargs: Any) -> list[Any]:
                return [e for e in await real(**kwargs) if e.id not in hidden]

            rt.store.audit = late  # type: ignore[method-assign]
            await hub.poll()
            assert watcher.seen == [("approved", a.id)]  # delivered: above the hole
            assert hub.position(watcher) == opened - 1
            assert state.position("hub:channel") == opened - 1
            hidden.clear()
            await hub.poll()
            # the late entry, as it reads now (a is closed: only b and c are open), and nothing
            # delivered twice
            assert watcher.seen == [("approved", a.id), ("requested", b.id), ("requested", c.id)]
            assert hub.position(watcher) == entries[-1].id


async def until(check: Any, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_a_running_hub_follows_the_trail_by_itself(store_url: str) -> None:
    runs: list[str] = []
    async with so.Runtime([three_refunds(runs)], store=store_url) as rt:
        sms = Texts()
        async with ChannelHub(rt, [sms], poll_interval=0.05):
            r = await rt.generate("support", prompt="Refund A, B and C")
            a, b, _ = r.pending
            await until(lambda: sms.sent == [sms.render(a)])
            await rt.respond(r.session_id, [so.InputResponse(request_id=a.id, option_id="approve")])
            await until(lambda: sms.sent[-1] == sms.render(b))
            assert sms.sent[-2].startswith("issue_refund was approved by the policy")


async def test_a_channel_that_cannot_start_does_not_stop_the_others(tmp_path: Path) -> None:
    class Down(Flaky):
        async def start(self, open_requests: Any) -> None:
            raise ConnectionError("service down")

    runs: list[str] = []
    async with runtime(tmp_path, three_refunds(runs)) as rt:
        r = await rt.generate("support", prompt="Refund A, B and C")
        down, sms = Down(0, name="down"), Texts()
        async with manual(ChannelHub(rt, [down, sms])) as hub:
            assert sms.sent == [sms.render(r.pending[0])]
            await rt.respond(
                r.session_id, [so.InputResponse(request_id=r.pending[0].id, option_id="approve")]
            )
            await hub.poll()
            assert down.seen == [("approved", r.pending[0].id)]


async def test_a_failing_channel_backs_off_and_gives_up_after_max_attempts(
    tmp_path: Path,
) -> None:
    runs: list[str] = []
    async with runtime(tmp_path, three_refunds(runs)) as rt:
        broken = Flaky(100)
        async with manual(ChannelHub(rt, [broken], retry_backoff=3600)) as hub:
            await rt.generate("support", prompt="Refund A, B and C")
            await hub.poll()
            await hub.poll()  # within its backoff: not tried again
            assert broken.attempts == 1
        broken = Flaky(100)
        # Another name: a hub of the first's would go on from where it stopped (its claim).
        again = ChannelHub(rt, [broken], retry_backoff=0, max_attempts=3, name="again")
        async with manual(again) as hub:
            start = hub.position(broken)
            r = await rt.generate("support", prompt="Refund A, B and C again")
            for _ in range(5):
                await hub.poll()
            assert broken.attempts == 3  # then the entry is skipped for this channel
            assert hub.position(broken) > start
            await rt.respond(
                r.session_id, [so.InputResponse(request_id=r.pending[0].id, option_id="approve")]
            )
            await hub.poll()
            assert broken.seen == [("approved", r.pending[0].id)]


async def test_a_channel_retried_without_backoff_past_1024_failures_holds_up_no_other(
    tmp_path: Path,
) -> None:
    """`retry_backoff=0.0` with many attempts retries at every poll: past the 1024th failure the
    doubled backoff is larger than a float. That must stay a retry, not an OverflowError out
    of every poll, which held up the other channels (and this one) for good."""
    runs: list[str] = []
    async with runtime(tmp_path, three_refunds(runs)) as rt:
        flaky, steady = Flaky(1030, name="flaky"), Flaky(0, name="steady")
        hub = ChannelHub(rt, [flaky, steady], retry_backoff=0.0, max_attempts=2000)
        async with manual(hub):
            r = await rt.generate("support", prompt="Refund A, B and C")
            a, b, c = r.pending
            while flaky.fail:
                await hub.poll()
            await hub.poll()
            opened = [("requested", a.id), ("requested", b.id), ("requested", c.id)]
            assert flaky.seen == steady.seen == opened
            await rt.respond(r.session_id, [so.InputResponse(request_id=a.id, option_id="approve")])
            await hub.poll()
            assert flaky.seen == steady.seen == [*opened, ("approved", a.id)]


class Throttled(Flaky):
    """A `Flaky` whose service, for its next `limit` resolutions, asks to be called later."""

    def __init__(self, limit: int, **kwargs: Any) -> None:
        super().__init__(0, **kwargs)
        self.limit = limit

    async def on_resolved(self, request: so.InputRequest, resolution: Resolution) -> None:
        if self.limit:
            self.limit -= 1
            raise RateLimited("slow down", 0.0)
        await super().on_resolved(request, resolution)


async def test_an_entry_given_up_on_and_rate_limited_when_redelivered_is_sent_in_that_run(
    tmp_path: Path, store_url: str
) -> None:
    """The entries a hub gave up on are delivered again at its next start; a rate limit then
    (many at once can hit one) waits for the service's Retry-After, as on the feed, rather
    than leaving them for the start after, and the entries after them wait behind them."""
    runs: list[str] = []
    state = tmp_path / "hub.db"
    async with so.Runtime([three_refunds(runs)], store=store_url) as rt:
        r = await rt.generate("support", prompt="Refund A, B and C")
        a, b, _ = r.pending
        broken = Flaky(0)
        async with manual(ChannelHub(rt, [broken], state=state, max_attempts=1)) as hub:
            await hub.poll()

            async def fail(request: so.InputRequest, resolution: Resolution) -> None:
                raise ConnectionError("service down")

            broken.on_resolved = fail  # type: ignore[method-assign]
            await rt.respond(r.session_id, [so.InputResponse(request_id=a.id, option_id="approve")])
            await hub.poll()  # given up on: kept for the next start
        await rt.respond(r.session_id, [so.InputResponse(request_id=b.id, option_id="approve")])
        throttled = Throttled(1)
        async with manual(ChannelHub(rt, [throttled], state=state)) as hub:
            assert throttled.seen == []  # rate limited at start
            await hub.poll()
            assert throttled.seen == [("approved", a.id), ("approved", b.id)]
        again = Flaky(0)
        async with manual(ChannelHub(rt, [again], state=state)) as hub:
            await hub.poll()
        assert again.seen == []  # nothing twice


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"poll_interval": float("nan")}, "poll_interval must be positive"),
        ({"retry_backoff": float("nan")}, "retry_backoff and gap_timeout"),
        ({"gap_timeout": float("nan")}, "retry_backoff and gap_timeout"),
        ({"gap_timeout": float("inf")}, "retry_backoff and gap_timeout"),
        ({"retry_backoff": -1}, "retry_backoff and gap_timeout"),
    ],
)
def test_a_hub_refuses_seconds_that_are_not_finite(
    tmp_path: Path, setting: dict[str, Any], message: str
) -> None:
    """NaN passed the hub's `<= 0` / `< 0` checks, and its loops then slept or waited NaN."""
    rt = so.Runtime([], store=f"sqlite:///{tmp_path}/s.db")
    with pytest.raises(so.UsageError, match=message):
        ChannelHub(rt, [], **setting)


def test_a_hub_refuses_a_runtime_channels_or_state_of_the_wrong_kind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each was a raw AttributeError or TypeError, and a number for `state` made files named
    after it in the working directory."""
    monkeypatch.chdir(tmp_path)
    rt = so.Runtime([], store=f"sqlite:///{tmp_path}/s.db")
    texts = Texts()
    with pytest.raises(so.UsageError, match="takes a so.Runtime, not None"):
        ChannelHub(None, [])  # type: ignore[arg-type]
    with pytest.raises(so.UsageError, match="takes a list of channels"):
        ChannelHub(rt, texts)  # type: ignore[arg-type]
    with pytest.raises(so.UsageError, match="takes a list of channels, not None"):
        ChannelHub(rt, None)  # type: ignore[arg-type]
    with pytest.raises(so.UsageError, match="state must be a ChannelState or a file path"):
        ChannelHub(rt, [], state=42)  # type: ignore[arg-type]
    with pytest.raises(so.UsageError, match="holds a NUL"):
        ChannelHub(rt, [], state=f"{tmp_path}/hub\x00.db")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("attempts", [0, 2.5, float("nan"), True, "3"])
def test_a_hub_refuses_max_attempts_that_is_not_a_whole_number_from_1(
    tmp_path: Path, attempts: Any
) -> None:
    """NaN passed the hub's `< 1` check (no delivery was ever given up on), 2.5 and True were
    taken as counts, and "3" raised a bare TypeError."""
    rt = so.Runtime([], store=f"sqlite:///{tmp_path}/s.db")
    with pytest.raises(so.UsageError, match=r"^max_attempts must be a whole number from 1, not "):
        ChannelHub(rt, [], max_attempts=attempts)


@pytest.mark.parametrize("busy_timeout", [float("nan"), float("inf"), -1, "5", True])
def test_channel_state_refuses_a_busy_timeout_that_is_not_seconds(busy_timeout: Any) -> None:
    with pytest.raises(so.UsageError, match="busy_timeout must be seconds from 0"):
        ChannelState(":memory:", busy_timeout=busy_timeout)


def test_channel_options_of_the_wrong_kind_are_refused_when_made() -> None:
    """Each was taken, and failed (or answered as nobody) only when the first request came."""
    with pytest.raises(so.UsageError, match="accepts must be a function of the request"):
        Texts(accepts="support")
    with pytest.raises(so.UsageError, match="principal must be a so.Principal or None"):
        TerminalTextChannel(principal="bob")  # type: ignore[arg-type]
    with pytest.raises(so.UsageError, match="terminal must be a TerminalChannel or None"):
        TerminalTextChannel(terminal=Console())  # type: ignore[arg-type]
    with pytest.raises(so.UsageError, match="read must be a function"):
        TerminalChannel(read="y")  # type: ignore[arg-type]
    with pytest.raises(so.UsageError, match="clock must be a function"):
        TerminalChannel(clock=5.0)  # type: ignore[arg-type]
    with pytest.raises(so.UsageError, match="console must be a rich Console or None"):
        TerminalChannel(console=io.StringIO())  # type: ignore[arg-type]


async def _billing_only(request: so.InputRequest) -> bool:
    return request.agent == "billing"


class _AsyncAccepts:
    async def __call__(self, request: so.InputRequest) -> bool:
        return False


@pytest.mark.parametrize("accepts", [_billing_only, _AsyncAccepts()], ids=["function", "object"])
def test_an_async_accepts_is_refused_when_the_channel_is_made(accepts: Any) -> None:
    """`accepts` is asked without awaiting: an async one's coroutine was taken for True, so a
    channel meant for some requests showed, and took replies to, every one."""
    with pytest.raises(so.UsageError, match="accepts must be a plain function .* an async one"):
        Texts(accepts=accepts)


async def test_an_accepts_that_returns_an_awaitable_shows_no_request(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A plain predicate calling an async one (`lambda r: check(r)`), which no check at
    construction can tell, returned a coroutine: the channel showed every request. It is no
    answer now: no request is shown, and the log says why, once."""
    sms = Texts(accepts=lambda request: _billing_only(request))
    async with runtime(tmp_path, three_refunds([])) as rt:
        await rt.generate("support", prompt="Refund A, B and C")
        async with manual(ChannelHub(rt, [sms])) as hub:
            await hub.poll()
    assert sms.sent == []
    assert caplog.text.count("accepts returned <coroutine object") == 1


async def test_a_hub_ticks_its_channels_by_its_runtimes_time(store_url: str) -> None:
    """A hub given no clock tells its channels the runtime's time (`Runtime.now`, the
    database's on PostgreSQL), which the request deadlines it warns of were set by."""
    seen: list[float] = []

    class Ticking(Channel):
        async def tick(self, now: float) -> None:
            seen.append(now)

    clock = ManualClock()
    async with so.Runtime([], store=store_url, clock=clock) as rt:
        async with manual(ChannelHub(rt, [Ticking(name="ticking")])) as hub:
            await hub.poll()
            clock.advance(30)
            await hub.poll()
    assert seen == [clock.now - 30, clock.now]


async def test_a_position_past_the_end_of_the_trail_is_brought_back_to_it(tmp_path: Path) -> None:
    """A store restored from a backup (or whose last unsynced commits a power cut lost) ends
    below the position the state file kept: new entries take the ids again, and the hub skipped
    them as handled, so a request opened then was never shown. At start the position is brought
    back to the trail's end, and nothing of the restored trail is delivered again."""
    state = tmp_path / "hub.db"
    async with runtime(tmp_path, three_refunds([])) as rt:
        async with manual(ChannelHub(rt, [Flaky(0)], state=state)) as hub:
            for _ in range(3):
                await rt.generate("support", prompt="Refund A, B and C")
            await hub.poll()
            kept = hub.position("channel")
    restored = so.Runtime([three_refunds([])], store=f"sqlite:///{tmp_path / 'backup.db'}")
    async with restored as rt:
        await rt.generate("support", prompt="Refund A, B and C")  # in the backup
        end = (await rt.store.audit())[-1].id
        assert end < kept
        watcher = Flaky(0)
        async with manual(ChannelHub(rt, [watcher], state=state)) as hub:
            assert hub.position(watcher) == end
            r = await rt.generate("support", prompt="Refund A, B and C")
            await hub.poll()
            assert watcher.seen == [("requested", p.id) for p in r.pending]


async def test_a_hub_that_fails_to_start_lets_go_of_its_channels(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store failing while a hub starts (finding the trail's end) fails the start, and
    leaves the hub as it was: its channels' locks are let go, so another hub on the file
    delivers to them, and the same hub can be started again once the store is back."""
    runs: list[str] = []
    async with so.Runtime([three_refunds(runs)], store=store_url) as rt:
        state = tmp_path / "channels.db"
        hub = ChannelHub(rt, [Texts()], state=state)
        reads = rt.store.audit
        down = True

        async def audit(**kwargs: Any) -> Any:
            if down:
                raise so.StoreUnavailable("the database refuses connections")
            return await reads(**kwargs)

        monkeypatch.setattr(rt.store, "audit", audit)
        with pytest.raises(so.StoreUnavailable):
            await hub.start(follow=False)
        down = False
        async with manual(ChannelHub(rt, [Texts()], state=state)) as other:
            assert other.active  # not standing by for a hub that is not running
        async with manual(hub):
            assert hub.active
            r = await rt.generate("support", prompt="Refund A, B and C")
            await hub.poll()
            (sms,) = hub.channels
            assert isinstance(sms, Texts) and sms.sent == [sms.render(r.pending[0])]


async def test_a_standby_that_fails_to_take_over_leaves_no_channel_delivering(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A standby taking over starts the channel (a webhook channel sends what the hub before
    kept unsent); the store failing right after makes it let go of the lock again. The channel
    it started must not go on sending then: the hub that takes the lock next sends the same
    unsent delivery, and the receiver would get it twice, from two hubs at once."""
    runs: list[str] = []
    down = False

    class Slow(Receiver):
        async def handle(self, request: Any) -> Any:
            await asyncio.sleep(0.5)  # the first hub's delivery is still in flight
            return await super().handle(request)

    class Starting(WebhookChannel):
        async def start(self, open_requests: Any) -> None:
            await super().start(open_requests)
            nonlocal down
            down = True  # the store fails as soon as the channel has started

    async with so.Runtime([three_refunds(runs)], store=store_url) as rt, Slow([503]) as receiver:
        reads = rt.store.audit

        async def audit(**kwargs: Any) -> Any:
            if down:
                raise so.StoreUnavailable("the database refuses connections")
            return await reads(**kwargs)

        monkeypatch.setattr(rt.store, "audit", audit)
        state = tmp_path / "channels.db"
        hooks = WebhookChannel(receiver.url, SECRET, max_attempts=1)
        standby = ChannelHub(rt, [Starting(receiver.url, SECRET)], state=state)
        async with manual(ChannelHub(rt, [hooks], state=state)) as first:
            await standby.start(follow=False)
            assert not standby.active
            await rt.generate("support", prompt="Refund A, B and C")
            await first.poll()
            await hooks.drain()  # a 503: given up on, kept for the next hub to send
        # an entry given up on, no longer in the trail: reading it is what fails
        standby.state.remember("hub:webhooks", "skipped", [10**9])
        with pytest.raises(so.StoreUnavailable):
            await standby.poll()
        down = False
        async with manual(ChannelHub(rt, [WebhookChannel(receiver.url, SECRET)], state=state)):
            pass  # the next hub to take the lock sends what is still unsent
        await standby.stop()
        sent = [headers["Signoff-Delivery"] for headers, _ in receiver.accepted]
        assert len(sent) == 3 and len(set(sent)) == 3  # the three openings, each once
        assert len(receiver.attempts) == 4  # and the 503


async def _async_clock() -> float:
    return 1_700_000_000.0


@pytest.mark.parametrize(
    ("clock", "why"),
    [
        (_async_clock, "must be a plain function returning the time, not .* an async one"),
        (ManualClock, r"is the class ManualClock: pass a clock, such as ManualClock\(\)"),
        (1_700_000_000.0, "must be a function returning the time"),
        (lambda skew: 1_700_000_000.0 + skew, "must be a function of no arguments"),
    ],
    ids=["async", "class", "number", "arguments"],
)
def test_a_clock_that_is_no_clock_is_refused_when_the_channel_is_made(
    tmp_path: Path, clock: Any, why: str
) -> None:
    """Channels and their hub read their clock without awaiting it, as `Runtime` does, which
    refuses these: an async clock's coroutine, or a `ManualClock` instance made of each call,
    was taken for the time, a TypeError where it was used (a hub's tick, a webhook delivery's
    signature, the time a terminal request has left), and a number was not refused at all."""
    rt = runtime(tmp_path)
    makers = {
        "ChannelHub": lambda: ChannelHub(rt, [], clock=clock),
        "WebhookChannel": lambda: WebhookChannel("https://example.com/h", SECRET, clock=clock),
        "TerminalChannel": lambda: TerminalChannel(clock=clock),
    }
    for name, make in makers.items():
        with pytest.raises(so.UsageError, match=f"{name}: clock {why}"):
            make()


def test_a_terminal_read_that_is_async_or_gives_no_text_is_named() -> None:
    """`read` is called in a thread, without awaiting: an async one's coroutine was taken for
    the line, an AttributeError ('coroutine' object has no attribute 'strip') that named neither
    `read` nor the fix; bytes were no answer ever ("y" is text), and a number the same error."""

    async def typed(prompt: str) -> str:
        return "y"

    with pytest.raises(so.UsageError, match="read must be a plain function .* an async one"):
        TerminalChannel(read=typed)  # type: ignore[arg-type]
    for given in (b"y", 1):
        terminal = TerminalChannel(read=lambda prompt, given=given: given)  # type: ignore[misc]
        with pytest.raises(so.UsageError, match=r"read returned .*, not a line of text \(str\)"):
            terminal.read("? ")
    assert TerminalChannel(read=lambda prompt: " y ").read("? ") == "y"


async def test_a_channel_whose_hook_is_a_plain_method_is_refused_by_the_hub(
    tmp_path: Path,
) -> None:
    """The hub awaits a channel's hooks: a plain `on_requested` ran (posting the request), and
    awaiting its None was a TypeError, so the hub delivered the entry again and again, each
    attempt posting it once more, and again at every later poll and start after giving up."""
    posted: list[str] = []

    class Chat(Channel):
        name = "chat"

        def on_requested(self, request: so.InputRequest) -> None:  # type: ignore[override]
            posted.append(request.id)

    with pytest.raises(
        so.UsageError, match=r"channel 'chat': Chat.on_requested must be an async def"
    ):
        ChannelHub(runtime(tmp_path), [Chat()])
    assert posted == []
