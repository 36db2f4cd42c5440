"""`ChannelState` shared by several processes, as two `signoff serve --channel-state` on one file
do: opening a new file together, and a lock held elsewhere. Each failure is a named
`StoreError`, never a raw `sqlite3` error."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import Channel, ChannelHub, ChannelState, WebhookChannel, verify_webhook
from signoff.channels._base import waiting_until
from signoff.channels._state import STATE_SCHEMA
from signoff.testing import call, call_tools, scripted_agent

from ._forks import Scripts
from ._locks import holding, open_together
from ._wal import SPILL, uncommitted_frames
from .test_sqlite_upgrade import _child_env


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
        time.sleep(0.2)
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


# -- one hub delivers per state file: the others stand by ---------------------------------------


class Seen(Channel):
    """Records the requests it is told opened."""

    def __init__(self, name: str = "seen") -> None:
        super().__init__(name=name)
        self.opened: list[str] = []

    async def on_requested(self, request: so.InputRequest) -> None:
        self.opened.append(request.id)


def gated(tmp_path: Path) -> so.Runtime:
    """A runtime whose every turn opens one approval request."""

    @so.tool(approval=so.always())
    async def deploy(env: str) -> str:
        """Deploy."""
        return env

    agent = scripted_agent(
        "ops", [call_tools(call("deploy", env="prod"))], tools=[deploy], repeat_last=True
    )
    return so.Runtime([agent], store=f"sqlite:///{tmp_path / 'state.db'}")


async def open_one(rt: so.Runtime) -> str:
    (request,) = (await rt.generate("ops", prompt="deploy")).pending
    return request.id


async def test_two_hubs_on_one_state_file_deliver_each_request_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "channels.db"
    async with gated(tmp_path) as rt:
        first, second = Seen(), Seen()
        one = ChannelHub(rt, [first], state=state)
        two = ChannelHub(rt, [second], state=state)
        await one.start(follow=False)
        with caplog.at_level(logging.WARNING, logger="signoff.channels"):
            await two.start(follow=False)
        try:
            r1 = await open_one(rt)
            for _ in range(3):
                await two.poll()
                await one.poll()
            assert first.opened == [r1] and second.opened == []
            assert one.active and not two.active
            standby = [r for r in caplog.records if "stands by" in r.getMessage()]
            assert len(standby) == 1  # said once, not on every poll
            await one.stop()  # the first lets go: the second delivers from where it stopped
            r2 = await open_one(rt)
            await two.poll()
            assert two.active and second.opened == [r2]
            await one.start(follow=False)  # back again, it is now the standby
            await one.poll()
            assert not one.active and first.opened == [r1]
            # another hub name, or another channel, has its own position and its own lock
            other = ChannelHub(rt, [Seen()], state=state, name="other")
            await other.start(follow=False)
            assert other.active
            await other.stop()
            hooks, again = Seen("hooks"), Seen()
            both = ChannelHub(rt, [again, hooks], state=state)
            await both.start(follow=False)
            r3 = await open_one(rt)
            await both.poll()
            await two.poll()
            assert not both.active  # it delivers to hooks, and stands by for seen
            assert hooks.opened == [r3] and again.opened == [] and second.opened == [r2, r3]
            await two.stop()
            await both.poll()
            assert both.active and again.opened == []  # r3 was delivered already
            r4 = await open_one(rt)
            await both.poll()
            assert again.opened == hooks.opened[1:] == [r4]
            await both.stop()
        finally:
            await one.stop()
            await two.stop()


async def test_hubs_on_memory_states_share_nothing_and_each_delivers(tmp_path: Path) -> None:
    async with gated(tmp_path) as rt:
        first, second = Seen(), Seen()
        async with ChannelHub(rt, [first]) as one, ChannelHub(rt, [second]) as two:
            assert one.active and two.active


async def test_names_that_would_share_a_position_or_a_lock_are_refused(tmp_path: Path) -> None:
    """A channel's position is kept under `<hub>:<channel>` and its lock under `<hub>.<channel>`:
    hub `a:b` with channel `c` and hub `a` with channel `b:c` would share a position, and one
    hub would skip what it never delivered. Names with `:` or `.` are refused at once."""

    class Dotted(Channel):
        name = "b.c"  # a subclass's name set on the class, not through __init__

    async with gated(tmp_path) as rt:
        for hub, channel in (("a:b", "c"), ("a", "b:c"), ("a.b", "c"), ("a", "b.c")):
            with pytest.raises(so.UsageError, match="':' or '.'"):
                ChannelHub(rt, [Seen(channel)], state=tmp_path / "hub.db", name=hub)
        with pytest.raises(so.UsageError, match="':' or '.'"):
            ChannelHub(rt, [Dotted()], state=tmp_path / "hub.db", name="a")
        assert not (tmp_path / "hub.db").exists()  # nothing was opened or written
        # what the names keep apart still works: another hub's channel of the same name
        first, second = Seen("c"), Seen("c")
        one = ChannelHub(rt, [first], state=tmp_path / "hub.db", name="a-b")
        two = ChannelHub(rt, [second], state=tmp_path / "hub.db", name="a_b")
        await one.start(follow=False)
        await two.start(follow=False)
        try:
            assert one.active and two.active
            r1 = await open_one(rt)
            await one.poll()
            await two.poll()
            assert first.opened == second.opened == [r1]
        finally:
            await one.stop()
            await two.stop()


_HUB = """
import asyncio, sys
import signoff as so
from signoff.channels import Channel, ChannelHub

