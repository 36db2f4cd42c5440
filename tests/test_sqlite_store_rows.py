"""How the SQLite store keeps rows small: turn ids named once, a request's repeated call stored
once, audit streams read by primary key.
"""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path
from typing import Any

import signoff as so
from signoff._audit_trail import entries as trail_entries
from signoff.stores import Commit, SQLiteStore
from signoff.stores import sqlite as sqlite_store
from signoff.stores._audit import AUDIT_TYPES, AuditRow
from signoff.stores._codec import needs_previous, stored_type
from signoff.testing import call, call_tools, reply, scripted_agent

from ._sqlite_store import new_session, store

__all__ = ["store"]  # the fixture, used by name


# -- how an event row keeps its turn --------------------------------------------------------------


def turn_event(sid: str, seq: int, turn: str | None, type: Any = "tool.step") -> so.Event:
    return so.Event(session_id=sid, seq=seq, type=type, at=float(seq), turn_id=turn, data={})


async def test_turn_ids_read_back_exactly_though_rows_name_them_once(store: SQLiteStore) -> None:
    await new_session(store, "s1")
    turns = [None, "trn_a", "trn_a", None, "trn_b", "trn_b", "trn_b"]
    turns += ["trn_c"] * (sqlite_store.TURN_NAMED_EVERY * 2 + 5) + ["trn_d"]
    seq = 1
    for i in range(0, len(turns), 3):  # three events per commit, turns run across commits
        batch = [
            turn_event("s1", seq + 1 + j, t, "turn.started" if j == 0 else "tool.step")
            for j, t in enumerate(turns[i : i + 3])
        ]
        await store.commit(Commit(session_id="s1", expected_seq=seq, events=batch))
        seq += len(batch)
    events = await store.read_events("s1")
    assert [e.turn_id for e in events[1:]] == turns
    # every window, every type filter, every starting point agrees with the whole read
    by_seq = {e.seq: e.turn_id for e in events}
    for after in (0, 3, 5, 70, seq - 2):
        assert [(e.seq, e.turn_id) for e in await store.read_events("s1", after)] == [
            (s, t) for s, t in by_seq.items() if s > after
        ]
    for newest in (1, 2, 65, 200):
        window = await store.read_events("s1", newest=newest)
        assert [(e.seq, e.turn_id) for e in window] == list(by_seq.items())[-newest:]
    started = await store.read_events("s1", types=["turn.started"])
    assert all(e.type == "turn.started" and e.turn_id == by_seq[e.seq] for e in started)
    assert len(started) == (len(turns) + 2) // 3
    # rows name a turn where it changes, and again at least every TURN_NAMED_EVERY rows
    named = [
        s
        for (s,) in store.conn.execute(
            "SELECT seq FROM events WHERE sk = (SELECT sk FROM sessions WHERE id='s1') "
            "AND turn IS NOT NULL ORDER BY seq"
        )
    ]
    assert len(named) < len(turns) // 10
    assert all(
        b - a <= sqlite_store.TURN_NAMED_EVERY for a, b in zip(named, named[1:], strict=False)
    )


async def test_a_commit_names_turns_from_what_this_store_wrote_without_reading_them(
    tmp_path: Path,
) -> None:
    """The turn at the head is remembered from the store's own last commit, not read back;
    commits that alternate between two stores on one file (each reading it) name the same
    rows as those of one store."""
    turns = ["trn_a", "trn_a", None, "trn_b"] + ["trn_c"] * (sqlite_store.TURN_NAMED_EVERY + 7)
    one = SQLiteStore(f"sqlite:///{tmp_path / 'one.db'}")
    first = SQLiteStore(f"sqlite:///{tmp_path / 'two.db'}")
    second = SQLiteStore(f"sqlite:///{tmp_path / 'two.db'}")
    for s in (one, first, second):
        await s.open()
    reads: list[str] = []
    one.conn.set_trace_callback(
        lambda sql: reads.append(sql) if "turn IS NOT NULL" in sql else None
    )
    try:
        for s in (one, first):
            await new_session(s, "s1")
        seq = 1
        for i in range(0, len(turns), 2):
            batch = [turn_event("s1", seq + 1 + j, t) for j, t in enumerate(turns[i : i + 2])]
            await one.commit(Commit(session_id="s1", expected_seq=seq, events=batch))
            other = first if i % 4 == 0 else second
            await other.commit(Commit(session_id="s1", expected_seq=seq, events=batch))
            seq += len(batch)
        assert reads == []
        rows = "SELECT seq, turn FROM events ORDER BY seq"
        assert one.conn.execute(rows).fetchall() == first.conn.execute(rows).fetchall()
        assert [e.turn_id for e in (await one.read_events("s1"))[1:]] == turns
    finally:
        for s in (one, first, second):
            await s.close()


