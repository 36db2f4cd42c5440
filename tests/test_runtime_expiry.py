"""Session expiry through the public API: the TTL, activity that keeps a session alive, and
followers that meet the expiry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.testing import (
    ExecutionLog,
    ManualClock,
    reply,
    scripted_agent,
    sqlite_runtime,
)

from ._ttl import ttl_agent
from .test_runtime import ALICE, BOB, refund_agent, tools, types_of, waiting_session


async def test_session_ttl_expired_with_pending_requests(tmp_path: Path) -> None:
    log = ExecutionLog()
    clock = ManualClock()
    agent = refund_agent(log, limits=so.Limits(ttl=60))
    async with sqlite_runtime(tmp_path, agent, clock=clock) as rt:
        r = await waiting_session(rt)
        rid = r.pending[0].id
        clock.advance(59)
        assert (await rt.state(r.session_id)).pending_requests()[0].id == rid
        clock.advance(2)
    # reopened from another runtime (a new process) after the TTL passed
    async with sqlite_runtime(
        tmp_path, refund_agent(log, limits=so.Limits(ttl=60)), clock=clock
    ) as rt2:
        with pytest.raises(so.SessionExpired) as info:
            await rt2.generate(
                session_id=r.session_id, approvals=[so.Decision(id=rid, approved=True)]
            )
        assert info.value.session_id == r.session_id
        assert info.value.pending == [rid]
        assert rid in str(info.value)
        assert log.count() == 0
        assert await rt2.pending() == []  # the request is closed, not left dangling
        # still expired when reopened again: it does not silently start over
        with pytest.raises(so.SessionExpired):
            await rt2.generate(session_id=r.session_id, prompt="hello again")
        with pytest.raises((so.SessionExpired, so.RequestClosed)):
            await rt2.respond(r.session_id, [so.InputResponse(request_id=rid, option_id="approve")])
        assert log.count() == 0


async def test_cancel_of_a_session_past_its_ttl_is_session_expired(store_url: str) -> None:
    """A cancel after the TTL passed does not withdraw the parked turn's requests as if the
    session were live: it raises `SessionExpired`, and what is recorded is the expiry."""
    log = ExecutionLog()
    clock = ManualClock()
    agent = refund_agent(log, limits=so.Limits(ttl=60))
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        r = await waiting_session(rt)
        rid = r.pending[0].id
        clock.advance(61)
        with pytest.raises(so.SessionExpired) as info:
            await rt.cancel(r.session_id, "too late")
        assert (info.value.session_id, info.value.pending) == (r.session_id, [rid])
        types = await types_of(rt, r.session_id)
        assert "turn.cancelled" not in types and types[-1] == "turn.failed"
        stored = await rt.store.get_request(rid)
        assert stored is not None and stored.status == "expired"
        with pytest.raises(so.SessionExpired):
            await rt.cancel(r.session_id)
        assert await types_of(rt, r.session_id) == types
        assert log.count() == 0


async def test_session_ttl_timedelta_and_activity_keeps_it_alive(tmp_path: Path) -> None:
    from datetime import timedelta

    log = ExecutionLog()
    clock = ManualClock()
    agent = scripted_agent(
        "a",
        [reply("one"), reply("two")],
        tools=tools(log),
        limits=so.Limits(ttl=timedelta(minutes=1)),
    )
    async with sqlite_runtime(tmp_path, agent, clock=clock) as rt:
        sid = (await rt.generate("a", prompt="hi")).session_id
        clock.advance(50)
        assert (await rt.generate(session_id=sid, prompt="still there?")).text == "two"
        clock.advance(50)  # 100 s after creation, 50 s after the last activity
        assert (await rt.state(sid)).expired(clock()) is False


async def test_activity_in_another_process_keeps_the_session_alive_for_this_one(
    tmp_path: Path,
) -> None:
    """A runtime whose cached state of a session is older than the TTL must not expire it
    when another process has used the session since."""
    clock = ManualClock()

    def agent() -> so.Agent:
        return scripted_agent(
            "a", [reply("one"), reply("two"), reply("three")], tools=[], limits=so.Limits(ttl=60)
        )

    async with sqlite_runtime(tmp_path, agent(), clock=clock) as here:
        sid = (await here.generate("a", prompt="hi")).session_id
        clock.advance(50)
        async with sqlite_runtime(tmp_path, agent(), clock=clock) as elsewhere:
            assert (await elsewhere.generate(session_id=sid, prompt="again")).text == "two"
        clock.advance(50)  # 100 s after this runtime last saw it, 50 s after the last activity
        done = await here.generate(session_id=sid, prompt="still there?")
        assert done.status == "completed"


async def test_a_follower_reads_the_expiry_it_meets_before_it_raises(tmp_path: Path) -> None:
    """README: a followed session raises `SessionExpired` after its last event, and an expiry
    that caught the turn unfinished is in the log. The follower that meets the expiry records
    it and yields it (the request expired, the turn failed for good) before raising, instead of
    raising on a log that still shows the turn waiting."""
    import asyncio

    now = [1_000_000.0]
    async with so.Runtime(
        [ttl_agent()], store=f"sqlite:///{tmp_path}/s.db", clock=lambda: now[0], poll_interval=0.01
    ) as rt:
        r = await rt.generate("desk", prompt="reset")
        seen: list[so.Event] = []

        async def follow() -> None:
            async for event in rt.events(r.session_id):
                seen.append(event)

        task = asyncio.create_task(follow())
        await asyncio.sleep(0.1)
        now[0] += 120
        with pytest.raises(so.SessionExpired) as info:
            await asyncio.wait_for(task, 5)
        assert info.value.pending == [r.pending[0].id]
        assert [(e.type, e.data.get("status")) for e in seen[-2:]] == [
            ("input.resolved", "expired"),
            ("turn.failed", None),
        ]
        assert seen[-1].data["error"]["code"] == "session_expired"


async def test_a_follower_waits_one_tick_before_the_expiry_and_raises_at_it(
    tmp_path: Path,
) -> None:
    """The boundary of a followed session's expiry, on the runtime's clock: one tick before
    its `expires_at` the follower keeps waiting for events; at it, it raises `SessionExpired`."""
    import asyncio
    import math

    now = [1_000_000.0]
    async with so.Runtime(
        [ttl_agent()], store=f"sqlite:///{tmp_path}/s.db", clock=lambda: now[0], poll_interval=0.01
    ) as rt:
        r = await rt.generate("desk", prompt="reset")
        state = await rt.state(r.session_id)
        expires = state.expires_at
        assert expires == now[0] + 60
        now[0] = math.nextafter(expires, -math.inf)
        seen: list[int] = []

        async def follow() -> None:
            async for event in rt.events(r.session_id):
                seen.append(event.seq)

        task = asyncio.create_task(follow())
        await asyncio.sleep(0.1)  # ten polls, each finding the session live
        assert not task.done() and seen == list(range(1, state.seq + 1))
        now[0] = expires
        with pytest.raises(so.SessionExpired) as info:
            await asyncio.wait_for(task, 5)
        assert info.value.pending == [r.pending[0].id]


async def test_following_a_session_ends_when_it_expires_or_is_deleted(tmp_path: Path) -> None:
    """A followed session that can have no more events (its TTL passed, or its rows were
    deleted) used to be waited on for ever: `rt.events(follow=True)` now yields every event,
    then raises `SessionExpired` (naming the requests the expiry closes) or `UnknownSession`."""
    import asyncio
    import sqlite3

    import signoff._event_stream as event_stream

    now = [1_000_000.0]

    agent = ttl_agent(repeat_last=True)
    path = tmp_path / "ttl.db"
    async with so.Runtime(
        [agent], store=f"sqlite:///{path}", clock=lambda: now[0], poll_interval=0.01
    ) as rt:
        r = await rt.generate("desk", prompt="reset")

        first: list[int] = []

        async def follow() -> None:
            async for event in rt.events(r.session_id):
                first.append(event.seq)

        task = asyncio.create_task(follow())
        await asyncio.sleep(0.1)
        assert not task.done()  # live: waiting for events
        now[0] += 120
        with pytest.raises(so.SessionExpired) as info:
            await asyncio.wait_for(task, 5)
        assert info.value.pending == [r.pending[0].id]
        assert first == list(range(1, (await rt.state(r.session_id)).seq + 1))

        other = await rt.generate("desk", prompt="reset again")
        seen: list[int] = []

        async def collect() -> None:
            async for event in rt.events(other.session_id):
                seen.append(event.seq)

        event_stream._RECHECK_FOLLOWED, before = 0.05, event_stream._RECHECK_FOLLOWED
        try:
            task = asyncio.create_task(collect())
            await asyncio.sleep(0.1)
            with sqlite3.connect(path) as db:  # an operator removes the session
                sk = db.execute(
                    "SELECT sk FROM sessions WHERE id=?", (other.session_id,)
                ).fetchone()[0]
                for table in ("events", "snapshots", "requests", "leases", "audit"):
                    db.execute(f"DELETE FROM {table} WHERE sk=?", (sk,))
                db.execute("DELETE FROM sessions WHERE sk=?", (sk,))
            with pytest.raises(so.UnknownSession):
                await asyncio.wait_for(task, 5)
        finally:
            event_stream._RECHECK_FOLLOWED = before
        assert seen and seen == list(range(1, len(seen) + 1))


async def test_sessions_filtered_by_status_as_shown_when_ttl_unrecorded(store_url: str) -> None:
    """A runtime without the session's agent cannot record its passed TTL, so it lists the
    session as `failed`: the `failed` filter must find it there, and `waiting` must not (it
    was in neither, so a filtered listing disagreed with the unfiltered one)."""
    log = ExecutionLog()
    clock = ManualClock()
    agent = refund_agent(log, limits=so.Limits(ttl=60))
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        lapsing = await waiting_session(rt)
        clock.advance(30)
        live = await waiting_session(rt)
        clock.advance(31)  # the first one's TTL passed, the second's not
    async with so.Runtime([], store=store_url, clock=clock) as reader:
        shown = {s.id: s.status for s in await reader.sessions()}
        assert shown == {lapsing.session_id: "failed", live.session_id: "waiting"}
        failed = await reader.sessions(status="failed")
        assert [s.id for s in failed] == [lapsing.session_id]
        waiting = await reader.sessions(status="waiting")
        assert [s.id for s in waiting] == [live.session_id]
        assert [s.id for s in await reader.sessions(status="waiting", limit=1)] == [live.session_id]
        assert await reader.sessions(status="waiting", offset=1) == []
        assert await reader.sessions(status="failed", offset=1) == []


async def test_a_state_read_without_the_agent_shows_the_ttl_passed(store_url: str) -> None:
    """A runtime without the session's agent cannot record its passed TTL, and its `rt.state`
    showed the session `waiting` on a request no one can answer any more, while its listing
    and queue showed it failed and the request gone. It shows the state as recording the
    expiry leaves it (the turn failed for good, the request expired), writing nothing, and
    the same as the agent's runtime reads once it recorded it."""
    log = ExecutionLog()
    clock = ManualClock()
    agent = refund_agent(log, limits=so.Limits(ttl=60))
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        r = await waiting_session(rt)
        rid = r.pending[0].id
    clock.advance(61)
    other = refund_agent(log, name="other")
    async with so.Runtime([other], store=store_url, clock=clock) as reader:
        before = await types_of(reader, r.session_id)
        shown = await reader.state(r.session_id)
        assert (shown.status, shown.pending_requests()) == ("failed", [])
        assert shown.turn is not None and shown.turn.error is not None
        assert (shown.turn.error["code"], shown.turn.retryable) == ("session_expired", False)
        assert shown.requests[rid].status == "expired"
        assert shown.expired(clock()) and shown.seq == len(before)
        assert [s.status for s in await reader.sessions()] == ["failed"]  # as listed
        assert await types_of(reader, r.session_id) == before  # a read: nothing recorded
        stored = await reader.store.get_request(rid)
        assert stored is not None and stored.status == "pending"
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        recorded = await rt.state(r.session_id)
        assert await types_of(rt, r.session_id) == [*before, "input.resolved", "turn.failed"]
    assert recorded.status == shown.status and recorded.turn is not None
    assert (recorded.turn.status, recorded.turn.error) == ("failed", shown.turn.error)
    assert {k: (v.status, v.outcome) for k, v in recorded.requests.items()} == {
        k: (v.status, v.outcome) for k, v in shown.requests.items()
    }
    assert log.count() == 0


