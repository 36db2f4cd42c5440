"""Several OS processes on one SQLite file, as `signoff serve`, workers, the CLI and scripts use
it: opening a new file together, a writer elsewhere, the file deleted or replaced under an open
store. Each failure is a named `StoreError`, never a raw `sqlite3` error or a silent loss.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import signoff as so
from signoff.stores import Commit, PendingFilter, SQLiteStore
from signoff.stores.sqlite._connection import READ_CHECK_EVERY
from signoff.testing import ExecutionLog, call, call_tools, reply, scripted_agent

from ._locks import STORE_ROW, holding, open_together
from ._wal import SPILL, uncommitted_frames


def _event(sid: str, seq: int, type: str = "session.created") -> so.Event:
    return so.Event(session_id=sid, seq=seq, type=type, at=float(seq), data={})  # type: ignore[arg-type]


def test_opening_waits_for_a_writer_elsewhere_instead_of_failing(tmp_path: Path) -> None:
    # Switching a file to WAL while another process writes to it makes SQLite answer "database
    # is locked" at once, without its busy handler; the open must wait as a write would.
    path = tmp_path / "state.db"
    with holding(path) as holder:
        store = SQLiteStore(f"sqlite:///{path}", busy_timeout=10)
        errors: list[BaseException] = []

        def open_it() -> None:
            try:
                store.open_sync()
            except BaseException as exc:
                errors.append(exc)

        opener = threading.Thread(target=open_it)
        opener.start()
        opener.join(timeout=0.3)  # the writer still holds its lock meanwhile
        assert errors == [] and opener.is_alive(), errors
        holder.release()
        opener.join(timeout=10)
        assert not opener.is_alive() and errors == [], errors
        assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        store.conn.close()


def _open_at(path: str) -> None:
    SQLiteStore(f"sqlite:///{path}", busy_timeout=10).open_sync()


def test_processes_opening_a_new_file_at_once_all_open_it(tmp_path: Path) -> None:
    # `signoff serve` and a few workers started together on a file that does not exist yet.
    open_together(_open_at, [str(tmp_path / f"state-{trial}.db") for trial in range(20)])


async def test_a_write_to_a_file_deleted_under_the_store_is_refused(tmp_path: Path) -> None:
    # Once the file is unlinked, SQLite writes on to the orphaned inode in WAL mode: answers
    # would be acknowledged, and tools run, on a file no other process will ever read.
    path = tmp_path / "state.db"
    store = SQLiteStore(f"sqlite:///{path}")
    await store.create_session("s1", "a", [_event("s1", 1)], None)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    with pytest.raises(so.StoreError, match="deleted or replaced"):
        await store.commit(
            Commit(session_id="s1", expected_seq=1, events=[_event("s1", 2, "turn.waiting")])
        )
    with pytest.raises(so.StoreError, match="deleted or replaced"):
        await store.acquire_lease("s1", "A", 10, 0)
    assert not store.conn.in_transaction
    await store.close()
    assert not path.exists()  # nothing recreated it behind the caller's back


_OTHER_PROCESS = """
import asyncio, sys
import signoff as so
from signoff.stores import SQLiteStore
async def main():
    store = SQLiteStore("sqlite:///" + sys.argv[1])
    if sys.argv[2] == "write":
        event = so.Event(session_id="s2", seq=1, type="session.created", at=1.0, data={})
        await store.create_session("s2", "a", [event], None)
    print(await store.head("s1"), await store.head("s2"), await store.head("s3"))
    await store.close()
