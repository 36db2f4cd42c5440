"""A SQLite store this process may read but not write (another user's file, a directory it may
not write, a shared directory): it reads, creates no file, and a write is a `StoreError` naming
the permission problem. Each test reads in a forked child that dropped root for real uids; a
writer that has the file open meanwhile is another process (tests/_locks.py's `Keeper`): a child
forked while this one had it open may not open it."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import shutil
import sqlite3
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import signoff as so
from signoff._types import SessionStatus
from signoff.cli import app
from signoff.stores import Commit, PendingFilter, SQLiteStore
from signoff.testing import ExecutionLog, call, call_tools, reply, scripted_agent

from ._locks import kept_open
from .test_cli_queue import lapsed_pair, leases

READER = 65534  # nobody
OWNER = 65533  # an unprivileged uid of its own, that owns the store in a shared directory

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root, to fork children that drop to unprivileged uids"
)


def as_user(uid: int, fn: Callable[[], Any]) -> Any:
    """Run `fn` in a forked child as `uid` (no capabilities left); its result, or its error
    re-raised here."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            try:
                outcome: tuple[str, Any] = ("ok", fn())
            except BaseException as exc:
                outcome = ("error", (type(exc).__name__, str(exc)))
            with os.fdopen(write_end, "wb") as pipe:
                pickle.dump(outcome, pipe)
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    kind, value = pickle.loads(data)
    if kind == "error":
        raise AssertionError(f"in the child: {value[0]}: {value[1]}")
    return value


@pytest.fixture
def folder() -> Iterator[Path]:
    """A directory every uid can reach (pytest's tmp_path is root's alone)."""
    made = Path(tempfile.mkdtemp(prefix="signoff-perm-", dir="/tmp"))
    made.chmod(0o755)
    yield made
    shutil.rmtree(made)


def _event(sid: str, seq: int, type: str = "session.created") -> so.Event:
    return so.Event(session_id=sid, seq=seq, type=type, at=float(seq), data={})  # type: ignore[arg-type]


def _store_with_a_session(path: Path) -> None:
    async def go() -> None:
        store = SQLiteStore(f"sqlite:///{path}")
        await store.create_session("s1", "a", [_event("s1", 1)], None)
        await store.close()

    asyncio.run(go())


def _read_then_write(path: Path) -> tuple[int | None, int, str]:
    async def go() -> tuple[int | None, int, str]:
        store = SQLiteStore(f"sqlite:///{path}", busy_timeout=2)
        head = await store.head("s1")
        queue = len(await store.pending(PendingFilter()))
        try:
            await store.commit(
                Commit(session_id="s1", expected_seq=1, events=[_event("s1", 2, "turn.waiting")])
            )
            refused = ""
        except so.StoreError as exc:
            refused = str(exc)
        await store.close()
        return head, queue, refused

    return asyncio.run(go())


def _files(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_uid for p in folder.iterdir()}


def test_a_store_in_a_directory_the_reader_may_not_write_is_read(folder: Path) -> None:
    # No writer has the file open, so it has no -wal and -shm, and SQLite may not create them:
    # opening it as usual fails ("attempt to write a readonly database") before any read.
    path = folder / "state.db"
    _store_with_a_session(path)
    assert _files(folder) == {"state.db": 0}
    head, queue, refused = as_user(READER, lambda: _read_then_write(path))
    assert (head, queue) == (1, 0)
    assert "read-only to this process" in refused and "nothing was written" in refused
    assert _files(folder) == {"state.db": 0}
    assert asyncio.run(SQLiteStore(f"sqlite:///{path}").head("s1")) == 1


