"""A SQLite store on a full disk, a real one (a small tmpfs mounted for the test and filled):
no process had the file open, so it has no -wal and -shm, and SQLite cannot make the -shm it
reads through. It is read all the same (README, Guarantees), writes are refused naming the full
disk, and it takes writes again once there is room."""

from __future__ import annotations

import asyncio
import errno
import os
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

import signoff as so
from signoff.cli import app
from signoff.stores import Commit, SQLiteStore
from signoff.stores.sqlite import _connection
from signoff.stores.sqlite._files import open_access
from signoff.testing import reply, scripted_agent

from .test_sqlite_permissions import READER, as_user

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root, to mount a small file system and fill it"
)


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB file system of its own, unmounted after the test."""
    mounted = tmp_path / "disk"
    mounted.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mounted)], check=True)
    try:
        yield mounted
    finally:
        subprocess.run(["umount", "--lazy", str(mounted)], check=True)


def _fill(disk: Path) -> None:
    """Write to a file until the disk holds no more."""
    with (disk / "filler").open("ab", buffering=0) as filler:
        try:
            while True:
                filler.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc


def _event(sid: str, seq: int, type: str) -> so.Event:
    return so.Event(session_id=sid, seq=seq, type=type, at=float(seq), data={})  # type: ignore[arg-type]


async def _closed_store(disk: Path) -> tuple[str, str]:
    """A store with one finished session, closed (the file alone left), its disk then filled:
    its URL and the session's id."""
    url = f"sqlite:///{disk}/s.db"
    agent = scripted_agent("a", [reply("hi")], repeat_last=True)
    async with so.Runtime([agent], store=url) as rt:
        sid = (await rt.generate("a", prompt="hello")).session_id
    assert sorted(os.listdir(disk)) == ["s.db"]
    _fill(disk)
    return url, sid


async def test_a_closed_store_on_a_full_disk_is_read_and_written_once_there_is_room(
    disk: Path,
) -> None:
    url, sid = await _closed_store(disk)
    agent = scripted_agent("a", [reply("again")], repeat_last=True)
    async with so.Runtime([agent], store=url) as rt:
        assert [s.id for s in await rt.sessions()] == [sid]
        assert (await rt.state(sid)).status == "idle"
        assert await rt.pending() == []
        with pytest.raises(so.StoreError) as refused:
            await rt.generate(session_id=sid, prompt="again")
        said = str(refused.value)
        assert "no space left on the device" in said and "nothing was written" in said, said
        assert sorted(os.listdir(disk)) == ["filler", "s.db"]  # nothing made beside it
        assert (await rt.state(sid)).status == "idle"
        (disk / "filler").unlink()  # room again: the next call opens the file writable
        again = await rt.generate(session_id=sid, prompt="again")
        assert (again.status, again.text) == ("completed", "again")
    async with so.Runtime([agent], store=url) as rt:
        assert (await rt.state(sid)).status == "idle"
        assert len([e async for e in rt.events(sid, follow=False)]) > 4


def test_the_commands_read_a_closed_store_on_a_full_disk(disk: Path) -> None:
    url, sid = asyncio.run(_closed_store(disk))
    for args in (["pending"], ["sessions"], ["events", sid], ["db", "status"]):
        ran = CliRunner().invoke(app, [*args, "--store", url])
        assert ran.exit_code == 0, (args, ran.output, ran.stderr)
    assert sid in CliRunner().invoke(app, ["sessions", "--store", url]).stdout
    assert sorted(os.listdir(disk)) == ["filler", "s.db"]


_WRITER = """
import asyncio, sys
import signoff as so
from signoff.stores import Commit, SQLiteStore
store, sid = SQLiteStore(sys.argv[1]), sys.argv[2]
head = asyncio.run(store.head(sid))
event = so.Event(session_id=sid, seq=head + 1, type="turn.waiting", at=9.0, data={})
asyncio.run(store.commit(Commit(session_id=sid, expected_seq=head, events=[event])))
print("committed", flush=True)
sys.stdin.readline()
"""


