"""What only the PostgreSQL store has: URLs and connections, migrations, lost connections, NOTIFY.

Everything the `Store` protocol promises is tested once for both stores in
test_store_conformance.py; this file covers what is specific to PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

import signoff as so
from signoff import _audit_trail as audit_trail
from signoff._audit_requests import request_rows
from signoff._audit_trail import entries as trail_entries
from signoff._events import Event, dumps
from signoff._exceptions import SchemaVersionError, StoreError, StoreUnavailable, UsageError
from signoff.stores import Commit, PendingFilter, Resolve, open_store
from signoff.stores._audit import AuditRow
from signoff.stores.postgres import MIGRATIONS, STORE_SCHEMA, PostgresStore

from ._pg_events import T0, ev, new_session
from ._pg_syncs import seen_syncs, watch_syncs
from ._relay import Relay
from ._shipping import shipping_agent
from .conftest import PgCluster, _free_port


@pytest.fixture
async def pg(pg_store_url: str) -> AsyncIterator[PostgresStore]:
    store = PostgresStore(pg_store_url)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def admin(url: str) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(url, autocommit=True)


# -- URLs and connections --------------------------------------------------------------------


def test_open_store_selects_postgres_by_url() -> None:
    for url in ("postgresql://u@127.0.0.1:5432/db", "postgres://u@127.0.0.1/db"):
        store = open_store(url)
        assert isinstance(store, PostgresStore) and store.url == url
    with pytest.raises(UsageError):
        open_store("mysql://u@h/db")


def test_not_a_postgres_url_or_schema() -> None:
    with pytest.raises(StoreError, match="not a PostgreSQL URL"):
        PostgresStore("sqlite:///x.db")
    with pytest.raises(UsageError, match="schema name"):  # an argument: the developer's misuse
        PostgresStore("postgresql://u@h/db", schema="Robert'); DROP TABLE")


async def test_malformed_url_is_a_store_error() -> None:
    # An option libpq does not know is refused as soon as the store is made, before any open.
    with pytest.raises(StoreError, match="invalid PostgreSQL URL"):
        PostgresStore("postgresql://u@127.0.0.1:5432/db?no_such_option=1")
    store = PostgresStore("postgresql://u@127.0.0.1:notaport/db")
    with pytest.raises(StoreError) as info:
        await store.open()
    assert "notaport" in str(info.value)


async def test_unreachable_server_is_a_store_error_without_the_password() -> None:
    port = _free_port()  # nothing listens there
    store = PostgresStore(f"postgresql://alice:s3cret-pw@127.0.0.1:{port}/db", connect_timeout=2)
    with pytest.raises(StoreError) as info:
        await store.open()
    message = str(info.value)
    assert f"cannot connect to PostgreSQL at postgresql://alice@127.0.0.1:{port}/db" in message
    assert "refused" in message.lower()
    assert "s3cret-pw" not in message
    assert isinstance(info.value.__cause__, psycopg.OperationalError)


async def test_unreachable_server_through_the_runtime() -> None:
    agent = so.Agent(name="a", model=so.models.Scripted([so.ModelResponse(text="hi")]))
    rt = so.Runtime([agent], store=f"postgresql://postgres@127.0.0.1:{_free_port()}/db")
    with pytest.raises(StoreError, match="cannot connect"):
        await rt.generate("a", prompt="hello")
    await rt.close()


async def test_missing_database_is_a_store_error(pg_cluster: PgCluster) -> None:
    store = PostgresStore(pg_cluster.url("no_such_database_here"))
    with pytest.raises(StoreError, match="no_such_database_here"):
        await store.open()


async def test_a_pooled_connection_prepares_a_statement_the_first_time_it_runs(
    pg_store_url: str,
) -> None:
    # psycopg's default prepares a statement on its 6th run per connection, so the first turns
    # on each connection of the pool paid for parsing and planning every statement again.
    store = PostgresStore(pg_store_url, min_size=1, max_size=1)
    await store.open()
    try:
        await new_session(store)
        pool = await store._get_pool()
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT statement FROM pg_prepared_statements")
            prepared = [str(row[0]) for row in await cur.fetchall()]
    finally:
        await store.close()
    assert any("INSERT INTO" in sql and ".events" in sql for sql in prepared), prepared


# -- schema and migrations -------------------------------------------------------------------


async def test_migrations_create_the_schema_once(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    assert await store.schema_version() == 0
    await store.open()
    await store.close()
    assert await store.schema_version() == STORE_SCHEMA == len(MIGRATIONS)
    assert await store.migrate() == (STORE_SCHEMA, STORE_SCHEMA)  # idempotent
    conn = await admin(pg_url)
    async with conn:
        cur = await conn.execute("SELECT version FROM signoff.schema_version ORDER BY version")
        assert [r[0] for r in await cur.fetchall()] == [v for v, _, _ in MIGRATIONS]
        cur = await conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema='signoff'"
        )
        tables = {r[0] for r in await cur.fetchall()}
        assert {"events", "leases", "requests", "schema_version", "sessions", "snapshots"} <= tables


async def _write_old_events(
    conn: psycopg.AsyncConnection[Any], schema: str, sk: int, events: list[Event]
) -> None:
    """Events as migrations 1-2 stored them: JSON data, every row naming its turn."""
    for e in events:
        await conn.execute(
            f"INSERT INTO {schema}.events (sk, seq, type, turn, at, v, data) "
            "VALUES (%s,%s,%s,%s,%s,%s,%s::json)",
            (sk, e.seq, e.type, e.turn_id, e.at, e.v, dumps(e.data)),
        )


async def test_an_older_schema_is_upgraded_in_place(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database left at migration 1, with a session written as that code wrote it, is
    migrated forward when a store opens it, with its data intact."""
    import signoff.stores.postgres._schema as module

    older = PostgresStore(pg_url)
    monkeypatch.setattr(module, "MIGRATIONS", MIGRATIONS[:1])
    monkeypatch.setattr(module, "STORE_SCHEMA", MIGRATIONS[0][0])
    assert await older.migrate() == (0, MIGRATIONS[0][0])
    monkeypatch.undo()
    sid = f"ses_{uuid.uuid4().hex[:20]}"
    created = Event(session_id=sid, seq=1, type="session.created", at=T0, turn_id=None, data={})
    waiting = Event(session_id=sid, seq=3, type="session.waiting", at=T0, turn_id=None, data={})
    first = [created, ev(sid, 2, "turn.message", text="hi"), waiting]  # no turn after a turn
    conn = await admin(pg_url)
    async with conn:
        cur = await conn.execute(
            "INSERT INTO signoff.sessions (id, agent, head, status, created_at, updated_at) "
            "VALUES (%s, 'support', 3, 'idle', %s, %s) RETURNING sk",
            (sid, T0, T0),
        )
        row = await cur.fetchone()
        assert row is not None
        await _write_old_events(conn, "signoff", row[0], first)
    assert await PostgresStore(pg_url, migrate=False).schema_version() == MIGRATIONS[0][0]
    with pytest.raises(StoreError, match="signoff db upgrade"):
        await PostgresStore(pg_url, migrate=False).open()
    newer = PostgresStore(pg_url)
    await newer.open()
    try:
        assert await newer.schema_version() == STORE_SCHEMA
        assert await newer.read_events(sid) == first
        await newer.commit(Commit(session_id=sid, expected_seq=3, events=[ev(sid, 4)]))
        assert await newer.read_events(sid) == [*first, ev(sid, 4)]
        assert await newer.head(sid) == 4
    finally:
        await newer.close()


