"""`Driver.record`: a drive that lost its lease, or gave it back, records nothing more."""

from __future__ import annotations

import time

import pytest

import signoff as so
from signoff._leasing import Held
from signoff._recording import EventSpec, TurnStopped, tells_a_person
from signoff.stores import Commit
from signoff.stores.sqlite import SQLiteStore
from signoff.testing import ExecutionLog, call, call_tools, reply, scripted_agent, store_contents

from ._pg_syncs import seen_syncs, watch_syncs
from ._ttl import ttl_agent

AL = so.Principal(authenticator="sso", principal_id="al")


def deploy_agent(*then: str) -> so.Agent:
    """An agent whose first turn deploys with approval; `then`: its replies to later messages."""
    log = ExecutionLog()

    @log.tool(approval=so.always())
    async def deploy(service: str) -> str:
        """Deploy a service."""
        return f"{service} live"

    script = [call_tools(call("deploy", service="api")), reply("ok"), *map(reply, then)]
    return scripted_agent("ops", script, tools=[deploy])


async def test_a_drive_that_lost_or_gave_back_its_lease_records_nothing(store_url: str) -> None:
    """Its lease given up (renewals not getting through, so the store may still take its
    token) or given back with its last commit, a drive must not append: another process may run
    the turn now. The same append from a drive holding its lease goes through."""
    async with so.Runtime([deploy_agent()], store=store_url) as rt:
        r = await rt.generate("ops", prompt="deploy api", auth=AL)
        assert r.status == "waiting"
        sid = r.session_id
        waiting: EventSpec = ("turn.waiting", {"on": "input", "request_ids": [r.pending[0].id]})
        before = await store_contents(rt.store, sid)

        lost = rt._driver((await rt.state(sid)).copy(), None)
        lost.held = Held(at=time.monotonic(), expires=time.time() + 60)
        lost.held.lose()
        with pytest.raises(so.LeaseLost):
            await lost.record([waiting])
        released = rt._driver((await rt.state(sid)).copy(), None)
        released.released = True
        with pytest.raises(TurnStopped):
            await released.record([waiting])
        assert await store_contents(rt.store, sid) == before

        live = rt._driver((await rt.state(sid)).copy(), None)
        live.held = Held(at=time.monotonic(), expires=time.time() + 60)
        (event,) = await live.record([waiting])
        assert before.head is not None and event.seq == before.head + 1


def _trace_sqlite_syncs(store: SQLiteStore) -> dict[int, bool]:
    """Each committed event's seq mapped to whether its transaction's COMMIT ran under
    `PRAGMA synchronous=FULL`, as the statements sent to SQLite show."""
    statements: list[str] = []
    store.conn.set_trace_callback(statements.append)
    synced: dict[int, bool] = {}
    original = store.commit

    async def traced(commit: Commit) -> None:
        start = len(statements)
        await original(commit)
        ran = [sql for sql in statements[start:] if sql.startswith(("PRAGMA synch", "COMMIT"))]
        full = ran == ["PRAGMA synchronous=FULL", "COMMIT", "PRAGMA synchronous=NORMAL"]
        assert full or ran == ["COMMIT"], ran
        synced.update((e.seq, full) for e in commit.events)

    store.commit = traced  # type: ignore[method-assign]
    return synced


async def _postgres_syncs(url: str) -> dict[int, bool]:
    return {int(seq): setting == "on" for seq, setting in await seen_syncs(url)}


async def test_a_park_and_an_answer_are_synced_to_disk_and_nothing_else_is(
    store_url: str,
) -> None:
    """The commit that opens a request and parks the turn may be shown to a person (the reply
    carries the request id, Slack posts it) before anything else is committed, so it is synced
    like the answer: after a power cut that person's answer must still find its request. The
    other commits of the turn skip the sync, but on PostgreSQL a later prompt's `turn.started`,
    which grants its call's drive the lease in the same write, is flushed as `acquire_lease`
    flushed the lease it took after that commit before."""
    postgres = not store_url.startswith("sqlite")
    if postgres:
        await watch_syncs(store_url)
    async with so.Runtime([deploy_agent("you're welcome")], store=store_url) as rt:
        if isinstance(rt.store, SQLiteStore):
            synced = _trace_sqlite_syncs(rt.store)
        r = await rt.generate("ops", prompt="deploy api", auth=AL)
        assert r.status == "waiting"
        decision = so.Decision(id=r.pending[0].id, approved=True)
        done = await rt.generate(session_id=r.session_id, approvals=[decision], auth=AL)
        assert done.status == "completed"
        later = await rt.generate(session_id=r.session_id, prompt="thanks", auth=AL)
        assert later.status == "completed"  # its `turn.started` is a `Store.commit` of its own
        events = [e async for e in rt.events(r.session_id, follow=False)]
    if postgres:
        synced = await _postgres_syncs(store_url)
    by_type: dict[str, set[bool]] = {}
    # The session's creation, which starts its first turn, is not a `Store.commit`.
    assert [e.type for e in events[:2]] == ["session.created", "turn.started"]
    for e in events[2:]:
        by_type.setdefault(e.type, set()).add(synced[e.seq])
    durable = {"input.requested", "turn.waiting", "approval.settled", "input.resolved"}
    if postgres:
        assert by_type.pop("turn.started") == {True}  # the later prompt's, with its grant
    assert by_type == {t: {t in durable} for t in by_type}
    assert durable <= by_type.keys() and "tool.completed" in by_type
    assert postgres or "turn.started" in by_type


