"""The state file's layout: older ones are brought up to date in place (once, even by processes
opening them together, and never half-way), newer ones and directories are refused.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import ChannelHub, ChannelState, WebhookChannel, verify_webhook
from signoff.channels._state import STATE_SCHEMA

from ._channel_state import old_state_file
from ._forks import Scripts
from ._locks import open_together
from ._wal import SPILL, uncommitted_frames
from .test_sqlite_upgrade import _child_env


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
