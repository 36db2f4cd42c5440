"""`ChannelState` shared by several processes, as two `signoff serve --channel-state` on one file
do: opening a new file together, and a lock held elsewhere. Each failure is a named
`StoreError`, never a raw `sqlite3` error; an empty path is a `UsageError`.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import ChannelHub, ChannelState
from signoff.channels._base import waiting_until

from ._locks import holding, open_together


def test_opening_waits_for_a_writer_elsewhere_instead_of_failing(tmp_path: Path) -> None:
    # SQLite refuses the switch to WAL at once while another process writes to a file not yet
    # in WAL, without its busy handler: the open must wait as a write would.
    path = tmp_path / "channels.db"
    with holding(path) as holder:
        opened: list[ChannelState] = []
        errors: list[BaseException] = []

        def open_it() -> None:
            try:
                opened.append(ChannelState(path, busy_timeout=10))
            except BaseException as exc:
                errors.append(exc)

        opener = threading.Thread(target=open_it)
        opener.start()
        opener.join(timeout=0.3)
        assert errors == [] and opener.is_alive(), errors
        holder.release()
        opener.join(timeout=10)
        assert not opener.is_alive() and errors == [], errors
    (state,) = opened
    state.set_position("hub:slack", 7)
    assert state.position("hub:slack") == 7
    state.close()


def _open_at(path: str) -> None:
    state = ChannelState(path)
    state.remember("slack", "msg:r1", {"ts": "1.2"})
    state.close()


def test_processes_opening_a_new_file_at_once_all_open_it(tmp_path: Path) -> None:
    # Two `signoff serve --channel-state` (and more) started together on a file not there yet.
    open_together(_open_at, [str(tmp_path / f"channels-{trial}.db") for trial in range(40)])


def test_a_write_locked_elsewhere_past_the_timeout_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "channels.db"
    state = ChannelState(path, busy_timeout=0.2)
    state.set_position("hub:slack", 1)
    state.remember("slack", "msg:r1", {"ts": "1.2"})
    with holding(path) as holder:
        with pytest.raises(so.StoreError, match=r"channel state .*save a position.*locked"):
            state.set_position("hub:slack", 2)
        with pytest.raises(so.StoreError, match=r"channel state .*save a memo.*locked"):
            state.remember("slack", "msg:r2", {"ts": "3.4"})
        with pytest.raises(so.StoreError, match=r"channel state .*delete a memo.*locked"):
            state.forget("slack", "msg:r1")
        assert state.position("hub:slack") == 1  # WAL: reads go on under another's write
        holder.release()
    state.set_position("hub:slack", 2)  # the lock is gone: it works again
    assert state.position("hub:slack") == 2
    assert state.recall("slack", "msg:r1") == {"ts": "1.2"}
    state.close()


def test_calls_given_a_deadline_wait_for_the_state_only_until_it(tmp_path: Path) -> None:
    # What must answer Slack in time: neither another process's lock on the file nor another
    # thread's call waiting for it holds such a call for the state's busy_timeout.
    path = tmp_path / "channels.db"
    state = ChannelState(path, busy_timeout=30)
    state.remember("slack", "msg:r1", {"ts": "1.2"})
    with holding(path) as holder:
        began = time.monotonic()
        with (
            waiting_until(time.monotonic() + 0.3),
            pytest.raises(so.StoreError, match=r"channel state .*save a memo.*locked"),
        ):
            state.remember("slack", "msg:r2", {"ts": "3.4"})
        assert time.monotonic() - began < 10
        assert state._conn.execute("PRAGMA busy_timeout").fetchone() == (30000,)  # restored
        patient = threading.Thread(target=state.remember, args=("slack", "msg:r3", 3))
        patient.start()  # holds the state's lock while it waits for the file's
        held_by = time.monotonic() + 10  # a sleep of 0.2 s was not always enough under load
        while not state._lock.locked() and time.monotonic() < held_by:
            time.sleep(0.01)
        assert state._lock.locked()
        with (
            waiting_until(time.monotonic() + 0.3),
            pytest.raises(so.StoreError, match=r"read a memo: busy past the deadline"),
        ):
            state.recall("slack", "msg:r1")
        holder.release()
        patient.join(timeout=10)
    with waiting_until(time.monotonic() + 0.3):  # free: it works as ever
        state.remember("slack", "msg:r2", {"ts": "3.4"})
    assert [key for key, _ in state.memos("slack")] == ["msg:r1", "msg:r3", "msg:r2"]
    with waiting_until(time.monotonic() - 1):  # past: only what needs no wait
        assert state.recall("slack", "msg:r2") == {"ts": "3.4"}
    state.close()


def test_a_read_of_a_damaged_file_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "channels.db"
    state = ChannelState(path)
    state.set_position("hub:slack", 1)
    state.remember("slack", "msg:r1", {"ts": "1.2"})
    state.close()
    data = path.read_bytes()
    page = int.from_bytes(data[16:18], "big")  # the page size, from the header
    path.write_bytes(data[:page] + b"\xff" * (len(data) - page))  # the tables' pages ruined
    state = ChannelState(path)
    with pytest.raises(so.StoreError, match=r"channel state .*read a position"):
        state.position("hub:slack")
    with pytest.raises(so.StoreError, match=r"channel state .*read a memo"):
        state.recall("slack", "msg:r1")
    state.close()


def test_a_closed_state_is_a_store_error() -> None:
    state = ChannelState()
    state.close()
    with pytest.raises(so.StoreError, match="channel state"):
        state.position("hub:slack")


def test_every_write_is_synced_whatever_the_sqlite_build_defaults_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A memo saved before Slack is told 200 must survive a power cut: in WAL mode only
    # synchronous=FULL syncs each commit, and some builds default to NORMAL (as here).
    connect = sqlite3.connect

    def normal_by_default(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn: sqlite3.Connection = connect(*args, **kwargs)
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    monkeypatch.setattr(sqlite3, "connect", normal_by_default)
    state = ChannelState(tmp_path / "channels.db")
    try:
        assert state._conn.execute("PRAGMA synchronous").fetchone() == (2,)  # FULL
    finally:
        state.close()


def test_memos_are_listed_by_literal_prefix_oldest_first() -> None:
    state = ChannelState()
    state.remember("hooks", "outbox:b", 1)
    state.remember("hooks", "outbox:a", 2)
    state.remember("hooks", "outbox%", 3)  # no LIKE wildcards: % and _ are plain characters
    state.remember("hooks", "outbox_x", 4)
    state.remember("other", "outbox:c", 5)
    state.remember("hooks", "outbox:b", 6)  # an update keeps its place
    assert state.memos("hooks", "outbox:") == [("outbox:b", 6), ("outbox:a", 2)]
    assert [k for k, _ in state.memos("hooks")] == ["outbox:b", "outbox:a", "outbox%", "outbox_x"]


@pytest.mark.parametrize("name", ["file:channels.db", "file::memory:"])
def test_a_relative_path_starting_with_file_colon_is_that_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """SQLite built with SQLITE_USE_URI (Debian's is) reads a name starting with `file:` as a
    URI even when not asked to: `--channel-state file:channels.db` kept the memos in
    `channels.db`, and `file::memory:` in memory, lost when the process ended, as the store
    did before (see tests/test_sqlite_connection.py). The path names the file, as any other."""
    monkeypatch.chdir(tmp_path)
    state = ChannelState(name)
    try:
        state.remember("slack", "msg:r1", {"ts": "1.2"})
    finally:
        state.close()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(("-wal", "-shm"))) == [
        name
    ]
    again = ChannelState(tmp_path / name)
    try:
        assert again.recall("slack", "msg:r1") == {"ts": "1.2"}
    finally:
        again.close()


def test_an_empty_state_path_is_refused_not_kept_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`state="$UNSET"` (as `signoff serve --channel-state ""` passed it) made a hub keep its
    positions in memory, and `ChannelState("")` SQLite's temporary file: both lost on restart,
    and neither said so."""
    monkeypatch.chdir(tmp_path)
    rt = so.Runtime([], store=f"sqlite:///{tmp_path}/s.db")
    with pytest.raises(so.UsageError, match=r"^state must name a file, or be None for memory"):
        ChannelHub(rt, [], state="")

    async def in_a_loop() -> None:  # where a hub opens its file only when it starts
        ChannelHub(rt, [], state="")

    with pytest.raises(so.UsageError, match=r"^state must name a file"):
        asyncio.run(in_a_loop())
    with pytest.raises(so.UsageError, match=r"^path must name a file, or be ':memory:'"):
        ChannelState("")
    assert list(tmp_path.iterdir()) == []
