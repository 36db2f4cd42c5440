"""The dashboard's queue stream (`/_signoff/stream`) read directly: keep-alives go on every
heartbeat while a store call hangs (a frozen database host), as the event stream's do, and a
server that begins to stop ends it without waiting for that call."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import signoff as so
from signoff.server._queue_stream import queue_changes
from signoff.server._sign_ins import Grant, SignOuts

from .test_server_common import ALICE, make_agents
from .test_sse_stream import _context, _keep_alives_while_hung, _request

ADMIN = so.Principal(authenticator="token", principal_id="root", attributes={"admin": True})


def _hanging(hung: asyncio.Event, released: asyncio.Event) -> Any:
    async def hanging(*args: Any, **kwargs: Any) -> Any:
        hung.set()
        try:
            await asyncio.sleep(3600)
        finally:
            released.set()
        raise AssertionError("unreachable")

    return hanging


@pytest.mark.parametrize("viewer", [ADMIN, ALICE], ids=["every-request", "own-queue"])
async def test_the_queue_stream_sends_keep_alives_while_a_store_read_hangs(
    store_url: str, monkeypatch: pytest.MonkeyPatch, viewer: so.Principal
) -> None:
    """The queue's version read held the stream for the store's `operation_timeout` (30 s) when
    the database stopped answering: nothing was sent that long, past its `heartbeat`, and a
    proxy's idle timeout could cut the dashboard's live updates."""
    async with so.Runtime(make_agents(), store=store_url) as rt:
        await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        hung, released = asyncio.Event(), asyncio.Event()
        monkeypatch.setattr(rt.store, "count_pending", _hanging(hung, released))
        ctx = _context(rt, poll_interval=0.01, heartbeat=0.05)
        await _keep_alives_while_hung(ctx, queue_changes(_request(), ctx, viewer), hung, released)


async def test_the_queue_stream_sends_keep_alives_while_a_sign_in_check_hangs(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue stream reads the store's sign-outs every `heartbeat`: a database not answering
    held that read too, the stream silent meanwhile."""
    async with so.Runtime(make_agents(), store=store_url) as rt:
        ctx = _context(rt, poll_interval=0.01, heartbeat=0.05)
        hung, released = asyncio.Event(), asyncio.Event()
        monkeypatch.setattr(SignOuts, "revoked", _hanging(hung, released))
        request = _request()
        request.state.signoff_sign_in = Grant("sgn_1", int(rt.now()), ALICE)
        await _keep_alives_while_hung(ctx, queue_changes(request, ctx, ALICE), hung, released)
