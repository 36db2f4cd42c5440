"""PostgreSQL: two deletions of one session at once. Each reads the tree unlocked, then deletes
it in one statement if it is still what was read: the one that finds it gone deleted nothing,
and is `UnknownSession` (as on SQLite, whose deletion reads under its lock), not told it
deleted the session; one `store:deletions` entry, one id in the prunes' results."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import signoff as so
from signoff.stores._deletions import DELETIONS_STREAM
from signoff.testing import ManualClock, reply, scripted_agent

from .test_deletion import _erasing_meanwhile


def chat() -> so.Agent:
    return scripted_agent("chat", [reply("hello")], repeat_last=True)


async def _finished(rt: so.Runtime) -> str:
    """A new finished (idle) session's id."""
    return (await rt.generate("chat", prompt="hi")).session_id


def _deleted_after_read(b: so.Runtime, delete: Any) -> list[str]:
    """Run `delete()` (another runtime's deletion, committed) once `b`'s next deletion has
    read the tree, before its write: as a deletion in another process that read first and
    committed first. Returns its ids, once run."""
    store: Any = b.store
    doomed = store._doomed
    ran: list[str] = []

    async def then_deleted(*args: Any, **kwargs: Any) -> Any:
        store._doomed = doomed
        found = await doomed(*args, **kwargs)
        ran.extend(await delete())
        return found

    store._doomed = then_deleted
    return ran


async def _entries(rt: so.Runtime, session_id: str) -> list[Any]:
    """The `store:deletions` entries naming the session."""
    return [
        e for e in await rt.audit(stream=DELETIONS_STREAM) if e.data["session_id"] == session_id
    ]


async def test_a_deletion_that_read_the_session_before_another_deleted_it_is_unknown(
    pg_store_url: str,
) -> None:
    """Both returned the id as deleted (in 32 of 40 races of two processes): the statement
    said whether the session was gone afterwards, not whether it deleted it, and the one that
    found it gone had deleted nothing and written no entry."""
    async with (
        so.Runtime([chat()], store=pg_store_url) as a,
        so.Runtime([chat()], store=pg_store_url) as b,
    ):
        sid = await _finished(a)
        first = _deleted_after_read(b, lambda: a.delete_session(sid, reason="a"))
        with pytest.raises(so.UnknownSession):
            await b.delete_session(sid, reason="b")
        assert first == [sid]
        assert [e.data["reason"] for e in await _entries(a, sid)] == ["a"]


async def test_a_deletion_waiting_for_another_ones_locks_finds_the_session_gone(
    pg_store_url: str,
) -> None:
    """The race as it runs: the second deletion read the tree, then its statement waited for
    the locks of another transaction deleting it, which committed. The second deleted nothing,
    so it is `UnknownSession`, and writes no entry."""
    async with so.Runtime([chat()], store=pg_store_url) as rt:
        sid = await _finished(rt)
        raised, waited = await _erasing_meanwhile(
            pg_store_url, sid, lambda: rt.delete_session(sid, reason="second")
        )
        assert waited
        assert isinstance(raised, so.UnknownSession), raised
        assert await rt.audit(stream=DELETIONS_STREAM) == []


async def test_two_prunes_meeting_one_session_count_it_once(pg_store_url: str) -> None:
    """Two prunes listed the same session: the one whose deletion found it gone skips it (as
    deleted by another run), rather than counting it too (both did, in 28 of 30 races). One
    clock, moved on past the session's last activity: each runtime's reading of the database's
    clock (likely) differed by milliseconds under load, and `a`, reading it behind, did not find
    the session old enough (1 run in 75 with three busy loops beside it)."""
    clock = ManualClock()
    async with (
        so.Runtime([chat()], store=pg_store_url, clock=clock) as a,
        so.Runtime([chat()], store=pg_store_url, clock=clock) as b,
    ):
        sid = await _finished(a)
        clock.advance(60)
        first = _deleted_after_read(b, lambda: a.prune(older_than=0, reason="a"))
        assert await b.prune(older_than=0, reason="b") == []
        assert first == [sid]
        assert [e.data["reason"] for e in await _entries(a, sid)] == ["a"]


def _drop_after_deletion(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Once a string is added to the list returned, the next deletion statement loses its
    connection just after the server answered it (it committed, or found nothing to do)."""
    execute = psycopg.AsyncClientCursor.execute
    armed: list[str] = []

    async def execute_then_drop(self: psycopg.AsyncClientCursor[Any], query: Any, *a: Any) -> Any:
        cur = await execute(self, query, *a)
        if armed == ["armed"] and "deleted_sessions" in str(query):
            armed.append("dropped")
            self.connection.pgconn.finish()
            raise psycopg.OperationalError("server closed the connection unexpectedly (test)")
        return cur

    monkeypatch.setattr(psycopg.AsyncClientCursor, "execute", execute_then_drop)
    return armed


async def test_a_deletion_whose_connection_was_lost_is_found_by_its_own_entry(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second deletion's statement found the session gone, then its connection was lost:
    the check of whether it committed read the session's row gone and said yes, so it too
    returned the id. Its own entry is what says so: none, so it is `UnknownSession`."""
    async with (
        so.Runtime([chat()], store=pg_store_url) as a,
        so.Runtime([chat()], store=pg_store_url) as b,
    ):
        sid = await _finished(a)
        armed = _drop_after_deletion(monkeypatch)

        async def first() -> list[str]:
            ids = await a.delete_session(sid, reason="a")
            armed.append("armed")
            return ids

        deleted = _deleted_after_read(b, first)
        with pytest.raises(so.UnknownSession):
            await b.delete_session(sid, reason="b")
        assert armed == ["armed", "dropped"]
        assert deleted == [sid]
        assert [e.data["reason"] for e in await _entries(a, sid)] == ["a"]


async def test_a_deletion_whose_acknowledgement_is_lost_returns_its_ids(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deletion committed, then its connection dropped before the client heard so: its
    entry found, it returns the ids it deleted, once."""
    async with so.Runtime([chat()], store=pg_store_url) as rt:
        sid = await _finished(rt)
        armed = _drop_after_deletion(monkeypatch)
        armed.append("armed")
        assert await rt.delete_session(sid, reason="lost") == [sid]
        assert armed == ["armed", "dropped"]
        assert [e.data["reason"] for e in await _entries(rt, sid)] == ["lost"]
        with pytest.raises(so.UnknownSession):
            await rt.state(sid)
