"""The SQLite store's errors: held locks and busy timeouts, damaged files, bad URLs and paths."""

from __future__ import annotations

import io
import os
import re
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.stores import Commit, PendingFilter, SQLiteStore, open_store
from signoff.stores._audit import AuditRow
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from ._audit import agent as audit_agent
from ._audit import alter, run_scenario
from ._procs import query
from ._sqlite_store import count, event, new_session


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
            "request_session": lambda: store.request_session("req_1"),
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


async def test_a_damaged_file_is_named_by_the_error_of_each_read_and_write(
    tmp_path: Path,
) -> None:
    """A store error from a damaged file names the file and says it is damaged, for reads and
    writes alike: a process may have several stores open, and "malformed" alone says neither
    which file to restore nor that restoring it is what to do."""
    path = tmp_path / "state.db"
    store = SQLiteStore(f"sqlite:///{path}")
    await new_session(store, "s1")
    await store.close()
    await store.open()  # its cache holds none of the pages damaged below
    page = store.conn.execute("PRAGMA page_size").fetchone()[0]
    store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    with path.open("r+b") as f:  # every page but the first (the header and the schema)
        f.seek(page)
        f.write(b"\xff" * (path.stat().st_size - page))
    row = AuditRow(stream="tools:a.t", type="tool.setting", at=1.0, seq=None, data={})
    calls = {
        "load": lambda: store.load("s1"),
        "pending": lambda: store.pending(PendingFilter()),
        "wait_for_change": lambda: store.wait_for_change("s1", 0.01),
        "commit": lambda: store.commit(
            Commit(session_id="s1", expected_seq=1, events=[event("s1", 2)])
        ),
        "create_session": lambda: new_session(store, "s2"),
        "acquire_lease": lambda: store.acquire_lease("s1", "o", 10, 0),
        "claim": lambda: store.claim("o", 10, 0, 5),
        "record_audit": lambda: store.record_audit([row]),
    }
    try:
        for name, call_ in calls.items():
            with pytest.raises(so.StoreError) as caught:
                await call_()
                pytest.fail(name)
            said = str(caught.value)
            assert str(path) in said and "damaged" in said.replace(str(path), ""), (name, said)
    finally:
        await store.close()


async def _parked_refund(tmp_path: Path) -> tuple[so.Agent, str, so.GenerateResult]:
    """A turn of agent "a" parked on an approval in a SQLite file of `tmp_path`, the runtime
    closed: the agent, the store's URL and the parked result."""

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
    return agent, url, parked


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
    agent, url, parked = await _parked_refund(tmp_path)
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


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        ("expires_at = 'zz'", "lease expiry is 'zz'"),
        ("expires_at = x'00'", "lease expiry is b'\\x00'"),
        ("owner = x'07'", "lease owner is b'\\x07'"),
    ],
)
async def test_reading_whether_a_damaged_lease_is_held_is_a_store_error(
    tmp_path: Path, damage: str, named: str
) -> None:
    """`lease_held` (what `signoff sessions` and the sweeps read) names a lease row a hand edit
    left holding text for its expiry, as taking the lease does: SQLite orders text after every
    number, so the row read as a lease held forever, and the session as run by a live drive."""
    store = SQLiteStore(f"sqlite:///{tmp_path / 'state.db'}")
    await new_session(store, "s1")
    assert await store.acquire_lease("s1", "w", 30.0, 1000.0) == 1
    store.conn.execute(f"UPDATE leases SET {damage}")
    try:
        for read in (
            lambda: store.lease_held("s1", 2000.0),
            lambda: store.acquire_lease("s1", "other", 30.0, 2000.0),
        ):
            with pytest.raises(
                so.StoreError, match=re.escape(f"session 's1' is damaged: its {named}")
            ):
                await read()
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        ("head = 'x'", "head is 'x'"),
        ("updated_at = 'x'", "updated_at is 'x'"),
        ("created_at = x'00'", "created_at is b'\\x00'"),
        ("expires_at = 'soon'", "expires_at is 'soon'"),
    ],
)
async def test_reading_a_session_row_holding_text_for_a_number_is_a_store_error(
    tmp_path: Path, damage: str, named: str
) -> None:
    """Its head, listing and change wait name the damaged session row, not a ValueError from
    converting it (a listing of every session would fail on one such row)."""
    store = SQLiteStore(f"sqlite:///{tmp_path / 'state.db'}")
    await new_session(store, "s1")
    store.conn.execute(f"UPDATE sessions SET {damage}")
    reads: list[Callable[[], Awaitable[object]]] = [store.sessions, store.sessions_counted]
    if damage.startswith("head"):
        reads += [lambda: store.head("s1"), lambda: store.wait_for_change("s1", 0.01)]
    try:
        for read in reads:
            damaged = re.escape(f"session 's1' is damaged: its {named}")
            with pytest.raises(so.StoreError, match=damaged):
                await read()
    finally:
        await store.close()


