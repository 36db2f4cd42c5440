"""`Runtime.delete_session`: a finished session and its subagents' sessions erased from either
store in one transaction, recorded and chained in the audit stream `store:deletions`; a live
one (running, waiting on people), a subagent's and an unknown one refused with nothing changed;
readers of a deleted session (listings, followers, trails) told it is unknown."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import pytest

import signoff as so
from signoff import _child_closes, _child_sessions
from signoff.stores import _deletions
from signoff.stores._codec import pack
from signoff.stores._deletions import DELETIONS_STREAM
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from ._audit import alter
from ._subagents import Counted, refund_agents
from .conftest import make_store
from .test_subagents_spend import orders, support, tokens, waiting_child

ALICE = so.Principal(authenticator="test", principal_id="alice")
OPS = so.Principal(authenticator="test", principal_id="ops")


def chat() -> so.Agent:
    """An agent answering every message, and asking for approval of a refund when told to."""

    @so.tool(approval=so.always())
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    return scripted_agent(
        "chat",
        [
            lambda conv: (
                call_tools(call("refund", order_id="7"))
                if "refund" in str(conv[-1])
                else so.ModelResponse(text="hello")
            )
        ],
        tools=[refund],
        repeat_last=True,
    )


def chat_with_ttl() -> so.Agent:
    """`chat` whose sessions expire 60 s after they start; its first reply asks for a refund."""
    return scripted_agent(
        "chat",
        [call_tools(call("refund", order_id="7"))],
        tools=list(chat().tools.values()),
        limits=so.Limits(ttl=60),
    )


def agents() -> list[so.Agent]:
    return [chat(), support(), orders(tokens(40))]


async def _rows(url: str) -> dict[str, int]:
    """How many rows each table of the store holds (sessions, events, ...)."""
    store = make_store(url)
    await store.open()
    try:
        counts: dict[str, int] = {}
        tables = ("sessions", "events", "snapshots", "requests", "leases")
        if url.startswith("sqlite"):
            conn = store.conn  # type: ignore[attr-defined]
            for t in tables:
                counts[t] = conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
            counts["session audit"] = conn.execute(
                "SELECT COUNT(*) FROM audit WHERE sk IS NOT NULL"
            ).fetchone()[0]
        else:
            s = store._s  # type: ignore[attr-defined]

            async def body(conn: Any) -> None:
                for t in tables:
                    cur = await conn.execute(f"SELECT COUNT(*) FROM {s}.{t}")
                    counts[t] = (await cur.fetchone())[0]
                cur = await conn.execute(f"SELECT COUNT(*) FROM {s}.audit WHERE sk IS NOT NULL")
                counts["session audit"] = (await cur.fetchone())[0]

            await store._read(body, "counting")  # type: ignore[attr-defined]
        return counts
    finally:
        await store.close()


async def test_a_finished_session_and_its_subagents_are_deleted_whole(store_url: str) -> None:
    async with so.Runtime(agents(), store=store_url) as rt:
        kept = (await rt.generate("chat", prompt="hi", auth=ALICE)).session_id
        before = await _rows(store_url)
        parent, child = await waiting_child(rt)
        await rt.cancel(parent, principal=ALICE)
        heads = {sid: (await rt.audit(sid))[-1] for sid in (parent, child)}
        closes = {
            sid: [
                {"id": e.data["request_id"], "closed": e.id}
                for e in await rt.audit(sid)
                if e.type == "input.resolved"
            ]
            for sid in (parent, child)
        }
        assert len(closes[child]) == 1 and len(closes[parent]) == 1  # its own, and the mirror
        deleted = await rt.delete_session(parent, by=OPS, reason="GDPR erasure #12")
        assert deleted == [parent, child]
        for sid in (parent, child):
            with pytest.raises(so.UnknownSession):
                await rt.state(sid)
            with pytest.raises(so.UnknownSession):
                await rt.audit(sid)
            with pytest.raises(so.UnknownSession):
                await rt.verify_audit(sid)
            with pytest.raises(so.UnknownSession):
                [e async for e in rt.events(sid, follow=False)]
        assert [s.id for s in await rt.sessions()] == [kept]
        assert await rt.pending() == []
        assert await rt.verify_audit() == []
        [entry] = await rt.audit(stream=DELETIONS_STREAM)
        assert entry.type == "session.deleted" and entry.n == 1
        assert entry.data["session_id"] == parent
        assert entry.data["by"] == OPS.model_dump()
        assert entry.data["reason"] == "GDPR erasure #12"
        recorded = {d["id"]: d for d in entry.data["sessions"]}
        assert set(recorded) == {parent, child}
        for sid, last in heads.items():
            assert recorded[sid]["audit_n"] == last.n
            assert recorded[sid]["audit_hash"] == last.hash
        # The requests channels may show, each with the entry that closed it, for the hubs
        # that never read that entry: the child's own; its mirror on the parent is not shown.
        assert recorded[child]["requests"] == closes[child]
        assert recorded[parent]["requests"] == []
        assert await rt.verify_audit(DELETIONS_STREAM) == []
        with pytest.raises(so.UnknownSession):
            await rt.delete_session(parent)  # twice: the second finds nothing
    assert await _rows(store_url) == before  # nothing of either left behind


def refunds() -> so.Agent:
    """An agent asking for approval of a refund of the order its message names last."""

    @so.tool(approval=so.always())
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    def asks(conv: Any) -> so.ModelResponse:
        if isinstance(conv[-1], so.ToolResultMessage):
            return so.ModelResponse(text="done")
        return call_tools(call("refund", order_id=conv[-1].text.split()[-1]))

    return scripted_agent("refunds", [asks], tools=[refund], repeat_last=True)


async def test_the_entry_names_each_request_erased_and_the_entry_that_closed_it(
    store_url: str,
) -> None:
    """A session's requests, each closed by an entry the deletion erases with it, are named in
    the deletion's entry with the id of that entry, in the order they closed; one a forced
    deletion erases open is named with none. A hub that never read a close (erased before it
    did) tells its channels from this entry. The trail still verifies."""
    async with so.Runtime([*agents(), refunds()], store=store_url) as rt:
        a = await rt.generate("refunds", prompt="refund 7", auth=ALICE)
        [first] = a.pending
        approve = so.InputResponse(request_id=first.id, option_id="approve")
        a = await rt.respond(a.session_id, [approve], principal=ALICE)
        a = await rt.generate(session_id=a.session_id, prompt="refund 8", auth=ALICE)
        [second] = a.pending
        await rt.cancel(a.session_id, principal=ALICE, reason="wrong order")
        closed = {
            e.data["request_id"]: e.id
            for e in await rt.audit(a.session_id)
            if e.type == "input.resolved"
        }
        assert set(closed) == {first.id, second.id}
        b = await rt.generate("refunds", prompt="refund 9", auth=ALICE)
        await rt.delete_session(a.session_id, by=OPS)
        await rt.delete_session(b.session_id, by=OPS, force=True)
        one, two = await rt.audit(stream=DELETIONS_STREAM)
        [erased] = one.data["sessions"]
        assert erased["requests"] == [
            {"id": first.id, "closed": closed[first.id]},
            {"id": second.id, "closed": closed[second.id]},
        ]
        [forced] = two.data["sessions"]
        assert forced["requests"] == [{"id": b.pending[0].id, "closed": None}]
        assert await rt.verify_audit() == []


def test_the_entry_names_at_most_max_erased_the_open_and_the_last_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A session of 100,000 requests made one entry of megabytes, read by every hub: the
    entry names the open ones and those closed last, `MAX_ERASED` in all."""
    monkeypatch.setattr(_deletions, "MAX_ERASED", 3)
    own = pack({"id": "x", "kind": "tool-approval"})
    rows = [("ses_a", f"req_{i}", own, None, None, "settled") for i in range(5)]
    rows.append(("ses_b", "req_open", own, None, None, "pending"))
    mirror = pack({"id": "m", "child": {"session_id": "ses_c", "call_id": "c"}})
    rows.append(("ses_b", "req_mirror", mirror, None, None, "pending"))
    closes = [(10 + i, pack({"request_id": f"req_{i}"})) for i in range(5)]
    found = _deletions.erased_requests(rows, closes)
    assert found == {
        "ses_a": [{"id": "req_3", "closed": 13}, {"id": "req_4", "closed": 14}],
        "ses_b": [{"id": "req_open", "closed": None}],
    }


