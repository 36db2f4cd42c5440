"""`Runtime.open` and `async with`: an open that fails after the store opened leaves nothing of
the store running (a PostgreSQL pool's tasks and connections), and a later call opens it anew."""

from __future__ import annotations

import asyncio
import math

import pytest

import signoff as so
from signoff.testing import reply, scripted_agent


def _others() -> list[asyncio.Task[object]]:
    """The tasks running on this loop but the test's own (a pool's workers and schedulers)."""
    return [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]


async def test_an_async_with_whose_opening_fails_leaves_the_store_closed(store_url: str) -> None:
    """A clock whose first reading is no time fails the `async with` after the store opened;
    with no `__aexit__` to follow, the pool of a PostgreSQL store ran on (ten tasks, a
    connection) until the process ended."""
    agent = scripted_agent("a", [reply("hi")], repeat_last=True)
    with pytest.raises(so.UsageError, match="clock returned inf"):
        async with so.Runtime([agent], store=store_url, clock=lambda: math.inf):
            pass
    assert _others() == []


async def test_a_call_whose_opening_fails_on_the_store_leaves_it_closed(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's clock cannot be read as the runtime opens (the server restarting): the call
    fails with the store's error and the store is closed again; the next call opens it."""
    agent = scripted_agent("a", [reply("hi")], repeat_last=True)
    rt = so.Runtime([agent], store=pg_store_url)
    store = rt.store

    async def down() -> float:
        raise so.StoreError("the server is restarting")

    monkeypatch.setattr(store, "server_time", down)
    with pytest.raises(so.StoreError, match="restarting"):
        await rt.generate("a", "hello")
    assert _others() == []
    monkeypatch.undo()
    try:
        assert (await rt.generate("a", "hello")).status == "completed"
    finally:
        await rt.close()
    assert _others() == []
