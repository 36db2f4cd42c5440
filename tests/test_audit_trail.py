"""The audit trail at its edges: tampering on both stores, exports checked offline, paging
while commits land, and malformed arguments."""

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

import signoff as so
from signoff import _audit_trail as audit_trail
from signoff._audit_export import export as export_trail
from signoff._audit_trail import entries as trail_entries
from signoff._audit_trail import verify as verify_trail
from signoff.stores import Store
from signoff.stores._audit import AuditEntry, AuditRow, chain_hash
from signoff.stores._base import RequestRow
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from ._audit import agent, alter, run_scenario, wipe
from ._procs import query
from .conftest import make_store


async def test_malformed_audit_arguments_are_usage_errors(tmp_path: Path) -> None:
    """A limit that is not a whole number from 0, a stream that is not text or holds a lone
    surrogate, and an export target that takes no text are refused by name, not failed on."""
    clock = ManualClock()
    async with so.Runtime([agent()], store=f"sqlite:///{tmp_path}/a.db", clock=clock) as rt:
        sid = await run_scenario(rt, clock)
        assert await rt.audit(sid, limit=0) == []
        assert len(await rt.audit(sid, limit=2)) == 2
        for limit in (-1, "3", 2.5, True, 2**63):
            with pytest.raises(so.UsageError, match="limit"):
                await rt.audit(sid, limit=limit)  # type: ignore[arg-type]
        for bad in (123, b"ses", "ses\ud800"):
            with pytest.raises(so.UsageError):
                await rt.audit(bad)  # type: ignore[arg-type]
            with pytest.raises(so.UsageError):
                await rt.audit(stream=bad)  # type: ignore[arg-type]
            with pytest.raises(so.UsageError):
                await rt.verify_audit(bad)  # type: ignore[arg-type]
            with pytest.raises(so.UsageError):
                await rt.export_audit(io.StringIO(), bad)  # type: ignore[arg-type]
        for out in (None, io.BytesIO()):
            with pytest.raises(so.UsageError, match="text"):
                await rt.export_audit(out)  # type: ignore[arg-type]
        # A file that cannot take every entry's text, or none: refused before a line is
        # written (an ASCII one failed at its first "é", leaving a cut export that verified).
        target = tmp_path / "trail.jsonl"
        for encoding in ("ascii", "cp1252", "latin-1"):
            with target.open("w", encoding=encoding) as f:
                with pytest.raises(so.UsageError, match="encoding='utf-8'"):
                    await rt.export_audit(f)
            assert target.read_bytes() == b""
        with target.open("r", encoding="utf-8") as f:
            with pytest.raises(so.UsageError, match="not writable"):
                await rt.export_audit(f)
        closed = target.open("w", encoding="utf-8")
        closed.close()
        with pytest.raises(so.UsageError, match="closed file"):
            await rt.export_audit(closed)
        for encoding in ("utf-8", "UTF8", "utf-16"):
            with target.open("w", encoding=encoding) as f:
                assert await rt.export_audit(f) == len(await rt.audit())


def chained(stream: str, n: int, entry_id: int, prev: str | None) -> AuditEntry:
    digest = chain_hash(prev, stream=stream, n=n, type="turn.started", at=1.0, seq=n, data={})
    return AuditEntry(
        id=entry_id,
        stream=stream,
        n=n,
        type="turn.started",
        at=1.0,
        seq=n,
        data={},
        prev=prev,
        hash=digest,
    )


