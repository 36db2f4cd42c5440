"""Reads of one audit stream page by page: in the stream's index order (`n`, its order of ids),
each page bounded by the page (on SQLite, a search of the index), the same entries as by id."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.stores import SQLiteStore
from signoff.stores._audit import DAMAGED, AuditRow
from signoff.testing import call, call_tools, reply, scripted_agent

from ._audit import alter


@so.tool(approval=so.always())
def wipe() -> str:
    """Wipe."""
    return "wiped"


def _rows(stream: str, count: int) -> list[AuditRow]:
    return [
        AuditRow(stream=stream, type="dashboard.signed_out", at=1.0, seq=None, data={"i": i})
        for i in range(count)
    ]


async def _paged(store: Any, stream: str, after: int = 0, page: int = 7) -> list[Any]:
    out = []
    while True:
        got = await store.audit(stream=stream, after_id=after, limit=page)
        out += got
        if len(got) < page:
            return out
        after = got[-1].id


async def test_a_stream_read_page_by_page_is_read_from_its_index_without_a_sort(
    store_url: str,
) -> None:
    """Each page of one stream read and sorted the whole rest of the stream by id before its
    LIMIT: 100,000 sign-outs (which every server process reads at its first sign-in check)
    took 5.5 s, growing with the square of the stream; now a search of its index."""
    steps = [call_tools(call("wipe")), reply("Done.")] * 3
    agent = scripted_agent("a", steps, tools=[wipe])
    async with so.Runtime([agent], store=store_url) as rt:
        store: Any = rt.store
        r = await rt.generate("a", "one")
        sid = r.session_id
        await store.record_audit(_rows("x:a", 20) + _rows("x:b", 20))
        for _ in range(3):
            (request,) = r.pending
            await rt.respond(sid, [so.InputResponse(request_id=request.id, option_id="approve")])
            await store.record_audit(_rows("x:a", 5))
            r = await rt.generate(session_id=sid, prompt="again")
        whole = {s: await store.audit(stream=s, limit=1000) for s in ("x:a", "x:b", sid)}
        assert [len(whole[s]) for s in ("x:a", "x:b")] == [35, 20] and len(whole[sid]) > 10
        for stream, entries in whole.items():
            assert [e.id for e in entries] == sorted(e.id for e in entries)
            assert await _paged(store, stream) == entries
            # From an id that is not the stream's (another's, or none): read by id, as before.
            other = whole["x:b" if stream != "x:b" else "x:a"][3].id
            assert await _paged(store, stream, after=other) == [e for e in entries if e.id > other]
        if not isinstance(store, SQLiteStore):
            return
        plans: list[str] = []
        real = store.conn
        execute = real.execute

        def explained(sql: str, params: Any = ()) -> Any:
            if "FROM audit a" in sql:
                plans.extend(str(r[-1]) for r in execute("EXPLAIN QUERY PLAN " + sql, params))
            return execute(sql, params)

        class Explaining:
            def __getattr__(self, name: str) -> Any:
                return explained if name == "execute" else getattr(real, name)

        conn, store._conn = store._conn, Explaining()  # type: ignore[assignment]
        try:
            await store.audit(stream="x:a", after_id=whole["x:a"][5].id, limit=5)
        finally:
            store._conn = conn
        assert any("USING INDEX audit_by_stream (stream=? AND n>?)" in p for p in plans), plans
        assert not any("TEMP B-TREE" in p for p in plans), plans


@so.tool
async def step(i: int) -> int:
    """Step."""
    return i


def _stepper(steps: int) -> so.Agent:
    calls = [call_tools(call("step", i=i)) for i in range(steps)]
    return scripted_agent("a", [*calls, reply("done")], tools=[step])


# `n` made text, a BLOB or a real (SQLite keeps each in its INTEGER column), another number, or
# a number below every other: each sorts elsewhere than its entry's id.
MOVED = ["'x'", "x'01'", "2.5", "1e300", "0.5", "500"]


async def _read_moved(url: str, which: int, moved: str) -> None:
    """Entry `which` of a session's stream and of another stream, of 20 each, given the `n`
    `moved`: each stream read 7 at a time by `Store.audit` is its entries in the whole trail."""
    async with so.Runtime([_stepper(10)], store=url) as rt:
        store: Any = rt.store
        sid = (await rt.generate("a", "go")).session_id
        await store.record_audit(_rows("x:a", 20) + _rows("x:b", 20))
        assert len(await rt.audit(sid)) == 20
    alter(url, f"UPDATE {{t}}audit SET n={moved} WHERE stream='x:a' AND n={{p}}", which)
    alter(url, f"UPDATE {{t}}audit SET n={moved} WHERE n={{p}} AND sk IS NOT NULL", which)
    async with so.Runtime([_stepper(10)], store=url) as rt:
        store = rt.store
        trail = await store.audit(limit=1000)
        for stream in ("x:a", sid, "x:b"):
            by_id = [e for e in trail if e.stream == stream]
            assert len(by_id) == 20
            assert await _paged(store, stream) == by_id, stream


@pytest.mark.parametrize("moved", MOVED)
@pytest.mark.parametrize("which", [1, 7, 8, 10, 20])
async def test_a_stream_whose_n_a_hand_edit_moved_reads_as_by_id(
    tmp_path: Path, which: int, moved: str
) -> None:
    """Read by `n` past the last entry's `n` and id, a page skipped an entry whose `n` a hand
    edit left sorting after the page's (SQLite sorts text after every number): 'x' at entry 10
    of 20 read 7 at a time lost it, and so did 0.5 at the last. A page read by `n` stands only
    while it numbers on one by one, to the head if it is the last: else it is read by id."""
    await _read_moved(f"sqlite:///{tmp_path / 'state.db'}", which, moved)


@pytest.mark.parametrize("which", [1, 8, 20])
async def test_a_stream_whose_n_a_hand_edit_renumbered_reads_as_by_id(
    store_url: str, which: int
) -> None:
    """PostgreSQL's `n` is a BIGINT, which holds no text, but an entry renumbered past the
    others (500) was skipped by its reads by `n` as well: both backends read it where its id
    is."""
    await _read_moved(store_url, which, "500")


@pytest.mark.parametrize("moved", MOVED)
async def test_an_entry_with_its_n_damaged_is_named_past_the_first_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moved: str
) -> None:
    """A session of more entries than a page, one of whose `n` a hand edit made text: its
    trail was listed and exported without it and no error, and verifying the session blamed
    the next entry ('expected entry 5'), where verifying all named it. Each now names it: the
    listing and the export refuse it, and both verifications name it alone (an `n` made
    another number, out of place, is listed where its id is, and named there by both)."""
    monkeypatch.setattr("signoff._audit_trail.PAGE", 7)
    url = f"sqlite:///{tmp_path / 'state.db'}"
    async with so.Runtime([_stepper(10)], store=url) as rt:
        sid = (await rt.generate("a", "go")).session_id
        damaged, following = (await rt.audit(sid))[4:6]
    alter(url, f"UPDATE audit SET n={moved} WHERE id=?", damaged.id)
    async with so.Runtime([_stepper(10)], store=url) as rt:
        problems = [(damaged.id, sid, DAMAGED, "its n is not a whole number")]
        if moved == "500":  # a number out of place: it, and the next for not following it
            problems = [
                (damaged.id, sid, 500, "expected entry 5"),
                (following.id, sid, 6, "expected entry 501"),
            ]
        for verified in (await rt.verify_audit(sid), await rt.verify_audit()):
            assert [(p.id, p.stream, p.n, p.reason) for p in verified] == problems
        if moved == "500":
            trail = [e.id for e in await rt.audit() if e.stream == sid]
            assert [e.id for e in await rt.audit(sid)] == trail and len(trail) == 20
            return
        named = rf"audit entry {damaged.id} of '{sid}' is damaged: its n is not a number"
        for read in (rt.audit, lambda s: rt.export_audit(io.StringIO(), s)):
            with pytest.raises(so.StoreError, match=named):
                await read(sid)