def test_a_store_a_writer_has_open_is_read_and_not_written(folder: Path) -> None:
    # The writer is another process: a child forked while this one had the file open may not
    # open it at all (SQLite's locks stay with the parent).
    path = folder / "state.db"
    _store_with_a_session(path)
    writer = SQLiteStore(f"sqlite:///{path}")
    with kept_open(path):
        asyncio.run(writer.acquire_lease("s1", "W", 60, 0))  # its -wal and -shm now exist
        asyncio.run(writer.close())  # the other process keeps them
        head, _, refused = as_user(READER, lambda: _read_then_write(path))
    assert head == 1 and "read-only to this process" in refused


def test_a_reader_in_a_shared_directory_leaves_nothing_that_stops_the_owner(
    folder: Path,
) -> None:
    # In a sticky shared directory SQLite would create the -wal and -shm as the reader, and the
    # owner could no longer write its own store ("attempt to write a readonly database").
    folder.chmod(0o1777)
    path = folder / "state.db"
    as_user(OWNER, lambda: _store_with_a_session(path))
    head, _, refused = as_user(READER, lambda: _read_then_write(path))
    assert head == 1 and "read-only" in refused
    assert _files(folder) == {"state.db": OWNER}
    head, _, refused = as_user(OWNER, lambda: _read_then_write(path))
    assert (head, refused) == (1, "")


def test_a_reader_sees_what_a_writer_starting_later_commits(folder: Path) -> None:
    # The reader opened the file before any writer (no -wal): it must still see later commits,
    # as `signoff events --follow` and the dashboard do, not the file as it was for ever.
    path = folder / "state.db"
    _store_with_a_session(path)
    go_read, go_write = os.pipe()
    go_wait, go_commit = os.pipe()

    def follow() -> tuple[int | None, bool, int | None]:
        async def go() -> tuple[int | None, bool, int | None]:
            store = SQLiteStore(f"sqlite:///{path}")
            before = await store.head("s1")
            os.write(go_commit, b"x")
            changed = await store.wait_for_change("s1", 60, after=1, poll_interval=0.01)
            after = await store.head("s1")
            await store.close()
            return before, changed, after

        return asyncio.run(go())

    async def commit_when_told() -> None:
        await asyncio.get_running_loop().run_in_executor(None, os.read, go_wait, 1)
        writer = SQLiteStore(f"sqlite:///{path}")
        await writer.commit(
            Commit(session_id="s1", expected_seq=1, events=[_event("s1", 2, "turn.waiting")])
        )
        os.write(go_write, b"x")

    committer = threading.Thread(target=lambda: asyncio.run(commit_when_told()))
    committer.start()
    try:
        assert as_user(READER, follow) == (1, True, 2)
    finally:
        committer.join(timeout=30)
        for fd in (go_read, go_write, go_wait, go_commit):
            os.close(fd)


def test_signoff_pending_reads_a_store_it_may_not_write_and_approve_says_why_not(
    folder: Path,
) -> None:
    log = ExecutionLog()

    @log.tool(approval=so.always())
    async def refund(order_id: str) -> str:
        return order_id

    agent = scripted_agent(
        "a", [call_tools(call("refund", order_id="1")), reply("Done.")], tools=[refund]
    )

    url = f"sqlite:///{folder / 'state.db'}"
    rt = so.Runtime([agent], store=url)
    try:
        request_id = rt.generate_sync("a", prompt="refund order 1").pending[0].id
    finally:
        rt.close_sync()
    args = ["pending", "--json", "--store", url]
    assert CliRunner().invoke(app, args).exit_code == 0  # imports what the child will need

    def cli() -> tuple[int, str, int, str]:
        listed = CliRunner().invoke(app, args)
        approve = ["approve", request_id, "--store", url, "--as", "test:bob", "--reason", "ok"]
        refused = CliRunner().invoke(app, approve)
        return listed.exit_code, listed.output, refused.exit_code, refused.output

    code, listed, refused_code, refused = as_user(READER, cli)
    assert code == 0 and request_id in listed
    assert refused_code == 1 and "StoreError" in refused and "read-only" in refused
    rt = so.Runtime([agent], store=url)
    try:
        assert [r.id for r in rt.pending_sync()] == [request_id]  # still open: nothing written
    finally:
        rt.close_sync()