async def test_the_entry_goes_past_every_id_the_trail_gave(store_url: str) -> None:
    """Deleting the session whose entries are the newest: the deletion's entry, and the ones
    after it, take ids past all given before. SQLite numbered them from the highest kept, the
    erased entries' ids again, which a hub that had read the erased ones had passed: it never
    read the deletion, nor the next request opened (its position past their ids)."""
    async with so.Runtime([*agents(), refunds()], store=store_url) as rt:
        r = await rt.generate("refunds", prompt="refund 7", auth=ALICE)
        await rt.cancel(r.session_id, principal=ALICE)
        top = (await rt.store.audit(after_id=0, limit=10_000))[-1].id
        await rt.delete_session(r.session_id)
        await rt.generate("refunds", prompt="refund 8", auth=ALICE)
        after = await rt.store.audit(after_id=0, limit=10_000)
        assert [e.type for e in after if e.id > top] == ["session.deleted", "input.requested"]


async def test_deletions_chain_and_verify_like_other_streams(store_url: str) -> None:
    async with so.Runtime(agents(), store=store_url) as rt:
        ids = [(await rt.generate("chat", prompt="hi", auth=ALICE)).session_id for _ in range(3)]
        for sid in ids:
            await rt.delete_session(sid, reason=f"erase {sid}")
        entries = await rt.audit(stream=DELETIONS_STREAM)
        assert [e.n for e in entries] == [1, 2, 3]
        assert [e.data["session_id"] for e in entries] == ids
        assert entries[1].prev == entries[0].hash
        assert await rt.verify_audit() == []
        assert await rt.sessions() == []


