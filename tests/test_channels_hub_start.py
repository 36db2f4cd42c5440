"""A hub's first start on PostgreSQL: an entry whose transaction took its id below the trail's
end but commits after the hub read that end is delivered, not skipped as handled."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

import signoff as so
from signoff.channels import ChannelHub, ChannelState
from signoff.stores._audit import AuditRow

from ._channel_state import Seen
from ._channels import manual, three_refunds
from .test_channels_hub import Flaky

_KEY = 4242  # the advisory lock a stalled transaction waits on, after its audit insert


@asynccontextmanager
async def stalling(url: str, schema: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """While `stall` holds a row, a transaction that writes audit entries waits after its insert
    (ids taken, nothing visible) until this connection lets go of the advisory lock `_KEY`."""
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    try:
        await conn.execute(f"CREATE TABLE {schema}.stall (x int)")
        await conn.execute(
            f"CREATE FUNCTION {schema}.stall() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"IF EXISTS (SELECT 1 FROM {schema}.stall) THEN "
            f"PERFORM pg_advisory_xact_lock({_KEY}); END IF; RETURN NULL; END $$"
        )
        await conn.execute(
            f"CREATE TRIGGER stall AFTER INSERT ON {schema}.audit "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {schema}.stall()"
        )
        yield conn
    finally:
        await conn.close()


async def waiting_on_the_lock(conn: psycopg.AsyncConnection[Any]) -> None:
    """Until a transaction waits for the advisory lock (its audit entries inserted)."""
    for _ in range(1000):
        cur = await conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND objid = %s",
            [_KEY],
        )
        row = await cur.fetchone()
        if row and row[0]:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("no transaction waits on the lock")


async def test_an_entry_committing_below_the_end_at_the_first_start_is_delivered(
    pg_store_url: str,
) -> None:
    """Ids are taken at insert and seen at commit: a request opened in a transaction still
    committing when the hub read the end (below it, a later one committed) reaches the channel."""
    runs: list[str] = []
    async with so.Runtime([three_refunds(runs)], store=pg_store_url) as rt:
        schema = rt.store.schema  # type: ignore[attr-defined]
        async with stalling(pg_store_url, schema) as conn:
            await conn.execute(f"INSERT INTO {schema}.stall VALUES (1)")
            await conn.execute("SELECT pg_advisory_lock(%s)", [_KEY])
            late = asyncio.create_task(rt.generate("support", prompt="Refund A, B and C"))
            await waiting_on_the_lock(conn)
            await conn.execute(f"DELETE FROM {schema}.stall")
            done = await rt.generate("support", prompt="Refund D, E and F")  # committed above
            seen = Seen()
            async with manual(ChannelHub(rt, [seen], state=ChannelState(), gap_timeout=60)) as hub:
                assert seen.opened == []  # done's were handed to start() as open
                await conn.execute("SELECT pg_advisory_unlock(%s)", [_KEY])
                stalled = await late
                await hub.poll()
                assert seen.opened == [r.id for r in stalled.pending]
                assert hub.position(seen) == (await rt.store.audit())[-1].id
                assert {r.id for r in done.pending}.isdisjoint(seen.opened)


async def test_a_hole_at_the_first_start_waits_for_its_entry_or_gap_timeout(
    store_url: str,
) -> None:
    """The same on both stores, the hole made by hiding an entry: the entries there before the
    start are not delivered, the late one is, and a hole that never fills is passed."""
    runs: list[str] = []
    async with so.Runtime([three_refunds(runs)], store=store_url) as rt:
        first = await rt.generate("support", prompt="Refund A, B and C")
        second = await rt.generate("support", prompt="Refund D, E and F")
        entries = await rt.store.audit()
        (opened, _) = [e.id for e in entries if e.type == "input.requested"]
        real = rt.store.audit
        hidden = {opened}

        async def late(**kwargs: Any) -> list[Any]:
            return [e for e in await real(**kwargs) if e.id not in hidden]

        rt.store.audit = late  # type: ignore[method-assign]
        seen, state = Seen(), ChannelState()
        async with manual(ChannelHub(rt, [seen], state=state, gap_timeout=60)) as hub:
            await hub.poll()
            assert seen.opened == [] and hub.position(seen) == opened - 1
            assert state.position("hub:seen") == opened - 1
            hidden.clear()  # it commits
            await hub.poll()
            assert seen.opened == [r.id for r in first.pending]
            assert hub.position(seen) == entries[-1].id
        # a later first start (another hub name) whose hole never fills passes it
        hidden.add(opened)
        other = Seen()
        async with manual(ChannelHub(rt, [other], state=state, name="b", gap_timeout=60)) as hub:
            await hub.poll()
            assert hub.position(other) == opened - 1
            hub.gap_timeout = 0
            await hub.poll()
            assert hub.position(other) == entries[-1].id and other.opened == []
        assert {r.id for r in second.pending}.isdisjoint(seen.opened)


async def test_a_hub_taking_over_above_a_hole_does_not_deliver_again_what_was_delivered(
    store_url: str, tmp_path: Path
) -> None:
    """The saved position stays below a hole while the entries above it are delivered: a hub
    that takes over from it (a standby, or the same hub restarted) within `gap_timeout` skips
    those, delivering only the late entry once it shows up."""
    runs: list[str] = []
    async with so.Runtime([three_refunds(runs)], store=store_url) as rt:
        state = tmp_path / "channels.db"
        first = Flaky(0)
        async with manual(ChannelHub(rt, [first], state=state, gap_timeout=60)) as hub:
            r = await rt.generate("support", prompt="Refund A, B and C")
            a, b, c = r.pending
            await rt.respond(r.session_id, [so.InputResponse(request_id=a.id, option_id="approve")])
            entries = await rt.store.audit()
            (opened,) = [e.id for e in entries if e.type == "input.requested"]
            real = rt.store.audit
            hidden = {opened}

            async def late(**kwargs: Any) -> list[Any]:
                return [e for e in await real(**kwargs) if e.id not in hidden]

            rt.store.audit = late  # type: ignore[method-assign]
            await hub.poll()
            assert first.seen == [("approved", a.id)]
            assert hub.position(first) == opened - 1
        second = Flaky(0)
        async with manual(ChannelHub(rt, [second], state=state, gap_timeout=60)) as hub:
            await hub.poll()
            assert second.seen == []  # approved was told already
            hidden.clear()
            await hub.poll()
            assert second.seen == [("requested", b.id), ("requested", c.id)]
            assert hub.position(second) == entries[-1].id


async def test_the_position_of_a_channel_the_hub_does_not_deliver_to_is_a_named_error(
    tmp_path: Path,
) -> None:
    """Not started yet, a channel it stands by for, or a name it has not: a `UsageError`."""
    async with so.Runtime([three_refunds([])], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        state = tmp_path / "channels.db"
        one, two = Seen(), Seen()
        first = ChannelHub(rt, [one], state=state)
        with pytest.raises(so.UsageError, match="no position"):
            first.position(one)
        async with manual(first), manual(ChannelHub(rt, [two], state=state)) as standby:
            assert first.position(one) == (await rt.store.audit())[-1].id
            with pytest.raises(so.UsageError, match="no position"):
                standby.position(two)
            with pytest.raises(so.UsageError, match="no position"):
                first.position("sms")


async def test_a_first_start_finds_the_end_without_reading_the_whole_trail(
    store_url: str,
) -> None:
    """A hub on memory starts without a position every time: it finds the trail's end by ids,
    reading only the last entries (those it waits on holes among), not all of them."""
    async with so.Runtime([three_refunds([])], store=store_url) as rt:
        rows = [
            AuditRow(stream="stream", type="tool.approval_changed", at=1.0, seq=None, data={})
            for _ in range(3000)
        ]
        for _ in range(4):
            await rt.store.record_audit(rows)
        real = rt.store.audit
        read: list[int] = []

        async def counted(**kwargs: Any) -> list[Any]:
            found = await real(**kwargs)
            read.append(len(found))
            return found

        rt.store.audit = counted  # type: ignore[method-assign]
        seen = Seen()
        async with manual(ChannelHub(rt, [seen])) as hub:
            assert hub.position(seen) == (await real(after_id=11_500))[-1].id
            assert sum(read) <= 1000  # of 12,000
