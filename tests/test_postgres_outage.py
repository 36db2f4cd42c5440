"""A PostgreSQL connection lost under the store (`_outage.py`): backends an admin terminates are
replaced at once, a stopped server is a `StoreUnavailable` naming the URL without its password
within the outage grace, and a network gone silent fails calls within the grace, then at once,
rather than after libpq's `connect_timeout` each; nothing is written twice, nor lost."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import PoolTimeout

import signoff as so
from signoff._exceptions import StoreBusy, StoreUnavailable
from signoff.stores import Commit
from signoff.stores._prompt import promptly
from signoff.stores.postgres import PostgresStore
from signoff.stores.postgres._outage import ANSWERED_WITHIN, PROBE_AFTER, Outage, is_down

from ._pg_events import ev, new_session
from ._relay import Relay
from ._shipping import shipping_agent
from .conftest import PgCluster

LONG = 20
"""The pool's wait, the call deadline and the outage grace of the stores whose backends are
terminated: a call that waited for any of them would show it."""


async def terminate_backends(url: str) -> int:
    """Terminate every other client backend of the database, from an admin connection."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
        cur = await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
            "current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        )
        return len(await cur.fetchall())


async def timed(call: Any) -> tuple[BaseException | None, float]:
    """What `call()` raised (None if nothing), and the seconds it took."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        await call()
    except Exception as exc:
        return exc, loop.time() - started
    return None, loop.time() - started


def with_options(url: str, **options: Any) -> str:
    query = "&".join(f"{key}={value}" for key, value in options.items())
    return f"{url}{'&' if '?' in url else '?'}{query}"


async def test_backends_terminated_under_a_runtime_are_replaced_at_once(
    pg_store_url: str,
) -> None:
    """Every backend of the store's pool (and its LISTEN connection) terminated while a turn is
    parked: the approval goes through on fresh connections without waiting for the pool, a
    call deadline or an outage grace, the tool runs once and the log has no gap."""
    runs: list[str] = []

    agent = shipping_agent(runs)
    url = with_options(pg_store_url, pool_timeout=LONG, operation_timeout=LONG, outage_grace=LONG)
    rt = so.Runtime([agent], store=url)
    try:
        r = await rt.generate("a", prompt="ship 7")
        assert r.status == "waiting"
        assert await terminate_backends(pg_store_url) >= 1
        decision = so.Decision(id=r.pending[0].id, approved=True)
        loop = asyncio.get_running_loop()
        started = loop.time()
        r = await asyncio.wait_for(rt.generate(session_id=r.session_id, approvals=[decision]), 60)
        assert loop.time() - started < LONG / 2  # none of the waits above: a retry at once
        assert r.status == "completed" and r.text == "Shipped."
        assert runs == ["7"]
        events = [e async for e in rt.events(r.session_id, follow=False)]
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert [e.type for e in events].count("approval.settled") == 1
    finally:
        await rt.close()


@pytest.mark.parametrize("op", ["read", "write"])
async def test_a_whole_pool_terminated_serves_the_next_call_at_once(
    pg_store_url: str, op: str
) -> None:
    store = PostgresStore(
        pg_store_url, min_size=3, max_size=3, timeout=LONG, operation_timeout=LONG, grace=LONG
    )
    try:
        sid = await new_session(store)
        await asyncio.gather(*(store.head(sid) for _ in range(6)))
        assert await terminate_backends(pg_store_url) >= 1
        commit = Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)])
        call = (lambda: store.head(sid)) if op == "read" else (lambda: store.commit(commit))
        error, took = await timed(call)
        assert error is None and took < LONG / 2
        assert [e.seq for e in await store.read_events(sid)] == ([1] if op == "read" else [1, 2])
    finally:
        await store.close()


async def test_a_stopped_server_is_unavailable_naming_the_url_without_its_password() -> None:
    """A server stopped under an open store: the first call fails with `StoreUnavailable`
    once the outage grace is over (not the pool's 30 s), the next ones at once; its message
    names the server, never the password; nothing is written, and the store works again once
    the server is back."""
    cluster = PgCluster.start()
    try:
        params = conninfo_to_dict(cluster.admin_url)
        url = cluster.admin_url.replace("postgres@", "postgres:s3cr3t-pw@", 1)
        assert "s3cr3t-pw" in url  # the cluster trusts loopback: the password is not checked
        store = PostgresStore(url, min_size=2, max_size=2, grace=1)
        sid = await new_session(store)
        await asyncio.to_thread(cluster.halt)
        error, took = await timed(lambda: store.head(sid))
        assert isinstance(error, StoreUnavailable), error
        assert took < 3 * (1 + PROBE_AFTER)
        where = f"postgresql://postgres@127.0.0.1:{params['port']}/postgres"
        assert where in str(error) and "s3cr3t" not in str(error)
        commit = Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)])
        for call in (lambda: store.commit(commit), lambda: store.head(sid)):
            error, took = await timed(call)
            assert isinstance(error, StoreUnavailable) and "s3cr3t" not in str(error)
            assert took < 3 * PROBE_AFTER
        await asyncio.to_thread(cluster.resume)
        assert [e.seq for e in await store.read_events(sid)] == [1]  # the commit was not written
        await store.commit(commit)
        assert [e.seq for e in await store.read_events(sid)] == [1, 2]
        await store.close()
    finally:
        cluster.stop()


class _CutProxy(Relay):
    """A TCP relay to PostgreSQL whose network can be cut: the connections open go silent (no
    reset, no answer), and new ones are accepted, then never answered, as a dropped route does
    to a connection's first packets."""

    cut_off = False

    def relaying(self) -> bool:
        return not self.cut_off

    def cut(self) -> None:
        self.cut_off = True
        self.silence()

    async def close(self) -> None:
        self.cut()
        await super().close()


async def test_a_silent_network_fails_calls_within_the_grace_then_at_once(
    pg_store_url: str,
) -> None:
    """The network to the server cut silently: a call on a pooled connection fails at its
    `operation_timeout`; the next, finding no connection, fails when the outage grace is over
    although its probe's connection is still waiting for an answer (`connect_timeout`, 8 s
    here, which each call used to wait in full); once the grace is over, calls fail at once;
    the commit refused so was not written."""
    params = conninfo_to_dict(pg_store_url)
    proxy = _CutProxy(str(params["host"]), int(str(params["port"])))
    port = await proxy.start()
    url = with_options(
        pg_store_url.replace(f":{params['port']}/", f":{port}/"),
        connect_timeout=8,
        pool_min=1,
        pool_max=1,
        operation_timeout=1,
        outage_grace=1,
    )
    store = PostgresStore(url)
    try:
        sid = await new_session(store)
        proxy.cut()
        error, took = await timed(lambda: store.head(sid))
        assert isinstance(error, StoreUnavailable) and "operation_timeout" in str(error)
        assert took < 3 * 1
        commit = Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)])
        error, took = await timed(lambda: store.commit(commit))
        assert isinstance(error, StoreUnavailable), error
        assert took < 3 * (1 + PROBE_AFTER)  # the grace, not the probe's 8 s
        assert "PostgreSQL unavailable" in str(error) and "not answered" in str(error)
        for call in (lambda: store.head(sid), lambda: store.commit(commit)):
            error, took = await timed(call)
            assert isinstance(error, StoreUnavailable), error
            assert took < 3 * PROBE_AFTER + 1  # at once, not after the probe's 8 s
    finally:
        await proxy.close()  # first: the connections it holds silent fail at once
        await store.close()
    direct = PostgresStore(pg_store_url)
    try:
        assert [e.seq for e in await direct.read_events(sid)] == [1]
    finally:
        await direct.close()


