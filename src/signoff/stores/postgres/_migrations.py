"""The PostgreSQL store's schema as its connections see it: the version read, the migrations
applied under an advisory lock (`_schema` holds them), and what a current schema lacks."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import psycopg

from ..._exceptions import SchemaVersionError, StoreError, StoreUnavailable
from . import _schema
from ._outage import unreachable
from ._transactions import Conn, Transactions, failed

__all__ = ["Migrations"]


class Migrations(Transactions):
    """`schema_version`, `schema_missing` and `migrate`, and how a connection just made names
    its failure (`_opening_failed`): the part of `Connections` that reads and changes the
    schema itself."""

    _s: str  # the schema's name, quoted
    _server: str  # the server, as an error names it

    if TYPE_CHECKING:  # `Connections._connect`

        async def _connect(self) -> Conn: ...

    async def schema_version(self) -> int:
        """The store schema version of the database (0 if signoff never ran there)."""
        conn = await self._connect()
        try:
            return await self._read_version(conn)
        finally:
            await conn.close()

    async def schema_missing(self) -> list[str]:
        """The tables, indexes and functions of this signoff's schema that the database's
        schema lacks (`db status`)."""
        conn = await self._connect()
        try:
            return await _schema.names_missing(conn, self.schema)
        except psycopg.Error as exc:
            raise self._opening_failed("cannot read the schema", exc) from exc
        finally:
            await conn.close()

    async def _lacking(self) -> list[str]:
        """What `schema_missing` names, read when a statement found a table missing (`_gone`):
        only for a schema at this signoff's version (a schema gone, or older, is migrated by
        opening it anew), and none when that cannot be read (the server down, say)."""
        try:
            async with asyncio.timeout(self.operation_timeout):
                conn = await self._connect()
                try:
                    if await self._read_version(conn) != _schema.STORE_SCHEMA:
                        return []
                    return await _schema.names_missing(conn, self.schema)
                finally:
                    await conn.close()
        except (psycopg.Error, StoreError, TimeoutError):
            return []

    async def migrate(self) -> tuple[int, int]:
        """Bring the database's schema up to `STORE_SCHEMA`; returns (before, after). A schema
        already there needs nothing created, so a user that may only use it can run this too."""
        conn = await self._connect()
        try:
            version = await self._read_version(conn)
            self._refuse_newer(version)
            if version == _schema.STORE_SCHEMA:
                return version, version
            return await self._migrate(conn)
        finally:
            await conn.close()

    async def _read_version(self, conn: Conn) -> int:
        try:
            cur = await conn.execute(
                "SELECT t.oid, ARRAY(SELECT attname::text FROM pg_attribute WHERE attrelid = t.oid "
                "AND attnum > 0 AND NOT attisdropped ORDER BY attnum) "
                "FROM (SELECT to_regclass(%s) AS oid) t",
                (f"{self._s}.schema_version",),
            )
            row = await cur.fetchone()
            if row is None or row[0] is None:
                return 0
            if not {"version", "description", "applied_at"} <= set(row[1]):
                # Another program's table (a schema shared with it): its numbers are no
                # store schema, and "upgrade signoff" would be the wrong advice.
                raise StoreError(
                    f"PostgreSQL store {self._server} (schema {self.schema!r}) holds a table "
                    f"schema_version that is not signoff's (columns {', '.join(row[1])}): "
                    "another program's; give signoff a schema of its own (?schema=NAME)"
                )
            cur = await conn.execute(
                f"SELECT COALESCE(MAX(version), 0) FROM {self._s}.schema_version"
            )
            row = await cur.fetchone()
        except psycopg.Error as exc:
            raise self._opening_failed("cannot read the schema version", exc) from exc
        return 0 if row is None else int(row[0])

    def _opening_failed(self, what: str, exc: psycopg.Error) -> StoreError:
        """A statement of a connection just made failed: `StoreUnavailable` if the server is
        not there (the connection lost, or a proxy's answer that it cannot reach it), as when
        the connection itself is refused; a `StoreError` otherwise."""
        detail = " ".join(str(exc).split()) or type(exc).__name__
        if unreachable(exc):
            return StoreUnavailable(f"PostgreSQL unavailable at {self._where}: {what}: {detail}")
        if isinstance(exc, psycopg.errors.InsufficientPrivilege):
            # "permission denied for schema x" named the object, not the grants signoff needs
            return StoreError(
                f"{what} at {self._server} (schema {self.schema!r}): {detail}. This user may not "
                f"use schema {self.schema!r}: grant it USAGE on the schema, SELECT, INSERT, "
                "UPDATE and DELETE on its tables and USAGE on its sequences (or connect as "
                "its owner)"
            )
        return failed(f"{what} at {self._where}", exc)

    def _refuse_newer(self, version: int) -> None:
        if version > _schema.STORE_SCHEMA:
            raise SchemaVersionError(
                f"PostgreSQL store {self._server} (schema {self.schema!r}) is at store schema "
                f"version {version}; this signoff knows up to {_schema.STORE_SCHEMA}. "
                "Upgrade signoff."
            )

    async def _migrate(self, conn: Conn) -> tuple[int, int]:
        s = self._s
        try:
            # READ COMMITTED whatever a DBA's default: the version is read after the lock is
            # granted, and a stricter snapshot, taken as the lock's statement began, would miss
            # the migrations another process committed while this one waited for it.
            await conn.set_isolation_level(psycopg.IsolationLevel.READ_COMMITTED)
            async with conn.transaction():
                # A DBA's timeouts bound an application's statements, not its upgrade: one that
                # ended it (a fill's Python work over many rows idle in the transaction, the
                # wait for another process's migration) would fail every opening the same way.
                await conn.execute(
                    "SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = 0; "
                    "SET LOCAL idle_in_transaction_session_timeout = 0"
                )
                await conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"{s}.migrate",))
                before = await _schema.locked_version(conn, self.schema, s)
                self._refuse_newer(before)
                if before == _schema.STORE_SCHEMA:  # another process upgraded it meanwhile
                    return before, before  # nothing created: a role that may only use it
                taken = await _schema.names_taken(conn, self.schema, before)
                if taken:  # before anything is made: on the first, PostgreSQL named it alone
                    why = _schema.shared(self.schema, taken)
                    raise StoreError(f"cannot migrate PostgreSQL store {self._where}: {why}")
                # Created only if missing: PostgreSQL checks the right to create schemas in the
                # database even for one that exists, which the owner of a schema a DBA made
                # for it (`CREATE SCHEMA ... AUTHORIZATION`) need not have.
                cur = await conn.execute(
                    "SELECT 1 FROM pg_namespace WHERE nspname = %s", (self.schema,)
                )
                if await cur.fetchone() is None:
                    await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
                await conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {s}.schema_version ("
                    "version INTEGER PRIMARY KEY, description TEXT NOT NULL, "
                    "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
                )
                for version, description, ddl in _schema.MIGRATIONS:
                    if version <= before:
                        continue
                    await conn.execute(ddl.replace("{s}", s))
                    fill = _schema.FILLS.get(version)
                    if fill is not None:
                        await fill(conn, s)
                    await conn.execute(
                        f"INSERT INTO {s}.schema_version (version, description) VALUES (%s, %s)",
                        (version, description),
                    )
        except psycopg.errors.InsufficientPrivilege as exc:
            raise StoreError(
                f"cannot migrate PostgreSQL store {self._where}: {exc}. This user may not create "
                f"or change schema {self.schema!r}: run `signoff db upgrade` as one that may, then "
                "grant this one USAGE on the schema, SELECT, INSERT, UPDATE and DELETE on its "
                "tables and USAGE on its sequences"
            ) from exc
        except psycopg.Error as exc:
            raise StoreError(f"cannot migrate PostgreSQL store {self._where}: {exc}") from exc
        return before, _schema.STORE_SCHEMA