def test_signoff_names_a_store_it_may_not_read_or_create(folder: Path) -> None:
    """A store file this user may not read, or a new one in a directory it may not write, is
    named as a permission problem, not SQLite's "unable to open database file"; nothing is
    created."""
    secret = folder / "secret.db"
    _store_with_a_session(secret)
    secret.chmod(0o600)
    closed = folder / "closed"
    closed.mkdir(mode=0o755)
    assert CliRunner().invoke(app, ["pending", "--store", "sqlite:///:memory:"]).exit_code == 0

    def cli() -> list[tuple[int, str]]:
        runs = [
            ["pending", "--store", f"sqlite:///{secret}"],
            ["db", "upgrade", "--store", f"sqlite:///{closed / 'new.db'}"],
        ]
        return [(r.exit_code, r.stderr) for r in (CliRunner().invoke(app, a) for a in runs)]

    (read, read_error), (create, create_error) = as_user(READER, cli)
    assert read == 1 and read_error == (
        f"error: StoreError: cannot open SQLite store {secret}: this user may not read it "
        "(permission denied)\n"
    )
    assert create == 1 and create_error == (
        f"error: StoreError: cannot open SQLite store {closed / 'new.db'}: this user may not "
        f"create files in {closed} (permission denied)\n"
    )
    assert list(closed.iterdir()) == []


def test_a_runtime_whose_tool_settings_changed_reads_a_store_it_may_not_write(
    folder: Path,
) -> None:
    # Opening a runtime records tool setting changes (a write): on a store this process may
    # only read, a runtime whose tool became ungated must still open and read the queue and the
    # session; the change is left for a process that may write, and nothing is written here.
    log = ExecutionLog()

    @log.tool(approval=so.always())
    async def refund(order_id: str) -> str:
        return order_id

    steps = [call_tools(call("refund", order_id="1")), reply("Done.")]
    url = f"sqlite:///{folder / 'state.db'}"
    rt = so.Runtime([scripted_agent("a", steps, tools=[refund])], store=url)
    try:
        parked = rt.generate_sync("a", prompt="refund order 1")
    finally:
        rt.close_sync()
    loose = so.tool(approval=so.never())(refund.fn)
    changed = scripted_agent("a", steps, tools=[loose])

    def read() -> tuple[list[str], str, int]:
        reader = so.Runtime([changed], store=url)
        try:
            pending = [r.id for r in reader.pending_sync()]
            status = reader.state_sync(parked.session_id).status
            return pending, status, len(reader.audit_sync(stream="tools:a.refund"))
        finally:
            reader.close_sync()

    assert as_user(READER, read) == ([parked.pending[0].id], "waiting", 1)
    rt = so.Runtime([changed], store=url)
    try:  # a process that may write records the change when it opens
        history = rt.audit_sync(stream="tools:a.refund")
        assert [(e.data["old"], e.data["new"]) for e in history] == [
            (None, "Always"),
            ("Always", "Never"),
        ]
    finally:
        rt.close_sync()


def test_a_write_refused_by_a_wal_file_the_writer_may_not_write_names_why(folder: Path) -> None:
    # The file itself is writable, so the store opens it for writing; SQLite refuses the write
    # only then, and the error must still say it is a matter of permission.
    path = folder / "state.db"
    _store_with_a_session(path)
    path.chmod(0o666)
    writer = SQLiteStore(f"sqlite:///{path}")
    with kept_open(path):
        asyncio.run(writer.acquire_lease("s1", "W", 60, 0))
        asyncio.run(writer.close())  # the other process keeps its -wal and -shm
        Path(f"{path}-wal").chmod(0o644)
        Path(f"{path}-shm").chmod(0o644)
        head, _, refused = as_user(READER, lambda: _read_then_write(path))
    assert head == 1 and "may read the store but not write it" in refused, refused