class Log(Channel):
    name = "seen"

    async def on_requested(self, request):
        with open(sys.argv[3], "a") as out:
            out.write(request.id + "\\n")

async def main():
    async with so.Runtime([], store=sys.argv[1]) as rt:
        async with ChannelHub(rt, [Log()], state=sys.argv[2], poll_interval=0.05) as hub:
            print("active" if hub.active else "standby", flush=True)
            await asyncio.Event().wait()

asyncio.run(main())
"""


async def until(check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_a_standby_hub_takes_over_when_the_delivering_process_is_killed(
    tmp_path: Path,
) -> None:
    # As two `signoff serve --channel-state` on one file: the first delivers, then dies.
    state, log = tmp_path / "channels.db", tmp_path / "delivered.txt"
    log.touch()
    async with gated(tmp_path) as rt:
        proc = subprocess.Popen(
            [sys.executable, "-c", _HUB, str(rt.store.url), str(state), str(log)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "active"
            seen = Seen()
            async with ChannelHub(rt, [seen], state=state, poll_interval=0.05) as hub:
                assert not hub.active
                reader = ChannelState(state)
                start = reader.position("hub:seen")
                assert start is not None
                r1 = await open_one(rt)
                await until(lambda: (reader.position("hub:seen") or 0) > start)
                assert log.read_text().split() == [r1]
                proc.kill()  # SIGKILL: no goodbye, the OS lets go of its lock
                proc.wait()
                await until(lambda: hub.active, timeout=5)
                r2 = await open_one(rt)
                await until(lambda: seen.opened == [r2])
                await asyncio.sleep(0.2)
                assert seen.opened == [r2] and log.read_text().split() == [r1]
                reader.close()
        finally:
            proc.kill()
            proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()


# -- the file's layout: older ones brought up to date in place, newer ones refused --------------

OLD_LAYOUT = """
CREATE TABLE channel_positions (name TEXT PRIMARY KEY, after_id INTEGER NOT NULL);
CREATE TABLE channel_memos (channel TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
    PRIMARY KEY (channel, key));
"""
"""The tables as signoff wrote them before memos were kept per hub (the file unmarked)."""


def old_state_file(
    path: Path, positions: dict[str, int], memos: list[tuple[str, str, Any]]
) -> None:
    """A state file in the old layout, as a process of that signoff left it."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(OLD_LAYOUT)
    conn.executemany("INSERT INTO channel_positions VALUES (?, ?)", positions.items())
    conn.executemany(
        "INSERT INTO channel_memos VALUES (?, ?, ?)",
        [(channel, key, json.dumps(value)) for channel, key, value in memos],
    )
    conn.close()


