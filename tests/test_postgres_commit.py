"""The PostgreSQL commit as one statement: what it guesses, what it checks, what it folds.

A commit is sent as one statement (a transaction of its own, with its Sync, in one round trip)
built from the session's state as this store last saw it; the statement checks that guess under
the row lock and writes nothing when it is wrong. These tests make the guess wrong in every way
they can, and cover the rows the statement folds together (batches longer than a VALUES list, a
request resolved twice, resolved and updated, created and updated in one commit). The event rows
it writes are in tests/test_postgres_commit_rows.py, the audit entries in
tests/test_postgres_commit_audit.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from signoff._audit_trail import verify
from signoff._exceptions import (
    AppendConflict,
    LeaseLost,
    RequestClosed,
    UnknownSession,
)
from signoff._types import Action, InputRequest
from signoff.stores import Commit, PendingFilter, Resolve
from signoff.stores.postgres import PostgresStore
from signoff.stores.postgres._connections import Seen

from ._pg_events import T0, ev, new_session
from ._postgres_commit import two

__all__ = ["two"]  # the fixture, used by name


async def chain_problems(pg: PostgresStore, sid: str) -> list[Any]:
    """`verify`'s findings about the session's hash chain. The requests these tests commit are
    asked by stand-in events, not real `input.requested` ones, so the check of request rows
    against their entries (`_audit_requests`, tested in test_audit_requests.py) finds them all
    unasked, and their stand-in snapshots are no fold of those events (`_audit_snapshots`,
    tested in test_audit_verify_snapshots.py): those parts of `verify` are left out here."""
    problems = await verify(pg, stream=sid)
    return [p for p in problems if not p.reason.startswith(("request ", "the snapshot "))]


def approval(sid: str, rid: str) -> InputRequest:
    return InputRequest(
        kind="tool-approval",
        id=rid,
        session_id=sid,
        turn_id="trn_1",
        agent="support",
        action=Action(call_id=f"call_{rid}", tool_name="ship", input={"n": 1}, input_hash="h"),
        created_at=T0,
    )


def settle(rid: str, outcome: str = "approved") -> Resolve:
    return Resolve(request_id=rid, status="settled", outcome=outcome, resolution={"o": outcome})


async def test_another_process_moved_the_head(two: tuple[PostgresStore, PostgresStore]) -> None:
    a, b = two
    sid = await new_session(a)
    await b.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2, "tool.started")]))
    # a's guess is head 1: a commit expecting 1 conflicts and writes nothing ...
    with pytest.raises(AppendConflict, match="at seq 2, not 1"):
        await a.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2, "tool.started")]))
    # ... and one expecting 2 chains its audit entry onto b's.
    await a.commit(
        Commit(session_id=sid, expected_seq=2, events=[ev(sid, 3, "tool.completed", ok=1)])
    )
    assert [e.seq for e in await a.read_events(sid)] == [1, 2, 3]
    assert [e.n for e in await a.audit(stream=sid)] == [1, 2]
    assert await verify(a, stream=sid) == []


async def test_a_wrong_guess_of_the_audit_chain_is_read_and_sent_again(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = two
    sid = await new_session(a)
    await b.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2, "tool.started")]))
    for n, digest in [(0, None), (1, b"\x00" * 32), (7, None)]:
        head = await a.head(sid)
        assert head is not None
        # right head, wrong chain head
        a._state[sid] = a._state[sid]._replace(head=head, audit_n=n, audit_hash=digest)
        await a.commit(
            Commit(session_id=sid, expected_seq=head, events=[ev(sid, head + 1, "tool.started")])
        )
    assert [e.n for e in await a.audit(stream=sid)] == [1, 2, 3, 4]
    assert await verify(a, stream=sid) == []
    assert await a.head(sid) == 5


async def test_a_lease_taken_over_elsewhere_is_lost(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = two
    sid = await new_session(a)
    token = await a.acquire_lease(sid, "w1", 10, T0)
    assert token is not None
    assert await b.acquire_lease(sid, "w2", 10, T0 + 1) is None  # live: not taken
    taken = await b.acquire_lease(sid, "w2", 10, T0 + 20)  # expired: taken over
    assert taken == token + 1
    with pytest.raises(LeaseLost):
        await a.commit(
            Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)], lease_token=token)
        )
    # A stale head still wins over a lost lease, as before.
    with pytest.raises(AppendConflict):
        await a.commit(
            Commit(session_id=sid, expected_seq=5, events=[ev(sid, 6)], lease_token=token)
        )
    await b.commit(
        Commit(
            session_id=sid,
            expected_seq=1,
            events=[ev(sid, 2)],
            lease_token=taken,
            release_lease=True,
        )
    )
    assert await a.head(sid) == 2
    assert await a.acquire_lease(sid, "w3", 10, T0 + 2) == taken + 1  # released


async def test_acquire_lease_on_an_unknown_session(pg: PostgresStore) -> None:
    with pytest.raises(UnknownSession):
        await pg.acquire_lease("ses_nobody", "w1", 10, T0)


async def test_commit_to_an_unknown_session_with_a_guess(pg: PostgresStore) -> None:
    pg._state["ses_nobody"] = Seen(1, 0, None, 1, "")
    with pytest.raises(UnknownSession):
        await pg.commit(Commit(session_id="ses_nobody", expected_seq=1, events=[ev("x", 2)]))
    assert "ses_nobody" not in pg._state


async def test_long_batches_go_as_arrays(pg: PostgresStore) -> None:
    """More rows than a VALUES list takes: events, audit entries and requests as arrays."""
    sid = await new_session(pg, events=30)
    assert [e.seq for e in await pg.read_events(sid)] == list(range(1, 31))
    ids = [f"req_{sid}_{i}" for i in range(20)]
    events = [ev(sid, 31, "input.requested", requests=[])]
    events += [ev(sid, 32 + i, "tool.started", i=i) for i in range(20)]
    await pg.commit(
        Commit(
            session_id=sid,
            expected_seq=30,
            events=events,
            new_requests=[approval(sid, r) for r in ids],
            snapshot={"seq": 51},
        )
    )
    assert len(await pg.pending(PendingFilter(session_id=sid, limit=100))) == 20
    changed = [approval(sid, r).model_copy(update={"question": f"q{r}"}) for r in ids]
    await pg.commit(
        Commit(
            session_id=sid,
            expected_seq=51,
            events=[ev(sid, 52 + i, "input.resolved", i=i) for i in range(18)],
            resolve=[settle(r) for r in ids[:18]],
            updated_requests=changed[10:],  # 10 of them also resolved here
        )
    )
    for i, rid in enumerate(ids):
        stored = await pg.get_request(rid)
        assert stored is not None
        assert stored.status == ("settled" if i < 18 else "pending")
        assert stored.request.question == (f"q{rid}" if i >= 10 else None)
    assert await pg.head(sid) == 69
    assert len(await pg.audit(stream=sid)) == 20 + 18 + 1
    assert await chain_problems(pg, sid) == []
    loaded = await pg.load(sid)
    assert loaded is not None and loaded.snapshot == {"seq": 51} and len(loaded.events) == 18


async def test_a_request_resolved_twice_in_one_commit_is_closed(pg: PostgresStore) -> None:
    sid = await new_session(pg)
    await pg.commit(
        Commit(
            session_id=sid,
            expected_seq=1,
            events=[ev(sid, 2, "input.requested")],
            new_requests=[approval(sid, "rq_a"), approval(sid, "rq_b")],
        )
    )
    with pytest.raises(RequestClosed) as info:
        await pg.commit(
            Commit(
                session_id=sid,
                expected_seq=2,
                events=[ev(sid, 3, "input.resolved")],
                resolve=[settle("rq_b"), settle("rq_a"), settle("rq_b", "denied")],
            )
        )
    assert info.value.request_ids == ["rq_b"]
    assert await pg.head(sid) == 2
    assert len(await pg.pending(PendingFilter(session_id=sid))) == 2
    # The first of the commit's requests that is not pending is the one named.
    await pg.commit(
        Commit(
            session_id=sid,
            expected_seq=2,
            events=[ev(sid, 3, "input.resolved")],
            resolve=[settle("rq_b")],
        )
    )
    with pytest.raises(RequestClosed) as info:
        await pg.commit(
            Commit(
                session_id=sid,
                expected_seq=3,
                events=[ev(sid, 4, "input.resolved")],
                resolve=[settle("rq_a"), settle("rq_b"), settle("rq_gone")],
            )
        )
    assert info.value.request_ids == ["rq_b"]
    a = await pg.get_request("rq_a")
    assert a is not None and a.status == "pending"


async def test_a_request_created_or_resolved_and_updated_in_one_commit(
    pg: PostgresStore,
) -> None:
    sid = await new_session(pg)
    req = approval(sid, "rq_new")
    changed = req.model_copy(update={"question": "changed at once"})
    await pg.commit(
        Commit(
            session_id=sid,
            expected_seq=1,
            events=[ev(sid, 2, "input.requested", requests=[req.model_dump(mode="json")])],
            new_requests=[req],
            updated_requests=[changed],
        )
    )
    stored = await pg.get_request("rq_new")
    assert stored is not None and stored.request == changed and stored.status == "pending"
    again = changed.model_copy(update={"question": "changed while settled"})
    await pg.commit(
        Commit(
            session_id=sid,
            expected_seq=2,
            events=[ev(sid, 3, "input.resolved")],
            resolve=[settle("rq_new")],
            updated_requests=[again],
        )
    )
    stored = await pg.get_request("rq_new")
    assert stored is not None and stored.status == "settled"
    assert stored.request.question == "changed while settled"


async def test_commit_waits_for_a_row_updated_elsewhere_then_applies(
    pg: PostgresStore, pg_store_url: str
) -> None:
    """The session row changes (not its head) after the statement started: the lock waits,
    then every write goes to the row's newest version."""
    sid = await new_session(pg)
    await pg.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)]))
    holder = await psycopg.AsyncConnection.connect(pg_store_url, autocommit=True)
    observer = await psycopg.AsyncConnection.connect(pg_store_url, autocommit=True)
    async with holder, observer:
        await holder.execute("BEGIN")
        await holder.execute(
            "UPDATE signoff.sessions SET expires_at = 5 WHERE id=%s", (sid,), prepare=False
        )
        commit = asyncio.create_task(
            pg.commit(
                Commit(
                    session_id=sid,
                    expected_seq=2,
                    events=[ev(sid, 3, "tool.started")],
                    status="running",
                    expires_at=T0 + 99,
                )
            )
        )
        for _ in range(500):
            cur = await observer.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database() AND query LIKE %s",
                ("%FOR UPDATE%",),
            )
            row = await cur.fetchone()
            if row is not None and row[0] == 1:
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("the commit never waited for the row")
        assert not commit.done()
        await holder.execute("COMMIT")
        await asyncio.wait_for(commit, 10)
        cur = await observer.execute(
            "SELECT head, status, expires_at, audit_n FROM signoff.sessions WHERE id=%s", (sid,)
        )
        assert await cur.fetchone() == (3, "running", T0 + 99, 1)
    assert await verify(pg, stream=sid) == []


