"""Reads on both stores: where a read bounded by size stops, and a request read from the event
holding it however that event is stored."""

from __future__ import annotations

import pytest

import signoff as so
from signoff._audit_trail import verify as verify_trail
from signoff._events import dumps
from signoff.stores import Commit, Store


async def test_a_read_by_size_stops_at_the_event_that_reaches_it(store: Store) -> None:
    """The read stops after the event that brings the JSON read to `max_bytes`, not one later,
    on either store; a bound between two events reads the one crossing it."""
    sid = "ses_sized"
    events = [
        so.Event(session_id=sid, seq=seq, type="turn.message", at=float(seq), data={"t": "x" * 40})
        for seq in range(1, 6)
    ]
    await store.create_session(sid, "a", events, None)
    size = len(dumps(events[0].data))
    for bound, count in [(2 * size, 2), (2 * size + 1, 3), (1, 1), (5 * size, 5)]:
        read = await store.read_events(sid, max_bytes=bound)
        assert [e.seq for e in read] == list(range(1, count + 1)), bound


async def test_a_request_held_by_an_event_two_deep_in_a_chain_reads_back(store: Store) -> None:
    """A request row with no copy reads its request from the `input.requested` event, which may
    be stored on the event before it and that one on the one before (`CHAIN_MAX`): the read
    joins each at its own place, on either store, and the trail verifies."""
    sid = "ses_chained"
    big = {"path": "notes.txt", "text": " ".join(f"line {i} of the letter" for i in range(200))}
    action = so.Action(call_id="call_1", tool_name="send", input=big, input_hash="sha256:0")
    request = so.InputRequest(
        kind="tool-approval",
        id="req_chained",
        session_id=sid,
        turn_id="trn_1",
        agent="a",
        action=action,
        created_at=4.0,
    )
    asked = {"requests": [request.model_dump(mode="json", exclude_defaults=True)]}
    events = [
        so.Event(session_id=sid, seq=1, type="session.created", at=1.0, data={}),
        so.Event(session_id=sid, seq=2, type="model.completed", at=2.0, data={"n": 1, **asked}),
        so.Event(session_id=sid, seq=3, type="model.completed", at=3.0, data={"n": 2, **asked}),
        so.Event(session_id=sid, seq=4, type="input.requested", at=4.0, data=asked),
    ]
    await store.create_session(sid, "a", events[:1], None)
    await store.commit(
        Commit(session_id=sid, expected_seq=1, events=events[1:], new_requests=[request])
    )
    found = await store.get_request(request.id)
    assert found is not None and found.request == request
    assert await verify_trail(store, stream=sid) == []


async def test_a_session_listing_of_the_wrong_kind_is_refused_alike_by_either_store(
    store: Store,
) -> None:
    """SQLite matched `agent=5` as the text '5' where psycopg raised a bare TypeError, and took
    a negative limit as none where PostgreSQL refused it with a StoreError: each store refuses
    such a listing with the same UsageError, before reading anything."""
    event = so.Event(session_id="ses_listed", seq=1, type="turn.message", at=1.0, data={})
    await store.create_session("ses_listed", "a", [event], None)
    wrong: list[tuple[dict[str, object], str]] = [
        ({"agent": 5}, "agent must be text or None, not 5"),
        ({"status": b"idle"}, "status must be text or None"),
        ({"agent": "a\ud800"}, "agent is not valid Unicode text"),
        ({"limit": -1}, "limit must be a whole number from 0"),
        ({"offset": -1}, "offset must be a whole number from 0"),
        ({"limit": "5"}, "limit must be a whole number from 0"),
    ]
    for given, message in wrong:
        with pytest.raises(so.UsageError, match=message):
            await store.sessions(**given)  # type: ignore[arg-type]
        counted = {k: v for k, v in given.items() if k in ("agent", "status")}
        if counted:
            with pytest.raises(so.UsageError, match=message):
                await store.count_sessions(**counted)  # type: ignore[arg-type]
    assert [s.id for s in await store.sessions(agent="a", limit=5)] == ["ses_listed"]
    assert await store.count_sessions(agent="a") == 1


@pytest.mark.parametrize(
    ("bound", "value"),
    [
        ("newest", 2**63),
        ("limit", 2**64),
        ("max_bytes", -1),
        ("after", 2**63),
        ("newest", True),
        ("limit", 1.5),
    ],
)
async def test_a_read_bound_no_store_takes_is_refused_alike(
    store: Store, bound: str, value: object
) -> None:
    """A read's bounds are whole numbers of 64 bits on either store, else `UsageError`: past
    that SQLite raised a bare OverflowError and PostgreSQL an SQL error blamed on the store."""
    sid = "ses_bounds"
    event = so.Event(session_id=sid, seq=1, type="session.created", at=1.0, data={})
    await store.create_session(sid, "a", [event], None)
    with pytest.raises(so.UsageError, match=bound):
        await store.read_events(sid, **{bound: value})  # type: ignore[arg-type]
    assert [e.seq for e in await store.read_events(sid, newest=2**63 - 1)] == [1]
