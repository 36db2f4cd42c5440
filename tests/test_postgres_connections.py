"""A process frozen inside a transaction (SIGSTOP, a paused virtual machine) keeps its row locks
while its kernel still answers the server: the server ends the transaction once it has been idle
for half the store's `operation_timeout`, so the session's other writers go on."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

import signoff as so
from signoff.stores import Commit
from signoff.stores._audit import AuditRow, chain_parts
from signoff.stores.postgres import PostgresStore
from signoff.stores.postgres._sql import event_rows

from .test_postgres import admin


async def test_a_transaction_left_open_by_a_frozen_process_does_not_block_the_session(
    pg_store_url: str,
) -> None:
    """A signoff connection left idle in a transaction holding the session's row lock (what a
    process frozen between a commit's statement and its COMMIT leaves) is ended by the server;
    an answer waiting for the lock then goes through, well within its own deadline."""
    url = f"{pg_store_url}?operation_timeout=4"
    agent = so.Agent(
        name="support",
        model=so.models.Scripted([so.ModelResponse(text="Hello.")], repeat_last=True),
    )
    async with so.Runtime([agent], store=url) as rt:
        sid = await rt.create_session("support")
        frozen = PostgresStore(url)
        await frozen.open()
        try:
            pool = await frozen._get_pool()
            async with pool.connection() as conn:
                await conn.execute("BEGIN")
                await conn.execute(
                    'SELECT 1 FROM "signoff".sessions WHERE id = %s FOR UPDATE', (sid,)
                )
                started = time.monotonic()
                result = await asyncio.wait_for(rt.generate(session_id=sid, prompt="Hi"), 10)
                assert result.status == "completed"
                assert time.monotonic() - started < 4  # not cut by its own deadline
                try:
                    await conn.execute("COMMIT")
                except psycopg.Error:
                    pass  # the server ended it: its connection is gone
                else:
                    raise AssertionError("the idle transaction was not ended")
        finally:
            await frozen.close()


async def test_a_commit_frozen_between_its_statements_does_not_block_the_session(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit that must read the session first (this process had no guess of its head) is
    frozen after that read, before it sends its statement: it holds no lock there (the read
    took none), so an answer on the session goes through at once, and the frozen commit,
    resumed, finds the head moved and writes nothing. (Frozen once its statement is sent, it
    holds none either: tests/test_postgres_frozen.py.)"""
    url = f"{pg_store_url}?operation_timeout=2"
    agent = so.Agent(
        name="support",
        model=so.models.Scripted([so.ModelResponse(text="Hello.")], repeat_last=True),
    )
    frozen_thread: list[threading.Thread] = []
    resume = threading.Event()  # set once the other write is checked
    read = threading.Event()

    def freezing(*args: Any) -> Any:
        if threading.current_thread() in frozen_thread:
            read.set()
            resume.wait(10)  # the whole process stops, its event loop with it
        return event_rows(*args)

    monkeypatch.setattr("signoff.stores.postgres._store.event_rows", freezing)
    outcome: list[BaseException | None] = []

    async def commit_frozen(sid: str, head: int) -> None:
        store = PostgresStore(url)
        await store.open()
        try:
            event = so.Event(
                session_id=sid, seq=head + 1, type="session.waiting", at=time.time(), data={}
            )
            await store.commit(Commit(session_id=sid, expected_seq=head, events=[event]))
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)
        finally:
            await store.close()

    async with so.Runtime([agent], store=url) as rt:
        sid = await rt.create_session("support")
        head = await rt.store.head(sid)
        assert head is not None
        thread = threading.Thread(target=asyncio.run, args=(commit_frozen(sid, head),))
        frozen_thread.append(thread)
        thread.start()
        try:
            assert await asyncio.to_thread(read.wait, 5)
            result = await asyncio.wait_for(rt.generate(session_id=sid, prompt="Hi"), 10)
            assert result.status == "completed"
            # Done while the other is frozen: waiting for it, it would be cut by its own
            # operation_timeout (2 s), or let through by the server ending the frozen one's
            # transaction (after 1 s idle), which the frozen one's outcome below would show.
        finally:
            resume.set()
            await asyncio.to_thread(thread.join, 10)
        assert len(outcome) == 1 and isinstance(outcome[0], so.AppendConflict)
        after = await rt.store.read_events(sid, after=head)
        assert [e.type for e in after][:1] == ["turn.started"]  # the answer's, not the frozen one


