"""The event rows the PostgreSQL commit writes: type codes, a turn id only where it changes, from
whichever store wrote the rows before, and rows in the older format read back unchanged.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from signoff._audit_trail import verify
from signoff._events import Event, dumps
from signoff._exceptions import (
    AppendConflict,
)
from signoff.stores import Commit
from signoff.stores._codec import stored_type
from signoff.stores.postgres import PostgresStore
from signoff.stores.postgres._sql import TURN_NAMED_EVERY

from ._pg_events import T0
from ._postgres_commit import two

__all__ = ["two"]  # the fixture, used by name


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
        assert sent == ["WITH"], look
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
