"""A followed event stream that is idle waits on the store's change signal instead of reading
the log every `poll_interval`: on PostgreSQL (LISTEN/NOTIFY) an idle stream costs about no reads,
where it read the log four times a second; and what it sends is as before (a new event
promptly, once, in order)."""

from __future__ import annotations

import asyncio
from typing import Any

import signoff as so
from signoff.server._sse import event_stream

from .test_server_common import ALICE, make_agents
from .test_sse_stream import _context, _request


def _counted(rt: so.Runtime, counts: dict[str, int], monkeypatch: Any) -> None:
    """Count the store's reads of a session's log and of its head."""
    for name in ("read_events", "head"):
        real = getattr(rt.store, name)

        def counting(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            counts[_name] = counts.get(_name, 0) + 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(rt.store, name, counting)


async def test_an_idle_followed_stream_does_not_poll_a_notifying_store(
    pg_store_url: str, monkeypatch: Any
) -> None:
    """500 idle streams cost about 2,000 reads a second: each read the log every 0.25 s."""
    async with so.Runtime(make_agents(), store=pg_store_url) as rt:
        sid = (await rt.generate("support", prompt="Refund order 1042", auth=ALICE)).session_id
        ctx = _context(rt)  # the defaults: poll_interval 0.25 s, heartbeat 15 s
        messages: list[str] = []

        async def read() -> None:
            async for message in event_stream_of(ctx, sid):
                messages.append(message)

        idle = asyncio.Event()
        wait_for_change = rt.store.wait_for_change  # type: ignore[attr-defined]

        async def waiting(*args: Any, **kwargs: Any) -> bool:
            idle.set()
            return bool(await wait_for_change(*args, **kwargs))

        monkeypatch.setattr(rt.store, "wait_for_change", waiting)
        reader = asyncio.create_task(read())
        # Caught up, and idle: in the store's wait, however long a loaded machine took to read
        # the log (a fixed second counted the reads of a stream still catching up).
        await asyncio.wait_for(idle.wait(), 10)
        counts: dict[str, int] = {}
        _counted(rt, counts, monkeypatch)
        await asyncio.sleep(1.0)
        assert sum(counts.values()) <= 1, counts  # 4 or more before
        ctx.closing = True
        await asyncio.wait_for(reader, 5)


def event_stream_of(ctx: Any, sid: str) -> Any:
    """A followed stream of the session's events from the first."""
    return event_stream(_request(), ctx, sid, 0, follow=True)


async def test_a_waiting_stream_sends_a_new_event_promptly_and_once(store_url: str) -> None:
    async with so.Runtime(make_agents(), store=store_url) as rt:
        sid = (await rt.generate("support", prompt="Refund order 1042", auth=ALICE)).session_id
        head = (await rt._state(sid)).seq
        ctx = _context(rt)
        ids: list[int] = []
        seen = asyncio.Event()

        async def read() -> None:
            async for message in event_stream_of(ctx, sid):
                for line in message.splitlines():
                    if line.startswith("id: "):
                        ids.append(int(line.removeprefix("id: ")))
                        if ids[-1] > head:
                            seen.set()

        reader = asyncio.create_task(read())
        async with asyncio.timeout(10):  # caught up, however busy the machine
            while len(ids) < head:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)  # and waiting: nothing more comes meanwhile
        assert ids == list(range(1, head + 1))
        await rt.cancel(sid)
        await asyncio.wait_for(seen.wait(), 2)
        await asyncio.sleep(0.3)
        new = (await rt._state(sid)).seq
        assert ids == list(range(1, new + 1))  # every event once, in order
        ctx.closing = True
        await asyncio.wait_for(reader, 5)
