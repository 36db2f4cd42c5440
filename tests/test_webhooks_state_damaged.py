"""A webhook channel whose state holds a damaged memo: its other deliveries kept unsent, its
new ones and its expiry warnings all go on."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

import signoff as so
from signoff.channels import ChannelHub, ChannelState, WebhookChannel, verify_webhook
from signoff.testing import ManualClock

from ._channel_state import damage_memo
from .test_webhooks import SECRET, Receiver, manual, refund_agent


async def test_deliveries_and_warnings_go_on_past_a_damaged_kept_delivery(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One kept delivery not JSON failed every read of the others (a `JSONDecodeError`, not a
    `StoreError`): the start and then every poll failed with a traceback, and no kept delivery
    nor any `request.expiring` was sent. One that is JSON but no delivery (no event and body)
    failed the start with a traceback (a `TypeError`) and stayed for every start after; it is
    dropped, logged."""
    clock = ManualClock()
    path = tmp_path / "hub.db"
    async with (
        Receiver([]) as receiver,
        so.Runtime(
            [refund_agent(expires_in=3600)], store=f"sqlite:///{tmp_path / 's.db'}", clock=clock
        ) as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET, expiring_within=600, clock=clock)
        hub = ChannelHub(rt, [hooks], state=path, clock=clock)
        # What an earlier run kept unsent, one of them damaged by hand, one by a tool.
        ChannelState(path).close()
        for n, stored in enumerate(["ok", "{not json", "ok", "[1]"]):
            body = json.dumps({"id": f"dlv_old{n}", "type": "request.opened"})
            kept = {"event": "request.opened", "body": body}
            value = json.dumps(kept) if stored == "ok" else stored
            damage_memo(path, hub.name, hooks.name, f"outbox:{receiver.url} dlv_old{n}", value)
        caplog.set_level(logging.WARNING, logger="signoff.channels")
        async with manual(hub):
            await rt.generate("support", prompt="Refund 1042")
            for _ in range(3):
                await hub.poll()
            await asyncio.wait_for(hooks.drain(), 10)
            clock.advance(3100)  # within `expiring_within` of the request's deadline
            for _ in range(3):
                await hub.poll()
            await asyncio.wait_for(hooks.drain(), 10)
            left = [key for key, _ in hooks.memos("outbox:")]
        got = [json.loads(body) for _, body in receiver.accepted]
        assert [p["id"] for p in got[:2]] == ["dlv_old0", "dlv_old2"]
        fresh = [
            verify_webhook(SECRET, h, b, now=clock.now, tolerance=4000)["type"]
            for h, b in receiver.accepted[2:]
        ]
        assert fresh == ["request.opened", "request.expiring"]
        assert left == []  # the one not JSON is passed by every read, and stays in the file
        logged = [(r.levelname, r.getMessage()) for r in caplog.records]
        assert [level for level, _ in logged] == ["WARNING", "WARNING"], logged
        assert "dlv_old1" in logged[0][1] and "cannot be read" in logged[0][1]
        assert "dlv_old3" in logged[1][1] and "damaged" in logged[1][1]


async def _warned_past(
    tmp_path: Path, damage: Callable[[str, ChannelHub, WebhookChannel], Awaitable[None]]
) -> list[str]:
    """The deliveries of a second hub's channel started after `damage(store file, first hub,
    its channel)`, as the receiver accepted them, past two requests' expiry warnings."""
    clock = ManualClock()
    url = f"sqlite:///{tmp_path / 's.db'}"
    async with (
        Receiver([]) as receiver,
        so.Runtime([refund_agent(expires_in=3600)], store=url, clock=clock) as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET, expiring_within=600, clock=clock)
        hub = ChannelHub(rt, [hooks], state=tmp_path / "a.db", clock=clock, claim_ttl=1.0)
        async with manual(hub):
            await rt.generate("support", prompt="Refund 1042")
            await hub.poll()
            await asyncio.wait_for(hooks.drain(), 10)
        again = WebhookChannel(receiver.url, SECRET, expiring_within=600, clock=clock)
        second = ChannelHub(rt, [again], state=tmp_path / "b.db", clock=clock, claim_ttl=1.0)
        await damage(str(tmp_path / "s.db"), second, again)
        async with manual(second):
            await rt.generate("support", prompt="Refund 2")
            for _ in range(3):
                clock.advance(5)
                await second.poll()
            clock.advance(3100)  # both requests within `expiring_within` of their deadlines
            for _ in range(3):
                clock.advance(5)
                await second.poll()
            await asyncio.wait_for(again.drain(), 10)
        return [json.loads(body)["type"] for _, body in receiver.accepted]


async def test_a_store_memo_kept_at_a_time_that_is_text_is_passed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A memo a hub keeps in the store (`<hub>.<channel>:asked:...`) whose time a hand edit left
    as text: SQLite's `channel_memos` read it with `float()`, a bare ValueError at the channel's
    start and at every tick after, and no expiry warning went out. It is logged, once, and
    passed; the channel goes on."""

    async def text_time(db: str, hub: ChannelHub, channel: WebhookChannel) -> None:
        conn = sqlite3.connect(db)
        with conn:
            conn.execute(
                "INSERT INTO channel_claims (name, owner, expires_at) VALUES (?, ?, 'yesterday')",
                (f"{hub.name}.{channel.name}:asked:abc", json.dumps({"seconds": 30})),
            )
        conn.close()

    caplog.set_level(logging.WARNING)
    got = await _warned_past(tmp_path, text_time)
    assert got == ["request.opened", "request.opened", "request.expiring", "request.expiring"]
    damaged = [r.getMessage() for r in caplog.records if "asked:abc" in r.getMessage()]
    assert len(damaged) == 1 and "'yesterday'" in damaged[0], damaged


async def test_kept_deliveries_that_cannot_be_read_hold_back_no_warning(tmp_path: Path) -> None:
    """A tick read the kept deliveries a start could not, then queued the warnings due, in one
    go: while a damaged row failed that read, at every tick, no `request.expiring` went out."""

    async def failing_restore(db: str, hub: ChannelHub, channel: WebhookChannel) -> None:
        async def restore() -> None:
            raise so.StoreDamaged("a kept delivery is damaged")

        channel._restore = restore  # type: ignore[method-assign]

    got = await _warned_past(tmp_path, failing_restore)
    assert got.count("request.expiring") == 2, got