async def test_a_deletions_entry_altered_is_named(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    async with so.Runtime(agents(), store=url) as rt:
        sid = (await rt.generate("chat", prompt="hi", auth=ALICE)).session_id
        await rt.delete_session(sid, reason="asked")
        conn = rt.store.conn  # type: ignore[attr-defined]
        conn.execute("UPDATE audit SET data = replace(data, 'asked', 'other') WHERE n = 1")
        [problem] = await rt.verify_audit()
        assert problem.stream == DELETIONS_STREAM and "content" in problem.reason


async def test_a_live_session_is_refused_and_left_whole(store_url: str) -> None:
    async with so.Runtime(agents(), store=store_url) as rt:
        r = await rt.generate("chat", prompt="refund it", auth=ALICE)
        assert r.status == "waiting"
        with pytest.raises(so.SessionWaiting) as waiting:
            await rt.delete_session(r.session_id)
        assert waiting.value.request_ids == [r.pending[0].id]
        assert waiting.value.code == "session_waiting"
        parent, child = await waiting_child(rt)
        with pytest.raises(so.SubagentSession) as sub:
            await rt.delete_session(child)
        assert sub.value.parent_id == parent
        with pytest.raises(so.SessionWaiting):  # its child waits on an approval
            await rt.delete_session(parent)
        await rt.cancel(parent, principal=ALICE)
        with pytest.raises(so.SubagentSession):  # cancelled, still its parent's
            await rt.delete_session(child)
        # A turn running: its lease held by a drive.
        idle = (await rt.generate("chat", prompt="hi", auth=ALICE)).session_id
        token = await rt.store.acquire_lease(idle, "elsewhere", 30.0, rt.now())
        assert token is not None
        with pytest.raises(so.SessionBusy):
            await rt.delete_session(idle)
        await rt.store.release_lease(idle, "elsewhere", token)
        assert await rt.audit(stream=DELETIONS_STREAM) == []
        assert len(await rt.sessions()) == 4
        assert await rt.verify_audit() == []
        with pytest.raises(so.UnknownSession):
            await rt.delete_session("sess_nope")
        assert await rt.delete_session(idle) == [idle]


async def test_a_turn_with_work_to_do_and_no_lease_is_refused(store_url: str) -> None:
    """Answered and not yet taken up again (`respond(resume=False)`, or a drive about to take
    the lease, or one that died): the turn is running though no drive holds its lease, and a
    worker would claim it. It was deleted, the answer accepted and then lost."""
    async with so.Runtime(agents(), store=store_url) as rt:
        r = await rt.generate("chat", prompt="refund it", auth=ALICE)
        answer = {"request_id": r.pending[0].id, "option_id": "approve"}
        await rt.respond(r.session_id, [answer], principal=ALICE, resume=False)
        assert (await rt.state(r.session_id)).status == "running"
        before = await _rows(store_url)
        with pytest.raises(so.SessionBusy, match="has work to do"):
            await rt.delete_session(r.session_id)
        assert await _rows(store_url) == before
        assert await rt.audit(stream=DELETIONS_STREAM) == []
        await rt.cancel(r.session_id, principal=ALICE)
        assert await rt.delete_session(r.session_id) == [r.session_id]


async def test_a_session_whose_ttl_passed_with_a_request_open_is_expired_then_deleted(
    tmp_path: Any,
) -> None:
    clock = ManualClock()
    url = f"sqlite:///{tmp_path / 'state.db'}"
    limited = chat_with_ttl()
    async with so.Runtime([limited], store=url, clock=clock) as rt:
        r = await rt.generate("chat", prompt="refund it", auth=ALICE)
        assert r.status == "waiting"
        clock.advance(61)
        assert await rt.delete_session(r.session_id) == [r.session_id]
        assert await rt.verify_audit() == []


async def test_a_turn_with_work_to_do_whose_ttl_passed_is_deleted(tmp_path: Any) -> None:
    """No worker claims a session whose TTL passed: it can never run again, and is deleted."""
    clock = ManualClock()
    limited = chat_with_ttl()
    async with so.Runtime([limited], store=f"sqlite:///{tmp_path / 's.db'}", clock=clock) as rt:
        r = await rt.generate("chat", prompt="refund it", auth=ALICE)
        answer = {"request_id": r.pending[0].id, "option_id": "approve"}
        await rt.respond(r.session_id, [answer], principal=ALICE, resume=False)
        with pytest.raises(so.SessionBusy):
            await rt.delete_session(r.session_id)
        clock.advance(61)
        assert await rt.delete_session(r.session_id) == [r.session_id]
        assert await rt.verify_audit() == []


async def test_a_follower_of_a_deleted_session_ends_with_unknown_session(store_url: str) -> None:
    async with so.Runtime(agents(), store=store_url, poll_interval=0.05) as rt:
        sid = (await rt.generate("chat", prompt="hi", auth=ALICE)).session_id
        seen: list[int] = []

        async def follow() -> None:
            async for e in rt.events(sid):
                seen.append(e.seq)

        task = asyncio.create_task(follow())
        while not seen or seen[-1] < (await rt.state(sid)).seq:
            await asyncio.sleep(0.01)
        await rt.delete_session(sid)
        with pytest.raises(so.UnknownSession):
            await asyncio.wait_for(task, 10)


async def test_another_process_deleting_leaves_no_key_to_another_session(tmp_path: Any) -> None:
    """SQLite gives a new row the highest key + 1: a store that remembered the deleted newest
    session's key must not read a session created after it as that one."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    async with so.Runtime(agents(), store=url) as a, so.Runtime(agents(), store=url) as b:
        gone = (await a.generate("chat", prompt="hi", auth=ALICE)).session_id
        assert await a.store.read_events(gone)  # remembers its key
        await b.delete_session(gone)
        new = (await b.generate("chat", prompt="hi", auth=ALICE)).session_id
        assert await a.store.read_events(gone) == []
        with pytest.raises(so.UnknownSession):  # no lease row of no session is written
            await a.store.acquire_lease(gone, "x", 30.0, a.now())
        with pytest.raises(so.UnknownSession):
            await a.state(gone)
        assert [e.session_id for e in await a.store.read_events(new)] == [new] * len(
            await b.store.read_events(new)
        )
        assert await a.verify_audit() == []


async def test_an_idempotency_key_repeated_after_a_deletion_brings_no_id_back(
    store_url: str,
) -> None:
    """A client retrying `generate` (or `POST /v1/sessions`) with its idempotency key after the
    session was erased got a new session of the erased id, which the deletion entry names and
    which another process that remembered the old one's SQLite row key read as having no
    events. The key now starts nothing again: `SessionDeleted` (an `UnknownSession`), nothing
    written; a new key starts a new session."""
    async with (
        so.Runtime(agents(), store=store_url) as a,
        so.Runtime(agents(), store=store_url) as b,
    ):
        sid = (await a.generate("chat", prompt="hi", auth=ALICE, idempotency_key="k1")).session_id
        assert await a.store.read_events(sid)
        await b.delete_session(sid)
        for rt in (a, b):
            with pytest.raises(so.SessionDeleted, match="was deleted") as raised:
                await rt.generate("chat", prompt="hi", auth=ALICE, idempotency_key="k1")
            assert isinstance(raised.value, so.UnknownSession)
            assert raised.value.session_id == sid
            assert await rt.store.head(sid) is None
            with pytest.raises(so.UnknownSession):
                await rt.state(sid)
        fresh = await a.generate("chat", prompt="hi", auth=ALICE, idempotency_key="k2")
        assert fresh.session_id != sid
        assert [s.id for s in await a.sessions()] == [fresh.session_id]
        assert await a.verify_audit() == []


def test_the_sync_twin_deletes(tmp_path: Any) -> None:
    with so.Runtime(agents(), store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        sid = rt.generate_sync("chat", prompt="hi", auth=ALICE).session_id
        assert rt.delete_session_sync(sid, by=OPS) == [sid]
        assert rt.sessions_sync() == []


async def test_a_channel_hub_copes_with_a_deleted_sessions_requests(store_url: str) -> None:
    """A hub that showed a request whose session was then cancelled and deleted before it read
    the close: the person is told it closed with its session, the next session's request is
    shown, and a yes answers that one; a hub started afterwards is handed nothing of the
    deleted one. The channel kept the erased request on show (every reply refused as an
    unknown session, no other request shown); this test held as both requests read alike."""
    from signoff.channels import ChannelHub

    from ._channels import Texts, manual

    async with so.Runtime([*agents(), refunds()], store=store_url) as rt:
        r = await rt.generate("refunds", prompt="refund 7", auth=ALICE)
        sms = Texts()
        async with manual(ChannelHub(rt, [sms], gap_timeout=0)) as hub:
            await hub.poll()
            assert sms.sent == [sms.render(r.pending[0])]
            await rt.cancel(r.session_id, principal=ALICE)
            await rt.delete_session(r.session_id, by=OPS, reason="GDPR request 12")
            nxt = await rt.generate("refunds", prompt="refund 8", auth=ALICE)
            assert sms.render(nxt.pending[0]) != sms.render(r.pending[0])
            for _ in range(3):
                await hub.poll()
            told, shown = sms.sent[1:]
            assert told.startswith("refund was withdrawn at ")
            assert told.endswith(": its session was deleted by ops (GDPR request 12).")
            assert shown == sms.render(nxt.pending[0])
            assert sms.current is not None and sms.current.id == nxt.pending[0].id
            out = await sms.reply("yes", ALICE)
            assert out is not None and out.request_id == nxt.pending[0].id and out.applied
            assert (await rt.store.get_request(nxt.pending[0].id)).status == "settled"  # type: ignore[union-attr]
        later = Texts()
        async with manual(ChannelHub(rt, [later], name="later")) as hub:
            await hub.poll()
            assert all(r.session_id not in text for text in later.sent)


async def test_a_session_waiting_with_no_request_open_is_not_deleted(store_url: str) -> None:
    """A parent whose subagent ended, and which is yet to read its result back, waits with no
    request open anywhere in its tree and no lease held: it was deleted, and the turn its
    worker was about to go on with was lost (found by a load test, 1 run in 6). Status
    `waiting` with no request open is refused as not finished, until its TTL passes."""
    from ._audit import alter

    async with so.Runtime(agents(), store=store_url) as rt:
        sid = (await rt.generate("chat", prompt="hi", auth=ALICE)).session_id
        assert (await rt.state(sid)).status == "idle"
        alter(store_url, "UPDATE {t}sessions SET status = 'waiting' WHERE id = {p}", sid)
        with pytest.raises(so.SessionBusy, match="waits on a subagent"):
            await rt.delete_session(sid, by=OPS)
        assert await rt.store.head(sid) is not None
        assert await rt.audit(stream=DELETIONS_STREAM) == []


async def test_a_key_repeated_while_its_session_is_deleted_is_told_it_was_deleted(
    store_url: str,
) -> None:
    """A call repeating an idempotency key meets its session (the create refused as already
    there), which a deletion then erases before the call reads it back: it raised
    `StoreError: session ... already exists` of a session that was not. It is `SessionDeleted`
    (found by a load test on PostgreSQL)."""
    async with (
        so.Runtime(agents(), store=store_url) as a,
        so.Runtime(agents(), store=store_url) as b,
    ):
        sid = (await a.generate("chat", prompt="hi", auth=ALICE, idempotency_key="k9")).session_id
        create = b.store.create_session

        async def meets_it_then_it_goes(*args: Any, **kwargs: Any) -> int | None:
            b.store.create_session = create  # type: ignore[method-assign]
            await a.delete_session(sid, by=OPS)  # between the refused create and the read
            raise so.StoreError(f"session {sid!r} already exists")

        b.store.create_session = meets_it_then_it_goes  # type: ignore[method-assign]
        with pytest.raises(so.SessionDeleted):
            await b.generate("chat", prompt="hi", auth=ALICE, idempotency_key="k9")
        assert await b.store.head(sid) is None


async def _erasing_meanwhile(url: str, session_id: str, call: Any) -> tuple[Any, bool]:
    """Run `call()` while another transaction has deleted the session's rows (as a deletion
    does) and not committed yet, committed once `call`'s statement waits on it (or `call`
    ended): what `call` returned or raised, and whether it waited."""
    import psycopg

    from ._procs import query

    [(sk,)] = query(url, "SELECT sk FROM {t}sessions WHERE id = {p}", session_id)
    base, _, _ = url.partition("?")
    waited = False
    async with await psycopg.AsyncConnection.connect(base) as pg:
        for table in ("events", "snapshots", "requests", "leases", "audit", "sessions"):
            await pg.execute(f"DELETE FROM signoff.{table} WHERE sk = %s", (sk,))
        await pg.execute(
            "INSERT INTO signoff.deleted_sessions (id, at) VALUES (%s, 0)", (session_id,)
        )
        task = asyncio.create_task(call())
        async with await psycopg.AsyncConnection.connect(base, autocommit=True) as look:
            for _ in range(500):  # until its statement waits for this transaction
                cur = await look.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"
                )
                waited = bool((await cur.fetchone() or (0,))[0])
                if waited or task.done():
                    break
                await asyncio.sleep(0.01)
        await pg.commit()
    outcome: tuple[Any] = await asyncio.gather(task, return_exceptions=True)
    return outcome[0], waited


async def test_a_key_repeated_as_its_session_is_deleted_makes_nothing_again(
    pg_store_url: str,
) -> None:
    """PostgreSQL: a repeated key's create whose statement began before a deletion of its
    session committed waited for it on the id's unique index, then went through, its check
    of the erased ids having read the time before: the session was made again, and ran (found
    by a load test: an id deleted twice). The create's statement now locks the id's row too: a
    row its snapshot saw but gone once locked was deleted meanwhile: `SessionDeleted`, nothing
    written (the locking read is what waits here)."""
    async with so.Runtime(agents(), store=pg_store_url, inline=False) as rt:
        sid = (await rt.generate("chat", prompt="hi", auth=ALICE, idempotency_key="k")).session_id
        raised, waited = await _erasing_meanwhile(
            pg_store_url,
            sid,
            lambda: rt.generate("chat", prompt="hi", auth=ALICE, idempotency_key="k"),
        )
        assert isinstance(raised, so.SessionDeleted), raised
        assert waited
        assert raised.session_id == sid
        assert await rt.store.head(sid) is None
        assert await rt.sessions() == []


def _child_created(parent: str) -> Any:
    """A `session.created` of a subagent's session `ses_child` under `parent`."""
    from signoff._events import Event

    return Event(
        session_id="ses_child",
        seq=1,
        type="session.created",
        at=1.0,
        data={"agent": "chat", "initiator": None, "parent": parent, "ttl": None},
    )