async def test_a_schema_4_database_learns_its_tool_setting_chain_heads(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Schema 4 kept no head for a tool-setting stream: migration 5 takes each one's last entry
    as its head, so entries removed from its end afterwards are named."""
    import signoff.stores.postgres._schema as module

    monkeypatch.setattr(module, "MIGRATIONS", [m for m in MIGRATIONS if m[0] <= 4])
    monkeypatch.setattr(module, "STORE_SCHEMA", 4)
    older = PostgresStore(pg_url)
    await older.open()
    try:
        for new in ("Always", "Never"):
            row = AuditRow(stream="tools:a.t", type="t", at=T0, seq=None, data={"new": new})
            await older.record_audit([row])
        entries = await older.audit(stream="tools:a.t")
    finally:
        await older.close()
    monkeypatch.undo()
    conn = await admin(pg_url)
    async with conn:
        await conn.execute("DELETE FROM signoff.audit WHERE n = 0")  # as schema 4 wrote it
    store = PostgresStore(pg_url, migrate=False)
    assert await store.migrate() == (4, STORE_SCHEMA)
    await store.open()
    try:
        assert await store.audit_heads() == {"tools:a.t": (2, entries[-1].hash)}
    finally:
        await store.close()
    conn = await admin(pg_url)
    async with conn:
        await conn.execute("DELETE FROM signoff.audit WHERE id = %s", (entries[-1].id,))
    async with so.Runtime([], store=pg_url) as rt:
        problems = await rt.verify_audit()
        assert [(p.id, p.stream, p.n) for p in problems] == [(entries[0].id, "tools:a.t", 2)]


async def test_rows_written_at_schema_2_read_back_the_same_after_the_upgrade(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Migration 3 converts the rows of a schema-2 database (JSON columns, requests with their
    own copies, audit entries with hex hashes and `prev`, turn ids on every row, NULL for none):
    `signoff db upgrade` keeps every event, request, snapshot and audit entry as it read before,
    and the session goes on from there with its audit chains intact."""
    import signoff.stores.postgres._schema as module

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        return {"refunded": amount}

    def step(messages: list[Any]) -> so.ModelResponse:
        if messages[-1].kind == "tool":
            return so.ModelResponse(text="Refunded, " + "x" * 300)
        call = so.ToolCall(name="issue_refund", input={"order_id": "1042", "amount": 180.0})
        return so.ModelResponse(tool_calls=[call])

    agent = so.Agent(
        name="support",
        model=so.models.Scripted([step], repeat_last=True),
        tools=[issue_refund],
    )

    # The reference: a session on the current schema (its own PostgreSQL schema), one turn
    # approved and a second one parked, plus the tool-setting stream the runtime records.
    rt = so.Runtime([agent], store=pg_url + "?schema=reference")
    try:
        r = await rt.generate("support", prompt="Refund order 1042, it arrived broken. " * 8)
        sid = r.session_id
        r = await rt.generate(
            session_id=sid, approvals=[so.Decision(id=r.pending[0].id, approved=True)]
        )
        assert r.status == "completed"
        snapshot = (await rt.state(sid)).to_snapshot()
        r = await rt.generate(session_id=sid, prompt="And order 1043 too.")
        assert r.status == "waiting"
        parked = r.pending[0].id
    finally:
        await rt.close()
    reference = PostgresStore(pg_url, schema="reference")
    try:
        events = await reference.read_events(sid)
        entries = await reference.audit()
        pending = await reference.pending(PendingFilter())
        ids = [
            raw["id"] for e in events if e.type == "input.requested" for raw in e.data["requests"]
        ]
        requests = {i: await reference.get_request(i) for i in ids}
    finally:
        await reference.close()
    assert (
        len(ids) == 2
        and len(pending) == 1
        and {e.stream for e in entries}
        == {
            sid,
            "tools:support.issue_refund",
        }
    )
    assert any(e.turn_id is None for e in events) and any(e.turn_id for e in events)

    # The same rows written the way the schema-2 code wrote them.
    monkeypatch.setattr(module, "MIGRATIONS", MIGRATIONS[:2])
    monkeypatch.setattr(module, "STORE_SCHEMA", 2)
    assert await PostgresStore(pg_url).migrate() == (0, 2)
    monkeypatch.undo()
    conn = await admin(pg_url)
    async with conn:
        cur = await conn.execute(
            "INSERT INTO signoff.sessions (id, agent, head, status, created_at, updated_at) "
            "VALUES (%s, 'support', %s, 'waiting', %s, %s) RETURNING sk",
            (sid, events[-1].seq, events[0].at, events[-1].at),
        )
        row = await cur.fetchone()
        assert row is not None
        sk = row[0]
        await _write_old_events(conn, "signoff", sk, events)
        await conn.execute(
            "INSERT INTO signoff.snapshots (sk, seq, data) VALUES (%s, %s, %s::json)",
            (sk, snapshot["seq"], dumps(snapshot)),
        )
        for i, stored in requests.items():
            assert stored is not None
            req = stored.request
            await conn.execute(
                "INSERT INTO signoff.requests (id, sk, agent, kind, tool, status, created_at, "
                "outcome, data, resolution) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s::json,%s::json)",
                (
                    i,
                    sk,
                    req.agent,
                    req.kind,
                    req.tool_name,
                    stored.status,
                    req.created_at,
                    stored.outcome,
                    dumps(req.model_dump(mode="json", exclude_defaults=True, exclude={"status"})),
                    None if stored.resolution is None else dumps(stored.resolution),
                ),
            )
        # with the reference's ids (the head rows it keeps leave gaps between them)
        for entry in entries:
            await conn.execute(
                "INSERT INTO signoff.audit (id, stream, n, type, at, seq, data, prev, hash) "
                "OVERRIDING SYSTEM VALUE VALUES (%s,%s,%s,%s,%s,%s,%s::json,%s,%s)",
                (
                    entry.id,
                    entry.stream,
                    entry.n,
                    entry.type,
                    entry.at,
                    entry.seq,
                    "null" if entry.seq is not None else dumps(entry.data),
                    entry.prev,
                    entry.hash,
                ),
            )
        await conn.execute(
            "SELECT setval(pg_get_serial_sequence('signoff.audit', 'id'), MAX(id)) "
            "FROM signoff.audit"
        )

    # `signoff db upgrade`, then everything reads back as the reference does.
    store = PostgresStore(pg_url, migrate=False)
    assert await store.migrate() == (2, STORE_SCHEMA)
    try:
        assert await store.read_events(sid) == events
        assert [e.to_dict() for e in await store.audit()] == [e.to_dict() for e in entries]
        assert [e.to_dict() for e in await store.audit(stream=sid)] == [
            e.to_dict() for e in entries if e.stream == sid
        ]
        assert await store.pending(PendingFilter()) == pending
        assert {i: await store.get_request(i) for i in ids} == requests
        loaded = await store.load(sid)
        assert loaded is not None and loaded.snapshot == snapshot
        assert loaded.events == [e for e in events if e.seq > snapshot["seq"]]
    finally:
        await store.close()

    # The session goes on: the parked request is answered, the chains continue unbroken.
    rt = so.Runtime([agent], store=pg_url)
    try:
        assert await rt.verify_audit() == []
        r = await rt.generate(session_id=sid, approvals=[so.Decision(id=parked, approved=True)])
        assert r.status == "completed" and r.text.startswith("Refunded")
        assert await rt.pending() == []
        assert await rt.verify_audit() == []
        chain = [e for e in await rt.audit(session_id=sid)]
        assert [e.n for e in chain] == list(range(1, len(chain) + 1))
        assert len(chain) > len([e for e in entries if e.stream == sid])
        after = [e async for e in rt.events(sid, follow=False)]
        assert after[: len(events)] == events
    finally:
        await rt.close()


async def test_concurrent_first_opens_migrate_once(pg_url: str) -> None:
    stores = [PostgresStore(pg_url) for _ in range(6)]
    await asyncio.gather(*(s.open() for s in stores))
    try:
        sid = await new_session(stores[0])
        assert await stores[5].head(sid) == 1
    finally:
        for s in stores:
            await s.close()
    conn = await admin(pg_url)
    async with conn:
        cur = await conn.execute("SELECT COUNT(*) FROM signoff.schema_version")
        assert (await cur.fetchone()) == (STORE_SCHEMA,)


async def test_schemas_keep_stores_apart(pg_url: str) -> None:
    a, b = PostgresStore(pg_url), PostgresStore(pg_url, schema="tenant_b")
    c = open_store(f"{pg_url}?connect_timeout=3&schema=tenant_c&pool_max=3")
    assert isinstance(c, PostgresStore)
    assert (c.schema, c.max_size, c.url) == (
        "tenant_c",
        3,
        f"{pg_url}?connect_timeout=3&schema=tenant_c&pool_max=3",
    )
    for s in (a, b, c):
        await s.open()
    try:
        sid = await new_session(a)
        assert await b.head(sid) is None and await c.head(sid) is None
        assert len({a.channel, b.channel, c.channel}) == 3
    finally:
        for s in (a, b, c):
            await s.close()
    conn = await admin(pg_url)
    async with conn:
        cur = await conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname IN ('signoff','tenant_b','tenant_c') "
            "ORDER BY 1"
        )
        assert [r[0] for r in await cur.fetchall()] == ["signoff", "tenant_b", "tenant_c"]