class _Clocked(Outage):
    """An outage record read by a clock the test sets, and a server that answers as told."""

    def __init__(self, answers: list[BaseException | None]) -> None:
        super().__init__(self._answer, "postgresql://db.example/app", grace=10)
        self.t = 100.0
        self.answers = answers
        self.closed: list[object] = []
        self.held = asyncio.Event()

    def _now(self) -> float:
        return self.t

    async def _answer(self) -> Any:
        answer = self.answers.pop(0)
        if answer is not None:
            raise answer
        if not self.answers:  # the last answer: a connection
            return SimpleNamespace(close=self._close)
        await self.held.wait()  # a network that does not answer yet
        raise psycopg.OperationalError("timeout expired")

    async def _close(self) -> None:
        self.closed.append(self)


REFUSED = psycopg.OperationalError("connection failed: Connection refused")


async def test_the_grace_runs_from_the_first_probe_that_found_the_server_down() -> None:
    """Later probes that find it down keep the outage's start: calls fail at once when the
    grace is over however often the server was asked meanwhile."""
    outage = _Clocked([REFUSED, REFUSED])
    assert outage.grace_left() == 10 and not outage.over_grace()  # no outage: the whole grace
    assert await outage.probe() is None and outage.since == 100
    outage.t = 109.5
    assert await outage.probe() is None
    assert outage.grace_left() == 0.5 and not outage.over_grace()
    outage.t = 110
    assert outage.over_grace() and outage.grace_left() == 0
    assert "unavailable at postgresql://db.example/app for 10.0s" in str(outage.unavailable())


