"""What only the PostgreSQL store has: URLs and connections, and reading the audit trail by index.

Everything the `Store` protocol promises is tested once for both stores in
test_store_conformance.py and test_store_{requests,leases,concurrency,runtime,edited_rows}.py;
the test_postgres_*.py files cover what is specific to PostgreSQL.
The `admin` connection helper here is shared by them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import psycopg
import pytest

import signoff as so
from signoff import _audit_trail as audit_trail
from signoff._audit_requests import request_rows
from signoff._audit_trail import entries as trail_entries
from signoff._exceptions import StoreError, UsageError
from signoff.stores import open_store
from signoff.stores._audit import AuditRow
from signoff.stores.postgres import PostgresStore

from ._pg_events import T0, new_session
from .conftest import PgCluster, _free_port


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
    # So is a port that is not one (it once read as "store unavailable", which a worker retries
    # for ever), and it names the port.
    with pytest.raises(StoreError, match="port 'notaport' is not a whole number"):
        PostgresStore("postgresql://u@127.0.0.1:notaport/db")


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


async def test_a_read_of_events_after_the_head_takes_no_round_trip_for_the_row_key(
    pg: PostgresStore, pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`head` reads the session's row key with its head, so the read of its events that follows
    (`Runtime.events`) is one statement: a store that had not read the session yet looked the
    key up first, a round trip more on each session's first read."""
    sid = await new_session(pg, events=3)
    other = PostgresStore(pg_store_url)  # knows nothing of the session yet
    await other.open()
    try:
        await other.head("ses_none")  # its pool is open: only the reads below are counted
        statements: list[str] = []
        execute = psycopg.AsyncConnection.execute

        async def traced(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
            statements.append(str(query))
            return await execute(self, query, params, **kw)

        monkeypatch.setattr(psycopg.AsyncConnection, "execute", traced)
        assert await other.head(sid) == 3
        assert [e.seq for e in await other.read_events(sid, after=1)] == [2, 3]
        monkeypatch.undo()
        assert len(statements) == 2, statements
    finally:
        await other.close()