class LateCommits:
    """A store whose ids are taken before commit, as PostgreSQL's are: entry 3 (stream a's
    second) commits only after entry 4 has been read, together with entry 5 (a's third)."""

    def __init__(self) -> None:
        a1 = chained("a", 1, 1, None)
        a2 = chained("a", 2, 3, a1.hash)
        a3 = chained("a", 3, 5, a2.hash)
        b1 = chained("b", 1, 2, None)
        b2 = chained("b", 2, 4, b1.hash)
        self.all = [a1, b1, a2, b2, a3]
        self.visible = {1, 2, 4}
        self.heads = {"a": (1, a1.hash), "b": (2, b2.hash)}

    async def audit(
        self, *, stream: str | None = None, after_id: int = 0, limit: int = 1000
    ) -> list[AuditEntry]:
        found = [
            e
            for e in self.all
            if e.id > after_id and e.id in self.visible and stream in (None, e.stream)
        ][:limit]
        if 4 in {e.id for e in found}:  # the late commit lands after this read
            self.visible |= {3, 5}
            self.heads["a"] = (3, self.all[-1].hash)
        return found

    async def audit_heads(self, *, stream: str | None = None) -> dict[str, tuple[int, str]]:
        return {s: h for s, h in self.heads.items() if stream in (None, s)}

    async def stored_requests(
        self, *, session_id: str | None = None, after: str = "", limit: int = 1000
    ) -> list[RequestRow]:
        return []  # no requests: only the chains are checked


async def test_paging_does_not_skip_an_entry_committed_after_a_higher_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On PostgreSQL an entry's id is taken before its commit, so a page can hold id 4 while id 3
    is still uncommitted; a later page then shows its stream's next entry after a hole. Paging
    fetches the stream's missing entries then, so nothing is skipped and nothing is misnamed."""
    for page in (1, 2, 3):
        store = cast(Store, LateCommits())
        listed = [(e.stream, e.n) async for e in trail_entries(store, page=page)]
        for name in ("a", "b"):  # each stream read up to some entry, none skipped before it
            ns = [n for s, n in listed if s == name]
            assert ns == list(range(1, len(ns) + 1)), (page, listed)
        if page == 1:
            assert len(listed) == 5
    monkeypatch.setattr(audit_trail, "PAGE", 1)
    assert await verify_trail(cast(Store, LateCommits())) == []
    out = io.StringIO()
    assert await export_trail(cast(Store, LateCommits()), out) == 5
    assert [json.loads(line)["n"] for line in out.getvalue().splitlines()] == [1, 1, 2, 2, 3]


