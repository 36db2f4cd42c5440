"""Rows edited behind the runtime's back: a damaged event, session or request row is a named
store error.

Part of the one suite for the `Store` protocol (test_store_conformance.py and
test_store_{requests,leases,concurrency,runtime,edited_rows}.py): the `store` and `store_url`
fixtures in conftest.py run it against both backends.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff._exceptions import (
    StoreError,
)
from signoff.stores._codec import pack_bytes
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from ._procs import query

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
    """The log says a request is pending, its row says otherwise (or is gone): answering it, or
    cancelling its turn, is a StoreError naming both, not twenty retries ending in 'too much
    contention'; nothing is written, and the other session's answer goes through."""
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
        # A cancel, too (it said `SessionBusy`, "could not cancel", after its retries).
        with pytest.raises(StoreError, match=f"session '{one.session_id}' is damaged.*{rid}"):
            await rt.cancel(one.session_id, "stuck")
        assert session_rows(store_url, one.session_id) == before
        answer = so.InputResponse(request_id=two.pending[0].id, option_id="approve")
        assert (await rt.respond(two.session_id, [answer])).status == "completed"


async def test_a_damaged_request_row_is_named_by_its_id(store_url: str) -> None:
    """A request row whose own copy cannot be read fails the store's listings that read it: the
    error names the request, so the row can be found and mended (it said only "a stored
    document is not JSON", with every request of the queue to suspect); nothing is written.
    The queue people read leaves it out (test_listing_damaged_rows.py)."""
    async with so.Runtime([gated_agent()], store=store_url) as rt:
        one, _ = await parked_pair(rt)
        rid = one.pending[0].id
        edit(store_url, "UPDATE {t}requests SET data = {p} WHERE id = {p}", b"garbage", rid)
        before = session_rows(store_url, one.session_id)
        assert rid not in {r.id for r in await rt.pending()}
        for attempt in (
            lambda: rt.store.pending(so.stores.PendingFilter()),
            lambda: rt.store.get_request(rid),
        ):
            with pytest.raises(StoreError, match=f"request {rid}") as info:
                await attempt()
            # Damage, not a read that failed (a retry reads the same): no other StoreError.
            assert type(info.value) is so.StoreDamaged, info.value
        assert session_rows(store_url, one.session_id) == before


EVENT_DAMAGES = {
    "data that does not inflate": ("data", b"\x01not deflate"),
    "data that is not an object": ("data", pack_bytes([1, 2])),
    "a type code no signoff wrote": ("type", "?"),
}


@pytest.mark.parametrize("damage", [*EVENT_DAMAGES, "a snapshot that does not inflate"])
async def test_an_event_or_snapshot_that_cannot_be_read_back_is_store_damaged(
    store_url: str, damage: str
) -> None:
    """A stored event or snapshot that does not read back is `StoreDamaged` (reading it again
    gives the same), naming its session, from the store's reads and from a state's load; it
    was a plain `StoreError`, what a read that failed for a moment also raises. Nothing is
    written, and the other session goes on."""
    async with so.Runtime([gated_agent()], store=store_url) as rt:
        one, two = await parked_pair(rt)
        sid = one.session_id
        state = await rt.state(sid)
    of_session = "sk = (SELECT sk FROM {t}sessions WHERE id = {p})"
    if damage in EVENT_DAMAGES:
        column, value = EVENT_DAMAGES[damage]
        edit(
            store_url,
            f"UPDATE {{t}}events SET {column} = {{p}} WHERE seq = 2 AND {of_session}",
            value,
            sid,
        )
        reads: tuple[str, ...] = ("read_events", "load", "state")
    else:
        edit(
            store_url,
            "INSERT INTO {t}snapshots (sk, seq, data) SELECT sk, {p}, {p} FROM {t}sessions "
            "WHERE id = {p} ON CONFLICT (sk) DO UPDATE SET seq = excluded.seq, "
            "data = excluded.data",
            state.seq,
            b"\x01garbage",
            sid,
        )
        reads = ("load", "state")
    before = session_rows(store_url, sid)
    async with so.Runtime([gated_agent()], store=store_url) as fresh:  # nothing cached
        await fresh.open()
        attempts = {
            "read_events": lambda: fresh.store.read_events(sid),
            "load": lambda: fresh.store.load(sid),
            "state": lambda: fresh.state(sid),
        }
        for read in reads:
            with pytest.raises(StoreError, match=f"session '{sid}'") as info:
                await attempts[read]()
            assert type(info.value) is so.StoreDamaged, (read, info.value)
        answer = so.InputResponse(request_id=two.pending[0].id, option_id="approve")
        assert (await fresh.respond(two.session_id, [answer])).status == "completed"
    assert session_rows(store_url, sid) == before


@pytest.mark.parametrize(
    ("sql", "read"),
    [
        ("UPDATE events SET at = 'noon' WHERE seq = 2", "read_events"),
        ("UPDATE sessions SET head = 'x'", "load"),
        ("UPDATE leases SET token = 'x'", "acquire_lease"),
    ],
)
async def test_a_sqlite_row_of_the_wrong_types_is_store_damaged(
    tmp_path: Path, sql: str, read: str
) -> None:
    """SQLite keeps whatever a hand edit puts in a column: an event's time, a session row's head
    or its lease of the wrong type is `StoreDamaged` naming the session, as a number `kept`
    checks already was."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    async with so.Runtime([gated_agent()], store=url) as rt:
        one, _ = await parked_pair(rt)
    edit(url, sql)
    async with so.Runtime([gated_agent()], store=url) as fresh:
        await fresh.open()
        attempts = {
            "read_events": lambda: fresh.store.read_events(one.session_id),
            "load": lambda: fresh.store.load(one.session_id),
            "acquire_lease": lambda: fresh.store.acquire_lease(one.session_id, "me", 30.0, 0.0),
        }
        with pytest.raises(StoreError, match=f"session '{one.session_id}'") as info:
            await attempts[read]()
        assert type(info.value) is so.StoreDamaged, info.value


NOT_A_TIME = [
    ("sessions", "expires_at", -math.inf),
    ("sessions", "updated_at", -math.inf),
    ("sessions", "created_at", math.inf),
    ("sessions", "updated_at", math.nan),
    ("events", "at", math.inf),
    ("events", "at", math.nan),
]


@pytest.mark.parametrize(("table", "column", "value"), NOT_A_TIME)
async def test_a_time_that_is_no_finite_number_is_store_damaged(
    store_url: str, table: str, column: str, value: float
) -> None:
    """PostgreSQL keeps 'infinity' and 'NaN' in a `double precision` column, SQLite 9e999: such
    a time of a session row, or of an event, is `StoreDamaged` naming the session, as text there
    is (but a deadline of +infinity: `test_an_infinite_session_deadline_never_expires`). It
    was read as a number: the listing of every session failed its JSON (HTTP 500 for every
    caller), `signoff sessions` and `signoff events` their dates. Nothing is written, and the
    other session goes on."""
    if math.isnan(value) and store_url.startswith("sqlite"):
        pytest.skip("SQLite keeps NaN as NULL")
    async with so.Runtime([gated_agent()], store=store_url) as rt:
        one, two = await parked_pair(rt)
    sid = one.session_id
    if table == "sessions":
        edit(store_url, f"UPDATE {{t}}sessions SET {column} = {{p}} WHERE id = {{p}}", value, sid)
    else:  # its last event, which the session's state reads last
        edit(
            store_url,
            "UPDATE {t}events SET at = {p} WHERE sk = (SELECT sk FROM {t}sessions WHERE id = {p}) "
            "AND seq = (SELECT head FROM {t}sessions WHERE id = {p})",
            value,
            sid,
            sid,
        )
    before = session_rows(store_url, sid)
    async with so.Runtime([gated_agent()], store=store_url) as fresh:  # nothing cached
        await fresh.open()
        answer = so.InputResponse(request_id=one.pending[0].id, option_id="approve")
        if table == "sessions":
            # `fresh.sessions()` leaves it out (test_listing_damaged_rows.py)
            assert sid not in {s.id for s in await fresh.sessions()}
            attempts: list[Any] = [fresh.store.sessions, fresh.store.sessions_counted]  # type: ignore[attr-defined]
            if column == "expires_at":  # read with its requests too
                attempts.append(lambda: fresh.store.get_request(one.pending[0].id))
            named = f"session '{sid}' is damaged: its {column} is {value!r}"
        else:
            attempts = [
                lambda: fresh.store.read_events(sid),
                lambda: fresh.state(sid),
                lambda: fresh.respond(sid, [answer]),
            ]
            named = f"event '{sid}':\\d+ is malformed"
        for attempt in attempts:
            with pytest.raises(so.StoreDamaged, match=named):
                await attempt()
        answer = so.InputResponse(request_id=two.pending[0].id, option_id="approve")
        assert (await fresh.respond(two.session_id, [answer])).status == "completed"
    assert session_rows(store_url, sid) == before


async def test_an_infinite_session_deadline_never_expires(store_url: str) -> None:
    """A signoff before 7c6bc9b4 wrote `expires_at` +infinity for `Limits(ttl=math.inf)`, and an
    operator's `SET expires_at = 'infinity'` on PostgreSQL means as much: read as a session that
    never expires. Read as damage, it failed every caller's listing of sessions and every read of
    the session's requests (the request page, Slack, webhooks), until a commit healed the row."""
    async with so.Runtime([gated_agent()], store=store_url) as rt:
        one, two = await parked_pair(rt)
    sid = one.session_id
    edit(store_url, "UPDATE {t}sessions SET expires_at = {p} WHERE id = {p}", math.inf, sid)
    async with so.Runtime([gated_agent()], store=store_url) as fresh:  # nothing cached
        await fresh.open()
        listed = {s.id: s for s in await fresh.sessions()}
        assert listed[sid].expires_at is None and listed[sid].status == "waiting"
        stored = await fresh.store.get_request(one.pending[0].id)
        assert stored is not None and stored.session_expires_at is None
        answer = so.InputResponse(request_id=one.pending[0].id, option_id="approve")
        assert (await fresh.respond(sid, [answer])).status == "completed"
        assert two.session_id in listed


def rewrite_events(url: str, session_id: str, events: list[so.Event]) -> None:
    """Store each of `events` (of `session_id`) as its own plain document, kept on no event
    before it, so one of them can be changed alone."""
    for event in events:
        edit(
            url,
            "UPDATE {t}events SET data = {p} WHERE seq = {p} AND sk = "
            "(SELECT sk FROM {t}sessions WHERE id = {p})",
            pack_bytes(event.data),
            event.seq,
            session_id,
        )


def _ttl_text(data: dict[str, Any]) -> None:
    data["ttl"] = "3600"


def _no_agent(data: dict[str, Any]) -> None:
    data["agent"] = None


def _call_id_null(data: dict[str, Any]) -> None:
    data["tool_calls"][0]["id"] = None


@pytest.mark.parametrize(
    ("event_type", "damage"),
    [
        ("session.created", _ttl_text),
        ("session.created", _no_agent),
        ("model.completed", _call_id_null),
    ],
)
async def test_an_event_field_of_the_wrong_type_is_named_before_anything_is_written(
    store_url: str, event_type: str, damage: Any
) -> None:
    """An event a hand edit left readable, of its type, but with a field of the wrong type that
    the fold kept: a text `ttl` failed every read of the session with a bare TypeError, a null
    `agent` its page (500), and a null call id an answer with a bare ValidationError after the
    store held the approval settled and its request resolved, the session left `running`. Now
    its state is a `StoreError` naming the event, and answering writes nothing."""
    async with so.Runtime([gated_agent()], store=store_url) as rt:
        one, two = await parked_pair(rt)
        sid = one.session_id
        events = await rt.store.read_events(sid)
    target = next(e for e in events if e.type == event_type)
    damage(target.data)
    rewrite_events(store_url, sid, events)
    before = session_rows(store_url, sid)
    requests = query(store_url, "SELECT status FROM {t}requests WHERE id = {p}", one.pending[0].id)
    async with so.Runtime([gated_agent()], store=store_url) as fresh:  # nothing cached
        answer = so.InputResponse(request_id=one.pending[0].id, option_id="approve")
        for attempt in (lambda: fresh.state(sid), lambda: fresh.respond(sid, [answer])):
            malformed = rf"event {sid}:{target.seq} \({event_type}\) is malformed: TypeError"
            with pytest.raises(so.StoreError, match=malformed):
                await attempt()
        answer = so.InputResponse(request_id=two.pending[0].id, option_id="approve")
        assert (await fresh.respond(two.session_id, [answer])).status == "completed"
    assert session_rows(store_url, sid) == before
    assert query(store_url, "SELECT status FROM {t}requests WHERE id = {p}", one.pending[0].id) == (
        requests
    )


@pytest.mark.parametrize("damaged", ["event", "request"])
async def test_a_damaged_session_past_its_deadline_leaves_the_listing_of_the_others(
    store_url: str, damaged: str
) -> None:
    """A listing shows a session whose passed deadline no one recorded as recording would leave
    it, reading its state: one whose log does not read back (a newer signoff's event type, a
    hand edit) failed every caller's listing of sessions (`signoff sessions`, `GET /v1/sessions`,
    `rt.sessions()`). It is listed as the store holds it, the others as before."""

    @so.tool(approval=so.ApprovalSpec(request=so.always(), expires_in=60, on_timeout="deny"))
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return f"refunded {order_id}"

    steps = [call_tools(call("issue_refund", order_id="1")), reply("done")] * 2
    clock = ManualClock(1_700_000_000.0)
    agent = scripted_agent("support", steps, tools=[issue_refund])
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        one, two = await parked_pair(rt)
    sid = one.session_id
    if damaged == "event":
        edit(
            store_url,
            "UPDATE {t}events SET data = {p} WHERE sk = (SELECT sk FROM {t}sessions WHERE id = {p})"
            " AND seq = (SELECT head FROM {t}sessions WHERE id = {p})",
            b"\x01not deflate",
            sid,
            sid,
        )
    else:  # its request's row: that deadline is unread, its session shown as stored
        rid = one.pending[0].id
        edit(store_url, "UPDATE {t}requests SET data = {p} WHERE id = {p}", b"garbage", rid)
    clock.advance(61)
    async with so.Runtime([agent], store=store_url, clock=clock) as fresh:
        listed = {s.id: s.status for s in await fresh.sessions()}
        # The other as its passed deadline leaves it: a damaged request row of another session
        # once listed every deadline-freed session as `waiting` (review r14, 02849854).
        assert listed == {sid: "waiting", two.session_id: "running"}
        if damaged == "event":
            with pytest.raises(so.StoreError):
                await fresh.state(sid)
