"""A new channel state file SIGKILLed while its tables are created (no rollback): the file holds
none of them and no layout mark, and the next openings (two at once) create it once."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from signoff.channels import ChannelState
from signoff.channels._state import STATE_SCHEMA

from . import _proof
from ._forks import Scripts
from ._wal import SPILL, uncommitted_frames
from .test_sqlite_upgrade import _child_env

_DIE_IN_CREATION = (
    SPILL
    + """
import sys
from signoff.channels import _state

def at_commit(conn):
    if sys.argv[2] == "commit":
        assert conn.execute("PRAGMA user_version").fetchone() == (_state.STATE_SCHEMA,)
        die()  # both tables made and the file marked, all but the commit

switch = _state._switch_to_wal

def in_wal(conn, timeout):
    switch(conn, timeout)
    if sys.argv[2] == "wal":  # the file exists, in WAL mode, and nothing is created yet
        _os.kill(_os.getpid(), _signal.SIGKILL)

_state._switch_to_wal = in_wal
_state.ChannelState(sys.argv[1])
sys.exit(3)  # not killed: the creation never reached the point
"""
)

_OPEN_STATE = """
import sys
from signoff.channels import ChannelState
ChannelState(sys.argv[1], busy_timeout=10).close()
"""


@pytest.mark.parametrize("dies", ["wal", "commit"])
def test_a_new_state_file_killed_while_created_is_created_next_time(
    tmp_path: Path, scripts: Scripts, dies: str
) -> None:
    path = tmp_path / "channels.db"
    child = scripts.run(_DIE_IN_CREATION, str(path), dies, env=_child_env())
    assert child.returncode == -signal.SIGKILL, child.stderr
    _proof.record("crash-outside:kills")
    if dies == "commit":
        assert uncommitted_frames(Path(f"{path}-wal")) > 0  # its pages on disk, uncommitted
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT name FROM sqlite_master").fetchall() == []
        assert conn.execute("PRAGMA user_version").fetchone() == (0,)
    finally:
        conn.close()

    racers = [
        subprocess.Popen([sys.executable, "-c", _OPEN_STATE, str(path)], env=_child_env())
        for _ in range(2)
    ]
    assert [r.wait(timeout=30) for r in racers] == [0, 0]
    state = ChannelState(path)
    try:
        state.set_position("ops:webhooks", 3)
        state.remember("webhooks", "outbox:x", {"event": "request.opened"}, hub="ops")
        assert state.position("ops:webhooks") == 3
        assert state.memos("webhooks", hub="ops") == [("outbox:x", {"event": "request.opened"})]
    finally:
        state.close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone() == (STATE_SCHEMA,)
    finally:
        conn.close()
