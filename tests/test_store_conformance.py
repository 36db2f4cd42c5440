"""One suite for the `Store` protocol, run against every backend (SQLite and PostgreSQL):
sessions and events, snapshots, schema versions and bounded reads; the stand-in events and
requests the rest of the suite shares.

Nothing here knows which store it talks to: the `store` and `store_url` fixtures in conftest.py
are parametrized over both. The rest of the suite is in
test_store_{requests,leases,concurrency,runtime,edited_rows}.py.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff._events import SCHEMA_VERSION, Event
from signoff._exceptions import (
    AppendConflict,
    SchemaVersionError,
    StoreError,
    UnknownSession,
)
from signoff._types import Action, InputRequest, input_hash
from signoff.stores import Commit, PendingFilter, Resolve, SQLiteStore, Store
from signoff.stores._audit import AuditRow
from signoff.stores._codec import needs_previous
from signoff.stores.postgres import PostgresStore

from ._procs import query
from .conftest import make_store

T0 = 1_700_000_000.0


def ev(sid: str, seq: int, type_: Any = "turn.started", **data: Any) -> Event:
    return Event(session_id=sid, seq=seq, type=type_, at=T0 + seq, turn_id="trn_1", data=data)


def approval(
    sid: str, rid: str, *, agent: str = "support", tool: str = "issue_refund", at: float = T0
) -> InputRequest:
    payload = {"order_id": "1042", "amount": 180.0}
    return InputRequest(
        kind="tool-approval",
        id=rid,
        session_id=sid,
        turn_id="trn_1",
        agent=agent,
        action=Action(
            call_id=f"call_{rid}", tool_name=tool, input=payload, input_hash=input_hash(payload)
        ),
        created_at=at,
    )


def question(sid: str, rid: str, *, agent: str = "support", at: float = T0) -> InputRequest:
    return InputRequest(
        kind="question",
        id=rid,
        session_id=sid,
        turn_id="trn_1",
        agent=agent,
        question="Which color?",
        allow_text=True,
        created_at=at,
    )


async def new_session(store: Store, agent: str = "support") -> str:
    sid = f"ses_{uuid.uuid4().hex[:20]}"
    created = Event(session_id=sid, seq=1, type="session.created", at=T0, data={"agent": agent})
    await store.create_session(sid, agent, [created], None)
    return sid


def settle(rid: str, outcome: str = "approved") -> Resolve:
    return Resolve(
        request_id=rid, status="settled", outcome=outcome, resolution={"outcome": outcome}
    )


# -- sessions and events ---------------------------------------------------------------------


async def test_create_load_read_head(store: Store) -> None:
    sid = await new_session(store)
    assert await store.head(sid) == 1
    loaded = await store.load(sid)
    assert loaded is not None
    assert (loaded.session_id, loaded.agent, loaded.snapshot) == (sid, "support", None)
    assert [(e.seq, e.type, e.data) for e in loaded.events] == [
        (1, "session.created", {"agent": "support"})
    ]
    events = [ev(sid, 2, message="héllo ✓", nested={"b": [1, 2.5, None], "a": True})]
    events.append(ev(sid, 3, "model.completed", text="hi"))
    events.append(ev(sid, 4, "turn.completed"))
    await store.commit(Commit(session_id=sid, expected_seq=1, events=events))
    assert await store.head(sid) == 4
    got = await store.read_events(sid)
    assert [e.seq for e in got] == [1, 2, 3, 4]
    assert got[1] == events[0]  # every field round-trips exactly, data key order included
    assert list(got[1].data["nested"]) == ["b", "a"]
    assert [e.seq for e in await store.read_events(sid, after=2)] == [3, 4]
    assert [e.seq for e in await store.read_events(sid, after=1, limit=2)] == [2, 3]
    assert [e.seq for e in await store.read_events(sid, types=["model.completed"])] == [3]
    assert await store.read_events(sid, after=4) == []
    # the newest N, oldest first, with every field (the turn of a row that leaves it out too)
    assert await store.read_events(sid, newest=2) == got[2:]
    assert await store.read_events(sid, newest=9) == got
    newest = await store.read_events(sid, types=["turn.started", "turn.completed"], newest=1)
    assert newest == [got[3]]


async def test_a_read_bounded_by_bytes_holds_no_more_than_that(store: Store) -> None:
    """`max_bytes` stops a read after the event that brings it to that size (at least one
    event), so a stream of large events never holds a whole batch of them; the rest is read
    from where it stopped, in order, none lost."""
    sid = await new_session(store)
    blobs = [uuid.uuid4().hex * 3_000 for _ in range(10)]  # about 96 KB each, packs to ~half
    events = [ev(sid, seq, "tool.completed", result=b) for seq, b in enumerate(blobs, start=2)]
    events.append(ev(sid, 12, "turn.completed"))
    await store.commit(Commit(session_id=sid, expected_seq=1, events=events))
    first = await store.read_events(sid, limit=500, max_bytes=250_000)
    assert [e.seq for e in first] == [1, 2, 3, 4]  # ~288 KB of JSON: the fourth crossed
    assert [e.data["result"] for e in first[1:]] == blobs[:3]
    assert [e.seq for e in await store.read_events(sid, after=1, max_bytes=1)] == [2]
    seqs: list[int] = []
    after = 0
    while batch := await store.read_events(sid, after=after, limit=3, max_bytes=150_000):
        assert sum(len(str(e.data)) for e in batch[:-1]) < 150_000  # the last one crossed
        seqs.extend(e.seq for e in batch)
        after = batch[-1].seq
    assert seqs == list(range(1, 13))
    small = await store.read_events(sid, after=11, limit=500, max_bytes=250_000)
    assert [e.seq for e in small] == [12]
    got = await store.read_events(sid)
    assert [e.turn_id for e in got] == [
        e.turn_id for e in await store.read_events(sid, max_bytes=1 << 30)
    ]


async def test_unknown_session(store: Store) -> None:
    assert await store.head("ses_nope") is None
    assert await store.load("ses_nope") is None
    with pytest.raises(UnknownSession):
        await store.read_events("ses_nope")
    with pytest.raises(UnknownSession):
        await store.commit(Commit(session_id="ses_nope", expected_seq=1, events=[]))
    with pytest.raises(UnknownSession):
        await store.acquire_lease("ses_nope", "w1", 10, T0)


async def test_ids_and_filters_with_a_nul_name_nothing(store: Store) -> None:
    """No id signoff makes holds a NUL, and PostgreSQL cannot store one: such an id is unknown
    and such a filter matches nothing, on every store, rather than a driver error."""
    sid = await new_session(store)
    await store.commit(
        Commit(session_id=sid, expected_seq=1, events=[], new_requests=[approval(sid, "req_1")])
    )
    bad, bad_rid = sid + "\x00", "req_1\x00"
    assert await store.head(bad) is None
    assert await store.load(bad) is None
    assert await store.get_request(bad_rid) is None
    with pytest.raises(UnknownSession):
        await store.read_events(bad)
    with pytest.raises(UnknownSession):
        await store.commit(Commit(session_id=bad, expected_seq=1, events=[]))
    with pytest.raises(UnknownSession):
        await store.acquire_lease(bad, "w1", 10, T0)
    for field in ("session_id", "agent", "tool_name", "kind", "status"):
        given: dict[str, Any] = {field: "x\x00"}
        flt = PendingFilter(**given)
        assert await store.pending(flt) == [], field
        assert await store.count_pending(flt) == 0, field
    assert await store.sessions(agent="support\x00") == []
    assert await store.sessions(status="idle\x00") == []
    assert await store.count_sessions(agent="support\x00") == 0
    assert await store.count_sessions(status="idle\x00") == 0
    assert await store.audit(stream=bad) == []
    assert await store.audit_heads(stream=bad) == {}
    assert await store.audit_sessions(after=bad) == {}
    assert await store.audit(sessions=[bad]) == []
    assert await store.stored_requests(sessions=[bad]) == []
    assert [r.id for r in await store.stored_requests(sessions=[bad, sid])] == ["req_1"]
    assert [r.id for r in await store.pending(PendingFilter())] == ["req_1"]


async def test_duplicate_session_is_refused(store: Store) -> None:
    sid = await new_session(store)
    created = Event(session_id=sid, seq=1, type="session.created", at=T0, data={})
    with pytest.raises(StoreError, match="already exists"):
        await store.create_session(sid, "other", [created], None)
    loaded = await store.load(sid)
    assert loaded is not None and loaded.agent == "support"


async def test_commit_at_stale_seq_conflicts_and_writes_nothing(store: Store) -> None:
    sid = await new_session(store)
    await store.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)]))
    stale = Commit(
        session_id=sid,
        expected_seq=1,
        events=[ev(sid, 2, "model.completed")],
        new_requests=[approval(sid, "req_stale")],
        snapshot={"seq": 2, "stale": True},
    )
    with pytest.raises(AppendConflict):
        await store.commit(stale)
    assert await store.head(sid) == 2
    assert [e.type for e in await store.read_events(sid)] == ["session.created", "turn.started"]
    assert await store.get_request("req_stale") is None
    loaded = await store.load(sid)
    assert loaded is not None and loaded.snapshot is None


async def test_commit_ahead_of_head_conflicts(store: Store) -> None:
    sid = await new_session(store)
    with pytest.raises(AppendConflict):
        await store.commit(Commit(session_id=sid, expected_seq=5, events=[ev(sid, 6)]))
    assert await store.head(sid) == 1


async def test_session_status_is_kept(store: Store) -> None:
    sid = await new_session(store)
    await store.commit(
        Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)], status="running")
    )
    await store.commit(Commit(session_id=sid, expected_seq=2, events=[ev(sid, 3)]))
    assert await store.head(sid) == 3


async def test_sessions_are_counted_as_they_are_listed(store: Store) -> None:
    """`count_sessions` counts what `sessions` lists without a limit, under the same filters
    (the HTTP listing's total)."""
    support = [await new_session(store) for _ in range(3)]
    await new_session(store, "batch")
    await store.commit(
        Commit(session_id=support[0], expected_seq=1, events=[ev(support[0], 2)], status="waiting")
    )
    for agent in (None, "support", "batch", "nobody"):
        for status in (None, "idle", "waiting", "failed"):
            listed = await store.sessions(agent=agent, status=status, limit=1000)
            assert await store.count_sessions(agent=agent, status=status) == len(listed), (
                agent,
                status,
            )
    assert await store.count_sessions() == 4
    assert await store.count_sessions(agent="support", status="idle") == 2
    assert await store.count_sessions(status="waiting") == 1


# -- snapshots -------------------------------------------------------------------------------


async def test_snapshot_is_upserted_with_its_commit(store: Store) -> None:
    sid = await new_session(store)
    await store.commit(
        Commit(
            session_id=sid,
            expected_seq=1,
            events=[ev(sid, 2), ev(sid, 3)],
            snapshot={"v": SCHEMA_VERSION, "seq": 3, "z": 1, "a": [1, {"x": None}]},
        )
    )
    await store.commit(Commit(session_id=sid, expected_seq=3, events=[ev(sid, 4), ev(sid, 5)]))
    loaded = await store.load(sid)
    assert loaded is not None
    assert loaded.snapshot == {"v": SCHEMA_VERSION, "seq": 3, "z": 1, "a": [1, {"x": None}]}
    assert [e.seq for e in loaded.events] == [4, 5]  # only the tail after the snapshot
    await store.commit(
        Commit(session_id=sid, expected_seq=5, events=[ev(sid, 6)], snapshot={"seq": 6})
    )
    loaded = await store.load(sid)
    assert loaded is not None and loaded.snapshot == {"seq": 6} and loaded.events == []


# -- schema versions -------------------------------------------------------------------------


async def test_event_from_a_newer_schema_is_refused(store: Store) -> None:
    sid = await new_session(store)
    newer = Event(
        session_id=sid, seq=2, type="turn.started", at=T0, data={"x": 1}, v=SCHEMA_VERSION + 1
    )
    await store.commit(Commit(session_id=sid, expected_seq=1, events=[newer]))
    with pytest.raises(SchemaVersionError, match="schema version"):
        await store.read_events(sid)
    with pytest.raises(SchemaVersionError):
        await store.load(sid)
    assert [e.seq for e in await store.read_events(sid, limit=1)] == [1]  # older ones still read


async def test_events_repeating_the_ones_before_read_back_from_anywhere(store_url: str) -> None:
    """A request repeating the tool call the model just proposed may be stored on it; every
    read (from any point, by type, the queue, the audit trail) still sees exactly what was
    written, also when two stores take turns writing the session."""
    sid = f"s_{uuid.uuid4().hex[:8]}"
    big = {"path": "notes.txt", "text": " ".join(f"line {i} of the notes" for i in range(300))}
    req = InputRequest(
        kind="tool-approval",
        id=f"req_{sid}",
        session_id=sid,
        turn_id="trn_1",
        agent="support",
        action=Action(call_id="call_1", tool_name="write", input=big, input_hash=input_hash(big)),
        created_at=T0,
    )
    proposed = {"text": "", "tool_calls": [{"id": "call_1", "name": "write", "input": big}]}
    batches: list[list[tuple[str, dict[str, Any]]]] = [
        [("turn.started", {"message": "write the notes"}), ("model.completed", proposed)],
        [("input.requested", {"requests": [req.model_dump(mode="json", exclude_defaults=True)]})],
        [("turn.waiting", {"on": "input", "request_ids": [req.id]})],
        [("model.completed", proposed), ("model.completed", proposed | {"text": "again"})],
        [("model.completed", proposed | {"text": "and again"}), ("turn.completed", {})],
    ]
    stores = [make_store(store_url), make_store(store_url)]
    for s in stores:
        await s.open()
    try:
        await stores[0].create_session(sid, "support", [ev(sid, 1, "session.created")], None)
        seq = 1
        written: list[tuple[int, str, dict[str, Any]]] = [(1, "session.created", {})]
        for i, batch in enumerate(batches):
            events = [ev(sid, seq + 1 + j, type_, **data) for j, (type_, data) in enumerate(batch)]
            await stores[0 if i < 2 else i % 2].commit(
                Commit(
                    session_id=sid,
                    expected_seq=seq,
                    events=events,
                    new_requests=[req] if i == 1 else [],
                )
            )
            written += [(e.seq, e.type, e.data) for e in events]
            seq += len(events)
        # what repeats the event before it is stored on it: the request, and the second
        # proposal of one commit
        stored = dict(
            query(
                store_url,
                "SELECT e.seq, e.data FROM {t}events e JOIN {t}sessions s ON s.sk = e.sk "
                "WHERE s.id = {p}",
                sid,
            )
        )
        assert needs_previous(stored[3]) is False and needs_previous(stored[4])
        assert needs_previous(stored[7]) and len(stored[7]) < len(stored[6]) / 4
        for s in stores:
            for after in range(seq):
                got = await s.read_events(sid, after)
                assert [(e.seq, e.type, e.data) for e in got] == written[after:]
            for newest in range(1, seq + 1):
                got = await s.read_events(sid, newest=newest)
                assert [(e.seq, e.type, e.data) for e in got] == written[-newest:]
            asked = await s.read_events(sid, types=["input.requested"])
            assert [e.data for e in asked] == [written[3][2]]
            kept = await s.get_request(req.id)
            assert kept is not None and kept.request.action is not None
            assert kept.request.action.input == big
            queue = await s.pending(PendingFilter(session_id=sid))
            assert [q.action.input for q in queue if q.action] == [big]
            trail = await s.audit(stream=sid)
            assert [(a.seq, a.data) for a in trail] == [
                (n, data) for n, type_, data in written if type_ == "input.requested"
            ]
    finally:
        for s in stores:
            await s.close()


async def test_what_a_store_remembers_of_sessions_stays_bounded(store: Store) -> None:
    """A store serving for weeks must not remember something of every session it touched: past
    its bound (`keep`, lowered here) it forgets, and reads what it needs again."""
    # The row keys of sessions, and (PostgreSQL) the state a commit guesses from.
    kept: list[Any] = [getattr(store, name) for name in ("_sk", "_state") if hasattr(store, name)]
    for memory in kept:
        memory.keep = 8
    sids = [await new_session(store) for _ in range(30)]
    for sid in sids:
        loaded = await store.load(sid)
        assert loaded is not None and loaded.agent == "support"
        token = await store.acquire_lease(sid, "w", 30.0, T0)
        assert token is not None
        await store.release_lease(sid, "w", token)
        assert await store.head(sid) == 1
    for sid in sids:  # what was forgotten is read again
        await store.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)]))
        assert await store.head(sid) == 2
    assert [len(memory) <= 8 for memory in kept] == [True] * len(kept)


