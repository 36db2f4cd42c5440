"""Audit entries of no session recorded by the PostgreSQL statement: chained from heads read
unlocked, checked and hashed under the streams' locks, from many processes at once.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from signoff._audit_trail import verify
from signoff.stores._audit import AuditRow
from signoff.stores.postgres import PostgresStore

from ._pg_events import T0


async def test_audit_entries_recorded_at_once_from_many_processes_chain(
    pg_store_url: str,
) -> None:
    """Entries of no session (tool settings, sign-outs) are chained from heads read unlocked and
    checked under the streams' locks: processes recording on the same streams at once, in
    either order of the streams, each write every entry once, numbered without a gap, with ids
    without a gap, and the chains verify."""
    stores = [PostgresStore(pg_store_url) for _ in range(4)]
    for store in stores:
        await store.open()

    async def record(k: int, store: PostgresStore) -> None:
        for i in range(8):
            streams = ["tools:a.t", "tools:b.t"][:: 1 if k % 2 else -1]
            await store.record_audit(
                [
                    AuditRow(stream=stream, type="t", at=T0, seq=None, data={"k": k, "i": i})
                    for stream in streams
                ]
            )

    try:
        await asyncio.gather(*(record(k, store) for k, store in enumerate(stores)))
        every = await stores[0].audit()
        assert [e.id for e in every] == list(range(1, 65))
        for stream in ("tools:a.t", "tools:b.t"):
            entries = await stores[0].audit(stream=stream)
            assert [e.n for e in entries] == list(range(1, 33))
            written = sorted((e.data["k"], e.data["i"]) for e in entries)
            assert written == [(k, i) for k in range(4) for i in range(8)]
        assert await verify(stores[0]) == []
    finally:
        for store in stores:
            await store.close()


async def test_audit_entries_chained_by_the_statement_verify(pg: PostgresStore) -> None:
    """The statement recording entries of no session hashes them itself, from the heads it
    reads under the streams' locks: text of any script, nested and unordered keys and precise
    times hash as `chain_hash` does, and an entry expecting its stream elsewhere (`after`) is
    skipped mid-batch while the others chain on, each stream on its own."""
    data = {"z": [1, {"b": 2.5, "a": 'é ü 中 \u2028 "q" \\\\'}], "a": None, "n": 3}

    def row(stream: str, after: int | None, k: int) -> AuditRow:
        return AuditRow(
            stream=stream, type="t", at=T0 + k / 7, seq=None, data={**data, "k": k}, after=after
        )

    await pg.record_audit([row("tools:b.t", None, 0)])
    await pg.record_audit(
        [
            row("tools:a.t", 0, 1),
            row("tools:b.t", 1, 2),
            row("tools:a.t", 0, 3),  # skipped: the stream is at 1 by now
            row("tools:a.t", 1, 4),
            row("tools:b.t", 5, 5),  # skipped
            row("tools:b.t", None, 6),
        ]
    )
    found = [
        (e.stream, e.n, e.data["k"], e.data == {**data, "k": e.data["k"]}) for e in await pg.audit()
    ]
    assert found == [
        ("tools:b.t", 1, 0, True),
        ("tools:a.t", 1, 1, True),
        ("tools:b.t", 2, 2, True),
        ("tools:a.t", 2, 4, True),
        ("tools:b.t", 3, 6, True),
    ]
    assert [e.at for e in await pg.audit(stream="tools:a.t")] == [T0 + 1 / 7, T0 + 4 / 7]
    assert await verify(pg) == []


@pytest.mark.parametrize("when", ["before it was sent", "after it committed"])
async def test_audit_entries_whose_connection_is_lost_are_written_once(
    pg: PostgresStore, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """The lock and the entries go out in one message: a connection lost as it is sent (it
    never arrived) or once it committed (the answer lost) leaves the outcome unknown, so the
    entries are looked for on a fresh connection: found, the call succeeds; not found, they are
    sent again. Either way each is written once."""
    await pg.record_audit([AuditRow(stream="tools:a.t", type="t", at=T0, seq=None, data={})])
    real = psycopg.AsyncCursor.execute
    dropped: list[str] = []

    async def execute(self: psycopg.AsyncCursor[Any], query: Any, *a: Any, **k: Any) -> Any:
        ours = "pg_advisory_xact_lock" in str(query) and not dropped
        if ours and when == "before it was sent":
            dropped.append(when)
            self.connection.pgconn.finish()
            raise psycopg.OperationalError("server closed the connection unexpectedly (test)")
        cur = await real(self, query, *a, **k)
        if ours:
            dropped.append(when)
            self.connection.pgconn.finish()
            raise psycopg.OperationalError("server closed the connection unexpectedly (test)")
        return cur

    monkeypatch.setattr(psycopg.AsyncCursor, "execute", execute)
    rows = [
        AuditRow(stream=stream, type="t", at=T0 + 1, seq=None, data={"k": k})
        for k, stream in enumerate(["tools:a.t", "tools:b.t", "tools:a.t"])
    ]
    await pg.record_audit(rows)
    monkeypatch.undo()
    assert dropped == [when]
    entries = await pg.audit()
    assert [(e.stream, e.n, e.data) for e in entries] == [
        ("tools:a.t", 1, {}),
        ("tools:a.t", 2, {"k": 0}),
        ("tools:b.t", 1, {"k": 1}),
        ("tools:a.t", 3, {"k": 2}),
    ]
    assert [e.id for e in entries] == [1, 2, 3, 4]
    assert await verify(pg) == []


@pytest.mark.parametrize("setting", ["standard_conforming_strings", "array_nulls"])
async def test_audit_entries_verify_on_a_database_of_legacy_quoting(
    pg_store_url: str, setting: str
) -> None:
    """A DBA's `standard_conforming_strings = off` (a legacy database's): psycopg quotes the
    bytea arrays `record_audit` binds on the client as if it were on, so each entry's hash was
    stored as the text of its hex digits, and verification reported every entry as altered.
    `array_nulls = off` read the NULLs of those arrays as the text 'NULL': every call failed."""
    async with await psycopg.AsyncConnection.connect(pg_store_url, autocommit=True) as admin:
        name = (await (await admin.execute("SELECT current_database()")).fetchone() or [""])[0]
        await admin.execute(f'ALTER DATABASE "{name}" SET {setting} = off')
    store = PostgresStore(pg_store_url)
    try:
        rows = [
            AuditRow(stream="tools:a.t", type="t", at=T0 + k, seq=None, data={"k": k})
            for k in range(3)
        ]
        await store.record_audit(rows[:1])
        await store.record_audit(rows[1:])
        assert [e.data["k"] for e in await store.audit()] == [0, 1, 2]
        assert await verify(store) == []
    finally:
        await store.close()
