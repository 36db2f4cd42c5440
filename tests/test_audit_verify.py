"""Verifying the audit trail: damaged, removed, rewritten, forged or repeated entries are named,
not raised, and entries committed while verifying are not.
"""

import io
import json
from pathlib import Path
from typing import cast

import pytest

import signoff as so
from signoff._audit_trail import verify as verify_trail
from signoff.stores import Store
from signoff.stores._audit import AuditEntry, chain_hash
from signoff.stores._base import RequestRow
from signoff.stores._codec import pack_bytes
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from ._audit import agent, alter, run_scenario, wipe
from ._procs import query


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


async def test_an_event_or_entry_time_that_is_no_number_is_named_not_raised(
    store_url: str,
) -> None:
    """A time edited into what is no number (text SQLite keeps in a REAL column as it is; NaN
    in PostgreSQL's) no longer matches its entry's hash: named, not a ValueError that stops
    every other check."""
    clock = ManualClock()
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt:
        sid = await run_scenario(rt, clock)
        settled = next(e for e in await rt.audit(sid) if e.type == "approval.settled")
        (setting,) = await rt.audit(stream="tools:support.wipe")
    ((sk,),) = query(store_url, "SELECT sk FROM {t}sessions WHERE id={p}", sid)
    damage = "NaN" if store_url.startswith("postgresql") else "soon"
    alter(
        store_url, "UPDATE {t}events SET at={p} WHERE sk={p} AND seq={p}", damage, sk, settled.seq
    )
    alter(store_url, "UPDATE {t}audit SET at={p} WHERE id={p}", damage, setting.id)
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt2:
        problems = await rt2.verify_audit()
        assert sorted((p.id, p.stream, p.reason) for p in problems) == sorted(
            [
                (settled.id, sid, "content does not match"),
                (setting.id, "tools:support.wipe", "content does not match"),
            ]
        )


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


async def test_audited_events_left_without_their_entries_are_named(store_url: str) -> None:
    """The log's audited events must each have their entry: the trail's last entries deleted
    and the session's chain head rewound to the entry left, with their events still in the log
    (the tool's run, here), are named, each event by the entry it would follow."""
    a = scripted_agent(
        "support", [call_tools(call("wipe", disk="sda")), reply("done")], tools=[wipe]
    )
    async with so.Runtime([a], store=store_url) as rt:
        r = await rt.generate("support", prompt="wipe it")
        approve = so.InputResponse(request_id=r.pending[0].id, option_id="approve")
        assert (await rt.respond(r.session_id, [approve])).status == "completed"
        entries = await rt.audit(r.session_id)
        assert await rt.verify_audit() == []
    sid = r.session_id
    ran = [e for e in entries if e.type.startswith("tool.")]
    assert entries[-len(ran) :] == ran and len(ran) == 2
    left = entries[-3]
    ((sk,),) = query(store_url, "SELECT sk FROM {t}sessions WHERE id={p}", sid)
    alter(store_url, "DELETE FROM {t}audit WHERE sk={p} AND n>{p}", sk, left.n)
    alter(
        store_url,
        "UPDATE {t}sessions SET audit_n={p}, audit_hash={p} WHERE sk={p}",
        left.n,
        bytes.fromhex(left.hash),
        sk,
    )
    async with so.Runtime([a], store=store_url) as rt2:
        assert await rt2.audit(sid) == entries[:-2]
        expected = [
            (
                left.id,
                sid,
                left.n + 1,
                f"event {e.seq} of the log ({e.type}) is audited, but no entry of the "
                "session's chain stands for it",
            )
            for e in ran
        ]
        for problems in (await rt2.verify_audit(sid), await rt2.verify_audit()):
            assert [(p.id, p.stream, p.n, p.reason) for p in problems] == expected
        # an event the trail does not audit (the model's response) made an audited one: forged
        ((seq,),) = query(store_url, "SELECT min(seq) FROM {t}events WHERE sk={p} AND type='d'", sk)
        assert seq < entries[0].seq
        alter(store_url, "UPDATE {t}events SET type='k' WHERE sk={p} AND seq={p}", sk, seq)
        forged = (
            0,
            sid,
            1,
            f"event {seq} of the log (approval.settled) is audited, but no entry of the "
            "session's chain stands for it",
        )
        for problems in (await rt2.verify_audit(sid), await rt2.verify_audit()):
            assert [(p.id, p.stream, p.n, p.reason) for p in problems] == [forged, *expected]


