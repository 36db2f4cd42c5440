"""The deadline a PostgreSQL store call is held to on its connection (`operation_timeout`): a
server process that stops answering while its kernel still acknowledges (here: SIGSTOP) fails
the call with `StoreUnavailable` instead of holding it for ever, its connection is dropped, and
a COMMIT left unanswered is decided as one whose connection was lost."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

import signoff as so
from signoff._exceptions import StoreError, StoreUnavailable, UsageError
from signoff.stores import Commit
from signoff.stores.postgres import PostgresStore
from signoff.stores.postgres._borrowed import OPERATION_TIMEOUT
from signoff.stores.postgres._transactions import CHECK_WAIT

from ._pg_events import ev, new_session
from ._shipping import shipping_agent
from .conftest import PgCluster

GENEROUS = 15.0
"""Seconds a call held to a 1 s deadline is given before the test calls it hung."""


async def backend_pid(store: PostgresStore) -> int:
    """The server process serving the store's (only) pooled connection."""

    async def body(conn: psycopg.AsyncConnection[Any]) -> int:
        cur = await conn.execute("SELECT pg_backend_pid()")
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    return await store._read(body, "reading the backend's pid")


@contextlib.contextmanager
def frozen(*pids: int) -> Iterator[None]:
    """These server processes stopped (their kernel still acknowledging), and always resumed."""
    stopped: list[int] = []
    try:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
        yield
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)


async def gone(url: str, pid: int) -> None:
    """Wait until the server process `pid`, resumed, has ended (it finds its client gone)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for _ in range(500):
            cur = await conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,))
            if await cur.fetchone() is None:
                return
            await asyncio.sleep(0.02)
    raise AssertionError(f"server process {pid} never ended")


@pytest.fixture
def cluster(pg_cluster: PgCluster) -> PgCluster:
    if not pg_cluster.ours:
        pytest.skip("stopping server processes needs a cluster these tests started")
    return pg_cluster


@pytest.fixture
async def one(cluster: PgCluster, pg_store_url: str) -> AsyncIterator[PostgresStore]:
    """A store with one pooled connection, whose calls may wait on it 1 s."""
    store = PostgresStore(pg_store_url, min_size=1, max_size=1, operation_timeout=1)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


# -- the option ------------------------------------------------------------------------------


def test_the_default_and_the_url_option() -> None:
    assert PostgresStore("postgresql://u@h/db").operation_timeout == OPERATION_TIMEOUT == 30.0
    store = PostgresStore("postgresql://u@h/db?operation_timeout=2.5&pool_max=3")
    assert store.operation_timeout == 2.5
    assert "operation_timeout" not in conninfo_to_dict(store._dsn)  # signoff's, not libpq's
    assert PostgresStore("postgresql://u@h/db", operation_timeout=4).operation_timeout == 4


def test_the_argument_wins_over_the_url() -> None:
    store = PostgresStore("postgresql://u@h/db?operation_timeout=9", operation_timeout=0.5)
    assert store.operation_timeout == 0.5


@pytest.mark.parametrize("value", [0, -1, 0.0, float("nan"), float("inf"), True, "5"])
def test_an_argument_that_is_not_a_positive_finite_number_is_refused(value: Any) -> None:
    with pytest.raises(UsageError, match="operation_timeout must be a positive, finite number"):
        PostgresStore("postgresql://u@h/db", operation_timeout=value)


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_a_url_option_that_is_not_a_positive_finite_number_is_refused(value: str) -> None:
    with pytest.raises(StoreError, match="operation_timeout"):
        PostgresStore(f"postgresql://u@h/db?operation_timeout={value}")


# -- a server process that stopped answering ------------------------------------------------


async def test_a_read_on_a_frozen_connection_fails_and_the_store_goes_on(
    one: PostgresStore, pg: PostgresStore
) -> None:
    sid = await new_session(pg)
    pid = await backend_pid(one)
    with frozen(pid):
        with pytest.raises(StoreUnavailable) as info:
            await asyncio.wait_for(one.head(sid), GENEROUS)
        message = str(info.value)
        assert f"reading the head of session {sid!r}" in message
        assert "did not answer within 1s (`operation_timeout`)" in message
        assert one._pool is not None and one._pool.get_stats().get("returns_bad") == 1
        # The frozen connection was dropped, not pooled again: the next call gets a new one.
        assert await asyncio.wait_for(one.head(sid), GENEROUS) == 1
        assert await backend_pid(one) != pid
    await gone(one.url, pid)
    assert await one.head(sid) == 1


async def test_a_frozen_connection_is_cut_with_no_file_descriptor_to_spare(
    one: PostgresStore, pg: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cutting a connection takes no new file descriptor: a process that has run out of them
    (EMFILE, under load, just when a server stops answering) still gets its call back."""
    sid = await new_session(pg)
    pid = await backend_pid(one)

    def no_more(fd: int) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    with frozen(pid):
        monkeypatch.setattr(os, "dup", no_more)
        with pytest.raises(StoreUnavailable, match="did not answer within 1s"):
            await asyncio.wait_for(one.head(sid), GENEROUS)
        monkeypatch.undo()
    await gone(one.url, pid)
    assert await one.head(sid) == 1


