"""The audit trail: every request, evaluation, decision, edit, expiry and execution, chained."""

import asyncio
import contextlib
import hashlib
import io
import json
import sqlite3
from pathlib import Path
from typing import cast
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import pytest

import signoff as so
from signoff._audit_trail import verify as verify_trail
from signoff.stores import Store
from signoff.stores._audit import AuditEntry, AuditRow, chain_hash, chain_parts
from signoff.stores._base import RequestRow
from signoff.stores._codec import pack, pack_bytes, unpack_event
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from ._procs import query

ALICE = so.Principal(authenticator="test", principal_id="alice")
BOB = so.Principal(authenticator="test", principal_id="bob")


def only_bob(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
    return so.Allowed() if ctx.response.principal == BOB else so.Rejected("bob approves refunds")


@so.tool(approval=so.ApprovalSpec(request=so.always(), response=only_bob))
async def refund(order_id: str, amount: float) -> dict[str, object]:
    """Refund an order."""
    return {"refunded": amount}


@so.tool(approval=so.always(expires_in=60))
async def wipe(disk: str) -> str:
    """Wipe a disk."""
    return f"wiped {disk}"


def agent() -> so.Agent:
    return scripted_agent(
        "support",
        [
            call_tools(call("refund", order_id="1", amount=50), call("wipe", disk="sda")),
            reply("done"),
        ],
        tools=[refund, wipe],
    )


async def run_scenario(rt: so.Runtime, clock: ManualClock) -> str:
    r = await rt.generate("support", prompt="refund and wipe", auth=ALICE)
    refund_req = next(p for p in r.pending if p.tool_name == "refund")
    # refused by the response policy, then approved by bob with an edit
    await rt.respond(
        r.session_id,
        [so.InputResponse(request_id=refund_req.id, option_id="approve")],
        principal=ALICE,
    )
    await rt.respond(
        r.session_id,
        [
            so.InputResponse(
                request_id=refund_req.id,
                option_id="approve",
                edited_input={"order_id": "1", "amount": 40},
            )
        ],
        principal=BOB,
    )
    clock.advance(61)  # nobody decides the wipe: it expires
    await rt.expire_due()
    assert (await rt.state(r.session_id)).status == "idle"
    return r.session_id


async def test_the_trail_records_each_step_and_verifies(tmp_path: Path) -> None:
    clock = ManualClock()
    async with so.Runtime([agent()], store=f"sqlite:///{tmp_path}/a.db", clock=clock) as rt:
        sid = await run_scenario(rt, clock)
        entries = await rt.audit(sid)
        kinds = [e.type for e in entries]
        assert kinds[0] == "input.requested"
        # refused: pending then rejected; allowed: pending, then the settlement itself
        outcomes = [e.data["outcome"] for e in entries if e.type == "approval.candidate"]
        assert outcomes == ["pending", "rejected", "pending"]
        settled = next(e for e in entries if e.type == "approval.settled")
        assert settled.data["by"]["principal_id"] == "bob"
        assert settled.data["edited_input"] == {"order_id": "1", "amount": 40.0}
        expired = [e for e in entries if e.type == "input.resolved"]
        assert {e.data["outcome"] for e in expired} == {"approved", "expired"}
        assert [e.type for e in entries if e.type.startswith("tool.")] == [
            "tool.started",
            "tool.completed",
            "tool.completed",
        ]
        assert [e.n for e in entries] == list(range(1, len(entries) + 1))
        assert entries[0].prev is None and all(
            b.prev == a.hash for a, b in zip(entries, entries[1:], strict=False)
        )
        # tool settings were recorded when the runtime opened
        tools = await rt.audit(stream="tools:support.refund")
        assert [e.data["new"] for e in tools] == ["Always + response policy"]
        assert await rt.verify_audit() == []


async def test_altering_the_log_or_the_trail_is_named(tmp_path: Path) -> None:
    clock = ManualClock()
    db = tmp_path / "a.db"
    async with so.Runtime([agent()], store=f"sqlite:///{db}", clock=clock) as rt:
        sid = await run_scenario(rt, clock)
        settled = next(e for e in await rt.audit(sid) if e.type == "approval.settled")
    assert settled.seq is not None
    # Rewrite who approved, in the event log itself: the trail reads the event, so it notices.
    with sqlite3.connect(db) as conn:
        (sk,) = conn.execute("SELECT sk FROM sessions WHERE id=?", (sid,)).fetchone()
        stored = dict(
            conn.execute(
                "SELECT seq, data FROM events WHERE sk=? AND seq BETWEEN ? AND ?",
                (sk, settled.seq - 2, settled.seq),
            ).fetchall()
        )
        # it may be kept on the events before it: read it with them
        data = unpack_event(stored[settled.seq], stored[settled.seq - 1], stored[settled.seq - 2])
        data["by"]["principal_id"] = "mallory"
        conn.execute("UPDATE events SET data=? WHERE sk=? AND seq=?", (pack(data), sk, settled.seq))
    async with so.Runtime([agent()], store=f"sqlite:///{db}", clock=clock) as rt2:
        problems = await rt2.verify_audit()
        assert [(p.id, p.stream, p.reason) for p in problems] == [
            (settled.id, sid, "content does not match")
        ]
        # rewriting an entry of the trail itself (a tool setting change) is named too
        with sqlite3.connect(db) as conn:
            tool_entry = conn.execute(
                "SELECT id, data FROM audit WHERE stream='tools:support.wipe' AND n > 0"
            ).fetchone()
            changed = json.loads(tool_entry[1]) | {"new": "Never"}
            conn.execute("UPDATE audit SET data=? WHERE id=?", (json.dumps(changed), tool_entry[0]))
        problems = await rt2.verify_audit("tools:support.wipe")
        assert [(p.id, p.reason) for p in problems] == [(tool_entry[0], "content does not match")]
        # deleting an entry breaks the chain at the next one
        with sqlite3.connect(db) as conn:
            conn.execute("DELETE FROM audit WHERE id=?", (settled.id,))
        problems = await rt2.verify_audit(sid)
        assert [p.id for p in problems] == [settled.id + 1]


async def test_tool_setting_changes_are_recorded_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/a.db"
    loose = so.tool(approval=so.never())(wipe.fn)
    for tools, expected in (([wipe], 1), ([wipe], 1), ([loose], 2)):
        a = scripted_agent("support", [reply("hi")], tools=tools)
        async with so.Runtime([a], store=url) as rt:
            history = await rt.audit(stream="tools:support.wipe")
            assert len(history) == expected
    assert [(e.data["old"], e.data["new"]) for e in history] == [
        (None, "Always"),
        ("Always", "Never"),
    ]


async def test_a_runtime_opens_on_a_store_refusing_writes_and_records_its_settings_later(
    tmp_path: Path,
) -> None:
    """A tool's setting changed while the store refuses writes (full): opening the runtime must
    not fail for it, so the store can still be read (the queue, a session); the change is
    recorded by the first call once the store takes writes again, before that call's writes."""
    url = f"sqlite:///{tmp_path}/a.db"
    gated = scripted_agent("support", [reply("hi")], tools=[wipe])
    async with so.Runtime([gated], store=url) as rt:
        r = await rt.generate("support", prompt="hello")
    never = so.tool(approval=so.never())(wipe.fn)
    loose = scripted_agent("support", [reply("hi")], tools=[never], repeat_last=True)
    rt = so.Runtime([loose], store=url)
    await rt.store.open()
    conn = rt.store.conn  # type: ignore[attr-defined]
    conn.execute("PRAGMA query_only=1")  # every write refused from now on
    try:
        assert await rt.pending() == []
        assert (await rt.state(r.session_id)).status == "idle"
        assert len(await rt.audit(stream="tools:support.wipe")) == 1
        with pytest.raises(so.StoreError):
            await rt.generate(session_id=r.session_id, prompt="again")
        conn.execute("PRAGMA query_only=0")
        again = await rt.generate(session_id=r.session_id, prompt="again")
        assert again.status == "completed"
        history = await rt.audit(stream="tools:support.wipe")
        assert [(e.data["old"], e.data["new"]) for e in history] == [
            (None, "Always"),
            ("Always", "Never"),
        ]
    finally:
        await rt.close()


async def test_export_writes_json_lines(tmp_path: Path) -> None:
    clock = ManualClock()
    async with so.Runtime([agent()], store=f"sqlite:///{tmp_path}/a.db", clock=clock) as rt:
        sid = await run_scenario(rt, clock)
        out = io.StringIO()
        count = await rt.export_audit(out, sid)
        lines = [json.loads(line) for line in out.getvalue().splitlines()]
        assert count == len(lines) == len(await rt.audit(sid))
        assert {"id", "stream", "n", "type", "at", "data", "prev", "hash"} <= set(lines[0])


async def test_the_trail_on_both_stores(store_url: str) -> None:
    clock = ManualClock()
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt:
        sid = await run_scenario(rt, clock)
        assert len(await rt.audit(sid)) >= 10
        assert await rt.verify_audit(sid) == []


def alter(url: str, sql: str, *params: object) -> None:
    """Write to signoff's tables behind its back (`{t}` and `{p}` as in `query`)."""
    if url.startswith("sqlite:///"):
        with contextlib.closing(sqlite3.connect(url[len("sqlite:///") :])) as conn, conn:
            conn.execute(sql.format(t="", p="?"), params)
        return
    import psycopg

    parts = urlsplit(url)
    options = parse_qs(parts.query)
    schema = options.pop("schema", ["signoff"])[0]
    libpq = urlunsplit(parts._replace(query=urlencode(options, doseq=True)))
    with psycopg.connect(libpq) as pg:
        pg.execute(sql.format(t=f'"{schema}".', p="%s").encode(), params)


async def test_a_damaged_event_is_named_by_verification_not_raised(store_url: str) -> None:
    clock = ManualClock()
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt:
        sid = await run_scenario(rt, clock)
        entries = await rt.audit(sid)
    settled = next(e for e in entries if e.type == "approval.settled")
    resolved = next(e for e in entries if e.type == "input.resolved")
    started = next(e for e in entries if e.type == "tool.started")
    ((sk,),) = query(store_url, "SELECT sk FROM {t}sessions WHERE id={p}", sid)
    # one event overwritten with bytes that do not inflate, another with text that is not JSON
    for seq, damage in ((settled.seq, b"\x01garbage"), (resolved.seq, b"{nope")):
        alter(store_url, "UPDATE {t}events SET data={p} WHERE sk={p} AND seq={p}", damage, sk, seq)
    # and one given a type code no signoff knows
    alter(store_url, "UPDATE {t}events SET type='?' WHERE sk={p} AND seq={p}", sk, started.seq)
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt2:
        problems = await rt2.verify_audit(sid)
        assert sorted((p.id, p.reason) for p in problems) == sorted(
            (e.id, "content does not match") for e in (settled, resolved, started)
        )
        listed = {e.id: e for e in await rt2.audit(sid)}
        assert listed[settled.id].data == listed[resolved.id].data == {}


async def test_a_damaged_tool_setting_entry_is_named_not_raised(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/a.db"
    async with so.Runtime([agent()], store=url) as rt:
        (entry,) = await rt.audit(stream="tools:support.wipe")
    alter(url, "UPDATE audit SET data='{{nope' WHERE id=?", entry.id)
    async with so.Runtime([agent()], store=url) as rt2:
        problems = await rt2.verify_audit("tools:support.wipe")
        assert [(p.id, p.reason) for p in problems] == [(entry.id, "content does not match")]


async def test_entries_removed_from_the_end_of_a_session_chain_are_named(store_url: str) -> None:
    clock = ManualClock()
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt:
        sid = await run_scenario(rt, clock)
        entries = await rt.audit(sid)
        assert await rt.verify_audit() == []
    last = entries[-1]
    # the last entry goes: no entry after it can break, but the session row knows its chain head
    alter(store_url, "DELETE FROM {t}audit WHERE id={p}", last.id)
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt2:
        for problems in (await rt2.verify_audit(sid), await rt2.verify_audit()):
            assert [(p.stream, p.n) for p in problems] == [(sid, last.n)]
            assert "missing" in problems[0].reason
        # and so do all of them
        alter(store_url, "DELETE FROM {t}audit WHERE seq IS NOT NULL")
        problems = await rt2.verify_audit(sid)
        assert [(p.stream, p.n) for p in problems] == [(sid, 1)]


async def test_entries_of_a_deleted_session_row_are_named_not_raised(tmp_path: Path) -> None:
    """SQLite has no foreign keys to stop a hand edit deleting a session's row: its entries are
    then named as a gone session's, not an AttributeError from a stream of None."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    clock = ManualClock()
    async with so.Runtime([agent()], store=url, clock=clock) as rt:
        sid = await run_scenario(rt, clock)
        count = len(await rt.audit(sid))
        (sk,) = query(url, "SELECT sk FROM sessions WHERE id=?", sid)[0]
    alter(url, "DELETE FROM {t}sessions WHERE id={p}", sid)
    gone = f"session #{sk} (its row is gone)"
    async with so.Runtime([agent()], store=url, clock=clock) as rt2:
        assert [e.stream for e in await rt2.audit()].count(gone) == count
        problems = await rt2.verify_audit()
        assert problems and {p.stream for p in problems} == {gone}


async def test_a_rewritten_last_entry_is_named_by_the_head_its_session_keeps(
    store_url: str,
) -> None:
    """The last event rewritten with its trail entry's hash recomputed leaves a chain that
    checks out link by link: only the chain head the session row keeps tells it apart."""
    clock = ManualClock()
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt:
        sid = await run_scenario(rt, clock)
        last = (await rt.audit(sid))[-1]
    assert last.seq is not None
    ((sk,),) = query(store_url, "SELECT sk FROM {t}sessions WHERE id={p}", sid)
    forged = {**last.data, "forged": True}
    digest = chain_hash(
        last.prev, stream=sid, n=last.n, type=last.type, at=last.at, seq=last.seq, data=forged
    )
    alter(
        store_url,
        "UPDATE {t}events SET data={p} WHERE sk={p} AND seq={p}",
        pack_bytes(forged),
        sk,
        last.seq,
    )
    alter(store_url, "UPDATE {t}audit SET hash={p} WHERE id={p}", bytes.fromhex(digest), last.id)
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt2:
        assert (await rt2.audit(sid))[-1].data == forged  # the forgery reads back as written
        for problems in (await rt2.verify_audit(sid), await rt2.verify_audit()):
            assert [(p.id, p.stream, p.n, p.reason) for p in problems] == [
                (last.id, sid, last.n + 1, "the chain does not end with the hash its session keeps")
            ]


async def test_an_entry_naming_another_predecessor_is_named() -> None:
    """A store that reports an entry's `prev` other than the hash of the entry before it (a
    link moved or rewritten) is told so, even when the entry's own hash checks out."""

    def entry(n: int, prev: str | None, hashed_on: str | None) -> AuditEntry:
        digest = chain_hash(hashed_on, stream="s", n=n, type="turn.started", at=1.0, seq=n, data={})
        return AuditEntry(
            id=n,
            stream="s",
            n=n,
            type="turn.started",
            at=1.0,
            seq=n,
            data={},
            prev=prev,
            hash=digest,
        )

    first = entry(1, None, None)
    second = entry(2, "00" * 32, first.hash)  # hashed on the true predecessor, names another

    class Listed:
        async def audit(
            self, *, stream: str | None = None, after_id: int = 0, limit: int = 1000
        ) -> list[AuditEntry]:
            return [e for e in (first, second) if e.id > after_id][:limit]

        async def audit_heads(self, *, stream: str | None = None) -> dict[str, tuple[int, str]]:
            return {"s": (2, second.hash)}

        async def stored_requests(
            self, *, session_id: str | None = None, after: str = "", limit: int = 1000
        ) -> list[RequestRow]:
            return []  # no requests: only the chains are checked

    problems = await verify_trail(cast(Store, Listed()))
    assert [(p.id, p.n, p.reason) for p in problems] == [(2, 2, "previous hash differs")]


async def test_runtimes_opening_at_once_record_a_tool_setting_once(store_url: str) -> None:
    runtimes = [so.Runtime([agent()], store=store_url) for _ in range(3)]
    try:
        await asyncio.gather(*(rt.open() for rt in runtimes))
        history = await runtimes[0].audit(stream="tools:support.wipe")
        assert [(e.n, e.data["old"], e.data["new"]) for e in history] == [(1, None, "Always")]
        assert await runtimes[0].verify_audit() == []
    finally:
        for rt in runtimes:
            await rt.close()


async def test_an_entry_expecting_its_stream_elsewhere_is_skipped(store_url: str) -> None:
    def row(after: int | None, new: str) -> AuditRow:
        return AuditRow(
            stream="tools:a.t", type="t", at=1.0, seq=None, data={"new": new}, after=after
        )

    async with so.Runtime([], store=store_url) as rt:
        store = rt.store
        await store.record_audit([row(0, "A")])
        await store.record_audit([row(0, "B")])  # recorded from the same empty stream: skipped
        await store.record_audit([row(1, "C"), row(None, "D")])
        entries = await store.audit(stream="tools:a.t")
        assert [(e.n, e.data["new"]) for e in entries] == [(1, "A"), (2, "C"), (3, "D")]
        assert await rt.verify_audit() == []


async def test_entries_removed_from_the_end_of_a_tool_setting_stream_are_named(
    store_url: str,
) -> None:
    """A tool-setting stream has no session row: the store keeps its head all the same, so its
    last entries removed are named with the stream, as a session's are."""
    loose = so.tool(approval=so.never())(wipe.fn)
    for tools in ([wipe], [loose]):
        async with so.Runtime(
            [scripted_agent("support", [reply("hi")], tools=tools)], store=store_url
        ):
            pass  # each opening records the tool's setting
    stream = "tools:support.wipe"
    async with so.Runtime([], store=store_url) as rt:
        entries = await rt.audit(stream=stream)
        assert [e.n for e in entries] == [1, 2] and await rt.verify_audit() == []
        # the heads kept leave no gap in the ids readers page through (a ChannelHub waits on one)
        ids = [e.id for e in await rt.audit()]
        assert ids == list(range(1, len(ids) + 1))
    alter(store_url, "DELETE FROM {t}audit WHERE id={p}", entries[-1].id)
    async with so.Runtime([], store=store_url) as rt:
        for problems in (await rt.verify_audit(stream), await rt.verify_audit()):
            assert [(p.id, p.stream, p.n) for p in problems] == [(entries[0].id, stream, 2)]
            assert "missing" in problems[0].reason
        alter(store_url, "DELETE FROM {t}audit WHERE stream={p} AND n>0", stream)
        problems = await rt.verify_audit()
        assert [(p.id, p.stream, p.n) for p in problems] == [(0, stream, 1)]


async def test_a_forged_entry_appended_past_a_chains_head_is_named(store_url: str) -> None:
    """An entry added after the last one with a hash that checks out (anyone can compute one)
    goes past the head the store keeps for its stream: named, for a session and a tool stream."""
    clock = ManualClock()
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt:
        sid = await run_scenario(rt, clock)
        last = (await rt.audit(sid))[-1]
        (tool,) = await rt.audit(stream="tools:support.wipe")
        events = [e async for e in rt.events(sid, follow=False)]
    ((sk,),) = query(store_url, "SELECT sk FROM {t}sessions WHERE id={p}", sid)
    later = events[-1]  # not audited: an entry for it claims a step that is not in the trail
    assert last.seq is not None and later.seq > last.seq
    digest = chain_hash(
        last.hash,
        stream=sid,
        n=last.n + 1,
        type=later.type,
        at=later.at,
        seq=later.seq,
        data=later.data,
    )
    alter(
        store_url,
        "INSERT INTO {t}audit (sk, n, seq, hash) VALUES ({p},{p},{p},{p})",
        sk,
        last.n + 1,
        later.seq,
        bytes.fromhex(digest),
    )
    data = {"agent": "support", "tool": "wipe", "old": "Always", "new": "Never"}
    forged = chain_hash(
        tool.hash, stream=tool.stream, n=2, type=tool.type, at=tool.at, seq=None, data=data
    )
    alter(
        store_url,
        "INSERT INTO {t}audit (stream, n, type, at, data, hash) VALUES ({p},2,{p},{p},{p},{p})",
        tool.stream,
        tool.type,
        tool.at,
        json.dumps(data),
        bytes.fromhex(forged),
    )
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt2:
        listed = await rt2.audit()
        assert listed[-2].seq == later.seq and listed[-1].data == data  # both read back
        problems = await rt2.verify_audit()
        assert [(p.id, p.stream, p.n) for p in problems] == [
            (listed[-2].id, sid, last.n + 1),
            (listed[-1].id, tool.stream, 2),
        ]
        assert all("past the end" in p.reason for p in problems)
        assert [(p.stream, p.n) for p in await rt2.verify_audit(sid)] == [(sid, last.n + 1)]


async def test_an_entry_pointing_at_an_event_again_is_named(store_url: str) -> None:
    """An entry whose hash checks out but points at an event an earlier entry of its session
    already stands for (a step shown twice) is named."""
    clock = ManualClock()
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt:
        sid = await run_scenario(rt, clock)
        entries = await rt.audit(sid)
    first, second = entries[0], entries[1]
    assert first.seq is not None
    # the second entry rewritten to stand for the first's event again, its hash recomputed, and
    # every later hash after it too, up to the head its session keeps
    prev = first.hash
    for e in entries[1:]:
        seq, type_, at, data = (
            (first.seq, first.type, first.at, first.data)
            if e is second
            else (e.seq, e.type, e.at, e.data)
        )
        prev = chain_hash(prev, stream=sid, n=e.n, type=type_, at=at, seq=seq, data=data)
        alter(
            store_url,
            "UPDATE {t}audit SET seq={p}, hash={p} WHERE id={p}",
            seq,
            bytes.fromhex(prev),
            e.id,
        )
    alter(
        store_url,
        "UPDATE {t}sessions SET audit_hash={p} WHERE id={p}",
        bytes.fromhex(prev),
        sid,
    )
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt2:
        problems = await rt2.verify_audit(sid)
        assert [(p.id, p.stream, p.n) for p in problems] == [(second.id, sid, second.n)]
        assert "event" in problems[0].reason


async def test_entries_committed_while_verifying_are_not_named() -> None:
    """Entries a commit adds between reading the heads and reading the entries go past the
    heads first read; the heads read again then cover them, so only a real excess is named."""

    def entry(n: int, prev: str | None) -> AuditEntry:
        digest = chain_hash(prev, stream="s", n=n, type="turn.started", at=1.0, seq=n, data={})
        return AuditEntry(
            id=n,
            stream="s",
            n=n,
            type="turn.started",
            at=1.0,
            seq=n,
            data={},
            prev=prev,
            hash=digest,
        )

    first = entry(1, None)
    second = entry(2, first.hash)

    class Committing:
        def __init__(self, later: int) -> None:
            self.reads = [(1, first.hash), (later, second.hash)]

        async def audit(
            self, *, stream: str | None = None, after_id: int = 0, limit: int = 1000
        ) -> list[AuditEntry]:
            return [e for e in (first, second) if e.id > after_id][:limit]

        async def audit_heads(self, *, stream: str | None = None) -> dict[str, tuple[int, str]]:
            n, digest = self.reads.pop(0) if len(self.reads) > 1 else self.reads[0]
            return {"s": (n, digest)}

        async def stored_requests(
            self, *, session_id: str | None = None, after: str = "", limit: int = 1000
        ) -> list[RequestRow]:
            return []  # no requests: only the chains are checked

    assert await verify_trail(cast(Store, Committing(later=2))) == []
    problems = await verify_trail(cast(Store, Committing(later=1)))
    assert [(p.id, p.n, p.reason) for p in problems] == [
        (2, 2, "entry 2 is past the end of the chain its session keeps")
    ]


async def test_export_to_a_utf8_file_keeps_text_no_encoding_can_hold(tmp_path: Path) -> None:
    """Recorded data may hold a lone surrogate (a model's text): the export still writes every
    entry to a UTF-8 file, that one escaped as JSON allows."""
    a = scripted_agent(
        "support", [call_tools(call("wipe", disk="sd\ud800a")), reply("ok")], tools=[wipe]
    )
    async with so.Runtime([a], store=f"sqlite:///{tmp_path}/a.db") as rt:
        r = await rt.generate("support", prompt="wipe")
        assert r.pending
        out = tmp_path / "trail.jsonl"
        with out.open("w", encoding="utf-8") as f:
            count = await rt.export_audit(f)
        listed = await rt.audit()
    text = out.read_text(encoding="utf-8")
    assert count == len(listed) == len(text.splitlines())
    assert [json.loads(line) for line in text.splitlines()] == [e.to_dict() for e in listed]
    assert "\\ud800" in text


@pytest.mark.parametrize(
    ("prev", "n", "at", "seq", "data"),
    [
        (None, 1, 1.5, None, {}),
        ("ab" * 32, 12, 1700000000.123456, None, {"new": "Never", "old": None}),
        ("00" * 32, 999, 0.1, 7, {"z": [1, {"b": 2, "a": "é\u2028"}], "a": {"n": 3}}),
        (None, 2, -0.0, None, {"at": "x", "seq": 1, "n": "\ud800"}),
    ],
)
def test_chain_parts_hash_as_chain_hash_does(
    prev: str | None, n: int, at: float, seq: int | None, data: dict[str, object]
) -> None:
    """A store chaining an entry itself (PostgreSQL's `record_audit`, in SQL) hashes the
    previous hash, a newline and the parts around the entry's number: the same as `chain_hash`."""
    before, behind = chain_parts(stream="tools:a.t", type="t", at=at, seq=seq, data=data)
    ours = hashlib.sha256(f"{prev or ''}\n".encode() + before + str(n).encode() + behind)
    theirs = chain_hash(prev, stream="tools:a.t", n=n, type="t", at=at, seq=seq, data=data)
    assert ours.hexdigest() == theirs
