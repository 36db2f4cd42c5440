"""A process frozen inside a transaction (SIGSTOP, a paused virtual machine) keeps its row locks
while its kernel still answers the server: the server ends the transaction once it has been idle
for half the store's `operation_timeout`, so the session's other writers go on."""

from __future__ import annotations

import asyncio
import time

import psycopg

import signoff as so
from signoff.stores.postgres import PostgresStore


async def test_a_transaction_left_open_by_a_frozen_process_does_not_block_the_session(
    pg_store_url: str,
) -> None:
    """A signoff connection left idle in a transaction holding the session's row lock (what a
    process frozen between a commit's statement and its COMMIT leaves) is ended by the server;
    an answer waiting for the lock then goes through, well within its own deadline."""
    url = f"{pg_store_url}?operation_timeout=4"
    agent = so.Agent(
        name="support",
        model=so.models.Scripted([so.ModelResponse(text="Hello.")], repeat_last=True),
    )
    async with so.Runtime([agent], store=url) as rt:
        sid = await rt.create_session("support")
        frozen = PostgresStore(url)
        await frozen.open()
        try:
            pool = await frozen._get_pool()
            async with pool.connection() as conn:
                await conn.execute("BEGIN")
                await conn.execute(
                    'SELECT 1 FROM "signoff".sessions WHERE id = %s FOR UPDATE', (sid,)
                )
                started = time.monotonic()
                result = await asyncio.wait_for(rt.generate(session_id=sid, prompt="Hi"), 10)
                assert result.status == "completed"
                assert time.monotonic() - started < 4  # not cut by its own deadline
                try:
                    await conn.execute("COMMIT")
                except psycopg.Error:
                    pass  # the server ended it: its connection is gone
                else:
                    raise AssertionError("the idle transaction was not ended")
        finally:
            await frozen.close()
