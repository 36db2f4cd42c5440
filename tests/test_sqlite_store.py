"""The SQLite store: WAL, compare-and-set commits that write all or nothing, leases, the queue."""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff._audit_trail import entries as trail_entries
from signoff.stores import Commit, PendingFilter, Resolve, SQLiteStore, open_store
from signoff.stores import sqlite as sqlite_store
from signoff.stores._audit import AUDIT_TYPES, AuditRow
from signoff.stores._codec import needs_previous, stored_type
from signoff.testing import ExecutionLog, call, call_tools, reply, scripted_agent


def event(sid: str, seq: int, type: Any = "session.waiting", **data: Any) -> so.Event:
    return so.Event(session_id=sid, seq=seq, type=type, at=float(seq), data=data)


def request(
    sid: str,
    rid: str,
    *,
    agent: str = "a",
    tool: str = "refund",
    kind: Any = "tool-approval",
    at: float = 1.0,
) -> so.InputRequest:
    action = so.Action(call_id=f"call_{rid}", tool_name=tool, input={}, input_hash="sha256:0")
    return so.InputRequest(
        kind=kind,
        id=rid,
        session_id=sid,
        turn_id="trn_1",
        agent=agent,
        action=action if kind == "tool-approval" else None,
        question=None if kind == "tool-approval" else "which one?",
        created_at=at,
    )


def settle(rid: str) -> Resolve:
    return Resolve(request_id=rid, status="settled", outcome="approved", resolution={"ok": True})


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(f"sqlite:///{tmp_path / 'state.db'}")
    await s.open()
    yield s
    await s.close()


async def new_session(store: SQLiteStore, sid: str, agent: str = "a") -> None:
    await store.create_session(sid, agent, [event(sid, 1, "session.created", agent=agent)], None)


async def count(store: SQLiteStore, table: str) -> int:
    row = store.conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()
    return int(row[0])