async def test_a_reader_on_a_full_disk_sees_a_writer_that_came_with_room(disk: Path) -> None:
    # The reader reads the file alone; room is made, another process opens the file, commits
    # and keeps it open (its commit in its -wal), and the disk fills again. The reader must read
    # through that -wal, not the file as it was.
    url = f"sqlite:///{disk}/s.db"
    setup = SQLiteStore(url)
    await setup.create_session("s1", "a", [_event("s1", 1, "session.created")], None)
    await setup.close()
    _fill(disk)
    reader = SQLiteStore(url)
    assert await reader.head("s1") == 1
    (disk / "filler").unlink()
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, url, "s1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "committed"
        _fill(disk)
        assert sorted(os.listdir(disk)) == ["filler", "s.db", "s.db-shm", "s.db-wal"]
        assert await reader.head("s1") == 2
        with pytest.raises(so.StoreError):
            await reader.commit(
                Commit(session_id="s1", expected_seq=2, events=[_event("s1", 3, "turn.waiting")])
            )
        assert await reader.head("s1") == 2
    finally:
        writer.communicate("go\n", timeout=30)
        await reader.close()


async def test_a_new_store_on_a_full_disk_names_the_full_disk(disk: Path) -> None:
    _fill(disk)
    with pytest.raises(so.StoreError, match="no space left on the device"):
        await SQLiteStore(f"sqlite:///{disk}/new.db").head("s1")


async def test_a_full_disk_where_an_opener_failed_before_is_read(disk: Path) -> None:
    # Another program (the sqlite3 shell, an older signoff) tried to open the file on the full
    # disk: it left an empty -wal and a -shm it could not grow, which no connection uses.
    url, sid = await _closed_store(disk)
    other = sqlite3.connect(disk / "s.db")
    with pytest.raises(sqlite3.OperationalError, match="disk I/O error"):
        other.execute("SELECT count(*) FROM sessions").fetchone()
    other.close()
    assert sorted(os.listdir(disk)) == ["filler", "s.db", "s.db-shm", "s.db-wal"]
    agent = scripted_agent("a", [reply("again")], repeat_last=True)
    async with so.Runtime([agent], store=url) as rt:
        assert [s.id for s in await rt.sessions()] == [sid]
        with pytest.raises(so.StoreError, match="no space left on the device"):
            await rt.generate(session_id=sid, prompt="again")
        (disk / "filler").unlink()
        assert (await rt.generate(session_id=sid, prompt="again")).status == "completed"


async def test_a_disk_that_fills_as_the_store_opens_it_is_read(
    disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The disk had room when the store looked, none when SQLite made the -shm.
    url, sid = await _closed_store(disk)
    looked = []

    def with_room(path: str) -> str:
        looked.append(path)
        return "rw" if len(looked) == 1 else open_access(path)

    monkeypatch.setattr(_connection, "open_access", with_room)
    store = SQLiteStore(url)
    try:
        head = await store.head(sid)
        assert head is not None and head > 1 and len(looked) == 2
        with pytest.raises(so.StoreError, match="no space left on the device"):
            await store.commit(
                Commit(session_id=sid, expected_seq=1, events=[_event(sid, 2, "turn.waiting")])
            )
    finally:
        await store.close()


@pytest.fixture
def shared_disk() -> Iterator[Path]:
    """A 2 MiB file system every uid can reach (pytest's tmp_path is root's alone), writable
    by root alone."""
    folder = Path(tempfile.mkdtemp(prefix="signoff-full-", dir="/tmp"))
    folder.chmod(0o755)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=755", "tmpfs", folder], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], check=True)
        folder.rmdir()


def test_a_store_read_only_to_the_process_on_a_full_disk_says_so(shared_disk: Path) -> None:
    """The file is another user's to write: on a full disk its writes were refused as "on a full
    disk … writes again once the disk has room", which room never brought; it is read-only to
    this process, and said to be."""
    url, sid = asyncio.run(_closed_store(shared_disk))

    def write_as_reader() -> str:
        store = SQLiteStore(url)
        head = asyncio.run(store.head(sid))
        assert head is not None
        event = so.Event(session_id=sid, seq=head + 1, type="turn.waiting", at=9.0, data={})
        try:
            asyncio.run(store.commit(Commit(session_id=sid, expected_seq=head, events=[event])))
        except so.StoreError as exc:
            return str(exc)
        finally:
            asyncio.run(store.close())
        return "written"

    said = as_user(READER, write_as_reader)
    assert "read-only to this process" in said and "full disk" not in said, said
