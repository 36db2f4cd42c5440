"""The PostgreSQL store's schema: migrations, upgrades in place, URL options, and settings a DBA
may have changed."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

import signoff as so
from signoff._events import Event, dumps
from signoff._exceptions import SchemaVersionError, StoreError
from signoff.stores import Commit, PendingFilter, open_store
from signoff.stores._audit import AuditRow
from signoff.stores.postgres import MIGRATIONS, STORE_SCHEMA, PostgresStore

from ._pg_events import T0, ev, new_session
from ._pg_syncs import seen_syncs, watch_syncs
from .test_postgres import admin

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


async def test_the_indexes_of_appended_rows_fill_their_pages(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Migration 9: the keys of events and audit entries only go after the last of their session
    or of the trail, so those indexes fill their pages whole (fillfactor 100), in a new store and
    in one upgraded from migration 8; every other index keeps PostgreSQL's default."""
    import signoff.stores.postgres._schema as module

    older = PostgresStore(pg_url, schema="at_8")
    monkeypatch.setattr(module, "MIGRATIONS", MIGRATIONS[:8])
    monkeypatch.setattr(module, "STORE_SCHEMA", 8)
    assert await older.migrate() == (0, 8)
    monkeypatch.undo()
    for store in (PostgresStore(pg_url), PostgresStore(pg_url, schema="at_8")):
        await store.open()
        await store.close()
    conn = await admin(pg_url)
    async with conn:
        cur = await conn.execute(
            "SELECT n.nspname, c.relname, c.reloptions FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname IN ('signoff', 'at_8') "
            "AND c.relkind = 'i' AND c.reloptions IS NOT NULL ORDER BY 1, 2"
        )
        assert await cur.fetchall() == [
            (schema, index, ["fillfactor=100"])
            for schema in ("at_8", "signoff")
            for index in ("audit_by_session", "audit_pkey", "events_pkey")
        ]


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


async def _migrated_once(pg_url: str) -> None:
    """The default schema holds one version row per migration: none ran twice."""
    conn = await admin(pg_url)
    async with conn:
        cur = await conn.execute("SELECT COUNT(*) FROM signoff.schema_version")
        assert (await cur.fetchone()) == (STORE_SCHEMA,)


async def test_concurrent_first_opens_migrate_once(pg_url: str) -> None:
    stores = [PostgresStore(pg_url) for _ in range(6)]
    await asyncio.gather(*(s.open() for s in stores))
    try:
        sid = await new_session(stores[0])
        assert await stores[5].head(sid) == 1
    finally:
        for s in stores:
            await s.close()
    await _migrated_once(pg_url)


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


@pytest.mark.parametrize("level", ["repeatable read", "serializable"])
async def test_concurrent_first_opens_migrate_once_under_a_stricter_default_isolation(
    pg_url: str, level: str
) -> None:
    """Two processes first opening a fresh database both wait for the migration lock; the one
    that waited must see the schema the other committed meanwhile. Under a DBA's stricter
    default isolation its snapshot was taken before the lock was granted: it read no migration
    applied, ran them again and failed on the tables that were there."""
    conn = await admin(pg_url)
    async with conn:
        await conn.execute(
            f"ALTER DATABASE \"{conn.info.dbname}\" SET default_transaction_isolation = '{level}'"
        )
    blocker = await admin(pg_url)
    stores = [PostgresStore(pg_url) for _ in range(2)]
    async with blocker:
        await blocker.execute("SELECT pg_advisory_lock(hashtext(%s))", ('"signoff".migrate',))
        opens = [asyncio.create_task(s.open()) for s in stores]
        try:
            for _ in range(200):  # until both wait for the lock the blocker holds
                cur = await blocker.execute(
                    "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                )
                if (await cur.fetchone()) == (2,):
                    break
                await asyncio.sleep(0.05)
            else:
                pytest.fail("the opens never waited for the migration lock")
            await blocker.execute("SELECT pg_advisory_unlock(hashtext(%s))", ('"signoff".migrate',))
            await asyncio.wait_for(asyncio.gather(*opens), 30)
            sid = await new_session(stores[0])
            assert await stores[1].head(sid) == 1
        finally:
            for task in opens:
                task.cancel()
            await asyncio.gather(*opens, return_exceptions=True)
            for s in stores:
                await s.close()
    await _migrated_once(pg_url)
