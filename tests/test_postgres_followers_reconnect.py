"""A follower waiting on a session when its PostgreSQL server crashes, and nothing is written
after it: its shown events lost, it stops within seconds of the server being back
(`EventsRewritten`), woken by its listener reconnecting or by the shared re-check of the heads,
not ~30 s later when its wait times out."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from typing import Any, cast

import pytest

import signoff as so
from signoff.server import TokenAuth, create_app
from signoff.stores.postgres import PostgresStore
from signoff.testing import reply

from .conftest import PgCluster
from .test_followers_lost_commits import _agents, _raw_stream
from .test_postgres_followers_crash import _head, _signal, _until, _wal_writers
from .test_server_common import TOKENS, running


@pytest.fixture
def cluster() -> Iterator[PgCluster]:
    """A PostgreSQL server of this test's own: it is crashed."""
    cluster = PgCluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.parametrize("woken_on_reconnect", [True, False], ids=["reconnect", "recheck"])
async def test_a_follower_whose_shown_events_a_crash_lost_stops_once_the_server_is_back(
    cluster: PgCluster, woken_on_reconnect: bool
) -> None:
    """The crash loses the second turn's last events, which the follower had shown, and nothing
    is written after it, so nothing notifies: the listener, reconnecting, wakes every wait
    (`_wake_all`), and the follower's next read finds its last event gone. Without that wake
    (`recheck`: a reconnect that backs off for seconds on a loaded machine, as in a CI run) the
    shared re-check finds the head behind what the follower read, and wakes it; it woke only
    a head past it, so the follower stopped ~30 s later (this test then fails after 10 s)."""
    url = cluster.url(cluster.create_database())
    async with so.Runtime(
        _agents([reply("One."), reply("Two.")]), store=url, poll_interval=0.05
    ) as rt:
        listener = cast(PostgresStore, rt.store)._changes
        if not woken_on_reconnect:
            listener._wake_all = lambda: None  # type: ignore[method-assign]
        sid = (await rt.generate("a", "one")).session_id
        kept = await rt.store.head(sid)
        writers = await _wal_writers(cluster.admin_url)  # all so far on disk
        shown: list[so.Event] = []

        async def follow() -> None:
            async for event in rt.events(sid):
                shown.append(event)

        following = asyncio.create_task(follow())
        try:
            await _until(lambda: len(shown) == kept, "the follower caught up")
            _signal(writers, signal.SIGSTOP)  # async commits stay in the WAL buffers
            try:
                await rt.generate(session_id=sid, prompt="two")
                reached = await rt.store.head(sid)
                assert reached is not None
                await _until(lambda: len(shown) == reached, "the follower showed the second turn")
                # Waiting past it before the crash, not still reading the session's state.
                await _until(
                    lambda: (sid, reached) in listener._follows.values(), "the follower waits"
                )
            finally:
                _signal(writers, signal.SIGKILL)  # the server crashes and recovers
            after = await _head(url, sid)
            assert kept is not None and kept < after < reached  # it lost the last ones
            with pytest.raises(so.EventsRewritten) as rewritten:
                await asyncio.wait_for(following, 10)
        finally:
            following.cancel()
            vars(listener).pop("_wake_all", None)
    assert (rewritten.value.session_id, rewritten.value.seq) == (sid, reached)
    assert [e.seq for e in shown] == list(range(1, reached + 1))


async def test_followers_resumed_past_what_a_crash_kept_stop_without_spinning(
    cluster: PgCluster,
) -> None:
    """Followers resumed at the second turn's last seq (`events(after=)`, an HTTP stream's
    `Last-Event-ID`), nothing shown yet, when a crash loses that turn's last events: each ends
    (`EventsRewritten`; `stream.end` 409 `events_rewritten`) soon after the server is back,
    woken by the head now behind what they resumed at. They waited for their periodic look at
    the session (30 s; the stream's `heartbeat`), and a wake that found no event to read must
    not have them read again at once, over and over, until that look."""
    url = cluster.url(cluster.create_database())
    async with so.Runtime(
        _agents([reply("One."), reply("Two.")]), store=url, poll_interval=0.05
    ) as rt:
        sid = (await rt.generate("a", "one")).session_id
        writers = await _wal_writers(cluster.admin_url)  # all so far on disk
        server = so.Runtime(_agents([]), store=url, poll_interval=0.05)
        reads = 0
        read_events = server.store.read_events

        async def counted(*args: Any, **kwargs: Any) -> list[so.Event]:
            nonlocal reads
            reads += 1
            return await read_events(*args, **kwargs)

        server.store.read_events = counted  # type: ignore[method-assign]
        # The stream's heartbeat (its periodic look) longer than the test's bound.
        app = create_app(server, auth=TokenAuth(TOKENS), poll_interval=0.05, heartbeat=20.0)
        store = cast(PostgresStore, server.store)
        followed: list[so.Event] = []
        raw: list[dict[str, Any]] = []
        with running(app) as base:
            _signal(writers, signal.SIGSTOP)  # async commits stay in the WAL buffers
            try:
                await rt.generate(session_id=sid, prompt="two")
                reached = await rt.store.head(sid)
                assert reached is not None

                async def follow() -> None:
                    async for event in server.events(sid, after=reached):
                        followed.append(event)

                following = asyncio.create_task(follow())
                streaming = asyncio.create_task(_raw_stream(base, sid, raw, last=reached))
            except BaseException:
                _signal(writers, signal.SIGKILL)
                raise
            try:
                try:
                    # One wait on this loop's listener, one on the server's (its own loop).
                    await _until(lambda: _waits(store, (sid, reached)) == 2, "both followers wait")
                finally:
                    _signal(writers, signal.SIGKILL)  # the server crashes and recovers
                after = await _head(url, sid)
                assert after < reached  # it lost the last ones
                back, reads = time.monotonic(), 0
                with pytest.raises(so.EventsRewritten) as rewritten:
                    await asyncio.wait_for(following, 10)
                await asyncio.wait_for(streaming, 10)
                took, read = time.monotonic() - back, reads
            finally:
                following.cancel()
                streaming.cancel()
    assert (rewritten.value.session_id, rewritten.value.seq) == (sid, reached)
    assert followed == []
    end = raw[-1]["data"]
    assert raw[-1]["event"] == "stream.end" and end["error"]["code"] == "events_rewritten", end
    assert (end["status"], end["error"]["seq"]) == (409, reached)
    # A few reads each (a poll_interval apart at most while the server recovers), not one per
    # loop of a wait that returns at once.
    assert read <= 20 + 2 * took / 0.05, (read, took)


def _waits(store: PostgresStore, follow: tuple[str, int]) -> int:
    """How many waits, on every event loop's listener, follow this session past this seq."""
    listeners = list(store._listeners.values())
    return sum(list(listener._follows.values()).count(follow) for listener in listeners)
