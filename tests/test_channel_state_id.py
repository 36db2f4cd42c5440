"""A channel state file has an id of its own, written in it by the first hub started on it (a
file of an earlier signoff gets one then too): the hubs on one file share it, and hubs on other
files do not, whatever their machine's name and their path. A hub holding its file's lock
succeeds at once the claims of hubs with its file's id and path (`test_channel_claims`);
before, it did those of hubs with its machine's name and its file's path, which two containers
sharing a hostname, each with its own volume at one path, both had."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from signoff.channels import ChannelState

from ._channel_state import old_state_file
from ._locks import open_together


def _id_row(path: Path) -> list[tuple[str, str, str]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(
            "SELECT hub, channel, value FROM channel_memos WHERE key='state-id'"
        ).fetchall()
    finally:
        conn.close()


def test_a_file_keeps_an_id_of_its_own(tmp_path: Path) -> None:
    first = ChannelState(tmp_path / "a.db")
    other = ChannelState(tmp_path / "b.db")
    again = ChannelState(tmp_path / "a.db")  # another process on the file, say
    try:
        assert _id_row(tmp_path / "a.db") == []  # opening alone writes nothing
        made = first.identity()
        assert made == again.identity() != other.identity()
        assert len(made) == 32 and int(made, 16) >= 0
        # a memo outside every hub and channel: no channel reads or lists it
        assert first.memos("slack") == [] and first.memos("slack", hub="hub") == []
    finally:
        for state in (first, other, again):
            state.close()
    assert _id_row(tmp_path / "a.db") == [("", "", json.dumps(made))]
    state = ChannelState(tmp_path / "a.db")
    assert state.identity() == made  # kept across opens
    state.close()
    assert ChannelState().identity() != ChannelState().identity()  # each in memory its own


def test_a_file_an_earlier_signoff_wrote_gets_one_from_its_first_hub(tmp_path: Path) -> None:
    """Of the current layout (without an id), or of the layout before (brought up to date too):
    the first call writes one, the next ones (in other processes too) read it."""
    current, old = tmp_path / "current.db", tmp_path / "old.db"
    state = ChannelState(current)
    state.set_position("hub:slack", 4)
    state.close()
    old_state_file(old, {"hub:slack": 9}, [("slack", "msg:r1", {"ts": "1.2"})])
    assert _id_row(current) == []
    for path, position in ((current, 4), (old, 9)):
        state = ChannelState(path)
        made = state.identity()
        assert state.position("hub:slack") == position
        state.close()
        assert [value for _, _, value in _id_row(path)] == [json.dumps(made)]
        state = ChannelState(path)
        assert state.identity() == made
        state.close()


def _note_id(path: str) -> None:
    state = ChannelState(path, busy_timeout=10)
    with open(f"{path}.ids", "a") as out:
        out.write(state.identity() + "\n")
    state.close()


def test_processes_opening_a_file_at_once_agree_on_its_id(tmp_path: Path) -> None:
    """Six processes at once (six hubs started together) on a new file, or on one without an
    id: each writes one if it finds none, only the first is kept (one statement each, so a
    crash leaves the file with it or without it), and all of them read that one."""
    new = [str(tmp_path / f"new-{trial}.db") for trial in range(6)]
    bare = [str(tmp_path / f"bare-{trial}.db") for trial in range(6)]
    for path in bare:
        ChannelState(path).close()
    open_together(_note_id, new + bare)
    for path in new + bare:
        ids = Path(f"{path}.ids").read_text().split()
        assert len(ids) == 6 and len(set(ids)) == 1, ids
        state = ChannelState(path)
        assert state.identity() == ids[0]
        state.close()


def test_a_damaged_id_is_read_the_same_by_every_process(tmp_path: Path) -> None:
    """An id changed by hand into something else (not JSON, say) is read as a hash of what it
    holds: every hub on the file still shares it, and it is left as it is."""
    path = tmp_path / "channels.db"
    state = ChannelState(path)
    state.identity()
    state.close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("UPDATE channel_memos SET value='{oops' WHERE key='state-id'")
    conn.close()
    one, two = ChannelState(path), ChannelState(path)
    try:
        assert one.identity() == two.identity() and len(one.identity()) == 32
    finally:
        one.close()
        two.close()
    assert _id_row(path) == [("", "", "{oops")]