def test_a_runtime_with_the_agent_lists_a_read_only_store_past_a_deadline(folder: Path) -> None:
    # Listing the queue applies passed deadlines (a write) for the agents the runtime has; on a
    # store this process may only read, the listing still answers, showing the request as its
    # deadline leaves it (left out), and the store is left as it was.
    log = ExecutionLog()

    @log.tool(approval=so.always(expires_in=60))
    async def refund(order_id: str) -> str:
        return order_id

    agent = scripted_agent(
        "a", [call_tools(call("refund", order_id="1")), reply("Done.")], tools=[refund]
    )
    url = f"sqlite:///{folder / 'state.db'}"
    rt = so.Runtime([agent], store=url, clock=lambda: 1000.0)
    try:
        rt.generate_sync("a", prompt="refund order 1")
    finally:
        rt.close_sync()

    def listed() -> tuple[int, int]:
        later = so.Runtime([agent], store=url, clock=lambda: 2000.0)
        try:
            return len(later.pending_sync()), len(later.pending_page_sync(PendingFilter())[0])
        finally:
            later.close_sync()

    assert as_user(READER, listed) == (0, 0)
    rt = so.Runtime([agent], store=url, clock=lambda: 1000.0)
    try:
        assert len(rt.pending_sync()) == 1  # nothing was written
    finally:
        rt.close_sync()


def test_a_runtime_with_the_agent_lists_a_read_only_store_past_a_session_ttl(
    folder: Path,
) -> None:
    # Listing sessions records the expiry of one whose TTL passed running (a write); on a store
    # this process may only read, the listing still answers, showing the session as its expiry
    # leaves it (failed, not running), and the store is left as it was.
    agent = scripted_agent("a", [reply("Done.")], limits=so.Limits(ttl=60))
    url = f"sqlite:///{folder / 'state.db'}"
    rt = so.Runtime([agent], store=url, clock=lambda: 1000.0, inline=False)
    try:
        rt.generate_sync("a", prompt="hello")
    finally:
        rt.close_sync()

    def listed() -> tuple[list[SessionStatus], list[SessionStatus]]:
        later = so.Runtime([agent], store=url, clock=lambda: 2000.0)
        try:
            running = [s.status for s in later.sessions_sync(status="running")]
            return running, [s.status for s in later.sessions_sync()]
        finally:
            later.close_sync()

    assert as_user(READER, listed) == ([], ["failed"])
    rt = so.Runtime([agent], store=url, clock=lambda: 1000.0)
    try:
        assert [s.status for s in rt.sessions_sync()] == ["running"]  # nothing was written
    finally:
        rt.close_sync()


def _follow_while_another_commits(
    path: Path, before_commit: Callable[[], None] = lambda: None
) -> tuple[int | None, bool, int | None]:
    """The reader (as `READER`) reads the session's head, then, after `before_commit` and
    another store's commit and close as root, waits for the change and reads the head again."""
    go_read, go_write = os.pipe()
    go_wait, go_commit = os.pipe()

    def follow() -> tuple[int | None, bool, int | None]:
        async def go() -> tuple[int | None, bool, int | None]:
            store = SQLiteStore(f"sqlite:///{path}")
            before = await store.head("s1")
            os.write(go_commit, b"x")
            os.read(go_read, 1)  # the writer has committed and closed
            changed = await store.wait_for_change("s1", 2, after=1, poll_interval=0.01)
            after = await store.head("s1")
            await store.close()
            return before, changed, after

        return asyncio.run(go())

    async def commit_when_told() -> None:
        await asyncio.get_running_loop().run_in_executor(None, os.read, go_wait, 1)
        before_commit()
        writer = SQLiteStore(f"sqlite:///{path}")
        await writer.commit(
            Commit(session_id="s1", expected_seq=1, events=[_event("s1", 2, "turn.waiting")])
        )
        await writer.close()
        os.write(go_write, b"x")

    committer = threading.Thread(target=lambda: asyncio.run(commit_when_told()))
    committer.start()
    try:
        seen: tuple[int | None, bool, int | None] = as_user(READER, follow)
        return seen
    finally:
        committer.join(timeout=30)
        for fd in (go_read, go_write, go_wait, go_commit):
            os.close(fd)


