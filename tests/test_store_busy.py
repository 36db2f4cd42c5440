"""A busy store: a call made for an HTTP request waits for a PostgreSQL connection only
`?request_pool_timeout=` seconds (for SQLite's file lock, as long), then fails with `StoreBusy`
(503 `store_busy`, Retry-After), while workers, background work and the rest of a request that
has written keep the store's whole wait (`?pool_timeout=`, SQLite's busy timeout)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import httpx
import pytest

import signoff as so
from signoff._events import Event
from signoff._wire import error as _error
from signoff.server import TokenAuth, create_app
from signoff.stores import SQLiteStore, promptly
from signoff.stores.postgres import PostgresStore
from signoff.stores.sqlite._transactions import waiting_for_lock
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from .test_server_common import TOKENS, auth, make_agents, make_runtime

BOUND = 10.0
"""A generous bound on a prompt failure with a 0.3 s wait: far below the pool's 30 s."""


@contextlib.asynccontextmanager
async def held(store: PostgresStore, n: int) -> AsyncIterator[None]:
    """Every connection of the store's pool (`n` of them) borrowed for the block's duration."""
    pool = await store._get_pool()
    conns = [await pool.getconn() for _ in range(n)]
    try:
        yield
    finally:
        for conn in conns:
            await pool.putconn(conn)


async def _answer_later(runtime: so.Runtime) -> tuple[str, str]:
    result = await runtime.generate("support", "Refund order 1042, it broke", auth=_alice())
    assert result.status == "waiting"
    return result.session_id, result.pending[0].id


def _releases(monkeypatch: pytest.MonkeyPatch, runtime: so.Runtime) -> list[str]:
    """The sessions whose lease the runtime gives back from now on, in order."""
    released: list[str] = []
    release = runtime._release

    async def counted(session_id: str, owner: str, token: int) -> None:
        released.append(session_id)
        await release(session_id, owner, token)

    monkeypatch.setattr(runtime, "_release", counted)
    return released


def _alice() -> so.Principal:
    return TOKENS["alice-token"]


async def test_an_http_call_on_a_busy_pool_is_a_prompt_503_store_busy(pg_store_url: str) -> None:
    """With every pooled connection held, the API answers 503 `store_busy` with Retry-After in
    about the configured wait, not after the pool's 30 s, and the answer it refused was not
    recorded; once connections are free again, the same call succeeds."""
    runtime = make_runtime(f"{pg_store_url}?pool_min=2&pool_max=2&request_pool_timeout=0.3")
    app = create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None)
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app):
        sid, rid = await _answer_later(runtime)
        store = runtime.store
        assert isinstance(store, PostgresStore)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://t", headers=auth("alice-token")
        ) as c:
            body = {"inputResponses": [{"requestId": rid, "optionId": "approve"}]}
            loop = asyncio.get_running_loop()
            async with held(store, 2):
                for method, path, payload in (
                    ("GET", "/v1/requests", None),
                    ("POST", f"/v1/sessions/{sid}/responses", body),
                ):
                    started = loop.time()
                    r = await asyncio.wait_for(c.request(method, path, json=payload), BOUND)
                    assert loop.time() - started < BOUND
                    assert r.status_code == 503, r.text
                    detail = r.json()["error"]
                    assert detail["code"] == "store_busy"
                    assert r.headers["Retry-After"] == str(so.StoreBusy.retry_after)
                    assert "127.0.0.1" not in detail["message"]
            stored = await store.get_request(rid)
            assert stored is not None and stored.status == "pending"  # nothing was recorded
            r = await c.post(f"/v1/sessions/{sid}/responses", json=body)
            assert r.status_code == 200, r.text
    await runtime.close()


async def test_calls_outside_a_request_keep_the_pools_whole_wait(pg_store_url: str) -> None:
    """A worker's or a script's call is not made for an HTTP request: it still waits for a
    connection (up to `pool_timeout`) and goes through once one is free."""
    store = PostgresStore(f"{pg_store_url}?pool_min=2&pool_max=2&request_pool_timeout=0.3")
    await store.open()
    try:
        async with held(store, 2):
            reading = asyncio.ensure_future(store.count_pending(so.stores.PendingFilter()))
            await asyncio.sleep(1.0)  # past the request's wait (0.3 s)
            assert not reading.done()
        assert await asyncio.wait_for(reading, BOUND) == 0
    finally:
        await store.close()