def test_a_commit_tells_a_person_when_it_opens_a_request_or_parks_the_turn() -> None:
    """A request opened while other calls of the response still run is shown at once, like a
    park; a commit doing neither is not synced for that reason."""
    request = so.InputRequest(
        id="req_1",
        kind="question",
        session_id="ses_1",
        turn_id="trn_1",
        agent="ops",
        question="Go?",
        created_at=1.0,
    )
    waiting: EventSpec = ("turn.waiting", {"on": "input", "request_ids": ["req_1"]})
    asked: EventSpec = ("input.requested", {"requests": []})
    assert tells_a_person([asked], [request])
    assert tells_a_person([waiting], [])
    assert not tells_a_person([("turn.started", {}), ("tool.completed", {})], [])


async def test_a_drive_that_read_the_turn_before_a_cancel_records_nothing_into_it(
    store_url: str,
) -> None:
    """A drive whose state predates a person's cancel (another process's, say) finds the cancel
    when its append conflicts, and records nothing into the cancelled turn."""
    async with so.Runtime([deploy_agent()], store=store_url) as rt:
        r = await rt.generate("ops", prompt="deploy api", auth=AL)
        sid = r.session_id
        stale = rt._driver((await rt.state(sid)).copy(), None)
        await rt.cancel(sid)
        before = await store_contents(rt.store, sid)
        with pytest.raises(TurnStopped):
            await stale.record([("turn.waiting", {"on": "input", "request_ids": []})])
        assert await store_contents(rt.store, sid) == before


async def test_the_commit_that_records_an_expiry_leaves_the_session_expired(store_url: str) -> None:
    """Recording a passed TTL sets the session's expiry to that moment, not a new TTL from it:
    the listing shows it failed and expired, never due to expire later."""
    now = [1_000_000.0]
    async with so.Runtime([ttl_agent()], store=store_url, clock=lambda: now[0]) as rt:
        r = await rt.generate("desk", prompt="reset")
        (row,) = await rt.sessions()
        assert row.expires_at == now[0] + 60
        now[0] += 120
        (row,) = await rt.sessions()
        assert row.id == r.session_id and row.status == "failed"
        assert row.expires_at is not None and row.expires_at <= now[0]


async def test_a_commit_that_closes_a_request_a_person_was_shown_is_synced(store_url: str) -> None:
    """A session whose TTL lapses with its approval open: channels show the close (Slack's
    message says Expired, a webhook receiver hears `request.resolved`, whose delivery id it
    dedupes on). Without a person answering, that commit skipped the sync, so a power cut
    could take back a close already shown."""
    postgres = not store_url.startswith("sqlite")
    if postgres:
        await watch_syncs(store_url)
    now = [1_000_000.0]
    async with so.Runtime([ttl_agent()], store=store_url, clock=lambda: now[0]) as rt:
        if isinstance(rt.store, SQLiteStore):
            synced = _trace_sqlite_syncs(rt.store)
        r = await rt.generate("desk", prompt="reset")
        assert r.status == "waiting"
        now[0] += 120
        await rt.sessions()  # reads the lapsed TTL, and records it
        events = [e async for e in rt.events(r.session_id, follow=False)]
    if postgres:
        synced = await _postgres_syncs(store_url)
    (closed,) = [e for e in events if e.type == "input.resolved"]
    assert closed.data["outcome"] == "expired" and synced[closed.seq]
    assert tells_a_person([("input.resolved", {"request_id": "req_1"})], [])
