"""A request's deadline is warned of (`request.expiring`) once, also across hubs: the memo that
it was warned of is kept in the store too (`<hub>.<channel>:warned:<request>`), not only in the
hub's state file. Before, a hub taking over on another state (another machine), or started
again on a state file that was lost, warned of the same request a second time."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import ChannelHub, WebhookChannel
from signoff.testing import ManualClock

from .test_webhooks import SECRET, Receiver, manual, refund_agent
from .test_webhooks_escalations import FIONA, escalating_agent


def sent(receiver: Receiver, kind: str) -> list[str]:
    """The request ids of the deliveries of `kind` the receiver took, in order."""
    found = [json.loads(body) for _, body in receiver.accepted]
    return [p["request"]["id"] for p in found if p["type"] == kind]


async def memo(rt: so.Runtime, hub: ChannelHub, hooks: WebhookChannel, rid: str) -> Any:
    """The store's memo that `rid` was warned of (JSON text), None if there is none."""
    store: Any = rt.store  # the memos are not part of the `Store` protocol
    return await store.channel_memo(f"{hub.name}.{hooks.name}:warned:{rid}")


async def take_over(hub: ChannelHub, timeout: float = 30.0) -> None:
    """Poll a standby until it delivers (the other hub's claim lapsed: on PostgreSQL by the
    database's clock, so in real time)."""
    deadline = time.monotonic() + timeout
    while not hub.active:
        assert time.monotonic() < deadline, "the standby never took over"
        await asyncio.sleep(0.1)
        await hub.poll()


@pytest.mark.parametrize("how", ["another-state", "state-lost"])
async def test_a_hub_taking_over_does_not_warn_of_an_expiry_again(
    store_url: str, tmp_path: Path, how: str
) -> None:
    """Hub A (state a.db) warns of a request 500 s before its deadline. `another-state`: A stops
    polling (its machine lost) and hub B on b.db, sharing only the store, takes the lapsed
    claim; `state-lost`: A stops and starts again on a.db, which was lost meanwhile. The request
    still open and within `expiring_within`, the new hub warns of nothing (it did again
    before)."""
    clock = ManualClock()
    async with (
        Receiver([]) as receiver,
        so.Runtime([refund_agent(expires_in=3600)], store=store_url, clock=clock) as rt,
    ):

        def hub(state: str) -> tuple[ChannelHub, WebhookChannel]:
            hooks = WebhookChannel(receiver.url, SECRET, expiring_within=600, clock=clock)
            h = ChannelHub(rt, [hooks], state=tmp_path / state, clock=clock, claim_ttl=1.0)
            return h, hooks

        a, hooks_a = hub("a.db")
        async with manual(a):
            (req,) = (await rt.generate("support", prompt="Refund 1042")).pending
            await a.poll()
            clock.advance(3100)  # within 600 s of the deadline
            await a.poll()
            await hooks_a.drain()
            assert sent(receiver, "request.expiring") == [req.id]
            if how == "another-state":
                clock.advance(60)  # A's claim lapses (on SQLite, by the runtime's clock)
                b, hooks_b = hub("b.db")
                async with manual(b):
                    await take_over(b)
                    for _ in range(3):
                        clock.advance(10)
                        await b.poll()
                    await hooks_b.drain()
        if how == "state-lost":
            for path in tmp_path.glob("a.db*"):
                path.unlink()
            clock.advance(60)
            b, hooks_b = hub("a.db")
            async with manual(b):
                assert b.active
                for _ in range(3):
                    clock.advance(10)
                    await b.poll()
                await hooks_b.drain()
    assert sent(receiver, "request.expiring") == [req.id]
    assert req.id in sent(receiver, "request.opened")


@pytest.mark.parametrize("close", ["answered", "escalated-then-answered"])
async def test_the_store_memo_of_a_warning_is_dropped_when_the_request_closes(
    store_url: str, tmp_path: Path, close: str
) -> None:
    """The memo is kept in the store (and the state) when the warning is queued, and dropped
    from both when the request closes: also after an escalation lifted its deadline."""
    clock = ManualClock()
    agent = refund_agent(expires_in=3600) if close == "answered" else escalating_agent()
    async with (
        Receiver([]) as receiver,
        so.Runtime([agent], store=store_url, clock=clock) as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET, expiring_within=600, clock=clock)
        hub = ChannelHub(rt, [hooks], state=tmp_path / "hub.db", clock=clock)
        async with manual(hub):
            (req,) = (await rt.generate("support", prompt="Refund 1042")).pending
            await hub.poll()
            if close == "answered":
                clock.advance(3100)  # within 600 s of the deadline
                await hub.poll()
            assert await memo(rt, hub, hooks, req.id) == "true"
            assert hooks.recall(f"warned:{req.id}") is True
            # Delivered before the deadline moves: a warning still queued when its request
            # closes or escalates is dropped unsent (`still_due`), by design.
            await hooks.drain()
            assert sent(receiver, "request.expiring") == [req.id]
            principal = None
            if close == "escalated-then-answered":
                clock.advance(61)
                assert await rt.expire_due() == 1
                await hub.poll()
                assert await memo(rt, hub, hooks, req.id) == "true"  # still open
                principal = FIONA
            reply = so.InputResponse(request_id=req.id, option_id="approve")
            r = await rt.respond(req.session_id, [reply], principal=principal)
            assert r.outcomes[0].outcome == "approved"
            await hub.poll()
            await hooks.drain()
            assert await memo(rt, hub, hooks, req.id) is None
            assert hooks.memos("warned:") == []
    assert sent(receiver, "request.expiring") == [req.id]
    assert sent(receiver, "request.resolved") == [req.id]


async def test_a_warning_whose_store_memo_fails_is_kept_by_the_next_tick(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store fails to keep the memo (unavailable) after the warning was queued: it does not
    count as warned in the state either, and the next tick keeps it in both without queuing
    the warning again. The warning is delivered once."""
    clock = ManualClock()
    async with (
        Receiver([]) as receiver,
        so.Runtime([refund_agent(expires_in=3600)], store=store_url, clock=clock) as rt,
    ):
        store: Any = rt.store
        keep = store.keep_channel_memos
        broken = [True]

        async def flaky(memos: dict[str, str | None], *args: Any, **kw: Any) -> None:
            if broken and any(":warned:" in name for name in memos):
                raise so.StoreUnavailable("the database is down")
            await keep(memos, *args, **kw)

        monkeypatch.setattr(store, "keep_channel_memos", flaky)
        hooks = WebhookChannel(receiver.url, SECRET, expiring_within=600, clock=clock)
        hub = ChannelHub(rt, [hooks], state=tmp_path / "hub.db", clock=clock)
        async with manual(hub):
            (req,) = (await rt.generate("support", prompt="Refund 1042")).pending
            await hub.poll()
            clock.advance(3100)  # within 600 s of the deadline
            await hub.poll()
            await hooks.drain()
            assert sent(receiver, "request.expiring") == [req.id]  # queued before the memo
            assert hooks.recall(f"warned:{req.id}") is None
            assert await memo(rt, hub, hooks, req.id) is None
            broken.clear()  # the store is back
            await hub.poll()
            assert await memo(rt, hub, hooks, req.id) == "true"
            assert hooks.recall(f"warned:{req.id}") is True
            clock.advance(10)
            await hub.poll()
            await hooks.drain()
    assert sent(receiver, "request.expiring") == [req.id]
