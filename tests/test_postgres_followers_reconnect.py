"""A follower waiting on a session when its PostgreSQL server crashes, and nothing is written
after it: its shown events lost, it stops within seconds of the server being back
(`EventsRewritten`), woken by its listener reconnecting or by the shared re-check of the heads,
not ~30 s later when its wait times out."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from typing import cast

import psycopg
import pytest

import signoff as so
from signoff.stores.postgres import PostgresStore
from signoff.testing import reply

from .conftest import PgCluster
from .test_followers_lost_commits import _agents
from .test_postgres_followers_crash import _head, _until


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
        async with await psycopg.AsyncConnection.connect(cluster.admin_url, autocommit=True) as a:
            await a.execute("CHECKPOINT")  # all so far on disk
            cur = await a.execute(
                "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'"
            )
            (walwriter,) = await cur.fetchone() or (0,)
        shown: list[so.Event] = []

        async def follow() -> None:
            async for event in rt.events(sid):
                shown.append(event)

        following = asyncio.create_task(follow())
        try:
            await _until(lambda: len(shown) == kept, "the follower caught up")
            os.kill(walwriter, signal.SIGSTOP)  # async commits stay in the WAL buffers
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
                os.kill(walwriter, signal.SIGKILL)  # the server crashes and recovers
            after = await _head(url, sid)
            assert kept is not None and kept < after < reached  # it lost the last ones
            with pytest.raises(so.EventsRewritten) as rewritten:
                await asyncio.wait_for(following, 10)
        finally:
            following.cancel()
            vars(listener).pop("_wake_all", None)
    assert (rewritten.value.session_id, rewritten.value.seq) == (sid, reached)
    assert [e.seq for e in shown] == list(range(1, reached + 1))