async def test_a_claim_frozen_before_its_commit_does_not_block_the_session(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's claim locks the sessions it leases: a worker frozen before it reads the claim's
    answer has had it committed (it went out with its Sync), so a write on a session it claimed
    (a message, an answer) goes through at once rather than waiting for the worker to resume."""
    url = f"{pg_store_url}?operation_timeout=2"
    agent = so.Agent(
        name="support",
        model=so.models.Scripted([so.ModelResponse(text="Hello.")], repeat_last=True),
    )
    frozen_thread: list[threading.Thread] = []
    resume = threading.Event()  # set once the other write is checked
    answered = threading.Event()
    real_fetchall = psycopg.AsyncCursor.fetchall

    async def freezing(self: psycopg.AsyncCursor[Any]) -> Any:
        rows = await real_fetchall(self)
        if threading.current_thread() in frozen_thread:
            answered.set()
            resume.wait(10)  # the whole process stops, its event loop with it
        return rows

    monkeypatch.setattr(psycopg.AsyncCursor, "fetchall", freezing)
    claimed: list[list[tuple[str, int]]] = []

    async def claim_frozen() -> None:
        store = PostgresStore(url)
        await store.open()
        try:
            claimed.append(await store.claim("frozen-worker", 30.0, time.time(), 1))
        finally:
            await store.close()

    async with so.Runtime([agent], store=url, inline=False) as rt:
        sid = (await rt.generate("support", "Hi")).session_id  # running, for a worker
        head = await rt.store.head(sid)
        assert head is not None
        thread = threading.Thread(target=asyncio.run, args=(claim_frozen(),))
        frozen_thread.append(thread)
        thread.start()
        try:
            assert await asyncio.to_thread(answered.wait, 5)
            event = so.Event(
                session_id=sid, seq=head + 1, type="session.waiting", at=time.time(), data={}
            )
            await rt.store.commit(Commit(session_id=sid, expected_seq=head, events=[event]))
            # Done while the other is frozen: waiting for it, it would be cut by its own
            # operation_timeout (2 s), or let through by the server ending the frozen one's
            # transaction (after 1 s idle), which the frozen one's outcome below would show.
        finally:
            resume.set()
            await asyncio.to_thread(thread.join, 10)
        assert [s for s, _ in claimed[0]] == [sid]


async def test_an_audit_entry_frozen_before_its_commit_does_not_block_the_stream(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry no event carries (a tool setting, a sign-out) is chained onto its stream's head
    by the statement that writes it, sent with the stream's lock and COMMIT once the entry is
    ready: a process frozen while it prepares one (it used to hold the lock there, having read
    the head) holds no lock, so another process's entry on the same stream is written at once;
    the frozen one, resumed, chains onto the moved head."""
    url = f"{pg_store_url}?operation_timeout=2"
    frozen_thread: list[threading.Thread] = []
    resume = threading.Event()  # set once the other write is checked
    preparing = threading.Event()

    def freezing(**kwargs: Any) -> Any:
        if threading.current_thread() in frozen_thread:
            preparing.set()
            resume.wait(10)  # the whole process stops, its event loop with it
        return chain_parts(**kwargs)

    monkeypatch.setattr("signoff.stores.postgres._store.chain_parts", freezing)
    outcome: list[BaseException | None] = []

    def row(new: str) -> AuditRow:
        return AuditRow(stream="tools:a.t", type="t", at=time.time(), seq=None, data={"new": new})

    async def record_frozen() -> None:
        store = PostgresStore(url)
        await store.open()
        try:
            await store.record_audit([row("frozen")])
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)
        finally:
            await store.close()

    async with so.Runtime([], store=url) as rt:
        thread = threading.Thread(target=asyncio.run, args=(record_frozen(),))
        frozen_thread.append(thread)
        thread.start()
        try:
            assert await asyncio.to_thread(preparing.wait, 5)
            await asyncio.wait_for(rt.store.record_audit([row("other")]), 10)
            # Done while the other is frozen: waiting for it, it would be cut by its own
            # operation_timeout (2 s), or let through by the server ending the frozen one's
            # transaction (after 1 s idle), which the frozen one's outcome below would show.
        finally:
            resume.set()
            await asyncio.to_thread(thread.join, 10)
        assert outcome == [None]
        entries = await rt.store.audit(stream="tools:a.t")
        assert [(e.n, e.data["new"]) for e in entries] == [(1, "other"), (2, "frozen")]
        assert await rt.verify_audit() == []


async def test_a_pool_the_server_will_not_fill_says_why_and_what_to_change(
    pg_store_url: str,
) -> None:
    """`?pool_min=` past what the server takes for the role ("too many connections for role"):
    the store failed to open with psycopg_pool's "pool initialization incomplete after 2.0 sec"
    alone, the refusal only in a log the CLI does not show."""
    role = f"app_{uuid.uuid4().hex[:8]}"
    params = conninfo_to_dict(pg_store_url)
    url = f"postgresql://{role}@{params['host']}:{params['port']}/{params['dbname']}"
    conn = await admin(pg_store_url)
    async with conn:
        await conn.execute(
            f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT 2; GRANT USAGE ON SCHEMA signoff TO '
            f'"{role}"; GRANT SELECT ON ALL TABLES IN SCHEMA signoff TO "{role}"'
        )
        try:
            store = PostgresStore(f"{url}?pool_min=4&pool_max=4&pool_timeout=2")
            with pytest.raises(so.StoreError) as info:
                await store.open()
            await store.close()
            message = str(info.value)
            assert "the pool opened 2 of the 4 connections it keeps (pool_min)" in message
            assert f'too many connections for role "{role}"' in message, message
            assert "Lower pool_min, or let the server take more connections" in message
        finally:
            await conn.execute(f'DROP OWNED BY "{role}"; DROP ROLE "{role}"')
