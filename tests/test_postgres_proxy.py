"""PostgreSQL behind a proxy (pgbouncer) whose server is down: the proxy accepts the login and
answers the first statement with an error of its own (SQLSTATE 08P01, "pgbouncer cannot connect
to server", "server login has been failing"). That is the server being down, as a connection
refused is when signoff connects to it directly: `StoreUnavailable` naming the proxy's answer,
at once when the store opens, after the outage grace once it is open.

And a pgbouncer that shares one server connection between its clients (`pool_mode` transaction
or statement): signoff's prepared statements, session settings and LISTEN do not survive it, so
the store refuses it when it opens, before writing anything, and a call that meets its symptoms
all the same (a proxy switched to it later) names the likely cause."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

import signoff as so
from signoff._exceptions import StoreError, StoreUnavailable
from signoff.stores.postgres import PostgresStore
from signoff.stores.postgres._outage import unreachable
from signoff.stores.postgres._proxy import ANSWER_WITHIN, shares_backend
from signoff.stores.postgres._transactions import failed
from signoff.testing import ExecutionLog, call, call_tools, reply, scripted_agent

from ._pg_proxy import free_port, pg_proxy, pgbouncer

DOWN = (
    "pgbouncer cannot connect to server",
    "server login has been failing, try again later (server_login_retry)",
)


def _through(url: str, port: int) -> str:
    """`url` with its port replaced by the proxy's."""
    target = urlsplit(url).port
    return url.replace(f":{target}/", f":{port}/", 1)


@pytest.mark.parametrize("answer", DOWN)
async def test_a_proxy_whose_server_is_down_fails_an_opening_store_as_unavailable(
    answer: str,
) -> None:
    """As a server refusing the connection does, not a `StoreError` saying the schema's version
    could not be read."""
    async with pg_proxy() as proxy:
        proxy.refuse = answer
        store = PostgresStore(f"postgresql://postgres@127.0.0.1:{proxy.port}/db?pool_timeout=8")
        try:
            began = time.monotonic()
            with pytest.raises(StoreUnavailable, match=r"\(server_login_retry\)|pgbouncer") as e:
                await store.head("ses_x")
            assert time.monotonic() - began < 2
            assert answer in str(e.value) and f"127.0.0.1:{proxy.port}" in str(e.value)
        finally:
            await store.close()


async def test_a_proxy_whose_server_goes_away_is_an_outage_ridden_out(pg_store_url: str) -> None:
    target = urlsplit(pg_store_url).port
    async with pg_proxy(target) as proxy:
        url = _through(pg_store_url, proxy.port)
        store = PostgresStore(url + ("&" if "?" in url else "?") + "outage_grace=1")
        try:
            assert await store.head("ses_x") is None
            proxy.refuse = DOWN[0]
            proxy.cut()
            began = time.monotonic()
            with pytest.raises(StoreUnavailable, match="pgbouncer cannot connect to server"):
                await store.head("ses_x")
            assert time.monotonic() - began < 5
            proxy.refuse = None  # the server is back
            assert await store.head("ses_x") is None
        finally:
            await store.close()


@pytest.fixture
def pgbouncer_port() -> Iterator[int]:
    """A real pgbouncer in front of a port no server listens on."""
    with pgbouncer(free_port()) as port:
        yield port


async def test_pgbouncer_whose_server_is_down_fails_an_opening_store_as_unavailable(
    pgbouncer_port: int,
) -> None:
    """The same with pgbouncer itself (1.18), over a server refusing TCP connections: it holds a
    new client while it retries the server (every `server_login_retry`), or answers at once
    that it cannot reach it, so a store opening fails either way with `StoreUnavailable`, once
    libpq's `connect_timeout` ends its wait at the latest; never a `StoreError`."""
    # What it must not wait for is the pool's timeout (30 s): libpq's 2 s and a busy machine's
    # delay take far less.
    url = f"postgresql://postgres@127.0.0.1:{pgbouncer_port}/db?pool_timeout=30&connect_timeout=2"
    for _ in range(2):
        store = PostgresStore(url)
        try:
            began = time.monotonic()
            with pytest.raises(StoreUnavailable, match="server|timeout") as caught:
                await store.head("ses_x")
            assert time.monotonic() - began < 6, caught.value
        finally:
            await store.close()