async def test_a_server_that_answers_a_refusal_is_up_and_one_back_hands_over_its_connection() -> (
    None
):
    password = psycopg.OperationalError("connection failed: FATAL:  password authentication")
    outage = _Clocked([REFUSED, password])
    await outage.probe()
    assert outage.since == 100
    await outage.probe()
    assert outage.since is None  # it answered: not an outage, whatever it refused
    back = _Clocked([REFUSED, None])
    await back.probe()
    conn = await back.probe()
    assert conn is not None and back.since is None and back.closed == []  # for the caller
    up = _Clocked([None])
    assert await up.probe() is None and up.closed == [up]  # no outage: not kept


async def test_a_probe_not_answered_yet_counts_as_down_since_it_was_asked() -> None:
    outage = _Clocked([None, None])
    outage.t = 100
    assert await outage.probe(0) is None  # still waiting for an answer
    outage.t = 111
    assert outage.down_since() == 100 and outage.over_grace()
    assert "a new connection was not answered" in str(outage.unavailable())
    outage.held.set()
    await outage.close()


async def test_a_check_that_fails_other_than_by_a_connection_raises_to_its_caller() -> None:
    outage = _Clocked([ValueError("a bad connection string")])
    with pytest.raises(ValueError, match="a bad connection string"):
        await outage.probe()
    assert outage.since is None


class _Pool:
    """A pool as `borrow` sees it: `available` idle connections, or none to come."""

    timeout = 30.0
    max_size = 2
    lent = 0

    def __init__(self, available: int) -> None:
        self.available = available

    def get_stats(self) -> dict[str, int]:
        return {"pool_available": self.available}

    async def getconn(self, timeout: float | None = None) -> Any:
        if self.available:
            return "the pool's"
        raise PoolTimeout("no connection came")

    async def putconn(self, conn: Any) -> None:
        raise AssertionError("nothing was borrowed")


async def test_the_connection_a_check_found_the_server_back_on_goes_to_the_next_call() -> None:
    """Not left open beside the pool's idle ones: the next call gets it."""
    outage = _Clocked([REFUSED, None])
    await outage.probe()
    await outage._start_probe()  # a check no call waited for: back, its connection is kept
    conn, pools = await outage.borrow(cast(Any, _Pool(1)), None)
    assert not pools and conn is not None and outage.closed == []


async def test_a_pool_that_gives_nothing_during_an_outage_is_unavailable_not_busy() -> None:
    outage = _Clocked([REFUSED])
    await outage.probe()
    with pytest.raises(StoreUnavailable, match="PostgreSQL unavailable"):
        await outage.borrow(cast(Any, _Pool(0)), None)


class _Slowly(_Clocked):
    """A server that answered the checks so far as told, and now hands over a connection only
    after `delay` seconds of real time, as one just back on a loaded machine does."""

    def __init__(self, answers: list[BaseException | None], delay: float) -> None:
        super().__init__(answers)
        self.delay = delay

    async def _answer(self) -> Any:
        if self.answers:
            answer = self.answers.pop(0)
            if answer is TIMED_OUT:
                self.t += 8  # libpq's connect_timeout, on the outage's clock
            assert answer is not None
            raise answer
        await asyncio.sleep(self.delay)
        return SimpleNamespace(close=self._close)


