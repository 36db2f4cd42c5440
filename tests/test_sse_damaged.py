"""A stored row that does not read back (`StoreDamaged`: a hand edit, a half-restored copy) under
an event stream: reading it again gives the same, so the stream ends with `stream.end` (503
`store_error`), followed or not, and `AsyncClient.events` raises `StoreError`, as `rt.events`
raises at once in process. A followed stream waited it out as an outage, sending keep-alives for
ever (its client hung), and one not followed was cut off (`connection_lost` after the retries);
the dashboard's queue stream goes on past a damaged request row, as the queue's listing leaves
it out (test_listing_damaged_rows.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

import signoff as so
from signoff.server import AsyncClient
from signoff.server._queue_stream import queue_changes
from signoff.server._sse import event_stream

from .test_server_common import ADMIN, ALICE, PLAIN, auth, make_agents, served
from .test_sse_stream import _context, _request
from .test_store_edited_rows import edit

DAMAGE_EVENT = (
    "UPDATE {t}events SET data = {p} WHERE seq = 2 AND sk = "
    "(SELECT sk FROM {t}sessions WHERE id = {p})"
)


def _end(messages: list[str]) -> dict[str, Any]:
    """The data of the stream's last message, which must be its `stream.end`."""
    lines = messages[-1].splitlines()
    assert lines[0] == "event: stream.end", messages[-3:]
    data: dict[str, Any] = json.loads(lines[1].removeprefix("data: "))
    return data


async def _sent(stream: Any) -> list[str]:
    """Everything a stream sends until it ends (within 5 s: it waited for ever before)."""
    messages: list[str] = []

    async def read() -> None:
        async for message in stream:
            messages.append(message)

    try:
        await asyncio.wait_for(read(), 5)
    except TimeoutError:
        raise AssertionError(f"the stream did not end; it sent {messages[-3:]}") from None
    return messages


@pytest.mark.parametrize("follow", [True, False], ids=["followed", "not-followed"])
async def test_a_stream_over_a_damaged_event_ends_with_a_store_error(
    store_url: str, follow: bool
) -> None:
    async with so.Runtime(make_agents(), store=store_url) as rt:
        sid = (await rt.generate("support", prompt="Refund order 1042", auth=ALICE)).session_id
        head = (await rt._state(sid)).seq
        edit(store_url, DAMAGE_EVENT, b"\x01not deflate", sid)
        with pytest.raises(so.StoreDamaged):  # as the runtime reads it
            await anext(aiter(rt.events(sid, follow=follow)))
        ctx = _context(rt, poll_interval=0.01, heartbeat=0.05)
        sent = await _sent(event_stream(_request(), ctx, sid, 0, follow=follow, head=head))
    end = _end(sent)
    assert end["status"] == 503 and end["error"]["code"] == "store_error", end
    assert "StoreDamaged" in end["error"]["message"]  # the store's own text is the log's


async def _changed(stream: Any) -> int:
    """The total of the stream's next `queue` event (within 5 s), past keep-alives."""

    async def read() -> int:
        async for message in stream:
            assert not message.startswith("event: stream.end"), message
            if message.startswith("event: queue"):
                total: int = json.loads(message.splitlines()[1].removeprefix("data: "))["total"]
                return total
        raise AssertionError("the stream ended")

    return await asyncio.wait_for(read(), 5)


@pytest.mark.parametrize("viewer", [ADMIN, ALICE], ids=["every-request", "own-queue"])
async def test_the_queue_stream_goes_on_past_a_damaged_request_row(
    store_url: str, viewer: so.Principal
) -> None:
    """The queue's listing leaves a request row that does not read back out, logged; its stream
    goes on telling the others' changes too, whether that row is the queue's first or last
    (which the stream's fingerprint reads: then by its key, its data unread)."""
    async with so.Runtime(make_agents(), store=store_url) as rt:
        ctx = _context(rt, poll_interval=0.01, heartbeat=0.05)
        stream = queue_changes(_request(), ctx, viewer)
        assert (await anext(stream)).startswith("retry:")
        made = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        rid = made.pending[0].id
        edit(store_url, "UPDATE {t}requests SET data = {p} WHERE id = {p}", b"garbage", rid)
        before = await _changed(stream)
        await rt.generate("support", prompt="Refund order 1043", auth=ALICE)
        assert await _changed(stream) == before + 1
        await stream.aclose()  # type: ignore[attr-defined]  # an async generator


async def test_the_client_raises_a_damaged_streams_store_error_followed_or_not(
    store_url: str,
) -> None:
    """Over HTTP, with the session's state in the server's cache (its page still reads): the
    stream is opened, then ends with `stream.end`, which the client raises as its class."""
    with served(store_url) as base:
        async with AsyncClient(base, token="alice-token", timeout=5) as client:
            sid = (await client.generate("support", "Refund order 1042")).session_id
            await client.state(sid)  # folded and cached by the server
            edit(store_url, DAMAGE_EVENT, b"\x01not deflate", sid)
            async with httpx.AsyncClient(base_url=base, verify=PLAIN, timeout=5) as raw:
                url = f"/v1/sessions/{sid}/events"
                r = await raw.get(url, params={"follow": "false"}, headers=auth("alice-token"))
            assert r.status_code == 200, r.text
            assert r.text.splitlines()[-3] == "event: stream.end", r.text[-300:]
            for follow in (True, False):
                with pytest.raises(so.StoreError) as caught:
                    events = client.events(sid, follow=follow, retries=1)
                    await asyncio.wait_for(anext(aiter(events)), 10)
                assert type(caught.value) is so.StoreError, (follow, caught.value)
                assert caught.value.code == "store_error"


async def test_the_queue_stream_opens_over_a_damaged_request_row(store_url: str) -> None:
    """As `GET /v1/requests` lists the queue without it: one damaged row stops no one's
    dashboard (a 503 stopped its EventSource, whose page said the store failed)."""
    with served(store_url) as base:
        async with AsyncClient(base, token="alice-token", timeout=5) as client:
            made = await client.generate("support", "Refund order 1042")
        rid = made.pending[0].id
        edit(store_url, "UPDATE {t}requests SET data = {p} WHERE id = {p}", b"garbage", rid)
        async with httpx.AsyncClient(base_url=base, verify=PLAIN, timeout=5) as raw:
            listed = await raw.get("/v1/requests", headers=auth("admin-token"))
            async with raw.stream("GET", "/_signoff/stream", headers=auth("admin-token")) as r:
                status = r.status_code
    assert (listed.status_code, listed.json()["items"]) == (200, [])
    assert listed.json()["total"] == 1  # the store counts it
    assert status == 200
