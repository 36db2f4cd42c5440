"""The store's memo of the request a Slack thread answers (`<hub>.<channel>:thread:...`) is
tidied also when the request's close reached no Slack hub (no hub ran then, and the next one
started past it): a sweep of the delivering hub looks up the request of each thread kept open
longer than `KEEP_THREADS`, a bounded number at a time, marks a closed one closed (dropped by a
later sweep, once it has taken replies for that long) and keeps an open one. Before, such a
memo stayed in the store for ever."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import ChannelHub
from signoff.channels._shared import Shared
from signoff.channels.slack import _replies
from signoff.channels.slack._inbox import TIDY_EVERY
from signoff.channels.slack._replies import KEEP_THREADS

from ._channel_state import gated, open_one
from ._slack import FakeSlack, channel, fake, manual
from ._slack_replies import FIRST_TS, deliver, event, shop_agent
from .test_slack_takeover import _approve

__all__ = ["fake"]  # the fixture, used by name

DAY = 86400.0


async def _threads(rt: so.Runtime) -> dict[str, Any]:
    """The store's thread memos, by the request they name: whether each is marked closed."""
    s: Any = rt.store
    rows = await s.channel_memos("hub.slack:thread:")
    return {
        json.loads(v)["request_id"]: json.loads(v).get("closed_at") is not None for _, v, _ in rows
    }


async def _age(url: str, seconds: float) -> None:
    """Make the hub's claim and memos in the store `seconds` older (kept that much earlier)."""
    sql = "UPDATE {}channel_claims SET expires_at = expires_at - {} WHERE name LIKE 'hub.slack%'"
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        conn.execute(sql.format("", seconds))
        conn.close()
        return
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as pg:
        await pg.execute(sql.format("signoff.", seconds).encode())


@pytest.mark.parametrize("checks", [100, 1])
async def test_a_thread_whose_close_reached_no_hub_is_tidied(
    store_url: str,
    tmp_path: Path,
    fake: FakeSlack,
    checks: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hub posts two requests and stops; one is approved while no hub runs. Eight days on
    (the rows made that much older), a hub starts (its claim long lapsed: at the trail's end,
    never hearing of that close); its sweeps mark the closed one's thread closed and keep the
    open one's (one look-up per sweep when `CHECKS_PER_SWEEP` is 1: the one kept anew leaves
    the next sweep to the other). Eight days later the closed one's is dropped, the open
    one's stays."""
    monkeypatch.setattr(_replies, "CHECKS_PER_SWEEP", checks, raising=False)
    now = [time.time()]
    async with gated(tmp_path, store_url) as rt:
        async with manual(ChannelHub(rt, [channel(fake)])) as a:
            closed = await open_one(rt)
            still = await open_one(rt)
            await a.poll()
        assert await _threads(rt) == {closed: False, still: False}
        await _approve(rt, closed)
        await _age(store_url, 8 * DAY)
        slack = channel(fake, clock=lambda: now[0])
        async with manual(ChannelHub(rt, [slack])) as b:
            await b.poll()
            if checks == 1:
                now[0] += TIDY_EVERY + 1
                await b.poll()
            assert await _threads(rt) == {closed: True, still: False}
            await _age(store_url, KEEP_THREADS + 1)
            now[0] += TIDY_EVERY + 1
            await b.poll()
            assert await _threads(rt) == {still: False}
            if checks == 1:  # the open one was looked up again, not starved
                now[0] += TIDY_EVERY + 1
                await b.poll()
                assert await _threads(rt) == {still: False}
        assert fake.of("chat.update") == []  # the close was never shown: no hub heard of it


@pytest.mark.parametrize("store_has", ["closed-long-ago", "nothing"])
async def test_a_thread_open_in_this_state_and_over_by_the_store_takes_no_reply(
    tmp_path: Path, fake: FakeSlack, store_has: str
) -> None:
    """This state has the thread open (its hub stopped before the close, which another hub
    delivered); the store says it closed more than `KEEP_THREADS` seconds ago, or keeps it no
    longer (dropped that long after its close) and its request is closed: a reply in it is
    ignored, nothing reaches the session. Before, the state's open memo took it for ever."""
    async with so.Runtime([shop_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("shop", prompt="Reorder the soap")
        size, _ = r.pending
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack])) as hub:  # in memory: stays open
            await hub.poll()
        await rt.respond(r.session_id, [so.InputResponse(request_id=size.id, text="Large")])
        key = f"thread:C42:{FIRST_TS}"
        assert slack.recall(key) == {"request_id": size.id}  # open in this state
        closed = {"request_id": size.id, "closed_at": time.time() - KEEP_THREADS - 1}
        await Shared(slack).keep({key: closed if store_has == "closed-long-ago" else None})
        before = [e.type async for e in rt.events(r.session_id, follow=False)]
        await deliver(slack, event("Also tell the team, please", user="U5"))
        after = [e.type async for e in rt.events(r.session_id, follow=False)]
        assert after == before
        assert fake.of("chat.postEphemeral") == []