TIMED_OUT = psycopg.OperationalError("connection failed: timeout expired")


async def test_a_server_back_but_slow_to_answer_serves_a_call_made_past_the_grace() -> None:
    """Its host refused connections at once while it was down; now back, it takes longer than
    `PROBE_AFTER` to hand one over: the call waits for it rather than failing while the server
    is there (CI: the first call after `pg_ctl start` failed so on a loaded machine)."""
    outage = _Slowly([REFUSED], delay=2 * PROBE_AFTER)
    await outage.probe()
    outage.t = 111
    assert outage.over_grace()
    conn, pools = await outage.borrow(cast(Any, _Pool(0)), None)
    assert not pools and conn is not None and outage.since is None


async def test_a_silent_network_past_the_grace_still_fails_a_call_at_once() -> None:
    """After a check no answer came to (a silent network), a call past the grace waits for
    the next check only `PROBE_AFTER`, however long that check takes."""
    outage = _Slowly([TIMED_OUT], delay=4 * PROBE_AFTER)
    await outage.probe()
    outage.t = 111
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(StoreUnavailable, match="timeout expired"):
        await outage.borrow(cast(Any, _Pool(0)), None)
    assert loop.time() - started < 2 * PROBE_AFTER
    await outage.close()


class _Contended(_Pool):
    """A pool whose idle connection another call takes first."""

    async def getconn(self, timeout: float | None = None) -> Any:
        raise PoolTimeout("another call took it")


async def test_a_refusal_found_before_does_not_name_a_call_that_found_the_pool_only_busy() -> None:
    """A call that got no connection only because another took the idle one first is busy
    (503 `store_busy`, worth a retry soon), whatever an earlier check was refused."""
    password = psycopg.OperationalError("connection failed: FATAL:  password authentication")
    outage = _Clocked([password])
    await outage.probe()
    assert outage.refused is not None and outage.since is None
    with pytest.raises(StoreBusy, match="all 2 of the pool's .* are in use"):
        await outage.borrow(cast(Any, _Contended(1)), 3.0)


async def _refusing(url: str) -> psycopg.AsyncConnection[Any]:
    """An admin connection to the server of `url`, whose database from now on refuses new
    connections (as after a password rotated, a role or an entry of `pg_hba.conf` removed),
    every backend of it terminated: the server is up, but a pool can open no connection."""
    name = conninfo_to_dict(url)["dbname"]
    admin = await psycopg.AsyncConnection.connect(
        make_conninfo(url, dbname="postgres"), autocommit=True
    )
    await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
    await admin.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
    )
    return admin


async def _accepting(admin: psycopg.AsyncConnection[Any], url: str) -> None:
    name = conninfo_to_dict(url)["dbname"]
    await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    await admin.close()


async def test_a_server_refusing_new_connections_fails_calls_soon_with_its_refusal(
    pg_store_url: str,
) -> None:
    """No connection of the pool is in use, so none can come back, and the server refuses new
    ones: a call fails soon with a `StoreError` giving the server's refusal, not after the
    pool's whole wait, nor claiming that every connection is in use (or, for an HTTP request,
    with a 503 `store_busy` that the client would retry for ever)."""
    store = PostgresStore(pg_store_url, min_size=2, max_size=4, timeout=LONG, grace=LONG)
    try:
        sid = await new_session(store)
        admin = await _refusing(pg_store_url)
        try:
            commit = Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)])
            for call in (lambda: store.head(sid), lambda: store.commit(commit)):
                error, took = await timed(call)
                assert type(error) is so.StoreError, error
                assert "is not currently accepting connections" in str(error)
                assert "in use" not in str(error)
                assert took < 2 + 3 * PROBE_AFTER
            with promptly():
                error, _ = await timed(lambda: store.head(sid))
            assert type(error) is so.StoreError, error  # not StoreBusy: not worth a retry
        finally:
            await _accepting(admin, pg_store_url)
        assert await store.head(sid) == 1  # the commits were not written
        await store.commit(commit)
        assert await store.head(sid) == 2
    finally:
        await store.close()