async def test_a_subagent_is_not_made_under_a_parent_being_deleted(pg_store_url: str) -> None:
    """PostgreSQL: a subagent's session created as its parent is deleted (the parent's drive
    stalled past its lease) was made with no parent, a top-level session no one would run or
    delete with its tree. Refused: `SessionDeleted` naming the parent, nothing written."""
    async with so.Runtime(agents(), store=pg_store_url) as rt:
        parent = (await rt.generate("chat", prompt="hi", auth=ALICE)).session_id
        created = _child_created(parent)
        raised, waited = await _erasing_meanwhile(
            pg_store_url,
            parent,
            lambda: rt.store.create_session("ses_child", "chat", [created], None),
        )
        assert isinstance(raised, so.SessionDeleted), raised
        assert waited
        assert raised.session_id == parent
        assert await rt.store.head("ses_child") is None


def _boss_and_desk() -> list[so.Agent]:
    """`boss` delegates each message to `desk`, which answers it."""
    desk = scripted_agent("desk", [reply("on it")], repeat_last=True)
    boss = scripted_agent(
        "boss",
        [
            lambda conv: (
                reply("done")
                if isinstance(conv[-1], so.ToolResultMessage)
                else call_tools(call("desk", message="help"))
            )
        ],
        tools=[so.delegate("desk")],
        repeat_last=True,
    )
    return [boss, desk]