async def test_a_patient_call_that_finds_no_connection_is_a_plain_store_error(
    pg_store_url: str,
) -> None:
    """Past the pool's whole timeout a call outside a request fails as it always did: a
    `StoreError`, not `StoreBusy`, which promises that the HTTP request wrote nothing."""
    store = PostgresStore(f"{pg_store_url}?pool_min=2&pool_max=2&pool_timeout=1")
    await store.open()
    try:
        async with held(store, 2):
            with pytest.raises(so.StoreError, match="no free PostgreSQL connection") as info:
                await asyncio.wait_for(store.count_pending(so.stores.PendingFilter()), BOUND)
            assert not isinstance(info.value, so.StoreBusy)
    finally:
        await store.close()


async def test_a_prompt_call_fails_with_store_busy(pg_store_url: str) -> None:
    """Inside `promptly()` a read fails with `StoreBusy`, a `StoreError`, after the short wait."""
    store = PostgresStore(f"{pg_store_url}?pool_min=2&pool_max=2&request_pool_timeout=0.3")
    await store.open()
    try:
        loop = asyncio.get_running_loop()
        async with held(store, 2):
            started = loop.time()
            with promptly(), pytest.raises(so.StoreBusy, match="no free PostgreSQL connection"):
                await asyncio.wait_for(store.count_pending(so.stores.PendingFilter()), BOUND)
            assert 0.25 < loop.time() - started < BOUND
        assert issubclass(so.StoreBusy, so.StoreError)
    finally:
        await store.close()


async def test_after_a_write_the_rest_of_the_request_waits(pg_store_url: str) -> None:
    """Once a call made for a request has written, the rest of that request waits as workers
    do: failing it now would leave half of what the request does recorded (an answer whose
    turn never runs) behind a 503 that says to retry."""
    store = PostgresStore(f"{pg_store_url}?pool_min=2&pool_max=2&request_pool_timeout=0.3")
    await store.open()
    try:
        with promptly():
            await store.create_session(
                "ses_busy1", "support", [_created("ses_busy1")], expires_at=None
            )
            async with held(store, 2):
                reading = asyncio.ensure_future(store.head("ses_busy1"))
                await asyncio.sleep(1.0)  # past the request's wait (0.3 s)
                assert not reading.done()
            assert await asyncio.wait_for(reading, BOUND) == 1
    finally:
        await store.close()


def _created(sid: str) -> Event:
    return Event(session_id=sid, seq=1, type="session.created", at=1_700_000_000.0, data={})


def test_the_request_pool_timeout_url_option() -> None:
    store = PostgresStore("postgresql://u@h/db?request_pool_timeout=2.5")
    assert store.request_timeout == 2.5
    assert PostgresStore("postgresql://u@h/db").request_timeout == 3.0
    with pytest.raises(so.StoreError, match="request_pool_timeout"):
        PostgresStore("postgresql://u@h/db?request_pool_timeout=0")


def test_the_client_raises_store_busy() -> None:
    exc = _error({"code": "store_busy", "message": "the store is busy"}, 503)
    assert isinstance(exc, so.StoreBusy)


async def test_sqlite_a_prompt_write_on_a_locked_file_is_store_busy(tmp_path: Path) -> None:
    """SQLite has no pool, but a write waits for the file's lock (another process writing, an
    open `sqlite3` shell): made for an HTTP request it waits only briefly, then `StoreBusy`,
    instead of holding the server (its calls run on the event loop) for the 30 s busy timeout;
    outside a request it keeps the whole timeout and its plain `StoreError`."""
    path = tmp_path / "state.db"
    store = SQLiteStore(f"sqlite:///{path}")
    await store.open()
    locker = sqlite3.connect(path, isolation_level=None)
    try:
        locker.execute("BEGIN IMMEDIATE")
        loop = asyncio.get_running_loop()
        started = loop.time()
        with promptly(), pytest.raises(so.StoreBusy, match="locked"):
            await store.create_session("ses_busy1", "support", [_created("ses_busy1")], None)
        assert loop.time() - started < BOUND
        assert store._conn is not None
        assert store._conn.execute("PRAGMA busy_timeout").fetchone() == (30_000,)
        patient = SQLiteStore(f"sqlite:///{path}", busy_timeout=0.5)
        with pytest.raises(so.StoreError, match="locked") as info:
            await patient.create_session("ses_busy2", "support", [_created("ses_busy2")], None)
        assert not isinstance(info.value, so.StoreBusy)
        await patient.close()
        locker.execute("ROLLBACK")
        with promptly():
            await store.create_session("ses_busy1", "support", [_created("ses_busy1")], None)
        assert await store.head("ses_busy1") == 1
    finally:
        locker.close()
        await store.close()