async def test_audit_windows_bound_a_read_by_id(store: Store) -> None:
    """`audit_window` names the id a window of `limit` entries ends at (the last entry's if
    fewer follow, None past the end), and `audit(upto_id=...)` reads up to it and no further,
    in any scope."""
    sid = await new_session(store)
    await store.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2, "tool.started")]))
    rows = [
        AuditRow(stream="tools:a.t", type="tool.approval_changed", at=T0, seq=None, data={"k": k})
        for k in range(3)
    ]
    await store.record_audit(rows)
    ids = [e.id for e in await store.audit()]
    assert len(ids) == 4 and ids == sorted(ids)
    assert await store.audit_window(limit=2) == ids[1]
    assert await store.audit_window(after_id=ids[1], limit=10) == ids[3]
    assert await store.audit_window(after_id=ids[3]) is None
    upto = [e.id for e in await store.audit(after_id=ids[0], upto_id=ids[2])]
    assert upto == ids[1:3]
    others = await store.audit(others=True, upto_id=ids[2])
    assert [(e.stream, e.n) for e in others] == [("tools:a.t", 1), ("tools:a.t", 2)]
    assert [e.n for e in await store.audit(stream=sid, upto_id=ids[0])] == [1]


@pytest.mark.parametrize("migrate", ["no", "false", 0, None])
def test_a_migrate_flag_that_is_not_a_bool_is_refused_and_nothing_is_touched(
    store_url: str, migrate: Any
) -> None:
    """`migrate="no"` (read from an environment variable, say) was true: the store it was to
    keep from upgrading was upgraded, or a missing one created."""
    kind = SQLiteStore if store_url.startswith("sqlite") else PostgresStore
    with pytest.raises(so.UsageError, match=f"^migrate must be True or False, not {migrate!r}$"):
        kind(store_url, migrate=migrate)
    if kind is SQLiteStore:  # a PostgreSQL store connects only when opened
        assert not Path(store_url.removeprefix("sqlite:///")).exists()
