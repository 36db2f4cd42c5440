"""The `Store` protocol's leases and claims: fencing, renewals, releases, and workers claiming
sessions with work.

Part of the one suite for the `Store` protocol (test_store_conformance.py and
test_store_{requests,leases,concurrency,runtime,edited_rows}.py): the `store` and `store_url`
fixtures in conftest.py run it against both backends.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from signoff._events import Event
from signoff._exceptions import (
    AppendConflict,
    LeaseLost,
    StoreError,
)
from signoff.stores import Commit, Store

from .conftest import make_store
from .test_store_conformance import T0, ev, new_session
from .test_store_edited_rows import edit

# -- leases ----------------------------------------------------------------------------------


async def test_a_commit_grants_the_lease_it_asks_for_unless_another_holds_it(store: Store) -> None:
    """`Commit.grant`: the commit that makes a turn runnable leases the session to the drive it
    is for in the same write, so no claim takes the turn first; with another owner's lease live
    it applies all the same and grants none, and a lapsed one is taken over (a newer token)."""
    sid = await new_session(store)

    def running(seq: int, at: float) -> Commit:
        return Commit(
            session_id=sid,
            expected_seq=seq - 1,
            events=[ev(sid, seq)],
            status="running",
            grant=("call", 10, at),
        )

    first = running(2, T0)
    await store.commit(first)
    assert first.granted is not None
    assert await store.claim("worker", 10, T0 + 1, 10) == []  # leased with the commit
    assert await store.acquire_lease(sid, "other", 10, T0 + 2) is None
    assert await store.renew_lease(sid, "call", first.granted, 10, T0 + 2)
    await store.release_lease(sid, "call", first.granted)
    held = await store.acquire_lease(sid, "worker", 10, T0 + 3)
    assert held is not None and held > first.granted
    second = running(3, T0 + 4)
    await store.commit(second)
    assert second.granted is None and await store.head(sid) == 3  # applied, nothing granted
    assert await store.renew_lease(sid, "worker", held, 10, T0 + 5)  # still the worker's
    third = running(4, T0 + 30)  # the worker's lease lapsed
    await store.commit(third)
    assert third.granted is not None and third.granted > held
    assert not await store.renew_lease(sid, "worker", held, 10, T0 + 31)


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


async def test_a_session_created_with_its_lease_is_held_and_fenced_from_the_start(
    store: Store,
) -> None:
    """`create_session(lease=...)`: the lease (token 1) is written with the session, so no
    other owner acquires or claims it while it runs; its token commits, renews and gives it
    back like an acquired one's. A second creation of the id writes nothing, lease included."""
    sid = "ses_leased_at_creation"
    created = Event(session_id=sid, seq=1, type="session.created", at=T0, data={"agent": "a"})
    first = ev(sid, 2, "turn.started", message="hi")
    token = await store.create_session(
        sid, "a", [created, first], None, status="running", lease=("w1", 10, T0)
    )
    assert token == 1
    assert [(x.status, x.head) for x in await store.sessions()] == [("running", 2)]
    assert await store.acquire_lease(sid, "w2", 10, T0 + 5) is None
    assert await store.claim("w2", 10, T0 + 5, 10) == []
    with pytest.raises(StoreError):
        await store.create_session(sid, "a", [created], None, lease=("w2", 10, T0 + 20))
    assert await store.head(sid) == 2
    assert await store.acquire_lease(sid, "w2", 10, T0 + 9) is None  # still w1's, to T0 + 10
    assert await store.renew_lease(sid, "w1", token, 10, T0 + 9)
    commit = Commit(session_id=sid, expected_seq=2, events=[ev(sid, 3)], lease_token=token)
    await store.commit(dataclasses.replace(commit, release_lease=True))
    again = await store.acquire_lease(sid, "w2", 10, T0 + 10)  # given back with the commit
    assert again is not None and again > token
    with pytest.raises(LeaseLost):
        await store.commit(
            Commit(session_id=sid, expected_seq=3, events=[ev(sid, 4)], lease_token=token)
        )
    # Without `lease` nothing is leased: a running session is claimed at once.
    other = "ses_created_unleased"
    made = Event(session_id=other, seq=1, type="session.created", at=T0, data={"agent": "a"})
    started = ev(other, 2, "turn.started", message="hi")
    assert await store.create_session(other, "a", [made, started], None, status="running") is None
    assert [sid for sid, _ in await store.claim("w3", 10, T0 + 11, 10)] == [other]


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