async def test_a_state_read_whose_store_refuses_the_expiry_shows_it(store_url: str) -> None:
    """A store refusing the write that records a passed TTL (one this process may only read)
    left `rt.state` showing the session `waiting` on a request no one can answer any more,
    as its listing did not: it is shown as recording leaves it, and recorded once it can be."""
    clock = ManualClock()
    agent = refund_agent(ExecutionLog(), limits=so.Limits(ttl=60))
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        r = await waiting_session(rt)
        clock.advance(61)

        async def refused(*args: Any, **kwargs: Any) -> None:
            raise so.StoreError("the store is read-only to this process")

        rt.store.commit = refused  # type: ignore[method-assign]
        try:
            shown = await rt.state(r.session_id)
            assert (shown.status, shown.pending_requests()) == ("failed", [])
            assert [s.status for s in await rt.sessions()] == ["failed"]
        finally:
            del rt.store.commit
        assert (await types_of(rt, r.session_id))[-1] == "turn.waiting"  # nothing recorded
        assert (await rt.state(r.session_id)).status == "failed"
        assert (await types_of(rt, r.session_id))[-2:] == ["input.resolved", "turn.failed"]


async def test_a_state_read_without_the_agent_keeps_a_message_queued_behind_the_expiry(
    store_url: str,
) -> None:
    """A message another person sent while the turn waited is queued behind it; once the TTL
    passed, a runtime without the agent showed the session `running` (the queued message as if
    it could start), while its listing and the agent's runtime, once it recorded the expiry,
    said `failed`: the TTL's failure starts no queued message, shown or recorded."""
    log = ExecutionLog()
    clock = ManualClock()
    agent = refund_agent(log, limits=so.Limits(ttl=60))
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        r = await waiting_session(rt, auth=ALICE)
        assert (await rt.send(r.session_id, "and order 2", principal=BOB)).queued
    clock.advance(61)
    async with so.Runtime(
        [refund_agent(log, name="other")], store=store_url, clock=clock
    ) as reader:
        before = await types_of(reader, r.session_id)
        shown = await reader.state(r.session_id)
        assert (shown.status, shown.turn_status, len(shown.queued)) == ("failed", "failed", 1)
        [row] = await reader.sessions()
        assert (row.status, row.expires_at) == ("failed", shown.expires_at)  # the store's
        assert await types_of(reader, r.session_id) == before
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        recorded = await rt.state(r.session_id)
        assert await types_of(rt, r.session_id) == [*before, "input.resolved", "turn.failed"]
    assert recorded.turn is not None and shown.turn is not None
    assert (recorded.status, recorded.turn.id, len(recorded.queued)) == (
        "failed",
        shown.turn.id,
        1,
    )
    assert log.count() == 0