async def test_a_subagents_turn_ends_well_though_its_tree_is_deleted_as_it_ends(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message to a subagent's session (its parent finished) runs a turn; once it ended and
    gave its lease back, a prune deleted the tree, and the drive, looking for the parent's
    turn to go on with, raised `UnknownSession`: a worker logged "the turn failed" and kept
    the lease for its TTL (found by the retention load test). The turn's result stands."""
    async with (
        so.Runtime(_boss_and_desk(), store=store_url) as a,
        so.Runtime(_boss_and_desk(), store=store_url) as b,
    ):
        parent = (await a.generate("boss", prompt="hi", auth=ALICE)).session_id
        [child] = [s.id for s in await a.sessions() if s.agent == "desk"]
        assert (await a.state(parent)).status == "idle"
        after_drive = _child_sessions.after_drive

        async def deleted_first(rt: so.Runtime, session_id: str) -> None:
            if session_id == child:  # its turn ended, its lease given back
                assert await b.delete_session(parent, by=OPS) == [parent, child]
            await after_drive(rt, session_id)

        monkeypatch.setattr(_child_sessions, "after_drive", deleted_first)
        result = await a.send(child, "thanks", principal=ALICE)
        assert (result.status, result.text) == ("completed", "on it")
        with pytest.raises(so.UnknownSession):
            await a.state(child)


async def test_a_child_answered_directly_whose_parent_another_process_finished_and_deleted(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child's approval answered on the child closes its mirror in the parent, then drives the
    parent's turn on: if another process finished that turn and pruned the tree in between (a
    stall under load), the read of the parent raised `UnknownSession` for the parent, which a
    worker logged as "the turn failed" and kept the lease for its TTL. The answer stands."""
    ran: list[dict[str, Any]] = []
    parent_agent, child_agent = refund_agents(ran, Counted("Handled in the billing session."))
    async with (
        so.Runtime([parent_agent, child_agent], store=store_url) as a,
        so.Runtime([parent_agent, child_agent], store=store_url) as b,
    ):
        [mirror] = (await a.generate("support", prompt="Refund order 1042", auth=ALICE)).pending
        assert mirror.child is not None
        parent, child = mirror.session_id, mirror.child.session_id
        lapsed = _child_closes._lapsed

        async def finished_elsewhere(rt: so.Runtime, state: so.SessionState) -> bool:
            # The child's drive read the parent (waiting for it), then stalled: meanwhile another
            # process finishes the parent's turn with the child's result and prunes the tree.
            if rt is a and state.id == parent:
                assert (await b.generate("support", session_id=parent)).status == "completed"
                assert await b.delete_session(parent, by=OPS) == [parent, child]
            return await lapsed(rt, state)

        monkeypatch.setattr(_child_closes, "_lapsed", finished_elsewhere)
        answer = so.InputResponse(request_id=mirror.child.request_id, option_id="approve")
        done = await a.respond(child, [answer], principal=ALICE)
        assert done.status == "completed" and ran == [{"order_id": "1042", "amount": 180.0}]
        with pytest.raises(so.UnknownSession):
            await a.state(parent)


async def test_a_subagent_is_not_made_under_a_deleted_parent(store_url: str) -> None:
    """A subagent's session created once its parent was deleted (the parent's drive stalled
    past its lease) was made with no parent: a top-level session of no one. Refused on either
    store: `SessionDeleted` naming the parent, nothing written."""
    async with so.Runtime(agents(), store=store_url) as rt:
        parent = (await rt.generate("chat", prompt="hi", auth=ALICE)).session_id
        await rt.delete_session(parent, by=OPS)
        created = _child_created(parent)
        with pytest.raises(so.SessionDeleted) as raised:
            await rt.store.create_session("ses_child", "chat", [created], None)
        assert raised.value.session_id == parent
        assert await rt.store.head("ses_child") is None
        assert await rt.sessions() == []


async def test_a_deletion_finds_the_subagents_through_their_index(store_url: str) -> None:
    """Finding a session's subagents' sessions read every session: SQLite built a temporary
    index of them for each deletion, PostgreSQL hash-joined whole tables with the tree (a
    prune of 5,000 sessions: 1.06 ms a session on SQLite, against 0.28 for 300). The tree's
    step is a search of `sessions_by_parent` (SQLite schema 10, PostgreSQL migration 14), whose
    condition `parent > 0` only the tree's query states."""
    from ._procs import query

    async with so.Runtime(agents(), store=store_url) as rt:
        parent, child = await waiting_child(rt)
        await rt.cancel(parent, principal=ALICE)
    if store_url.startswith("sqlite:///"):
        from signoff.stores.sqlite._deletions import _TREE

        [(sk,)] = query(store_url, "SELECT sk FROM sessions WHERE id = ?", parent)
        plan = [str(r[-1]) for r in query(store_url, "EXPLAIN QUERY PLAN " + _TREE, sk)]
        assert "SEARCH c USING COVERING INDEX sessions_by_parent (parent=?)" in plan, plan
        assert not [p for p in plan if "AUTOMATIC" in p], plan
    else:
        import psycopg

        from signoff.stores.postgres._deletions import _NESTED, _READ

        with psycopg.connect(store_url.partition("?")[0]) as conn:
            conn.execute("ANALYZE")
            for setting in _NESTED.split(";")[:-1]:
                conn.execute(setting.encode())
            conn.execute("SET LOCAL enable_seqscan = off")  # these tables are tiny
            [(plan,)] = conn.execute(
                b"EXPLAIN (FORMAT JSON) " + _READ.format(s='"signoff"').encode(), (parent, 0, 0)
            ).fetchall()
        text = str(plan)
        assert "'Index Name': 'sessions_by_parent'" in text, plan
        assert "Hash Join" not in text and "Merge Join" not in text, plan
    async with so.Runtime(agents(), store=store_url) as rt:
        assert await rt.delete_session(parent) == [parent, child]