def test_bad_url_options() -> None:
    with pytest.raises(StoreError, match="pool_max"):
        PostgresStore("postgresql://u@h/db?pool_max=many")
    with pytest.raises(StoreError, match="pool_timeout"):
        PostgresStore("postgresql://u@h/db?pool_timeout=-1")
    with pytest.raises(StoreError, match="pool sizes"):
        PostgresStore("postgresql://u@h/db?pool_min=5&pool_max=2")
    with pytest.raises(StoreError, match="schema name"):
        PostgresStore("postgresql://u@h/db?schema=Bad-Name")


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN", "infinity"])
@pytest.mark.parametrize(
    "option", ["pool_timeout", "request_pool_timeout", "outage_grace", "operation_timeout"]
)
def test_url_options_in_seconds_must_be_finite(option: str, value: str) -> None:
    """`?pool_timeout=nan` was taken as a number of seconds (NaN is not <= 0), leaving every
    wait for the pool or the outage grace to compare against NaN; it is a named StoreError."""
    with pytest.raises(StoreError, match=f"{option} must be a positive, finite number"):
        PostgresStore(f"postgresql://u@h/db?{option}={value}")


async def test_newer_schema_version_is_refused(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    await store.open()
    sid = await new_session(store)
    await store.close()
    conn = await admin(pg_url)
    async with conn:
        await conn.execute(
            "INSERT INTO signoff.schema_version (version, description) VALUES (%s, 'future')",
            (STORE_SCHEMA + 1,),
        )
    newer = PostgresStore(pg_url)
    with pytest.raises(SchemaVersionError, match=f"version {STORE_SCHEMA + 1}") as info:
        await newer.open()
    assert "Upgrade signoff" in str(info.value)
    with pytest.raises(SchemaVersionError):
        await newer.migrate()
    with pytest.raises(SchemaVersionError):
        await newer.head(sid)  # every entry point opens first, and refuses
    with pytest.raises(SchemaVersionError):
        await PostgresStore(pg_url, migrate=False).open()
    rt = so.Runtime([], store=pg_url)
    with pytest.raises(SchemaVersionError):
        await rt.open()
    await rt.close()


async def test_a_user_that_may_not_create_the_schema(pg_url: str) -> None:
    """A user without CREATE on the database is told to have the schema migrated by one that
    may; once it is (and this one granted its use), it opens, writes, and `signoff db upgrade`
    as this user says the schema is up to date rather than failing on the CREATE it skips."""
    role = f"app_{uuid.uuid4().hex[:8]}"
    params = conninfo_to_dict(pg_url)
    app_url = f"postgresql://{role}@{params['host']}:{params['port']}/{params['dbname']}"
    conn = await admin(pg_url)
    async with conn:
        await conn.execute(f'CREATE ROLE "{role}" LOGIN')
        try:
            for attempt in (PostgresStore(app_url).open, PostgresStore(app_url).migrate):
                with pytest.raises(StoreError, match="may not create") as info:
                    await attempt()
                assert "signoff db upgrade" in str(info.value)
            assert await PostgresStore(pg_url).migrate() == (0, STORE_SCHEMA)
            await conn.execute(
                f'GRANT USAGE ON SCHEMA signoff TO "{role}"; '
                "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA signoff "
                f'TO "{role}"; '
                f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA signoff TO "{role}"'
            )
            assert await PostgresStore(app_url).migrate() == (STORE_SCHEMA, STORE_SCHEMA)
            store = PostgresStore(app_url)
            try:
                sid = await new_session(store)
                await store.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)]))
                assert [e.seq for e in await store.read_events(sid)] == [1, 2]
            finally:
                await store.close()
        finally:
            await conn.execute(f'DROP OWNED BY "{role}"; DROP ROLE "{role}"')


async def test_a_client_encoding_set_by_a_dba_does_not_limit_the_text_stored(
    pg_store_url: str,
) -> None:
    """A database (or role) whose client_encoding is LATIN1 made any id, agent or filter outside
    Latin-1 a raw UnicodeEncodeError (a 500 over HTTP); signoff's connections speak UTF-8."""
    conn = await admin(pg_store_url)
    async with conn:
        await conn.execute(
            f"ALTER DATABASE \"{conn.info.dbname}\" SET client_encoding = 'LATIN1'".encode()
        )
    store = PostgresStore(pg_store_url)
    try:
        assert await store.head("ses_\u4e2d\U0001f600") is None
        sid = f"ses_{uuid.uuid4().hex[:8]}_\u4e2d"
        await store.create_session(sid, "agent_\u4e2d", [ev(sid, 1, "session.created")], None)
        assert await store.head(sid) == 1
        loaded = await store.load(sid)
        assert loaded is not None and loaded.agent == "agent_\u4e2d"
        assert await store.pending(PendingFilter(agent="\u4e2d")) == []
        assert await store.wait_for_change(sid, 0.05) is False  # the listener connects too
    finally:
        await store.close()


