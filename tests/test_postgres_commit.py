"""The PostgreSQL commit as one statement: what it guesses, what it checks, what it folds.

A commit is sent as one statement (between BEGIN and COMMIT, in one round trip) built from the
session's state as this store last saw it; the statement checks that guess under the row lock
and writes nothing when it is wrong. These tests make the guess wrong in every way they can,
and cover the rows the statement folds together (batches longer than a VALUES list, a request
resolved twice, resolved and updated, created and updated in one commit) and the event rows it
writes (type codes, a turn id only where it changes, from whichever store wrote the rows before).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from signoff._audit_trail import verify
from signoff._events import Event, dumps
from signoff._exceptions import (
    AppendConflict,
    LeaseLost,
    RequestClosed,
    UnknownSession,
)
from signoff._types import Action, InputRequest
from signoff.stores import Commit, PendingFilter, Resolve
from signoff.stores._audit import AuditRow
from signoff.stores._codec import stored_type
from signoff.stores.postgres import PostgresStore
from signoff.stores.postgres._connections import Seen
from signoff.stores.postgres._sql import TURN_NAMED_EVERY

from ._pg_events import T0, ev, new_session


async def chain_problems(pg: PostgresStore, sid: str) -> list[Any]:
    """`verify`'s findings about the session's hash chain. The requests these tests commit are
    asked by stand-in events, not real `input.requested` ones, so the check of request rows
    against their entries (`_audit_requests`, tested in test_audit_requests.py) finds them all
    unasked: that half of `verify` is left out here."""
    return [p for p in await verify(pg, stream=sid) if not p.reason.startswith("request ")]


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


async def test_a_guessed_commit_is_one_statement_between_begin_and_commit(
    pg: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With its state known, a commit sends BEGIN, one statement and COMMIT, all in one
    pipeline that waits once, when it ends; without it, it reads the state first (one more
    statement, unlocked: the session row and the row naming the turn at its head, and one wait
    for its answer). Creating a session is one statement alone."""
    sent: list[str] = []
    real = psycopg.AsyncConnection.execute
    real_fetch = psycopg.AsyncCursor._fetch_pipeline

    async def execute(self: psycopg.AsyncConnection[Any], query: Any, *a: Any, **k: Any) -> Any:
        sent.append(str(query).split(" ", 1)[0])
        return await real(self, query, *a, **k)

    async def fetch(self: psycopg.AsyncCursor[Any]) -> None:
        if self.pgresult is None and self.connection._pipeline is not None:
            sent.append("(wait)")  # an answer read before the pipeline ends
        await real_fetch(self)

    monkeypatch.setattr(psycopg.AsyncConnection, "execute", execute)
    monkeypatch.setattr(psycopg.AsyncCursor, "_fetch_pipeline", fetch)
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
    assert sent == ["BEGIN", "WITH", "COMMIT"] * 3
    sent.clear()
    pg._state.clear()
    await pg.commit(Commit(session_id=sid, expected_seq=4, events=[ev(sid, 5)], lease_token=token))
    assert sent == ["BEGIN", "SELECT", "(wait)", "WITH", "COMMIT"]
    assert await chain_problems(pg, sid) == []


# -- event rows: type codes, turn ids where they change ------------------------------------------


def turn_ev(sid: str, seq: int, turn: str | None, type_: Any = "tool.step") -> Event:
    return Event(session_id=sid, seq=seq, type=type_, at=T0 + seq, turn_id=turn, data={"n": seq})


def named_where_it_changes(turns: list[str | None]) -> list[str | None]:
    """The `turn` column of a log of events of these turns, the first at seq 1: a row names its
    turn ('' for none) where it differs from the row before, or TURN_NAMED_EVERY rows after the
    row that last named it; else NULL."""
    column: list[str | None] = []
    last, since = None, 0
    for turn in turns:
        named = turn or ""
        if named == last and since + 1 < TURN_NAMED_EVERY:
            column.append(None)
            since += 1
        else:
            column.append(named)
            last, since = named, 0
    return column


async def rows_of(url: str, sid: str) -> list[tuple[int, str, str | None]]:
    """The session's event rows as stored: seq, type, turn."""
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute(
            "SELECT e.seq, e.type, e.turn FROM signoff.events e "
            "JOIN signoff.sessions s ON s.sk = e.sk WHERE s.id = %s ORDER BY e.seq",
            (sid,),
        )
        return [(int(seq), str(code), turn) for seq, code, turn in await cur.fetchall()]