async def test_wal_mode_is_on(store: SQLiteStore, tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "state.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.file_bytes() > 0


async def test_commit_appends_and_moves_the_head(store: SQLiteStore) -> None:
    await new_session(store, "s1")
    await store.commit(Commit(session_id="s1", expected_seq=1, events=[event("s1", 2)]))
    assert await store.head("s1") == 2
    assert [e.seq for e in await store.read_events("s1")] == [1, 2]
    assert [e.seq for e in await store.read_events("s1", after=1)] == [2]
    assert [e.type for e in await store.read_events("s1", types=["session.created"])] == [
        "session.created"
    ]
    assert len(await store.read_events("s1", limit=1)) == 1


async def test_stale_expected_seq_raises_and_writes_nothing(store: SQLiteStore) -> None:
    await new_session(store, "s1")
    await store.commit(Commit(session_id="s1", expected_seq=1, events=[event("s1", 2)]))
    events_before = await count(store, "events")
    stale = Commit(
        session_id="s1",
        expected_seq=1,
        events=[event("s1", 2), event("s1", 3)],
        new_requests=[request("s1", "req_new")],
        snapshot={"seq": 3, "v": so.SCHEMA_VERSION},
    )
    with pytest.raises(so.AppendConflict, match="seq 2, not 1"):
        await store.commit(stale)
    assert await store.head("s1") == 2
    assert await count(store, "events") == events_before
    assert await store.get_request("req_new") is None
    assert await count(store, "snapshots") == 0


async def test_resolve_of_a_closed_request_rolls_back_the_whole_commit(
    store: SQLiteStore,
) -> None:
    await new_session(store, "s1")
    await store.commit(
        Commit(
            session_id="s1",
            expected_seq=1,
            events=[event("s1", 2)],
            new_requests=[request("s1", "req_a"), request("s1", "req_b")],
        )
    )
    await store.commit(
        Commit(session_id="s1", expected_seq=2, events=[event("s1", 3)], resolve=[settle("req_a")])
    )
    stored = await store.get_request("req_a")
    assert stored is not None and stored.status == "settled" and stored.resolution == {"ok": True}
    events_before = await count(store, "events")
    with pytest.raises(so.RequestClosed) as info:
        await store.commit(
            Commit(
                session_id="s1",
                expected_seq=3,
                events=[event("s1", 4), event("s1", 5)],
                # req_b would settle, but req_a is closed: neither may change
                resolve=[settle("req_b"), settle("req_a")],
                new_requests=[request("s1", "req_c")],
                snapshot={"seq": 5, "v": so.SCHEMA_VERSION},
                durable=True,
            )
        )
    assert info.value.request_ids == ["req_a"]
    assert await store.head("s1") == 3
    assert await count(store, "events") == events_before
    b = await store.get_request("req_b")
    assert b is not None and b.status == "pending"
    assert await store.get_request("req_c") is None
    assert await count(store, "snapshots") == 0
    # the connection is usable afterwards: the transaction really ended
    await store.commit(
        Commit(session_id="s1", expected_seq=3, events=[event("s1", 4)], resolve=[settle("req_b")])
    )
    assert await store.head("s1") == 4


async def test_resolve_cannot_reach_another_sessions_request(store: SQLiteStore) -> None:
    await new_session(store, "s1")
    await new_session(store, "s2")
    await store.commit(
        Commit(
            session_id="s2",
            expected_seq=1,
            events=[event("s2", 2)],
            new_requests=[request("s2", "req_other")],
        )
    )
    with pytest.raises(so.RequestClosed):
        await store.commit(
            Commit(
                session_id="s1",
                expected_seq=1,
                events=[event("s1", 2)],
                resolve=[settle("req_other")],
            )
        )
    other = await store.get_request("req_other")
    assert other is not None and other.status == "pending"
    assert await store.head("s1") == 1


async def test_unknown_sessions_and_duplicates(store: SQLiteStore) -> None:
    with pytest.raises(so.UnknownSession):
        await store.commit(Commit(session_id="nope", expected_seq=1, events=[event("nope", 2)]))
    with pytest.raises(so.UnknownSession):
        await store.read_events("nope")
    with pytest.raises(so.UnknownSession):
        await store.acquire_lease("nope", "w", 10, 0)
    assert await store.load("nope") is None
    assert await store.head("nope") is None
    await new_session(store, "s1")
    with pytest.raises(so.StoreError, match="already exists"):
        await new_session(store, "s1")


# -- leases and fencing ---------------------------------------------------------------------------


async def test_lease_acquire_renew_release_and_fencing(store: SQLiteStore) -> None:
    await new_session(store, "s1")
    assert await store.acquire_lease("s1", "A", 10, now=100) == 1
    assert await store.acquire_lease("s1", "B", 10, now=105) is None  # held by A
    assert await store.acquire_lease("s1", "A", 10, now=106) == 2  # re-acquiring fences the old
    # an append under the stale token is refused, and nothing is written
    with pytest.raises(so.LeaseLost):
        await store.commit(
            Commit(session_id="s1", expected_seq=1, events=[event("s1", 2)], lease_token=1)
        )
    assert await store.head("s1") == 1
    await store.commit(
        Commit(session_id="s1", expected_seq=1, events=[event("s1", 2)], lease_token=2)
    )
    assert await store.renew_lease("s1", "A", 1, 10, now=107) is False
    assert await store.renew_lease("s1", "B", 2, 10, now=107) is False
    assert await store.renew_lease("s1", "A", 2, 10, now=108) is True  # now until 118
    assert await store.acquire_lease("s1", "B", 10, now=115) is None
    assert await store.acquire_lease("s1", "B", 10, now=118.5) == 3  # A's lease expired
    with pytest.raises(so.LeaseLost):
        await store.commit(
            Commit(session_id="s1", expected_seq=2, events=[event("s1", 3)], lease_token=2)
        )
    assert await store.head("s1") == 2
    assert await store.renew_lease("s1", "A", 2, 10, now=119) is False
    await store.release_lease("s1", "A", 2)  # not A's any more: no effect
    assert await store.acquire_lease("s1", "A", 10, now=120) is None
    await store.release_lease("s1", "B", 3)
    assert await store.acquire_lease("s1", "A", 10, now=120) == 4  # free at once after release
    with pytest.raises(so.LeaseLost):
        await store.commit(
            Commit(session_id="s1", expected_seq=2, events=[event("s1", 3)], lease_token=3)
        )


async def test_two_stores_on_one_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    a, b = SQLiteStore(url), SQLiteStore(url)
    try:
        await new_session(a, "s1")
        assert await b.head("s1") == 1
        await a.commit(Commit(session_id="s1", expected_seq=1, events=[event("s1", 2)]))
        assert await b.head("s1") == 2
        with pytest.raises(so.AppendConflict):
            await b.commit(Commit(session_id="s1", expected_seq=1, events=[event("s1", 2, x=1)]))
        assert (await a.read_events("s1"))[-1].data == {}
        assert await a.acquire_lease("s1", "A", 10, 0) == 1
        assert await b.acquire_lease("s1", "B", 10, 1) is None
    finally:
        await a.close()
        await b.close()


async def test_a_held_write_lock_is_a_store_error_not_a_hang(tmp_path: Path) -> None:
    store = SQLiteStore(f"sqlite:///{tmp_path / 'state.db'}", busy_timeout=0.05)
    await new_session(store, "s1")
    blocker = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        with pytest.raises(so.StoreError, match="locked"):
            await store.commit(Commit(session_id="s1", expected_seq=1, events=[event("s1", 2)]))
        blocker.execute("ROLLBACK")
        assert await store.head("s1") == 1
        await store.commit(Commit(session_id="s1", expected_seq=1, events=[event("s1", 2)]))
        assert await store.head("s1") == 2
    finally:
        blocker.close()
        await store.close()


@pytest.mark.parametrize("busy_timeout", [-1, float("nan"), float("inf"), 86_401, 1e12, True, "5"])
def test_a_busy_timeout_out_of_its_range_is_refused_and_no_file_made(
    tmp_path: Path, busy_timeout: Any
) -> None:
    """NaN or infinity failed at open (`int()` of it), a huge one overflowed SQLite's
    millisecond count, and a negative one turned the wait off: each is a `UsageError` now."""
    with pytest.raises(
        so.UsageError, match=r"^busy_timeout must be a number of seconds, from 0 to 86400, not "
    ):
        SQLiteStore(f"sqlite:///{tmp_path / 'state.db'}", busy_timeout=busy_timeout)
    assert not (tmp_path / "state.db").exists()
    assert SQLiteStore(f"sqlite:///{tmp_path / 'state.db'}", busy_timeout=0).busy_timeout == 0


@pytest.mark.parametrize("url", [5, None, b"sqlite:///state.db"])
def test_a_url_that_is_not_text_is_a_store_error_as_for_postgres(url: Any) -> None:
    """It raised AttributeError; `PostgresStore` says the same of one (the URL is data, its
    keyword arguments are the developer's: `busy_timeout` above and `migrate` are UsageError)."""
    with pytest.raises(so.StoreError, match="^not a SQLite URL"):
        SQLiteStore(url)


def test_a_migrate_argument_that_is_not_a_bool_is_misuse(tmp_path: Path) -> None:
    with pytest.raises(so.UsageError, match="^migrate must be True or False, not 'no'"):
        SQLiteStore(f"sqlite:///{tmp_path / 'state.db'}", migrate="no")  # type: ignore[arg-type]
    assert not (tmp_path / "state.db").exists()


async def test_every_write_held_up_past_busy_timeout_is_a_store_error(tmp_path: Path) -> None:
    store = SQLiteStore(f"sqlite:///{tmp_path / 'state.db'}", busy_timeout=0.05)
    await new_session(store, "s1")
    writes = {
        "create_session": lambda: new_session(store, "s2"),
        "acquire_lease": lambda: store.acquire_lease("s1", "o", 10, 0),
        "renew_lease": lambda: store.renew_lease("s1", "o", 1, 10, 0),
        "release_lease": lambda: store.release_lease("s1", "o", 1),
        "claim": lambda: store.claim("o", 10, 0, 5),
        "record_audit": lambda: store.record_audit(
            [AuditRow(stream="tools:a.x", type="tool.approval_changed", at=1, seq=None, data={})]
        ),
    }
    blocker = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        for name, write in writes.items():
            with pytest.raises(so.StoreError, match="locked"):
                await write()
            assert not store.conn.in_transaction, name
        blocker.execute("ROLLBACK")
        assert await store.acquire_lease("s1", "o", 10, 0) == 1  # and the store still works
        await new_session(store, "s2")
    finally:
        blocker.close()
        await store.close()


async def test_reads_of_a_file_damaged_under_an_open_store_are_store_errors(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    store = SQLiteStore(f"sqlite:///{path}")
    await new_session(store, "s1")
    await store.close()
    store = SQLiteStore(f"sqlite:///{path}")
    await store.open()
    try:
        # every page but the first (the header and the schema) overwritten with garbage
        page = store.conn.execute("PRAGMA page_size").fetchone()[0]
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        with path.open("r+b") as f:
            f.seek(page)
            f.write(b"\xff" * (path.stat().st_size - page))
        reads = {
            "load": lambda: store.load("s1"),
            "read_events": lambda: store.read_events("s1"),
            "head": lambda: store.head("s1"),
            "get_request": lambda: store.get_request("req_1"),
            "pending": lambda: store.pending(PendingFilter()),
            "count_pending": lambda: store.count_pending(PendingFilter()),
            "sessions": lambda: store.sessions(),
            "count_sessions": lambda: store.count_sessions(),
            "audit": lambda: store.audit(),
            "renew_lease": lambda: store.renew_lease("s2", "o", 1, 10, 0),
            "release_lease": lambda: store.release_lease("s2", "o", 1),
            "wait_for_change": lambda: store.wait_for_change("s1", 0.01),
        }
        for name, read in reads.items():
            with pytest.raises(so.StoreError, match="malformed"):
                await read()
                pytest.fail(name)
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        ("UPDATE sessions SET head = 'x'", "head is 'x'"),
        ("UPDATE sessions SET audit_n = 'q'", "audit_n is 'q'"),
        ("UPDATE sessions SET audit_hash = 'zz'", "audit_hash is 'zz'"),
        ("INSERT OR REPLACE INTO leases SELECT sk, 'w', 'abc', 'zz' FROM sessions", "lease"),
    ],
)
async def test_text_where_a_session_row_keeps_a_number_is_a_store_error(
    tmp_path: Path, damage: str, named: str
) -> None:
    """SQLite keeps whatever a hand edit puts in a column: a session row or lease holding text
    where a number or hash belongs is named, not a ValueError or TypeError from converting it,
    and answering the session writes nothing (a damaged lease stops only the turn's run: the
    answer, recorded before it, stays)."""

    @so.tool(approval=so.always())
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return order_id

    agent = scripted_agent(
        "a", [call_tools(call("refund", order_id="1")), reply("ok")], tools=[refund]
    )
    url = f"sqlite:///{tmp_path / 'state.db'}"
    async with so.Runtime([agent], store=url) as rt:
        parked = await rt.generate("a", prompt="hi")
    with sqlite3.connect(tmp_path / "state.db") as conn:
        conn.execute(damage)
    conn.close()
    answer = so.InputResponse(request_id=parked.pending[0].id, option_id="approve")
    async with so.Runtime([agent], store=url) as rt:
        store = rt.store
        assert isinstance(store, SQLiteStore)
        before = await count(store, "events")
        with pytest.raises(so.StoreError, match=named):
            await rt.respond(parked.session_id, [answer])
        try:
            await rt.verify_audit()
        except so.StoreError as exc:
            assert named in str(exc)
        if named != "lease":
            assert await count(store, "events") == before