async def test_float_digits_set_by_a_dba_do_not_round_the_times_read_back(
    pg_store_url: str,
) -> None:
    """With `extra_float_digits = 0` (a role's or database's), PostgreSQL sends doubles rounded
    to 15 digits: events read back differed from those written (`time.time()` has 16 or 17),
    and a commit whose acknowledgement was lost was not recognised as committed."""
    conn = await admin(pg_store_url)
    async with conn:
        await conn.execute(
            f'ALTER DATABASE "{conn.info.dbname}" SET extra_float_digits = 0'.encode()
        )
    store = PostgresStore(pg_store_url)
    try:
        sid = await new_session(store)
        written = Event(session_id=sid, seq=2, type="turn.started", at=1764522615.1234567)
        await store.commit(Commit(session_id=sid, expected_seq=1, events=[written]))
        assert (await store.read_events(sid))[1] == written
        assert await store._has_events(sid, [written])  # how a lost COMMIT is checked
    finally:
        await store.close()


async def test_without_auto_migrate_an_old_schema_is_refused(pg_url: str) -> None:
    store = PostgresStore(pg_url, migrate=False)
    with pytest.raises(StoreError, match="signoff db upgrade"):
        await store.open()
    assert await store.migrate() == (0, STORE_SCHEMA)
    await store.open()
    try:
        assert await new_session(store)
    finally:
        await store.close()


@pytest.mark.parametrize("server_default", ["on", "off"])
async def test_durable_commits_flush_the_others_need_not(
    pg_store_url: str, server_default: str
) -> None:
    """An acknowledged answer is flushed before COMMIT returns, whatever the server's default;
    other commits skip the flush (as SQLite's synchronous=NORMAL does)."""
    await watch_syncs(pg_store_url, server_default)
    store = PostgresStore(pg_store_url)
    await store.open()
    try:
        sid = await new_session(store)
        await store.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)]))
        await store.commit(
            Commit(session_id=sid, expected_seq=2, events=[ev(sid, 3)], durable=True)
        )
    finally:
        await store.close()
    assert await seen_syncs(pg_store_url) == [(1, "on"), (2, "off"), (3, "on")]


# -- lost connections ------------------------------------------------------------------------


async def _backend_waiting(
    conn: psycopg.AsyncConnection[Any],
    what: str,
    skip: set[int] | None = None,
    *,
    sleeping: bool = False,
) -> int:
    """The pid of the one backend (not ours, not in `skip`) whose current query matches `what`;
    with `sleeping`, only once it waits in `pg_sleep` (a COMMIT that only started may still
    see the stall turned off and go through)."""
    for _ in range(500):
        cur = await conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
            "AND state = 'active' AND query LIKE %s"
            + (" AND wait_event = 'PgSleep'" if sleeping else ""),
            (what,),
        )
        rows = [int(r[0]) for r in await cur.fetchall() if int(r[0]) not in (skip or set())]
        if len(rows) == 1:
            return rows[0]
        await asyncio.sleep(0.01)
    raise AssertionError(f"no backend running {what!r}")


async def test_connection_killed_mid_transaction_is_retried_cleanly(
    pg: PostgresStore, pg_store_url: str
) -> None:
    sid = await new_session(pg)
    holder, observer = await admin(pg_store_url), await admin(pg_store_url)
    async with holder, observer:
        # Hold the session row, so the commit stops inside its transaction, then kill it there.
        await holder.execute("BEGIN")
        await holder.execute("SELECT 1 FROM signoff.sessions WHERE id=%s FOR UPDATE", (sid,))
        commit = asyncio.create_task(
            pg.commit(
                Commit(
                    session_id=sid,
                    expected_seq=1,
                    events=[ev(sid, 2, "model.completed"), ev(sid, 3, "tool.started")],
                )
            )
        )
        pid = await _backend_waiting(observer, "%FOR UPDATE%")
        await observer.execute("SELECT pg_terminate_backend(%s)", (pid,))
        # Retried on a fresh connection: now waiting for the row again, in another backend.
        await _backend_waiting(observer, "%FOR UPDATE%", skip={pid})
        assert not commit.done()
        await holder.execute("COMMIT")
        await asyncio.wait_for(commit, 10)
    assert [e.seq for e in await pg.read_events(sid)] == [1, 2, 3]
    assert await pg.head(sid) == 3


@pytest.fixture
async def slow_commit(pg: PostgresStore, pg_store_url: str) -> AsyncIterator[str]:
    """Make COMMIT of an event insert sleep (a deferred trigger) while `stall` says so."""
    conn = await admin(pg_store_url)
    async with conn:
        await conn.execute(
            """
            CREATE TABLE public.stall (n INT NOT NULL);
            CREATE FUNCTION public.stall_commit() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF EXISTS (SELECT 1 FROM public.stall WHERE n > 0) THEN
                    PERFORM pg_sleep(30);
                END IF;
                RETURN NULL;
            END $$;
            CREATE CONSTRAINT TRIGGER stall AFTER INSERT ON signoff.events
                DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.stall_commit();
            """
        )
    yield pg_store_url


async def _kill_stalled_commits(url: str, times: int) -> asyncio.Task[int]:
    """Make commits stall, then (in a task) terminate each backend stalled in COMMIT, `times`
    times; the last one is killed after stalling is turned off, so later commits go through."""
    conn = await admin(url)
    async with conn:
        await conn.execute("INSERT INTO public.stall VALUES (1)")
    return asyncio.create_task(_killer(url, times))


async def _killer(url: str, times: int) -> int:
    conn = await admin(url)
    killed: set[int] = set()
    async with conn:
        while len(killed) < times:
            pid = await _backend_waiting(conn, "%COMMIT%", skip=killed, sleeping=True)
            if len(killed) == times - 1:
                await conn.execute("DELETE FROM public.stall")
            await conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            killed.add(pid)
    return len(killed)


async def test_connection_killed_during_commit_is_checked_then_retried(
    pg: PostgresStore, slow_commit: str
) -> None:
    sid = await new_session(pg)
    killer = await _kill_stalled_commits(slow_commit, 1)
    await asyncio.wait_for(
        pg.commit(
            Commit(
                session_id=sid,
                expected_seq=1,
                events=[ev(sid, 2, "tool.started"), ev(sid, 3, "tool.completed")],
            )
        ),
        20,
    )
    assert await killer == 1
    # The killed COMMIT rolled back; the store saw nothing stored, retried, and wrote it once.
    assert [e.type for e in await pg.read_events(sid)] == [
        "session.created",
        "tool.started",
        "tool.completed",
    ]


