"""One suite for the `Store` protocol, run against every backend (SQLite and PostgreSQL).

Nothing here knows which store it talks to: the `store` and `store_url` fixtures in conftest.py
are parametrized over both.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff._events import SCHEMA_VERSION, Event
from signoff._exceptions import (
    AppendConflict,
    LeaseLost,
    RequestClosed,
    SchemaVersionError,
    StoreError,
    UnknownSession,
)
from signoff._types import Action, InputRequest, input_hash
from signoff.stores import Commit, PendingFilter, Resolve, SQLiteStore, Store
from signoff.stores._audit import AuditRow
from signoff.stores._codec import needs_previous, pack_bytes
from signoff.stores.postgres import PostgresStore
from signoff.testing import call, call_tools, reply, scripted_agent

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


# -- requests --------------------------------------------------------------------------------


async def test_new_request_then_resolve(store: Store) -> None:
    sid = await new_session(store)
    req = approval(sid, "req_a")
    await store.commit(
        Commit(
            session_id=sid,
            expected_seq=1,
            events=[ev(sid, 2, "input.requested", request_ids=["req_a"])],
            new_requests=[req],
        )
    )
    stored = await store.get_request("req_a")
    assert stored is not None
    assert (stored.status, stored.outcome, stored.resolution) == ("pending", None, None)
    assert stored.request == req
    assert stored.request.session_id == sid and stored.request.tool_name == "issue_refund"
    await store.commit(
        Commit(
            session_id=sid,
            expected_seq=2,
            events=[ev(sid, 3, "approval.settled"), ev(sid, 4, "input.resolved")],
            resolve=[
                Resolve(
                    request_id="req_a",
                    status="settled",
                    outcome="approved",
                    resolution={"outcome": "approved", "by": {"principal_id": "bob"}},
                )
            ],
            durable=True,
        )
    )
    stored = await store.get_request("req_a")
    assert stored is not None
    assert stored.status == "settled" and stored.request.status == "settled"
    assert stored.outcome == "approved"
    assert stored.resolution == {"outcome": "approved", "by": {"principal_id": "bob"}}
    assert await store.get_request("req_missing") is None


async def test_updated_requests_replace_the_stored_data(store: Store) -> None:
    sid = await new_session(store)
    req = approval(sid, "req_a")
    await store.commit(
        Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)], new_requests=[req])
    )
    changed = req.model_copy(update={"question": "Refund 180?", "expires_at": T0 + 60})
    await store.commit(
        Commit(session_id=sid, expected_seq=2, events=[ev(sid, 3)], updated_requests=[changed])
    )
    stored = await store.get_request("req_a")
    assert stored is not None and stored.request == changed and stored.status == "pending"
    assert await store.pending(PendingFilter(session_id=sid)) == [changed]
    # An update in a commit that fails is not applied either.
    again = changed.model_copy(update={"question": "never stored"})
    with pytest.raises(AppendConflict):
        await store.commit(
            Commit(session_id=sid, expected_seq=2, events=[ev(sid, 3)], updated_requests=[again])
        )
    stored = await store.get_request("req_a")
    assert stored is not None and stored.request.question == "Refund 180?"


async def test_resolve_of_a_closed_request_rolls_back_everything(store: Store) -> None:
    sid = await new_session(store)
    await store.commit(
        Commit(
            session_id=sid,
            expected_seq=1,
            events=[ev(sid, 2, "input.requested")],
            new_requests=[approval(sid, "req_a"), approval(sid, "req_b")],
        )
    )
    await store.commit(
        Commit(
            session_id=sid,
            expected_seq=2,
            events=[ev(sid, 3, "input.resolved")],
            resolve=[settle("req_a")],
        )
    )
    # req_b is still pending, req_a is not: the whole commit must fail and write nothing.
    with pytest.raises(RequestClosed) as info:
        await store.commit(
            Commit(
                session_id=sid,
                expected_seq=3,
                events=[ev(sid, 4, "input.resolved"), ev(sid, 5, "input.resolved")],
                resolve=[settle("req_b", "cancelled"), settle("req_a", "cancelled")],
                new_requests=[question(sid, "req_c")],
                snapshot={"seq": 5},
            )
        )
    assert info.value.request_ids == ["req_a"]
    assert await store.head(sid) == 3
    b = await store.get_request("req_b")
    assert b is not None and b.status == "pending" and b.outcome is None
    a = await store.get_request("req_a")
    assert a is not None and a.outcome == "approved"
    assert await store.get_request("req_c") is None
    loaded = await store.load(sid)
    assert loaded is not None and loaded.snapshot is None and len(loaded.events) == 3


async def test_resolve_of_another_sessions_request_is_refused(store: Store) -> None:
    s1 = await new_session(store)
    s2 = await new_session(store)
    await store.commit(
        Commit(session_id=s1, expected_seq=1, events=[ev(s1, 2)], new_requests=[approval(s1, "r1")])
    )
    with pytest.raises(RequestClosed):
        await store.commit(
            Commit(session_id=s2, expected_seq=1, events=[ev(s2, 2)], resolve=[settle("r1")])
        )
    r1 = await store.get_request("r1")
    assert r1 is not None and r1.status == "pending"
    assert await store.head(s2) == 1


async def test_duplicate_request_id_conflicts_and_writes_nothing(store: Store) -> None:
    sid = await new_session(store)
    await store.commit(
        Commit(
            session_id=sid, expected_seq=1, events=[ev(sid, 2)], new_requests=[approval(sid, "r")]
        )
    )
    with pytest.raises(StoreError):
        await store.commit(
            Commit(
                session_id=sid,
                expected_seq=2,
                events=[ev(sid, 3)],
                new_requests=[approval(sid, "r")],
            )
        )
    assert await store.head(sid) == 2


async def test_pending_filters_and_count(store: Store) -> None:
    s1 = await new_session(store, "support")
    s2 = await new_session(store, "billing")
    await store.commit(
        Commit(
            session_id=s1,
            expected_seq=1,
            events=[ev(s1, 2, "input.requested")],
            new_requests=[
                approval(s1, "req_1", at=T0 + 1),
                question(s1, "req_2", at=T0 + 2),
                approval(s1, "req_3", tool="delete_account", at=T0 + 3),
            ],
        )
    )
    await store.commit(
        Commit(
            session_id=s2,
            expected_seq=1,
            events=[ev(s2, 2, "input.requested")],
            new_requests=[approval(s2, "req_4", agent="billing", at=T0 + 4)],
        )
    )
    await store.commit(
        Commit(
            session_id=s1,
            expected_seq=2,
            events=[ev(s1, 3, "input.resolved")],
            resolve=[settle("req_3", "cancelled")],
        )
    )

    async def ids(**kw: Any) -> list[str]:
        flt = PendingFilter(**kw)
        found = [r.id for r in await store.pending(flt)]
        if "limit" not in kw and "offset" not in kw:
            assert await store.count_pending(flt) == len(found)
        return found

    assert await ids() == ["req_1", "req_2", "req_4"]
    assert await ids(agent="billing") == ["req_4"]
    assert await ids(session_id=s1) == ["req_1", "req_2"]
    assert await ids(kind="question") == ["req_2"]
    assert await ids(tool_name="issue_refund") == ["req_1", "req_4"]
    assert await ids(tool_name="delete_account") == []
    assert await ids(status="settled") == ["req_3"]
    assert await ids(status=None) == ["req_1", "req_2", "req_3", "req_4"]
    assert await ids(created_before=T0 + 2) == ["req_1"]
    assert await ids(created_after=T0 + 1) == ["req_2", "req_4"]
    assert await ids(limit=2) == ["req_1", "req_2"]
    assert await ids(limit=2, offset=2) == ["req_4"]
    assert await store.count_pending(PendingFilter(limit=1)) == 3
    listed = await store.pending(PendingFilter(session_id=s1))
    assert all(r.status == "pending" for r in listed)
    settled = await store.pending(PendingFilter(status="settled"))
    assert settled[0].status == "settled"


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


# -- leases ----------------------------------------------------------------------------------


async def test_leases_and_fencing(store: Store) -> None:
    sid = await new_session(store)
    t1 = await store.acquire_lease(sid, "w1", 10, T0)
    assert t1 is not None
    assert await store.acquire_lease(sid, "w2", 10, T0 + 5) is None  # held
    assert await store.renew_lease(sid, "w1", t1, 10, T0 + 9)
    assert await store.acquire_lease(sid, "w2", 10, T0 + 15) is None  # renewed until T0+19
    assert await store.acquire_lease(sid, "w2", 10, T0 + 18.5) is None  # held to its end
    assert not await store.renew_lease(sid, "w2", t1, 10, T0 + 15)  # not the owner
    assert not await store.renew_lease(sid, "w1", t1 + 1, 10, T0 + 15)  # not the token
    # A lease commit goes through; then the lease expires and w2 takes over with a new token.
    await store.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)], lease_token=t1))
    t2 = await store.acquire_lease(sid, "w2", 10, T0 + 20)
    assert t2 is not None and t2 > t1
    with pytest.raises(LeaseLost):
        await store.commit(
            Commit(session_id=sid, expected_seq=2, events=[ev(sid, 3)], lease_token=t1)
        )
    assert await store.head(sid) == 2
    assert not await store.renew_lease(sid, "w1", t1, 10, T0 + 21)
    await store.commit(Commit(session_id=sid, expected_seq=2, events=[ev(sid, 3)], lease_token=t2))
    # The stale owner releasing does nothing; the real owner releasing frees it at once.
    await store.release_lease(sid, "w1", t1)
    assert await store.acquire_lease(sid, "w3", 10, T0 + 22) is None
    await store.release_lease(sid, "w2", t2)
    t3 = await store.acquire_lease(sid, "w3", 10, T0 + 22)
    assert t3 is not None and t3 > t2
    with pytest.raises(LeaseLost):
        await store.commit(
            Commit(session_id=sid, expected_seq=3, events=[ev(sid, 4)], lease_token=t2)
        )
    # Re-acquiring one's own lease fences one's own older token too.
    t4 = await store.acquire_lease(sid, "w3", 10, T0 + 23)
    assert t4 is not None and t4 > t3
    with pytest.raises(LeaseLost):
        await store.commit(
            Commit(session_id=sid, expected_seq=3, events=[ev(sid, 4)], lease_token=t3)
        )
    assert await store.head(sid) == 3


async def test_a_late_renewal_never_shortens_a_lease(store: Store) -> None:
    """A renewal sent earlier but applied later (a PostgreSQL server process frozen with it
    buffered, woken after the call timed out and a newer renewal went through) keeps the
    later expiry: the lease is never shortened under its owner."""
    sid = await new_session(store)
    token = await store.acquire_lease(sid, "w1", 10, T0)
    assert token is not None
    assert await store.renew_lease(sid, "w1", token, 10, T0 + 8)  # until T0 + 18
    assert await store.renew_lease(sid, "w1", token, 10, T0 + 2)  # the late one: until T0 + 12
    assert await store.acquire_lease(sid, "w2", 10, T0 + 15) is None  # still w1's to T0 + 18
    assert await store.acquire_lease(sid, "w2", 10, T0 + 18.5) is not None


async def test_a_commit_can_free_its_lease(store: Store) -> None:
    sid = await new_session(store)
    t1 = await store.acquire_lease(sid, "w1", 10, T0)
    assert t1 is not None
    commit = Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)], lease_token=t1)
    await store.commit(dataclasses.replace(commit, release_lease=True))
    assert await store.head(sid) == 2
    assert not await store.renew_lease(sid, "w1", t1, 10, T0 + 1)  # given back with the commit
    t2 = await store.acquire_lease(sid, "w2", 10, T0 + 1)  # at once, not at expiry
    assert t2 is not None and t2 > t1
    # A refused commit frees nothing: the lease stays w2's.
    stale = Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)], lease_token=t2)
    with pytest.raises(AppendConflict):
        await store.commit(dataclasses.replace(stale, release_lease=True))
    assert await store.acquire_lease(sid, "w3", 10, T0 + 2) is None


async def test_a_released_lease_token_never_writes_again(store: Store) -> None:
    """A token given back (by `release_lease` or by the commit that releases it) is fenced at
    once, not only once someone else takes the lease; the next grant still gets a larger one."""
    sid = await new_session(store)
    t1 = await store.acquire_lease(sid, "w1", 10, T0)
    assert t1 is not None
    await store.release_lease(sid, "w1", t1)
    for stale in (
        Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)], lease_token=t1),
        Commit(session_id=sid, expected_seq=1, events=[], lease_token=t1, snapshot={"seq": 1}),
    ):
        with pytest.raises(LeaseLost):
            await store.commit(stale)
    assert await store.head(sid) == 1
    assert (await store.load(sid)).snapshot is None  # type: ignore[union-attr]
    assert not await store.renew_lease(sid, "w1", t1, 10, T0 + 1)
    t2 = await store.acquire_lease(sid, "w1", 10, T0 + 1)
    assert t2 is not None and t2 > t1
    # A worker stopping gives back a session that still has work: another claims it at once.
    released = Commit(
        session_id=sid,
        expected_seq=1,
        events=[ev(sid, 2)],
        lease_token=t2,
        status="running",
        release_lease=True,
    )
    await store.commit(released)
    with pytest.raises(LeaseLost):
        await store.commit(
            Commit(session_id=sid, expected_seq=2, events=[ev(sid, 3)], lease_token=t2)
        )
    assert await store.head(sid) == 2
    [(claimed, t3)] = await store.claim("w2", 10, T0 + 2, 10)
    assert claimed == sid and t3 > t2
    await store.commit(Commit(session_id=sid, expected_seq=2, events=[ev(sid, 3)], lease_token=t3))
    assert await store.head(sid) == 3


async def test_lease_token_on_a_never_leased_session_is_lost(store: Store) -> None:
    sid = await new_session(store)
    with pytest.raises(LeaseLost):
        await store.commit(
            Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)], lease_token=1)
        )
    assert not await store.renew_lease(sid, "w1", 1, 10, T0)
    await store.release_lease(sid, "w1", 1)  # harmless
    assert await store.acquire_lease(sid, "w1", 10, T0) is not None


async def test_leases_are_per_session(store: Store) -> None:
    s1 = await new_session(store)
    s2 = await new_session(store)
    assert await store.acquire_lease(s1, "w1", 10, T0) is not None
    assert await store.acquire_lease(s2, "w2", 10, T0) is not None
    assert await store.acquire_lease(s1, "w2", 10, T0) is None


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


# -- faults and concurrency ------------------------------------------------------------------


async def test_fault_hook_brackets_every_commit(store: Store) -> None:
    calls: list[tuple[str, str]] = []
    store.set_fault_hook(lambda when, label: calls.append((when, label)))
    sid = await new_session(store)
    await store.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2, "tool.started")]))
    assert calls == [
        ("before", "session.created"),
        ("after", "session.created"),
        ("before", "tool.started"),
        ("after", "tool.started"),
    ]

    def crash(when: str, label: str) -> None:
        if when == "before":
            raise RuntimeError("simulated crash")

    store.set_fault_hook(crash)
    with pytest.raises(RuntimeError):
        await store.commit(Commit(session_id=sid, expected_seq=2, events=[ev(sid, 3)]))
    store.set_fault_hook(None)
    assert await store.head(sid) == 2


async def test_concurrent_commits_at_one_seq_exactly_one_wins(store_url: str) -> None:
    stores = [make_store(store_url) for _ in range(4)]
    for s in stores:
        await s.open()
    try:
        sid = await new_session(stores[0])
        await stores[0].commit(
            Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)], new_requests=[])
        )

        async def attempt(i: int) -> str:
            s = stores[i % len(stores)]
            try:
                await s.commit(
                    Commit(
                        session_id=sid,
                        expected_seq=2,
                        events=[ev(sid, 3, "model.completed", writer=i), ev(sid, 4, writer=i)],
                        new_requests=[approval(sid, f"req_w{i}")],
                    )
                )
            except AppendConflict:
                return "conflict"
            return "won"

        results = await asyncio.gather(*(attempt(i) for i in range(12)))
        assert results.count("won") == 1, results
        assert results.count("conflict") == 11
        winner = results.index("won")
        events = await stores[1].read_events(sid)
        assert [e.seq for e in events] == [1, 2, 3, 4]
        assert {e.data.get("writer") for e in events[2:]} == {winner}
        assert [r.id for r in await stores[2].pending(PendingFilter(session_id=sid))] == [
            f"req_w{winner}"
        ]
    finally:
        for s in stores:
            await s.close()


async def test_concurrent_settlements_of_one_request_exactly_one_wins(store_url: str) -> None:
    stores = [make_store(store_url) for _ in range(3)]
    for s in stores:
        await s.open()
    try:
        sid = await new_session(stores[0])
        await stores[0].commit(
            Commit(
                session_id=sid,
                expected_seq=1,
                events=[ev(sid, 2)],
                new_requests=[approval(sid, "r")],
            )
        )

        async def answer(i: int) -> str:
            s = stores[i % len(stores)]
            for _ in range(50):
                head = await s.head(sid)
                assert head is not None
                try:
                    await s.commit(
                        Commit(
                            session_id=sid,
                            expected_seq=head,
                            events=[ev(sid, head + 1, "input.resolved", by=i)],
                            resolve=[settle("r")],
                            durable=True,
                        )
                    )
                except AppendConflict:
                    continue
                except RequestClosed:
                    return "closed"
                return "settled"
            return "starved"

        results = await asyncio.gather(*(answer(i) for i in range(9)))
        assert results.count("settled") == 1, results
        assert results.count("closed") == 8
        assert await stores[0].head(sid) == 3
    finally:
        for s in stores:
            await s.close()


async def test_store_can_be_reopened(store_url: str) -> None:
    s = make_store(store_url)
    await s.open()
    sid = await new_session(s)
    await s.close()
    await s.close()  # twice is fine
    await s.open()
    try:
        assert await s.head(sid) == 1
    finally:
        await s.close()


# -- the runtime end to end, on each store ---------------------------------------------------


def refund_agent(runs: list[dict[str, Any]]) -> so.Agent:
    @so.tool(approval=lambda input: input.amount > 100)
    async def issue_refund(order_id: str, amount: float, reason: str) -> dict[str, Any]:
        """Refund an order."""
        runs.append({"order_id": order_id, "amount": amount})
        return {"refunded": amount}

    return scripted_agent(
        "support",
        [
            call_tools(call("issue_refund", order_id="1042", amount=180, reason="broken")),
            reply("Done."),
        ],
        tools=[issue_refund],
    )


@pytest.mark.parametrize("given", ["url", "instance"])
async def test_runtime_generate_wait_approve_complete(store_url: str, given: str) -> None:
    runs: list[dict[str, Any]] = []
    store: str | Store = store_url if given == "url" else make_store(store_url)
    rt = so.Runtime([refund_agent(runs)], store=store)
    try:
        r = await rt.generate("support", prompt="Refund order 1042")
        assert r.status == "waiting" and runs == []
        assert len(r.pending) == 1 and r.pending[0].tool_name == "issue_refund"
        queue = await rt.pending()
        assert [q.id for q in queue] == [r.pending[0].id]
        r = await rt.generate(
            session_id=r.session_id,
            approvals=[so.Decision(id=r.pending[0].id, approved=True, reason="ok")],
        )
        assert r.status == "completed" and r.text == "Done."
        assert runs == [{"order_id": "1042", "amount": 180.0}]
        assert await rt.pending() == []
        events = [e async for e in rt.events(r.session_id, after=0, follow=False)]
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        types = [e.type for e in events]
        assert types[0] == "session.created" and "approval.settled" in types
        assert types.index("approval.settled") < types.index("tool.completed")
        assert types[-1] == "session.waiting" or "turn.completed" in types
    finally:
        await rt.close()


async def test_runtime_resumes_from_another_runtime(store_url: str) -> None:
    runs: list[dict[str, Any]] = []
    first = so.Runtime([refund_agent(runs)], store=store_url)
    try:
        r = await first.generate("support", prompt="Refund order 1042")
        assert r.status == "waiting"
    finally:
        await first.close()
    second = so.Runtime([refund_agent(runs)], store=store_url)
    try:
        r2 = await second.respond(
            r.session_id, [so.InputResponse(request_id=r.pending[0].id, option_id="approve")]
        )
        assert r2.status == "completed" and len(runs) == 1
        again = await second.respond(
            r.session_id, [so.InputResponse(request_id=r.pending[0].id, option_id="approve")]
        )
        assert again.outcomes[0].applied is False and len(runs) == 1
    finally:
        await second.close()


def test_both_backends_implement_the_protocol(tmp_path: Path) -> None:
    assert isinstance(make_store(f"sqlite:///{tmp_path}/x.db"), Store)
    assert isinstance(make_store("postgresql://u@127.0.0.1:1/db"), Store)


async def test_runtimes_racing_to_answer_settle_once(store_url: str) -> None:
    runs: list[dict[str, Any]] = []
    first = so.Runtime([refund_agent(runs)], store=store_url)
    try:
        r = await first.generate("support", prompt="Refund order 1042")
        rid = r.pending[0].id
    finally:
        await first.close()
    racers = [so.Runtime([refund_agent(runs)], store=store_url) for _ in range(4)]
    try:
        answers = [so.InputResponse(request_id=rid, option_id="approve")]
        results = await asyncio.gather(
            *(rt.respond(r.session_id, answers) for rt in racers), return_exceptions=True
        )
        errors = [x for x in results if isinstance(x, BaseException)]
        assert not errors, errors
        applied = [
            o.applied for x in results if isinstance(x, so.GenerateResult) for o in x.outcomes
        ]
        assert applied.count(True) == 1 and applied.count(False) == 3
        assert runs == [{"order_id": "1042", "amount": 180.0}]
        events = [e async for e in racers[0].events(r.session_id, follow=False)]
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert [e.type for e in events].count("approval.settled") == 1
        assert [e.type for e in events].count("tool.completed") == 1
        state = await racers[1].state(r.session_id)
        assert state.turn is not None and state.turn.status == "completed"
    finally:
        for rt in racers:
            await rt.close()


def test_runtime_across_event_loops(store_url: str) -> None:
    """A script may call asyncio.run() once per step with one Runtime; and the sync twins."""
    runs: list[dict[str, Any]] = []
    rt = so.Runtime([refund_agent(runs)], store=store_url)
    r = asyncio.run(rt.generate("support", prompt="Refund order 1042"))
    assert r.status == "waiting"
    decision = so.Decision(id=r.pending[0].id, approved=True)
    r = asyncio.run(rt.generate(session_id=r.session_id, approvals=[decision]))
    assert r.status == "completed" and len(runs) == 1
    asyncio.run(rt.close())
    rt = so.Runtime([refund_agent(runs)], store=store_url)
    r = rt.generate_sync("support", prompt="Refund order 1043")
    assert rt.pending_sync()[0].id == r.pending[0].id
    r = rt.generate_sync(
        session_id=r.session_id, approvals=[decision.model_copy(update={"id": r.pending[0].id})]
    )
    assert r.status == "completed" and len(runs) == 2
    rt.close_sync()


# -- change notifications --------------------------------------------------------------------


async def test_wait_for_change(store_url: str) -> None:
    waiter, writer = make_store(store_url), make_store(store_url)
    await waiter.open()
    await writer.open()
    try:
        s1 = await new_session(writer)
        s2 = await new_session(writer)
        wait = waiter.wait_for_change  # type: ignore[attr-defined]
        assert await wait(s1, 0.2) is False  # nothing happens: times out
        assert await wait(s1, 5, after=0) is True  # already past seq 0
        assert await wait(s1, 0.2, after=1) is False

        async def commit_later(sid: str, seq: int) -> None:
            await asyncio.sleep(0.1)
            await writer.commit(Commit(session_id=sid, expected_seq=seq, events=[ev(sid, seq + 1)]))

        task = asyncio.create_task(commit_later(s1, 1))
        assert await wait(s1, 10) is True
        await task
        task = asyncio.create_task(commit_later(s2, 1))
        assert await wait(s1, 0.5) is False  # another session's commit does not wake s1
        await task
        task = asyncio.create_task(commit_later(s2, 2))
        assert await wait(None, 10) is True  # any session
        await task
        task = asyncio.create_task(commit_later(s1, 2))
        assert await wait(s1, 10, after=2) is True
        await task
        with pytest.raises(UnknownSession):
            await wait("ses_nope", 1, after=0)
    finally:
        await waiter.close()
        await writer.close()


# -- claiming work (workers) -----------------------------------------------------------------


async def running_session(store: Store, at: float) -> str:
    sid = await new_session(store)
    event = Event(session_id=sid, seq=2, type="turn.started", at=at, turn_id="trn_1")
    await store.commit(Commit(session_id=sid, expected_seq=1, events=[event], status="running"))
    return sid


async def test_claim_leases_sessions_with_work(store: Store) -> None:
    idle = await new_session(store)
    s1 = await running_session(store, T0 + 1)
    s2 = await running_session(store, T0 + 2)
    s3 = await running_session(store, T0 + 3)
    held = await store.acquire_lease(s3, "busy", 10, T0)
    assert held is not None
    got = await store.claim("w1", 10, T0, 1)
    assert [sid for sid, _ in got] == [s1]  # oldest first, up to the limit
    got += await store.claim("w1", 10, T0, 10)
    assert [sid for sid, _ in got] == [s1, s2]  # not the idle one, not the one held
    assert await store.claim("w2", 10, T0 + 5, 10) == []  # all live
    assert await store.acquire_lease(s1, "w2", 10, T0 + 5) is None  # claimed means leased
    token1 = dict(got)[s1]
    await store.commit(
        Commit(session_id=s1, expected_seq=2, events=[ev(s1, 3)], lease_token=token1)
    )
    # Expired leases (w1's and busy's) are claimed again, with new tokens that fence the old.
    again = dict(await store.claim("w2", 10, T0 + 11, 10))
    assert set(again) == {s1, s2, s3}
    assert again[s1] > token1 and again[s3] > held
    with pytest.raises(LeaseLost):
        await store.commit(
            Commit(session_id=s1, expected_seq=3, events=[ev(s1, 4)], lease_token=token1)
        )
    # A released lease is claimable at once; a session that went idle is not.
    await store.release_lease(s2, "w2", again[s2])
    await store.commit(
        Commit(
            session_id=s3,
            expected_seq=2,
            events=[ev(s3, 3, "turn.completed")],
            lease_token=again[s3],
            status="idle",
        )
    )
    await store.release_lease(s3, "w2", again[s3])
    assert [sid for sid, _ in await store.claim("w3", 10, T0 + 12, 10)] == [s2]
    assert idle not in {sid for sid, _ in await store.claim("w4", 10, T0 + 99, 10)}


async def test_claim_takes_only_the_agents_asked_for(store: Store) -> None:
    sid = await running_session(store, T0)
    assert await store.claim("w1", 10, T0, 10, agents=[]) == []
    assert await store.claim("w1", 10, T0, 10, agents=["billing", "other"]) == []
    assert [s for s, _ in await store.claim("w1", 10, T0, 10, agents=["billing", "support"])] == [
        sid
    ]


async def test_concurrent_claimers_never_share_a_session(store_url: str) -> None:
    stores = [make_store(store_url) for _ in range(4)]
    for s in stores:
        await s.open()
    try:
        sids = [await running_session(stores[0], T0 + i) for i in range(30)]

        async def claimer(i: int) -> list[tuple[str, int]]:
            got: list[tuple[str, int]] = []
            for _ in range(10):
                got += await stores[i % len(stores)].claim(f"w{i}", 30, T0 + 100, 2)
            return got

        results = await asyncio.gather(*(claimer(i) for i in range(8)))
        claimed = [sid for got in results for sid, _ in got]
        assert sorted(claimed) == sorted(sids)  # every session once, none twice
    finally:
        for s in stores:
            await s.close()


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


# -- rows edited behind the runtime's back ---------------------------------------------------


def edit(url: str, sql: str, *params: Any) -> None:
    """Change signoff's tables directly, as a hand edit or a half-restored backup would
    (`{t}` and `{p}` as for `query`), and commit."""
    if url.startswith("sqlite:///"):
        import sqlite3

        conn = sqlite3.connect(url[len("sqlite:///") :])
        with conn:
            conn.execute(sql.format(t="", p="?"), params)
        conn.close()
        return
    query(url, sql + " RETURNING 1", *params)


async def parked_pair(rt: so.Runtime) -> tuple[so.GenerateResult, so.GenerateResult]:
    """Two sessions of `gated_agent`, each waiting for an approval."""
    return await rt.generate("support", prompt="one"), await rt.generate("support", prompt="two")


def gated_agent() -> so.Agent:
    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return f"refunded {order_id}"

    steps = [call_tools(call("issue_refund", order_id="1")), reply("done")] * 2
    return scripted_agent("support", steps, tools=[issue_refund])


def session_rows(url: str, sid: str) -> list[tuple[Any, ...]]:
    return query(
        url,
        "SELECT s.head, e.seq FROM {t}sessions s LEFT JOIN {t}events e ON e.sk = s.sk "
        "WHERE s.id = {p} ORDER BY e.seq",
        sid,
    )


async def test_a_damaged_event_row_is_named_by_its_session_and_seq(store_url: str) -> None:
    async with so.Runtime([gated_agent()], store=store_url) as rt:
        one, two = await parked_pair(rt)
        edit(
            store_url,
            "UPDATE {t}events SET data = {p} WHERE seq = 2 AND sk = "
            "(SELECT sk FROM {t}sessions WHERE id = {p})",
            b"\x01not deflate",
            one.session_id,
        )
        before = session_rows(store_url, one.session_id)
        fresh = so.Runtime([gated_agent()], store=store_url)  # nothing cached
        try:
            answer = so.InputResponse(request_id=one.pending[0].id, option_id="approve")
            for attempt in (
                lambda: fresh.state(one.session_id),
                lambda: fresh.store.read_events(one.session_id),
                lambda: fresh.respond(one.session_id, [answer]),
            ):
                with pytest.raises(StoreError, match=f"session '{one.session_id}', event 2: "):
                    await attempt()
            answer = so.InputResponse(request_id=two.pending[0].id, option_id="approve")
            assert (await fresh.respond(two.session_id, [answer])).status == "completed"
        finally:
            await fresh.close()
        assert session_rows(store_url, one.session_id) == before


@pytest.mark.parametrize(
    "damage",
    ["last event deleted", "every event deleted", "head ahead", "head behind", "snapshot ahead"],
)
async def test_a_session_row_that_disagrees_with_its_log_is_a_store_error(
    store_url: str, damage: str
) -> None:
    """A half-restored backup: the session row's head, its snapshot and its events do not
    agree. Reading or answering it says so, instead of retrying commits that can never apply
    ("too many concurrent appends") or calling the session unknown; nothing is written, and
    other sessions go on."""
    async with so.Runtime([gated_agent()], store=store_url) as rt:
        one, two = await parked_pair(rt)
        sid = one.session_id
        state = await rt.state(sid)
    of_session = "sk = (SELECT sk FROM {t}sessions WHERE id = {p})"
    if damage == "last event deleted":
        edit(
            store_url, f"DELETE FROM {{t}}events WHERE seq = {{p}} AND {of_session}", state.seq, sid
        )
    elif damage == "every event deleted":
        edit(store_url, f"DELETE FROM {{t}}events WHERE {of_session}", sid)
    elif damage == "head ahead":
        edit(store_url, "UPDATE {t}sessions SET head = head + 3 WHERE id = {p}", sid)
    elif damage == "head behind":
        edit(store_url, "UPDATE {t}sessions SET head = head - 1 WHERE id = {p}", sid)
    else:
        snapshot = {**state.to_snapshot(), "seq": state.seq + 5}
        edit(
            store_url,
            "INSERT INTO {t}snapshots (sk, seq, data) SELECT sk, {p}, {p} FROM {t}sessions "
            "WHERE id = {p} ON CONFLICT (sk) DO UPDATE SET seq = excluded.seq, "
            "data = excluded.data",
            state.seq + 5,
            pack_bytes(snapshot),
            sid,
        )
    before = session_rows(store_url, sid)
    async with so.Runtime([gated_agent()], store=store_url) as rt:
        answer = so.InputResponse(request_id=one.pending[0].id, option_id="approve")
        for attempt in (lambda: rt.state(sid), lambda: rt.respond(sid, [answer])):
            with pytest.raises(StoreError, match=f"session '{sid}'") as info:
                await attempt()
            assert type(info.value) is StoreError, info.value
        answer = so.InputResponse(request_id=two.pending[0].id, option_id="approve")
        assert (await rt.respond(two.session_id, [answer])).status == "completed"
    assert session_rows(store_url, sid) == before


@pytest.mark.parametrize(
    "damage",
    [
        "UPDATE {t}requests SET status = 'settled' WHERE id = {p}",
        "DELETE FROM {t}requests WHERE id = {p}",
    ],
)
async def test_a_request_row_that_disagrees_with_the_log_is_a_store_error(
    store_url: str, damage: str
) -> None:
    """The log says a request is pending, its row says otherwise (or is gone): answering it is
    a StoreError naming both, not twenty retries ending in 'too much contention'; nothing is
    written, and the other session's answer goes through."""
    async with so.Runtime([gated_agent()], store=store_url) as rt:
        one, two = await parked_pair(rt)
        rid = one.pending[0].id
        edit(store_url, damage, rid)
        before = session_rows(store_url, one.session_id)
        answer = so.InputResponse(request_id=rid, option_id="approve")
        with pytest.raises(StoreError, match=f"session '{one.session_id}'.*{rid}") as info:
            await rt.respond(one.session_id, [answer])
        assert type(info.value) is StoreError, info.value
        assert session_rows(store_url, one.session_id) == before
        answer = so.InputResponse(request_id=two.pending[0].id, option_id="approve")
        assert (await rt.respond(two.session_id, [answer])).status == "completed"


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


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"agent": 5}, r"PendingFilter\(agent=...\) must be text or None, not 5"),
        ({"tool_name": b"x"}, r"PendingFilter\(tool_name=...\) must be text or None"),
        ({"status": 1}, r"PendingFilter\(status=...\) must be text or None, not 1"),
        ({"session_id": ["s"]}, r"PendingFilter\(session_id=...\) must be text or None"),
        ({"kind": 0}, r"PendingFilter\(kind=...\) must be text or None, not 0"),
        ({"created_before": "1"}, r"PendingFilter\(created_before=...\) must be a finite"),
        ({"live_at": float("nan")}, r"PendingFilter\(live_at=...\) must be a finite"),
        ({"due_by": True}, r"PendingFilter\(due_by=...\) must be a finite"),
        ({"created_after": float("inf")}, r"PendingFilter\(created_after=...\) must be a fin"),
        # No float holds it (an OverflowError), or SQLite cannot bind it where psycopg can.
        ({"created_before": 10**400}, r"PendingFilter\(created_before=...\) must be a finite"),
        ({"due_by": -(2**63) - 1}, r"PendingFilter\(due_by=...\) must be a finite"),
        ({"live_at": 2**63}, r"PendingFilter\(live_at=...\) must be a finite time"),
        ({"limit": -1}, r"PendingFilter\(limit=...\) must be a whole number from 0, not -1"),
        ({"limit": "5"}, r"PendingFilter\(limit=...\) must be a whole number from 0"),
        ({"offset": 2.0}, r"PendingFilter\(offset=...\) must be a whole number from 0"),
        ({"offset": 2**63}, r"PendingFilter\(offset=...\) must be a whole number from 0"),
    ],
)
def test_a_pending_filter_of_the_wrong_kind_is_refused_when_made(
    given: dict[str, Any], message: str
) -> None:
    """SQLite matched `agent=5` as the text '5' where psycopg failed on it, and a negative
    limit was "no limit" to SQLite: a filter the two stores would read differently is refused
    before either sees it."""
    with pytest.raises(so.UsageError, match=message):
        PendingFilter(**given)
    assert PendingFilter(agent="a", live_at=1, due_by=2.5, limit=0, offset=2**63 - 1).limit == 0
    assert PendingFilter(created_before=2**63 - 1, created_after=-(2**63)).created_after == -(2**63)


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
