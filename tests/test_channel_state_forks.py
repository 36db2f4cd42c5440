"""A process forked while a `ChannelState` had its file open (a gunicorn `--preload` master that
started a hub, a multiprocessing "fork" child): as with a SQLite store (tests/test_sqlite_forks.py),
SQLite's record of the file and its locks is copied into the child and the locks are not, so a
state the child opened held none and the parent's close deleted the -wal and -shm under it, with
the feed positions and memos it wrote after. The child may not use that file, through a new state
or the copy, and is told so (`UsageError`) before anything is read or written; a child forked
after the state closed, one started with "spawn", one forked while another file was open, a state
in memory, and the parent itself go on."""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
from multiprocessing.connection import Connection as Pipe
from pathlib import Path
from typing import Any

import signoff as so
from signoff.channels import ChannelState

from ._fork_children import FORK, ended, in_child, open_files, try_to


def _memos(path: Path) -> dict[str, Any]:
    """The memos of channel "slack" in the file, read once every state has closed it."""
    with sqlite3.connect(path) as db:
        found = {
            str(key): value
            for key, value in db.execute(
                "SELECT key, value FROM channel_memos WHERE channel='slack'"
            )
        }
    db.close()
    return found


def _refused(sent: tuple[str, str], done: str) -> None:
    kind, message = sent
    assert kind == "UsageError", sent
    assert "forked" in message and f"nothing was {done}" in message, message
    assert "Close the channel state" in message and '"spawn"' in message, message


def _new_state_remembers(path: str, key: str, out: Pipe) -> None:
    """In the child: a new state on `path` keeps memo `key`."""
    try_to(out, lambda: ChannelState(path).remember("slack", key, 1))


def _keep(state: ChannelState, key: str, talk: Pipe) -> None:
    """Keep memo `key`; send it with what that did: "done", or the error and its message."""
    try:
        state.remember("slack", key, 1)
        talk.send((key, "done", ""))
    except so.SignoffError as exc:
        talk.send((key, type(exc).__name__, str(exc)))


def _writes_across_the_parents_close(path: str, talk: Pipe) -> None:
    """In the child: a new state on `path` keeps a memo, waits for the parent to close its own,
    then keeps another (`_keep`); one that cannot be opened is sent as ("open", error, message)."""
    try:
        state = ChannelState(path)
    except so.SignoffError as exc:
        talk.send(("open", type(exc).__name__, str(exc)))
        talk.recv()
        return
    _keep(state, "child-before", talk)
    talk.recv()  # the parent closed its state
    _keep(state, "child-after", talk)
    state.close()


def _copy_used_closed_used(state: ChannelState, out: Pipe) -> None:
    """In the child: the state that came with the fork reads and writes, is closed (whether the
    file is still open here is sent too), and writes again."""
    try_to(out, lambda: state.remember("slack", "copy", 1))
    try_to(out, lambda: state.set_position("hub:slack", 9))
    try_to(out, lambda: state.forget("slack", "p1"))
    try_to(out, lambda: state.recall("slack", "p1"))
    try_to(out, lambda: state.memos("slack"))
    try_to(out, lambda: state.position("hub:slack"))
    try_to(out, state.identity)
    try_to(out, state.close)
    out.send(("open", str(os.path.realpath(state.path) in open_files())))
    try_to(out, lambda: state.remember("slack", "copy", 1))


def _copy_in_memory_used(state: ChannelState, out: Pipe) -> None:
    """In the child: the state in memory that came with the fork keeps and reads a memo."""
    state.remember("slack", "child", 2)
    out.send(("recalled", str((state.recall("slack", "parent"), state.recall("slack", "child")))))
    try_to(out, state.close)


def test_what_a_child_forked_while_the_state_was_open_writes_is_kept_or_refused(
    tmp_path: Path,
) -> None:
    # Before: the child's new state opened, and what it wrote after the parent closed the file
    # (the -wal deleted under it) was acknowledged and lost.
    path = tmp_path / "channels.db"
    state = ChannelState(path)
    state.remember("slack", "p1", 1)
    talk, there = FORK.Pipe()
    child = FORK.Process(target=_writes_across_the_parents_close, args=(str(path), there))
    child.start()
    there.close()
    sent = [talk.recv()]
    state.close()
    talk.send("closed")
    try:
        while True:
            sent.append(talk.recv())
    except EOFError:
        pass
    child.join(timeout=60)
    assert child.exitcode == 0
    kept = _memos(path)
    told_kept = {what for what, kind, _ in sent if kind == "done"}
    assert told_kept <= kept.keys(), (sent, kept)
    [(what, kind, message)] = sent
    assert what == "open"
    _refused((kind, message), "opened")
    assert kept == {"p1": "1"}


