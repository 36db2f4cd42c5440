"""A Slack message of a request erased with its session (cancelled, then `delete_session`)
before the hub read the close: rewritten to say the session was deleted, its buttons gone and
what it asked no longer shown, and its memos (in the state and the store, its thread's too)
dropped; also when the hub was down meanwhile and reads the deletion once started again. It
kept its Approve and Deny buttons for good, and its memos stayed behind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from signoff.channels import ChannelHub

from ._slack import ALICE, FakeSlack, channel, fake_slack, manual, refund_runtime


async def _memos(rt: Any, state: Path, request_id: str) -> list[str]:
    """The memos naming the request (or its message's thread), in the state and the store."""
    import sqlite3

    conn = sqlite3.connect(state)
    try:
        rows = conn.execute("SELECT key, value FROM channel_memos").fetchall()
    finally:
        conn.close()
    kept = [str(k) for k, v in rows if request_id in f"{k} {v}"]
    stored = await rt.store.channel_memos("hub.slack:")
    return kept + [str(name) for name, raw, _ in stored if request_id in f"{name} {raw}"]


def _closed_as_deleted(slack: FakeSlack, request_id: str, session_id: str) -> None:
    """The request's message, updated once: no controls, nothing it asked, its ids shown."""
    [update] = slack.of("chat.update")
    blocks = update["blocks"]
    assert [b["type"] for b in blocks] == ["section", "context", "context"]
    shown = str(blocks)
    assert request_id in shown and session_id in shown
    asked = shown.replace(request_id, "").replace(session_id, "")  # a random id may hold 1042
    assert "1042" not in asked and "issue_refund" not in asked
    assert "*Deleted* with its session by `alice`" in blocks[-1]["elements"][0]["text"]
    assert update["text"] == f"Deleted: request {request_id} (its session was deleted)"
    assert slack.messages["C42"][0]["blocks"] == blocks


async def test_the_message_of_a_request_erased_is_closed_and_its_memos_dropped(
    tmp_path: Path,
) -> None:
    state = tmp_path / "channels.db"
    async with fake_slack() as slack, refund_runtime(tmp_path, []) as rt:
        async with manual(ChannelHub(rt, [channel(slack)], state=state, gap_timeout=0)) as hub:
            r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
            [req] = r.pending
            await hub.poll()
            assert [m for m, _ in slack.calls] == ["chat.postMessage"]
            assert await _memos(rt, state, req.id) != []
            await rt.cancel(r.session_id, principal=ALICE)
            await rt.delete_session(r.session_id, by=ALICE, reason="GDPR request 12")
            for _ in range(3):
                await hub.poll()
        _closed_as_deleted(slack, req.id, r.session_id)
        assert await _memos(rt, state, req.id) == []


async def test_a_hub_started_again_after_the_deletion_closes_the_message(
    tmp_path: Path,
) -> None:
    state = tmp_path / "channels.db"
    async with fake_slack() as slack, refund_runtime(tmp_path, []) as rt:
        async with manual(ChannelHub(rt, [channel(slack)], state=state)) as hub:
            r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
            [req] = r.pending
            await hub.poll()
        await rt.cancel(r.session_id, principal=ALICE)
        await rt.delete_session(r.session_id, by=ALICE)
        async with manual(ChannelHub(rt, [channel(slack)], state=state)) as hub:
            await hub.poll()
        assert [m for m, _ in slack.calls] == ["chat.postMessage", "chat.update"]
        _closed_as_deleted(slack, req.id, r.session_id)
        assert await _memos(rt, state, req.id) == []
