"""A runtime's cached session state once the store lost commits it had folded and another
process wrote those seqs again: the normal recovery after a PostgreSQL crash, which loses the
commits made with `synchronous_commit=off` (a model's reply, a turn's end), when a worker resumes
the turn. The cache is checked by the last event it folded, not its seq alone, so it is dropped
and the session read as stored; a commit planned on it is refused the same way.

The crash is simulated without killing the server: the store is copied right after the last
commit a crash would keep (the turn's start, synced), and put back over the store once the lost
commits are made (`_copy`), as a crash leaves it: every table as of that commit."""

from __future__ import annotations

from typing import Any

import pytest

import signoff as so
from signoff._recording import load_state
from signoff._state import fold
from signoff.stores import Commit
from signoff.stores.postgres import PostgresStore
from signoff.testing import Capture, call, call_tools, reply, scripted_agent

from .conftest import make_store
from .test_engine_lost_commits import _copy


@so.tool
async def noop() -> str:
    """Nothing."""
    return "ok"


def _texts(messages: list[so.Message]) -> list[str]:
    """What the people and the model said (not the model's tool calls, nor their results)."""
    return [
        m.text for m in messages if isinstance(m, so.UserMessage | so.AssistantMessage) and m.text
    ]


@pytest.mark.parametrize("read_first", [True, False], ids=["state", "message"])
@pytest.mark.parametrize("longer", [False, True], ids=["same_head", "past_it"])
async def test_a_cached_state_is_not_used_once_its_events_were_lost_and_written_again(
    store_url: str, longer: bool, read_first: bool
) -> None:
    """Runtime `a` drives a turn (its reply "A one" cached), the crash loses it, and runtime `b`
    resumes the turn from what is stored ("B one", with a tool call first when `longer`, so the
    store's head passes the seq `a` cached). `a.state()` showed "A one" where the heads were
    equal, and folded `b`'s events onto it where they were not; `a`'s next message (read first
    or not) sent the model a conversation holding "A one", which the log does not."""
    front = so.Runtime([scripted_agent("a", [])], store=store_url, inline=False)
    seen = Capture(reply("A two"))
    a = so.Runtime([scripted_agent("a", [reply("A one"), seen, seen])], store=store_url)
    b_steps = [call_tools(call("noop")), reply("B one")] if longer else [reply("B one")]
    b = so.Runtime([scripted_agent("a", b_steps, tools=[noop])], store=store_url)
    async with front, a, b:
        sid = (await front.generate("a", prompt="one")).session_id
        put_back = await _copy(store_url)  # the turn's start, which a crash keeps
        assert (await a.generate(session_id=sid)).text == "A one"
        cached = await a.state(sid)
        await put_back()  # the crash: the commits of `a`'s drive are lost
        assert (await b.generate(session_id=sid)).text == "B one"
        head = await b.store.head(sid)
        assert head is not None and (head > cached.seq if longer else head == cached.seq)
        if read_first:
            stored = fold(await b.store.read_events(sid))
            state = await a.state(sid)
            assert state.turn is not None and state.turn.text == "B one"
            assert state.to_snapshot() == stored.to_snapshot()
        assert (await a.generate(session_id=sid, prompt="two")).text == "A two"
        assert _texts(seen.last) == ["one", "B one", "two"]
        log = await a.store.read_events(sid)
        assert [e.data["text"] for e in log if e.type == "model.completed"][-2:] == [
            "B one",
            "A two",
        ]


async def test_a_head_read_and_a_commit_check_the_event_they_are_given(store_url: str) -> None:
    """`Store.head(shown=)` raises `EventsRewritten` unless the event at `shown.seq` is that one
    (same type, time and turn), and a commit given `expected_event` is refused with
    `AppendConflict` unless the head event is that one, writing nothing."""
    store = make_store(store_url)
    await store.open()
    try:
        sid = "ses_shown"

        def event(seq: int, at: float, kind: Any = "session.waiting") -> so.Event:
            return so.Event(session_id=sid, seq=seq, type=kind, at=at, data={})

        first = event(1, 1.0, "session.created")
        await store.create_session(sid, "a", [first], None)
        assert await store.head(sid, shown=first) == 1
        for other in (event(1, 1.5, "session.created"), event(1, 1.0), event(2, 1.0)):
            with pytest.raises(so.EventsRewritten):
                await store.head(sid, shown=other)
        refused = Commit(
            session_id=sid, expected_seq=1, events=[event(2, 2.0)], expected_event=event(1, 1.0)
        )
        with pytest.raises(so.AppendConflict, match="written again"):
            await store.commit(refused)
        assert await store.head(sid) == 1
        second = event(2, 2.0)
        await store.commit(
            Commit(session_id=sid, expected_seq=1, events=[second], expected_event=first)
        )
        assert await store.head(sid, shown=second) == 2
    finally:
        await store.close()


async def test_a_lease_grant_checks_the_event_at_the_head_it_read(pg: PostgresStore) -> None:
    """PostgreSQL's grant answers the session's head with the lease, so a drive needs no round
    trip to read it: the head is given only if the event a cached state ends at (`shown`) is
    the one the grant found there, else None, and the drive reads it (`Store.head(shown=)`)."""
    sid = "ses_granted"
    created = so.Event(session_id=sid, seq=1, type="session.created", at=1.0, data={})
    await pg.create_session(sid, "a", [created], None)
    started = so.Event(session_id=sid, seq=2, type="turn.started", at=2.0, turn_id="trn_1")
    await pg.commit(Commit(session_id=sid, expected_seq=1, events=[started], status="running"))
    again = so.Event(session_id=sid, seq=2, type="turn.started", at=2.5, turn_id="trn_1")
    for shown, head in ((started, 2), (again, None), (created, 2), (None, 2)):
        token = await pg.acquire_lease(sid, "w1", 10, 100.0)
        assert token is not None
        assert pg.granted_head(sid, token, shown=shown) == head
        await pg.release_lease(sid, "w1", token)
    ((_, token),) = await pg.claim("w2", 10, 100.0, 10)
    assert pg.granted_head(sid, token, shown=again) is None


async def test_a_state_from_an_older_snapshot_at_the_head_reads_its_last_event(
    store_url: str,
) -> None:
    """An older signoff's snapshot keeps no last event: a state loaded from one at the head (no
    event after it to fold) reads that event, so the state can be checked like any other."""
    store = make_store(store_url)
    await store.open()
    try:
        sid = "ses_older"
        data = {"agent": "a"}
        created = so.Event(session_id=sid, seq=1, type="session.created", at=1.0, data=data)
        await store.create_session(sid, "a", [created], None)
        waiting = so.Event(session_id=sid, seq=2, type="session.waiting", at=2.0)
        older = {k: v for k, v in fold([created, waiting]).to_snapshot().items() if k != "last"}
        await store.commit(Commit(session_id=sid, expected_seq=1, events=[waiting], snapshot=older))
        state = await load_state(store, sid)
        assert state.seq == 2 and state.shown() == waiting
    finally:
        await store.close()
