"""A store whose disk fills up: every insert into the log refused, as on a full disk, until
space is freed; on SQLite by the runtime's own connection's page limit, on PostgreSQL by a
trigger that raises SQLSTATE 53100 (disk_full)."""

from __future__ import annotations

from collections.abc import Callable

import psycopg

import signoff as so

__all__ = ["FAIL_INSERTS", "disk"]

FAIL_INSERTS = """
CREATE FUNCTION signoff.disk_full() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'could not extend file: No space left on device' USING ERRCODE = '53100';
END $$;
CREATE TRIGGER disk_full BEFORE INSERT ON signoff.events
FOR EACH ROW EXECUTE FUNCTION signoff.disk_full();
"""


def disk(rt: so.Runtime, url: str) -> tuple[Callable[[], None], Callable[[], None]]:
    """`fill` and `unfill` for the store of `rt` at `url` (SQLite or PostgreSQL)."""
    if url.startswith("sqlite"):

        def fill() -> None:
            conn = rt.store.conn  # type: ignore[attr-defined]
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            conn.execute(f"PRAGMA max_page_count={pages}")

        def unfill() -> None:
            rt.store.conn.execute("PRAGMA max_page_count=1073741823")  # type: ignore[attr-defined]

        return fill, unfill
    admin = url.split("?")[0]

    def fill_pg() -> None:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("DROP TRIGGER IF EXISTS disk_full ON signoff.events")
            conn.execute("DROP FUNCTION IF EXISTS signoff.disk_full()")
            conn.execute(FAIL_INSERTS)

    def unfill_pg() -> None:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("DROP TRIGGER IF EXISTS disk_full ON signoff.events")

    return fill_pg, unfill_pg