async def test_a_seq_past_the_log_is_refused_not_followed(store_url: str) -> None:
    """`rt.events(after=N)` with N past the session's last event matched no event: followed, it
    waited in silence and would skip every event up to N, and once the TTL passed it spun on
    the store without yielding to the event loop, freezing the process. It is refused, as the
    HTTP stream and `signoff events --after` refuse it; the last seq itself is still followed."""
    import asyncio

    now = [1_000_000.0]
    async with so.Runtime(
        [ttl_agent()], store=store_url, clock=lambda: now[0], poll_interval=0.01
    ) as rt:
        r = await rt.generate("desk", prompt="reset")
        head = (await rt.state(r.session_id)).seq
        for follow in (True, False):
            events = rt.events(r.session_id, head + 1, follow=follow)
            with pytest.raises(so.UsageError, match=rf"past the session's last event \({head}\)"):
                await asyncio.wait_for(anext(events), 2)
        followed = rt.events(r.session_id, head)
        waiting = asyncio.ensure_future(anext(followed))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # caught up: it waits for the next event
        now[0] += 120
        with pytest.raises(so.SessionExpired):
            await asyncio.wait_for(_drain(waiting, followed), 5)


async def _drain(first: Any, rest: Any) -> None:
    """Await `first`, then read `rest` to its end."""
    await first
    async for _ in rest:
        pass
