"""PostgreSQL's copy of a subagent session's deadline (`child_expires_at`, migration 11): the
store as it was before it, for the tests that take a store back to an older schema, and the
counts of updates of its session rows, HOT (in place) or not."""

from __future__ import annotations

from typing import Any

from signoff.stores.postgres import PostgresStore

from ._audit import alter
from ._procs import query

__all__ = ["before_child_deadlines", "session_updates"]


def before_child_deadlines(url: str) -> None:
    """The PostgreSQL store at `url` as migration 10 left it: no `child_expires_at`, its
    children indexed by status and `expires_at`, migrations 11, 12 (channel claims), 13
    (deleted sessions), 14 (children by parent) and 15 (the leases' TTL and grant time) not
    marked (SQLite: as it is)."""
    if url.startswith("sqlite:///"):
        return
    alter(url, "ALTER TABLE {t}leases DROP COLUMN ttl, DROP COLUMN granted_at")  # migration 15's
    alter(url, "DROP INDEX {t}sessions_by_parent")  # migration 14's, after this one
    alter(url, "DROP TABLE {t}deleted_sessions")  # migration 13's, after this one
    alter(url, "DROP TABLE {t}channel_claims")  # migration 12's, after this one
    alter(url, "DROP INDEX {t}sessions_children")
    alter(url, "ALTER TABLE {t}sessions DROP COLUMN child_expires_at")
    alter(
        url,
        "CREATE INDEX sessions_children ON {t}sessions (status, expires_at) "
        "WHERE parent IS NOT NULL",
    )
    alter(url, "DELETE FROM {t}schema_version WHERE version >= 11")


async def session_updates(store: PostgresStore) -> tuple[int, int]:
    """How many session rows `store`'s database updated so far, and how many of those in place
    (HOT). `store` must have one connection (`max_size=1`): it is asked to report its counts
    now (`pg_stat_force_next_flush`, PostgreSQL 15); a backend otherwise reports them at most
    once a second, or as it exits."""
    assert store.max_size == 1, "the counts of another connection may not be reported yet"

    async def flush(conn: Any) -> None:
        await conn.execute("SELECT pg_stat_force_next_flush()")

    await store._read(flush, "reporting statistics")
    ((updated, hot),) = query(
        store.url,
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
        "WHERE schemaname = {p} AND relname = 'sessions'",
        store.schema,
    )
    return int(updated), int(hot)
