"""The PostgreSQL commit tests' approval requests and the check that a session's audit chain
verifies.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from signoff.stores.postgres import PostgresStore

__all__ = ["two"]


@pytest.fixture
async def two(pg_store_url: str) -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:
    """Two stores on one database, as two processes would have."""
    a, b = PostgresStore(pg_store_url), PostgresStore(pg_store_url)
    await a.open()
    await b.open()
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()