async def test_connection_lost_every_time_is_a_store_error_and_writes_nothing(
    pg: PostgresStore, slow_commit: str
) -> None:
    sid = await new_session(pg)
    killer = await _kill_stalled_commits(slow_commit, 3)
    with pytest.raises(StoreError, match="lost during COMMIT|kept failing"):
        await asyncio.wait_for(
            pg.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)])), 20
        )
    assert await killer == 3
    assert await pg.head(sid) == 1
    assert [e.seq for e in await pg.read_events(sid)] == [1]
    # The store is still usable afterwards.
    await pg.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)]))
    assert await pg.head(sid) == 2


async def test_runtime_turn_survives_a_killed_connection(
    pg_store_url: str, slow_commit: str
) -> None:
    runs: list[str] = []

    agent = shipping_agent(runs)
    rt = so.Runtime([agent], store=pg_store_url)
    try:
        r = await rt.generate("a", prompt="ship 7")
        assert r.status == "waiting"
        killer = await _kill_stalled_commits(slow_commit, 2)
        r = await asyncio.wait_for(
            rt.generate(
                session_id=r.session_id,
                approvals=[so.Decision(id=r.pending[0].id, approved=True)],
            ),
            30,
        )
        assert await killer == 2
        assert r.status == "completed" and r.text == "Shipped."
        assert runs == ["7"]
        events = [e async for e in rt.events(r.session_id, follow=False)]
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert [e.type for e in events].count("approval.settled") == 1
        assert [e.type for e in events].count("tool.completed") == 1
    finally:
        await rt.close()


async def test_commit_whose_acknowledgement_is_lost_is_found_committed(
    pg: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server commits, then the connection drops before the client hears so: the store
    reads the session back, finds its own events, and neither fails nor writes them twice."""
    real_pipeline = psycopg.AsyncConnection.pipeline
    lost: list[str] = []

    @contextlib.asynccontextmanager
    async def pipeline_then_drop(
        self: psycopg.AsyncConnection[Any],
    ) -> AsyncIterator[psycopg.AsyncPipeline]:
        # The pipeline closes with the COMMIT answered; then the connection drops.
        async with real_pipeline(self) as pipeline:
            yield pipeline
        if len(lost) < 2:
            assert self.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            lost.append("dropped")
            self.pgconn.finish()
            raise psycopg.OperationalError("server closed the connection unexpectedly (test)")

    monkeypatch.setattr(psycopg.AsyncConnection, "pipeline", pipeline_then_drop)
    sid = await new_session(pg)  # create_session takes the same path
    events = [ev(sid, 2, "tool.started"), ev(sid, 3, "tool.completed", result={"ok": True})]
    await pg.commit(Commit(session_id=sid, expected_seq=1, events=events))
    monkeypatch.undo()
    assert lost == ["dropped", "dropped"]
    assert await pg.read_events(sid) == [ev(sid, 1, "session.created"), *events]


def _drop_after_pipeline(monkeypatch: pytest.MonkeyPatch, times: int) -> list[str]:
    """Make the next `times` pipelines lose their connection just after the COMMIT was
    answered: the server committed, the client never heard so."""
    real_pipeline = psycopg.AsyncConnection.pipeline
    lost: list[str] = []

    @contextlib.asynccontextmanager
    async def pipeline_then_drop(
        self: psycopg.AsyncConnection[Any],
    ) -> AsyncIterator[psycopg.AsyncPipeline]:
        async with real_pipeline(self) as pipeline:
            yield pipeline
        if len(lost) < times:
            lost.append("dropped")
            self.pgconn.finish()
            raise psycopg.OperationalError("server closed the connection unexpectedly (test)")

    monkeypatch.setattr(psycopg.AsyncConnection, "pipeline", pipeline_then_drop)
    return lost


async def test_a_claim_whose_acknowledgement_is_lost_returns_what_it_claimed(
    pg: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim committed, then its connection dropped before the worker heard so: the worker
    gets the sessions it leased, rather than a `StoreError` that left them leased to it,
    unworked, until the lease lapsed (30 s by default) and any worker claimed them again."""
    sids = [await new_session(pg) for _ in range(2)]
    for sid in sids:
        await pg.commit(
            Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)], status="running")
        )
    lost = _drop_after_pipeline(monkeypatch, 1)
    claimed = await pg.claim("w1", 30, T0, 10)
    monkeypatch.undo()
    assert lost == ["dropped"]
    assert sorted(claimed) == sorted((sid, 1) for sid in sids)
    assert await pg.claim("w2", 30, T0 + 1, 10) == []  # leased once, to w1
    for sid in sids:  # its tokens are the live ones
        assert await pg.renew_lease(sid, "w1", 1, 30, T0 + 1) is True


async def test_a_claim_lost_before_it_committed_is_retried(
    pg: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With nothing leased to it at the time it set, a claim whose outcome was unknown did not
    commit: it is sent again, and claims the session once."""
    sid = await new_session(pg)
    await pg.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)], status="running"))
    real_execute = psycopg.AsyncConnection.execute
    dropped: list[str] = []

    async def drop_the_commit(
        self: psycopg.AsyncConnection[Any], query: Any, *a: Any, **k: Any
    ) -> Any:
        if query == "COMMIT" and not dropped:  # lost as COMMIT is sent: it never arrives
            dropped.append("dropped")
            self.pgconn.finish()
            raise psycopg.OperationalError("server closed the connection unexpectedly (test)")
        return await real_execute(self, query, *a, **k)

    monkeypatch.setattr(psycopg.AsyncConnection, "execute", drop_the_commit)
    claimed = await pg.claim("w1", 30, T0, 10)
    monkeypatch.undo()
    assert dropped == ["dropped"]
    assert claimed == [(sid, 1)]


async def test_refused_commits_leave_their_connection_clean(pg_store_url: str) -> None:
    """Commits refused by the server (a request no longer pending, raised inside the pipeline)
    or by the store (a stale head) roll back and leave the connection usable: many of each, past
    psycopg's prepare threshold, alternating with good commits on one pooled connection."""
    store = PostgresStore(pg_store_url, max_size=1)
    await store.open()
    try:
        sid = await new_session(store)
        head = 1
        closed: list[str] = []
        for _ in range(12):
            events = [ev(sid, head + 1), ev(sid, head + 2, "tool.started")]
            closing = Resolve(request_id="req_gone", status="settled", outcome="ok", resolution={})
            with pytest.raises(so.RequestClosed, match="req_gone") as info:
                await store.commit(
                    Commit(session_id=sid, expected_seq=head, events=events, resolve=[closing])
                )
            closed += info.value.request_ids
            with pytest.raises(so.AppendConflict):
                await store.commit(Commit(session_id=sid, expected_seq=head - 1, events=events))
            await store.commit(Commit(session_id=sid, expected_seq=head, events=events))
            head += 2
        assert closed == ["req_gone"] * 12
        assert [e.seq for e in await store.read_events(sid)] == list(range(1, head + 1))
        assert [e.n for e in await store.audit(stream=sid)] == list(range(1, 13))
    finally:
        await store.close()


async def test_claim_does_not_steal_a_lease_taken_while_it_ran(
    pg: PostgresStore, pg_store_url: str
) -> None:
    sid = await new_session(pg)
    await pg.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)], status="running"))
    old = await pg.acquire_lease(sid, "w0", 1, T0)  # expires at T0 + 1
    assert old is not None
    holder = await admin(pg_store_url)
    async with holder:
        # Another worker takes the expired lease over, and has not committed yet.
        await holder.execute("BEGIN")
        await holder.execute(
            "UPDATE signoff.leases SET owner='w1', token=token+1, expires_at=%s", (T0 + 100,)
        )
        claim = asyncio.create_task(pg.claim("w2", 10, T0 + 5, 10))
        observer = await admin(pg_store_url)
        async with observer:
            await _backend_waiting(observer, "%SKIP LOCKED%")
        await holder.execute("COMMIT")
        assert await asyncio.wait_for(claim, 10) == []  # re-checked: the lease is live now
    assert await pg.acquire_lease(sid, "w2", 10, T0 + 5) is None