def layout_of(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


OLD_MEMOS: list[tuple[str, str, Any]] = [
    ("webhooks", "outbox:https://a.example/h whd_1", {"event": "request.opened", "body": "{}"}),
    ("slack", "msg:r1", {"channel": "C42", "ts": "1.2"}),
    ("hub:slack", "skipped", [5]),  # the hub's own memo, under its position's name
    ("webhooks", "warned:r1", True),
    ("terminal", "seen", 3),  # a channel no hub ran (bound by hand)
]


def test_an_old_files_memos_go_to_each_hub_that_ran_the_channel(tmp_path: Path) -> None:
    path = tmp_path / "channels.db"
    positions = {"ops:webhooks": 9, "audit:webhooks": 8, "hub:slack": 7}
    old_state_file(path, positions, OLD_MEMOS)
    state = ChannelState(path)
    assert layout_of(path) == STATE_SCHEMA == 1
    outbox = ("outbox:https://a.example/h whd_1", {"event": "request.opened", "body": "{}"})
    for hub in ("ops", "audit"):  # which of them queued the delivery, the old file cannot say
        assert state.memos("webhooks", hub=hub) == [outbox, ("warned:r1", True)]  # in order
    assert state.memos("webhooks") == []
    assert state.recall("slack", "msg:r1", hub="hub") == {"channel": "C42", "ts": "1.2"}
    assert state.recall("slack", "msg:r1") is None
    assert state.recall("hub:slack", "skipped") == [5]
    assert state.recall("terminal", "seen") == 3
    assert {name: state.position(name) for name in positions} == positions
    state.close()
    again = ChannelState(path)  # brought up to date once: opening it again changes nothing
    assert again.memos("webhooks", hub="ops") == [outbox, ("warned:r1", True)]
    again.close()


def test_memos_of_same_named_channels_of_two_hubs_are_kept_apart() -> None:
    state = ChannelState()
    state.remember("webhooks", "warned:r1", True, hub="ops")
    state.remember("webhooks", "outbox:u d1", 1, hub="audit")
    assert state.recall("webhooks", "warned:r1", hub="audit") is None
    assert state.memos("webhooks", "outbox:", hub="ops") == []
    state.forget("webhooks", "outbox:u d1", hub="ops")  # not the other hub's
    assert state.memos("webhooks", hub="audit") == [("outbox:u d1", 1)]
    state.close()


def test_an_upgrade_that_fails_midway_leaves_the_old_file_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signoff.channels._state as state_module

    path = tmp_path / "channels.db"
    old_state_file(path, {"ops:webhooks": 9}, OLD_MEMOS)
    keep = state_module._keep_memos_per_hub

    def crashing(conn: sqlite3.Connection) -> None:
        keep(conn)
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(state_module, "_keep_memos_per_hub", crashing)
    with pytest.raises(so.StoreError, match="cannot open the channel state"):
        ChannelState(path)
    assert layout_of(path) == 0
    conn = sqlite3.connect(path)
    rows = conn.execute("SELECT channel, key FROM channel_memos ORDER BY rowid").fetchall()
    conn.close()
    assert rows == [(channel, key) for channel, key, _ in OLD_MEMOS]
    monkeypatch.undo()
    state = ChannelState(path)
    assert state.recall("webhooks", "warned:r1", hub="ops") is True
    state.close()


def _open_old_at(path: str) -> None:
    state = ChannelState(path, busy_timeout=10)
    assert state.recall("webhooks", "warned:r1", hub="ops") is True
    state.close()


def test_processes_opening_an_old_file_at_once_bring_it_up_to_date_once(tmp_path: Path) -> None:
    paths = [tmp_path / f"channels-{i}.db" for i in range(2)]
    for path in paths:
        old_state_file(path, {"ops:webhooks": 9}, OLD_MEMOS)
    open_together(_open_old_at, [str(p) for p in paths])
    for path in paths:
        state = ChannelState(path)
        assert state.memos("webhooks", hub="ops") == [
            (key, value) for channel, key, value in OLD_MEMOS if channel == "webhooks"
        ]
        state.close()


def test_a_file_of_a_newer_layout_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "channels.db"
    ChannelState(path).close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA user_version={STATE_SCHEMA + 1}")
    conn.close()
    with pytest.raises(so.SchemaVersionError, match="layout 2; this signoff knows up to 1"):
        ChannelState(path)
    assert layout_of(path) == STATE_SCHEMA + 1


def test_a_state_path_that_is_a_directory_is_named_as_one(tmp_path: Path) -> None:
    """A folder given where the state file was meant says so, as the SQLite store does, not
    SQLite's "unable to open database file"; the folder is left as it was."""
    with pytest.raises(so.StoreError) as info:
        ChannelState(tmp_path)
    assert str(info.value) == (
        f"cannot open the channel state {tmp_path}: it is a directory, not a file"
    )
    assert list(tmp_path.iterdir()) == []


_DIE_IN_UPGRADE = (
    SPILL
    + """
import sys
from signoff.channels import _state

def at_commit(conn):
    if sys.argv[2] == "commit":
        assert conn.execute("PRAGMA user_version").fetchone() == (_state.STATE_SCHEMA,)
        die()  # every step of the upgrade done but its commit

keep = _state._keep_memos_per_hub

def moved(conn):
    keep(conn)
    if sys.argv[2] == "moved":
        die()  # memos moved and the old table dropped, the file not yet marked

_state._keep_memos_per_hub = moved
_state.ChannelState(sys.argv[1])
sys.exit(3)  # not killed: the upgrade never reached the point
"""
)

_OPEN_STATE = """
import sys
from signoff.channels import ChannelState
ChannelState(sys.argv[1], busy_timeout=10).close()
"""


def rows_of(path: Path) -> list[tuple[Any, ...]]:
    """Every position and memo row of a state file, as stored."""
    conn = sqlite3.connect(path)
    try:
        tables = [
            name
            for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type='table' ORDER BY name"
            )
        ]
        return [(t, *row) for t in tables for row in conn.execute(f"SELECT * FROM {t}")]
    finally:
        conn.close()


