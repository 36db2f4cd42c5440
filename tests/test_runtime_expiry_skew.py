"""A follower meets a session's expiry on the runtime's clock, the database's on PostgreSQL,
not on this machine's wall clock, which may be minutes off it."""

from __future__ import annotations

import asyncio
import time

import pytest

import signoff as so

from ._ttl import ttl_agent

AHEAD = 25.0  # how far the database's clock runs ahead of this machine's


async def test_a_follower_meets_the_expiry_on_the_database_clock(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, an idle follower on PostgreSQL waited for changes until the session's expiry as
    this machine's clock read it: with the database's clock 25 s ahead, a session whose TTL of
    a second passed was followed on for about 25 s more (30 s at most, the re-check)."""
    agent = ttl_agent()
    agent.limits = so.Limits(ttl=1)
    rt = so.Runtime([agent], store=pg_store_url)
    server_time = rt.store.server_time  # type: ignore[attr-defined]

    async def ahead() -> float:
        return float(await server_time()) + AHEAD

    monkeypatch.setattr(rt.store, "server_time", ahead)
    async with rt:
        r = await rt.generate("desk", prompt="reset")
        assert r.status == "waiting"
        assert abs(rt.now() - time.time() - AHEAD) < 1
        began = time.monotonic()

        async def follow() -> None:
            async for _ in rt.events(r.session_id):
                pass

        with pytest.raises(so.SessionExpired):
            await asyncio.wait_for(follow(), 10)
        assert time.monotonic() - began < 5