async def test_a_lease_is_granted_with_the_head_of_a_commit_it_waited_for(
    pg: PostgresStore, pg_store_url: str
) -> None:
    """The head kept with a lease is the newest: an acquire that waits for a drive's last
    commit (which moves the head and frees the lease) keeps the head that commit left, not the
    one its statement's snapshot saw."""
    sid = await new_session(pg)
    held = await pg.acquire_lease(sid, "w0", 10, T0)
    assert held is not None
    assert await pg.acquire_lease(sid, "w1", 10, T0) is None  # live: not granted
    holder = await admin(pg_store_url)
    async with holder:
        # A commit in flight, as `commit_sql` runs it: the session row, then the lease row.
        await holder.execute("BEGIN")
        await holder.execute("SELECT 1 FROM signoff.sessions WHERE id=%s FOR UPDATE", (sid,))
        await holder.execute("UPDATE signoff.sessions SET head=2 WHERE id=%s", (sid,))
        await holder.execute("UPDATE signoff.leases SET owner='', expires_at=0")
        acquire = asyncio.create_task(pg.acquire_lease(sid, "w1", 10, T0))
        observer = await admin(pg_store_url)
        async with observer:
            await _backend_waiting(observer, "%INSERT INTO%leases%")
        await holder.execute("COMMIT")
        assert await asyncio.wait_for(acquire, 10) == held + 1
    assert pg.granted_head(sid, held + 1) == 2 == await pg.head(sid)


async def test_the_head_at_a_grant_is_given_once_and_only_for_its_token(
    pg: PostgresStore,
) -> None:
    sid = await new_session(pg)
    await pg.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)], status="running"))
    ((got, token),) = await pg.claim("w1", 10, T0, 10)
    assert got == sid
    assert pg.granted_head(sid, token + 1) is None  # not this grant's: forgotten too
    assert pg.granted_head(sid, token) is None
    await pg.release_lease(sid, "w1", token)
    ((_, token),) = await pg.claim("w1", 10, T0, 10)
    assert pg.granted_head(sid, token) == 2
    assert pg.granted_head(sid, token) is None  # once
    assert await pg.acquire_lease(sid, "w2", 10, T0) is None  # held: nothing kept
    assert pg.granted_head(sid, token + 1) is None
    assert pg.granted_head("ses_unknown", 1) is None


async def test_a_drive_reads_the_head_with_its_lease_not_after_it(pg_store_url: str) -> None:
    """On PostgreSQL the lease's statement answers the session's head, so a drive whose state
    is cached reads no head at all: not before it (the lease answered it), nor after it (its
    last commit gave the lease back, so its own state is the store's as of then)."""
    agent = so.Agent(
        name="a", model=so.models.Scripted([so.ModelResponse(text="hi")] * 3), tools=[]
    )
    rt = so.Runtime([agent], store=pg_store_url)
    try:
        r = await rt.generate("a", prompt="one")
        assert r.status == "completed"
        store = rt.store
        assert isinstance(store, PostgresStore)
        heads: list[str] = []
        real_head = store.head

        async def head(session_id: str) -> int | None:
            heads.append(session_id)
            return await real_head(session_id)

        store.head = head  # type: ignore[method-assign]
        r = await rt.generate(session_id=r.session_id, prompt="two")
        assert r.status == "completed" and r.text == "hi"
        assert heads == []
        assert [e.type for e in await store.read_events(r.session_id)].count("turn.completed") == 2
    finally:
        await rt.close()


async def test_a_worker_drive_reads_the_head_with_its_claim_not_after_it(
    pg_store_url: str,
) -> None:
    """A worker's claim keeps each session's head, and a drive whose last commit gave the lease
    back keeps its own state: its drives read no head."""
    agent = so.Agent(
        name="a", model=so.models.Scripted([so.ModelResponse(text="hi")] * 3), tools=[]
    )
    async with (
        so.Runtime([agent], store=pg_store_url, inline=False) as front,
        so.Runtime([agent], store=pg_store_url, inline=False) as worker,
    ):
        sid = await front.create_session("a")
        heads: list[str] = []
        real_head = worker.store.head

        async def head(session_id: str) -> int | None:
            heads.append(session_id)
            return await real_head(session_id)

        worker.store.head = head  # type: ignore[method-assign]
        stop = asyncio.Event()
        working = asyncio.create_task(worker.work(stop=stop, idle_wait=0.05, sweep_every=3600))
        try:
            for turns, prompt in enumerate(("one", "two"), 1):
                await front.generate(session_id=sid, prompt=prompt)
                for _ in range(1000):
                    events = [e.type for e in await front.store.read_events(sid)]
                    if events.count("turn.completed") == turns:
                        break
                    await asyncio.sleep(0.01)
                assert events.count("turn.completed") == turns
                await asyncio.sleep(0.1)  # time for a look at the head after the drive, if any
        finally:
            stop.set()
            await asyncio.wait_for(working, 30)
        assert heads == []


# -- LISTEN/NOTIFY ---------------------------------------------------------------------------


async def test_each_commit_is_notified_with_session_and_seq(
    pg: PostgresStore, pg_store_url: str
) -> None:
    sid = await new_session(pg)
    conn = await admin(pg_store_url)
    async with conn:
        await conn.execute(f'LISTEN "{pg.channel}"')
        await pg.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2), ev(sid, 3)]))
        sid2 = await new_session(pg)
        payloads = [n.payload async for n in conn.notifies(timeout=5, stop_after=2)]
    assert payloads == [f"{sid} 3", f"{sid2} 1"]


async def test_releasing_a_session_with_work_wakes_workers(
    pg: PostgresStore, pg_store_url: str
) -> None:
    idle = await new_session(pg)
    busy = await new_session(pg)
    await pg.commit(Commit(session_id=busy, expected_seq=1, events=[ev(busy, 2)], status="running"))
    t_idle = await pg.acquire_lease(idle, "w1", 10, T0)
    t_busy = await pg.acquire_lease(busy, "w1", 10, T0)
    assert t_idle is not None and t_busy is not None
    conn = await admin(pg_store_url)
    async with conn:
        await conn.execute(f'LISTEN "{pg.channel}"')
        await pg.release_lease(busy, "w2", t_busy)  # not the owner: nothing released
        await pg.release_lease(idle, "w1", t_idle)  # no work left: nobody to wake
        await pg.release_lease(busy, "w1", t_busy)
        payloads = [n.payload async for n in conn.notifies(timeout=0.5)]
    assert payloads == [f"{busy} 0"]