# -- the queue ------------------------------------------------------------------------------------


async def test_pending_filters(store: SQLiteStore) -> None:
    await new_session(store, "s1", agent="support")
    await new_session(store, "s2", agent="billing")
    await store.commit(
        Commit(
            session_id="s1",
            expected_seq=1,
            events=[event("s1", 2)],
            new_requests=[
                request("s1", "r1", agent="support", tool="refund", at=10),
                request("s1", "r2", agent="support", tool="lookup", at=20),
                request("s1", "r3", agent="support", kind="question", at=30),
            ],
        )
    )
    await store.commit(
        Commit(
            session_id="s2",
            expected_seq=1,
            events=[event("s2", 2)],
            new_requests=[
                request("s2", "r4", agent="billing", tool="refund", at=15),
                request("s2", "r5", agent="billing", tool="refund", at=25),
            ],
        )
    )
    await store.commit(
        Commit(session_id="s2", expected_seq=2, events=[event("s2", 3)], resolve=[settle("r5")])
    )

    async def ids(**kw: Any) -> list[str]:
        flt = PendingFilter(**kw)
        found = [r.id for r in await store.pending(flt)]
        if "limit" not in kw and "offset" not in kw:
            assert await store.count_pending(flt) == len(found)
        return found

    assert await ids() == ["r1", "r4", "r2", "r3"]  # pending, oldest first
    assert await ids(agent="billing") == ["r4"]
    assert await ids(tool_name="refund") == ["r1", "r4"]
    assert await ids(kind="question") == ["r3"]
    assert await ids(session_id="s1") == ["r1", "r2", "r3"]
    assert await ids(created_before=20) == ["r1", "r4"]
    assert await ids(created_after=15) == ["r2", "r3"]
    assert await ids(status=None) == ["r1", "r4", "r2", "r5", "r3"]
    assert await ids(status="settled") == ["r5"]
    assert await ids(limit=2) == ["r1", "r4"]
    assert await ids(limit=2, offset=2) == ["r2", "r3"]
    assert await ids(agent="support", tool_name="refund", session_id="s2") == []
    (settled,) = await store.pending(PendingFilter(status="settled"))
    assert settled.status == "settled"
    (pending_r1,) = await store.pending(PendingFilter(tool_name="refund", agent="support"))
    assert pending_r1 == request("s1", "r1", agent="support", tool="refund", at=10)