async def test_a_call_waiting_while_the_server_refuses_new_connections_says_so(
    pg_store_url: str,
) -> None:
    """A connection of the pool still in use may come back, so a call waits for it; if none
    does, its error says how many are in use and what the server answered a new one, rather
    than that all of the pool's are."""
    store = PostgresStore(pg_store_url, min_size=1, max_size=3, timeout=1.5, grace=LONG)
    try:
        sid = await new_session(store)
        pool = await store._get_pool()
        held = await pool.getconn()  # a call under way
        admin = await _refusing(pg_store_url)
        try:
            error, took = await timed(lambda: store.head(sid))
            assert type(error) is so.StoreError, error
            message = str(error)
            assert "within 1.5s: 1 of the pool's 3 (`pool_max`) in use, and a new one" in message
            assert "refused: " in message and "is not currently accepting connections" in message
            assert took >= 1.5
        finally:
            await pool.putconn(held)
            await _accepting(admin, pg_store_url)
        assert await store.head(sid) == 1
    finally:
        await store.close()


async def test_a_silent_network_after_an_outage_that_refused_at_once_fails_calls_at_once() -> None:
    """An earlier outage whose host refused connections at once, over since: a later one of a
    silent network (a `connect_timeout` longer than the grace, its check not answered yet)
    fails a call past the grace within `PROBE_AFTER`, as it would with no earlier outage,
    not after `ANSWERED_WITHIN`."""
    outage = _Clocked([REFUSED, None])  # refused at once; then back
    assert await outage.probe() is None and outage.since == 100
    outage.t = 101
    conn = await asyncio.wait_for(outage.probe(), 5)  # back: the call uses the connection
    assert conn is not None and outage.since is None
    outage.answers += [None, None]  # the next check hangs (`held`), as a silent network does
    outage.t = 200
    outage._start_probe()  # a call's check, the network now silent
    await asyncio.sleep(0)
    outage.t = 211
    assert outage.over_grace()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(StoreUnavailable):
        await outage.borrow(cast(Any, _Pool(0)), None)
    assert loop.time() - started < 2 * PROBE_AFTER
    outage.held.set()
    await outage.close()


class _GoneSilent(_Clocked):
    """A host that refused connections at once as told, and then went silent: each check
    after those is answered by libpq's `connect_timeout` only, `after` seconds of real time."""

    def __init__(self, answers: list[BaseException | None], after: float) -> None:
        super().__init__(answers)
        self.after = after

    async def _answer(self) -> Any:
        if self.answers:
            answer = self.answers.pop(0)
            assert answer is not None
            raise answer
        await asyncio.sleep(self.after)
        raise TIMED_OUT


async def test_a_call_that_joined_a_check_gone_unanswered_retries_within_probe_after() -> None:
    """Its host refused connections at once, then went silent: a call past the grace joins a
    check begun before it, which `connect_timeout` ends. Its retry waits `PROBE_AFTER` at most,
    as any call after a silent check does, not `ANSWERED_WITHIN` on another silent check."""
    outage = _GoneSilent([REFUSED], after=4 * PROBE_AFTER)
    await outage.probe()
    assert outage.since == 100
    outage.t = 120
    outage._start_probe()  # another call's check: the host is silent now
    await asyncio.sleep(1.2 * PROBE_AFTER)
    outage.t = 120 + 1.2 * PROBE_AFTER
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(StoreUnavailable, match="timeout expired"):
        await outage.borrow(cast(Any, _Pool(0)), None)
    # what is left of the joined check (2.8 x PROBE_AFTER), then PROBE_AFTER (not 4 x more)
    assert loop.time() - started < 5 * PROBE_AFTER
    await outage.close()


class _GoneSilentClocked(_GoneSilent):
    """`_GoneSilent`, whose unanswered checks take their time on the outage's clock too."""

    async def _answer(self) -> Any:
        try:
            return await super()._answer()
        except psycopg.OperationalError as exc:
            if exc is TIMED_OUT:
                self.t += self.after
            raise


