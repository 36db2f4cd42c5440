"""Followers across a real PostgreSQL crash that loses the last commits (a server process
killed, as by the OOM killer: the server restarts and recovers from the WAL it had written, as
after `pg_ctl stop -m immediate`): the commits of a turn written with `synchronous_commit=off`
while the WAL writer was stopped (SIGSTOP, so that they stay in its buffers whatever the
machine's timing) are gone after it, and the session then runs on from before them."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import signoff as so
from signoff.server import TokenAuth, create_app
from signoff.testing import call, call_tools, reply

from .conftest import PgCluster
from .test_followers_lost_commits import _agents, _raw_stream
from .test_server_common import TOKENS, running


@pytest.fixture
def cluster() -> Iterator[PgCluster]:
    """A PostgreSQL server of this test's own: it is crashed."""
    cluster = PgCluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


_WRITERS = ("walwriter", "background writer", "checkpointer", "autovacuum launcher")
"""The server processes that write the WAL out on their own: the WAL writer, and those that may
flush it first (a dirty page written, a checkpoint, an autovacuum worker's commit)."""


async def _wal_writers(admin_url: str) -> list[int]:
    """After a checkpoint (all so far on disk), the pids of the server's `_WRITERS`: stopped
    (SIGSTOP), async commits stay in the WAL buffers whatever the machine's timing, and a crash
    (SIGKILL) loses them; stopping only the WAL writer, a page written meanwhile once kept them."""
    async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as a:
        await a.execute("CHECKPOINT")
        cur = await a.execute(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = ANY(%s)", (list(_WRITERS),)
        )
        pids = [int(pid) for (pid,) in await cur.fetchall()]
    assert len(pids) == len(_WRITERS), pids
    return pids


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        os.kill(pid, sig)


async def _head(url: str, sid: str) -> int:
    """The session's head once the server answers again (it restarts after the crash)."""
    for _ in range(600):
        try:
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                cur = await conn.execute("SELECT head FROM signoff.sessions WHERE id=%s", (sid,))
                (head,) = await cur.fetchone() or (None,)
                return int(head)
        except psycopg.OperationalError:
            await asyncio.sleep(0.05)
    raise AssertionError("the server did not come back")


async def _until(check: Any, what: str) -> None:
    for _ in range(1000):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(what)


async def test_followers_across_a_server_crash_that_lost_shown_events_stop(
    cluster: PgCluster,
) -> None:
    """The crash loses the second turn's last events, which a `Runtime.events` follower and an
    HTTP stream had shown; the session then runs a longer turn from what the server kept.
    Both followers used to go on after the seq they had reached, skipping the events written
    anew; both stop there (`EventsRewritten`; `stream.end` 409 `events_rewritten`)."""
    url = cluster.url(cluster.create_database())
    async with so.Runtime(
        _agents([reply("One."), reply("Two.")]), store=url, poll_interval=0.05, lease_ttl=1.0
    ) as rt:
        sid = (await rt.generate("a", "one")).session_id
        kept = await rt.store.head(sid)
        writers = await _wal_writers(cluster.admin_url)  # all so far on disk
        server = so.Runtime(_agents([]), store=url, poll_interval=0.05)
        app = create_app(server, auth=TokenAuth(TOKENS), poll_interval=0.05, heartbeat=0.5)
        with running(app) as base:
            shown: list[so.Event] = []
            raw: list[dict[str, Any]] = []

            async def follow() -> None:
                async for event in rt.events(sid):
                    shown.append(event)

            following = asyncio.create_task(follow())
            streaming = asyncio.create_task(_raw_stream(base, sid, raw))
            try:
                await _until(lambda: len(shown) == len(raw) == kept, "the followers caught up")
                _signal(writers, signal.SIGSTOP)  # async commits stay in the WAL buffers
                try:
                    await rt.generate(session_id=sid, prompt="two")
                    reached = await rt.store.head(sid)
                    assert reached is not None
                    await _until(
                        lambda: len(shown) == len([m for m in raw if "id" in m]) == reached,
                        "the followers showed the second turn",
                    )
                finally:
                    _signal(writers, signal.SIGKILL)  # the server crashes and recovers
                after = await _head(url, sid)
                assert kept is not None and kept < after < reached  # it lost the last ones
                # Another process resumes the turn the crash left running (its message was
                # flushed) once the lease the crash kept has lapsed.
                other = [call_tools(call("noop")), call_tools(call("noop")), reply("Other.")]
                async with so.Runtime(_agents(other), store=url, lease_wait=20) as rt2:
                    await rt2.generate(session_id=sid)  # the turn the crash left running
                    assert (await rt2.store.head(sid) or 0) > reached + 2
                await _until(
                    lambda: following.done() or shown[-1].seq > reached, "the follower went on"
                )
                assert [e.seq for e in shown] == list(range(1, reached + 1))  # none past it
                with pytest.raises(so.EventsRewritten) as rewritten:
                    await asyncio.wait_for(following, 10)
                await asyncio.wait_for(streaming, 20)
            finally:
                following.cancel()
                streaming.cancel()
    assert (rewritten.value.session_id, rewritten.value.seq) == (sid, reached)
    assert [int(m["id"]) for m in raw if "id" in m] == list(range(1, reached + 1))
    end = raw[-1]["data"]
    assert raw[-1]["event"] == "stream.end" and end["error"]["code"] == "events_rewritten", end
    assert (end["status"], end["error"]["seq"]) == (409, reached)
