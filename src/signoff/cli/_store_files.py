"""What the commands make of a SQLite file before its store opens it: the reading and answering
commands refuse one that is no signoff store, and the commands that create or upgrade a store
refuse another program's database, so that none writes signoff's tables into a file not its own.
A runtime's store is opened again with the settings it was made with (`unopened_like`).
"""

from __future__ import annotations

import os
import sqlite3
import urllib.parse

from .._exceptions import UsageError
from ..stores import DEFAULT_URL, SQLiteStore, Store, open_store
from ..stores.sqlite._files import beside
from ..stores.sqlite._url import refuse_undecoded

__all__ = ["existing_store", "own_store", "reading_store", "refuse_unmade_schema", "unopened_like"]


def unopened_like(store: Store | str, *, migrate: bool) -> Store | None:
    """A new, unopened SQLite or PostgreSQL store that opens as `store` would but for `migrate`:
    a signoff store's copy, keeping the settings it was made with (a `connect_timeout`, a
    `busy_timeout`), which its URL leaves out; for a URL, or a store of another kind, one made
    from the URL. None for a URL of neither kind."""
    if isinstance(store, SQLiteStore):
        return store._unopened_copy(migrate=migrate)
    url = store if isinstance(store, str) else getattr(store, "url", None)
    if not isinstance(url, str):
        return None
    if url.startswith("sqlite://"):
        return SQLiteStore(url, migrate=migrate)
    if url.startswith(("postgresql://", "postgres://")):
        from ..stores.postgres import PostgresStore  # a UsageError without the extra

        if isinstance(store, PostgresStore):
            return store._unopened_copy(migrate=migrate)
        return PostgresStore(url, migrate=migrate)
    return None


def existing_store(store: str | None) -> str:
    """The store URL a reading command uses; a SQLite file that does not exist is a mistyped
    path (or the wrong directory), refused rather than created empty and reported as empty, and
    one without signoff's schema (empty, or another program's database) is refused too."""
    url = DEFAULT_URL if store is None else store  # "" (an unset variable) is refused
    found = open_store(url)
    if isinstance(found, SQLiteStore) and found.path != ":memory:":
        path = found.path
        refuse_undecoded(url, path)  # a file its %-escapes named before they were decoded
        if not os.path.exists(path):
            raise UsageError(
                f"no store at {path} (from {url}): pass --store or set SIGNOFF_STORE; "
                "serve, worker, chat and db upgrade create one"
            )
        tables = _unmarked(path)
        if tables:
            raise _foreign(path, tables, "pass the store's path with --store or SIGNOFF_STORE")
        if tables is not None:
            raise UsageError(
                f"{path} is not a signoff store (it has no signoff schema): pass the "
                "store's path with --store or SIGNOFF_STORE; serve, worker, chat and db upgrade "
                "create one"
            )
    return url


async def refuse_unmade_schema(store: Store | str) -> None:
    """Refuse, before an answering command (`approve`, `deny`, `answer`) opens it, a PostgreSQL
    store with no signoff schema (a database or `?schema=` mistyped), as `existing_store` refuses
    a SQLite file that is none: opening it would create the whole schema there, and then say the
    request is unknown. The error is the reading commands' (`signoff db upgrade` creates one).
    An older schema is left to the store, which upgrades it as a `Runtime` does."""
    url = store if isinstance(store, str) else getattr(store, "url", None)
    if not isinstance(url, str) or not url.startswith(("postgresql://", "postgres://")):
        return
    from ..stores.postgres import PostgresStore  # a UsageError without the extra

    probe = unopened_like(store, migrate=False)  # a runtime's store: with its settings
    assert isinstance(probe, PostgresStore)
    try:
        if await probe.schema_version() == 0:
            await probe.open()  # with no schema and migrate=False: its SchemaVersionError
    finally:
        await probe.close()


def reading_store(store: Store | str | None) -> Store:
    """The store a command that only reads (`pending`, `sessions`, `events`), or asks before
    it writes (`delete`, `prune`), opens: as `existing_store`, and never upgraded, as that
    would lock out the older processes still using it; an older schema is a
    `SchemaVersionError` saying to run `signoff db upgrade`. A runtime's store (`store_of`) is
    opened with its own settings (`unopened_like`)."""
    if store is None or isinstance(store, str):
        store = url = existing_store(store)
    else:
        url = existing_store(store.url)
    reading = unopened_like(store, migrate=False)
    return open_store(url) if reading is None else reading  # neither kind: its UsageError


def own_store(store: Store | str) -> None:
    """Refuse, before a command creates or upgrades its schema there, a SQLite store (or URL)
    whose file is another program's database: one with tables and no signoff schema mark. A
    new or empty file, and a store of any signoff schema, are left to the store to open."""
    if isinstance(store, str):
        store = open_store(store)
    if isinstance(store, SQLiteStore) and store.path != ":memory:":
        tables = _unmarked(store.path)
        if tables:
            raise _foreign(
                store.path, tables, "give signoff a file of its own (a new path, or an empty file)"
            )


def _foreign(path: str, tables: list[str], what_to_do: str) -> UsageError:
    names = ", ".join(tables[:5]) + (f" and {len(tables) - 5} more" if len(tables) > 5 else "")
    return UsageError(
        f"{path} is not a signoff store but another program's database (tables: {names}): "
        + what_to_do
    )


def _unmarked(path: str) -> list[str] | None:
    """The tables and views of the SQLite file at `path` when it has no signoff schema mark
    (none: an empty file, or one with no table yet), or None when it has the mark or cannot be
    read here (no regular file, not a database, locked): the store then names the fault. A
    file a writer has open is read through its -wal, where its last commits are."""
    if not os.path.isfile(path):  # a folder, a pipe, a device: the store says which
        return None
    if os.path.getsize(path) == 0:
        return []
    wal = os.path.exists(beside(path, "-wal"))
    # as bytes: a path may hold a byte that is not UTF-8, which SQLite takes back from its %XX
    uri = f"file:{urllib.parse.quote(os.fsencode(os.path.abspath(path)))}?mode=ro"
    uri += "" if wal else "&immutable=1"  # no writer: no lock taken, nothing made beside it
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=5, isolation_level=None)
        try:
            conn.execute("BEGIN")  # one snapshot: a store made meanwhile is seen whole or not
            names = [
                name
                for (name,) in conn.execute(
                    "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') "
                    "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name"
                )
            ]
            if "meta" in names:
                try:
                    row = conn.execute("SELECT 1 FROM meta WHERE key='schema'").fetchone()
                except sqlite3.Error:  # a `meta` of another shape: another program's
                    row = None
                if row is not None:
                    return None
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    return names