async def test_a_session_deleted_as_it_is_loaded_is_unknown(pg_store_url: str) -> None:
    """PostgreSQL loads a session in two statements (its row and snapshot, then its events):
    one deleted between them raised `StoreError: ... changed while it was read: its schema
    made anew?` (found by the retention load test in a full CI run). It is unknown."""
    async with (
        so.Runtime(agents(), store=pg_store_url) as a,
        so.Runtime(agents(), store=pg_store_url) as b,
    ):
        sid = (await a.generate("chat", prompt="hi", auth=ALICE)).session_id
        events = b.store._events  # type: ignore[attr-defined]

        async def deleted_first(*args: Any, **kwargs: Any) -> Any:
            b.store._events = events  # type: ignore[attr-defined]
            await a.delete_session(sid, by=OPS)
            return await events(*args, **kwargs)

        b.store._events = deleted_first  # type: ignore[attr-defined]
        with pytest.raises(so.UnknownSession):
            await b.state(sid)


# -- forced: a session no cancel can finish -----------------------------------------------------


async def test_a_damaged_session_no_cancel_can_finish_is_deleted_when_forced(
    store_url: str,
) -> None:
    """A session waiting on a request whose row is gone (a hand edit, a half-restored copy):
    its cancel is refused as damage (`StoreError`) and its deletion as unfinished, so nothing
    could remove it but SQL by hand. `force=True` deletes it, its subagent's with it, and its
    audit entry says so; nothing else changes."""
    async with so.Runtime(agents(), store=store_url) as rt:
        other = (await rt.generate("chat", prompt="hi", auth=ALICE)).session_id
        parent, child = await waiting_child(rt)
        alter(store_url, "DELETE FROM {t}requests")
        with pytest.raises(so.StoreError, match="damaged"):
            await rt.cancel(parent, principal=ALICE)
        before = await _rows(store_url)
        with pytest.raises(so.SessionBusy):
            await rt.delete_session(parent)
        with pytest.raises(so.SubagentSession):  # forced or not: deleted with its parent
            await rt.delete_session(child, force=True)
        assert await _rows(store_url) == before
        deleted = await rt.delete_session(parent, by=OPS, reason="damaged", force=True)
        assert deleted == [parent, child]
        for sid in deleted:
            with pytest.raises(so.UnknownSession):
                await rt.state(sid)
        [entry] = await rt.audit(stream=DELETIONS_STREAM)
        assert entry.data["force"] is True and entry.data["reason"] == "damaged"
        assert [s.id for s in await rt.sessions()] == [other]
        assert await rt.verify_audit() == []
        # Not forced, the entry says nothing of it: as entries before the option were.
        assert await rt.delete_session(other) == [other]
        assert "force" not in (await rt.audit(stream=DELETIONS_STREAM))[-1].data