async def test_a_failed_commit_notifies_nothing(pg: PostgresStore, pg_store_url: str) -> None:
    sid = await new_session(pg)
    conn = await admin(pg_store_url)
    async with conn:
        await conn.execute(f'LISTEN "{pg.channel}"')
        with pytest.raises(so.StoreError):
            await pg.commit(Commit(session_id=sid, expected_seq=7, events=[ev(sid, 8)]))
        assert [n async for n in conn.notifies(timeout=0.3)] == []


async def test_waiters_survive_a_killed_listener(pg: PostgresStore, pg_store_url: str) -> None:
    sid = await new_session(pg)
    assert await pg.wait_for_change(sid, 0.05) is False  # starts the listener
    conn = await admin(pg_store_url)
    async with conn:
        cur = await conn.execute(
            "SELECT pid FROM pg_stat_activity "
            "WHERE query LIKE 'LISTEN%%' AND pid <> pg_backend_pid()"
        )
        rows = await cur.fetchall()
        assert len(rows) == 1
        waiting = asyncio.create_task(pg.wait_for_change(sid, 10))
        await asyncio.sleep(0.05)
        await conn.execute("SELECT pg_terminate_backend(%s)", (rows[0][0],))
        # Woken by the reconnect: a notification may have been missed meanwhile.
        assert await asyncio.wait_for(waiting, 10) is True
    for _ in range(200):  # the listener is back and delivers again
        waiting = asyncio.create_task(pg.wait_for_change(sid, 10))
        await asyncio.sleep(0.05)
        if waiting.done():
            continue
        head = await pg.head(sid)
        assert head is not None
        await pg.commit(Commit(session_id=sid, expected_seq=head, events=[ev(sid, head + 1)]))
        assert await asyncio.wait_for(waiting, 10) is True
        break
    else:
        raise AssertionError("the listener never came back")


async def test_a_listen_connection_gone_silent_is_given_up_and_listening_resumes(
    pg: PostgresStore, pg_store_url: str
) -> None:
    """A LISTEN connection whose network went silent waits for ever for notifications that no
    longer come (nothing is sent on it, so nothing fails): the listener checks a connection
    quiet for a while, gives it up when it does not answer, and listens on a new one, so waits
    are woken by commits again."""
    params = conninfo_to_dict(pg_store_url)
    proxy = Relay(str(params["host"]), int(str(params["port"])))
    port = await proxy.start()
    store = PostgresStore(pg_store_url.replace(f":{params['port']}/", f":{port}/"))
    store._changes.check_every = 0.3
    store._changes.check_within = 0.3
    try:
        sid = await new_session(pg)
        assert await store.wait_for_change(sid, 0.05) is False  # starts the listener
        for _ in range(1000):  # subscribed: its connection is up (not mid-handshake) when silenced
            if store._changes._listening.is_set():
                break
            await asyncio.sleep(0.01)
        proxy.silence()
        await asyncio.sleep(1.5)  # quiet past `check_every`, no answer within `check_within`
        for head in range(1, 4):
            waiting = asyncio.create_task(store.wait_for_change(sid, 5))
            await asyncio.sleep(0.1)
            await pg.commit(Commit(session_id=sid, expected_seq=head, events=[ev(sid, head + 1)]))
            assert await asyncio.wait_for(waiting, 10) is True
    finally:
        await store.close()
        await proxy.close()


async def test_server_gone_after_open_is_a_store_error() -> None:
    cluster = PgCluster.start()
    try:
        store = PostgresStore(cluster.admin_url, timeout=0.3)
        await store.open()
        sid = await new_session(store)
        cluster.stop()
        with pytest.raises(StoreError):
            await store.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)]))
        with pytest.raises(StoreError):
            await store.head(sid)
        await store.close()
    finally:
        cluster.stop()


async def _kill_all_but(observer: psycopg.AsyncConnection[Any]) -> int:
    """Terminate every other client backend of this database (as a server restart would)."""
    cur = await observer.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
        "current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
    )
    return len(await cur.fetchall())


@pytest.mark.parametrize("op", ["read", "write"])
async def test_a_pool_of_connections_all_killed_while_idle_is_renewed(
    pg_store_url: str, op: str
) -> None:
    """After a server restart every idle connection in the pool is dead: the next read or write
    must not use them up one retry at a time and fail, but go on over fresh connections."""
    store = PostgresStore(pg_store_url, min_size=4, max_size=4)
    try:
        sid = await new_session(store)

        async def busy() -> None:
            await store.read_events(sid)
            await asyncio.sleep(0.05)

        await asyncio.gather(*(busy() for _ in range(4)))  # four connections, all idle now
        observer = await admin(pg_store_url)
        async with observer:
            assert await _kill_all_but(observer) >= 4
        if op == "read":
            assert [e.seq for e in await store.read_events(sid)] == [1]
        else:
            await store.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)]))
            assert await store.head(sid) == 2
    finally:
        await store.close()


async def test_the_pool_reconnects_soon_after_an_outage() -> None:
    """psycopg_pool retries a lost connection backing off up to minutes apart, so a database back
    after an outage went unused, every call failing, for up to as long again as it was down:
    reconnecting starts over within seconds instead."""
    cluster = PgCluster.start()
    try:
        store = PostgresStore(cluster.admin_url, min_size=2, max_size=2, timeout=2)
        sid = await new_session(store)
        cluster.halt()
        with pytest.raises(StoreError):
            await store.head(sid)  # the pool finds its connections dead, and reconnects
        # Its reconnections fail, each waiting longer (psycopg_pool: 1, 2, 4, 8 s...): about 8 s
        # after the loss, the next would come only 6 to 8 s later.
        await asyncio.sleep(5.5)
        cluster.resume()
        await asyncio.sleep(0.3)
        # The server is back: a call now gets a connection within its wait (2 s here).
        assert await store.head(sid) == 1
        await store.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)]))
        assert await store.head(sid) == 2
        await store.close()
    finally:
        cluster.stop()


async def test_a_long_outage_fails_fast_and_the_store_recovers() -> None:
    """With PostgreSQL down, a call waits for it only as long as the outage grace (not the
    pool's whole timeout), then fails with `StoreUnavailable`; once the outage outlasts the
    grace, calls fail at once; when the server is back, the next call goes through."""
    cluster = PgCluster.start()
    try:
        store = PostgresStore(cluster.admin_url, min_size=2, max_size=2, timeout=30, grace=1.5)
        sid = await new_session(store)
        cluster.halt()
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(StoreUnavailable, match="PostgreSQL unavailable"):
            await store.head(sid)
        assert loop.time() - started < 5  # the grace and a probe, not the 30 s pool timeout
        for call in (
            lambda: store.head(sid),
            lambda: store.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)])),
        ):
            started = loop.time()
            with pytest.raises(StoreUnavailable):
                await call()
            assert loop.time() - started < 1
        stop = asyncio.Event()

        async def hammer() -> None:  # calls failing all along, up to the moment it is back
            while not stop.is_set():
                with contextlib.suppress(StoreUnavailable):
                    await store.head(sid)
                await asyncio.sleep(0.02)

        hammering = asyncio.ensure_future(hammer())
        await asyncio.to_thread(cluster.resume)
        # the first call after the server is back finds it, not an earlier call's finding
        assert await store.head(sid) == 1  # nothing was written while it was down
        stop.set()
        await hammering
        await store.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)]))
        assert [e.seq for e in await store.read_events(sid)] == [1, 2]
        await store.close()
    finally:
        cluster.stop()


