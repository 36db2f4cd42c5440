"""`ChannelHub`: follows the audit trail (across processes) and tells channels what happened.

Each channel keeps its own position in `ChannelState`, so a restart continues where it stopped
instead of posting everything again, and a channel whose service is down retries the entries it
missed while the others go on. Without a saved position a channel starts at the end of the trail
(waiting, as for any hole, on a lower id still committing then).
A subagent's request is shown once, as the child's own request (with its deadline): its mirror
on the parent session is skipped, and answering the child's request also closes the mirror.
An escalated request is shown by the channels that take it as it now stands: one whose `accepts`
takes it only once escalated (the group's) is told it opened, one that took it only before (the
first line's) is still told of the escalation, of updates and of its close.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .._exceptions import StoreError, UsageError
from .._recording import own_cancel
from .._settings import positive_seconds, whole
from .._sync import checked_clock
from .._types import InputRequest
from .._work_waits import Failing
from ..stores._audit import AuditEntry
from . import _given_up as given_up
from ._announcements import Damaged, announce, passed
from ._base import (
    Channel,
    ChannelState,
    RateLimited,
    check_name,
    logger,
    off_loop,
    plain_hooks,
)
from ._claims import Claims
from ._given_up import note_given_up, redeliver
from ._hub_holes import Holes, advanced
from ._hub_standby import Standby
from ._hub_stop import cut_channels, finish_poll
from ._hub_trail import behind_the_end, open_requests, start_at
from ._lease import HubLease
from ._retries import Retries
from ._state import make_room
from ._stray_cancels import stray_cancels

if TYPE_CHECKING:
    from .._runtime import Runtime

__all__ = ["ChannelHub"]

_PAGE = 500
# The memo (under the hub's key for a channel) of the entries it delivered above its position
# (past a hole); those it gave up on are `_given_up`'s.
_DELIVERED = "delivered"


class ChannelHub(Standby):
    """Dispatches request openings, updates, escalations and resolutions to channels, in commit
    order.

    `state` is a `ChannelState` or the path of its SQLite file (memory by default, None:
    positions are then lost on restart, so it starts at the end; an empty path is a
    `UsageError`, not memory); a hub made inside a running event loop opens
    its file when it starts, in a worker thread. On a file, one hub at a time delivers to a
    channel (by hub `name` and channel name): it holds an OS lock next to the file while it
    runs, and another started on the same file (in this or another process on the machine)
    stands by for that channel, which still answers (e.g. Slack's clicks), and takes over at its
    next poll when the first stops or dies (skipping what the first delivered past a hole).
    Across states (in memory, other files, other machines) hubs sharing the runtime's store
    exclude each other by a claim in it (`_claims`): the delivering hub renews it at its polls
    with the position it reached, and in the background between them (while it follows) and
    while a poll takes longer; a standby takes it once it is given back (within two seconds)
    or lapses `claim_ttl` seconds after its hub died or stalled, and goes on from that
    position, skipping the entries the hub before delivered above it (past a hole), which it
    keeps beside the claim. A
    channel's positions and memos (Slack's messages, webhooks not yet sent) are the hub's own
    too: hubs of different names keep theirs apart on one file, also for channels of the same
    name. Hub and channel names must not contain `:`
    or `.`, which join them there.

    A channel that fails on an entry is retried from there after `retry_backoff * 2**n`
    seconds, `max_attempts` times in all (about two minutes by default), before the entry is
    skipped for it: that is logged as an error, and the entry is delivered to it again every
    minute while the hub runs (see `_given_up`) and when the hub next starts on the same
    `state`. Of an entry opening several requests, a retry tells none told already, and each
    delivery of it once given up on tells the others past the one the channel fails on, so one
    it never takes holds none back.
    A channel that raises `RateLimited` is retried after the delay it names (at most an hour),
    without spending an attempt, so a service that throttles is never given up on (nor are the
    entries delivered again at a start: the polls after the delay go on with them).
    What the store holds damaged (a request of an entry that is none, a request row it cannot
    read: `_announcements.Damaged`) is passed once the rest of its entry is told, logged once by
    each channel: it reads the same every time, so retrying it held every later entry back for
    `max_attempts` and then failed on it every minute. Any other `StoreError` (down, busy, a
    query cancelled) is retried as a channel's failure is.
    Deadlines (`request.expiring` warnings, expired sessions) are judged by `clock`, the
    runtime's (`Runtime.now`) unless given.
    """

    def __init__(
        self,
        runtime: Runtime,
        channels: Sequence[Channel],
        *,
        state: ChannelState | str | Path | None = None,
        name: str = "hub",
        poll_interval: float = 0.5,
        max_attempts: int = 8,
        retry_backoff: float = 1.0,
        gap_timeout: float = 10.0,
        clock: Callable[[], float] | None = None,
        claim_ttl: float = 30.0,
    ) -> None:
        if not hasattr(runtime, "now") or not hasattr(runtime, "store"):
            # Else an AttributeError deep in the constructor (None) or at the first tick.
            raise UsageError(f"a ChannelHub takes a so.Runtime, not {runtime!r}")
        if isinstance(channels, Channel) or not isinstance(channels, Iterable):
            raise UsageError(f"a ChannelHub takes a list of channels, not {channels!r}")
        if not (state is None or isinstance(state, ChannelState | str | os.PathLike)):
            # A number was taken for a file name, made in the working directory.
            raise UsageError(f"state must be a ChannelState or a file path, not {state!r}")
        if isinstance(state, str | os.PathLike) and "\x00" in os.fspath(state):
            raise UsageError(f"the state file's path holds a NUL: {state!r}")
        if isinstance(state, str | os.PathLike) and os.fspath(state) == "":
            # as `"$UNSET"` leaves it: it was kept in memory, and lost on restart
            raise UsageError("state must name a file, or be None for memory, not ''")
        channels = list(channels)
        for ch in channels:
            if not isinstance(ch, Channel):
                raise UsageError(f"a ChannelHub takes Channel objects, not {ch!r}")
            check_name("a channel", ch.name)  # a subclass may name itself on the class
            plain_hooks(ch)
        names = [ch.name for ch in channels]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise UsageError(f"channel names must be distinct: {', '.join(dupes)}")
        check_name("a hub", name)
        if clock is not None:  # else each tick failed, and no deadline was warned of
            checked_clock(clock, "ChannelHub: clock")
        if not positive_seconds(poll_interval):  # NaN passed `<= 0`, and a loop slept NaN
            raise UsageError(f"poll_interval must be positive, not {poll_interval!r}")
        whole("max_attempts", max_attempts, least=1)  # NaN or 2.5 passed `< 1`
        if not positive_seconds(claim_ttl):
            raise UsageError(f"claim_ttl must be positive, finite seconds, not {claim_ttl!r}")
        if not all(
            positive_seconds(v) or (v == 0 and not isinstance(v, bool))
            for v in (retry_backoff, gap_timeout)
        ):
            raise UsageError(
                "retry_backoff and gap_timeout must not be negative (finite seconds), not "
                f"{retry_backoff!r} and {gap_timeout!r}"
            )
        self.runtime = runtime
        self.channels = channels
        self._own_state = not isinstance(state, ChannelState)
        self._state = state if isinstance(state, ChannelState) else None
        if isinstance(state, ChannelState):
            self._path = state.path
        else:
            self._path = ":memory:" if state is None else str(state)
        if self._state is None and (self._path == ":memory:" or not _in_event_loop()):
            self._state = ChannelState(self._path)
        elif self._state is None:
            make_room(self._path)  # a path that cannot hold the file is refused here still
        self.name = name
        self.poll_interval = poll_interval
        self.max_attempts = max_attempts
        self.retry_backoff = retry_backoff
        self.gap_timeout = gap_timeout
        # The runtime's by default: on PostgreSQL the database's, which deadlines are set by.
        self.clock = runtime.now if clock is None else clock
        self._leases = {
            ch.name: HubLease(self._path, f"{name}.{ch.name}")
            for ch in channels
            if self._path != ":memory:"
        }
        self._active: set[str] = set()  # the channels this hub delivers to (holding their locks)
        self._claims = Claims(runtime, name, claim_ttl)
        self._renewals = Failing(f"channel hub {name}: renewing its claims", logger)
        self._unclaimed: set[str] = set()  # channels locked here whose claim another hub holds
        self._positions: dict[str, int] = {}
        self._retries = Retries()
        # monotonic time of the last give-up or round, for each channel with entries given up on
        self._given_up_at: dict[str, float] = {}
        self._seen: dict[str, set[int]] = {}
        self._kept: dict[str, list[int]] = {}  # `_seen` as saved in the state
        self._shared: dict[str, list[int]] = {}  # ... and beside the claim in the store
        self._holes = Holes()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._cut = asyncio.Event()  # set by a forced stop (`cut_short`) until the next start
        self._started = False

    @property
    def state(self) -> ChannelState:
        """Where the channels' positions and memos are kept. A hub made inside a running event
        loop opens its file when it starts; asked for before, it is opened here and now."""
        if self._state is None:
            self._state = ChannelState(self._path)
        return self._state

    @property
    def routers(self) -> list[Any]:
        """The channels' HTTP routers, for `signoff.server.create_app(..., channels=hub)`."""
        return [r for ch in self.channels for r in ch.routers]

    @property
    def active(self) -> bool:
        """Whether this hub delivers to all its channels now (none stands by for another hub)."""
        return len(self._active) == len(self.channels)

    def position(self, channel: Channel | str) -> int:
        """The last audit entry id a channel has handled; a `UsageError` for one this hub has
        not delivered to (not started, standing by for another hub, or not its channel)."""
        name = channel if isinstance(channel, str) else channel.name
        if name not in self._positions:
            raise UsageError(
                f"channel {name!r} has no position in hub {self.name!r}: it is not one of its "
                "channels, or the hub has not delivered to it (not started, or standing by)"
            )
        return self._positions[name]

    def _key(self, channel: Channel) -> str:
        return f"{self.name}:{channel.name}"

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self, *, follow: bool = True) -> None:
        """Deliver to the channels whose lock is free (standing by for the others), then (with
        `follow`) poll; see `_activate`. A start that fails (the store down) stops the hub
        again, locks let go, so it can be started once more."""
        if self._started:
            raise UsageError("this ChannelHub is already started")
        await self.runtime.open()
        if self._state is None or (self._state.closed and self._own_state):
            # In a worker thread: another process may hold the file's lock (or be setting it up).
            self._state = await off_loop(ChannelState, self._path)
        for ch in self.channels:  # a standby's channels answer too (e.g. Slack's clicks)
            ch.bind(self.runtime, self._state, hub=self.name)
        self._started = True
        self._cut = asyncio.Event()
        try:
            # The hubs on this file by this path (only those) succeed each other's claims at once.
            self._claims.bind(await off_loop(self.state.identity), self._path)
            free = await self._free()
            async with self._keeping():  # a channel's start may take long (many open requests)
                await self._activate(free)
        except BaseException:  # e.g. the store is down: no lock held, no channel left running
            await self.stop()
            raise
        if len(free) < len(self.channels):
            logger.warning(
                "channel hub %s: another hub delivers to %s (holding its lock next to %s, or "
                "its claim in the store); this one stands by and takes over when it stops",
                self.name,
                ", ".join(ch.name for ch in self.channels if ch.name not in self._active),
                self.state.path,
            )
        if follow:
            self._stopping = False
            self._task = asyncio.create_task(self._follow(), name=f"signoff-hub-{self.name}")

    async def _activate(self, channels: list[Channel]) -> None:
        """Start delivering to `channels`, whose locks this hub holds: load their positions, hand
        them the open requests and deliver what an earlier run gave up on."""
        start: tuple[int, set[int]] | None = None
        for ch in channels:
            saved = await off_loop(self.state.position, self._key(ch))
            shared = self._claims.saved.pop(ch.name, None)
            # What the hubs before (on any state) delivered, or passed over at a first start,
            # past the position they saved: not delivered again.
            past = await self._claims.delivered(ch.name)
            self._shared[ch.name] = past
            if shared is not None and (saved is None or shared > saved):
                # Where a hub on another state stopped: what it delivered is not delivered again.
                saved = shared
                await off_loop(self.state.set_position, self._key(ch), saved)
            if saved is None:
                if start is None:
                    start = await start_at(self.runtime.store, _PAGE)
                saved, present = start
                self._seen[ch.name] = set(present)  # there before the start: not delivered
                await off_loop(self.state.set_position, self._key(ch), saved)
            elif saved > 0 and not await self.runtime.store.audit(after_id=saved - 1, limit=1):
                saved = await behind_the_end(self.runtime.store, self.state, self._key(ch), saved)
                self._seen[ch.name] = set()  # the ids are taken again
                past = []
            else:  # what the hub before on this state delivered past a hole
                kept = await off_loop(self.state.recall, self._key(ch), _DELIVERED)
                self._kept[ch.name] = kept if isinstance(kept, list) else []
                self._seen[ch.name] = {i for i in self._kept[ch.name] if _whole(i) and i > saved}
            self._seen[ch.name].update(i for i in past if i > saved)
            self._positions[ch.name] = saved
            # The position this hub goes on from (a first start's, which a hub taking over
            # would otherwise go back from) with the ids past it, in one write.
            await self._keep_seen(ch, moved=True)
        self._active.update(ch.name for ch in channels)
        if channels:
            open_requests = await self._open_requests()
            for ch in channels:
                if not self._claims.live(ch.name):  # lapsed while another channel started
                    # Not left active unstarted: a later poll takes it over and starts it.
                    logger.warning(
                        "channel hub %s: its claim on %s lapsed while another channel started; "
                        "standing by to take it over",
                        self.name,
                        ch.name,
                    )
                    await self._stand_by(ch)
                    continue
                try:
                    with stray_cancels(ch.name, "start"):
                        await ch.start([r for r in open_requests if ch.accepts(r)])
                except Exception:  # a service that is down must not keep the server from starting
                    logger.exception("channel %s failed to start", ch.name)
                await self._redeliver(ch)

    async def stop(self) -> None:
        """Stop following and close the channels (and the state file, if the hub opened it).

        A state the hub keeps in memory stays open: closing would lose its positions and memos,
        and a restart of this hub would post the open requests again and miss what closed."""
        if not self._started:
            return
        task, self._task = self._task, None
        if task is not None:
            # The flag as well as the cancel: Python 3.11's asyncio.wait_for (inside
            # psycopg_pool) can swallow a cancellation, and the loop must end all the same.
            self._stopping = True
            await finish_poll(self._lock, self._cut, self.name)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for ch in self.channels:
            try:
                with stray_cancels(ch.name, "close"):
                    await ch.close()
            except Exception:
                logger.exception("channel %s failed to close", ch.name)
        for ch in self.channels:  # with the positions reached, for a hub on another state
            try:
                await self._claims.release(ch.name, self._positions.get(ch.name))
            except Exception:  # the store down: it lapses
                logger.warning(
                    "channel hub %s: giving back its claim on %s failed",
                    self.name,
                    ch.name,
                    exc_info=True,
                )
        for lease in self._leases.values():
            lease.release()  # after the channels' last writes: a standby goes on from them
        self._active.clear()
        self._unclaimed.clear()
        if self._own_state and self._path != ":memory:":
            await off_loop(self.state.close)
        self._started = False

    def cut_short(self) -> list[asyncio.Task[Any]]:
        """A forced stop (`serve`'s second signal): `stop` does not wait for a poll in progress
        (`finish_poll`), and each channel cancels the work it runs in the background
        (`Channel.cut_short`); the tasks still running, to be given a moment to end."""
        self._cut.set()
        return cut_channels(self.channels)

    async def __aenter__(self) -> ChannelHub:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _follow(self) -> None:
        store = self.runtime.store
        # PostgreSQL wakes us with LISTEN/NOTIFY; elsewhere reading the trail's tail is cheaper
        # than asking whether anything changed.
        wait = (
            None if str(store.url).startswith("sqlite") else getattr(store, "wait_for_change", None)
        )
        failing = Failing(f"channel hub {self.name}: reading the audit trail", logger)
        while not self._stopping:
            try:
                handled = await self.poll()
                failing.worked()
            except StoreError as exc:  # an outage: logged once, not at every poll
                failing.failed(exc, self.poll_interval)
                handled = 0
            except Exception:
                logger.exception("channel hub %s: reading the audit trail failed", self.name)
                handled = 0
            except asyncio.CancelledError as exc:
                # Only a cancel of this task (a stop) ends it: one of something the poll
                # awaited ended it silently, for every channel, the hub still seeming started.
                if self._stopping or not own_cancel(exc):
                    raise
                logger.exception("channel hub %s: a poll was cancelled from within", self.name)
                handled = 0
            if not handled:
                await self._pause(self.poll_interval, wait)

    # -- the feed -----------------------------------------------------------------------------

    async def poll(self) -> int:
        """Dispatch every entry past the channels' positions now; returns how many were new.
        The claims are renewed while it runs (`_keeping`), however long that is."""
        if not self._started:
            raise UsageError("start the ChannelHub first (await hub.start() or `async with`)")
        async with self._lock:
            if len(self._active) < len(self.channels):
                await self._take_over()
            live = await self._renew([ch for ch in self.channels if ch.name in self._active])
            async with self._keeping():
                total = await self._deliver(live) if live else 0
                live = await self._renew(live)  # the positions reached, for a hub taking over
                now = self.clock()
                for ch in live:
                    try:
                        with stray_cancels(ch.name, "tick"):
                            await ch.tick(now)
                    except Exception:
                        logger.exception("channel %s failed on tick", ch.name)
            return total

    async def _deliver(self, live: list[Channel]) -> int:
        """Dispatch the entries past the positions of the `live` channels, page by page, and
        move the positions on; how many were new. A channel whose claim is not live any more
        (another hub took it, or it was not renewed in time) is given nothing more. Read from
        the lowest position of those not held back (for a retry): from a held one's, each poll
        read all written since it stopped. It reads from its own once its hold ends."""
        total = 0
        for ch in live:  # the entries given up on before, which a rate limit held back
            if not self._claims.live(ch.name):
                continue
            if self._retries.redo_due(ch.name):
                await self._redeliver(ch)
            elif self._redo_due(ch):  # ... or which failed: the service may be back
                await self._redeliver(ch, until_failure=True)
        # Channels that failed and wait for their retry: they go on from there later;
        # those another hub delivers to are never told anything here.
        blocked = self._retries.blocked()
        blocked.update(ch.name for ch in self.channels if ch.name not in self._active)
        reading = [ch for ch in live if ch.name not in blocked]
        if not reading:
            return total
        cursor = start = min(self._positions[ch.name] for ch in reading)
        top = cursor
        present: set[int] = set()
        while True:
            entries = await self.runtime.store.audit(after_id=cursor, limit=_PAGE)
            for entry in entries:
                present.add(entry.id)
                total += await self._dispatch(entry, blocked)
                await asyncio.sleep(0)  # the claims' keeper runs even if no channel waits
            if entries:
                cursor = top = entries[-1].id
            if len(entries) < _PAGE:
                break
        self._holes.read(top, time.monotonic())
        for ch in live:
            # Not one held below what was read (its ids unread, not holes), nor another hub's
            if ch.name in self._claims.held and self._positions[ch.name] >= start:
                await self._advance(ch, top, present)
        return total

    async def _advance(self, ch: Channel, top: int, present: set[int]) -> None:
        """Move a channel's saved position (its state's, then its claim's) over every id it
        handled, and over the holes whose wait is over (`_hub_holes`).

        A hole below an entry the channel has not handled yet (it failed, or waits for its
        retry) holds it back too: it may be a close its session's deletion erased, which that
        deletion's entry, read later, tells only while the close is above the position
        (`_told`), also for a hub started again or taking over from the position saved.
        """
        seen = self._seen.setdefault(ch.name, set())
        pos = self._positions[ch.name]
        held = any(i > pos and i not in seen for i in present)
        passed = self._holes.passed(self.gap_timeout, time.monotonic())
        pos = advanced(pos, top, present, seen, held=held, passed=passed)
        moved = pos != self._positions[ch.name]
        if moved:
            self._positions[ch.name] = pos
            await off_loop(self.state.set_position, self._key(ch), pos)
            self._holes.forget(min(self._positions[n] for n in self._active))
        await self._keep_seen(ch, moved=moved)

    async def _keep_seen(self, ch: Channel, *, moved: bool) -> None:
        """Save the entries delivered (or passed over at a first start) above the channel's
        position where they changed, in its state and, with the position (if `moved`), in its
        claim in the store: a hub that takes over from the position, on this state or
        another, skips them. The claim's are written together, and only while it still names
        this hub: one that took it over (this hub stalled) keeps its own."""
        ids = sorted(self._seen.get(ch.name, ()))
        if ids != self._kept.get(ch.name, []):
            if ids:
                await off_loop(self.state.remember, self._key(ch), _DELIVERED, ids)
            else:
                await off_loop(self.state.forget, self._key(ch), _DELIVERED)
            self._kept[ch.name] = ids
        shared = None if ids == self._shared.get(ch.name, []) else ids
        if shared is None and not moved:
            return
        pos = self._positions[ch.name]
        if await self._claims.renew(ch.name, pos, delivered=shared) and shared is not None:
            self._shared[ch.name] = shared

    async def _dispatch(self, entry: AuditEntry, blocked: set[str]) -> int:
        """Deliver one entry to every channel that has not had it; 1 if any handled it."""
        handled = 0
        for ch in self.channels:
            if ch.name in blocked or self._positions[ch.name] >= entry.id:
                continue
            if not self._claims.live(ch.name):  # taken, or late: nothing more this poll
                blocked.add(ch.name)
                continue
            seen = self._seen.setdefault(ch.name, set())
            if entry.id in seen:
                continue
            shown = self._retries.shown.pop((ch.name, entry.id), set())
            try:
                await announce(self.runtime.store, ch, entry, self._told(ch), shown=shown)
            except RateLimited as exc:
                # The service says when to come back: no attempt is spent, nothing given up.
                self._retries.keep_shown(ch.name, entry.id, shown)
                self._retries.rate_limited(ch.name, entry.id, exc)
                blocked.add(ch.name)
                continue
            except Damaged as exc:  # the rest of it told: reading it again gives the same
                passed(ch, entry, exc)
            except Exception:
                self._retries.keep_shown(ch.name, entry.id, shown)  # also once given up on
                if self._retries.failed(ch.name, entry.id, self.max_attempts, self.retry_backoff):
                    blocked.add(ch.name)
                    continue
                await note_given_up(self.state, self._key(ch), entry.id)
                self._given_up_at.setdefault(ch.name, time.monotonic())
            self._retries.handled(ch.name, entry.id)
            seen.add(entry.id)
            handled = 1
        return handled

    def _told(self, ch: Channel) -> Callable[[int], bool]:
        """Whether an entry was delivered to `ch`: below its position (which passes a hole only
        once every entry after it fetched is handled, a deletion that erased it among them), or
        delivered above it."""
        pos = self._positions[ch.name]
        seen = self._seen.get(ch.name, set())
        return lambda i: i <= pos or i in seen

    async def _redeliver(self, ch: Channel, *, until_failure: bool = False) -> None:
        """Deliver again the entries given up on for `ch` (`redeliver`), while its claim is live;
        those kept are tried again `REDO_EVERY` seconds later."""
        live = functools.partial(self._claims.live, ch.name)
        args = (self.runtime.store, self.state, self._key(ch), ch, self._retries, live)
        if await redeliver(*args, until_failure=until_failure):
            self._given_up_at[ch.name] = time.monotonic()
        else:
            self._given_up_at.pop(ch.name, None)

    def _redo_due(self, ch: Channel) -> bool:
        """Whether it is time for a round that delivers again what `ch` was given up on: it
        has some, `REDO_EVERY` seconds have passed, and it waits for no retry now."""
        at = self._given_up_at.get(ch.name)
        return (
            at is not None
            and time.monotonic() - at >= given_up.REDO_EVERY
            and ch.name not in self._retries.blocked()
        )

    async def _open_requests(self) -> list[InputRequest]:
        """Every open request, for the channels the hub starts delivering to."""
        return await open_requests(self.runtime, self.clock, _PAGE)


def _whole(value: object) -> bool:
    """Whether a saved id is one (an int, not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _in_event_loop() -> bool:
    """Whether this thread runs an event loop now (where opening a file must not wait)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