SHARED = r"pool_mode = session\) or a direct connection"
"""What a store reached through a proxy sharing server connections says to do."""


@pytest.mark.parametrize("mode", ["transaction", "statement"])
async def test_pgbouncer_sharing_server_connections_is_refused_as_the_store_opens(
    pg_url: str, mode: str
) -> None:
    """Behind pgbouncer pooling by transaction (or statement), nearly every concurrent call
    failed with "prepared statement "_pg3_0" already exists" (or did not exist, or took another
    statement's parameters: a silent wrong write when their counts matched). Now opening the
    store says so, before its schema is made in the empty database; and again on a retry."""
    with pgbouncer(_port(pg_url), mode) as port:
        store = PostgresStore(_through(pg_url, port))
        try:
            for _ in range(2):
                with pytest.raises(StoreError, match=SHARED) as caught:
                    await store.head("ses_x")
                assert type(caught.value) is StoreError, caught.value  # not an outage to ride
                assert "pool_mode = transaction or statement" in str(caught.value)
                assert "Nothing was written" in str(caught.value)
        finally:
            await store.close()
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        cur = await conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'signoff'")
        assert await cur.fetchone() == (0,)  # no schema made


async def test_pgbouncer_pooling_by_session_opens_the_store_and_runs_concurrent_turns(
    pg_url: str,
) -> None:
    """Session pooling gives each client a server connection of its own: the store opens (its
    schema migrated through pgbouncer), and concurrent approvals all complete."""
    with pgbouncer(_port(pg_url), "session", pool_size=40) as port:
        log = ExecutionLog()

        @log.tool(approval=so.always())
        async def refund(order_id: str, amount: float) -> dict[str, float]:
            return {"refunded": amount}

        script = [call_tools(call("refund", order_id="1", amount=5)), reply("Done.")]
        agent = scripted_agent("support", script, tools=[refund])
        rt = so.Runtime(agents=[agent], store=_through(pg_url, port))

        async def flow() -> str:
            first = await rt.generate("support", "refund order 1")
            approval = so.Decision(id=first.pending[0].id, approved=True)
            done = await rt.generate(session_id=first.session_id, approvals=[approval])
            return done.status

        try:
            assert await asyncio.gather(*(flow() for _ in range(12))) == ["completed"] * 12
        finally:
            await rt.close()
        assert log.count("refund") == 12


async def test_pgbouncer_pooling_by_session_with_no_server_connection_to_spare_still_opens(
    pg_store_url: str,
) -> None:
    """The check's second connection waits for a server connection while another client holds
    the only other one (pgbouncer holds it up to its `query_wait_timeout`, 120 s): the check
    gives up soon, not taking that for sharing, and the store opens as it did without it."""
    with pgbouncer(_port(pg_store_url), "session", pool_size=2) as port:
        url = _through(pg_store_url, port)
        store = PostgresStore(url + "?pool_timeout=1")
        try:
            async with await psycopg.AsyncConnection.connect(url) as other:
                await other.execute("SELECT 1")  # it keeps its server connection
                began = time.monotonic()
                await store.open()
                assert time.monotonic() - began < ANSWER_WITHIN + 1 + 3
        finally:
            await store.close()


