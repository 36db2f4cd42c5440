"""A process frozen (SIGSTOP: a long GC pause, a paused virtual machine, a laptop lid) while it
holds something of a session, woken (SIGCONT) after others went on without it: a lease it held
past its TTL fences it (its renewal and its commit are refused, nothing written twice or from a
stale head), and on SQLite, where nothing can break another process's lock, a writer frozen
inside its transaction makes the others' writes fail after `busy_timeout` with a `StoreError`
(`StoreBusy` for an HTTP request's), writing nothing, and succeed once it woke.

The frozen children are real processes forked by the `scripts` fixture that stop themselves
with a real SIGSTOP; the test wakes them with SIGCONT."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

import signoff as so
from signoff.stores import Commit, SQLiteStore, promptly

from ._forks import Scripts
from ._frozen import stopped_child
from ._worker_procs import check_logs
from .conftest import make_store

_OPEN = r"""
import asyncio, json, os, signal, sys, time
from pathlib import Path

import signoff as so
from signoff.stores import Commit, SQLiteStore
from signoff.stores.postgres import PostgresStore


def store_of(url):
    return SQLiteStore(url) if url.startswith("sqlite:") else PostgresStore(url)


def freeze(pid_file):
    Path(pid_file).write_text(str(os.getpid()))
    os.kill(os.getpid(), signal.SIGSTOP)


def event(sid, seq):
    return so.Event(session_id=sid, seq=seq, type="session.waiting", at=time.time(), data={})
"""

# Takes the session's lease, then freezes; woken, renews it and commits under it.
_LEASE_HOLDER = (
    _OPEN
    + r"""
url, sid, pid_file, ttl = sys.argv[1:]


async def main():
    store = store_of(url)
    await store.open()
    try:
        granted = time.time()
        token = await store.acquire_lease(sid, "frozen", float(ttl), granted)
        head = await store.head(sid)
        Path(pid_file).with_suffix(".granted").write_text(repr(granted))
        freeze(pid_file)
        renewed = await store.renew_lease(sid, "frozen", token, float(ttl), time.time())
        try:
            await store.commit(
                Commit(session_id=sid, expected_seq=head, events=[event(sid, head + 1)],
                       lease_token=token)
            )
        except so.SignoffError as exc:
            outcome = type(exc).__name__
        else:
            outcome = "committed"
        print(json.dumps({"token": token, "renewed": renewed, "commit": outcome}))
    finally:
        await store.close()


asyncio.run(main())
"""
)

# Freezes inside a commit's write transaction (after BEGIN IMMEDIATE took the file's lock).
_SQLITE_WRITER = (
    _OPEN
    + r"""
url, sid, pid_file = sys.argv[1:]
checked = SQLiteStore._writable


def writable(self):
    checked(self)
    freeze(pid_file)


async def main():
    store = SQLiteStore(url)
    await store.open()
    try:
        head = await store.head(sid)
        SQLiteStore._writable = writable
        await store.commit(Commit(session_id=sid, expected_seq=head, events=[event(sid, head + 1)]))
        print("committed")
    finally:
        await store.close()


asyncio.run(main())
"""
)

LEASE_TTL = 0.5


def _agent() -> so.Agent:
    model = so.models.Scripted([so.ModelResponse(text="Hello.")], repeat_last=True)
    return so.Agent(name="support", model=model)


async def test_a_lease_holder_frozen_past_its_ttl_is_fenced_when_it_wakes(
    store_url: str, scripts: Scripts, tmp_path: Path
) -> None:
    """Frozen with the session's lease, a process loses it once it lapses: another takes it
    over; woken, the frozen one's renewal is refused and so is its commit, though the head it
    expects is still the session's (the lease alone fences it). The new holder's commit goes
    through, and the log has no gap."""
    store = make_store(store_url)
    await store.open()
    try:
        async with so.Runtime([_agent()], store=store) as rt:
            sid = await rt.create_session("support")
        head = await store.head(sid)
        assert head is not None
        pid_file = tmp_path / "frozen.pid"
        child = asyncio.create_task(
            asyncio.to_thread(
                scripts.run, _LEASE_HOLDER, store_url, sid, str(pid_file), str(LEASE_TTL)
            )
        )
        async with stopped_child(pid_file):
            # Held: asked as of half its TTL after the grant, not of now, as a loaded machine may
            # run the child past its whole TTL before it freezes (the lease lapsed by then).
            granted = float(pid_file.with_suffix(".granted").read_text())
            assert (
                await store.acquire_lease(sid, "other", LEASE_TTL, granted + LEASE_TTL / 2) is None
            )
            await asyncio.sleep(LEASE_TTL * 1.5)  # the frozen holder's lease lapses
            token = await store.acquire_lease(sid, "other", 30.0, time.time())
            assert token is not None
        done = await child
        assert done.returncode == 0, done.stderr
        frozen = json.loads(done.stdout)
        assert frozen == {"token": token - 1, "renewed": False, "commit": "LeaseLost"}
        assert await store.head(sid) == head  # it wrote nothing
        event = so.Event(
            session_id=sid, seq=head + 1, type="session.waiting", at=time.time(), data={}
        )
        await store.commit(
            Commit(session_id=sid, expected_seq=head, events=[event], lease_token=token)
        )
        assert await store.head(sid) == head + 1
    finally:
        await store.close()
    check_logs(store_url)


async def test_a_sqlite_writer_frozen_in_its_transaction_fails_the_others_by_name(
    scripts: Scripts, tmp_path: Path
) -> None:
    """A process frozen inside a write transaction holds the file's write lock, and nothing can
    take it from it: a write by another waits `busy_timeout` (1 s here), then fails with a
    `StoreError` saying the database is locked (an HTTP request's, `StoreBusy`, after its own
    shorter wait), writing nothing; reads go on meanwhile (WAL). Woken, the frozen one commits,
    and the same write, sent again, goes through."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    pid_file = tmp_path / "frozen.pid"
    store = SQLiteStore(url, busy_timeout=1)
    async with so.Runtime([_agent()], store=store) as rt:
        sid = await rt.create_session("support")
        head = await rt.store.head(sid)
        assert head is not None
        child = asyncio.create_task(
            asyncio.to_thread(scripts.run, _SQLITE_WRITER, url, sid, str(pid_file))
        )
        async with stopped_child(pid_file):
            started = time.monotonic()
            with pytest.raises(so.StoreError, match="database is locked") as info:
                await rt.generate(session_id=sid, prompt="Hi")
            assert type(info.value) is so.StoreError
            assert time.monotonic() - started < 5
            with promptly(), pytest.raises(so.StoreBusy, match="database is locked"):
                await rt.generate(session_id=sid, prompt="Hi")
            assert await rt.store.head(sid) == head  # read while the lock is held
            assert (await rt.state(sid)).turn is None  # nothing of either call was written
        done = await child
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["committed"]
        result = await rt.generate(session_id=sid, prompt="Hi")
        assert result.status == "completed" and result.text == "Hello."
        events = await rt.store.read_events(sid)
        assert [e.type for e in events][1:3] == ["session.waiting", "turn.started"]
    check_logs(url)
