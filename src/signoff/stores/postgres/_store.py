"""The PostgreSQL store (`postgresql://…`): psycopg 3, async, over a `psycopg_pool` pool.

Every write is one transaction. A commit is one statement: it locks its session's row (`FOR
UPDATE`), checks the head, the audit chain head and the lease (held `FOR SHARE`, so a takeover
waits for it), compare-and-sets the requests it resolves, then writes events, audit entries,
requests, snapshot and head together and announces itself with `NOTIFY`, all in one round trip
with its BEGIN and COMMIT. Commits that acknowledge an answer are synchronous; the others may
skip the WAL flush (`synchronous_commit=off`), like SQLite's `synchronous=NORMAL`. The schema
lives in its own PostgreSQL schema (`signoff` by default) and is migrated by signoff under an
advisory lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

try:
    import psycopg
    from psycopg import conninfo as _conninfo
    from psycopg import pq
    from psycopg.rows import TupleRow
    from psycopg_pool import AsyncConnectionPool, PoolTimeout
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "PostgreSQL support needs the extra: pip install 'signoff[postgres]'"
    ) from exc

from ..._events import Event, dumps
from ..._exceptions import (
    AppendConflict,
    LeaseLost,
    RequestClosed,
    SchemaVersionError,
    StoreError,
    UnknownSession,
)
from ..._types import InputRequest
from .._audit import AuditEntry, AuditRow, chain_hash, chain_session, loaded_data
from .._base import (
    Commit,
    FaultHook,
    Loaded,
    PendingFilter,
    SessionSummary,
    StoredRequest,
    request_rows,
    stored_request,
)
from .._codec import pack_bytes, unpack, unpack_text
from . import _schema
from ._sql import (
    REQUEST_COLUMNS,
    REQUEST_JOIN,
    TURN,
    commit_sql,
    create_sql,
    event_rows,
    rows_params,
)
from ._url import SCHEMA_NAME, describe, number, split_options

__all__ = ["PostgresStore"]

T = TypeVar("T")
Conn = psycopg.AsyncConnection[TupleRow]


class PostgresStore:
    """`Store` on PostgreSQL (`postgresql://user@host:port/db`); many processes may share it.

    `schema` names the PostgreSQL schema holding signoff's tables. With `migrate=False`, `open()`
    refuses an older schema instead of upgrading it (run `signoff db upgrade`). The URL may carry
    `schema`, `pool_min`, `pool_max` and `pool_timeout` beside libpq's own parameters.
    """

    def __init__(
        self,
        url: str,
        *,
        schema: str | None = None,
        min_size: int | None = None,
        max_size: int | None = None,
        connect_timeout: float = 5.0,
        timeout: float | None = None,
        poll_interval: float = 1.0,
        migrate: bool = True,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("postgresql://", "postgres://")):
            raise StoreError(f"not a PostgreSQL URL: {url!r} (expected postgresql://…)")
        dsn, options = split_options(url)
        schema = schema or options.get("schema") or "signoff"
        if not SCHEMA_NAME.match(schema):
            raise StoreError(f"schema name must be lowercase [a-z0-9_]: {schema!r}")
        self.url = url
        self.schema = schema
        self.channel = f"{schema}_changes"
        self.min_size = min_size or number(options, "pool_min", int, 1)
        self.max_size = max_size or number(options, "pool_max", int, 10)
        if not 1 <= self.min_size <= self.max_size:
            raise StoreError(f"pool sizes need 1 <= min <= max: {self.min_size}, {self.max_size}")
        self.connect_timeout = connect_timeout
        self.timeout = timeout or number(options, "pool_timeout", float, 30.0)
        self.poll_interval = poll_interval
        self.auto_migrate = migrate
        self._dsn = dsn
        self._where = describe(dsn)
        self._pool: AsyncConnectionPool[Conn] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server_async = False
        self._open_lock: asyncio.Lock | None = None
        self._fault: FaultHook | None = None
        self._sk: dict[str, int] = {}
        # session id -> (head, audit_n, audit_hash) as last seen: a commit guesses the session's
        # state from it, so it needs no round trip to read it first; the guess is checked in the
        # statement that writes, under the session's row lock.
        self._state: dict[str, tuple[int, int, bytes | None]] = {}
        self._listener: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()
        self._waiters: dict[str | None, set[asyncio.Future[None]]] = {}
        self._s = f'"{schema}"'

    def __repr__(self) -> str:
        return f"PostgresStore({self._where!r}, schema={self.schema!r})"

    # -- lifecycle ----------------------------------------------------------------------------

    async def open(self) -> None:
        await self._get_pool()

    async def _get_pool(self) -> AsyncConnectionPool[Conn]:
        if self._pool is not None:
            if self._loop is asyncio.get_running_loop():
                return self._pool
            self._abandon()  # e.g. a second asyncio.run(): the old loop took its pool with it
        if self._open_lock is None:
            self._open_lock = asyncio.Lock()
        async with self._open_lock:
            if self._pool is not None:
                return self._pool
            conn = await self._connect()
            try:
                version = await self._read_version(conn)
                self._refuse_newer(version)
                if version < _schema.STORE_SCHEMA:
                    if not self.auto_migrate:
                        raise StoreError(
                            f"PostgreSQL store {self._where} is at store schema version "
                            f"{version}, this signoff needs {_schema.STORE_SCHEMA}: "
                            "run `signoff db upgrade`"
                        )
                    await self._migrate(conn)
                cur = await conn.execute("SELECT current_setting('synchronous_commit')")
                row = await cur.fetchone()
                self._server_async = row is not None and row[0] == "off"
            except psycopg.Error as exc:
                raise StoreError(f"cannot read settings at {self._where}: {exc}") from exc
            finally:
                await conn.close()
            pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
                self._dsn,
                min_size=self.min_size,
                max_size=self.max_size,
                timeout=self.timeout,
                kwargs={"autocommit": True, "connect_timeout": max(1, int(self.connect_timeout))},
                open=False,
                name=f"signoff-{self.schema}",
            )
            try:
                await pool.open(wait=True, timeout=self.timeout)
            except PoolTimeout as exc:
                await pool.close()
                raise StoreError(f"cannot connect to PostgreSQL at {self._where}: {exc}") from exc
            self._pool = pool
            self._loop = asyncio.get_running_loop()
            return pool

    def _abandon(self) -> None:
        """Forget a pool whose event loop is gone; its connections close when collected."""
        self._pool = None
        self._loop = None
        self._open_lock = None
        self._listener = None
        self._listening = asyncio.Event()
        self._waiters.clear()

    async def _connect(self) -> Conn:
        """A fresh autocommit connection, or a `StoreError` saying why there is none."""
        try:
            _conninfo.conninfo_to_dict(self._dsn)
        except psycopg.Error as exc:
            raise StoreError(f"invalid PostgreSQL URL: {exc}".strip()) from exc
        try:
            return await psycopg.AsyncConnection.connect(
                self._dsn,
                autocommit=True,
                connect_timeout=max(1, int(self.connect_timeout)),
            )
        except psycopg.Error as exc:
            detail = str(exc).strip() or type(exc).__name__
            raise StoreError(f"cannot connect to PostgreSQL at {self._where}: {detail}") from exc

    async def close(self) -> None:
        if self._pool is not None and self._loop is not asyncio.get_running_loop():
            self._abandon()
            return
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
        self._listening.clear()
        self._wake_all()
        pool, self._pool = self._pool, None
        self._loop = None
        if pool is not None:
            await pool.close()

    def set_fault_hook(self, hook: FaultHook | None) -> None:
        self._fault = hook

    # -- schema and migrations ----------------------------------------------------------------

    async def schema_version(self) -> int:
        """The store schema version of the database (0 if signoff never ran there)."""
        conn = await self._connect()
        try:
            return await self._read_version(conn)
        finally:
            await conn.close()

    async def migrate(self) -> tuple[int, int]:
        """Bring the database's schema up to `STORE_SCHEMA`; returns (before, after)."""
        conn = await self._connect()
        try:
            return await self._migrate(conn)
        finally:
            await conn.close()

    async def _read_version(self, conn: Conn) -> int:
        try:
            cur = await conn.execute("SELECT to_regclass(%s)", (f"{self._s}.schema_version",))
            row = await cur.fetchone()
            if row is None or row[0] is None:
                return 0
            cur = await conn.execute(
                f"SELECT COALESCE(MAX(version), 0) FROM {self._s}.schema_version"
            )
            row = await cur.fetchone()
        except psycopg.Error as exc:
            raise StoreError(f"cannot read the schema version at {self._where}: {exc}") from exc
        return 0 if row is None else int(row[0])

    def _refuse_newer(self, version: int) -> None:
        if version > _schema.STORE_SCHEMA:
            raise SchemaVersionError(
                f"PostgreSQL store {self._where} (schema {self.schema!r}) is at store schema "
                f"version {version}; this signoff knows up to {_schema.STORE_SCHEMA}. "
                "Upgrade signoff."
            )

    async def _migrate(self, conn: Conn) -> tuple[int, int]:
        s = self._s
        try:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"{s}.migrate",))
                await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
                await conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {s}.schema_version ("
                    "version INTEGER PRIMARY KEY, description TEXT NOT NULL, "
                    "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
                )
                cur = await conn.execute(
                    f"SELECT COALESCE(MAX(version), 0) FROM {s}.schema_version"
                )
                row = await cur.fetchone()
                before = 0 if row is None else int(row[0])
                self._refuse_newer(before)
                for version, description, ddl in _schema.MIGRATIONS:
                    if version <= before:
                        continue
                    await conn.execute(ddl.replace("{s}", s))
                    await conn.execute(
                        f"INSERT INTO {s}.schema_version (version, description) VALUES (%s, %s)",
                        (version, description),
                    )
        except psycopg.Error as exc:
            raise StoreError(f"cannot migrate PostgreSQL store {self._where}: {exc}") from exc
        return before, _schema.STORE_SCHEMA

    # -- running statements -------------------------------------------------------------------

    async def _read(self, body: Callable[[Conn], Awaitable[T]], what: str) -> T:
        """Run a read-only `body`; a lost connection is retried once on a fresh one."""
        pool = await self._get_pool()
        for attempt in range(2):
            broken = False
            try:
                async with _Borrowed(pool) as conn:
                    try:
                        return await body(conn)
                    except psycopg.OperationalError as exc:
                        # libpq may fail to leave pipeline mode on a connection that died
                        # mid-batch before psycopg marks it broken: that is a lost connection.
                        broken = conn.broken or "exit pipeline mode" in str(exc)
                        if broken and not conn.closed:
                            await conn.close()
                        raise
            except PoolTimeout as exc:
                raise StoreError(
                    f"{what}: no PostgreSQL connection at {self._where}: {exc}"
                ) from exc
            except psycopg.OperationalError as exc:
                if broken and attempt == 0:
                    continue
                raise StoreError(f"{what} failed at {self._where}: {exc}") from exc
            except psycopg.Error as exc:
                raise StoreError(f"{what} failed at {self._where}: {exc}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def _write(
        self,
        body: Callable[[Conn], Awaitable[T]],
        what: str,
        *,
        committed: Callable[[], Awaitable[bool]] | None = None,
        synchronous: bool = True,
        transaction: bool = True,
        sets_sync: bool = False,
        single: bool = False,
    ) -> T | None:
        """Run `body` in one pipelined transaction; retried when the connection is lost before
        COMMIT.

        A connection lost during COMMIT leaves the outcome unknown: `committed` (read on a fresh
        connection) decides; without it, or if it cannot tell, the caller gets a `StoreError`.
        Returns None when the write is found committed that way. With `transaction=False`, the
        body is one idempotent autocommit statement, retried whenever the connection is lost.
        With `sets_sync`, the body's statement sets `synchronous_commit` itself
        (`_sync_setting`), which saves a statement. With `single` (and `sets_sync`), the body
        sends one statement, which is a transaction of its own (committed by the pipeline's sync):
        no BEGIN and COMMIT around it, and its outcome is unknown as soon as it is sent.
        """
        pool = await self._get_pool()
        for attempt in range(3):
            phase = "connect"
            broken = False
            try:
                async with _Borrowed(pool) as conn:
                    try:
                        phase = "body"
                        if not transaction:
                            return await body(conn)
                        # BEGIN and COMMIT are sent by hand: what `body` does not wait for
                        # goes out with the COMMIT in one round trip, where psycopg's
                        # `transaction()` in a pipeline would add three syncs.
                        async with conn.pipeline() as pipeline:
                            try:
                                if single:
                                    phase = "commit"  # from here the server may have committed
                                    result = await body(conn)
                                else:
                                    await conn.execute("BEGIN")
                                    if sets_sync:
                                        pass
                                    elif not synchronous:
                                        await conn.execute("SET LOCAL synchronous_commit = off")
                                    elif self._server_async:  # the server skips flushes: not us
                                        await conn.execute("SET LOCAL synchronous_commit = on")
                                    result = await body(conn)
                                    phase = "commit"  # from here the server may have committed
                                    await conn.execute("COMMIT")
                            except psycopg.Error:
                                if not conn.broken:  # leave the aborted pipeline quietly
                                    with contextlib.suppress(psycopg.Error):
                                        await pipeline.sync()
                                raise
                        phase = "done"
                        return result
                    except Exception as exc:
                        if isinstance(exc, psycopg.OperationalError):
                            # libpq may fail to leave pipeline mode on a connection that died
                            # mid-batch before psycopg marks it broken: a lost connection.
                            broken = conn.broken or "exit pipeline mode" in str(exc)
                            if broken and not conn.closed:
                                await conn.close()
                        if not conn.closed and conn.info.transaction_status in _OPEN:
                            # `rollback()`, not a ROLLBACK statement: it also forgets the
                            # statements an aborted pipeline skipped preparing.
                            with contextlib.suppress(psycopg.Error):
                                await conn.rollback()
                        raise
            except PoolTimeout as exc:
                raise StoreError(
                    f"{what}: no PostgreSQL connection at {self._where}: {exc}"
                ) from exc
            except psycopg.OperationalError as exc:
                if not broken:  # the server answered: the transaction was rolled back
                    raise StoreError(f"{what} failed at {self._where}: {exc}") from exc
                if transaction and phase in ("commit", "done"):
                    # The server may or may not have committed before the connection dropped.
                    if committed is not None:
                        try:
                            if await committed():
                                return None
                        except StoreError:
                            pass
                        else:
                            if attempt < 2:
                                continue  # not committed: safe to try again
                    raise StoreError(
                        f"{what}: connection to {self._where} lost during COMMIT; the outcome "
                        f"is unknown: {exc}"
                    ) from exc
                if attempt < 2:
                    continue  # lost before COMMIT (the server rolled back) or idempotent
                raise StoreError(f"{what} failed at {self._where}: {exc}") from exc
            except psycopg.IntegrityError as exc:
                raise AppendConflict(f"{what}: {exc}") from exc
            except psycopg.Error as exc:
                if exc.sqlstate == _CLOSED:
                    request_id = exc.diag.message_detail or ""
                    raise RequestClosed(
                        f"request {request_id} is no longer pending", [request_id]
                    ) from None
                raise StoreError(f"{what} failed at {self._where}: {exc}") from exc
        raise StoreError(f"{what}: connection to {self._where} kept failing")

    def _sync_setting(self, synchronous: bool) -> str | None:
        """The `synchronous_commit` a write's transaction needs, None for the server's."""
        if not synchronous:
            return "off"
        return "on" if self._server_async else None  # the server skips flushes: not for us

    def _remember(self, session_id: str, state: tuple[int, int, bytes | None]) -> None:
        if len(self._state) > 100_000:
            self._state.clear()
        self._state[session_id] = state

    async def _session_key(self, conn: Conn, session_id: str) -> int | None:
        sk = self._sk.get(session_id)
        if sk is None:
            cur = await conn.execute(
                f"SELECT sk FROM {self._s}.sessions WHERE id=%s", (session_id,)
            )
            row = await cur.fetchone()
            if row is None:
                return None
            if len(self._sk) > 100_000:
                self._sk.clear()
            sk = self._sk[session_id] = int(row[0])
        return sk

    # -- writes -------------------------------------------------------------------------------

    async def create_session(
        self, session_id: str, agent: str, events: Sequence[Event], expires_at: float | None
    ) -> None:
        s = self._s
        at = events[0].at
        last = events[-1].seq
        sync = self._sync_setting(True)
        rows = event_rows(events)
        # One statement: the session row, its first events and the announcement.
        sql = create_sql(s, len(rows), sync is not None)
        params: list[Any] = [session_id, agent, last, at, at, expires_at]
        params += rows_params(rows)
        params += [self.channel, f"{session_id} {last}"]
        if sync is not None:
            params.append(sync)

        async def body(conn: Conn) -> None:
            await conn.execute(sql, params)

        async def committed() -> bool:
            return await self._has_events(session_id, events)

        self._before("session.created")
        try:
            await self._write(
                body,
                f"creating session {session_id!r}",
                committed=committed,
                sets_sync=True,
                single=True,
            )
        except AppendConflict as exc:
            cause = exc.__cause__
            if isinstance(cause, psycopg.errors.UniqueViolation) and (
                cause.diag.constraint_name == "sessions_id_key"
            ):
                raise StoreError(f"session {session_id!r} already exists") from None
            raise
        self._remember(session_id, (last, 0, None))
        self._after("session.created")

    async def commit(self, commit: Commit) -> None:
        """One statement writes the whole commit, gated on the session's state: its head, its
        audit chain head (the chain is computed here from a guess of it, `_state`) and the lease,
        read under the session's row lock in that same statement. A wrong guess writes nothing
        and answers the state found, so the commit is sent again from it; a commit with no guess
        reads the state first (locked), as the statement's transaction's first round trip."""
        s = self._s
        sid = commit.session_id
        label = commit.events[0].type if commit.events else "commit"
        token = commit.lease_token
        events = commit.events
        rows = event_rows(events) if events else []
        updated = {
            req.id: pack_bytes(req.model_dump(mode="json", exclude_defaults=True))
            for req in commit.updated_requests
        }  # a request updated twice keeps the last
        new_rows: list[tuple[Any, ...]] = []
        for req, (seq, idx), copy in (
            request_rows(commit, pack_bytes) if commit.new_requests else ()
        ):
            # A new request updated in the same commit is stored with its update.
            data = updated.pop(req.id) if req.id in updated else copy
            new_rows.append(
                (req.id, seq, idx, req.agent, req.kind, req.tool_name, req.created_at, data)
            )
        resolve_rows: list[tuple[Any, ...]] = []
        seen: set[str] = set()
        for i, r in enumerate(commit.resolve):
            # A request resolved twice is closed the second time; one resolved and updated
            # gets both.
            dup = r.request_id in seen
            seen.add(r.request_id)
            data = None if dup else updated.pop(r.request_id, None)
            resolution = pack_bytes(r.resolution)
            resolve_rows.append((r.request_id, r.status, r.outcome, resolution, data, i, dup))
        updated_rows = list(updated.items())
        sync = self._sync_setting(commit.durable)
        ambiguous = False
        guess = self._state.get(sid)

        async def body(conn: Conn) -> psycopg.AsyncCursor[TupleRow] | None:
            state = guess
            if state is None or state[0] != commit.expected_seq:
                cur = await conn.execute(
                    f"SELECT sk, head, audit_n, audit_hash FROM {s}.sessions "
                    "WHERE id=%s FOR UPDATE",
                    (sid,),
                )
                found = await cur.fetchone()
                if found is None:
                    raise UnknownSession(sid)
                sk, head = int(found[0]), int(found[1])
                if head != commit.expected_seq:
                    if ambiguous and await self._events_match(conn, sk, events):
                        return None  # our first attempt did commit after all
                    raise AppendConflict(
                        f"session {sid!r} is at seq {head}, not {commit.expected_seq}"
                    )
                state = (head, int(found[2]), None if found[3] is None else bytes(found[3]))
            n, digest = state[1], state[2]
            audit = chain_session(n, digest, events) if events else []
            if audit:
                n, digest = audit[-1][0], audit[-1][2]
            sql = commit_sql(
                s,
                len(rows),
                len(audit),
                len(new_rows),
                len(resolve_rows),
                len(updated_rows),
                commit.snapshot is not None,
                token is not None,
                commit.release_lease and token is not None,
                sync is not None,
            )
            # In the order of their placeholders in `commit_sql`.
            params: list[Any] = [sid, commit.expected_seq, state[1], state[2]]
            if token is not None:
                params.append(token)
            if resolve_rows:
                params += rows_params(resolve_rows)
            if new_rows:
                params += rows_params(new_rows)
            if updated_rows:
                params += rows_params(updated_rows)
            if events:
                last = events[-1]
                params += rows_params(rows)
                if audit:
                    params += rows_params(audit)
                params += [last.seq, last.at, commit.status, commit.expires_at, n, digest]
                params += [self.channel, f"{sid} {last.seq}"]
            if commit.snapshot is not None:
                params += [commit.snapshot["seq"], pack_bytes(commit.snapshot)]
            if commit.release_lease and token is not None:
                params.append(token)
            if sync is not None:
                params.append(sync)
            written.clear()
            written.append((events[-1].seq if events else state[0], n, digest))
            return await conn.execute(sql, params)

        async def committed() -> bool:
            nonlocal ambiguous
            ambiguous = True
            if not events:
                raise StoreError("cannot tell")
            return await self._has_events(sid, events)

        written: list[tuple[int, int, bytes | None]] = []  # the state after it, if it applies
        self._before(label)
        for _ in range(2):
            cur = await self._write(
                body,
                f"commit to session {sid!r}",
                committed=committed,
                synchronous=commit.durable,
                sets_sync=True,
            )
            if cur is None:  # found committed after a lost connection: state unknown here
                written.clear()
                self._state.pop(sid, None)
                break
            # The statement's answer, the state it found: it came back with the COMMIT's, so
            # reading it needs the connection no more.
            row = await cur.fetchone()
            if row is None:
                self._state.pop(sid, None)
                raise UnknownSession(sid)
            if row[4]:
                break
            head, n, digest = int(row[0]), int(row[2]), None if row[3] is None else bytes(row[3])
            self._remember(sid, (head, n, digest))
            if head != commit.expected_seq:
                if ambiguous and await self._has_events(sid, events):
                    written.clear()  # our first attempt did commit after all
                    break
                raise AppendConflict(f"session {sid!r} is at seq {head}, not {commit.expected_seq}")
            if token is not None and (row[1] is None or int(row[1]) != token):
                raise LeaseLost(f"lease {token} on session {sid!r} was taken over")
            guess = None  # a stale guess of the audit chain head: read it, locked, and again
        else:
            raise StoreError(f"commit to session {sid!r}: its state kept changing")
        if written:
            self._remember(sid, written[-1])
        self._after(label)

    async def record_audit(self, rows: Sequence[AuditRow]) -> None:
        """Append entries that no event carries (tool setting changes)."""
        s = self._s

        async def body(conn: Conn) -> None:
            last: dict[str, tuple[int, str | None]] = {}
            for stream in sorted({row.stream for row in rows}):
                # No session row serializes these streams: lock each one for this transaction.
                await conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (stream,))
                cur = await conn.execute(
                    f"SELECT n, hash FROM {s}.audit WHERE stream=%s ORDER BY n DESC LIMIT 1",
                    (stream,),
                )
                found = await cur.fetchone()
                last[stream] = (
                    (0, None) if found is None else (int(found[0]), bytes(found[1]).hex())
                )
            for row in rows:
                n, prev = last[row.stream]
                n += 1
                digest = chain_hash(
                    prev, stream=row.stream, n=n, type=row.type, at=row.at, seq=None, data=row.data
                )
                await conn.execute(
                    f"INSERT INTO {s}.audit (stream, n, type, at, data, hash) "
                    "VALUES (%s,%s,%s,%s,%s::json,%s)",
                    (row.stream, n, row.type, row.at, dumps(row.data), bytes.fromhex(digest)),
                )
                last[row.stream] = (n, digest)

        await self._write(body, "recording audit entries")

    async def audit(
        self, *, stream: str | None = None, after_id: int = 0, limit: int = 1000
    ) -> list[AuditEntry]:
        s = self._s

        async def body(conn: Conn) -> list[AuditEntry]:
            # An entry of a session's event keeps only its place and hash: its type, time and
            # data are read from the event, so the chain also covers the event log itself;
            # `prev` is the hash of the entry before it in its stream.
            sql = (
                "SELECT a.id, COALESCE(x.id, a.stream), a.n, COALESCE(e.type, a.type), "
                "COALESCE(e.at, a.at), a.seq, a.sk, a.data::text, e.data, "
                f"COALESCE(p.hash, q.hash), a.hash FROM {s}.audit a "
                f"LEFT JOIN {s}.sessions x ON x.sk = a.sk "
                f"LEFT JOIN {s}.events e ON e.sk = a.sk AND e.seq = a.seq "
                f"LEFT JOIN {s}.audit p ON a.sk IS NOT NULL AND p.sk = a.sk AND p.n = a.n - 1 "
                f"LEFT JOIN {s}.audit q ON a.stream IS NOT NULL AND q.stream = a.stream "
                "AND q.n = a.n - 1 WHERE a.id>%s"
            )
            params: list[Any] = [after_id]
            if stream is not None:
                sk = await self._session_key(conn, stream)
                sql += " AND a.stream=%s" if sk is None else " AND a.sk=%s"
                params.append(stream if sk is None else sk)
            sql += " ORDER BY a.id LIMIT %s"
            params.append(limit)
            cur = await conn.execute(sql, params)
            return [
                AuditEntry(
                    id=int(i),
                    stream=st,
                    n=int(n),
                    type=t if t is not None else "",
                    at=float(at) if at is not None else 0.0,
                    seq=None if seq is None else int(seq),
                    data=loaded_data(
                        own if ask is None else None if ev is None else unpack_text(ev)
                    ),
                    prev=None if prev is None else bytes(prev).hex(),
                    hash=bytes(h).hex(),
                )
                for i, st, n, t, at, seq, ask, own, ev, prev, h in await cur.fetchall()
            ]

        return await self._read(body, "reading the audit trail")

    async def _has_events(self, session_id: str, events: Sequence[Event]) -> bool:
        """Whether exactly these events are stored (after a COMMIT whose outcome is unknown)."""

        async def body(conn: Conn) -> bool:
            sk = await self._session_key(conn, session_id)
            return sk is not None and await self._events_match(conn, sk, events)

        return await self._read(body, f"checking session {session_id!r}")

    async def _events_match(self, conn: Conn, sk: int, events: Sequence[Event]) -> bool:
        if not events:
            return False
        cur = await conn.execute(
            f"SELECT e.seq, e.type, {TURN.format(s=self._s)}, e.at, e.v, e.data "
            f"FROM {self._s}.events e WHERE e.sk=%s AND e.seq BETWEEN %s AND %s ORDER BY e.seq",
            (sk, events[0].seq, events[-1].seq),
        )
        rows = await cur.fetchall()
        if len(rows) != len(events):
            return False
        return all(
            (int(seq), type_, turn or None, float(at), int(v), unpack(data))
            == (e.seq, e.type, e.turn_id, e.at, e.v, e.data)
            for (seq, type_, turn, at, v, data), e in zip(rows, events, strict=True)
        )

    def _before(self, label: str) -> None:
        if self._fault is not None:
            self._fault("before", label)

    def _after(self, label: str) -> None:
        if self._fault is not None:
            self._fault("after", label)

    # -- reads --------------------------------------------------------------------------------

    async def load(self, session_id: str) -> Loaded | None:
        s = self._s

        async def body(conn: Conn) -> Loaded | None:
            cur = await conn.execute(
                f"SELECT s.sk, s.agent, n.seq, n.data, s.head, s.audit_n, s.audit_hash "
                f"FROM {s}.sessions s LEFT JOIN {s}.snapshots n ON n.sk = s.sk WHERE s.id=%s",
                (session_id,),
            )
            row = await cur.fetchone()
            if row is None:
                return None
            sk, agent = int(row[0]), str(row[1])
            self._sk[session_id] = sk
            # What the next commit to it guesses (checked by that commit).
            digest = None if row[6] is None else bytes(row[6])
            self._remember(session_id, (int(row[4]), int(row[5]), digest))
            after = 0 if row[2] is None else int(row[2])
            snapshot = None if row[3] is None else unpack(row[3])
            events = await self._events(conn, session_id, sk, after, None, None)
            return Loaded(session_id=session_id, agent=agent, snapshot=snapshot, events=events)

        return await self._read(body, f"loading session {session_id!r}")

    async def read_events(
        self,
        session_id: str,
        after: int = 0,
        *,
        limit: int | None = None,
        types: Sequence[str] | None = None,
        newest: int | None = None,
    ) -> list[Event]:
        async def body(conn: Conn) -> list[Event]:
            sk = await self._session_key(conn, session_id)
            if sk is None:
                raise UnknownSession(session_id)
            return await self._events(conn, session_id, sk, after, limit, types, newest)

        return await self._read(body, f"reading events of session {session_id!r}")

    async def _events(
        self,
        conn: Conn,
        session_id: str,
        sk: int,
        after: int,
        limit: int | None,
        types: Sequence[str] | None,
        newest: int | None = None,
    ) -> list[Event]:
        sql = (
            f"SELECT e.seq, e.type, {TURN.format(s=self._s)}, e.at, e.v, e.data "
            f"FROM {self._s}.events e WHERE e.sk=%s AND e.seq>%s"
        )
        params: list[Any] = [sk, after]
        if types:
            sql += " AND e.type = ANY(%s)"
            params.append(list(types))
        if newest is not None:  # the newest `newest` of them, still oldest first
            sql = f"SELECT * FROM ({sql} ORDER BY e.seq DESC LIMIT %s) AS t ORDER BY seq"
            params.append(newest)
        else:
            sql += " ORDER BY e.seq"
        if limit is not None:
            sql += " LIMIT %s"
            params.append(limit)
        cur = await conn.execute(sql, params)
        return [
            Event.from_row(
                session_id=session_id,
                seq=int(seq),
                type=type_,
                turn_id=turn or None,
                at=float(at),
                v=int(v),
                data=unpack(data),
            )
            for seq, type_, turn, at, v, data in await cur.fetchall()
        ]

    async def head(self, session_id: str) -> int | None:
        async def body(conn: Conn) -> int | None:
            cur = await conn.execute(
                f"SELECT head FROM {self._s}.sessions WHERE id=%s", (session_id,)
            )
            row = await cur.fetchone()
            return None if row is None else int(row[0])

        return await self._read(body, f"reading the head of session {session_id!r}")

    async def get_request(self, request_id: str) -> StoredRequest | None:
        async def body(conn: Conn) -> StoredRequest | None:
            cur = await conn.execute(
                f"SELECT {REQUEST_COLUMNS}, r.outcome, r.resolution FROM {self._s}.requests r "
                f"{REQUEST_JOIN.format(s=self._s)} WHERE r.id=%s",
                (request_id,),
            )
            row = await cur.fetchone()
            if row is None:
                return None
            return StoredRequest(
                request=stored_request(row[0], row[1], row[2], row[3], unpack),
                status=row[3],
                outcome=row[4],
                resolution=None if row[5] is None else unpack(row[5]),
            )

        return await self._read(body, f"reading request {request_id!r}")

    def _filter_sql(self, flt: PendingFilter) -> tuple[str, list[Any]]:
        return flt.where("%s")

    async def pending(self, flt: PendingFilter) -> list[InputRequest]:
        clause, params = self._filter_sql(flt)
        s = self._s

        async def body(conn: Conn) -> list[InputRequest]:
            cur = await conn.execute(
                f"SELECT {REQUEST_COLUMNS} FROM {s}.requests r "
                f"{REQUEST_JOIN.format(s=s)}{clause} "
                'ORDER BY r.created_at, r.id COLLATE "C" LIMIT %s OFFSET %s',
                [*params, flt.limit, flt.offset],
            )
            rows = await cur.fetchall()
            return [stored_request(own, ev, i, st, unpack) for own, ev, i, st in rows]

        return await self._read(body, "listing pending requests")

    async def count_pending(self, flt: PendingFilter) -> int:
        clause, params = self._filter_sql(flt)
        s = self._s

        async def body(conn: Conn) -> int:
            cur = await conn.execute(
                f"SELECT COUNT(*) FROM {s}.requests r JOIN {s}.sessions s ON s.sk=r.sk{clause}",
                params,
            )
            row = await cur.fetchone()
            return 0 if row is None else int(row[0])

        return await self._read(body, "counting pending requests")

    # -- leases -------------------------------------------------------------------------------

    async def sessions(
        self,
        *,
        agent: str | None = None,
        status: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[SessionSummary]:
        """Sessions, most recently active first."""
        s = self._s
        where: list[str] = []
        params: list[Any] = []
        for column, value in (("agent", agent), ("status", status)):
            if value is not None:
                where.append(f"{column}=%s")
                params.append(value)
        clause = (" WHERE " + " AND ".join(where)) if where else ""

        async def body(conn: Conn) -> list[SessionSummary]:
            cur = await conn.execute(
                f"SELECT id, agent, status, head, created_at, updated_at, expires_at "
                f"FROM {s}.sessions{clause} ORDER BY updated_at DESC, sk DESC LIMIT %s OFFSET %s",
                [*params, limit, offset],
            )
            return [
                SessionSummary(
                    id=i,
                    agent=a,
                    status=st,
                    head=int(h),
                    created_at=float(c),
                    updated_at=float(u),
                    expires_at=None if x is None else float(x),
                )
                for i, a, st, h, c, u, x in await cur.fetchall()
            ]

        return await self._read(body, "listing sessions")

    async def claim(self, owner: str, ttl: float, now: float, limit: int) -> list[tuple[str, int]]:
        """Lease up to `limit` sessions with work and no live lease, skipping rows another
        worker is claiming right now (`FOR UPDATE SKIP LOCKED`): `(id, token)` each."""
        s = self._s

        async def body(conn: Conn) -> list[tuple[str, int]]:
            cur = await conn.execute(
                f"WITH c AS (SELECT s.sk FROM {s}.sessions s "
                f"LEFT JOIN {s}.leases l ON l.sk = s.sk "
                "WHERE s.status = 'running' "
                "AND (l.sk IS NULL OR l.owner = '' OR l.expires_at < %s) "
                "ORDER BY s.updated_at LIMIT %s FOR UPDATE OF s SKIP LOCKED) "
                f"INSERT INTO {s}.leases AS l (sk, owner, token, expires_at) "
                "SELECT sk, %s, 1, %s FROM c ON CONFLICT (sk) DO UPDATE "
                "SET owner=excluded.owner, token=l.token + 1, expires_at=excluded.expires_at "
                # re-checked on the latest row: an acquire_lease may have won meanwhile
                "WHERE l.owner = '' OR l.expires_at < %s "
                f"RETURNING (SELECT x.id FROM {s}.sessions x WHERE x.sk = l.sk), l.token",
                (now, limit, owner, now + ttl, now),
            )
            return [(str(i), int(t)) for i, t in await cur.fetchall()]

        return await self._write(body, "claiming runnable sessions") or []

    async def acquire_lease(
        self, session_id: str, owner: str, ttl: float, now: float
    ) -> int | None:
        s = self._s

        async def body(conn: Conn) -> int | None:
            # One statement: no row if the session is unknown, a NULL token if the lease is live.
            cur = await conn.execute(
                f"WITH x AS (SELECT sk FROM {s}.sessions WHERE id=%s), "
                f"i AS (INSERT INTO {s}.leases AS l (sk, owner, token, expires_at) "
                "SELECT sk, %s, 1, %s FROM x ON CONFLICT (sk) DO UPDATE "
                "SET owner=excluded.owner, token=l.token + 1, expires_at=excluded.expires_at "
                "WHERE l.owner = '' OR l.owner = excluded.owner OR l.expires_at <= %s "
                "RETURNING token) "
                "SELECT (SELECT token FROM i) FROM x",
                (session_id, owner, now + ttl, now),
            )
            row = await cur.fetchone()
            if row is None:
                raise UnknownSession(session_id)
            return None if row[0] is None else int(row[0])

        return await self._write(
            body, f"acquiring the lease on session {session_id!r}", transaction=False
        )

    async def renew_lease(
        self, session_id: str, owner: str, token: int, ttl: float, now: float
    ) -> bool:
        async def body(conn: Conn) -> bool:
            sk = await self._session_key(conn, session_id)
            if sk is None:
                return False
            cur = await conn.execute(
                f"UPDATE {self._s}.leases SET expires_at=%s WHERE sk=%s AND owner=%s AND token=%s",
                (now + ttl, sk, owner, token),
            )
            return cur.rowcount == 1

        renewed = await self._write(
            body, f"renewing the lease on session {session_id!r}", transaction=False
        )
        return bool(renewed)

    async def release_lease(self, session_id: str, owner: str, token: int) -> None:
        async def body(conn: Conn) -> None:
            sk = await self._session_key(conn, session_id)
            if sk is None:
                return
            # A session released with work left (a worker stopping) wakes the other workers.
            await conn.execute(
                f"WITH r AS (UPDATE {self._s}.leases SET owner='', expires_at=0 "
                "WHERE sk=%s AND owner=%s AND token=%s RETURNING sk) "
                f"SELECT pg_notify(%s, %s) FROM r JOIN {self._s}.sessions s ON s.sk = r.sk "
                "WHERE s.status = 'running'",
                (sk, owner, token, self.channel, f"{session_id} 0"),
            )

        await self._write(body, f"releasing the lease on session {session_id!r}", transaction=False)

    # -- change notifications -----------------------------------------------------------------

    async def wait_for_change(
        self, session_id: str | None, timeout: float, *, after: int | None = None
    ) -> bool:
        """Wait until a commit to `session_id` (any session if None) is announced, or a lease
        on a session with work left is released.

        Returns True on a change (or a possibly missed one: the listener reconnected), False on
        timeout. Given `after`, it returns at once if the session's head is already past it, and
        re-checks the head every `poll_interval`, so a lost notification only delays a wake-up.
        """
        await self._get_pool()
        self._ensure_listener()
        if not self._listening.is_set():
            # The first wait: let the listener subscribe first, so no change slips past it.
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow the caller's
            # cancellation, which left a cancelled ChannelHub waiting here for ever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(timeout, self.timeout)):
                    await self._listening.wait()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        waiters = self._waiters.setdefault(session_id, set())
        waiters.add(fut)
        deadline = time.monotonic() + timeout
        try:
            while True:
                if after is not None and session_id is not None:
                    head = await self.head(session_id)
                    if head is None:
                        raise UnknownSession(session_id)
                    if head > after:
                        return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                slice_ = remaining if after is None else min(remaining, self.poll_interval)
                try:
                    async with asyncio.timeout(slice_):
                        await asyncio.shield(fut)
                    return True
                except TimeoutError:
                    continue
        finally:
            waiters.discard(fut)
            if not waiters:
                self._waiters.pop(session_id, None)

    def _ensure_listener(self) -> None:
        if self._listener is None or self._listener.done():
            self._listener = asyncio.get_running_loop().create_task(
                self._listen(), name=f"signoff-listen-{self.schema}"
            )

    async def _listen(self) -> None:
        """Keep one connection LISTENing; on reconnect, wake everyone: they may have missed some."""
        delay = 0.1
        while True:
            try:
                conn = await self._connect()
            except StoreError:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            try:
                await conn.execute(f'LISTEN "{self.channel}"')
                self._listening.set()
                self._wake_all()
                delay = 0.1
                async for note in self._notes(conn):
                    sid, _, _seq = note.rpartition(" ")
                    self._wake(sid)
            except psycopg.Error:
                pass
            finally:
                self._listening.clear()
                with contextlib.suppress(Exception):
                    await conn.close()
            await asyncio.sleep(delay)

    @staticmethod
    async def _notes(conn: Conn) -> AsyncIterator[str]:
        async for note in conn.notifies():
            yield note.payload

    def _wake(self, session_id: str) -> None:
        for key in (session_id, None):
            for fut in self._waiters.get(key, ()):
                if not fut.done():
                    fut.set_result(None)

    def _wake_all(self) -> None:
        for waiters in self._waiters.values():
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    # -- sizes (benchmarks, dashboard) --------------------------------------------------------

    async def database_bytes(self) -> int:
        """Bytes on disk of signoff's tables and indexes in this schema."""

        async def body(conn: Conn) -> int:
            cur = await conn.execute(
                "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relkind = 'r'",
                (self.schema,),
            )
            row = await cur.fetchone()
            return 0 if row is None else int(row[0])

        return await self._read(body, "measuring the database")


_OPEN = (pq.TransactionStatus.INTRANS, pq.TransactionStatus.INERROR)
"""A connection's transaction states that need a ROLLBACK before it goes back to the pool."""

_CLOSED = "SO409"
"""SQLSTATE of `request_closed()`: a resolved request was no longer pending."""


class _Borrowed:
    """A connection of the pool for one store call: `getconn()`, then `putconn()`. Lighter than
    the pool's `connection()`, whose `async with conn` commits or rolls back an autocommit
    connection (nothing to do: `_write` rolls back the transactions it opens, and the pool would
    roll back any other it is handed)."""

    __slots__ = ("conn", "pool")

    def __init__(self, pool: AsyncConnectionPool[Conn]) -> None:
        self.pool = pool

    async def __aenter__(self) -> Conn:
        self.conn = await self.pool.getconn()
        return self.conn

    async def __aexit__(self, *exc: object) -> None:
        await self.pool.putconn(self.conn)
