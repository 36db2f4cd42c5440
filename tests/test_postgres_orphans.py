"""A write whose connection the client lost while the server still ran it: the check on a fresh
connection finds it not committed yet, the write is sent again, and the first one commits
before the second can (an orphan). The call must take the orphan's commit as its own, once."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psycopg
import pytest

from signoff._exceptions import StoreError
from signoff.stores import Commit
from signoff.stores._audit import AuditRow
from signoff.stores._deletions import DELETIONS_STREAM, SESSION_DELETED
from signoff.stores.postgres import PostgresStore
from signoff.stores.postgres._borrowed import sever

from ._pg_events import T0, ev, new_session
from .test_postgres import admin

HOLD = 4242
"""The advisory lock the test holds while the first write's COMMIT waits for it."""


@pytest.fixture
async def held_commits(pg_store_url: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A COMMIT that writes events or audit entries waits (a deferred trigger) while the
    connection yielded holds advisory lock `HOLD`."""
    conn = await admin(pg_store_url)
    async with conn:
        await conn.execute(
            f"""
            CREATE FUNCTION public.hold_commit() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                PERFORM pg_advisory_xact_lock_shared({HOLD});
                RETURN NULL;
            END $$;
            CREATE CONSTRAINT TRIGGER hold AFTER INSERT ON signoff.events
                DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.hold_commit();
            CREATE CONSTRAINT TRIGGER hold AFTER INSERT ON signoff.audit
                DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.hold_commit();
            """
        )
        yield conn


async def _until(conn: psycopg.AsyncConnection[Any], sql: str, what: str) -> int:
    """The pid of the one backend `sql` (a condition on pg_stat_activity `a`) finds."""
    for _ in range(1000):
        cur = await conn.execute(
            f"SELECT a.pid FROM pg_stat_activity a WHERE a.pid <> pg_backend_pid() AND {sql}"
        )
        rows = await cur.fetchall()
        if len(rows) == 1:
            return int(rows[0][0])
        await asyncio.sleep(0.02)
    raise AssertionError(f"no backend {what}")


async def _first_commits_while_resent(
    store: PostgresStore,
    conn: psycopg.AsyncConnection[Any],
    monkeypatch: pytest.MonkeyPatch,
    write: Callable[[], Awaitable[Any]],
) -> int:
    """Run `write`: its statement's connection is cut once the server commits it (held there by
    `HOLD`), the write is sent again, and the first statement commits while the second waits
    for its locks. Returns how many statements were sent."""
    sent: list[psycopg.AsyncConnection[Any]] = []
    execute = psycopg.AsyncConnection.execute
    execute_bound = psycopg.AsyncClientCursor.execute  # `record_audit`'s

    async def noting(self: psycopg.AsyncConnection[Any], query: Any, *a: Any, **k: Any) -> Any:
        if f"INSERT INTO {store._s}." in str(query):
            sent.append(self)
        return await execute(self, query, *a, **k)

    async def noting_bound(self: psycopg.AsyncClientCursor[Any], query: Any, *a: Any) -> Any:
        if f"INSERT INTO {store._s}." in str(query):
            sent.append(self.connection)
        return await execute_bound(self, query, *a)

    monkeypatch.setattr(psycopg.AsyncConnection, "execute", noting)
    monkeypatch.setattr(psycopg.AsyncClientCursor, "execute", noting_bound)
    await conn.execute("SELECT pg_advisory_lock(%s)", (HOLD,))
    writing = asyncio.ensure_future(write())
    orphan = await _until(conn, "a.wait_event = 'advisory'", "committing the write")
    sever(sent[0])  # the client loses it; the server goes on committing
    await _until(
        conn,
        f"a.pid <> {orphan} AND a.wait_event_type = 'Lock'",
        "sending the write again",
    )
    await conn.execute("SELECT pg_advisory_unlock(%s)", (HOLD,))  # the first commits
    await asyncio.wait_for(writing, 30)
    monkeypatch.undo()
    return len(sent)


@pytest.mark.parametrize("leased", [False, True], ids=["unleased", "leased"])
async def test_a_session_created_by_a_statement_whose_connection_was_lost_is_created_once(
    pg_store_url: str,
    held_commits: psycopg.AsyncConnection[Any],
    monkeypatch: pytest.MonkeyPatch,
    leased: bool,
) -> None:
    """The creation was sent again while the first statement, its connection lost to the client,
    was still committing; that one committed first, and the second met the session it had made:
    "session ... already exists", for the session this very call created."""
    store = PostgresStore(pg_store_url, min_size=1, max_size=2)
    await store.open()
    try:
        sid = f"ses_{uuid.uuid4().hex[:20]}"
        first = [ev(sid, 1, "session.created")]
        lease = ("w1", 30.0, T0) if leased else None
        sent: list[int | None] = []

        async def create() -> None:
            sent.append(await store.create_session(sid, "support", first, None, lease=lease))

        assert await _first_commits_while_resent(store, held_commits, monkeypatch, create) == 2
        assert sent == [1 if leased else None]  # the lease its first statement granted
        assert await store.read_events(sid) == first
        # Another creation of the id, with other events or for another owner, is refused.
        for events, owner in (([*first, ev(sid, 2)], "w1"), (first, "w2")):
            with pytest.raises(StoreError, match="already exists"):
                await store.create_session(sid, "support", events, None, lease=(owner, 30, T0))
    finally:
        await store.close()


async def test_a_commit_whose_statement_committed_after_its_connection_was_lost_applies_once(
    pg_store_url: str,
    held_commits: psycopg.AsyncConnection[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = PostgresStore(pg_store_url, min_size=1, max_size=2)
    await store.open()
    try:
        sid = await new_session(store)
        events = [ev(sid, 2, "tool.started"), ev(sid, 3, "tool.completed")]
        sent = await _first_commits_while_resent(
            store,
            held_commits,
            monkeypatch,
            lambda: store.commit(Commit(session_id=sid, expected_seq=1, events=events)),
        )
        assert sent == 2
        assert await store.read_events(sid) == [ev(sid, 1, "session.created"), *events]
        await store.commit(Commit(session_id=sid, expected_seq=3, events=[ev(sid, 4)]))
        assert await store.head(sid) == 4
    finally:
        await store.close()


async def test_audit_entries_whose_statement_committed_after_its_connection_was_lost_are_kept_once(
    pg_store_url: str,
    held_commits: psycopg.AsyncConnection[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An entry recorded whatever its stream holds (a sign-out) was sent again while the first
    statement, its connection lost to the client, was still committing: the second waited for
    the stream's lock, then chained the same entry again after the first's."""
    store = PostgresStore(pg_store_url, min_size=1, max_size=2)
    await store.open()
    try:
        row = AuditRow(stream="signouts", type="signed.out", at=T0, seq=None, data={"who": "al"})
        sent = await _first_commits_while_resent(
            store, held_commits, monkeypatch, lambda: store.record_audit([row])
        )
        assert sent == 2
        entries = [(e.n, e.type, e.data) for e in await store.audit(stream="signouts")]
        assert entries == [(1, "signed.out", {"who": "al"})]
    finally:
        await store.close()


async def test_a_deletion_whose_statement_committed_after_its_connection_was_lost_returns_its_ids(
    pg_store_url: str,
    held_commits: psycopg.AsyncConnection[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check found no entry of the deletion (the first statement not committed yet), the
    statement sent again found the session gone, the first having deleted it meanwhile: it is
    this call's deletion (its entry says so), not `UnknownSession`, and recorded once."""
    store = PostgresStore(pg_store_url, min_size=1, max_size=2)
    await store.open()
    try:
        sid = await new_session(store)
        deleted: list[list[str]] = []

        async def delete() -> None:
            deleted.append(await store.delete_session(sid, now=T0 + 10, reason="once"))

        assert await _first_commits_while_resent(store, held_commits, monkeypatch, delete) == 2
        assert deleted == [[sid]]
        entries = await store.audit(stream=DELETIONS_STREAM)
        assert [(e.type, e.data["session_id"], e.data["reason"]) for e in entries] == [
            (SESSION_DELETED, sid, "once")
        ]
        assert await store.head(sid) is None
    finally:
        await store.close()
