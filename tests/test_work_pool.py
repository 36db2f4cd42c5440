"""A worker on PostgreSQL drives `concurrency` turns at once, each needing a pooled connection
for its store calls (and the claims, sweeps and lease renewals beside them): the pool is grown
to fit unless the URL sets `pool_max`, in which case a smaller one is named in a warning."""

from __future__ import annotations

import asyncio
import logging

import pytest

import signoff as so
from signoff.stores.postgres import PostgresStore

from ._shipping import shipping_agent


async def _working(url: str, concurrency: int) -> tuple[PostgresStore, int]:
    """The store of a worker run with `concurrency` a moment, and its pool's size meanwhile."""
    async with so.Runtime([shipping_agent([])], store=url, inline=False) as worker:
        store = worker.store
        assert isinstance(store, PostgresStore)
        stop = asyncio.Event()
        task = asyncio.create_task(worker.work(concurrency=concurrency, stop=stop, idle_wait=0.05))
        try:
            await asyncio.sleep(0.3)
            assert not task.done()
            pool = store._pool
            assert pool is not None
            return store, pool.max_size
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)


async def test_a_workers_pool_grows_to_its_concurrency(
    pg_store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="signoff.worker")
    store, size = await _working(pg_store_url, 16)
    assert size == store.max_size == 18  # a connection per turn, and two for the rest
    assert any("pool_max 10 -> 18" in r.getMessage() for r in caplog.records)
    store, size = await _working(pg_store_url, 4)
    assert size == store.max_size == 10  # never shrunk


async def test_a_pool_max_set_below_the_concurrency_is_kept_and_named(
    pg_store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="signoff.worker")
    sep = "&" if "?" in pg_store_url else "?"
    store, size = await _working(f"{pg_store_url}{sep}pool_max=4", 16)
    assert size == store.max_size == 4
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1
    message = warned[0].getMessage()
    assert "concurrency 16" in message and "pool_max=4" in message and "18" in message