@pytest.mark.parametrize("level", ["repeatable read", "serializable"])
async def test_a_stricter_default_isolation_set_by_a_dba_changes_nothing(
    pg_store_url: str, level: str
) -> None:
    """The commits and claims rely on READ COMMITTED (a statement that waited for a row lock goes
    on with the row's newest version): a database whose default isolation is stricter made them
    fail with "could not serialize access" instead; signoff's connections keep READ COMMITTED."""
    admin = await psycopg.AsyncConnection.connect(pg_store_url, autocommit=True)
    async with admin:
        await admin.execute(
            f"ALTER DATABASE \"{admin.info.dbname}\" SET default_transaction_isolation = '{level}'"
        )
    store = PostgresStore(pg_store_url)
    try:
        sid = await new_session(store)
        await store.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)]))
        holder = await psycopg.AsyncConnection.connect(pg_store_url, autocommit=True)
        async with holder:
            await holder.execute("BEGIN")
            await holder.execute("UPDATE signoff.sessions SET expires_at = 5 WHERE id=%s", (sid,))
            commit = asyncio.create_task(
                store.commit(
                    Commit(
                        session_id=sid,
                        expected_seq=2,
                        events=[ev(sid, 3, "tool.started")],
                        status="running",
                    )
                )
            )
            claim = asyncio.create_task(store.claim("w1", 10, T0, 10))
            await asyncio.sleep(0.3)  # both wait for the row lock
            assert not commit.done()
            await holder.execute("COMMIT")
            await asyncio.wait_for(commit, 10)
            await asyncio.wait_for(claim, 10)
        assert await store.head(sid) == 3
        assert [s for s, _ in await store.claim("w2", 10, T0, 10)] in ([], [sid])
    finally:
        await store.close()