async def test_a_write_frozen_before_its_commit_fails_and_writes_nothing(
    one: PostgresStore, pg: PostgresStore, pg_store_url: str
) -> None:
    """`one` never saw the session, so its commit reads the session's state first, and waits
    for it in vain: the call fails, and the server, resumed, rolls back what it was sent."""
    sid = await new_session(pg)
    pid = await backend_pid(one)
    with frozen(pid):
        with pytest.raises(StoreUnavailable, match=f"commit to session {sid!r}: PostgreSQL"):
            await asyncio.wait_for(
                one.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)])),
                GENEROUS,
            )
    await gone(pg_store_url, pid)
    assert [e.seq for e in await pg.read_events(sid)] == [1]
    await one.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)]))
    assert [e.seq for e in await pg.read_events(sid)] == [1, 2]


async def test_a_commit_left_unanswered_is_checked_then_written_once(
    one: PostgresStore, pg_store_url: str
) -> None:
    """The COMMIT went out and no answer came: as when a connection is lost during COMMIT, a
    fresh connection finds it not committed and the commit is sent again there. The frozen
    process, resumed, runs what it was sent, which its session's head refuses."""
    sid = await new_session(one)  # `one` knows the session: its commit goes out in one batch
    pid = await backend_pid(one)
    events = [ev(sid, 2, "tool.started"), ev(sid, 3, "tool.completed")]
    with frozen(pid):
        await asyncio.wait_for(
            one.commit(Commit(session_id=sid, expected_seq=1, events=events)), GENEROUS
        )
        assert await one.head(sid) == 3
    await gone(pg_store_url, pid)
    assert [e.seq for e in await one.read_events(sid)] == [1, 2, 3]
    await one.commit(Commit(session_id=sid, expected_seq=3, events=[ev(sid, 4)]))
    assert await one.head(sid) == 4


async def test_a_session_created_unanswered_is_checked_then_created_once(
    one: PostgresStore, pg_store_url: str
) -> None:
    await new_session(one)  # the pool's connection is up
    pid = await backend_pid(one)
    with frozen(pid):
        sid = await asyncio.wait_for(new_session(one), GENEROUS)
    await gone(pg_store_url, pid)
    assert [e.seq for e in await one.read_events(sid)] == [1]


async def test_a_connection_cut_as_its_call_ended_is_not_pooled_again(pg_store_url: str) -> None:
    """The deadline passed while the call needed the server no more: its answer stands, and its
    connection, cut, is closed rather than handed to the next call."""
    store = PostgresStore(pg_store_url, min_size=1, max_size=1, operation_timeout=0.05)
    await store.open()
    try:
        pid = await backend_pid(store)

        async def slow(conn: psycopg.AsyncConnection[Any]) -> str:
            await asyncio.sleep(0.3)
            return "done"

        assert await store._read(slow, "thinking") == "done"
        assert store._pool is not None and store._pool.get_stats().get("returns_bad") == 1
        assert await backend_pid(store) != pid
    finally:
        await store.close()


async def lost_beside_frozen(store: PostgresStore, url: str) -> tuple[int, int]:
    """The store's two pooled connections idle, the one it lends next lost (its server process
    ended), the other's server process to be frozen: their pids."""
    pool = store._pool
    assert pool is not None
    lost, stuck = await pool.getconn(), await pool.getconn()
    pids = []
    for conn in (lost, stuck):
        cur = await conn.execute("SELECT pg_backend_pid()")
        row = await cur.fetchone()
        assert row is not None
        pids.append(int(row[0]))
    await pool.putconn(lost)  # the pool lends its longest idle connection first
    await pool.putconn(stuck)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
        await admin.execute("SELECT pg_terminate_backend(%s)", (pids[0],))
    await gone(url, pids[0])
    return pids[0], pids[1]


async def test_a_lost_connection_beside_a_frozen_one_is_retried_in_time(
    cluster: PgCluster, pg_store_url: str
) -> None:
    """A call whose connection was lost tests the connections idle in the pool before it tries
    again: one whose server process stopped answering is held to the call's deadline too, and
    dropped, rather than holding the test, and the call, for ever."""
    store = PostgresStore(pg_store_url, min_size=2, max_size=2, operation_timeout=1)
    await store.open()
    try:
        sid = await new_session(store)
        lost, stuck = await lost_beside_frozen(store, pg_store_url)
        with frozen(stuck):
            call = asyncio.ensure_future(store.head(sid))
            try:
                await asyncio.wait({call}, timeout=GENEROUS)
                assert call.done(), "the call hung on the pool's test of a frozen connection"
            finally:
                call.cancel()
            assert call.result() == 1
            assert await backend_pid(store) not in (lost, stuck)
            # The test itself ends while the process is still frozen, its connection cut.
            checking = store._checking
            assert checking is not None
            await asyncio.wait({checking}, timeout=GENEROUS)
            assert checking.done()
        await gone(pg_store_url, stuck)
    finally:
        await store.close()