def test_a_reader_sees_a_commit_by_a_writer_that_came_and_went(folder: Path) -> None:
    # The reader opened the file as immutable (no writer had it); a writer then opens it,
    # commits and closes, checkpointing into the file and deleting its -wal between two of the
    # reader's polls. `signoff events --follow` must still see the commit.
    path = folder / "state.db"
    _store_with_a_session(path)
    assert _follow_while_another_commits(path) == (1, True, 2)
    assert _files(folder) == {"state.db": 0}


def test_a_reader_sees_commits_after_the_writer_it_read_through_closed(folder: Path) -> None:
    # The reader opened the file while a writer (another process) had it, reading through its
    # -wal and -shm; that writer closes, and another opens, commits and closes. The reader
    # must see that commit, not the file as it was when the first writer went.
    path = folder / "state.db"
    _store_with_a_session(path)
    with kept_open(path) as first:  # its -wal and -shm now exist
        assert _follow_while_another_commits(path, first.close) == (1, True, 2)


def test_a_read_only_store_of_a_newer_signoff_says_to_upgrade(folder: Path) -> None:
    # Writing it as another user would not help: this signoff is too old for it.
    path = folder / "state.db"
    _store_with_a_session(path)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value='99' WHERE key='schema'")
    db.close()

    def opened() -> str:
        try:
            asyncio.run(SQLiteStore(f"sqlite:///{path}").head("s1"))
        except so.StoreError as exc:
            return f"{type(exc).__name__}: {exc}"
        return ""

    refused = as_user(READER, opened)
    assert refused.startswith("SchemaVersionError") and "Upgrade signoff" in refused, refused


def test_a_copy_with_its_wal_but_no_shm_in_a_directory_the_reader_may_not_write(
    folder: Path,
) -> None:
    # A store copied with its -wal (commits not yet in the file) but not its -shm: reading the
    # WAL needs a -shm, which the reader may not create there. Read without the WAL, the answers
    # would miss those commits; refused, the error names the -shm and what to do.
    live, copy = folder / "live", folder / "copy"
    live.mkdir()
    copy.mkdir(mode=0o755)
    _store_with_a_session(live / "state.db")
    writer = SQLiteStore(f"sqlite:///{live / 'state.db'}")
    asyncio.run(
        writer.commit(
            Commit(session_id="s1", expected_seq=1, events=[_event("s1", 2, "turn.waiting")])
        )
    )
    try:
        for name in ("state.db", "state.db-wal"):
            shutil.copyfile(live / name, copy / name)
            (copy / name).chmod(0o644)
    finally:
        writer.conn.close()
    with pytest.raises(AssertionError) as refused:
        as_user(READER, lambda: _read_then_write(copy / "state.db"))
    said = str(refused.value)
    assert "StoreError" in said and f"{copy / 'state.db'}-shm" in said, said
    assert _files(copy) == {"state.db": 0, "state.db-wal": 0}
    assert asyncio.run(SQLiteStore(f"sqlite:///{copy / 'state.db'}").head("s1")) == 2