async def test_a_guessed_commit_is_one_statement_sent_with_its_sync(
    pg: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With its state known, a commit sends one statement, a transaction of its own, not
    pipelined: it goes out with its Sync in one message, so the server commits it without
    waiting for this process (which may freeze once it is sent: tests/test_postgres_frozen.py);
    without it, it reads the state first (one more statement, unlocked: the session row and the
    row naming the turn at its head). Creating a session is one statement alone."""
    sent: list[str] = []
    real = psycopg.AsyncConnection.execute

    async def execute(self: psycopg.AsyncConnection[Any], query: Any, *a: Any, **k: Any) -> Any:
        pipelined = " (pipelined)" if self._pipeline is not None else ""
        sent.append(str(query).split(" ", 1)[0] + pipelined)
        return await real(self, query, *a, **k)

    monkeypatch.setattr(psycopg.AsyncConnection, "execute", execute)
    sid = await new_session(pg)
    assert sent == ["WITH"]  # one statement, a transaction of its own
    token = await pg.acquire_lease(sid, "w1", 10, T0)
    assert token is not None
    sent.clear()
    for seq in range(2, 5):
        await pg.commit(
            Commit(
                session_id=sid,
                expected_seq=seq - 1,
                events=[ev(sid, seq, "tool.started")],
                lease_token=token,
                new_requests=[approval(sid, f"rq_{sid}_{seq}")],
                snapshot={"seq": seq},
            )
        )
    assert sent == ["WITH"] * 3
    sent.clear()
    pg._state.clear()
    await pg.commit(Commit(session_id=sid, expected_seq=4, events=[ev(sid, 5)], lease_token=token))
    assert sent == ["SELECT", "WITH"]
    assert await chain_problems(pg, sid) == []