async def test_a_log_cut_short_of_the_head_its_session_keeps_is_named(store_url: str) -> None:
    """The newest events deleted, with the last entry and the chain head rewound to the entry
    left, but not the session's `head`: the log ends before the event its session row says is
    its last (the session no longer loads), and verification says so."""
    clock = ManualClock()
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt:
        sid = await run_scenario(rt, clock)
        trail = await rt.audit(sid)
        head = (await rt.state(sid)).seq
    ((sk,),) = query(store_url, "SELECT sk FROM {t}sessions WHERE id={p}", sid)
    keep, gone = trail[-2], trail[-1]
    assert gone.seq is not None and gone.seq < head
    # first only the events of no entry at the log's end: no chain notices
    alter(store_url, "DELETE FROM {t}snapshots WHERE sk={p}", sk)
    alter(store_url, "DELETE FROM {t}events WHERE sk={p} AND seq={p}", sk, head)
    reason = f"the event log ends at event {head - 1}, but its session keeps {head} as its last"
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt2:
        problems = await rt2.verify_audit()
        assert [(p.id, p.stream, p.n, p.reason) for p in problems] == [
            (gone.id, sid, gone.n + 1, reason)
        ]
    # then the last audited event and its entry too, the chain head rewound
    alter(store_url, "DELETE FROM {t}events WHERE sk={p} AND seq>={p}", sk, gone.seq)
    alter(store_url, "DELETE FROM {t}audit WHERE id={p}", gone.id)
    rewind = "UPDATE {t}sessions SET audit_n={p}, audit_hash={p} WHERE sk={p}"
    alter(store_url, rewind, keep.n, bytes.fromhex(keep.hash), sk)
    reason = f"the event log ends at event {gone.seq - 1}, but its session keeps {head} as its last"
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt2:
        for problems in (await rt2.verify_audit(), await rt2.verify_audit(sid)):
            assert [(p.id, p.stream, p.n, p.reason) for p in problems] == [
                (keep.id, sid, keep.n + 1, reason)
            ]


async def test_verifying_a_session_the_store_knows_nothing_of_is_refused(store_url: str) -> None:
    """A session id mistyped or of another store verifies nothing: `UnknownSession`, not an
    empty list that reads as its trail checked out; reading (as a session or as a stream) or
    exporting its trail is refused as well, not an empty trail (each listed nothing). A session
    with no audited event yet, and a tool-setting stream, still verify as clean and read as
    empty."""
    quiet = scripted_agent("quiet", [reply("hello")])
    async with so.Runtime([agent(), quiet], store=store_url) as rt:
        r = await rt.generate("quiet", "hi")
        assert await rt.audit(r.session_id) == []
        assert await rt.verify_audit(r.session_id) == []
        assert await rt.verify_audit("tools:support.wipe") == []
        assert await rt.audit("tools:quiet.nothing") == []
        out = io.StringIO()
        assert await rt.export_audit(out, r.session_id) == 0
        with pytest.raises(so.UnknownSession, match="ses_mistyped"):
            await rt.verify_audit("ses_mistyped")
        with pytest.raises(so.UnknownSession, match="ses_mistyped"):
            await rt.audit("ses_mistyped")
        with pytest.raises(so.UnknownSession, match="ses_mistyped"):
            await rt.audit(stream="ses_mistyped")
        assert await rt.audit(stream=r.session_id) == []
        assert await rt.audit(stream="tools:quiet.nothing") == []
        with pytest.raises(so.UnknownSession, match="ses_mistyped"):
            await rt.export_audit(out, "ses_mistyped")
        assert out.getvalue() == ""
        # An empty id (a form left blank) read every session's trail: refused as the others.
        reads = (rt.audit, lambda sid: rt.audit(stream=sid), rt.verify_audit)
        for call in (*reads, lambda sid: rt.export_audit(out, sid)):
            with pytest.raises(so.UnknownSession):
                await call("")
        assert out.getvalue() == ""


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        ("audit_hash='x'", "the chain does not end with the hash its session keeps"),
        ("audit_n='x'", "the length of the chain its session keeps is not a whole number"),
    ],
)
async def test_a_session_chain_head_edited_into_text_is_named_not_raised(
    tmp_path: Path, edit: str, reason: str
) -> None:
    """SQLite keeps text a hand edit puts in a session row's chain head: reading it raised
    `StoreDamaged` (or a bare ValueError) out of `verify_audit`, so the other sessions were not
    checked at all. That head is named, and the others' problems still are."""
    url = f"sqlite:///{tmp_path}/a.db"
    clock = ManualClock()
    async with so.Runtime([agent()], store=url, clock=clock) as rt:
        edited = await run_scenario(rt, clock)
        other = await run_scenario(rt, clock)
        assert await rt.verify_audit() == []
        changed = next(e for e in await rt.audit(other) if e.type == "approval.settled")
    ((sk,),) = query(url, "SELECT sk FROM {t}sessions WHERE id={p}", other)
    alter(url, "UPDATE events SET at=at+1 WHERE sk=? AND seq=?", sk, changed.seq)
    alter(url, f"UPDATE sessions SET {edit} WHERE id=?", edited)
    async with so.Runtime([agent()], store=url, clock=clock) as rt2:
        problems = [(p.stream, p.reason) for p in await rt2.verify_audit()]
    assert sorted(problems) == sorted([(edited, reason), (other, "content does not match")]), (
        problems
    )