@pytest.mark.parametrize("dies", ["moved", "commit"])
async def test_an_upgrade_killed_halfway_leaves_the_old_file_and_its_outbox_is_sent_later(
    tmp_path: Path, scripts: Scripts, dies: str
) -> None:
    """A process killed (SIGKILL) inside the upgrade transaction, after the memos moved or
    just before its commit, leaves the file at layout 0 with every memo, the unsent webhook
    delivery among them; two processes opening it next bring it up to date once, and the
    hub that ran the channel sends the delivery."""
    from .test_webhooks import SECRET, Receiver, manual

    path = tmp_path / "channels.db"
    async with (
        Receiver([]) as receiver,
        so.Runtime([], store=f"sqlite:///{tmp_path / 's.db'}") as rt,
    ):
        raw = json.dumps({"id": "whd_kept", "type": "request.opened"})
        kept = {"event": "request.opened", "body": raw}
        memos = [("webhooks", f"outbox:{receiver.url} whd_kept", kept)]
        memos += [m for m in OLD_MEMOS if not m[1].startswith("outbox:")]
        memos += [("slack", f"msg:r{i}", {"text": "x" * 2000}) for i in range(2, 40)]
        old_state_file(path, {"ops:webhooks": 0, "hub:slack": 7}, memos)
        before = rows_of(path)
        child = scripts.run(_DIE_IN_UPGRADE, str(path), dies, env=_child_env())
        assert child.returncode == -signal.SIGKILL, child.stderr
        wal = Path(f"{path}-wal")
        assert wal.stat().st_size == int(child.stdout)  # as the killed upgrade left it
        assert uncommitted_frames(wal) > 2  # its pages, on disk, no commit among them
        assert layout_of(path) == 0 and rows_of(path) == before

        racers = [
            subprocess.Popen([sys.executable, "-c", _OPEN_STATE, str(path)], env=_child_env())
            for _ in range(2)
        ]
        assert [r.wait(timeout=30) for r in racers] == [0, 0]
        assert layout_of(path) == STATE_SCHEMA
        state = ChannelState(path)
        ops = [(key, value) for channel, key, value in memos if channel == "webhooks"]
        assert state.memos("webhooks", hub="ops") == ops  # each once, in order
        assert state.recall("slack", "msg:r1", hub="hub") == {"channel": "C42", "ts": "1.2"}
        state.close()

        hooks = WebhookChannel(receiver.url, SECRET)
        async with manual(ChannelHub(rt, [hooks], state=path, name="ops")):
            await asyncio.wait_for(hooks.drain(), 10)
            assert hooks.memos("outbox:") == []
    ((headers, body),) = receiver.accepted
    assert body == raw.encode() and verify_webhook(SECRET, headers, body)["id"] == "whd_kept"