async def test_calls_during_a_brief_restart_go_through_once() -> None:
    """A restart shorter than the outage grace is ridden out: a read and a write made while
    the server is down both succeed once it is back, and the write is applied once."""
    cluster = PgCluster.start()
    try:
        store = PostgresStore(cluster.admin_url, min_size=2, max_size=2, timeout=30, grace=8)
        sid = await new_session(store)
        await asyncio.to_thread(cluster.halt)
        reading = asyncio.ensure_future(store.head(sid))
        writing = asyncio.ensure_future(
            store.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)]))
        )
        await asyncio.sleep(1.5)
        assert not reading.done() and not writing.done()
        await asyncio.to_thread(cluster.resume)
        started = asyncio.get_running_loop().time()
        assert await asyncio.wait_for(reading, 10) in (1, 2)
        await asyncio.wait_for(writing, 10)
        assert asyncio.get_running_loop().time() - started < 3  # soon after it is back
        assert [e.seq for e in await store.read_events(sid)] == [1, 2]
        await store.close()
    finally:
        cluster.stop()


def test_the_outage_grace_url_option() -> None:
    assert PostgresStore("postgresql://u@h/db?outage_grace=2.5")._outage.grace == 2.5
    with pytest.raises(StoreError, match="outage_grace"):
        PostgresStore("postgresql://u@h/db?outage_grace=0")


async def test_a_hot_standby_is_read_and_refuses_writes_clearly() -> None:
    """After a failover to a hot standby (read-only): reads work, writes are a `StoreError` that
    says so and write nothing, a wait ends at its timeout though the listener cannot subscribe
    there, and the listener retries backing off rather than reconnecting ten times a second."""
    cluster = PgCluster.start()
    standby: PgCluster | None = None
    try:
        name = cluster.create_database()
        primary = PostgresStore(cluster.url(name))
        sid = await new_session(primary)
        await primary.close()
        standby = cluster.standby()
        store = PostgresStore(standby.url(name), timeout=2)
        assert await store.head(sid) == 1
        with pytest.raises(StoreError, match="read-only"):
            await store.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)]))
        with pytest.raises(StoreError, match="read-only"):
            await new_session(store)
        with pytest.raises(StoreError, match="read-only"):
            await store.claim("w", 10, T0, 10)
        assert [e.seq for e in await store.read_events(sid)] == [1]
        real_connect = store._changes._connect
        connects: list[float] = []

        async def counted() -> Any:
            connects.append(asyncio.get_running_loop().time())
            return await real_connect()

        store._changes._connect = counted
        started = asyncio.get_running_loop().time()
        assert await store.wait_for_change(sid, 1.5) is False
        assert asyncio.get_running_loop().time() - started < 2.0
        await asyncio.sleep(2.0)
        assert 1 <= len(connects) <= 8, f"{len(connects)} LISTEN connections in 3.5 s"
        await store.close()
    finally:
        if standby is not None:
            standby.stop()
        cluster.stop()


# -- reading the audit trail -----------------------------------------------------------------


def _scans(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of an EXPLAIN (FORMAT JSON) plan."""
    return [plan, *(n for p in plan.get("Plans", []) for n in _scans(p))]


async def test_verification_reads_a_large_trail_by_index(
    pg: PostgresStore, pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Verification reads a trail of 100,000 entries of 20,000 sessions, with two of no session
    (tool settings) among them, a bounded page per statement: the other streams window by
    window, the sessions a page at a time. With the planner's statistics taken and no plan
    setting changed, each of its statements reaches the audit rows and the sessions through an
    index condition, so none scans a table however large the trail grows."""
    row = AuditRow(stream="tools:a.t", type="tool.approval_changed", at=T0, seq=None, data={})
    await pg.record_audit([row])
    conn = await admin(pg_store_url)
    try:
        await conn.execute(
            "INSERT INTO signoff.sessions (id, agent, head, status, created_at, updated_at) "
            "SELECT 'ses_' || g, 'a', 0, 'idle', 0, 0 FROM generate_series(1, 20000) g"
        )
        await conn.execute(
            "INSERT INTO signoff.audit (sk, n, seq, hash) SELECT s.sk, g, g, '\\x00' "
            "FROM signoff.sessions s, generate_series(1, 5) g"
        )
        await pg.record_audit([dataclasses.replace(row, data={"new": 1})])
        await conn.execute("ANALYZE")
        statements: list[tuple[str, Any]] = []
        execute = psycopg.AsyncConnection.execute

        async def traced(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
            statements.append((str(query), params))
            return await execute(self, query, params, **kw)

        monkeypatch.setattr(psycopg.AsyncConnection, "execute", traced)
        found = [(e.stream, e.n) async for e in trail_entries(pg, others=True)]
        reads = list(statements)
        heads = await pg.audit_sessions(limit=audit_trail.SESSIONS_PAGE)
        await pg.audit_heads(others=True)
        await request_rows(pg, sessions=list(heads))
        group = [e async for e in trail_entries(pg, sessions=list(heads))]
        monkeypatch.undo()
        assert found == [("tools:a.t", 1), ("tools:a.t", 2)]
        assert len(group) == 5 * audit_trail.SESSIONS_PAGE
        windows = [(q, p) for q, p in reads if "max(id)" in q]
        pages = [(q, p) for q, p in reads if ".audit a " in q]
        assert len(windows) == 100_002 // audit_trail.PAGE + 2 == len(pages) + 1
        middle = [windows[len(windows) // 2], pages[len(pages) // 2]]
        for q, p in middle + statements[len(reads) :]:
            cur = await conn.execute("EXPLAIN (FORMAT JSON) " + q, p)
            ((plan,),) = await cur.fetchall()
            tables = [n for n in _scans(plan[0]["Plan"]) if n.get("Relation Name")]
            # A page's 200 session keys alone may be looked up by a scan of the sessions
            # while they are this few (the planner's cheaper choice); never with the entries.
            # The events and requests hold a handful of rows here: a scan reads them fastest.
            checked = ("audit", "sessions") if ".audit" in q else ("audit",)
            for node in tables:
                if node["Relation Name"] in checked:
                    assert node["Node Type"] != "Seq Scan", (
                        q,
                        [(n["Node Type"], n["Relation Name"]) for n in tables],
                    )
                    assert "Index Cond" in node or "Recheck Cond" in node, (q, tables)
    finally:
        await conn.close()