async def test_a_lost_connection_beside_a_frozen_one_does_not_wait_for_its_deadline(
    cluster: PgCluster, pg_store_url: str
) -> None:
    """The test of the pool after a lost connection holds the frozen one until its deadline
    (20 s here), out of the pool: the call that lost its connection goes on without it after
    `CHECK_WAIT`, over a fresh connection, rather than waiting out that deadline."""
    store = PostgresStore(pg_store_url, min_size=2, max_size=2, operation_timeout=20)
    await store.open()
    try:
        sid = await new_session(store)
        lost, stuck = await lost_beside_frozen(store, pg_store_url)
        with frozen(stuck):
            loop = asyncio.get_running_loop()
            started = loop.time()
            assert await asyncio.wait_for(store.head(sid), GENEROUS) == 1
            assert loop.time() - started < 3 * CHECK_WAIT + 2  # not the frozen one's 20 s
            assert await backend_pid(store) not in (lost, stuck)
        checking = store._checking  # the test goes on: the resumed connection passes it
        assert checking is not None
        await asyncio.wait({checking}, timeout=GENEROUS)
        assert checking.done()
    finally:
        await store.close()


async def test_a_call_cancelled_while_the_pool_is_tested_is_cancelled(
    cluster: PgCluster, pg_store_url: str
) -> None:
    """Cancelled while it waits for the test of the pool after a lost connection (psycopg_pool's
    `check()` takes a cancellation for a broken connection), the call ends cancelled: it does
    not go on to try again, as a tool body cancelled with its lost lease must not."""
    store = PostgresStore(pg_store_url, min_size=2, max_size=2, operation_timeout=5)
    await store.open()
    try:
        sid = await new_session(store)
        _, stuck = await lost_beside_frozen(store, pg_store_url)
        with frozen(stuck):
            call = asyncio.ensure_future(store.head(sid))
            await asyncio.sleep(0.5)  # its connection found lost, the frozen one under test
            assert not call.done()
            call.cancel()
            await asyncio.wait({call}, timeout=GENEROUS)
            assert call.cancelled()
        # The test goes on without it: the resumed connection passes, and the store works on.
        assert await asyncio.wait_for(store.head(sid), GENEROUS) == 1
    finally:
        await store.close()


def _postmaster(cluster: PgCluster) -> int:
    assert cluster.directory is not None
    return int((cluster.directory / "data" / "postmaster.pid").read_text().split()[0])


async def test_a_commit_whose_outcome_cannot_be_checked_is_a_store_error(
    cluster: PgCluster, pg_store_url: str
) -> None:
    """The whole server frozen: the commit gets no answer and neither can a check of it (no new
    connection is accepted), so the outcome is unknown, as for a connection lost during COMMIT,
    and the call says so within its deadlines rather than hanging."""
    store = PostgresStore(
        f"{pg_store_url}?connect_timeout=1&outage_grace=1",
        min_size=1,
        max_size=1,
        operation_timeout=1,
    )
    await store.open()
    try:
        sid = await new_session(store)
        # A commit of the same shape first: its statement is prepared on the connection, so the
        # next one goes out whole, in one message, with no round trip to prepare it.
        await store.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)]))
        pid = await backend_pid(store)
        with frozen(_postmaster(cluster), pid):
            with pytest.raises(
                StoreError, match="within 1s .* during COMMIT; the outcome is unknown"
            ):
                await asyncio.wait_for(
                    store.commit(Commit(session_id=sid, expected_seq=2, events=[ev(sid, 3)])),
                    GENEROUS,
                )
        await gone(pg_store_url, pid)
        # Unknown indeed: the frozen process, resumed, ran the commit it had been sent before
        # it read that its client had gone. It wrote the commit once, whole.
        assert [e.seq for e in await store.read_events(sid)] == [1, 2, 3]
        assert await store.head(sid) == 3
    finally:
        await store.close()


async def test_a_runtime_call_on_a_frozen_server_fails_and_can_be_repeated(
    cluster: PgCluster, pg_store_url: str
) -> None:
    """Through the runtime: an approval sent while the server process does not answer fails
    with `StoreUnavailable` and records nothing; sent again once it answers, it runs the tool
    once."""
    runs: list[str] = []

    agent = shipping_agent(runs)
    rt = so.Runtime([agent], store=f"{pg_store_url}?operation_timeout=1&pool_min=1&pool_max=1")
    try:
        r = await rt.generate("a", prompt="ship 7")
        assert r.status == "waiting"
        store = rt.store
        assert isinstance(store, PostgresStore)
        pid = await backend_pid(store)
        approval = [so.Decision(id=r.pending[0].id, approved=True)]
        with frozen(pid):
            with pytest.raises(StoreUnavailable, match="within 1s"):
                await asyncio.wait_for(
                    rt.generate(session_id=r.session_id, approvals=approval), GENEROUS
                )
        await gone(pg_store_url, pid)
        assert runs == []
        r = await asyncio.wait_for(
            rt.generate(session_id=r.session_id, approvals=approval), GENEROUS
        )
        assert r.status == "completed" and r.text == "Shipped."
        assert runs == ["7"]
    finally:
        await rt.close()