def test_a_child_forked_while_the_state_was_open_may_not_open_it(tmp_path: Path) -> None:
    path = tmp_path / "channels.db"
    state = ChannelState(path)
    state.remember("slack", "p1", 1)
    [sent] = in_child(_new_state_remembers, str(path), "child")
    _refused(sent, "opened")
    state.remember("slack", "p2", 2)  # the parent goes on
    state.close()  # with nothing of the child's to delete
    assert _memos(path) == {"p1": "1", "p2": "2"}


def test_the_copy_of_an_open_state_a_child_was_forked_with_reads_and_writes_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "channels.db"
    state = ChannelState(path)
    state.remember("slack", "p1", 1)
    state.set_position("hub:slack", 3)
    known = state.identity()  # the copy has it too
    sent = in_child(_copy_used_closed_used, state)
    assert len(sent) == 10, sent
    *writes, recalled, listed, position, identity, closed, kept, again = sent
    for each in writes:
        _refused(each, "written")
    for each in (recalled, listed, position, identity):
        _refused(each, "read")
    # Closing it is no error, and leaves SQLite's connection open, as a store's copy does
    # (`_forks` keeps it: the file's last connection in the child is never closed there).
    assert (closed, kept) == (("done", ""), ("open", "True"))
    _refused(again, "written")
    state.remember("slack", "p2", 2)
    assert state.position("hub:slack") == 3 and state.identity() == known
    state.close()
    assert _memos(path) == {"p1": "1", "p2": "2"}


def test_children_forked_after_the_state_closed_or_spawned_use_the_file(tmp_path: Path) -> None:
    path = tmp_path / "channels.db"
    other = ChannelState(tmp_path / "other.db")  # open across every fork
    other.remember("slack", "o1", 1)
    state = ChannelState(path)
    state.remember("slack", "p1", 1)
    state.close()
    assert in_child(_new_state_remembers, str(path), "forked") == [("done", "")]
    state = ChannelState(path)  # open again, in the parent
    spawn = multiprocessing.get_context("spawn")
    assert in_child(_new_state_remembers, str(path), "spawned", ctx=spawn) == [("done", "")]
    state.remember("slack", "p2", 2)
    state.close()
    other.close()
    assert _memos(path) == {"p1": "1", "forked": "1", "spawned": "1", "p2": "2"}


def test_a_state_in_memory_is_the_forked_childs_own_copy() -> None:
    state = ChannelState()
    state.remember("slack", "parent", 1)
    sent = in_child(_copy_in_memory_used, state)
    assert sent == [("recalled", "(1, 2)"), ("done", "")]
    assert state.recall("slack", "child") is None  # the parent's is its own
    state.close()


def _close_copy(state: ChannelState, out: Pipe) -> None:
    """In the child: the copy of the state is closed, then refuses a read all the same."""
    state.close()
    out.send(("closed", str(state.closed)))
    try_to(out, lambda: state.recall("slack", "k"))


def test_the_copy_closes_though_a_thread_of_the_parent_held_its_lock_at_the_fork(
    tmp_path: Path,
) -> None:
    """A thread of the parent was in a call of the state at the fork (a hub's write waiting on
    the file): the child's copy of its lock came locked, with no thread to let it go, and the
    copy's close, taking it, hung for ever (a gunicorn worker's hub never stopped)."""
    state = ChannelState(tmp_path / "channels.db")
    read, write = FORK.Pipe(duplex=False)
    try:
        with state._lock:
            child = FORK.Process(target=_close_copy, args=(state, write))
            child.start()
        write.close()
        try:
            assert read.poll(30), "the copy's close hung"
            assert read.recv() == ("closed", "True")
            _refused(read.recv(), "read")
        finally:
            code = ended(child)
        assert code == 0
        state.remember("slack", "k", 1)  # the parent's state goes on
        assert state.recall("slack", "k") == 1
    finally:
        state.close()
