"""A memo damaged in the channel state file (not JSON: written by hand or by a tool): read as
absent and logged once with its key, so a channel goes on with its other memos. So is a
position that is no audit entry id: the hub goes on as for a channel without one."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from signoff.channels import ChannelHub, ChannelState

from ._channel_state import Seen, damage_memo, gated, open_one
from ._channels import manual

DAMAGED = "outbox:https://bot:hunter2@receiver.example/hook?token=abc dlv_bad"


@pytest.mark.parametrize(
    "stored",
    ["{not json", "", b"\xff\xfe", "[" * 100_000],
    ids=["broken", "empty", "not-utf8", "too-deep"],
)
def test_a_memo_that_is_not_json_is_passed_by_memos_and_absent_to_recall(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, stored: str | bytes
) -> None:
    """One damaged memo failed every read of its channel's memos with a `JSONDecodeError`, so
    a webhook channel sent none of the deliveries an earlier run kept (and warned of no
    deadline), at every poll. It is left out, the others read in their order."""
    path = tmp_path / "hub.db"
    state = ChannelState(path)
    state.remember("webhooks", "outbox:a dlv_1", {"event": "e1"}, hub="hub")
    damage_memo(path, "hub", "webhooks", DAMAGED, stored)
    state.remember("webhooks", "outbox:c dlv_3", {"event": "e3"}, hub="hub")
    caplog.set_level(logging.WARNING, logger="signoff.channels")
    for _ in range(3):  # a channel reads them at each poll: logged once
        assert state.memos("webhooks", "outbox:", hub="hub") == [
            ("outbox:a dlv_1", {"event": "e1"}),
            ("outbox:c dlv_3", {"event": "e3"}),
        ]
        assert state.recall("webhooks", DAMAGED, hub="hub") is None
    (logged,) = [r.getMessage() for r in caplog.records]
    assert "cannot be read" in logged and "dlv_bad" in logged and str(path) in logged
    assert "hunter2" not in logged and "abc" not in logged  # the URL's secrets stay out
    state.close()
    conn = sqlite3.connect(path)  # kept as it was: a read does not write
    assert conn.execute("SELECT count(*) FROM channel_memos").fetchone() == (3,)
    conn.close()


def test_a_damaged_memo_written_again_is_read_and_logged_again_if_damaged_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "hub.db"
    state = ChannelState(path)
    damage_memo(path, "", "slack", "shown", "{not json")
    caplog.set_level(logging.WARNING, logger="signoff.channels")
    assert state.recall("slack", "shown") is None
    state.remember("slack", "shown", "r1")
    assert state.recall("slack", "shown") == "r1"
    assert state.memos("slack") == [("shown", "r1")]
    damage_memo(path, "", "slack", "shown", "{still not json")
    assert state.memos("slack") == []
    assert len(caplog.records) == 2, [r.getMessage() for r in caplog.records]
    state.close()


def _damage_position(path: Path, name: str, stored: object) -> None:
    """Write `stored` as the position of `name`, as a hand or a tool other than signoff might."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("UPDATE channel_positions SET after_id=? WHERE name=?", (stored, name))
    conn.close()


@pytest.mark.parametrize(
    "stored", ["abc", "", 12.5, -3, b"12"], ids=["text", "empty", "fraction", "negative", "blob"]
)
def test_a_position_that_is_no_entry_id_is_read_as_absent_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, stored: object
) -> None:
    """It failed the read (and the hub's start) with a bare `ValueError` (`int('abc')`), or was
    taken as an id it is not (12.5 as 12, -3 read the whole trail again)."""
    path = tmp_path / "hub.db"
    state = ChannelState(path)
    state.set_position("hub:hooks", 7)
    state.set_position("hub:other", 9)
    _damage_position(path, "hub:hooks", stored)
    caplog.set_level(logging.WARNING, logger="signoff.channels")
    assert state.position("hub:hooks") is None
    assert state.position("hub:other") == 9
    (logged,) = [r.getMessage() for r in caplog.records]
    assert "the position of hub:hooks cannot be read" in logged and str(path) in logged
    state.set_position("hub:hooks", 8)  # written again: read
    assert state.position("hub:hooks") == 8
    state.close()


async def test_a_hub_whose_saved_position_is_damaged_goes_on_as_without_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The hub starts (from the position its claim in the store kept, the hub before having
    given it back, else at the trail's end): the request opened meanwhile and the one after are
    delivered, and the position is written anew."""
    path = tmp_path / "hub.db"
    async with gated(tmp_path) as rt:
        async with manual(ChannelHub(rt, [Seen("hooks")], state=path)):
            pass
        waiting = await open_one(rt)
        _damage_position(path, "hub:hooks", "abc")
        again = Seen("hooks")
        caplog.set_level(logging.WARNING, logger="signoff.channels")
        async with manual(ChannelHub(rt, [again], state=path)) as hub:
            await hub.poll()
            later = await open_one(rt)
            await hub.poll()
            assert again.opened == [waiting, later]
            end = hub.position(again)
            assert end == (await rt.store.audit())[-1].id
        state = ChannelState(path)
        assert state.position("hub:hooks") == end
        state.close()
    assert "the position of hub:hooks cannot be read ('abc')" in caplog.text