@pytest.mark.parametrize("column", ["agent", "status", "id"])
async def test_a_session_row_holding_a_blob_for_text_is_a_store_error(
    tmp_path: Path, column: str
) -> None:
    """SQLite keeps the BLOB a hand edit puts in a text column (`SET agent = X'ff...'`): the
    listings handed its bytes on, and failed whole (HTTP 500, `signoff sessions` a traceback),
    and a BLOB id failed the trail's verification and export with a bare TypeError. The
    store's listings name it now (`StoreDamaged`), as verification does a BLOB id (sessions are
    paged by their ids), and those people read leave it out, logged; the export holds no
    bytes."""
    agent, url, _ = await _parked_refund(tmp_path)
    with sqlite3.connect(tmp_path / "state.db") as conn:
        conn.execute(f"UPDATE sessions SET {column} = ?", (b"\xffa",))
    conn.close()
    async with so.Runtime([agent], store=url) as rt:
        store = rt.store
        assert isinstance(store, SQLiteStore)
        for read in (store.sessions, store.sessions_counted):
            with pytest.raises(so.StoreDamaged, match=re.escape(f"its {column} is b'\\xffa'")):
                await read()
        assert await rt.sessions() == []  # its only session left out
        out = io.StringIO()
        assert await rt.export_audit(out) > 0
        if column == "id":
            with pytest.raises(so.StoreDamaged, match=re.escape("its id is b'\\xffa'")):
                await rt.verify_audit()
        else:
            assert await rt.verify_audit() == []


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        ("INSERT INTO snapshots SELECT sk, 'x', '{{}}' FROM sessions", "snapshot seq is 'x'"),
        ("UPDATE sessions SET expires_at = 'x'", "expires_at is 'x'"),
    ],
)
async def test_loading_a_session_or_its_request_holding_text_for_a_number_is_a_store_error(
    tmp_path: Path, damage: str, named: str
) -> None:
    """A snapshot's seq, or the session's TTL read with its request, left as text by a hand
    edit: loading the session (to read or answer it) and reading the request name the session,
    not a ValueError from converting it, and answering writes nothing."""
    agent, url, parked = await _parked_refund(tmp_path)
    alter(url, damage)
    answer = so.InputResponse(request_id=parked.pending[0].id, option_id="approve")
    damaged = re.escape(f"session {parked.session_id!r} is damaged: its {named}")
    async with so.Runtime([agent], store=url) as rt:
        store = rt.store
        assert isinstance(store, SQLiteStore)
        before = await count(store, "events")
        reads = [
            lambda: rt.state(parked.session_id),
            lambda: rt.respond(parked.session_id, [answer]),
        ]
        if "expires_at" in damage:
            reads = [lambda: store.get_request(parked.pending[0].id)]
        for read in reads:
            with pytest.raises(so.StoreError, match=damaged):
                await read()
        assert await count(store, "events") == before


FIRST_ENTRY = "(SELECT min(id) FROM audit WHERE sk IS NOT NULL)"


@pytest.mark.parametrize("stored", ["'zz'", "'0123abcd'", "4.5"])
async def test_an_audit_hash_that_is_not_bytes_is_named_by_verification(
    tmp_path: Path, stored: str
) -> None:
    """SQLite keeps whatever a hand edit puts in an entry's hash: verifying (and listing) the
    trail names the entry, as for a hash of other bytes, not a TypeError from reading it.
    PostgreSQL's `bytea` column takes nothing else."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    clock = ManualClock()
    async with so.Runtime([audit_agent()], store=url, clock=clock) as rt:
        sid = await run_scenario(rt, clock)
        first, second = (await rt.audit(sid))[:2]
    alter(url, f"UPDATE audit SET hash={stored} WHERE id={FIRST_ENTRY}")
    async with so.Runtime([audit_agent()], store=url, clock=clock) as rt:
        listed = await rt.audit(sid)
        assert [e.id for e in listed[:2]] == [first.id, second.id]
        assert listed[0].hash != first.hash and listed[1].prev == listed[0].hash
        problems = await rt.verify_audit()
        assert [(p.id, p.reason) for p in problems] == [
            (first.id, "content does not match"),
            (second.id, "content does not match"),  # chained on the hash as stored
        ]


@pytest.mark.parametrize(
    ("column", "stored"), [("n", "'x'"), ("seq", "'x'"), ("n", "x'01'"), ("seq", "2.5")]
)
async def test_an_audit_number_that_is_not_a_number_is_named_as_damage(
    tmp_path: Path, column: str, stored: str
) -> None:
    """An entry whose number or event seq a hand edit made text cannot be placed in its chain:
    listing it is a `StoreError` naming the entry, not a TypeError from comparing it. Verifying
    stopped there too, hiding the rest: it names that entry as damaged, and goes on to name an
    entry altered after it."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    clock = ManualClock()
    async with so.Runtime([audit_agent()], store=url, clock=clock) as rt:
        sid = await run_scenario(rt, clock)
        first, *_, last = await rt.audit(sid)
        assert await rt.verify_audit() == []
    alter(url, f"UPDATE audit SET {column}={stored} WHERE id={FIRST_ENTRY}")
    alter(url, f"UPDATE audit SET hash=x'00' WHERE id={last.id}")
    named = rf"audit entry {first.id} of '{sid}' is damaged: its {column} is "
    async with so.Runtime([audit_agent()], store=url, clock=clock) as rt:
        with pytest.raises(so.StoreError, match=named):
            await rt.audit(sid)
        with pytest.raises(so.StoreError, match=named):
            await rt.export_audit(io.StringIO())
        problems = await rt.verify_audit()
        assert [(p.id, p.stream, p.reason) for p in problems] == [
            (first.id, sid, f"its {column} is not a whole number"),
            (last.id, sid, "content does not match"),
            (last.id, sid, "the chain does not end with the hash its session keeps"),
        ]