async def test_a_request_repeating_the_proposed_call_is_stored_once(tmp_path: Path) -> None:
    """The approval request repeats the tool input the model proposed one event earlier: its
    row keeps only what is new. An audited event is never what another is stored on."""
    rnd = random.Random(7)
    words = "dear customer your parcel refund order arrived late sorry we will send".split()
    big = {"text": " ".join(rnd.choice(words) + str(rnd.randrange(99)) for _ in range(600))}

    @so.tool(approval=so.always())
    async def send(text: str) -> str:
        """Send a letter."""
        return "sent"

    agent = scripted_agent("a", [call_tools(call("send", **big)), reply("Sent.")], tools=[send])
    db = tmp_path / "s.db"
    async with so.Runtime([agent], store=f"sqlite:///{db}") as rt:
        r = await rt.generate("a", prompt="write to them")
        await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=r.pending[0].id, approved=True)]
        )
        events = [e async for e in rt.events(r.session_id, follow=False)]
        assert await rt.verify_audit() == []
    with sqlite3.connect(db) as conn:
        rows = {
            seq: (code, data)
            for seq, code, data in conn.execute("SELECT seq, type, data FROM events ORDER BY seq")
        }
    by_type = {e.type: e.seq for e in events}
    proposed, requested = (
        rows[by_type["input.requested"] - 1][1],
        rows[by_type["input.requested"]][1],
    )
    assert needs_previous(requested) and len(requested) < len(proposed) / 4
    audited = {stored_type(t) for t in AUDIT_TYPES}
    for seq, (_, data) in rows.items():
        if seq - 1 in rows and rows[seq - 1][0] in audited:
            assert not needs_previous(data), f"event {seq} is stored on an audited event"


async def test_the_audit_streams_of_no_session_are_read_by_primary_key(tmp_path: Path) -> None:
    """Verification reads the entries of no session (tool settings) window by window: each
    statement searches the trail by its ids and the sessions by their keys, none scans a table."""
    store = SQLiteStore(f"sqlite:///{tmp_path}/a.db")
    await store.open()
    try:
        row = AuditRow(stream="tools:a.t", type="tool.approval_changed", at=1.0, seq=None, data={})
        await store.record_audit([row])
        statements: list[str] = []
        store.conn.set_trace_callback(statements.append)
        found = [e async for e in trail_entries(store, others=True)]
        store.conn.set_trace_callback(None)
        assert [(e.stream, e.n) for e in found] == [("tools:a.t", 1)]
        reads = [s for s in statements if s.startswith("SELECT") and " audit " in s]
        assert len(reads) == 3  # the window, its entries, then no window left
        plans = [[d for *_, d in store.conn.execute("EXPLAIN QUERY PLAN " + s)] for s in reads]
        assert not [d for plan in plans for d in plan if d.startswith("SCAN")], plans
        assert "SEARCH a USING INTEGER PRIMARY KEY (rowid>? AND rowid<?)" in plans[1]
        assert "SEARCH s USING INTEGER PRIMARY KEY (rowid=?) LEFT-JOIN" in plans[1]
    finally:
        await store.close()