async def test_forcing_still_refuses_a_session_a_drive_holds(store_url: str) -> None:
    """A drive holding the lease is writing to the session: forced or not, it is refused
    (`SessionBusy`) and nothing changes; a `force` that is not a bool is misuse."""
    async with so.Runtime(agents(), store=store_url) as rt:
        r = await rt.generate("chat", prompt="refund it", auth=ALICE)
        token = await rt.store.acquire_lease(r.session_id, "elsewhere", 30.0, rt.now())
        assert token is not None
        before = await _rows(store_url)
        with pytest.raises(so.SessionBusy, match="holds the lease"):
            await rt.delete_session(r.session_id, force=True)
        with pytest.raises(so.UsageError, match="force must be True or False"):
            await rt.delete_session(r.session_id, force="yes")  # type: ignore[arg-type]
        assert await _rows(store_url) == before
        assert await rt.audit(stream=DELETIONS_STREAM) == []
        await rt.store.release_lease(r.session_id, "elsewhere", token)
        # Live, waiting on a person, under no lease: forced, its open request goes with it.
        assert await rt.delete_session(r.session_id, force=True) == [r.session_id]
        assert await rt.pending() == []


ODD = so.Principal(
    authenticator="test",
    principal_id="ops",
    issuer="i\ud800",
    attributes={"team": ["a\ud800", {"k": "\udfff"}], "n": 1},
)
"""A principal whose text holds lone surrogates, as the session's events hold it."""