async def test_a_tool_setting_head_that_is_not_bytes_is_a_store_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A tool's setting changed while its stream's head row holds text for a hash: recording
    the change is a `StoreError` naming the stream, as verifying it is, and writes nothing; a
    runtime still opens (it warns, and tries again at each call), not an AttributeError."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    async with so.Runtime([audit_agent()], store=url):
        pass
    alter(url, "UPDATE audit SET hash='zz' WHERE n=0 AND stream='tools:support.refund'")

    @so.tool(approval=so.never())
    async def refund(order_id: str, amount: float) -> str:
        """Refund an order."""
        return order_id

    changed = scripted_agent("support", [reply("ok")], tools=[refund])
    before = query(url, "SELECT * FROM audit ORDER BY id")
    named = "'tools:support.refund' is damaged: its audit_hash is 'zz'"
    async with so.Runtime([changed], store=url) as rt:
        assert (await rt.generate("support", prompt="hi")).text == "ok"
        assert named in caplog.text
        row = AuditRow(
            stream="tools:support.refund", type="tool.setting", at=1.0, seq=None, data={}
        )
        with pytest.raises(so.StoreError, match=named):
            await rt.store.record_audit([row])
    assert query(url, "SELECT * FROM audit ORDER BY id") == before


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
        ("sqlite:///~/state.db", so.StoreError, "'~', which names a folder"),
        ("sqlite:///~", so.StoreError, "'~', which names a folder"),
        # A raw ValueError / UnicodeEncodeError at the first call, the URL accepted.
        ("sqlite:///state\x00.db", so.StoreError, "a NUL or lone surrogate"),
        ("sqlite:///state\ud800.db", so.StoreError, "a NUL or lone surrogate"),
        ("mysql://localhost/db", so.UsageError, "unknown store URL"),
        ("state.db", so.UsageError, "unknown store URL"),
        ("sqlite:state.db", so.UsageError, "unknown store URL"),
    ],
)
def test_bad_urls_get_clear_errors(url: str, error: type[Exception], match: str) -> None:
    """`sqlite:///~/state.db` made a folder named `~` in the working directory (nothing expands
    it in a URL, not even the shell), where a later `rm -rf ~` meant for it would remove the
    home directory: refused now, naming what to write instead."""
    with pytest.raises(error, match=match):
        so.Runtime([], store=url)


def test_a_url_under_a_tilde_names_the_full_path_to_give_instead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The refusal said "give the full path instead:" and then quoted the URL refused, as if
    that were the URL to give; it names the path under the home directory now."""
    monkeypatch.setenv("HOME", "/home/ana")
    with pytest.raises(so.StoreError) as caught:
        so.Runtime([], store="sqlite:///~/state.db")
    assert str(caught.value) == (
        "SQLite URL path starts with '~', which names a folder '~' here, not your home directory "
        "(nothing expands it in a URL): 'sqlite:///~/state.db'; give the full path instead, "
        "such as 'sqlite:////home/ana/state.db'"
    )


async def test_unusable_path_is_a_store_error(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file.txt"
    not_a_dir.write_text("x")
    with pytest.raises(so.StoreError):
        await SQLiteStore(f"sqlite:///{not_a_dir / 'state.db'}").open()
    directory = tmp_path / "adir"
    os.mkdir(directory)
    with pytest.raises(so.StoreError):
        await SQLiteStore(f"sqlite:///{directory}").open()


async def test_a_file_that_is_no_database_is_named_as_such(tmp_path: Path) -> None:
    """A path naming another kind of file (a config, a log) is refused naming it and saying it
    is no SQLite database, not that it is a damaged store to restore."""
    path = tmp_path / "state.db"
    path.write_text("[store]\nurl = 'sqlite:///x.db'\n" * 100)
    with pytest.raises(so.StoreError) as caught:
        await SQLiteStore(f"sqlite:///{path}").open()
    assert str(path) in str(caught.value) and "no SQLite database" in str(caught.value)
    assert path.read_text().startswith("[store]")