@pytest.mark.parametrize("requests", [None, 7])
async def test_an_entry_asking_no_list_of_requests_is_named_not_raised(
    store_url: str, requests: object
) -> None:
    """An `input.requested` whose `requests` an edit left no list (a null, a number): checking
    the request rows against it raised a bare TypeError out of `verify_audit` (and the
    dashboard's verify, a 500), where the export of the same trail verifies to the entry named;
    now the entry is named in process too."""
    clock = ManualClock()
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt:
        sid = await run_scenario(rt, clock)
        asked = next(e for e in await rt.audit(sid) if e.type == "input.requested")
        events = await rt.store.read_events(sid)
    for event in events:  # each kept on no event before it, so one can change alone
        data = {**event.data, "requests": requests} if event.seq == asked.seq else event.data
        alter(
            store_url,
            "UPDATE {t}events SET data={p} WHERE seq={p} AND sk="
            "(SELECT sk FROM {t}sessions WHERE id={p})",
            pack_bytes(data),
            event.seq,
            sid,
        )
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt2:
        named = [(asked.id, sid, "content does not match")]
        for problems in (await rt2.verify_audit(sid), await rt2.verify_audit()):
            assert [(p.id, p.stream, p.reason) for p in problems] == named
        out = io.StringIO()
        await rt2.export_audit(out)
    exported = so.verify_audit_export(out.getvalue())
    assert [(p.id, p.stream, p.reason) for p in exported] == named


async def test_an_entry_of_no_session_nor_stream_is_named_not_raised(store_url: str) -> None:
    """An audit row whose session key a hand edit cleared (its `stream` is NULL, as a session's
    entries keep it): it was read with no stream, and `verify_audit` raised a bare
    AttributeError (`None.startswith`), its export a line no verifier reads as an entry. It
    reads as a stream naming it, which no chain holds: named, as the session's chain it left."""
    clock = ManualClock()
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt:
        sid = await run_scenario(rt, clock)
        first = (await rt.audit(sid))[0]
    alter(store_url, "UPDATE {t}audit SET sk=NULL WHERE id={p}", first.id)
    orphan = f"entry #{first.id} (of no session or stream)"
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt2:
        problems = await rt2.verify_audit()
        assert {p.stream for p in problems} == {sid, orphan}, problems
        assert (first.id, orphan, "content does not match") in {
            (p.id, p.stream, p.reason) for p in problems
        }
        assert [e.stream for e in await rt2.audit() if e.id == first.id] == [orphan]
        out = io.StringIO()
        await rt2.export_audit(out)
    assert {p.stream for p in so.verify_audit_export(out.getvalue())} == {sid, orphan}