asyncio.run(main())
"""


def _other_process(path: Path, what: str) -> str:
    """What another process reads of sessions s1, s2 and s3 (after writing s2, if `what`)."""
    src = str(Path(so.__file__).resolve().parents[1])
    run = [sys.executable, "-c", _OTHER_PROCESS, str(path), what]
    env = {**os.environ, "PYTHONPATH": src}
    done = subprocess.run(run, check=True, timeout=60, env=env, capture_output=True, text=True)
    return done.stdout


async def _idle_store_whose_wal_goes(
    path: Path, deleted: tuple[str, ...] = ("-wal", "-shm")
) -> SQLiteStore:
    """A store holding session s1, its WAL checkpointed (as an idle store's is), whose `deleted`
    files are then deleted under it, as someone "cleaning up" beside a live store would."""
    store = SQLiteStore(f"sqlite:///{path}")
    await store.create_session("s1", "a", [_event("s1", 1)], None)
    store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    for suffix in deleted:
        Path(f"{path}{suffix}").unlink()
    return store


@pytest.mark.parametrize("deleted", [("-wal", "-shm"), ("-shm",), ("-wal",)])
async def test_a_wal_deleted_under_the_store_is_not_written_to(
    tmp_path: Path, deleted: tuple[str, ...]
) -> None:
    # Someone "cleaning up" the -wal and -shm beside a live store: the process that had them
    # open wrote on to its orphaned WAL, never saw another process's commits (made in new
    # files), and its close, as the last connection, deleted the new -wal with them, or wrote
    # its pages over them. It refuses to go on, and leaves its connection open.
    path = tmp_path / "state.db"
    store = await _idle_store_whose_wal_goes(path, deleted)
    assert _other_process(path, "write").split() == ["1", "1", "None"]
    with pytest.raises(so.StoreGone, match="-wal or -shm file"):
        await store.create_session("s3", "a", [_event("s3", 1)], None)
    with pytest.raises(so.StoreGone, match="-wal or -shm file"):
        await store.commit(
            Commit(session_id="s1", expected_seq=1, events=[_event("s1", 2, "turn.waiting")])
        )
    await store.close()
    with pytest.raises(so.StoreGone, match="restart the process"):
        await store.head("s1")  # here SQLite would read it through the old -shm
    assert _other_process(path, "read").split() == ["1", "1", "None"]  # kept


async def test_a_second_store_here_on_a_file_whose_wal_was_deleted_is_refused(
    tmp_path: Path,
) -> None:
    # A store opened in the same process after the -wal and -shm were deleted, while another
    # store here still had them open, got SQLite's old -shm of that one: its writes were
    # acknowledged, then lost. Both are refused; another process's commits are kept.
    path = tmp_path / "state.db"
    first = await _idle_store_whose_wal_goes(path)
    assert _other_process(path, "write").split() == ["1", "1", "None"]
    second = SQLiteStore(f"sqlite:///{path}")
    with pytest.raises(so.StoreGone, match="restart the process"):
        await second.create_session("s3", "a", [_event("s3", 1)], None)
    with pytest.raises(so.StoreGone, match="-wal or -shm file"):
        await first.create_session("s3", "a", [_event("s3", 1)], None)
    await second.close()
    await first.close()
    assert _other_process(path, "read").split() == ["1", "1", "None"]


def _write_in_fork(path: str) -> None:
    """In a forked child: exit 3 if writing the store is refused as the -wal was, else 0."""
    try:
        asyncio.run(
            SQLiteStore(f"sqlite:///{path}").create_session("s4", "a", [_event("s4", 1)], None)
        )
    except so.StoreGone:
        os._exit(3)
    os._exit(0)


async def test_a_process_forked_from_one_that_left_its_wal_does_not_write_the_store(
    tmp_path: Path,
) -> None:
    # A child inherits SQLite's record of the old -shm the parent's connection kept: its new
    # connection would read and write through it, and lose others' commits as the parent would.
    import multiprocessing

    path = tmp_path / "state.db"
    store = await _idle_store_whose_wal_goes(path)
    with pytest.raises(so.StoreGone):
        await store.create_session("s3", "a", [_event("s3", 1)], None)
    assert _other_process(path, "write").split() == ["1", "1", "None"]
    child = multiprocessing.get_context("fork").Process(target=_write_in_fork, args=(str(path),))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 3
    await store.close()
    assert _other_process(path, "read").split() == ["1", "1", "None"]


def test_opening_a_store_locked_elsewhere_waits_busy_timeout_once(tmp_path: Path) -> None:
    # The check whether the file has this signoff's schema took "database is locked" (after the
    # whole busy_timeout) for a new file, and the transaction after it waited as long again:
    # the CLI failed after 60 s where 30 were documented.
    from signoff.stores.sqlite import _connection

    path = tmp_path / "state.db"
    made = SQLiteStore(f"sqlite:///{path}")
    made.open_sync()
    made.conn.close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA locking_mode=EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            _connection._is_current(conn)
        with pytest.raises(so.StoreError, match="locked"):
            SQLiteStore(f"sqlite:///{path}", busy_timeout=0.2).open_sync()
    finally:
        conn.close()
        holder.close()


async def test_a_file_replaced_under_the_store_is_not_written_to(tmp_path: Path) -> None:
    # A backup moved into place over the live file: writing on to the old inode would lose it.
    path = tmp_path / "state.db"
    store = SQLiteStore(f"sqlite:///{path}")
    await store.create_session("s1", "a", [_event("s1", 1)], None)
    other = SQLiteStore(f"sqlite:///{tmp_path / 'backup.db'}")
    await other.create_session("s1", "a", [_event("s1", 1)], None)
    await other.close()
    os.replace(tmp_path / "backup.db", path)
    with pytest.raises(so.StoreError, match="deleted or replaced"):
        await store.create_session("s2", "a", [_event("s2", 1)], None)
    await store.close()
    reopened = SQLiteStore(f"sqlite:///{path}")
    assert await reopened.head("s1") == 1 and await reopened.head("s2") is None
    await reopened.close()


async def test_a_runtime_whose_file_was_deleted_does_not_run_the_approved_tool(
    tmp_path: Path,
) -> None:
    log = ExecutionLog()

    @log.tool(approval=so.always())
    async def issue_refund(order_id: str) -> dict[str, str]:
        return {"refunded": order_id}

    agent = scripted_agent(
        "a", [call_tools(call("issue_refund", order_id="1")), reply("Done.")], tools=[issue_refund]
    )
    path = tmp_path / "state.db"
    async with so.Runtime([agent], store=f"sqlite:///{path}") as rt:
        r = await rt.generate("a", prompt="refund order 1")
        assert r.status == "waiting"
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        answer = so.InputResponse(request_id=r.pending[0].id, option_id="approve")
        with pytest.raises(so.StoreError, match="deleted or replaced"):
            await rt.respond(r.session_id, [answer])
    assert log.count("issue_refund") == 0


async def test_the_relative_path_of_an_open_store_survives_a_change_of_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = SQLiteStore("sqlite:///state.db")
    await store.create_session("s1", "a", [_event("s1", 1)], None)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    await store.commit(
        Commit(session_id="s1", expected_seq=1, events=[_event("s1", 2, "turn.waiting")])
    )
    assert await store.head("s1") == 2
    await store.close()


async def test_a_reader_opens_the_store_while_another_process_holds_the_write_lock(
    tmp_path: Path,
) -> None:
    # In WAL mode readers never wait for the writer: `signoff pending`, `events` or a dashboard
    # starting while a worker holds the write lock (or stalls in a commit) must still read.
    path = tmp_path / "state.db"
    store = SQLiteStore(f"sqlite:///{path}")
    await store.create_session("s1", "a", [_event("s1", 1)], None)
    await store.close()
    with holding(path, STORE_ROW):
        reader = SQLiteStore(f"sqlite:///{path}", busy_timeout=0.2)
        await reader.open()
        assert await reader.head("s1") == 1
        with pytest.raises(so.StoreError, match="locked"):  # writing still waits, and says so
            await reader.acquire_lease("s1", "A", 10, 0)
        await reader.close()


STALL_INSIDE_COMMIT = (
    SPILL
    + """
import asyncio, os, secrets, sys, time
import signoff as so
from signoff.stores import Commit, SQLiteStore

def stall(*args, **kwargs):
    # The commit's rows are written (to the WAL, not committed), its transaction still open.
    print(os.path.getsize(sys.argv[1] + "-wal"), flush=True)
    time.sleep(3600)

SQLiteStore._insert_session_audit = staticmethod(stall)
data = {"x": secrets.token_hex(12000)}  # packs to more pages than the cache holds
event = so.Event(session_id="s1", seq=2, type="turn.waiting", at=2.0, data=data)
store = SQLiteStore("sqlite:///" + sys.argv[1])
asyncio.run(store.commit(Commit(session_id="s1", expected_seq=1, events=[event])))
"""
)


async def test_a_process_killed_inside_a_commit_leaves_no_trace_and_no_lock(
    tmp_path: Path,
) -> None:
    """A process killed (SIGKILL) inside a commit whose rows already reached the WAL leaves
    them there uncommitted: readers see the session as it was, and the next write does not
    wait for the dead process's lock."""
    path = tmp_path / "state.db"
    store = SQLiteStore(f"sqlite:///{path}", busy_timeout=5)
    await store.create_session("s1", "a", [_event("s1", 1)], None)
    wal = Path(f"{path}-wal")
    committed = wal.stat().st_size
    child = subprocess.Popen(
        [sys.executable, "-c", STALL_INSIDE_COMMIT, str(path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    try:
        stalled = int(child.stdout.readline())
        child.kill()  # SIGKILL: no rollback runs in the child
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)
        child.stdout.close()
    assert wal.stat().st_size == stalled > committed
    assert uncommitted_frames(wal, committed) > 2  # the killed commit's pages, on disk
    assert await store.head("s1") == 1 and len(await store.read_events("s1")) == 1
    fresh = SQLiteStore(f"sqlite:///{path}")  # a connection opened after the kill
    assert await fresh.head("s1") == 1 and len(await fresh.read_events("s1")) == 1
    await fresh.close()
    await store.commit(  # the lock died with the process: this write does not wait
        Commit(session_id="s1", expected_seq=1, events=[_event("s1", 2, "turn.waiting")])
    )
    assert [e.seq for e in await store.read_events("s1")] == [1, 2]
    await store.close()


def test_two_clis_answering_one_request_at_once_one_wins(tmp_path: Path) -> None:
    # An approve and a deny typed at once in two terminals: one is recorded; the other exits 1
    # naming ConflictingAnswer, and the store holds exactly one settlement.
    log = ExecutionLog()

    @log.tool(approval=so.always())
    async def issue_refund(order_id: str) -> dict[str, str]:
        return {"refunded": order_id}

    agent = scripted_agent(
        "a", [call_tools(call("issue_refund", order_id="1")), reply("Done.")], tools=[issue_refund]
    )
    url = f"sqlite:///{tmp_path / 'state.db'}"
    alice = so.Principal(authenticator="test", principal_id="alice")
    rt = so.Runtime([agent], store=url)
    try:
        r = rt.generate_sync("a", prompt="refund order 1", auth=alice)
    finally:
        rt.close_sync()
    request_id = r.pending[0].id
    env = {**os.environ, "SIGNOFF_STORE": url, "SIGNOFF_PRINCIPAL": "test:alice"}
    clis = [
        subprocess.Popen(
            [sys.executable, "-m", "signoff", command, request_id, "--reason", "why"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for command in ("approve", "deny")
    ]
    results = [(*cli.communicate(timeout=60), cli.returncode) for cli in clis]
    assert sorted(code for _, _, code in results) == [0, 1], results
    [(won, _, _)] = [res for res in results if res[2] == 0]
    [(_, lost, _)] = [res for res in results if res[2] == 1]
    assert lost.startswith("error: ConflictingAnswer:") and len(lost.strip().splitlines()) == 1
    assert won.startswith(("approved ", "denied ")), won
    rt = so.Runtime([agent], store=url)
    try:
        events = rt.events_sync(r.session_id)
    finally:
        rt.close_sync()
    settled = [e.data["decision"] for e in events if e.type == "approval.settled"]
    assert settled == ["approve" if won.startswith("approved") else "cancel"], settled
    assert log.count() == 0  # recorded only: no runtime here drives the turn


async def test_reads_of_a_file_deleted_under_the_store_are_refused(tmp_path: Path) -> None:
    # The reader still holds the orphaned inode: it would answer from a file nobody writes to.
    path = tmp_path / "state.db"
    store = SQLiteStore(f"sqlite:///{path}")
    await store.create_session("s1", "a", [_event("s1", 1)], None)
    assert await store.head("s1") == 1
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    await asyncio.sleep(READ_CHECK_EVERY)  # reads check the file at most this often
    with pytest.raises(so.StoreError, match="deleted or replaced"):
        await store.head("s1")
    with pytest.raises(so.StoreError, match="deleted or replaced"):
        await store.read_events("s1")
    with pytest.raises(so.StoreError, match="deleted or replaced"):
        await store.load("s1")
    with pytest.raises(so.StoreError, match="deleted or replaced"):
        await store.pending(PendingFilter())
    await store.close()
    assert not path.exists()


async def test_reads_of_a_file_replaced_under_the_store_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    store = SQLiteStore(f"sqlite:///{path}")
    await store.create_session("s1", "a", [_event("s1", 1)], None)
    other = SQLiteStore(f"sqlite:///{tmp_path / 'backup.db'}")
    await other.create_session("s2", "a", [_event("s2", 1)], None)
    await other.close()
    os.replace(tmp_path / "backup.db", path)
    await asyncio.sleep(READ_CHECK_EVERY)
    with pytest.raises(so.StoreError, match="deleted or replaced"):
        await store.sessions()
    with pytest.raises(so.StoreError, match="nothing was read"):
        await store.get_request("r1")
    await store.close()


async def test_waiting_for_a_change_to_a_deleted_file_fails_instead_of_waiting_for_ever(
    tmp_path: Path,
) -> None:
    # `signoff events --follow`, the SSE stream and the dashboard poll the file: once it is gone
    # no change can ever show up, so the wait ends with the error rather than at its timeout.
    path = tmp_path / "state.db"
    store = SQLiteStore(f"sqlite:///{path}")
    await store.create_session("s1", "a", [_event("s1", 1)], None)
    for session_id in ("s1", None):
        waiting = asyncio.create_task(
            store.wait_for_change(session_id, timeout=600, poll_interval=0.01)
        )
        await asyncio.sleep(0.05)
        assert not waiting.done()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        with pytest.raises(so.StoreError, match="deleted or replaced"):
            await asyncio.wait_for(waiting, timeout=30)
        await store.close()
        store = SQLiteStore(f"sqlite:///{path}")
        await store.create_session("s1", "a", [_event("s1", 1)], None)
    await store.close()