async def test_a_lease_row_deleted_by_hand_fences_the_holder_it_forgot(store_url: str) -> None:
    """A lease row deleted behind the stores' back (by hand, a half-restored backup) starts the
    next grant's token at 1 again: the token the holder that never knew has. A commit is fenced
    on the owner as well as the token, so that holder's commits are refused, its renewals and
    release do nothing, and the new holder's go through."""
    store = make_store(store_url)
    await store.open()
    try:
        sid = await new_session(store)
        old = await store.acquire_lease(sid, "w1", 10, T0)
        assert old is not None
        edit(
            store_url,
            "DELETE FROM {t}leases WHERE sk = (SELECT sk FROM {t}sessions WHERE id = {p})",
            sid,
        )
        new = await store.acquire_lease(sid, "w2", 10, T0 + 1)
        assert new == old  # the same token, issued to another owner
        forgotten = Commit(
            session_id=sid, expected_seq=1, events=[ev(sid, 2)], lease_token=old, lease_owner="w1"
        )
        with pytest.raises(LeaseLost):
            await store.commit(forgotten)
        with pytest.raises(LeaseLost):
            await store.commit(dataclasses.replace(forgotten, release_lease=True))
        assert await store.head(sid) == 1
        assert not await store.renew_lease(sid, "w1", old, 10, T0 + 2)
        await store.release_lease(sid, "w1", old)
        assert await store.acquire_lease(sid, "w3", 10, T0 + 2) is None  # still w2's
        await store.commit(dataclasses.replace(forgotten, lease_owner="w2"))
        assert await store.head(sid) == 2
    finally:
        await store.close()


async def test_lease_held_reads_whether_a_live_lease_is_held(store: Store) -> None:
    """`lease_held(session_id, now)`: a lease granted and live is held; one given back, or
    lapsed by `now`, is not, nor is a session never leased or unknown. A read: the token the
    next grant gets is the one after the last grant's, none skipped."""
    sid = await new_session(store)
    held = store.lease_held  # type: ignore[attr-defined]
    assert not await held(sid, T0) and not await held("ses_unknown", T0)
    t1 = await store.acquire_lease(sid, "w1", 10, T0)
    assert t1 is not None
    assert await held(sid, T0 + 9.9)
    assert not await held(sid, T0 + 10)  # lapsed: another may take it
    await store.release_lease(sid, "w1", t1)
    assert not await held(sid, T0 + 1)
    assert await store.acquire_lease(sid, "w2", 10, T0 + 1) == t1 + 1


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


async def test_claim_skips_the_sessions_its_process_drives(store: Store) -> None:
    """A lease lapsed under a drive that stalled in this process is left to that drive (its
    renewal keeps it), not taken by this process's next claim, which starts a second drive."""
    s1 = await running_session(store, T0)
    s2 = await running_session(store, T0 + 1)
    [(_, t1), _] = await store.claim("w1", 10, T0, 10)
    again = await store.claim("w1", 10, T0 + 11, 10, skip=[s1, "ses_unknown"])
    assert [sid for sid, _ in again] == [s2]
    assert await store.claim("w1", 10, T0 + 30, 10, skip=[s1, s2]) == []
    assert await store.renew_lease(s1, "w1", t1, 10, T0 + 30)  # still the stalled drive's
    assert [sid for sid, _ in await store.claim("w2", 10, T0 + 41, 10, skip=[s2])] == [s1]


