"""A channel hub following the trail through a store outage logs it as a worker does: one
warning when reading starts failing and one line when it works again, not an error with a
traceback at every poll (about two a second, for as long as the database is down); and a
channel that cannot deliver until a person mends it is logged with what to do."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

import signoff as so
from signoff.channels import Channel, ChannelHub, ChannelUnreachable

from ._channels import Texts, manual, three_refunds


async def test_an_outage_is_logged_once_and_its_end_once(
    store_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs: list[str] = []
    async with so.Runtime([three_refunds(runs)], store=store_url) as rt:
        texts = Texts(name="sms")
        hub = ChannelHub(rt, [texts], poll_interval=0.01)
        reads = rt.store.audit
        down = False

        async def audit(**kwargs: object) -> object:
            if down:  # the database refusing connections, past its outage grace
                raise so.StoreUnavailable("PostgreSQL unavailable at db: connection refused")
            return await reads(**kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(rt.store, "audit", audit)
        with caplog.at_level(logging.INFO, logger="signoff.channels"):
            async with hub:
                down = True  # once the hub has started and found the trail's end
                deadline = time.monotonic() + 5
                while len(caplog.records) < 1 and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.2)  # about 20 polls more, all failing
                failed = [r for r in caplog.records if r.name == "signoff.channels"]
                assert [(r.levelname, r.exc_info) for r in failed] == [("WARNING", None)]
                assert failed[0].getMessage() == (
                    "channel hub hub: reading the audit trail failed, retrying (logged again "
                    "once it works): PostgreSQL unavailable at db: connection refused"
                )
                down = False
                r = await rt.generate("support", prompt="Refund A, B and C")
                while not texts.sent and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                assert "issue_refund" in "".join(texts.sent)  # it went on where it stood
                assert r.status == "waiting"
        lines = [(r.levelname, r.getMessage()) for r in caplog.records]
        assert len(lines) == 2, lines
        assert lines[1][0] == "INFO"
        assert lines[1][1].startswith("channel hub hub: reading the audit trail works again")


class Unreachable(Channel):
    """Cannot deliver its first `times` requests until a person mends it, then records them."""

    def __init__(self, times: int) -> None:
        super().__init__(name="sms")
        self.times = times
        self.seen: list[str] = []

    async def on_requested(self, request: so.InputRequest) -> None:
        if self.times:
            self.times -= 1
            raise ChannelUnreachable("sms: the gateway refuses the sender: register it", 0.0)
        self.seen.append(request.id)


async def test_an_unreachable_channel_is_logged_with_what_to_do_and_waits(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """`ChannelUnreachable` waits as a rate limit does (no attempt spent: one allowed here,
    nothing given up on), and the hub logs its message, not "rate limited"."""
    runs: list[str] = []
    async with so.Runtime([three_refunds(runs)], store=store_url) as rt:
        sms = Unreachable(3)
        with caplog.at_level(logging.WARNING, logger="signoff.channels"):
            async with manual(ChannelHub(rt, [sms], max_attempts=1)) as hub:
                r = await rt.generate("support", prompt="Refund A, B and C")
                for _ in range(4):
                    await hub.poll()
        assert sms.seen == [q.id for q in r.pending]
        lines = [(rec.levelname, rec.getMessage()) for rec in caplog.records]
        assert len(lines) == 3 and all(level == "WARNING" for level, _ in lines), lines
        assert all("register it" in line and "rate limited" not in line for _, line in lines)
