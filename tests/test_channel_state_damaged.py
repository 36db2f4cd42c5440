"""A memo damaged in the channel state file (not JSON: written by hand or by a tool): read as
absent and logged once with its key, so a channel goes on with its other memos."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from signoff.channels import ChannelState

from ._channel_state import damage_memo

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