async def test_paging_on_postgres_does_not_skip_a_late_committed_lower_id(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two transactions on PostgreSQL: one takes an id for session a's next entry and commits
    only after a reader has paged past a higher id of session b; a's entry after it is then
    read, and the late one with it, not skipped."""
    import psycopg

    monkeypatch.setattr(audit_trail, "PAGE", 1)
    clock = ManualClock()
    async with so.Runtime([agent()], store=pg_store_url, clock=clock) as rt:
        a = await run_scenario(rt, clock)
        b = await run_scenario(rt, clock)
        n_a = len(await rt.audit(a))
        ((sk_a,), (sk_b,)) = [
            query(pg_store_url, "SELECT sk FROM {t}sessions WHERE id={p}", s)[0] for s in (a, b)
        ]
        insert = 'INSERT INTO "signoff".audit (sk, n, seq, hash) VALUES (%s, %s, 0, %s)'
        libpq = pg_store_url.split("?")[0]
        with psycopg.connect(libpq) as late, psycopg.connect(libpq, autocommit=True) as other:
            late.execute(insert, (sk_a, n_a + 1, b"\\0" * 32))  # id taken, not committed
            other.execute(insert, (sk_b, 100, b"\\1" * 32))
            reader = trail_entries(rt.store)
            read = [await anext(reader)]
            while read[-1].stream != b:  # up to and past b's new entry
                read.append(await anext(reader))
            while read[-1].n != 100:
                read.append(await anext(reader))
            late.commit()
            other.execute(insert, (sk_a, n_a + 2, b"\\2" * 32))
            read += [e async for e in reader]
        assert [e.n for e in read if e.stream == a] == list(range(1, n_a + 3))


async def test_an_export_is_verified_without_the_database(store_url: str, tmp_path: Path) -> None:
    """An export checks out offline; an entry altered, removed or swapped in the file, or a line
    that is not an entry, is named as `verify_audit` names it in the store."""
    clock = ManualClock()
    a = scripted_agent(
        "ops",
        [call_tools(call("wipe", disk="sd\ud800a")), reply("ok")],
        tools=[wipe],
    )
    async with so.Runtime([agent(), a], store=store_url, clock=clock) as rt:
        sid = await run_scenario(rt, clock)
        await rt.generate("ops", prompt="wipe")
        out = tmp_path / "trail.jsonl"
        with out.open("w", encoding="utf-8") as f:
            count = await rt.export_audit(f)
        again = io.StringIO()
        await rt.export_audit(again)
    text = out.read_text(encoding="utf-8")
    assert again.getvalue() == text  # stable: the same trail exports the same bytes
    lines = text.splitlines()
    assert count == len(lines) and so.verify_audit_export(lines) == []
    rows = [json.loads(line) for line in lines]
    settled = next(i for i, r in enumerate(rows) if r["type"] == "approval.settled")
    assert rows[settled]["stream"] == sid
    forged = dict(rows[settled], data={**rows[settled]["data"], "by": None})
    altered = [*lines[:settled], json.dumps(forged), *lines[settled + 1 :]]
    assert [(p.id, p.stream, p.reason) for p in so.verify_audit_export(altered)] == [
        (rows[settled]["id"], sid, "content does not match")
    ]
    removed = lines[:settled] + lines[settled + 1 :]
    n = rows[settled]["n"]
    assert [(p.stream, p.n, p.reason) for p in so.verify_audit_export(removed)] == [
        (sid, n + 1, f"expected entry {n}")  # the reason names the entry missing
    ]
    swapped = [*lines[:settled], lines[settled + 1], lines[settled], *lines[settled + 2 :]]
    assert so.verify_audit_export(swapped)[0].n == rows[settled]["n"] + 1
    broken = [*lines, "{nope", json.dumps({**rows[0], "n": "1"}), ""]
    problems = so.verify_audit_export(broken)
    assert [(p.id, p.n) for p in problems] == [(len(lines) + 1, 0), (len(lines) + 2, 0)]
    assert all("not an audit entry" in p.reason for p in problems)


async def test_an_export_of_text_holding_the_halves_of_a_pair_verifies(
    store_url: str, tmp_path: Path
) -> None:
    """A high surrogate then a low one as two code points (a reply streamed in chunks that split
    a pair) were exported as the escapes `\\ud83d\\ude00`, which JSON reads as the one character
    they encode together: the untouched export failed with "content does not match". Lone
    surrogates are now the only escaped text, and the export reads them back one by one."""
    odd = "half \ud83d\ude00 of a pair, \U0001f600 whole, \udcff alone, \\ud800 not one"
    a = scripted_agent("ops", [call_tools(call("wipe", disk=odd)), reply("ok")], tools=[wipe])
    async with so.Runtime([a], store=store_url) as rt:
        r = await rt.generate("ops", prompt="wipe")
        assert [p.action.input if p.action else None for p in r.pending] == [{"disk": odd}]
        assert await rt.verify_audit() == []
        out = tmp_path / "trail.jsonl"
        with out.open("w", encoding="utf-8") as f:
            count = await rt.export_audit(f)
        listed = await rt.audit()
    lines = out.read_text(encoding="utf-8").splitlines()
    assert count == len(lines) == len(listed)
    assert so.verify_audit_export(lines) == []
    # Only the lone surrogates are escaped: every other character is written as itself.
    asked = next(line for line in lines if '"input.requested"' in line)
    assert "half \\ud83d\\ude00 of a pair, \U0001f600 whole, \\udcff alone" in asked
    # Altered, the entry is still named.
    altered = [line.replace("\\udcff alone", "\\udcfe alone") for line in lines]
    assert [p.reason for p in so.verify_audit_export(altered)] == ["content does not match"]


async def test_an_events_time_changed_or_entries_copied_to_another_session_are_named(
    store_url: str,
) -> None:
    """Two insider edits docs/audit.md says are detected: an audited event's `at` moved, and a
    session's entries copied onto another session's chain."""
    clock = ManualClock()
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt:
        a = await run_scenario(rt, clock)
        b = await run_scenario(rt, clock)
        settled = next(e for e in await rt.audit(a) if e.type == "approval.settled")
        last_b = (await rt.audit(b))[-1]
    ((sk_a,), (sk_b,)) = [
        query(store_url, "SELECT sk FROM {t}sessions WHERE id={p}", s)[0] for s in (a, b)
    ]
    alter(store_url, "UPDATE {t}events SET at=at+1 WHERE sk={p} AND seq={p}", sk_a, settled.seq)
    alter(
        store_url,
        "INSERT INTO {t}audit (sk, n, seq, hash) SELECT {p}, n + {p}, seq, hash FROM {t}audit "
        "WHERE sk={p}",
        sk_b,
        last_b.n,
        sk_a,
    )
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt2:
        problems = await rt2.verify_audit()
        assert (settled.id, a, settled.n, "content does not match") in [
            (p.id, p.stream, p.n, p.reason) for p in problems
        ]
        assert [(p.stream, p.n) for p in problems if p.stream == b][0] == (b, last_b.n + 1)


class Counting:
    """A store that counts what verification asks of it: each read's scope, and the most
    request rows and sessions one read returned."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.unscoped: list[str] = []
        self.most_rows = self.most_sessions = 0
        self.sessions: list[str] = []

    async def audit(self, **kw: Any) -> list[AuditEntry]:
        if kw.get("stream") is None and not kw.get("sessions") and not kw.get("others"):
            self.unscoped.append("audit")
        return await self.store.audit(**kw)

    async def audit_heads(self, **kw: Any) -> dict[str, tuple[int, str | None]]:
        if kw.get("stream") is None and not kw.get("others"):
            self.unscoped.append("audit_heads")
        return await self.store.audit_heads(**kw)

    async def audit_sessions(self, **kw: Any) -> dict[str, tuple[int, str | None]]:
        heads = await self.store.audit_sessions(**kw)
        self.most_sessions = max(self.most_sessions, len(heads))
        self.sessions += heads
        return heads

    async def stored_requests(self, **kw: Any) -> list[RequestRow]:
        if kw.get("session_id") is None and kw.get("sessions") is None:
            self.unscoped.append("stored_requests")
        rows = await self.store.stored_requests(**kw)
        self.most_rows = max(self.most_rows, len(rows))
        return rows


async def test_a_whole_store_is_verified_a_page_of_sessions_at_a_time(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Verifying a whole store never reads every session's heads, rows or entries at once: a
    page of sessions at a time, then the other streams, so what it holds does not grow with
    the store; and it finds what it finds reading them all at once."""
    clock = ManualClock()
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt:
        sids = [await run_scenario(rt, clock) for _ in range(7)]
        for page in (1000, 2):
            monkeypatch.setattr(audit_trail, "SESSIONS_PAGE", page)
            counted = Counting(rt.store)
            assert await verify_trail(cast(Store, counted)) == []
            assert counted.unscoped == [] and sorted(counted.sessions) == sorted(sids)
        assert counted.most_sessions == 2 and counted.most_rows == 2 * 2  # two requests each
        settled = next(e for e in await rt.audit(sids[-1]) if e.type == "approval.settled")
    alter(store_url, "UPDATE {t}events SET at=at+1 WHERE seq={p}", settled.seq)  # every session
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt:
        found = []
        for page in (1000, 2):
            monkeypatch.setattr(audit_trail, "SESSIONS_PAGE", page)
            problems = await verify_trail(rt.store)
            found.append(sorted((p.stream, p.id, p.n, p.reason) for p in problems))
        assert found[0] == found[1] and {p[0] for p in found[0]} == set(sids)


class Plain:
    """A store as verification read it before windows: the same reads, no `audit_window`, so
    the other streams are read a page of matching entries at a time, as they were."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def audit(self, **kw: Any) -> list[AuditEntry]:
        return await self.store.audit(**kw)

    async def audit_heads(self, **kw: Any) -> dict[str, tuple[int, str | None]]:
        return await self.store.audit_heads(**kw)

    async def audit_sessions(self, **kw: Any) -> dict[str, tuple[int, str | None]]:
        return await self.store.audit_sessions(**kw)

    async def stored_requests(self, **kw: Any) -> list[RequestRow]:
        return await self.store.stored_requests(**kw)


class Windows(Plain):
    """Counts the reads of the other streams (those of no session): each one's bounds."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.reads: list[dict[str, Any]] = []

    async def audit(self, **kw: Any) -> list[AuditEntry]:
        found = await self.store.audit(**kw)
        if kw.get("others"):
            self.reads.append({**kw, "found": len(found)})
        return found

    async def audit_window(self, **kw: Any) -> int | None:
        return await self.store.audit_window(**kw)


async def sparse_trail(store_url: str) -> tuple[list[AuditEntry], list[AuditEntry], AuditEntry]:
    """A trail whose few entries of no session (tool-setting streams) lie among many of sessions:
    the whole trail in id order, those entries, and an approval settled in a session."""
    clock = ManualClock()
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt:
        for k in range(4):
            sid = await run_scenario(rt, clock)
            tool = f"t{k % 2}"
            data = {"agent": "ops", "tool": tool, "old": None, "new": str(k)}
            row = AuditRow(
                stream=f"tools:ops.{tool}",
                type="tool.approval_changed",
                at=clock(),
                seq=None,
                data=data,
            )
            await rt.store.record_audit([row])
        trail = await rt.audit()
        settled = next(e for e in await rt.audit(sid) if e.type == "approval.settled")
    others = [e for e in trail if e.stream.startswith("tools:")]
    return trail, others, settled


async def test_the_streams_of_no_session_are_verified_a_bounded_window_at_a_time(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entries of no session are few among all: each read of them looks at a window of at
    most a page of entries by id, not at the whole trail to fill a page, and the windows follow
    one another to the trail's end; it finds what reading them a page of matches at a time
    found, altered entries in the second window and on a window's edge included."""
    trail, others, settled = await sparse_trail(store_url)
    ranks = {e.id: i for i, e in enumerate(trail, 1)}
    edge, second = others[2], others[3]  # the first after session 1, the one after session 2
    page = ranks[edge.id]  # `edge` ends the first window, `second` lies in the second
    assert page < ranks[second.id] <= 2 * page < len(trail)
    alter(store_url, "UPDATE {t}audit SET at=at+1 WHERE id={p}", edge.id)
    alter(store_url, "UPDATE {t}audit SET at=at+2 WHERE id={p}", second.id)
    alter(store_url, "UPDATE {t}events SET at=at+1 WHERE seq={p}", settled.seq)  # every session
    store = make_store(store_url)
    try:
        before = await verify_trail(cast(Store, Plain(store)))
        named = {(p.id, p.stream, p.n, p.reason) for p in before}
        for e in (edge, second):
            assert (e.id, e.stream, e.n, "content does not match") in named
        assert (settled.id, settled.stream, settled.n, "content does not match") in named
        for size in (1, 2, 3, page, 1000):
            monkeypatch.setattr(audit_trail, "PAGE", size)
            counted = Windows(store)
            assert await verify_trail(cast(Store, counted)) == before, size
            reads = counted.reads
            assert len(reads) >= len(trail) // size
            assert reads[0]["after_id"] == 0
            for prev, read in zip(reads, reads[1:], strict=False):
                assert read["after_id"] == prev["upto_id"]  # no entry between two windows
            assert reads[-1]["upto_id"] == trail[-1].id
            for read in reads:
                ((scanned,),) = query(
                    store_url,
                    "SELECT count(*) FROM {t}audit WHERE id>{p} AND id<={p}",
                    read["after_id"],
                    read["upto_id"],
                )
                assert 0 < scanned <= size and read["found"] <= size
            if size == page:
                hit = [read["found"] for read in reads[:2]]
                assert hit[0] >= 3 and hit[1] >= 1  # open's two, `edge`; `second`
    finally:
        await store.close()


@pytest.mark.parametrize("field", ["id", "n"])
def test_an_export_line_with_true_for_a_number_is_not_an_entry(field: str) -> None:
    """JSON `true` is no entry number, though Python counts a bool as an int: the line is named,
    not checked as entry 1."""
    data = {"tool": "wipe"}
    digest = chain_hash(None, stream="s", n=1, type="tool.started", at=1.0, seq=None, data=data)
    entry = {"id": 1, "stream": "s", "n": 1, "type": "tool.started", "at": 1.0, "seq": None}
    entry |= {"data": data, "prev": None, "hash": digest}
    assert so.verify_audit_export([json.dumps(entry)]) == []
    problems = so.verify_audit_export([json.dumps({**entry, field: True})])
    assert [(p.id, p.n, p.reason) for p in problems] == [
        (1, 0, "line 1 is not an audit entry: id and n must be whole numbers")
    ]


def test_an_export_written_before_only_lone_surrogates_were_escaped_still_verifies() -> None:
    """An export from an earlier signoff escaped all the non-ASCII text of an entry holding a
    lone surrogate, a character above U+FFFF as an escaped pair: read as that pair, it checks
    out; altered, it is named."""
    data = {"text": "\U0001f600 beside \udcff", "more": "\\ud83d"}
    digest = chain_hash(None, stream="s", n=1, type="tool.completed", at=1.0, seq=None, data=data)
    entry = {"id": 1, "stream": "s", "n": 1, "type": "tool.completed", "at": 1.0, "seq": None}
    entry |= {"data": data, "prev": None, "hash": digest}
    old = json.dumps(entry, separators=(",", ":"))
    assert "\\ud83d\\ude00 beside \\udcff" in old
    assert so.verify_audit_export([old]) == []
    forged = old.replace("beside", "besides")
    assert [p.reason for p in so.verify_audit_export([forged])] == ["content does not match"]


async def test_an_export_given_whole_as_text_verifies_and_bytes_are_refused(
    tmp_path: Path,
) -> None:
    """An export's whole text (`f.read()`) was checked a character at a time, every one named
    as a line that is no entry; a file opened in binary mode named each line so, and None was
    a bare TypeError. The text is read line by line now, and bytes or no lines are refused."""
    clock = ManualClock()
    async with so.Runtime([agent()], store=f"sqlite:///{tmp_path}/a.db", clock=clock) as rt:
        await run_scenario(rt, clock)
        out = io.StringIO()
        await rt.export_audit(out)
    text = out.getvalue()
    assert len(text.splitlines()) > 10 and so.verify_audit_export(text.splitlines()) == []
    assert so.verify_audit_export(text) == []
    # a line separator in an entry's text is no end of a line: it stays in its entry
    entry = json.loads(text.split("\n")[0])
    data = {"note": "a\u2028b\x85c"}
    digest = chain_hash(None, stream="s", n=1, type="t", at=1.0, seq=None, data=data)
    entry |= {"stream": "s", "n": 1, "type": "t", "at": 1.0, "seq": None, "data": data}
    entry |= {"prev": None, "hash": digest}
    assert so.verify_audit_export(json.dumps(entry, ensure_ascii=False) + "\n") == []
    tampered = text.replace('"n":2,', '"n":3,', 1)
    assert tampered != text and so.verify_audit_export(tampered) != []
    for bad in (text.encode(), io.BytesIO(text.encode()), [text.encode()], None, 3):
        with pytest.raises(so.UsageError, match="lines of text"):
            so.verify_audit_export(bad)  # type: ignore[arg-type]


async def test_an_exports_file_name_given_for_its_text_is_refused(tmp_path: Path) -> None:
    """`so.verify_audit_export("trail.jsonl")` read the name as a one-line export and reported
    it as a line that is not an audit entry: an export of a sound trail, checked by its path,
    read as tampered with. A file name is refused, saying to open the file; the file verifies."""
    clock = ManualClock()
    path = tmp_path / "trail.jsonl"
    async with so.Runtime([agent()], store=f"sqlite:///{tmp_path}/a.db", clock=clock) as rt:
        await run_scenario(rt, clock)
        with path.open("w", encoding="utf-8") as f:
            await rt.export_audit(f)
    for name in (str(path), "trail.jsonl", " trail.jsonl "):
        with pytest.raises(so.UsageError, match=r"takes the export itself, not .*open it"):
            so.verify_audit_export(name)
    with path.open(encoding="utf-8") as f:
        assert so.verify_audit_export(f) == []
    # Text that has a line, or begins as an entry, is read as an export: what is wrong in it is
    # named, as before.
    assert [p.id for p in so.verify_audit_export("trail.jsonl\n")] == [1]
    assert [p.id for p in so.verify_audit_export('{"id": 1}')] == [1]
    assert so.verify_audit_export("") == [] and so.verify_audit_export(" ") == []


@pytest.mark.parametrize(
    "hostile",
    [
        pytest.param(lambda e: e.replace('"at":1.0', '"at":' + "9" * 400), id="time-past-float"),
        pytest.param(lambda e: "[" * 100_000 + "]" * 100_000, id="nested-line"),
        pytest.param(
            lambda e: e.replace('{"tool":"wipe"}', "[" * 100_000 + "]" * 100_000),
            id="nested-data",
        ),
    ],
)
def test_a_hostile_export_line_is_named_not_raised(hostile: Callable[[str], str]) -> None:
    """A line a forger wrote to make a checker fail (a time no float holds, nesting deeper
    than a reader recurses) is named as no entry, and the lines after it are still checked."""
    data = {"tool": "wipe"}
    digest = chain_hash(None, stream="s", n=1, type="tool.started", at=1.0, seq=None, data=data)
    entry = {"id": 1, "stream": "s", "n": 1, "type": "tool.started", "at": 1.0, "seq": None}
    entry |= {"data": data, "prev": None, "hash": digest}
    line = json.dumps(entry, separators=(",", ":"))
    problems = so.verify_audit_export([hostile(line), line])
    assert [(p.id, p.n) for p in problems] == [(1, 0)]
    assert problems[0].reason.startswith("line 1 is not an audit entry: ")


async def test_an_export_written_with_a_byte_order_mark_verifies(tmp_path: Path) -> None:
    """A file opened with `encoding="utf-8-sig"` (as tools on Windows write UTF-8) starts with a
    byte order mark, which a reader opening it as UTF-8 keeps: not taken for a damaged entry."""
    clock = ManualClock()
    out = tmp_path / "trail.jsonl"
    async with so.Runtime([agent()], store=f"sqlite:///{tmp_path}/a.db", clock=clock) as rt:
        await run_scenario(rt, clock)
        with out.open("w", encoding="utf-8-sig") as f:
            await rt.export_audit(f)
    with out.open(encoding="utf-8") as f:
        assert f.read(1) == "\ufeff"
        f.seek(0)
        assert so.verify_audit_export(f) == []
    assert so.verify_audit_export(out.read_text(encoding="utf-8")) == []