async def test_a_host_gone_silent_after_refusing_holds_calls_until_a_check_goes_unanswered() -> (
    None
):
    """What the README admits beside "within a second": its host refused connections at once,
    then went silent (its machine stopped after its server). A call past the grace cannot tell
    that from a server slow to start, so it waits for its check up to `ANSWERED_WITHIN` (here
    libpq's `connect_timeout`, shorter, ends it); once a check went unanswered, a call past the
    grace fails within a second again."""
    outage = _GoneSilentClocked([REFUSED], after=6 * PROBE_AFTER)
    await outage.probe()
    assert outage.since == 100
    outage.t = 120  # past the grace, no check under way
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(StoreUnavailable):
        await outage.borrow(cast(Any, _Pool(0)), None)
    assert 2 * PROBE_AFTER < loop.time() - started < ANSWERED_WITHIN + PROBE_AFTER
    started = loop.time()
    with pytest.raises(StoreUnavailable, match="timeout expired"):
        await outage.borrow(cast(Any, _Pool(0)), None)
    assert loop.time() - started < 2 * PROBE_AFTER
    await outage.close()


@pytest.mark.parametrize(
    "said",
    [
        'connection to server at "db", port 5432 failed: server does not support SSL, but SSL '
        "was required",
        'connection to server at "db", port 5432 failed: SSL error: certificate verify failed',
        'connection to server at "db", port 5432 failed: server certificate for "pgtest" does '
        'not match host name "db"',
        'connection to server at "db", port 5432 failed: root certificate file "/x/root.crt" '
        "does not exist\nEither provide the file, use the system's trusted roots with "
        "sslrootcert=system, or change sslmode to disable server certificate verification.",
        'connection to server at "db", port 5432 failed: certificate present, but not private '
        'key file "/x/client.key"',
        'connection to server at "db", port 5432 failed: could not load private key file "k"',
    ],
)
def test_a_connection_whose_ssl_cannot_be_set_up_is_no_outage(said: str) -> None:
    """libpq's words when the URL's `sslmode` (or a certificate or key it names) cannot be met:
    the server answered, or the fault is this side's. They read as a server that is down, a
    `StoreUnavailable`, which `signoff worker` and `serve` waited out for ever."""
    assert not is_down(psycopg.OperationalError(said))
    down = 'connection to server at "db", port 5432 failed: SSL SYSCALL error: EOF detected'
    assert is_down(psycopg.OperationalError(down))  # the connection lost mid-handshake


async def test_sslmode_require_on_a_server_without_ssl_is_a_store_error(pg_store_url: str) -> None:
    try:
        async with await psycopg.AsyncConnection.connect(f"{pg_store_url}?sslmode=require"):
            pytest.skip("this server supports SSL")
    except psycopg.OperationalError:
        pass
    store = PostgresStore(f"{pg_store_url}?sslmode=require")
    with pytest.raises(so.StoreError) as info:
        await store.open()
    assert not isinstance(info.value, StoreUnavailable), info.value
    assert "SSL was required" in str(info.value)
    await store.close()


async def test_an_open_whose_session_the_server_ends_waits_as_for_a_server_down(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server ending the open's session as it reads the schema version (a fast restart,
    `pg_terminate_backend`: SQLSTATE 57P01) was a plain StoreError, so `signoff worker` and
    `serve` (`open_when_up`) exited at start instead of waiting, though every later call rides
    the same event out. It is `StoreUnavailable`: waited for, and opened once it answers."""
    from signoff.cli._waiting import open_when_up
    from signoff.stores.postgres._migrations import Migrations

    read = Migrations._read_version
    kills = [1]

    async def ended_first(self: Migrations, conn: Any) -> int:
        if kills:
            kills.pop()
            pid = conn.info.backend_pid
            async with await psycopg.AsyncConnection.connect(pg_store_url, autocommit=True) as a:
                await a.execute("SELECT pg_terminate_backend(%s)", (pid,))
        return await read(self, conn)

    monkeypatch.setattr(Migrations, "_read_version", ended_first)
    said: list[str] = []
    rt = so.Runtime([], store=pg_store_url)
    try:
        assert await asyncio.wait_for(open_when_up(rt, asyncio.Event(), said.append), 30)
        assert len(said) == 2 and "waiting for the store" in said[0], said
        assert said[1] == "the store is up"
    finally:
        await rt.close()
