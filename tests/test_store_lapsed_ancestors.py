"""`lapsed_ancestors(now)`, run on every count of open requests: the sessions above a subagent
session whose TTL passed are found on both stores through a range of the index of children
(`sessions_children`, on their status and deadline), which the orphan sweep still uses too."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, cast

import psycopg
import pytest

import signoff as so
from signoff.stores import Commit, Store
from signoff.stores.sqlite import SQLiteStore

from ._procs import query


def _event(sid: str, seq: int, type: Any, at: float, **data: Any) -> so.Event:
    return so.Event(session_id=sid, seq=seq, type=type, at=at, turn_id=None, data=data)


def _question(rid: str, sid: str) -> so.InputRequest:
    return so.InputRequest(
        kind="question",
        id=rid,
        session_id=sid,
        turn_id="trn_a",
        agent="a",
        question="which one?",
        created_at=1.0,
    )


async def _session(
    store: Store,
    sid: str,
    *,
    parent: str | None = None,
    status: str = "waiting",
    expires_at: float | None = None,
    asks: bool = False,
) -> None:
    """A session (a subagent's of `parent`), left `status` with its TTL deadline at
    `expires_at` (None: no TTL), with a pending question if `asks`."""
    created = _event(sid, 1, "session.created", 1.0, **({"parent": parent} if parent else {}))
    await store.create_session(sid, "b" if parent else "a", [created], expires_at)
    await store.commit(
        Commit(
            session_id=sid,
            expected_seq=1,
            events=[_event(sid, 2, f"session.{status}", 2.0)],
            new_requests=[_question(f"req_{sid}", sid)] if asks else (),
            status=status,
            expires_at=expires_at,
        )
    )


async def _populate(store: Store) -> None:
    await _session(store, "ses_p", asks=True)
    await _session(store, "ses_p1", parent="ses_p", expires_at=100.0)  # lapses at 100
    await _session(store, "ses_q", asks=True)
    await _session(store, "ses_q1", parent="ses_q", status="running")  # no TTL: never lapses
    await _session(store, "ses_r", asks=True)
    await _session(store, "ses_r1", parent="ses_r", status="running", expires_at=200.0)
    await _session(store, "ses_s")  # no open request of its own
    await _session(store, "ses_s1", parent="ses_s", expires_at=50.0)
    await _session(store, "ses_t", asks=True, expires_at=10.0)  # lapsed, no parent
    await _session(store, "ses_u", asks=True)
    await _session(store, "ses_u1", parent="ses_u", status="idle", expires_at=10.0)  # done


async def test_the_sessions_above_a_lapsed_subagent_from_its_deadline(store: Store) -> None:
    """A parent is named once its running or waiting child's deadline is reached (not before),
    only if it has an open request; a child without a TTL (no deadline) never lapses, nor does a
    session of no parent or an idle child."""
    await _populate(store)
    lapsed: Callable[[float], Awaitable[list[str]]] = cast(Any, store).lapsed_ancestors
    assert await lapsed(49.9) == []
    assert await lapsed(99.9) == []
    assert await lapsed(100.0) == ["ses_p"]
    assert await lapsed(199.9) == ["ses_p"]
    assert await lapsed(200.0) == ["ses_p", "ses_r"]
    assert await lapsed(1e300) == ["ses_p", "ses_r"]
    assert await lapsed(float("inf")) == ["ses_p", "ses_r"]


async def _statements(
    store: Store, monkeypatch: pytest.MonkeyPatch, call: Callable[[], Awaitable[object]]
) -> list[tuple[str, Any]]:
    """The statements (and their parameters) the store runs for `call()`."""
    seen: list[tuple[str, Any]] = []
    if isinstance(store, SQLiteStore):
        store.conn.set_trace_callback(lambda sql: seen.append((sql, ())))  # values inlined
        try:
            await call()
        finally:
            store.conn.set_trace_callback(None)
        return [(sql, p) for sql, p in seen if "sessions" in sql]
    execute = psycopg.AsyncConnection.execute

    async def traced(self: Any, sql: Any, params: Any = None, **kw: Any) -> Any:
        seen.append((str(sql), params))
        return await execute(self, sql, params, **kw)

    with monkeypatch.context() as patch:
        patch.setattr(psycopg.AsyncConnection, "execute", traced)
        await call()
    return [(sql, p) for sql, p in seen if "sessions" in sql]


def _plan(url: str, sql: str, params: Any) -> list[dict[str, Any]]:
    """The nodes of the plan of `sql` (on SQLite each with its `detail` only; PostgreSQL with
    its statistics taken and sequential scans off: tables this small are cheaper scanned)."""
    if url.startswith("sqlite:///"):
        rows = query(url, "EXPLAIN QUERY PLAN " + sql.replace("{", "{{").replace("}", "}}"))
        return [{"detail": str(r[-1])} for r in rows]
    with psycopg.connect(url.partition("?")[0], autocommit=True) as conn:
        conn.execute("ANALYZE")
        conn.execute("SET enable_seqscan = off")
        ((plan,),) = conn.execute(("EXPLAIN (FORMAT JSON) " + sql).encode(), params).fetchall()

    def nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
        return [node, *(n for p in node.get("Plans", []) for n in nodes(p))]

    return nodes(plan[0]["Plan"])


def _children_scans(plan: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [n for n in plan if "sessions_children" in (n.get("detail") or n.get("Index Name", ""))]


async def test_a_lapsed_subagent_is_a_range_of_the_index_of_children(
    store: Store, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The statement `lapsed_ancestors` reads the index of children by status and up to the
    deadline, so it reads only the lapsed ones, not every running or waiting child, then looks
    up the pending requests of each session above; the orphan sweep still reads its children by
    status through the same index."""
    await _populate(store)
    reads: Any = store  # both stores' reads, beyond the `Store` protocol
    lapsed = await _statements(store, monkeypatch, lambda: reads.lapsed_ancestors(100.0))
    orphans = await _statements(store, monkeypatch, lambda: reads.orphaned_children(["b"]))
    ((sql, params),) = lapsed
    plan = _plan(store_url, sql, params)
    if store_url.startswith("sqlite:///"):
        assert _children_scans(plan) == [
            {"detail": "SEARCH sessions USING INDEX sessions_children (status=? AND expires_at<?)"}
        ]
        assert {
            "detail": "SEARCH r USING COVERING INDEX requests_by_session (sk=? AND status=?)"
        } in plan
    else:
        # (With sequential scans off, the recursive step may read the tiny index whole too.)
        ranges = [n for n in _children_scans(plan) if "expires_at" in n.get("Index Cond", "")]
        assert len(ranges) == 1, plan
        assert "status = ANY" in ranges[0]["Index Cond"], ranges
        assert "expires_at <=" in ranges[0]["Index Cond"], ranges
        filters = [str(n.get("Filter", "")) + str(n.get("Recheck Cond", "")) for n in plan]
        assert not [f for f in filters if "expires_at" in f], plan  # never read, then dropped
        requests = [n for n in plan if n.get("Relation Name") == "requests"]
        by_session = [n for n in requests if "(sk = s.sk)" in n.get("Index Cond", "")]
        assert by_session, plan  # each session above looked up, not every pending request read
        for node in requests:  # else a range of the passed deadlines (the other way up)
            assert node in by_session or "expires_at <=" in node.get("Index Cond", ""), node
    ((sql, params),) = orphans
    assert _children_scans(_plan(store_url, sql, params)), sql