# -- URLs -----------------------------------------------------------------------------------------


async def test_url_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    relative = SQLiteStore("sqlite:///data/rel.db")
    absolute = SQLiteStore(f"sqlite:///{tmp_path / 'abs' / 'abs.db'}")
    memory = SQLiteStore("sqlite:///:memory:")
    assert absolute.path == str(tmp_path / "abs" / "abs.db")
    assert f"sqlite:///{tmp_path}".startswith("sqlite:////")  # four slashes for absolute paths
    for store in (relative, absolute, memory):
        await store.open()
        await new_session(store, "s1")
        assert await store.head("s1") == 1
        await store.close()
    assert (tmp_path / "data" / "rel.db").exists()
    assert (tmp_path / "abs" / "abs.db").exists()
    assert memory.file_bytes() == 0


async def test_default_store_is_dot_signoff(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    async with so.Runtime([scripted_agent("a", [reply("hi")])]) as rt:
        assert isinstance(rt.store, SQLiteStore)
        r = await rt.generate("a", prompt="hello")
        assert r.text == "hi"
    assert (tmp_path / ".signoff" / "state.db").exists()
    assert isinstance(open_store(None), SQLiteStore)


@pytest.mark.parametrize(
    ("url", "error", "match"),
    [
        ("sqlite://state.db", so.StoreError, "three slashes"),
        ("sqlite:///", so.StoreError, "names no file"),
        ("sqlite:///data/", so.StoreError, "ends in '/'"),
        ("sqlite:////", so.StoreError, "ends in '/'"),
        ("sqlite:///state.db?mode=ro", so.StoreError, "no query"),
        ("sqlite:////tmp/s.db#x", so.StoreError, "no query"),
        ("mysql://localhost/db", so.UsageError, "unknown store URL"),
        ("state.db", so.UsageError, "unknown store URL"),
        ("sqlite:state.db", so.UsageError, "unknown store URL"),
    ],
)
def test_bad_urls_get_clear_errors(url: str, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        so.Runtime([], store=url)


async def test_unusable_path_is_a_store_error(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file.txt"
    not_a_dir.write_text("x")
    with pytest.raises(so.StoreError):
        await SQLiteStore(f"sqlite:///{not_a_dir / 'state.db'}").open()
    directory = tmp_path / "adir"
    os.mkdir(directory)
    with pytest.raises(so.StoreError):
        await SQLiteStore(f"sqlite:///{directory}").open()


# -- the WAL at rest ------------------------------------------------------------------------------


def wal_bytes(path: Path) -> int:
    wal = Path(f"{path}-wal")
    return wal.stat().st_size if wal.exists() else 0


def refund_agent(log: ExecutionLog) -> so.Agent:
    @log.tool(approval=so.always())
    async def issue_refund(order_id: str, amount: float) -> dict[str, float]:
        return {"refunded": amount}

    proposal = call_tools(call("issue_refund", order_id="1", amount=5))
    return scripted_agent("a", [proposal, reply("Done.")], tools=[issue_refund])


def park(sid: str, seq: int, token: int | None) -> Commit:
    """A commit that parks a turn on a person and gives the drive's lease back."""
    waiting = so.Event(
        session_id=sid, seq=seq, type="turn.waiting", at=float(seq), data={"on": "input"}
    )
    return Commit(
        session_id=sid,
        expected_seq=seq - 1,
        events=[waiting],
        lease_token=token,
        release_lease=True,
    )


async def fill_wal(store: SQLiteStore, sid: str, upto: int) -> None:
    for seq in range(2, upto + 1):
        await store.commit(
            Commit(session_id=sid, expected_seq=seq - 1, events=[event(sid, seq, x="y" * 200)])
        )


async def test_a_parked_session_is_one_file_of_live_pages(tmp_path: Path) -> None:
    # Parking the turn gives the drive's lease back; with no lease left the WAL is folded into
    # the database and truncated, so the database file alone holds the parked session.
    log = ExecutionLog()
    async with so.Runtime([refund_agent(log)], store=f"sqlite:///{tmp_path / 'a.db'}") as rt:
        r = await rt.generate("a", prompt="refund order 1")
        assert r.status == "waiting"
        assert wal_bytes(tmp_path / "a.db") == 0
        (tmp_path / "copy").mkdir()
        (tmp_path / "copy" / "a.db").write_bytes((tmp_path / "a.db").read_bytes())
        decision = so.Decision(id=r.pending[0].id, approved=True, reason="ok")
        done = await rt.generate(session_id=r.session_id, approvals=[decision])
        assert done.text == "Done." and log.count("issue_refund") == 1
        # A turn that ends without parking leaves its WAL to SQLite's own checkpoints.
        assert wal_bytes(tmp_path / "a.db") > 0
    # The copy taken while it waited, without any WAL, is the parked session whole.
    log2 = ExecutionLog()
    async with so.Runtime([refund_agent(log2)], store=f"sqlite:///{tmp_path / 'copy/a.db'}") as rt:
        assert [p.id for p in await rt.pending()] == [r.pending[0].id]
        done = await rt.generate(session_id=r.session_id, approvals=[decision])
        assert done.text == "Done." and log2.count("issue_refund") == 1


async def test_only_a_park_folds_the_wal(store: SQLiteStore, tmp_path: Path) -> None:
    await new_session(store, "s1")
    await fill_wal(store, "s1", 30)
    token = await store.acquire_lease("s1", "A", 10, now=1)
    assert token is not None
    await store.release_lease("s1", "A", token)  # a drive that had nothing to do
    assert wal_bytes(tmp_path / "state.db") > 0
    token = await store.acquire_lease("s1", "A", 10, now=2)
    await store.commit(park("s1", 31, token))
    assert wal_bytes(tmp_path / "state.db") == 0
    assert len(await store.read_events("s1")) == 31


async def test_the_wal_stays_while_another_lease_is_held(
    store: SQLiteStore, tmp_path: Path
) -> None:
    await new_session(store, "s1")
    await new_session(store, "s2")
    t1 = await store.acquire_lease("s1", "A", 10, now=1)
    t2 = await store.acquire_lease("s2", "B", 10, now=1)
    assert t1 == 1 and t2 == 1
    await fill_wal(store, "s1", 30)
    await store.commit(park("s1", 31, t1))
    assert wal_bytes(tmp_path / "state.db") > 0  # s2's drive is still running here
    await store.commit(park("s2", 2, t2))
    assert wal_bytes(tmp_path / "state.db") == 0
    assert len(await store.read_events("s1")) == 31


async def test_leases_that_lapsed_unreleased_neither_keep_the_wal_nor_pile_up(
    store: SQLiteStore, tmp_path: Path
) -> None:
    """A worker's failed drive keeps its lease until it lapses, and a stalled one may lose it to
    another process: neither is given back here, yet neither may stop every later park from
    folding the WAL, nor be remembered for ever."""
    await new_session(store, "s1")
    await new_session(store, "s2")
    failed = await store.acquire_lease("s1", "A", 10, now=1)  # kept: it lapses at 11
    lost = await store.acquire_lease("s2", "A", 10, now=1)  # taken over elsewhere at 12
    assert failed == lost == 1
    await fill_wal(store, "s1", 30)
    token = await store.acquire_lease("s1", "B", 10, now=20)  # the retry, after it lapsed
    assert token == 2
    await store.commit(park("s1", 31, token))
    assert wal_bytes(tmp_path / "state.db") == 0
    assert len(store._leased) == 0


async def test_a_reader_elsewhere_keeps_the_wal_and_nobody_waits(tmp_path: Path) -> None:
    # The fold never waits on another connection: a reader in another process would otherwise
    # stall the drive that gave its lease back for the whole busy timeout.
    store = SQLiteStore(f"sqlite:///{tmp_path / 'state.db'}", busy_timeout=60)
    await new_session(store, "s1")
    await fill_wal(store, "s1", 30)
    reader = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
    try:
        reader.execute("BEGIN")
        assert reader.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 30
        token = await store.acquire_lease("s1", "A", 10, now=1)
        await asyncio.wait_for(store.commit(park("s1", 31, token)), timeout=20)
        assert wal_bytes(tmp_path / "state.db") > 0
        reader.execute("COMMIT")
        token = await store.acquire_lease("s1", "A", 10, now=2)
        await store.commit(park("s1", 32, token))
        assert wal_bytes(tmp_path / "state.db") == 0
    finally:
        reader.close()
        await store.close()


# -- how an event row keeps its turn --------------------------------------------------------------


def turn_event(sid: str, seq: int, turn: str | None, type: Any = "tool.step") -> so.Event:
    return so.Event(session_id=sid, seq=seq, type=type, at=float(seq), turn_id=turn, data={})


async def test_turn_ids_read_back_exactly_though_rows_name_them_once(store: SQLiteStore) -> None:
    await new_session(store, "s1")
    turns = [None, "trn_a", "trn_a", None, "trn_b", "trn_b", "trn_b"]
    turns += ["trn_c"] * (sqlite_store.TURN_NAMED_EVERY * 2 + 5) + ["trn_d"]
    seq = 1
    for i in range(0, len(turns), 3):  # three events per commit, turns run across commits
        batch = [
            turn_event("s1", seq + 1 + j, t, "turn.started" if j == 0 else "tool.step")
            for j, t in enumerate(turns[i : i + 3])
        ]
        await store.commit(Commit(session_id="s1", expected_seq=seq, events=batch))
        seq += len(batch)
    events = await store.read_events("s1")
    assert [e.turn_id for e in events[1:]] == turns
    # every window, every type filter, every starting point agrees with the whole read
    by_seq = {e.seq: e.turn_id for e in events}
    for after in (0, 3, 5, 70, seq - 2):
        assert [(e.seq, e.turn_id) for e in await store.read_events("s1", after)] == [
            (s, t) for s, t in by_seq.items() if s > after
        ]
    for newest in (1, 2, 65, 200):
        window = await store.read_events("s1", newest=newest)
        assert [(e.seq, e.turn_id) for e in window] == list(by_seq.items())[-newest:]
    started = await store.read_events("s1", types=["turn.started"])
    assert all(e.type == "turn.started" and e.turn_id == by_seq[e.seq] for e in started)
    assert len(started) == (len(turns) + 2) // 3
    # rows name a turn where it changes, and again at least every TURN_NAMED_EVERY rows
    named = [
        s
        for (s,) in store.conn.execute(
            "SELECT seq FROM events WHERE sk = (SELECT sk FROM sessions WHERE id='s1') "
            "AND turn IS NOT NULL ORDER BY seq"
        )
    ]
    assert len(named) < len(turns) // 10
    assert all(
        b - a <= sqlite_store.TURN_NAMED_EVERY for a, b in zip(named, named[1:], strict=False)
    )


async def test_a_commit_names_turns_from_what_this_store_wrote_without_reading_them(
    tmp_path: Path,
) -> None:
    """The turn at the head is remembered from the store's own last commit, not read back;
    commits that alternate between two stores on one file (each reading it) name the same
    rows as those of one store."""
    turns = ["trn_a", "trn_a", None, "trn_b"] + ["trn_c"] * (sqlite_store.TURN_NAMED_EVERY + 7)
    one = SQLiteStore(f"sqlite:///{tmp_path / 'one.db'}")
    first = SQLiteStore(f"sqlite:///{tmp_path / 'two.db'}")
    second = SQLiteStore(f"sqlite:///{tmp_path / 'two.db'}")
    for s in (one, first, second):
        await s.open()
    reads: list[str] = []
    one.conn.set_trace_callback(
        lambda sql: reads.append(sql) if "turn IS NOT NULL" in sql else None
    )
    try:
        for s in (one, first):
            await new_session(s, "s1")
        seq = 1
        for i in range(0, len(turns), 2):
            batch = [turn_event("s1", seq + 1 + j, t) for j, t in enumerate(turns[i : i + 2])]
            await one.commit(Commit(session_id="s1", expected_seq=seq, events=batch))
            other = first if i % 4 == 0 else second
            await other.commit(Commit(session_id="s1", expected_seq=seq, events=batch))
            seq += len(batch)
        assert reads == []
        rows = "SELECT seq, turn FROM events ORDER BY seq"
        assert one.conn.execute(rows).fetchall() == first.conn.execute(rows).fetchall()
        assert [e.turn_id for e in (await one.read_events("s1"))[1:]] == turns
    finally:
        for s in (one, first, second):
            await s.close()


async def test_a_request_repeating_the_proposed_call_is_stored_once(tmp_path: Path) -> None:
    """The approval request repeats the tool input the model proposed one event earlier: its
    row keeps only what is new. An audited event is never what another is stored on."""
    rnd = random.Random(7)
    words = "dear customer your parcel refund order arrived late sorry we will send".split()
    big = {"text": " ".join(rnd.choice(words) + str(rnd.randrange(99)) for _ in range(600))}

    @so.tool(approval=so.always())
    async def send(text: str) -> str:
        """Send a letter."""
        return "sent"

    agent = scripted_agent("a", [call_tools(call("send", **big)), reply("Sent.")], tools=[send])
    db = tmp_path / "s.db"
    async with so.Runtime([agent], store=f"sqlite:///{db}") as rt:
        r = await rt.generate("a", prompt="write to them")
        await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=r.pending[0].id, approved=True)]
        )
        events = [e async for e in rt.events(r.session_id, follow=False)]
        assert await rt.verify_audit() == []
    with sqlite3.connect(db) as conn:
        rows = {
            seq: (code, data)
            for seq, code, data in conn.execute("SELECT seq, type, data FROM events ORDER BY seq")
        }
    by_type = {e.type: e.seq for e in events}
    proposed, requested = (
        rows[by_type["input.requested"] - 1][1],
        rows[by_type["input.requested"]][1],
    )
    assert needs_previous(requested) and len(requested) < len(proposed) / 4
    audited = {stored_type(t) for t in AUDIT_TYPES}
    for seq, (_, data) in rows.items():
        if seq - 1 in rows and rows[seq - 1][0] in audited:
            assert not needs_previous(data), f"event {seq} is stored on an audited event"