async def test_a_shared_server_connection_met_by_a_call_is_named_as_the_likely_cause(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A proxy the opening check missed (busy, or switched to transaction pooling later): two
    stores' connections on pgbouncer's one server connection each prepare their first
    statement under psycopg's first name, and the second finds it taken (SQLSTATE 42P05). The
    `StoreError` says what the server said and what most likely caused it."""
    monkeypatch.setattr(PostgresStore, "_refuse_shared", _unchecked, raising=False)
    with pgbouncer(_port(pg_store_url), "transaction", pool_size=1) as port:
        first, second = (PostgresStore(_through(pg_store_url, port)) for _ in range(2))
        try:
            assert await first.head("ses_a") is None
            with pytest.raises(StoreError, match=SHARED) as caught:
                await second.head("ses_b")
            assert 'prepared statement "_pg3_0" already exists' in str(caught.value)
            assert "shares one server connection" in str(caught.value)
        finally:
            await first.close()
            await second.close()


@pytest.mark.parametrize(
    "error",
    [
        psycopg.errors.DuplicatePreparedStatement('prepared statement "_pg3_0" already exists'),
        psycopg.errors.InvalidSqlStatementName('prepared statement "_pg3_3" does not exist'),
        psycopg.errors.ProtocolViolation(
            'bind message supplies 2 parameters, but prepared statement "_pg3_1" requires 1'
        ),
    ],
)
def test_each_symptom_of_a_shared_server_connection_names_the_likely_cause(
    error: psycopg.Error,
) -> None:
    message = str(failed("committing x failed at here", error))
    assert message.startswith(f"committing x failed at here: {error}")
    assert "shares one server connection" in message
    assert "pool_mode = session) or a direct connection" in message
    assert not unreachable(error)  # on a connection just made too: not the server down


def test_a_protocol_violation_of_another_kind_is_not_put_down_to_a_proxy() -> None:
    """08P01 is also pgbouncer's own "cannot connect to server": only a Bind that does not fit
    its prepared statement is the symptom."""
    error = psycopg.errors.ProtocolViolation("pgbouncer cannot connect to server")
    assert str(failed("x failed at here", error)) == (
        "x failed at here: pgbouncer cannot connect to server"
    )
    assert unreachable(error)


async def _unchecked(*_args: object) -> None:
    """The opening check skipped, as a busy proxy may make it miss."""


def _port(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None
    return port


async def test_the_check_connects_beside_the_host_reached_not_a_dead_first_one_again(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A URL naming a host that takes connections and never answers, then the server: the check's
    second connection went through the whole host list again, so opening waited out a second
    `connect_timeout` on the dead host; it goes to the host the first connection reached."""
    target = urlsplit(pg_store_url)
    accepted: list[object] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # held open, never answered

    dead = await asyncio.start_server(silent, "127.0.0.1", 0)
    dead_port = dead.sockets[0].getsockname()[1]
    url = (
        f"postgresql://{target.username}@127.0.0.1:{dead_port},{target.hostname}:{target.port}"
        f"{target.path}?connect_timeout=2&{target.query}".rstrip("&?")
    )
    from signoff.stores.postgres._connections import Connections

    checked: list[int] = []  # the dead host's connections once the check is done
    fill = Connections._filled

    async def filled(self: Connections, riding: bool) -> Any:
        checked.append(len(accepted))
        return await fill(self, riding)

    monkeypatch.setattr(Connections, "_filled", filled)
    store = PostgresStore(url)
    try:
        await store.open()
        assert checked == [1]  # the first connection's try only, not the check's too
    finally:
        await store.close()
        dead.close()
        for writer in accepted:
            writer.close()  # type: ignore[attr-defined]


async def test_a_store_open_already_is_not_checked_again_on_another_event_loop(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each event loop opens a pool of its own; the proxy check, passed as the store opened,
    made one more connection for each (a round trip or more apiece)."""
    from signoff.stores.postgres import _connections

    checks: list[object] = []
    real = shares_backend

    async def counted(*args: object) -> bool:
        checks.append(args)
        return await real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(_connections, "shares_backend", counted)
    store = PostgresStore(pg_store_url)
    try:
        await store.head("ses_x")
        assert len(checks) == 1
        await asyncio.to_thread(asyncio.run, store.head("ses_x"))  # another loop's pool
        assert len(checks) == 1
    finally:
        await store.close()


def test_the_check_goes_beside_by_host_alone_where_libpq_cannot_say_the_address() -> None:
    """`conn.info.hostaddr` raises with a libpq before 12 (a psycopg built against an old one):
    it escaped raw from the store's opening, the first connection left unclosed."""
    from types import SimpleNamespace

    from signoff.stores.postgres._proxy import beside

    class OldInfo:
        host, port = "db.example", 5433

        @property
        def hostaddr(self) -> str:
            raise psycopg.NotSupportedError("PQhostaddr requires libpq from PostgreSQL 12")

    assert beside(SimpleNamespace(info=OldInfo())) == {"host": "db.example", "port": "5433"}  # type: ignore[arg-type]
