"""PostgreSQL indexes a subagent session's deadline through a copy kept for children only
(`child_expires_at`, migration 11), so a commit that moves the deadline of a top-level session
with a TTL updates its row in place (HOT) as one without a TTL does, while a child's lapse is
still a range of the index of children."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

import signoff as so
from signoff.stores import Commit
from signoff.stores.postgres import PostgresStore
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from ._child_deadlines import session_updates
from ._procs import query
from ._subagents import ALICE, Counted
from .test_subagents_mirrors import expiring_agents


def _event(sid: str, seq: int, type: Any, at: float, **data: Any) -> so.Event:
    return so.Event(session_id=sid, seq=seq, type=type, at=at, turn_id=None, data=data)


def _question(sid: str) -> so.InputRequest:
    return so.InputRequest(
        kind="question",
        id=f"req_{sid}",
        session_id=sid,
        turn_id="trn_a",
        agent="a",
        question="which one?",
        created_at=1.0,
    )


@pytest.fixture
async def one_connection(pg_store_url: str) -> AsyncIterator[PostgresStore]:
    """A store whose every statement runs on one connection, whose counts `session_updates`
    can have reported."""
    store = PostgresStore(pg_store_url, min_size=1, max_size=1)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def _deadlines(url: str) -> dict[str, tuple[Any, Any]]:
    rows = query(url, "SELECT id, expires_at, child_expires_at FROM {t}sessions")
    return {str(sid): (at, child) for sid, at, child in rows}


async def _moved(store: PostgresStore, sid: str, commits: int, first: float) -> float:
    """`commits` commits of session `sid` (at seq 1), each keeping its status and moving its
    deadline, as a session with a TTL's do; the last deadline."""
    deadline = first
    for n in range(commits):
        deadline = first + n
        event = _event(sid, 2 + n, "turn.started", 2.0 + n)
        await store.commit(
            Commit(session_id=sid, expected_seq=1 + n, events=[event], expires_at=deadline)
        )
    return deadline


async def test_a_top_level_session_keeps_hot_updates_and_a_child_its_lapse(
    one_connection: PostgresStore,
) -> None:
    """Five commits that move a top-level session's deadline are all HOT; the same five of a
    subagent session are not (its indexed copy moves), and its parent is found by
    `lapsed_ancestors` at its last deadline, not before; only the child's row holds a copy."""
    store = one_connection
    url = store.url
    created = _event("ses_t", 1, "session.created", 1.0)
    await store.create_session("ses_t", "a", [created], 50.0, status="running")
    parent = _event("ses_p", 1, "session.created", 1.0)
    await store.create_session("ses_p", "a", [parent], None)
    waiting = _event("ses_p", 2, "session.waiting", 1.5)
    await store.commit(
        Commit(
            session_id="ses_p",
            expected_seq=1,
            events=[waiting],
            new_requests=[_question("ses_p")],
            status="waiting",
        )
    )
    child = _event("ses_c", 1, "session.created", 2.0, parent="ses_p")
    await store.create_session("ses_c", "b", [child], 50.0, status="running")
    assert _deadlines(url) == {
        "ses_t": (50.0, None),
        "ses_p": (None, None),
        "ses_c": (50.0, 50.0),
    }
    before = await session_updates(store)
    assert await _moved(store, "ses_t", 5, 100.0) == 104.0
    top = await session_updates(store)
    assert (top[0] - before[0], top[1] - before[1]) == (5, 5)
    assert await _moved(store, "ses_c", 5, 200.0) == 204.0
    children = await session_updates(store)
    assert (children[0] - top[0], children[1] - top[1]) == (5, 0)
    assert _deadlines(url) == {
        "ses_t": (104.0, None),
        "ses_p": (None, None),
        "ses_c": (204.0, 204.0),
    }
    assert await store.lapsed_ancestors(203.9) == []
    assert await store.lapsed_ancestors(204.0) == ["ses_p"]
    await store.commit(  # the child leaves its TTL: no deadline, no copy
        Commit(
            session_id="ses_c",
            expected_seq=6,
            events=[_event("ses_c", 7, "turn.started", 9.0)],
            expires_at=None,
        )
    )
    assert _deadlines(url)["ses_c"] == (None, None)
    assert await store.lapsed_ancestors(float("inf")) == []


async def test_a_ttl_costs_a_top_level_session_no_hot_update(pg_store_url: str) -> None:
    """Three turns of a session with a TTL through the runtime (a tool call and a reply each)
    update its row as many times, in place as many times, as those of one without a TTL."""

    @so.tool
    async def lookup(order_id: str) -> str:
        """Look an order up."""
        return "found"

    steps = [
        s for i in range(3) for s in (call_tools(call("lookup", order_id=str(i))), reply("ok"))
    ]
    counts = []
    for ttl in (None, 3600.0):
        agent = scripted_agent("a", steps, tools=[lookup], limits=so.Limits(ttl=ttl))
        store = PostgresStore(pg_store_url, min_size=1, max_size=1)
        async with so.Runtime([agent], store=store) as rt:
            before = await session_updates(store)
            sid = (await rt.generate("a", prompt="go")).session_id
            for _ in range(2):
                await rt.generate(session_id=sid, prompt="again")
            after = await session_updates(store)
        counts.append((after[0] - before[0], after[1] - before[1]))
        ((expires_at,),) = query(
            pg_store_url, "SELECT expires_at FROM {t}sessions WHERE id = {p}", sid
        )
        assert (expires_at is None) == (ttl is None)
    untimed, timed = counts
    assert timed == untimed and timed[1] > 0, counts


def _copies(url: str) -> list[tuple[bool, Any, Any]]:
    """Each session row's (has a parent, deadline, copy), children first."""
    return query(
        url,
        "SELECT parent IS NOT NULL, expires_at, child_expires_at FROM {t}sessions "
        "ORDER BY parent IS NULL, sk",
    )


async def test_the_runtime_keeps_a_childs_copy_through_its_lapse(pg_store_url: str) -> None:
    """Through the runtime (a delegation, a child parked on an approval, its TTL passing, the
    refused answer that records its expiry): the child's row holds a copy of its deadline at
    each step and the parent's none, and the parent is found above the lapsed child."""
    ran: list[dict[str, Any]] = []
    clock = ManualClock()
    parent, child = expiring_agents(ran, Counted("Billing timed out."))
    parent.limits = so.Limits(ttl=600)
    async with so.Runtime([parent, child], store=pg_store_url, clock=clock) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        [mirror] = r.pending
        [(child_row, lapses, copy), (parent_row, top, top_copy)] = _copies(pg_store_url)
        assert (child_row, parent_row, copy, top_copy) == (True, False, lapses, None)
        assert lapses is not None and top is not None and top > lapses
        reads = PostgresStore(pg_store_url)
        try:
            assert await reads.lapsed_ancestors(lapses - 0.001) == []
            assert await reads.lapsed_ancestors(lapses) == [r.session_id]
        finally:
            await reads.close()
        clock.advance(120)
        with pytest.raises(so.RequestClosed):
            await rt.respond(
                r.session_id,
                [so.InputResponse(request_id=mirror.id, option_id="approve")],
                principal=ALICE,
            )
        rows = _copies(pg_store_url)
        assert [(p, copy == at) for p, at, copy in rows] == [(True, True), (False, False)]
        assert rows[1][2] is None and ran == []