def test_a_reader_through_a_symlink_sees_the_commits_in_the_writers_wal(folder: Path) -> None:
    # The store's path is a symlink to the file in another directory: SQLite keeps the -wal and
    # -shm beside the file, not the link. A reader that looked for them beside the link would
    # read the file alone (immutable), missing the commits still in the writer's WAL.
    real, links = folder / "real", folder / "links"
    real.mkdir(mode=0o755)
    links.mkdir(mode=0o755)
    (links / "state.db").symlink_to(real / "state.db")
    _store_with_a_session(real / "state.db")
    writer = SQLiteStore(f"sqlite:///{links / 'state.db'}")
    with kept_open(real / "state.db"):
        asyncio.run(
            writer.commit(
                Commit(session_id="s1", expected_seq=1, events=[_event("s1", 2, "turn.waiting")])
            )
        )
        asyncio.run(writer.close())  # its commit stays in the -wal the other process keeps
        assert sorted(_files(real)) == ["state.db", "state.db-shm", "state.db-wal"]
        head, _, refused = as_user(READER, lambda: _read_then_write(links / "state.db"))
    assert head == 2 and "read-only to this process" in refused, (head, refused)
    assert sorted(_files(links)) == ["state.db"]


def test_the_sessions_command_tells_a_held_session_on_a_store_it_may_only_read(
    folder: Path,
) -> None:
    # `signoff sessions` reads whether a live drive holds a session whose TTL passed running: on
    # a file this user may only read, the one a worker elsewhere holds is still listed running,
    # the one no drive holds failed, and the store is left as it was. Its lease probe (a lease
    # taken and given back, a write) was refused here, and both were listed failed.
    url = f"sqlite:///{folder / 'state.db'}"
    held, free = lapsed_pair(url)

    def listed() -> dict[str, str]:
        result = CliRunner().invoke(app, ["sessions", "--store", url, "--json"])
        assert result.exit_code == 0, result.output
        return {r["id"]: r["status"] for r in json.loads(result.stdout)}

    before = leases(url)
    assert as_user(READER, listed) == {held: "running", free: "failed"}
    assert leases(url) == before


def test_signoff_names_a_read_only_file_system_as_such(folder: Path) -> None:
    """A store to create on a file system mounted read-only (a container's volume) was named a
    permission problem of "this user", which no chmod or other user mends; here the mount is
    made in a mount namespace of the command's own, gone with it."""
    import subprocess
    import sys

    mounted = folder / "volume"
    mounted.mkdir()
    src = Path(__file__).resolve().parents[1] / "src"
    script = (
        f"mount -t tmpfs -o ro tmpfs {mounted} && exec {sys.executable} -m signoff db upgrade "
        f"--store sqlite:///{mounted / 'new.db'}"
    )
    ran = subprocess.run(
        ["unshare", "--mount", "sh", "-c", script],
        env={**os.environ, "PYTHONPATH": str(src)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 1, ran
    assert ran.stderr == (
        f"error: StoreError: cannot open SQLite store {mounted / 'new.db'}: the file system "
        f"holding {mounted} is mounted read-only\n"
    )


def test_a_store_opened_read_only_writes_once_its_mode_allows(folder: Path) -> None:
    """The store's owner made it read-only (444), then writable again: the process that opened
    it meanwhile refused every write until it restarted, though README says a store that
    refuses writes is written once it takes them again. It opens the file anew, writable."""
    path = folder / "state.db"
    _store_with_a_session(path)
    os.chown(path, OWNER, OWNER)
    os.chown(folder, OWNER, OWNER)
    path.chmod(0o444)

    def read_then_mended() -> tuple[str, int | None]:
        async def go() -> tuple[str, int | None]:
            store = SQLiteStore(f"sqlite:///{path}", busy_timeout=2)
            assert await store.head("s1") == 1
            write = Commit(
                session_id="s1", expected_seq=1, events=[_event("s1", 2, "turn.waiting")]
            )
            try:
                await store.commit(write)
                refused = ""
            except so.StoreError as exc:
                refused = str(exc)
            path.chmod(0o644)  # its owner makes it writable again
            await store.commit(write)
            head = await store.head("s1")
            await store.close()
            return refused, head

        return asyncio.run(go())

    refused, head = as_user(OWNER, read_then_mended)
    assert "read-only to this process" in refused
    assert head == 2
    assert asyncio.run(SQLiteStore(f"sqlite:///{path}").head("s1")) == 2
