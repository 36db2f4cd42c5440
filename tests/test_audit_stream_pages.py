"""Reads of one audit stream page by page: in the stream's index order (`n`, its order of ids),
each page bounded by the page (on SQLite, a search of the index), the same entries as by id."""

from __future__ import annotations

from typing import Any

import signoff as so
from signoff.stores import SQLiteStore
from signoff.stores._audit import AuditRow
from signoff.testing import call, call_tools, reply, scripted_agent


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
