"""`Driver.record` when the store went back behind what the drive had recorded: commits it had
acknowledged were lost (a PostgreSQL server that crashed, its ordinary commits not flushed yet,
or a restore). Each test takes a copy of the store while a tool body runs, and puts it back while
the next one runs."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path

import psycopg
import pytest

import signoff as so
from signoff.stores import Commit
from signoff.testing import call, call_tools, reply, scripted_agent, store_contents

from .conftest import make_store

Restore = Callable[[], Awaitable[None]]


async def _copy(url: str) -> Restore:
    """A copy of the whole store as it is now, and how to put it back over the store."""
    if url.startswith("sqlite://"):
        path = url.removeprefix("sqlite:///")
        saved = sqlite3.connect(":memory:")
        with sqlite3.connect(path) as live:
            live.backup(saved)

        async def put_back_file() -> None:
            live = sqlite3.connect(path)
            try:
                saved.backup(live)
            finally:
                live.close()

        return put_back_file
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'signoff' ORDER BY tablename"
        )
        tables = [str(t) for (t,) in await cur.fetchall()]
        for t in tables:
            await conn.execute(f'CREATE TABLE public."saved_{t}" AS TABLE signoff."{t}"'.encode())

    async def put_back_tables() -> None:
        # The TRUNCATE locks table after table, so a follower's read holding one of them while
        # it waits for another is a deadlock PostgreSQL breaks by failing this whole transaction:
        # nothing of it is left, and it is run again.
        for attempt in range(5):
            try:
                await _put_back(url, tables)
                return
            except psycopg.errors.DeadlockDetected:
                if attempt == 4:
                    raise
                await asyncio.sleep(0.05)

    return put_back_tables


async def _put_back(url: str, tables: list[str]) -> None:
    """Put the tables saved by `_copy` back over the store's, in one transaction."""
    async with await psycopg.AsyncConnection.connect(url) as conn:
        await conn.execute("SET session_replication_role = replica")  # no foreign key checks
        names = ", ".join(f'signoff."{t}"' for t in tables)
        await conn.execute(f"TRUNCATE {names}".encode())
        for t in tables:
            await conn.execute(
                f'INSERT INTO signoff."{t}" OVERRIDING SYSTEM VALUE '
                f'SELECT * FROM public."saved_{t}"'.encode()
            )


def _two_steps() -> tuple[so.Agent, asyncio.Queue[tuple[str, str]], dict[str, asyncio.Event]]:
    """An agent calling two tools in turn, each of which says it was reached (its name and
    session) and waits to be let go (`go[name]`)."""
    reached: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
    go = {"first": asyncio.Event(), "second": asyncio.Event()}

    async def pause(name: str, ctx: so.ToolContext) -> str:
        await reached.put((name, ctx.session.id))
        await go[name].wait()
        return "done"

    @so.tool
    async def first(ctx: so.ToolContext) -> str:
        """The first step."""
        return await pause("first", ctx)

    @so.tool
    async def second(ctx: so.ToolContext) -> str:
        """The second step."""
        return await pause("second", ctx)

    script = [call_tools(call("first")), call_tools(call("second")), reply("Done.")]
    return scripted_agent("a", script, tools=[first, second]), reached, go


async def test_a_drive_whose_store_lost_its_last_commits_stops_and_records_nothing(
    store_url: str, tmp_path: Path
) -> None:
    """A drive whose store lost the commits that recorded its second tool call (the server
    crashed before flushing them) went on as if they were there: it appended that call's result
    after what was left, naming a call the log no longer held, and the session could never be
    read again ("refers to an unknown call"). It stops with a `StoreError` saying so, writes
    nothing, and the session reads as the store kept it."""
    agent, reached, go = _two_steps()
    async with so.Runtime([agent], store=store_url) as rt:
        turn = asyncio.create_task(rt.generate("a", prompt="go"))
        name, sid = await asyncio.wait_for(reached.get(), 20)
        assert name == "first"
        kept = await store_contents(rt.store, sid)
        put_back = await _copy(store_url)
        go["first"].set()
        assert (await asyncio.wait_for(reached.get(), 20))[0] == "second"
        assert (await rt.store.head(sid) or 0) > (kept.head or 0)
        await put_back()  # the commits since the copy are lost
        go["second"].set()
        with pytest.raises(so.StoreError, match="behind the seq .* lost commits") as failed:
            await asyncio.wait_for(turn, 20)
        assert type(failed.value) is so.StoreError
        assert await store_contents(rt.store, sid) == kept
        state = await rt.state(sid)  # it reads: no event names a call the log lost
        assert state.seq == kept.head


async def test_a_drive_whose_lost_commits_were_written_again_stops_and_records_nothing(
    store_url: str,
) -> None:
    """As above, and then another process wrote the session up to the seq the drive had reached
    (filler events here): the store's head is the one the drive expects, so its next commit
    applied, on a log that does not hold what it was planned from. The head event is checked
    too (`Commit.expected_event`): the drive stops with a `StoreError`, writing nothing."""
    agent, reached, go = _two_steps()
    async with so.Runtime([agent], store=store_url) as rt:
        turn = asyncio.create_task(rt.generate("a", prompt="go"))
        _, sid = await asyncio.wait_for(reached.get(), 20)
        kept = await rt.store.head(sid) or 0
        put_back = await _copy(store_url)
        go["first"].set()
        assert (await asyncio.wait_for(reached.get(), 20))[0] == "second"
        head = await rt.store.head(sid) or 0
        await put_back()  # the commits since the copy are lost
        other = make_store(store_url)
        await other.open()
        try:
            for seq in range(kept + 1, head + 1):  # written again, by another process
                filler = so.Event(session_id=sid, seq=seq, type="session.waiting", at=seq)
                await other.commit(Commit(session_id=sid, expected_seq=seq - 1, events=[filler]))
        finally:
            await other.close()
        written = await store_contents(rt.store, sid)
        go["second"].set()
        with pytest.raises(so.StoreError, match="another event at the seq .* lost commits"):
            await asyncio.wait_for(turn, 20)
        assert await store_contents(rt.store, sid) == written
        assert (await rt.state(sid)).seq == head