def test_a_dashboard_form_on_a_locked_file_is_503_with_retry_after(tmp_path: Path) -> None:
    """The API's 503 `store_busy` says when to try again; the dashboard's forms (an answer, as
    a page or as JSON, a message, a new session) gave the same 503 without `Retry-After`, which
    docs/server.md promises for any failure a browser meets there. Nothing is recorded."""
    import re

    from ._dashboard import csrf_of, signed_in, start
    from .test_server_common import running

    path = tmp_path / "state.db"
    store = SQLiteStore(f"sqlite:///{path}", busy_timeout=0.3)  # each refusal in 0.3 s, not 3
    runtime = so.Runtime(make_agents(), store=store, poll_interval=0.05)
    with running(create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None)) as base:
        body = start(base)
        sid, rid = body["session_id"], body["pending"][0]["id"]
        with signed_in(base) as c:
            page = c.get(f"/_signoff/sessions/{sid}").text
            csrf = csrf_of(page)
            found = re.search(r'name="form" value="([^"]+)"', page)
            assert found is not None
            posts = [
                (f"/_signoff/requests/{rid}/respond", {"option": "approve"}, "text/html"),
                (f"/_signoff/requests/{rid}/respond", {"option": "approve"}, "application/json"),
                (f"/_signoff/sessions/{sid}/messages", {"message": "hi", "form": found[1]}, "*/*"),
                ("/_signoff/sessions", {"agent": "support", "message": "Refund 7"}, "*/*"),
            ]
            locker = sqlite3.connect(path, isolation_level=None)
            try:
                locker.execute("BEGIN IMMEDIATE")
                for where, form, accept in posts:
                    r = c.post(where, data={"csrf": csrf, **form}, headers={"Accept": accept})
                    assert r.status_code == 503, (where, r.text)
                    assert "store_busy" in r.text, (where, r.text)
                    assert r.headers.get("Retry-After") == str(so.StoreBusy.retry_after), where
            finally:
                locker.execute("ROLLBACK")
                locker.close()
        with so.Runtime([], store=f"sqlite:///{path}") as rt:
            assert [s.id for s in rt.sessions_sync()] == [sid]
            assert [r.id for r in rt.pending_sync()] == [rid]
    runtime.close_sync()


async def test_a_new_session_refused_as_busy_waits_once_not_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session made for an HTTP request on a locked SQLite file: its creation gave up
    (`StoreBusy`: nothing written), then giving back the lease it never took waited for the
    lock as long again (503 after 6 s where the docs say 3). Nothing is given back now."""
    path = tmp_path / "state.db"
    runtime = make_runtime(f"sqlite:///{path}")
    await runtime.open()
    released = _releases(monkeypatch, runtime)
    locker = sqlite3.connect(path, isolation_level=None)
    try:
        locker.execute("BEGIN IMMEDIATE")
        with promptly(), pytest.raises(so.StoreBusy, match="locked"):
            await runtime.generate("support", "Refund order 1042, it broke", auth=_alice())
        assert released == []
        locker.execute("ROLLBACK")
        assert await runtime.sessions() == []
    finally:
        locker.close()
        await runtime.close()


async def test_a_new_session_refused_after_the_busy_timeout_waits_once_not_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same outside a request: a creation that waited out the busy timeout for the file's
    lock (a plain `StoreError`, nothing written) gave back the lease it never took, waiting
    as long again (60 s at the default 30). Nothing is given back now."""
    path = tmp_path / "state.db"
    runtime = so.Runtime(make_agents(), store=SQLiteStore(f"sqlite:///{path}", busy_timeout=0.3))
    await runtime.open()
    released = _releases(monkeypatch, runtime)
    locker = sqlite3.connect(path, isolation_level=None)
    try:
        locker.execute("BEGIN IMMEDIATE")
        with pytest.raises(so.StoreError, match="locked"):
            await runtime.generate("support", "Refund order 1042, it broke", auth=_alice())
        assert released == []
        locker.execute("ROLLBACK")
        assert await runtime.sessions() == []
    finally:
        locker.close()
        await runtime.close()


