"""A process forked while a SQLite store had its file open: SQLite's record of the file and its
locks is copied into the child, the locks are not, so a connection the child made held none and
the parent's close deleted the -wal and -shm under it (its acknowledged commits lost with them).
The child may not use that file, through a new store or the copy, and is told so (`UsageError`)
before anything is written; a child forked after the store closed, one started with "spawn", one
forked while another file was open, and the parent itself go on."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import sqlite3
import threading
from multiprocessing.connection import Connection as Pipe
from pathlib import Path

import signoff as so
from signoff.stores import SQLiteStore
from signoff.testing import reply, scripted_agent

from ._fork_children import FORK, ended, in_child, open_files, try_to


def _event(sid: str) -> so.Event:
    return so.Event(session_id=sid, seq=1, type="session.created", at=1.0, data={})


def _sessions(path: Path) -> set[str]:
    """The sessions in the file, read once every store has closed it."""
    with sqlite3.connect(path) as db:
        found = {sid for (sid,) in db.execute("SELECT id FROM sessions")}
    db.close()
    return found


def _create(store: SQLiteStore, sid: str) -> None:
    asyncio.run(store.create_session(sid, "a", [_event(sid)], None))


def _new_store_writes(url: str, sid: str, out: Pipe) -> None:
    """In the child: a new store of `url` creates session `sid`."""
    try_to(out, lambda: _create(SQLiteStore(url), sid))


def _copy_writes_closes_writes(store: SQLiteStore, out: Pipe) -> None:
    """In the child: the store that came with the fork writes, is closed (whether the file is
    still open here is sent too), and writes again."""
    try_to(out, lambda: _create(store, "copy"))
    try_to(out, lambda: asyncio.run(store.close()))
    out.send(("open", str(os.path.realpath(store.path) in open_files())))
    try_to(out, lambda: _create(store, "copy"))


def _new_runtime_answers(url: str, out: Pipe) -> None:
    """In the child: a new runtime on `url` starts a session."""

    async def go() -> None:
        agent = scripted_agent("a", [reply("hi")], repeat_last=True)
        async with so.Runtime([agent], store=url) as rt:
            await rt.generate("a", prompt="hi")

    try_to(out, lambda: asyncio.run(go()))


def _refused(sent: tuple[str, str], done: str) -> None:
    kind, message = sent
    assert kind == "UsageError", sent
    assert "forked" in message and f"nothing was {done}" in message, message
    assert "Close the store" in message and '"spawn"' in message, message


async def test_a_child_forked_while_the_store_was_open_may_not_open_it(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    url = f"sqlite:///{path}"
    store = SQLiteStore(url)
    await store.create_session("s1", "a", [_event("s1")], None)
    [sent] = in_child(_new_store_writes, url, "child")
    _refused(sent, "opened")
    await store.create_session("s2", "a", [_event("s2")], None)  # the parent goes on
    await store.close()  # with nothing of the child's to delete
    assert _sessions(path) == {"s1", "s2"}


async def test_a_runtime_made_in_a_forked_child_is_refused_the_file(tmp_path: Path) -> None:
    # A runtime made anew in the child (as the README said to) answered, and the parent's close
    # lost what it wrote: in a hunt, a tool ran again for an answer already applied.
    path = tmp_path / "state.db"
    url = f"sqlite:///{path}"
    agent = scripted_agent("a", [reply("hi")], repeat_last=True)
    async with so.Runtime([agent], store=url) as rt:
        first = await rt.generate("a", prompt="hi")
        [sent] = in_child(_new_runtime_answers, url)
        _refused(sent, "opened")
        assert [s.id for s in await rt.sessions()] == [first.session_id]
    assert _sessions(path) == {first.session_id}


async def test_the_copy_of_an_open_store_a_child_was_forked_with_writes_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    store = SQLiteStore(f"sqlite:///{path}")
    await store.create_session("s1", "a", [_event("s1")], None)
    written, closed, kept, reopened = in_child(_copy_writes_closes_writes, store)
    _refused(written, "written")
    # Closing it is no error, and leaves SQLite's connection open: closed as the file's last
    # connection in the child, SQLite would fold the WAL as it was at the fork into the file.
    assert (closed, kept) == (("done", ""), ("open", "True"))
    _refused(reopened, "opened")
    await store.create_session("s2", "a", [_event("s2")], None)
    await store.close()
    assert _sessions(path) == {"s1", "s2"}


async def test_children_forked_after_the_store_closed_or_spawned_use_the_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    url = f"sqlite:///{path}"
    store = SQLiteStore(url)
    other = SQLiteStore(f"sqlite:///{tmp_path / 'other.db'}")  # open across every fork
    await other.create_session("o1", "a", [_event("o1")], None)
    await store.create_session("s1", "a", [_event("s1")], None)
    await store.close()
    assert in_child(_new_store_writes, url, "forked") == [("done", "")]
    await store.create_session("s2", "a", [_event("s2")], None)  # open again, in the parent
    spawned = in_child(_new_store_writes, url, "spawned", ctx=multiprocessing.get_context("spawn"))
    assert spawned == [("done", "")]
    await store.create_session("s3", "a", [_event("s3")], None)
    await store.close()
    await other.close()
    assert _sessions(path) == {"s1", "forked", "s2", "spawned", "s3"}


def _close_copy(store: SQLiteStore, out: Pipe) -> None:
    """In the child: the store that came with the fork is closed, then refuses a write."""
    asyncio.run(store.close())
    out.send(("closed", ""))
    try_to(out, lambda: _create(store, "copy"))


def test_the_copy_closes_though_a_thread_of_the_parent_held_its_lock_at_the_fork(
    tmp_path: Path,
) -> None:
    """A thread of the parent was in a call of the store at the fork: the child's copy of its
    lock came locked, owned by no thread there, and the copy's close, taking it, hung for
    ever."""
    url = f"sqlite:///{tmp_path}/s.db"
    store = SQLiteStore(url)
    _create(store, "first")
    read, write = FORK.Pipe(duplex=False)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with store._lock:
            held.set()
            release.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        held.wait(30)
        child = FORK.Process(target=_close_copy, args=(store, write))
        child.start()
        write.close()
        try:
            assert read.poll(30), "the copy's close hung"
            assert read.recv() == ("closed", "")
            _refused(read.recv(), "opened")
        finally:
            code = ended(child)
        assert code == 0
    finally:
        release.set()
        holder.join()
    _create(store, "second")  # the parent's store goes on
    asyncio.run(store.close())
    assert _sessions(tmp_path / "s.db") == {"first", "second"}
