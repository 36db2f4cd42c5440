"""A process frozen (SIGSTOP: a long pause, a paused virtual machine) just after it sent a write
to PostgreSQL: a write that takes a lock goes out with its end (the protocol's Sync, or COMMIT)
in one message, so the server finishes it, commits, and holds nothing for the frozen process;
other writers of the session go on at once, and the frozen one, woken, reads its answer.

The children are real processes forked by the `scripts` fixture that stop themselves with a
real SIGSTOP at the chosen point; the test wakes them with SIGCONT."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import signoff as so
from signoff.stores._audit import AuditRow

from ._forks import Scripts
from ._frozen import stopped_child
from ._procs import query
from ._worker_procs import check_logs

# A child that stops itself just after the statement of a write (`MARK` in its text) was sent.
_FROZEN_WRITE = r"""
import asyncio, os, signal, sys, time
from pathlib import Path

import psycopg

import signoff as so
from signoff.stores import Commit
from signoff.stores._audit import AuditRow
from signoff.stores.postgres import PostgresStore

url, sid, pid_file, mark = sys.argv[1:]
real = psycopg.AsyncCursor.execute  # conn.execute's, and a client-side cursor's
frozen = []


async def execute(self, query, *args, **kwargs):
    cur = await real(self, query, *args, **kwargs)
    if not frozen and mark in str(query):
        frozen.append(True)
        Path(pid_file).write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)
    return cur


psycopg.AsyncCursor.execute = execute


async def main():
    store = PostgresStore(url)
    await store.open()
    try:
        if mark == "FOR UPDATE OF s SKIP LOCKED":
            claimed = await store.claim("frozen-worker", 30.0, time.time(), 1)
            print(json.dumps([s for s, _ in claimed]))
            return
        if mark == "pg_advisory_xact_lock":
            row = AuditRow(stream=sid, type="t", at=time.time(), seq=None, data={"new": "frozen"})
            await store.record_audit([row])
            print("recorded")
            return
        head = await store.head(sid)
        event = so.Event(
            session_id=sid, seq=head + 1, type="session.waiting", at=time.time(), data={}
        )
        try:
            await store.commit(Commit(session_id=sid, expected_seq=head, events=[event]))
        except so.SignoffError as exc:
            print(type(exc).__name__)
        else:
            print("committed")
    finally:
        await store.close()