def _writes(monkeypatch: pytest.MonkeyPatch, store: so.stores.Store) -> list[str]:
    """The commits (`commit+grant` for one asking for the session's lease) and lease writes
    the store is asked for from now on, in order."""
    writes: list[str] = []
    for name in ("commit", "acquire_lease", "release_lease", "renew_lease"):
        method = getattr(store, name)

        async def logged(*args: Any, _method: Any = method, _name: str = name) -> Any:
            grants = _name == "commit" and args[0].grant is not None
            writes.append(f"{_name}+grant" if grants else _name)
            return await _method(*args)

        monkeypatch.setattr(store, name, logged)
    return writes


def _answer_or_message(runtime: so.Runtime, call: str, sid: str, rid: str) -> Awaitable[object]:
    if call == "respond":
        answer = so.InputResponse(request_id=rid, option_id="approve")
        return runtime.respond(sid, [answer], principal=_alice())
    return runtime.send(sid, "Actually, refund 90 only", principal=_alice())


@pytest.mark.parametrize("prompt", [True, False], ids=["request", "patient"])
@pytest.mark.parametrize("call", ["respond", "send"])
async def test_an_answer_or_message_refused_as_busy_waits_once_not_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str, prompt: bool
) -> None:
    """An answer or a message to a session on a locked SQLite file: its commit, which asks for
    the lease of the turn it makes runnable, waited for the lock and gave up (nothing written);
    then giving back the lease it never got waited for the lock as long again (503 after 6 s
    where the docs say 3; 60 s at the default busy timeout outside a request). The refused
    commit is the call's last write now."""
    path = tmp_path / "state.db"
    runtime = so.Runtime(make_agents(), store=SQLiteStore(f"sqlite:///{path}", busy_timeout=0.3))
    await runtime.open()
    sid, rid = await _answer_later(runtime)
    writes = _writes(monkeypatch, runtime.store)
    locker = sqlite3.connect(path, isolation_level=None)
    try:
        locker.execute("BEGIN IMMEDIATE")
        wanted = so.StoreBusy if prompt else so.StoreError
        with pytest.raises(wanted, match="locked"):
            with promptly() if prompt else contextlib.nullcontext():
                await _answer_or_message(runtime, call, sid, rid)
        assert writes == ["commit+grant"]
        locker.execute("ROLLBACK")
        assert [r.id for r in await runtime.pending()] == [rid]
    finally:
        locker.close()
        await runtime.close()


@contextlib.asynccontextmanager
async def _busy(store: so.stores.Store, path: Path | None) -> AsyncIterator[None]:
    """The store busy for the block: the SQLite file at `path` locked by another connection,
    or every connection of a PostgreSQL store's pool of 2 held."""
    if path is None:
        assert isinstance(store, PostgresStore)
        async with held(store, 2):
            yield
        return
    locker = sqlite3.connect(path, isolation_level=None)
    try:
        locker.execute("BEGIN IMMEDIATE")
        yield
    finally:
        locker.execute("ROLLBACK")
        locker.close()