async def test_a_damaged_lease_row_is_passed_over_not_failing_every_claim(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A lease row a hand edit left with a token claims cannot take over (text, a fraction, the
    column's largest, with no next) or an expiry that is no number: that session is passed over
    and named in the log once (SQLite), taking no place within the claim's limit, and the
    others are claimed; its own acquiring still says what is wrong. It failed every claim, so
    no session ran. (PostgreSQL's columns hold only the largest token of these.)"""
    sqlite = store_url.startswith("sqlite")
    store = make_store(store_url)
    await store.open()
    try:
        damaged = await running_session(store, T0)  # the oldest: a claim reads it first
        other = await running_session(store, T0 + 1)
        assert await store.acquire_lease(damaged, "w0", 10, T0) is not None
        damages: list[tuple[str, object]] = [("token", 2**63 - 1)]
        if sqlite:
            damages += [("token", "seven"), ("token", 7.5), ("expires_at", "soon")]
        for n, (column, value) in enumerate(damages):
            now = T0 + 100 * (n + 1)
            row = "WHERE sk = (SELECT sk FROM {t}sessions WHERE id = {p})"
            edit(store_url, "UPDATE {t}leases SET token = 5, expires_at = {p} " + row, T0, damaged)
            edit(store_url, f"UPDATE {{t}}leases SET {column} = {{p}} " + row, value, damaged)
            caplog.clear()
            with caplog.at_level("WARNING", logger="signoff.store"):
                [(claimed, token)] = await store.claim("w1", 10, now, 1)
                assert await store.claim("w2", 10, now, 10) == []
            assert claimed == other
            if sqlite:
                [line] = [r.getMessage() for r in caplog.records]  # once, not at every claim
                assert damaged in line and "claims pass it over" in line
            with pytest.raises(StoreError):
                await store.acquire_lease(damaged, "w3", 10, now)
            await store.release_lease(other, "w1", token)
    finally:
        await store.close()


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


# -- the running sessions none holds (the inline sweep's) -------------------------------------


async def test_running_unheld_lists_the_running_sessions_of_an_agent_none_holds(
    store: Store,
) -> None:
    """`running_unheld(agent, now, last_types=, ids=, limit=, after=)`: the running sessions
    of `agent` (of `ids` only, if given), TTL not passed and no live lease, whose last event is
    of one of `last_types`, by id past `after`; what the inline sweep reads in one query where
    it read each session, and a listing for its page."""
    query = store.running_unheld  # type: ignore[attr-defined]
    settled = ["approval.settled"]

    async def running(last: str, agent: str = "support", expires: float | None = None) -> str:
        sid = await new_session(store, agent)
        events = [ev(sid, 2), ev(sid, 3, last)] if last != "turn.started" else [ev(sid, 2)]
        head = len(events) + 1
        await store.commit(
            Commit(
                session_id=sid, expected_seq=1, events=events, status="running", expires_at=expires
            )
        )
        assert await store.head(sid) == head
        return sid

    due = sorted([await running("approval.settled") for _ in range(3)])
    other_type = await running("turn.started")
    other_agent = await running("approval.settled", agent="billing")
    lapsed = await running("approval.settled", expires=T0 + 50)
    alive = await running("approval.settled", expires=T0 + 500)
    waiting = await new_session(store)
    await store.commit(
        Commit(
            session_id=waiting,
            expected_seq=1,
            events=[ev(waiting, 2, "approval.settled")],
            status="waiting",
        )
    )
    held = await running("approval.settled")
    assert await store.acquire_lease(held, "w1", 10, T0 + 100) is not None
    given_back = await running("approval.settled")
    token = await store.acquire_lease(given_back, "w1", 10, T0 + 100)
    assert token is not None
    await store.release_lease(given_back, "w1", token)
    lapsed_lease = await running("approval.settled")
    assert await store.acquire_lease(lapsed_lease, "w1", 10, T0 + 80) is not None

    ids = [r.id for r in await query("support", T0 + 100, last_types=settled, limit=100)]
    expected = sorted([*due, alive, given_back, lapsed_lease])
    assert ids == expected
    assert other_type not in ids and other_agent not in ids and lapsed not in ids
    assert waiting not in ids and held not in ids
    rows = await query("support", T0 + 100, last_types=settled, limit=2)
    assert [r.id for r in rows] == expected[:2] and all(r.status == "running" for r in rows)
    rest = await query("support", T0 + 100, last_types=settled, limit=100, after=expected[1])
    assert [r.id for r in rest] == expected[2:]
    assert [r.id for r in await query("billing", T0 + 100, last_types=settled)] == [other_agent]
    assert await query("support", T0 + 100, last_types=[]) == []
    both = await query("support", T0 + 100, last_types=["approval.settled", "turn.started"])
    assert other_type in [r.id for r in both]
    # earlier, the lapsed lease was live and the passed TTL not passed yet
    earlier = [r.id for r in await query("support", T0 + 40, last_types=settled, limit=100)]
    assert lapsed_lease not in earlier and lapsed in earlier
    # `ids=`: of those only (a listing's page), in one query, however many others there are
    asked = [due[2], held, lapsed, other_agent, waiting, given_back, "ses_none", due[0]]
    among = await query("support", T0 + 100, last_types=settled, ids=asked, limit=100)
    assert [r.id for r in among] == sorted([due[0], due[2], given_back])
    assert await query("support", T0 + 100, last_types=settled, ids=[]) == []
    assert await query("support", T0 + 100, last_types=settled, ids=["ses_none"]) == []


async def test_running_unheld_among_reads_the_last_event_of_those_types(store: Store) -> None:
    """`among=`: the type of a session's last event of `among`'s types, not of its last: the
    inline sweep lists a session whose request closed and whose drive wrote on before it died,
    not one that parked again since, nor one whose lease a drive holds."""
    query = store.running_unheld  # type: ignore[attr-defined]
    among = ["turn.waiting", "session.waiting", "input.resolved"]

    async def running(*types: str) -> str:
        sid = await new_session(store)
        events = [ev(sid, seq, t) for seq, t in enumerate(types, 2)]
        await store.commit(Commit(session_id=sid, expected_seq=1, events=events, status="running"))
        return sid

    resumed = [
        await running("turn.waiting", "input.resolved"),  # the drive died before it wrote
        await running("turn.waiting", "input.resolved", "tool.started", "tool.completed"),
        await running("input.resolved", "model.completed", "tool.step", "model.spent"),
    ]
    parked = await running("turn.waiting", "input.resolved", "tool.started", "turn.waiting")
    idle = await running("turn.waiting", "input.resolved", "session.waiting", "turn.started")
    never = await running("turn.started", "tool.started", "tool.completed")
    held = await running("turn.waiting", "input.resolved", "tool.started")
    assert await store.acquire_lease(held, "w1", 10, T0 + 100) is not None

    def listed(rows: list[Any]) -> list[str]:
        return [r.id for r in rows]

    closed = ["input.resolved"]
    rows = await query("support", T0 + 100, last_types=closed, among=among, limit=100)
    assert listed(rows) == sorted(resumed), (parked, idle, never, held)
    first = await query("support", T0 + 100, last_types=closed, among=among, limit=1)
    rest = await query(
        "support", T0 + 100, last_types=closed, among=among, after=first[0].id, limit=100
    )
    assert listed(first) + listed(rest) == sorted(resumed)
    # Without `among`, the session's last event: only the first of those ends with it.
    assert listed(await query("support", T0 + 100, last_types=closed)) == [resumed[0]]
    assert listed(await query("support", T0 + 120, last_types=closed, among=among)) == sorted(
        [*resumed, held]
    )  # its lease lapsed


async def test_running_unheld_lists_a_session_whose_lease_row_was_edited_odd(
    tmp_path: Path,
) -> None:
    """A lease whose expiry a hand edit left as text reads as held by no plain comparison
    (SQLite orders text after every number): it is listed, so that `lease_held`, which the
    sweep reads next, says what is wrong with it rather than the session being passed over.
    (SQLite only: PostgreSQL's column is a double, which holds no text.)"""
    store_url = f"sqlite:///{tmp_path / 'state.db'}"
    store = make_store(store_url)
    try:
        sid = await new_session(store)
        await store.commit(
            Commit(
                session_id=sid,
                expected_seq=1,
                events=[ev(sid, 2, "approval.settled")],
                status="running",
            )
        )
        assert await store.acquire_lease(sid, "w1", 10, T0) is not None
        edit(store_url, "UPDATE {t}leases SET expires_at = 'soon'")
        query = store.running_unheld  # type: ignore[attr-defined]
        listed = await query("support", T0, last_types=["approval.settled"])
        assert [r.id for r in listed] == [sid]
        with pytest.raises(StoreError, match="lease expiry"):
            await store.lease_held(sid, T0)  # type: ignore[attr-defined]
    finally:
        await store.close()