async def test_the_audit_streams_of_no_session_are_read_by_primary_key(tmp_path: Path) -> None:
    """Verification reads the entries of no session (tool settings) window by window: each
    statement searches the trail by its ids and the sessions by their keys, none scans a table."""
    store = SQLiteStore(f"sqlite:///{tmp_path}/a.db")
    await store.open()
    try:
        row = AuditRow(stream="tools:a.t", type="tool.approval_changed", at=1.0, seq=None, data={})
        await store.record_audit([row])
        statements: list[str] = []
        store.conn.set_trace_callback(statements.append)
        found = [e async for e in trail_entries(store, others=True)]
        store.conn.set_trace_callback(None)
        assert [(e.stream, e.n) for e in found] == [("tools:a.t", 1)]
        reads = [s for s in statements if s.startswith("SELECT") and " audit " in s]
        assert len(reads) == 3  # the window, its entries, then no window left
        plans = [[d for *_, d in store.conn.execute("EXPLAIN QUERY PLAN " + s)] for s in reads]
        assert not [d for plan in plans for d in plan if d.startswith("SCAN")], plans
        assert "SEARCH a USING INTEGER PRIMARY KEY (rowid>? AND rowid<?)" in plans[1]
        assert "SEARCH s USING INTEGER PRIMARY KEY (rowid=?) LEFT-JOIN" in plans[1]
    finally:
        await store.close()