@pytest.mark.parametrize("call", ["respond", "send"])
async def test_an_answer_refused_as_busy_leaves_the_lease_as_it_was(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    """`StoreBusy` says the call wrote nothing, but once the store was free again (the other
    process let go of the SQLite file, a pool connection came back) an answer or message
    refused so went on to write the session's lease, taking and releasing it, to give back a
    grant its refused commit never made. No lease is written now: the next grant is the one
    that came after the creation's (token 1), as if the call had never been made."""
    sqlite = store_url.startswith("sqlite:")
    store: so.stores.Store = (
        SQLiteStore(store_url, busy_timeout=0.3)
        if sqlite
        else PostgresStore(f"{store_url}?pool_min=2&pool_max=2&request_pool_timeout=0.3")
    )
    runtime = so.Runtime(make_agents(), store=store, poll_interval=0.05)
    await runtime.open()
    sid, rid = await _answer_later(runtime)
    writes = _writes(monkeypatch, store)
    commit = store.commit

    async def refused(c: Any) -> None:  # busy for the commit that asks for the lease only
        if c.grant is None:
            return await commit(c)
        async with _busy(store, tmp_path / "state.db" if sqlite else None):
            return await commit(c)

    monkeypatch.setattr(store, "commit", refused)
    try:
        with promptly(), pytest.raises(so.StoreBusy):
            await _answer_or_message(runtime, call, sid, rid)
        assert writes == ["commit+grant"]
        assert [r.id for r in await runtime.pending()] == [rid]
        assert await store.acquire_lease(sid, "probe", 30.0, runtime.now()) == 2
    finally:
        await runtime.close()


async def _cancelled_waiting(call: Awaitable[object], waits: asyncio.Event) -> None:
    """`call` cancelled (a caller's timeout) once it `waits` for the locked SQLite file's lock:
    it ends at once, cancelled, rather than wait for the lock again first."""
    task = asyncio.ensure_future(call)
    await asyncio.wait_for(waits.wait(), BOUND)
    assert waiting_for_lock()  # the cancel lands in the wait
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=BOUND)
    assert task in done, "the cancelled call went on waiting for the lock"
    assert task.cancelled()


def _told(monkeypatch: pytest.MonkeyPatch, store: so.stores.Store, name: str) -> asyncio.Event:
    """Set once the store's `name` call asks for the session's lease, then waits for the lock
    (its first try runs before the task suspends: see `serialised`)."""
    told = asyncio.Event()
    method = getattr(store, name)

    async def asked(*args: Any, **kwargs: Any) -> Any:
        if name != "commit" or args[0].grant is not None:
            told.set()
        return await method(*args, **kwargs)

    monkeypatch.setattr(store, name, asked)
    return told


@pytest.mark.parametrize("call", ["respond", "send"])
async def test_an_answer_or_message_cancelled_waiting_for_the_lock_ends_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    """An answer or message cancelled while its commit (which asks for the turn's lease) waits
    for another connection's lock on the SQLite file: that commit never began, yet the call
    gave back the lease it "may have granted", waiting for the lock a whole busy timeout more
    (30 s past the caller's timeout), and wrote the lease once the lock was free, after its
    caller was told it was cancelled. It ends at once now, and writes nothing."""
    path = tmp_path / "state.db"
    runtime = so.Runtime(make_agents(), store=SQLiteStore(f"sqlite:///{path}", busy_timeout=30))
    await runtime.open()
    try:
        sid, rid = await _answer_later(runtime)
        writes = _writes(monkeypatch, runtime.store)
        waits = _told(monkeypatch, runtime.store, "commit")
        async with _busy(runtime.store, path):
            await _cancelled_waiting(_answer_or_message(runtime, call, sid, rid), waits)
            assert writes == ["commit+grant"]
        assert [r.id for r in await runtime.pending()] == [rid]
        assert writes == ["commit+grant"]
        assert await runtime.store.acquire_lease(sid, "probe", 30.0, runtime.now()) == 2
    finally:
        await runtime.close()