import json
asyncio.run(main())
"""

# Backends of other processes in a transaction that holds a lock (a row's, through its
# transaction id, or an advisory one) while waiting for their client: what a frozen process
# would leave blocking the session's writers.
# Each store call's deadline: a lock held by the frozen process would be freed by the server at
# half of it (its idle transaction ended), or cut the write at it; a write on time takes a
# fraction of a second, however busy the machine.
DEADLINE = 10.0
_HOLDING = (
    "SELECT COUNT(DISTINCT a.pid) FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid "
    "WHERE a.datname = current_database() AND a.pid <> pg_backend_pid() "
    "AND a.wait_event = 'ClientRead' AND l.granted "
    "AND l.locktype IN ('transactionid', 'advisory')"
)


def _agent() -> so.Agent:
    model = so.models.Scripted([so.ModelResponse(text="Hello.")], repeat_last=True)
    return so.Agent(name="support", model=model)


async def test_a_process_frozen_just_after_sending_a_commit_holds_no_lock(
    pg_store_url: str, scripts: Scripts, tmp_path: Path
) -> None:
    """Frozen right after its commit statement went out, a process holds no row lock: the
    server committed it with the statement (it was one message with its Sync), so an answer on
    the session goes through at once, after it, rather than waiting for the frozen process to
    wake or for its own `operation_timeout` to cut it; the frozen process, woken, finds
    its commit applied."""
    url = f"{pg_store_url}?operation_timeout={DEADLINE:g}"
    pid_file = tmp_path / "frozen.pid"
    async with so.Runtime([_agent()], store=url) as rt:
        sid = await rt.create_session("support")
        child = asyncio.create_task(
            asyncio.to_thread(scripts.run, _FROZEN_WRITE, url, sid, str(pid_file), " FOR UPDATE)")
        )
        async with stopped_child(pid_file):
            assert query(pg_store_url, _HOLDING) == [(0,)]
            started = time.monotonic()
            result = await asyncio.wait_for(rt.generate(session_id=sid, prompt="Hi"), 10)
            elapsed = time.monotonic() - started
        done = await child
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["committed"]
        assert result.status == "completed"
        assert elapsed < DEADLINE / 3  # not held until the frozen process wakes or its own deadline
        events = await rt.store.read_events(sid)
        assert [e.type for e in events][1:3] == ["session.waiting", "turn.started"]
    check_logs(pg_store_url)


async def test_a_worker_frozen_just_after_sending_its_claim_holds_no_lock(
    pg_store_url: str, scripts: Scripts, tmp_path: Path
) -> None:
    """A worker's claim locks the sessions it leases: frozen right after sending it, the worker
    holds no lock (the claim was committed with it), so a write on the claimed session goes
    through at once."""
    url = f"{pg_store_url}?operation_timeout={DEADLINE:g}"
    pid_file = tmp_path / "frozen.pid"
    async with so.Runtime([_agent()], store=url, inline=False) as rt:
        sid = (await rt.generate("support", "Hi")).session_id  # running, for a worker
        head = await rt.store.head(sid)
        assert head is not None
        child = asyncio.create_task(
            asyncio.to_thread(
                scripts.run, _FROZEN_WRITE, url, sid, str(pid_file), "FOR UPDATE OF s SKIP LOCKED"
            )
        )
        async with stopped_child(pid_file):
            assert query(pg_store_url, _HOLDING) == [(0,)]
            started = time.monotonic()
            event = so.Event(
                session_id=sid, seq=head + 1, type="session.waiting", at=time.time(), data={}
            )
            await asyncio.wait_for(
                rt.store.commit(
                    so.stores.Commit(session_id=sid, expected_seq=head, events=[event])
                ),
                10,
            )
            elapsed = time.monotonic() - started
        done = await child
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == [f'["{sid}"]']
        assert elapsed < DEADLINE / 3  # not held until the frozen worker wakes or its own deadline
    check_logs(pg_store_url)


async def test_an_audit_entry_frozen_just_after_it_was_sent_holds_no_lock(
    pg_store_url: str, scripts: Scripts, tmp_path: Path
) -> None:
    """An entry no event carries (a tool setting, a sign-out) takes its stream's lock, then
    chains onto the stream's head: frozen right after sending it, a process holds no lock (the
    lock, the entry and the end of the transaction went out in one message), so another
    process's entry on the same stream is written at once, chained after it."""
    url = f"{pg_store_url}?operation_timeout={DEADLINE:g}"
    pid_file = tmp_path / "frozen.pid"
    stream = "tools:a.t"
    async with so.Runtime([], store=url) as rt:
        child = asyncio.create_task(
            asyncio.to_thread(
                scripts.run, _FROZEN_WRITE, url, stream, str(pid_file), "pg_advisory_xact_lock"
            )
        )
        async with stopped_child(pid_file):
            assert query(pg_store_url, _HOLDING) == [(0,)]
            started = time.monotonic()
            row = AuditRow(stream=stream, type="t", at=time.time(), seq=None, data={"new": "b"})
            await asyncio.wait_for(rt.store.record_audit([row]), 10)
            elapsed = time.monotonic() - started
        done = await child
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["recorded"]
        assert elapsed < DEADLINE / 3  # not held until the frozen process wakes or its own deadline
        entries = await rt.store.audit(stream=stream)
        assert [(e.n, e.data["new"]) for e in entries] == [(1, "frozen"), (2, "b")]
        assert await rt.verify_audit() == []