async def reads_every_way(store: PostgresStore, sid: str, events: list[Event]) -> None:
    """Every read of the log agrees with `events`: whole, from every starting point (the middle
    of a turn too), with a limit, the newest few, by type, and loaded."""
    assert await store.read_events(sid) == events
    for after in range(len(events)):
        assert await store.read_events(sid, after) == events[after:]
        assert await store.read_events(sid, after, limit=3) == events[after : after + 3]
    for newest in (1, 2, TURN_NAMED_EVERY + 1, 3 * TURN_NAMED_EVERY):
        assert await store.read_events(sid, newest=newest) == events[-newest:]
        assert await store.read_events(sid, 5, newest=newest) == events[5:][-newest:]
    for types in (["turn.started"], ["tool.step"], ["turn.started", "session.created"]):
        assert await store.read_events(sid, types=types) == [e for e in events if e.type in types]
    loaded = await store.load(sid)
    assert loaded is not None and loaded.events == events


async def test_a_commit_after_another_process_s_is_one_statement_once_its_head_was_read(
    two: tuple[PostgresStore, PostgresStore], pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`head`, `claim` and `acquire_lease` read the state a commit guesses with the head, so a
    store's commit after another process's (once it has looked at the session) needs no read
    first, and writes the rows one store alone would."""
    a, b = two
    sent: list[str] = []
    real = psycopg.AsyncConnection.execute

    async def execute(self: psycopg.AsyncConnection[Any], query: Any, *x: Any, **k: Any) -> Any:
        sent.append(str(query).split(" ", 1)[0])
        return await real(self, query, *x, **k)

    monkeypatch.setattr(psycopg.AsyncConnection, "execute", execute)
    sid = f"ses_{uuid.uuid4().hex[:20]}"
    events = [turn_ev(sid, 1, None, "session.created")]
    await a.create_session(sid, "support", events, None)

    async def claim() -> int | None:
        ((got, token),) = await a.claim("w", 10, T0, 10)
        assert got == sid
        return token

    looks = [
        lambda: a.head(sid),
        claim,
        lambda: a.acquire_lease(sid, "w", 10, T0),
        lambda: a.head(sid),
    ]
    for i, look in enumerate(looks):
        # The other process moves the session on, into a new turn, then leaves it runnable.
        head = len(events)
        moved = [turn_ev(sid, head + 1, f"trn_{i}"), turn_ev(sid, head + 2, f"trn_{i}")]
        await b.commit(Commit(session_id=sid, expected_seq=head, events=moved, status="running"))
        events += moved
        token = await look()
        sent.clear()
        event = turn_ev(sid, len(events) + 1, f"trn_{i}" if i % 2 else None)
        await a.commit(
            Commit(
                session_id=sid,
                expected_seq=len(events),
                events=[event],
                status="idle",
                lease_token=token if i in (1, 2) else None,
                release_lease=i in (1, 2),
            )
        )
        events.append(event)
        assert sent == ["BEGIN", "WITH", "COMMIT"], look
    rows = await rows_of(pg_store_url, sid)
    assert [turn for _, _, turn in rows] == named_where_it_changes([e.turn_id for e in events])
    await reads_every_way(a, sid, events)
    assert await verify(a, stream=sid) == []


async def test_rows_keep_type_codes_and_name_a_turn_where_it_changes(
    pg: PostgresStore, pg_store_url: str
) -> None:
    """Rows keep a type's one-letter code, and name their turn only where it changes and once
    in every TURN_NAMED_EVERY rows, across commits of every size (VALUES lists and arrays):
    every read still gives each event its turn."""
    sid = f"ses_{uuid.uuid4().hex[:20]}"
    turns: list[str | None] = [None, None, "trn_a", "trn_a", None, "trn_b", "trn_b", "trn_b"]
    turns += ["trn_c"] * (TURN_NAMED_EVERY * 2 + 5) + ["trn_d", "trn_d", None]
    events = [turn_ev(sid, 1, None, "session.created")]
    events += [
        turn_ev(sid, seq, turn, "turn.started" if turn != turns[seq - 2] else "tool.step")
        for seq, turn in enumerate(turns[1:], start=2)
    ]
    await pg.create_session(sid, "support", events[:2], None)
    head, sizes = 2, [3, 1, 20, 2]
    while head < len(events):
        batch = events[head : head + sizes[head % len(sizes)]]
        await pg.commit(Commit(session_id=sid, expected_seq=head, events=batch))
        head += len(batch)
    await reads_every_way(pg, sid, events)
    rows = await rows_of(pg_store_url, sid)
    assert [code for _, code, _ in rows] == [stored_type(e.type) for e in events]
    assert all(len(code) == 1 for _, code, _ in rows)
    assert [turn for _, _, turn in rows] == named_where_it_changes(turns)
    named = [seq for seq, _, turn in rows if turn is not None]
    assert len(named) < len(rows) // 10
    assert all(b - a <= TURN_NAMED_EVERY for a, b in zip(named, named[1:], strict=False))
    # A store that has not seen the session reads where the turn was named, and goes on.
    other = PostgresStore(pg_store_url)
    try:
        more = [turn_ev(sid, head + 1, None), turn_ev(sid, head + 2, "trn_e", "turn.started")]
        await other.commit(Commit(session_id=sid, expected_seq=head, events=more))
        assert await other.read_events(sid, head - 1) == events[-1:] + more
    finally:
        await other.close()
    rows = await rows_of(pg_store_url, sid)
    assert [turn for _, _, turn in rows] == named_where_it_changes([*turns, None, "trn_e"])


async def test_two_stores_taking_turns_on_a_session_name_the_turns_right(
    two: tuple[PostgresStore, PostgresStore], pg_store_url: str
) -> None:
    """Two stores (two processes) commit to one session in turn, each from the state it last
    saw or a conflict answered, through turns that change at, within and across their commits
    and that run longer than TURN_NAMED_EVERY: the rows are those one store alone would write."""
    a, b = two
    sid = f"ses_{uuid.uuid4().hex[:20]}"
    turns: list[str | None] = [None]
    for i, length in enumerate([3, 1, 7, TURN_NAMED_EVERY + 9, 2, 2 * TURN_NAMED_EVERY + 1, 5]):
        turns += [f"trn_{i}" if i % 3 else None] * length
    events = [turn_ev(sid, seq, turn) for seq, turn in enumerate(turns, start=1)]
    await a.create_session(sid, "support", events[:1], None)
    head, stores, sizes = 1, [b, a, a, b, b, b, a], [1, 2, 3, 5, 4]
    for i in range(10_000):
        if head == len(events):
            break
        store = stores[i % len(stores)]
        batch = events[head : head + sizes[i % len(sizes)]]
        if i % 4 == 0 and head > 1:  # a stale head first: the answer is its next guess
            with pytest.raises(AppendConflict):
                await store.commit(Commit(session_id=sid, expected_seq=head - 1, events=batch))
        await store.commit(Commit(session_id=sid, expected_seq=head, events=batch))
        head += len(batch)
    rows = await rows_of(pg_store_url, sid)
    assert [turn for _, _, turn in rows] == named_where_it_changes(turns)
    await reads_every_way(a, sid, events)
    await reads_every_way(b, sid, events)
    assert await verify(a, stream=sid) == []


async def test_a_wrong_guess_of_the_turn_is_read_and_sent_again(
    pg: PostgresStore, pg_store_url: str
) -> None:
    """The turn at the head, or how far back it was named, guessed wrong (with the head and the
    audit chain right): the statement writes nothing, and the commit is sent again from the
    state read under the lock, so no row names the wrong turn nor leaves one unnamed too long."""
    sid = f"ses_{uuid.uuid4().hex[:20]}"
    turns: list[str | None] = [None] + ["trn_a"] * (TURN_NAMED_EVERY - 1)
    events = [turn_ev(sid, seq, turn) for seq, turn in enumerate(turns, start=1)]
    await pg.create_session(sid, "support", events, None)
    head = len(events)
    wrong = [
        ("trn_b", head, "trn_b"),  # a new turn guessed to be the one at the head
        ("trn_b", head + 1, "trn_a"),  # the same turn on, guessed to be another
        ("trn_b", head + 2, "trn_b"),  # named further back than guessed: due again now
    ]
    for turn, turn_seq, guessed in wrong:
        seen = pg._state[sid]
        assert seen.head == head
        pg._state[sid] = seen._replace(turn_seq=turn_seq, turn=guessed)
        event = turn_ev(sid, head + 1, turn)
        await pg.commit(Commit(session_id=sid, expected_seq=head, events=[event]))
        events.append(event)
        turns.append(turn)
        head += 1
    rows = await rows_of(pg_store_url, sid)
    assert [turn for _, _, turn in rows] == named_where_it_changes(turns)
    await reads_every_way(pg, sid, events)


async def test_rows_in_the_older_format_read_back_unchanged(
    pg: PostgresStore, pg_store_url: str
) -> None:
    """Rows as signoff wrote them before (a type's full name, a turn id on every row, '' for
    none) read back as they were, by type too; a session goes on from them in the new format."""
    sid = f"ses_{uuid.uuid4().hex[:20]}"
    kinds = [
        ("session.created", None),
        ("turn.started", "trn_a"),
        ("tool.started", "trn_a"),
        ("tool.completed", "trn_a"),
        ("session.waiting", None),
        ("turn.started", "trn_b"),
        ("model.completed", "trn_b"),
    ]
    old = [turn_ev(sid, seq, turn, kind) for seq, (kind, turn) in enumerate(kinds, start=1)]
    async with await psycopg.AsyncConnection.connect(pg_store_url, autocommit=True) as conn:
        cur = await conn.execute(
            "INSERT INTO signoff.sessions (id, agent, head, status, created_at, updated_at) "
            "VALUES (%s, 'support', %s, 'idle', %s, %s) RETURNING sk",
            (sid, len(old), T0, T0),
        )
        row = await cur.fetchone()
        assert row is not None
        for e in old:
            await conn.execute(
                "INSERT INTO signoff.events (sk, seq, type, turn, at, v, data) "
                "VALUES (%s,%s,%s,%s,%s,%s,%s)",
                (row[0], e.seq, e.type, e.turn_id or "", e.at, e.v, dumps(e.data).encode()),
            )
    await reads_every_way(pg, sid, old)
    more = [
        turn_ev(sid, 8, "trn_b", "tool.started"),
        turn_ev(sid, 9, "trn_c", "turn.started"),
        turn_ev(sid, 10, "trn_c", "turn.completed"),
    ]
    await pg.commit(Commit(session_id=sid, expected_seq=len(old), events=more[:1]))
    await pg.commit(Commit(session_id=sid, expected_seq=len(old) + 1, events=more[1:]))
    assert await rows_of(pg_store_url, sid) == [
        *((e.seq, e.type, e.turn_id or "") for e in old),
        (8, stored_type("tool.started"), None),
        (9, stored_type("turn.started"), "trn_c"),
        (10, stored_type("turn.completed"), None),
    ]
    await reads_every_way(pg, sid, old + more)
    started = await pg.read_events(sid, types=["turn.started"])
    assert [(e.seq, e.turn_id) for e in started] == [(2, "trn_a"), (6, "trn_b"), (9, "trn_c")]


async def test_audit_entries_recorded_at_once_from_many_processes_chain(
    pg_store_url: str,
) -> None:
    """Entries of no session (tool settings, sign-outs) are chained from heads read unlocked and
    checked under the streams' locks: processes recording on the same streams at once, in
    either order of the streams, each write every entry once, numbered without a gap, with ids
    without a gap, and the chains verify."""
    stores = [PostgresStore(pg_store_url) for _ in range(4)]
    for store in stores:
        await store.open()

    async def record(k: int, store: PostgresStore) -> None:
        for i in range(8):
            streams = ["tools:a.t", "tools:b.t"][:: 1 if k % 2 else -1]
            await store.record_audit(
                [
                    AuditRow(stream=stream, type="t", at=T0, seq=None, data={"k": k, "i": i})
                    for stream in streams
                ]
            )

    try:
        await asyncio.gather(*(record(k, store) for k, store in enumerate(stores)))
        every = await stores[0].audit()
        assert [e.id for e in every] == list(range(1, 65))
        for stream in ("tools:a.t", "tools:b.t"):
            entries = await stores[0].audit(stream=stream)
            assert [e.n for e in entries] == list(range(1, 33))
            written = sorted((e.data["k"], e.data["i"]) for e in entries)
            assert written == [(k, i) for k in range(4) for i in range(8)]
        assert await verify(stores[0]) == []
    finally:
        for store in stores:
            await store.close()


async def test_audit_entries_chained_by_the_statement_verify(pg: PostgresStore) -> None:
    """The statement recording entries of no session hashes them itself, from the heads it
    reads under the streams' locks: text of any script, nested and unordered keys and precise
    times hash as `chain_hash` does, and an entry expecting its stream elsewhere (`after`) is
    skipped mid-batch while the others chain on, each stream on its own."""
    data = {"z": [1, {"b": 2.5, "a": 'é ü 中 \u2028 "q" \\\\'}], "a": None, "n": 3}

    def row(stream: str, after: int | None, k: int) -> AuditRow:
        return AuditRow(
            stream=stream, type="t", at=T0 + k / 7, seq=None, data={**data, "k": k}, after=after
        )

    await pg.record_audit([row("tools:b.t", None, 0)])
    await pg.record_audit(
        [
            row("tools:a.t", 0, 1),
            row("tools:b.t", 1, 2),
            row("tools:a.t", 0, 3),  # skipped: the stream is at 1 by now
            row("tools:a.t", 1, 4),
            row("tools:b.t", 5, 5),  # skipped
            row("tools:b.t", None, 6),
        ]
    )
    found = [
        (e.stream, e.n, e.data["k"], e.data == {**data, "k": e.data["k"]}) for e in await pg.audit()
    ]
    assert found == [
        ("tools:b.t", 1, 0, True),
        ("tools:a.t", 1, 1, True),
        ("tools:b.t", 2, 2, True),
        ("tools:a.t", 2, 4, True),
        ("tools:b.t", 3, 6, True),
    ]
    assert [e.at for e in await pg.audit(stream="tools:a.t")] == [T0 + 1 / 7, T0 + 4 / 7]
    assert await verify(pg) == []