async def test_a_new_session_cancelled_waiting_for_the_lock_ends_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new session's creation cancelled while it waits for the SQLite file's lock: it gave
    back the lease its creation never took, waiting for the lock a busy timeout more (a
    caller's 0.5 s timeout raised after 3.5 s at a 3 s busy timeout). It ends at once now."""
    path = tmp_path / "state.db"
    runtime = so.Runtime(make_agents(), store=SQLiteStore(f"sqlite:///{path}", busy_timeout=30))
    await runtime.open()
    try:
        writes = _writes(monkeypatch, runtime.store)
        waits = _told(monkeypatch, runtime.store, "create_session")
        async with _busy(runtime.store, path):
            new = runtime.generate("support", "Refund order 1042, it broke", auth=_alice())
            await _cancelled_waiting(new, waits)
        assert await runtime.sessions() == []
        assert writes == []
    finally:
        await runtime.close()


async def test_a_drive_cancelled_asking_for_the_lease_on_a_locked_file_ends_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A drive (here `generate` going on with a session) cancelled while its ask for the
    session's lease waits for the SQLite file's lock: it asked again, to give back a lease it
    was never granted, waiting a busy timeout more. It ends at once now, and writes nothing."""
    path = tmp_path / "state.db"
    runtime = so.Runtime(make_agents(), store=SQLiteStore(f"sqlite:///{path}", busy_timeout=30))
    await runtime.open()
    try:
        sid, rid = await _answer_later(runtime)
        writes = _writes(monkeypatch, runtime.store)
        waits = _told(monkeypatch, runtime.store, "acquire_lease")
        async with _busy(runtime.store, path):
            await _cancelled_waiting(runtime.generate(session_id=sid), waits)
            assert writes == ["acquire_lease"]
        assert [r.id for r in await runtime.pending()] == [rid]
        assert writes == ["acquire_lease"]
        assert await runtime.store.acquire_lease(sid, "probe", 30.0, runtime.now()) == 2
    finally:
        await runtime.close()


def _judged_agent() -> so.Agent:
    """An approval whose answers a response policy judges (on a task of its own, which goes
    on past the caller's cancel)."""

    @so.tool(approval=so.ApprovalSpec(request=so.always(), response=lambda ctx: so.Allowed()))
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    return scripted_agent(
        "support",
        [call_tools(call("issue_refund", order_id="1042")), reply("Done.")],
        tools=[issue_refund],
    )


async def test_an_answer_a_policy_judges_cancelled_waiting_for_the_lock_ends_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, for an answer a response policy judged: its settlement, committed on a task of
    its own that goes on past the cancel, waits for the lock; the call gave back the lease that
    commit asks for, waiting behind it for the lock. It ends at once now; the settlement's grant
    is given back once the lock is free, and the session is not left leased."""
    path = tmp_path / "state.db"
    runtime = so.Runtime([_judged_agent()], store=SQLiteStore(f"sqlite:///{path}", busy_timeout=30))
    await runtime.open()
    try:
        first = await runtime.generate("support", "Refund order 1042")
        sid, rid = first.session_id, first.pending[0].id
        writes = _writes(monkeypatch, runtime.store)
        locker = sqlite3.connect(path, isolation_level=None)
        waits = asyncio.Event()
        commit = runtime.store.commit

        async def locked_first(c: Any) -> Any:  # the settlement's commit meets the lock
            if c.grant is not None and not waits.is_set():
                locker.execute("BEGIN IMMEDIATE")
                waits.set()
            return await commit(c)

        monkeypatch.setattr(runtime.store, "commit", locked_first)
        try:
            answer = so.InputResponse(request_id=rid, option_id="approve")
            await _cancelled_waiting(runtime.respond(sid, [answer]), waits)
            assert "acquire_lease" not in writes
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        for _ in range(200):  # the settlement goes on past the cancel, once the lock is free
            stored = await runtime.store.get_request(rid)
            if stored is not None and stored.status == "settled" and "release_lease" in writes:
                break
            await asyncio.sleep(0.05)
        assert stored is not None and stored.status == "settled"
        assert await runtime.store.acquire_lease(sid, "probe", 30.0, runtime.now()) is not None
    finally:
        await runtime.close()


def _payouts() -> so.Agent:
    """Each turn asks to approve a payout, denied if no one decides within 60 s."""

    @so.tool(approval=so.always(expires_in=60))
    async def pay(invoice: str) -> str:
        """Pay an invoice."""
        return "paid"

    return scripted_agent("pay", [call_tools(call("pay", invoice="7")), reply("done")], tools=[pay])


@pytest.mark.parametrize("locked", ["from the start", "after one write", "past the timeout"])
async def test_a_queue_listing_on_a_locked_file_waits_for_its_lock_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, locked: str
) -> None:
    """`rt.pending()` made for an HTTP request (`GET /v1/requests`) with 3 sessions past their
    deadline, on a SQLite file another connection holds locked: it waits for the lock once,
    records no more, and shows the rest as their deadlines leave them (nothing to answer).
    Before, each deadline's write waited its 3 s in turn: 15 s for 5, 150 s for a page of 50;
    and once one was recorded (the lock taken after it, for 0.5 s here), the next waited the
    whole busy timeout (30 s). The turn of the one recorded goes on as before, once the lock
    is free (it waits as a worker does: the request recorded something); held past the busy
    timeout (1 s here), that turn waits for a sweep or the next call, said in a warning, not
    an ERROR with a traceback."""
    from signoff.stores.sqlite import _transactions

    monkeypatch.setattr(_transactions, "REQUEST_WAIT", 0.2)
    waits: list[float] = []
    gave_up = _transactions._gave_up

    def counted(path: str, exc: sqlite3.Error, prompt: bool, waited: float) -> so.StoreError:
        waits.append(waited)
        return gave_up(path, exc, prompt, waited)

    monkeypatch.setattr(_transactions, "_gave_up", counted)
    path = tmp_path / "state.db"
    clock = ManualClock()
    patience = 1.0 if locked == "past the timeout" else 30.0
    store = SQLiteStore(f"sqlite:///{path}", busy_timeout=patience)
    runtime = so.Runtime([_payouts()], store=store, clock=clock)
    await runtime.open()
    try:
        for _ in range(3):
            await runtime.generate("pay", "pay it", auth=_alice())
        clock.advance(61)
        locker = sqlite3.connect(path, isolation_level=None)
        commit = runtime.store.commit

        taken: list[bool] = []

        async def then_locked(c: Any) -> None:
            await commit(c)
            if not taken:  # after the first deadline's write, for 0.5 s
                taken.append(True)
                locker.execute("BEGIN IMMEDIATE")
                held = 0.5 if locked == "after one write" else 1.5
                asyncio.get_running_loop().call_later(held, locker.execute, "ROLLBACK")

        if locked == "from the start":
            locker.execute("BEGIN IMMEDIATE")
        else:
            monkeypatch.setattr(runtime.store, "commit", then_locked)
        try:
            with promptly(), caplog.at_level(logging.ERROR, logger="signoff"):
                assert await runtime.pending() == []
        finally:
            if locker.in_transaction:
                locker.execute("ROLLBACK")
            locker.close()
            monkeypatch.setattr(runtime.store, "commit", commit)
        assert waits == [0.2] if locked != "past the timeout" else [0.2, patience]
        assert [r.message for r in caplog.records] == []
        assert len(await runtime.pending()) == 0  # the lock free: recorded, the turns gone on
        if locked == "past the timeout":
            await runtime.expire_due()  # the sweep goes on with the one the lock held up
        assert {s.status for s in await runtime.sessions()} == {"idle"}
    finally:
        await runtime.close()


async def test_a_close_gives_back_an_answers_lease_before_the_store_closes(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The give-back of the lease an answer settling past its call's cancel asked for (a
    response policy's, above) runs before the runtime's close closes the store: before, it ran
    after, and on PostgreSQL opened a new pool on the closed store, its connections left open."""
    runtime = so.Runtime([_judged_agent()], store=store_url)
    await runtime.open()
    store = runtime.store
    first = await runtime.generate("support", "Refund order 1042")
    sid, rid = first.session_id, first.pending[0].id
    entered, closed = asyncio.Event(), []
    commit, close = store.commit, store.close

    async def held(c: Any) -> Any:  # the settlement's commit, held until the close cancels it
        if c.grant is not None:
            entered.set()
            try:
                await asyncio.Event().wait()
            finally:  # as a PostgreSQL statement takes a moment to be cancelled at the server
                await asyncio.sleep(0.1)
        return await commit(c)

    async def closing() -> None:
        closed.append(True)
        await close()

    monkeypatch.setattr(store, "commit", held)
    monkeypatch.setattr(store, "close", closing)
    lease_writes: list[tuple[str, bool]] = []
    for name in ("acquire_lease", "release_lease"):
        method = getattr(store, name)

        async def logged(*args: Any, _method: Any = method, _name: str = name) -> Any:
            lease_writes.append((_name, bool(closed)))
            return await _method(*args)

        monkeypatch.setattr(store, name, logged)
    task = asyncio.ensure_future(
        runtime.respond(sid, [so.InputResponse(request_id=rid, option_id="approve")])
    )
    await asyncio.wait_for(entered.wait(), BOUND)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await runtime.close()
    await asyncio.sleep(0.5)  # a give-back left running would write by now
    assert lease_writes == [("acquire_lease", False), ("release_lease", False)]
    assert runtime._giving_back == set()