ODD_RECORDED = {
    "authenticator": "test",
    "principal_id": "ops",
    "principal_type": "user",
    "issuer": "i\\ud800",
    "attributes": {"team": ["a\\ud800", {"k": "\\udfff"}], "n": 1},
}
"""`ODD` as a deletion's entry records it: each lone surrogate as its escape, as a sign-out's."""


async def test_a_deleter_whose_text_holds_a_lone_surrogate_is_recorded_escaped(
    store_url: str,
) -> None:
    """A `by` principal the session's records hold (it started the session) but the deletion's
    entry, UTF-8 text, cannot: a bare UnicodeEncodeError came out of the store's write, then
    the deletion was refused (`UsageError`). It deletes now, its text escaped in the entry as a
    dashboard sign-out's is, and the trail verifies, in the store and exported. A `reason`
    holding one is still refused."""
    async with so.Runtime(agents(), store=store_url) as rt:
        sid = (await rt.generate("chat", prompt="hi", auth=ODD)).session_id
        before = await _rows(store_url)
        with pytest.raises(so.UsageError, match="the reason is not valid Unicode text"):
            await rt.delete_session(sid, by=ODD, reason="a\ud800")  # text a person typed
        assert await _rows(store_url) == before
        assert await rt.delete_session(sid, by=ODD, reason="asked") == [sid]
        with pytest.raises(so.UnknownSession):
            await rt.state(sid)
    async with so.Runtime(agents(), store=store_url) as rt:  # as the store reads it back
        [entry] = await rt.audit(stream=DELETIONS_STREAM)
        assert entry.data["by"] == ODD_RECORDED
        assert entry.data["session_id"] == sid and entry.data["reason"] == "asked"
        assert await rt.verify_audit() == []
        assert await rt.verify_audit(DELETIONS_STREAM) == []
        exported = io.StringIO()
        await rt.export_audit(exported)
        assert so.verify_audit_export(exported.getvalue().splitlines()) == []


async def test_a_lease_row_a_hand_edit_left_odd_does_not_hold_a_forced_deletion(
    tmp_path: Any,
) -> None:
    """A lease whose expiry a hand edit left as text reads as held for ever (SQLite orders text
    after every number), so the session was `SessionBusy` to every deletion; forced, only a
    lease its row plainly shows held refuses it."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    async with so.Runtime(agents(), store=url) as rt:
        sid = (await rt.generate("chat", prompt="hi", auth=ALICE)).session_id
        token = await rt.store.acquire_lease(sid, "elsewhere", 30.0, rt.now())
        assert token is not None
        alter(url, "UPDATE {t}leases SET expires_at = 'soon'")
        with pytest.raises(so.SessionBusy):
            await rt.delete_session(sid)
        assert await rt.delete_session(sid, force=True) == [sid]


async def test_a_subagents_own_waiting_turn_is_named_as_what_to_cancel(store_url: str) -> None:
    """The top session's turn was over; its subagent's own turn (a message sent to it) waited
    on an approval. The refusal named the top and said "cancel it first", which leaves that
    turn alone (as documented): following it changed nothing. It names the subagent's session."""

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    asks = [call_tools(call("issue_refund", order_id="1042")), reply("Refunded.")]
    billing = scripted_agent("billing", asks * 2, tools=[issue_refund])
    delegates = [call_tools(call("billing", message="Refund order 1042")), reply("Done.")]
    parent_agent = scripted_agent("support", delegates, tools=[so.delegate("billing")])
    async with so.Runtime([parent_agent, billing], store=store_url) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        (mirror,) = r.pending
        assert mirror.child is not None
        kid = mirror.child.session_id
        approve = so.InputResponse(request_id=mirror.id, option_id="approve")
        assert (await rt.respond(r.session_id, [approve], principal=ALICE)).status == "completed"
        own = await rt.send(kid, "refund order 1042 again", principal=ALICE)
        (asked,) = own.pending
        with pytest.raises(so.SessionWaiting) as waiting:
            await rt.delete_session(r.session_id)
        assert (waiting.value.request_ids, waiting.value.held_by) == ([asked.id], [kid])
        assert f"{asked.id} of subagent session {kid!r}" in str(waiting.value)
        assert "cancel the sessions holding them first" in str(waiting.value)
        await rt.cancel(kid, principal=ALICE)
        assert await rt.delete_session(r.session_id) == [r.session_id, kid]
