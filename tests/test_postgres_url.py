"""What the PostgreSQL store puts in the libpq URL it connects with: signoff's own options taken
out, libpq's kept as written, and its connect timeout and TCP keepalive defaults, which must
reach the socket of every kind of connection the store opens, unless the URL sets them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import re
import secrets
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from signoff._events import Event
from signoff._exceptions import StoreError, StoreUnavailable, UsageError
from signoff.stores import Commit
from signoff.stores.postgres import PostgresStore
from signoff.stores.postgres._url import (
    CONNECT_TIMEOUT,
    TCP_DEFAULTS,
    describe,
    resolved_settings,
)

from ._cli import invoke
from ._relay import Relay

Conn = psycopg.AsyncConnection[Any]

LINUX = sys.platform == "linux"
ZERO_WINDOW_TIMEOUT = LINUX and tuple(
    int(n) for n in re.findall(r"[0-9]+", platform.release())[:2]
) >= (5, 11)
"""Whether the kernel ends a connection whose window stayed closed past TCP_USER_TIMEOUT."""


def _query(store: PostgresStore) -> dict[str, str]:
    return {k: str(v) for k, v in conninfo_to_dict(store._dsn).items()}


# -- the URL ---------------------------------------------------------------------------------


def test_defaults_are_added_where_the_url_sets_none() -> None:
    store = PostgresStore("postgresql://u:pw@db.internal/app?schema=tenant&pool_max=3")
    params = _query(store)
    assert params["connect_timeout"] == str(CONNECT_TIMEOUT) == str(store.connect_timeout)
    for key, value in TCP_DEFAULTS.items():
        assert params[key] == str(value)
    assert "schema" not in params and "pool_max" not in params  # signoff's own, taken out
    assert (params["host"], params["dbname"], params["password"]) == ("db.internal", "app", "pw")


def test_a_value_in_the_url_wins_over_the_default() -> None:
    store = PostgresStore(
        "postgresql://u@h/db?keepalives=0&keepalives_idle=60&tcp_user_timeout=0&connect_timeout=9"
    )
    params = _query(store)
    assert (params["keepalives"], params["keepalives_idle"]) == ("0", "60")
    assert (params["tcp_user_timeout"], params["connect_timeout"]) == ("0", "9")
    assert store.connect_timeout == 9
    assert params["keepalives_count"] == str(TCP_DEFAULTS["keepalives_count"])
    assert store._dsn.count("keepalives_idle") == 1


def test_a_connect_timeout_argument_wins_over_the_url() -> None:
    store = PostgresStore("postgresql://u@h/db?connect_timeout=9", connect_timeout=2.5)
    assert _query(store)["connect_timeout"] == "2" and store.connect_timeout == 2
    assert store._dsn.count("connect_timeout") == 1


@pytest.mark.parametrize(
    ("url", "start"),
    [
        ("postgresql:///app?host=/run/postgresql&schema=tenant", "postgresql:///app?host="),
        ("postgresql://?service=name", "postgresql://?service=name&"),
        ("postgresql://", "postgresql://?connect_timeout="),
    ],
)
def test_a_url_without_a_host_keeps_its_slashes(url: str, start: str) -> None:
    """libpq's forms for the default Unix socket or a service: rebuilt without their `//`
    (as `urlunsplit` does), libpq could not parse them."""
    store = PostgresStore(url)
    assert store._dsn.startswith(start)
    assert conninfo_to_dict(store._dsn)["keepalives"] == "1"


@pytest.mark.parametrize(
    "option",
    ["connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval", "tcp_user_timeout"],
)
@pytest.mark.parametrize("value", ["abc", "-1", "1.5", "", "1e3", "9999999999"])
def test_a_tcp_setting_that_is_not_a_whole_number_is_refused(option: str, value: str) -> None:
    """libpq would refuse it only when connecting, and psycopg's error reads as a server that is
    down (`StoreUnavailable`, retried by a worker for ever): it is refused when the store is
    made, naming the option."""
    with pytest.raises(StoreError, match=f"URL option {option}=.* must be a whole number"):
        PostgresStore(f"postgresql://u@h/db?{option}={value}")


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf")])
def test_a_connect_timeout_argument_must_be_positive(value: float) -> None:
    """An argument is the developer's misuse (`UsageError`), as `timeout=0` is; the same value
    in the URL is the store's data (`StoreError`, above)."""
    with pytest.raises(UsageError, match="^connect_timeout must be a positive"):
        PostgresStore("postgresql://u@h/db", connect_timeout=value)


@pytest.mark.parametrize(
    ("url", "arguments", "message"),
    [
        ("", {"schema": "Bad-Name"}, "schema name must be lowercase"),
        ("", {"schema": ""}, "schema name must be lowercase"),
        ("?schema=tenant", {"schema": 5}, "schema name must be lowercase"),
        ("", {"min_size": 5, "max_size": 2}, "pool sizes need 1 <= min <= max: 5, 2"),
        ("", {"min_size": 20}, "pool sizes need 1 <= min <= max: 20, 10"),
        ("?pool_max=2", {"min_size": 5}, "pool sizes need 1 <= min <= max: 5, 2"),
        ("?pool_min=5", {"max_size": 2}, "pool sizes need 1 <= min <= max: 5, 2"),
    ],
)
def test_an_argument_is_refused_as_misuse_where_the_urls_value_is_the_stores_error(
    url: str, arguments: dict[str, Any], message: str
) -> None:
    """`schema=` and the pool sizes given as arguments were a `StoreError`, as if the store
    held them; a pair that conflicts is misuse when an argument takes part in it."""
    with pytest.raises(UsageError, match=f"^{re.escape(message)}"):
        PostgresStore(f"postgresql://u@h/db{url}", **arguments)


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("schema=Bad-Name", "schema name must be lowercase"),
        ("pool_min=5&pool_max=2", "pool sizes need 1 <= min <= max: 5, 2"),
        ("pool_min=20", "pool sizes need 1 <= min <= max: 20, 10"),
    ],
)
def test_the_same_values_in_the_url_are_a_store_error(query: str, message: str) -> None:
    with pytest.raises(StoreError, match=f"^{re.escape(message)}"):
        PostgresStore(f"postgresql://u@h/db?{query}")


@pytest.mark.parametrize("query", ["schema=", "schema", "sslmode=disable&schema=&pool_max=2"])
def test_an_empty_schema_in_the_url_is_refused(query: str) -> None:
    """`?schema=` quietly meant the default schema, "signoff": a value left empty is a mistake
    (a variable that was not set), and the store it names would be another's."""
    with pytest.raises(StoreError, match="^URL option schema is empty"):
        PostgresStore(f"postgresql://u@h/db?{query}")


@pytest.mark.parametrize("option", ["pool_size", "Pool_max", "operation-timeout", "poolmax"])
def test_an_option_neither_signoff_nor_libpq_knows_is_refused_when_the_store_is_made(
    option: str,
) -> None:
    """A misspelt option of signoff's was passed on to libpq, which refused it only when
    connecting; now the store is not made, and the error names signoff's own options."""
    with pytest.raises(StoreError) as info:
        PostgresStore(f"postgresql://u:s3cret@h/db?sslmode=disable&{option}=5")
    message = str(info.value)
    assert message.startswith("invalid PostgreSQL URL: invalid URI query parameter"), message
    assert option in message and "pool_max" in message and "operation_timeout" in message
    assert "s3cret" not in message


def test_an_equals_sign_in_a_libpq_options_value_is_told_how_to_write() -> None:
    """`?options=-csearch_path=public` is refused by libpq's own URL parser ("extra key/value
    separator"); the error says to percent-encode the `=`, which it did not."""
    with pytest.raises(StoreError) as info:
        PostgresStore("postgresql://u@h/db?options=-csearch_path=public")
    assert 'percent-encode an "=" in a value as %3D' in str(info.value), info.value
    store = PostgresStore("postgresql://u@h/db?options=-csearch_path%3Dpublic")
    assert store.schema == "signoff"


@pytest.mark.parametrize(
    ("url", "character"),
    [
        # libpq read the text after the first "@" as the host: shown in every error, and taken
        # for a server that is down (StoreUnavailable, which a worker waits out for ever)
        ("postgresql://bob:left-part@right-part@127.0.0.1:1/db", "@"),
        ("postgresql://bob@corp:left-part@127.0.0.1:1/db", "@"),  # an Azure-style user name
        # libpq read "left-part" as the port and "right-part@…" as the database, all shown
        ("postgresql://bob:left-part/right-part@127.0.0.1:1/db", "/"),
        ("postgresql://bob:1234/right-part@127.0.0.1:1/db", "/"),
        # signoff's settings were appended inside the password ("?" and "#" end Python's host)
        ("postgresql://bob:left-part?right-part@127.0.0.1:1/db", "?"),
        ("postgresql://bob:left-part#right-part@127.0.0.1:1/db?schema=s", "#"),
    ],
)
def test_a_password_not_percent_encoded_is_refused_without_showing_it(
    url: str, character: str
) -> None:
    with pytest.raises(StoreError) as info:
        PostgresStore(url)
    message = str(info.value)
    assert message.startswith(f'invalid PostgreSQL URL: a "{character}" in its user name'), message
    assert "left-part" not in message and "right-part" not in message and "1234" not in message
    assert describe(url) == "<unparsable PostgreSQL URL>"  # what the CLI prints of it


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://bob:left-part%right-part@127.0.0.1:1/db",
        "postgresql://bob:left-part right-part@127.0.0.1:1/db",
        "postgresql://bob:left-part@[::1]x/db",  # libpq quoted the whole URL
        'postgresql://bob:left-"-part@[::1]x/db',
        "postgresql://bob:left-part@h/d%00b",
    ],
)
def test_a_url_libpq_cannot_parse_is_refused_when_the_store_is_made_without_its_text(
    url: str,
) -> None:
    """It was refused only when connecting, and libpq's word on it quotes the token it could
    not read (a password with a "%" or a space) or the whole URL, password and all."""
    with pytest.raises(StoreError) as info:
        PostgresStore(url)
    message = str(info.value)
    assert message.startswith("invalid PostgreSQL URL: "), message
    assert "percent-encode" in message
    assert "left-" not in message and "right-part" not in message


def test_a_url_of_another_scheme_is_named_without_its_password() -> None:
    with pytest.raises(StoreError) as info:
        PostgresStore("postgresql+psycopg://bob:s3cret@h/db")  # SQLAlchemy's
    assert str(info.value).startswith("not a PostgreSQL URL: 'postgresql+psycopg://bob:***@h/db'")


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://bob:p%40ss%2Fw%3Fo%23rd%25@h/db?schema=s",
        "postgresql:///db?host=/run/pg&user=bob@corp",
        "postgresql://[::1]:5432,h2:5433/db",
    ],
)
def test_percent_encoded_credentials_and_an_at_sign_in_the_query_are_taken(url: str) -> None:
    PostgresStore(url)


def test_an_option_of_signoffs_given_twice_is_refused() -> None:
    """The last one won silently: `?pool_max=2&...&pool_max=50` sized the pool at 50."""
    with pytest.raises(StoreError, match="URL option pool_max is given twice"):
        PostgresStore("postgresql://u@h/db?pool_max=2&schema=s&pool_max=50")


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("pool_min=0", "pool_min must be a whole number from 1, not '0'"),
        ("pool_max=0", "pool_max must be a whole number from 1, not '0'"),
        ("pool_max=2.5", "pool_max must be a whole number from 1, not '2.5'"),
        ("pool_max=-3", "pool_max must be a whole number from 1, not '-3'"),
        ("pool_timeout=0", "pool_timeout must be a positive, finite number of seconds"),
        ("operation_timeout=-0.5", "operation_timeout must be a positive, finite number"),
        ("outage_grace=ten", "outage_grace='ten' is not a number"),
    ],
)
def test_a_url_option_out_of_its_range_is_refused_naming_it(query: str, message: str) -> None:
    with pytest.raises(StoreError, match=f"^URL option {re.escape(message)}"):
        PostgresStore(f"postgresql://u@h/db?{query}")


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("min_size", 0),  # was taken as "unset": the URL's or the default size
        ("max_size", 0),
        ("max_size", 2.5),
        ("max_size", True),
        ("timeout", 0),
        ("timeout", float("nan")),
        ("request_timeout", -1),
        ("grace", float("inf")),
        ("grace", "10"),
        ("operation_timeout", 0),
        ("poll_interval", 0),
        ("poll_interval", float("nan")),
    ],
)
def test_a_setting_given_as_an_argument_is_refused_out_of_its_range(
    argument: str, value: Any
) -> None:
    with pytest.raises(UsageError, match=f"^{argument} must be a "):
        PostgresStore("postgresql://u@h/db", **{argument: value})


def test_an_argument_wins_over_the_url_and_a_small_one_is_kept() -> None:
    store = PostgresStore(
        "postgresql://u@h/db?pool_max=50&pool_timeout=9", max_size=2, timeout=0.25, grace=0.5
    )
    assert (store.min_size, store.max_size, store.timeout, store._outage.grace) == (
        1,
        2,
        0.25,
        0.5,
    )


def test_libpq_parameters_are_passed_on_as_written() -> None:
    """libpq decodes only `%XX` in a URL's query, not `+`: the parameters signoff passes on,
    with its own taken out, must not be re-encoded (a space became a `+`, which libpq keeps)."""
    store = PostgresStore(
        "postgresql://u@h/db?application_name=a%20b+c&schema=tenant&options=-c%20x%3Dy"
    )
    params = _query(store)
    assert (params["application_name"], params["options"]) == ("a b+c", "-c x=y")
    assert store.schema == "tenant"


# -- the live connections --------------------------------------------------------------------


@contextlib.contextmanager
def _socket_of(conn: Conn) -> Iterator[socket.socket]:
    sock = socket.socket(fileno=os.dup(conn.pgconn.socket))
    try:
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            pytest.skip("the test server is reached over a Unix socket: no TCP settings")
        yield sock
    finally:
        sock.close()


def _tcp_settings(conn: Conn) -> dict[str, int]:
    """The TCP settings the kernel has for `conn`'s socket, by libpq's names for them."""
    with _socket_of(conn) as sock:
        return {
            "keepalives": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
            "keepalives_idle": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            "keepalives_interval": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
            "keepalives_count": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
            "tcp_user_timeout": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
        }


def _settings(conn: Conn) -> tuple[dict[str, int], dict[str, int]]:
    """`conn`'s TCP settings as the kernel has them, and as libpq was given them."""
    params = conn.info.get_parameters()
    return _tcp_settings(conn), {k: int(params[k]) for k in TCP_DEFAULTS}


def _record_connections(store: PostgresStore) -> list[tuple[dict[str, int], dict[str, int]]]:
    """The settings of every connection the store opens outside its pool (the two of `open()`'s
    check, the LISTEN connection, the outage probe's), as it opens them."""
    opened: list[tuple[dict[str, int], dict[str, int]]] = []
    connect = store._connect_raw

    async def recording(**where: Any) -> Conn:
        conn = await connect(**where)
        opened.append(_settings(conn))
        return conn

    store._connect_raw = recording  # type: ignore[method-assign]
    return opened


def _expected(url_settings: dict[str, int]) -> dict[str, int]:
    return {**TCP_DEFAULTS, **url_settings}


@pytest.mark.skipif(not LINUX, reason="reads the socket's settings with Linux's names")
@pytest.mark.parametrize(
    "url_settings", [{}, {"keepalives_idle": 7, "keepalives_count": 2, "tcp_user_timeout": 9000}]
)
async def test_every_kind_of_connection_gets_the_tcp_settings(
    pg_store_url: str, url_settings: dict[str, int]
) -> None:
    """The pooled connections (every read and write, claims and leases among them), the two
    `open()` uses, the LISTEN connection and the outage probe's all get the defaults, or the
    URL's values where it sets them, from libpq to the kernel's socket."""
    query = "".join(f"&{k}={v}" for k, v in url_settings.items())
    store = PostgresStore(f"{pg_store_url}?pool_max=2{query}")
    opened = _record_connections(store)
    want = _expected(url_settings)
    try:
        await store.open()
        assert store._pool is not None
        async with store._pool.connection() as pooled:
            assert _settings(pooled) == (want, want)
            assert pooled.info.get_parameters()["connect_timeout"] == str(CONNECT_TIMEOUT)
        # The LISTEN connection, started by a first wait.
        assert await store.wait_for_change(f"ses_{uuid.uuid4().hex}", 0.05) is False
        probe = await store._probe_connect()
        try:
            # open()'s two (the second checks for a proxy sharing server connections), the
            # listener's, the probe's
            assert opened == [(want, want)] * 4
        finally:
            await probe.close()
    finally:
        await store.close()


async def test_a_server_that_accepts_and_never_answers_fails_open_with_the_default_timeout() -> (
    None
):
    """A port whose listener never answers (a hung server, a half-open load balancer) accepts
    the TCP connection and then says nothing: `open()` gives up after the default connect
    timeout (psycopg alone waits 130 s) with `StoreUnavailable`, which a worker starting up
    waits out."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # the kernel completes the handshakes; nothing ever reads or writes
        port = silent.getsockname()[1]
        store = PostgresStore(f"postgresql://alice:pw@127.0.0.1:{port}/db")
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT * 6):
                with pytest.raises(StoreUnavailable, match="timeout expired") as info:
                    await store.open()
        finally:
            await store.close()
    assert f"cannot connect to PostgreSQL at postgresql://alice@127.0.0.1:{port}/db" in str(
        info.value
    )


@pytest.mark.parametrize(("query", "waits"), [("?connect_timeout=2", 2), ("?connect_timeout=3", 3)])
async def test_a_silent_server_fails_open_migrate_and_reads_after_the_urls_connect_timeout(
    query: str, waits: int
) -> None:
    """A listening socket that never speaks (a hung server, a pgbouncer whose process froze):
    the URL's `connect_timeout`, not the default, bounds `open()`, `migrate()` (what `signoff db
    upgrade` runs) and a read of the schema version (`db status`) alike."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        url = f"postgresql://alice@127.0.0.1:{port}/db{query}&outage_grace=30"
        for call in ("open", "migrate", "schema_version"):
            store = PostgresStore(url)
            assert store.connect_timeout == waits
            began = asyncio.get_running_loop().time()
            try:
                with pytest.raises(StoreUnavailable, match="timeout expired"):
                    async with asyncio.timeout(waits * 4):
                        await getattr(store, call)()
            finally:
                await store.close()
            took = asyncio.get_running_loop().time() - began
            assert waits - 0.5 < took < waits + 3, (call, took)


def test_db_upgrade_and_status_on_a_silent_server_end_in_one_line() -> None:
    """`signoff db upgrade` and `db status` against a socket that never speaks end after the
    URL's `connect_timeout` with one line naming the server, exit status 1; never a hang."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        url = f"postgresql://alice:pw@127.0.0.1:{port}/db?connect_timeout=2"
        for command in (["db", "upgrade"], ["db", "status"]):
            began = time.monotonic()
            result = invoke(*command, "--store", url)
            took = time.monotonic() - began
            assert result.exit_code == 1 and 1.5 < took < 6, (command, took, result.output)
            line = f"error: StoreUnavailable: cannot connect to PostgreSQL at postgresql://alice@127.0.0.1:{port}/db"
            assert result.stderr.startswith(line), result.stderr
            assert len(result.stderr.strip().splitlines()) == 1 and "pw" not in result.stderr


@pytest.mark.parametrize(("given", "waits"), [("0", 130), ("1", 2)])
def test_the_connect_timeout_is_the_one_libpq_waits(given: str, waits: int) -> None:
    """libpq waits 2 s at least, and psycopg 130 s for `0` (libpq's "no limit"): a store said 1
    and 0 of the waits it would take 2 s and 130 s over, its argument's too."""
    assert PostgresStore(f"postgresql://u@h/db?connect_timeout={given}").connect_timeout == waits
    assert PostgresStore("postgresql://u@h/db", connect_timeout=1.5).connect_timeout == 2


# -- a peer that stops taking what is sent ---------------------------------------------------


class _StallingProxy(Relay):
    """A TCP relay to PostgreSQL that can be made to stop reading what a client sends once it
    sends more than a short statement, with a receive buffer small enough for the client to
    fill: the connection's window closes and what is left of the client's message stays unsent,
    as when the far side's network stops taking data. Its short statements before (a BEGIN, a
    read of the session's state) are relayed and answered, so that what is stuck is data sent
    and unacknowledged, never a query sent whole and waiting for its answer (which only
    `operation_timeout` ends)."""

    SHORT = 16384
    """Bytes more than a few short statements'."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(host, port)
        self.readers: list[asyncio.StreamReader] = []  # each relayed connection's client side
        self.stalling: dict[asyncio.StreamReader, int] = {}  # and the bytes taken since

    def listening(self) -> socket.socket:
        listening = super().listening()
        # Accepted sockets inherit it; set before listen() it also fixes the window offered.
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        return listening

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.readers.append(reader)
        await super()._accept(reader, writer)

    async def _relay(  # type: ignore[override]
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                if reader in self.stalling:
                    self.stalling[reader] += len(data)
                    if self.stalling[reader] > self.SHORT:
                        # Read no more: the reader's buffer, then the socket's, fill up.
                        await asyncio.Event().wait()
                writer.write(data)
                await writer.drain()
        writer.close()

    def stall(self) -> None:
        """Stop taking data from every connection open now once it sends a long message; later
        ones relay as before."""
        self.stalling = dict.fromkeys(self.readers, 0)


@pytest.mark.skipif(
    not ZERO_WINDOW_TIMEOUT, reason="Linux 5.11 and later apply TCP_USER_TIMEOUT here"
)
async def test_a_connection_that_stops_taking_data_is_given_up_and_the_commit_goes_through(
    pg_store_url: str,
) -> None:
    """A commit whose connection stops taking data (its window closed, what is left of it never
    sent) fails its connection after `tcp_user_timeout` instead of waiting for ever, and is
    retried on a fresh connection: stored once. A relay that stops forwarding but whose kernel
    still acknowledges what it is sent (a frozen proxy or server process) is not caught by any
    TCP setting; only a connection whose sent data goes unacknowledged is, as here. The
    `operation_timeout`, which would end either, is longer than the test's own limit."""
    params = conninfo_to_dict(pg_store_url)
    proxy = _StallingProxy(str(params["host"]), int(str(params["port"])))
    port = await proxy.start()
    url = pg_store_url.replace(f":{params['port']}/", f":{port}/")
    store = PostgresStore(
        f"{url}?tcp_user_timeout=1000&operation_timeout=600", min_size=1, max_size=1
    )
    try:
        sid = f"ses_{uuid.uuid4().hex[:20]}"
        first = Event(session_id=sid, seq=1, type="session.created", at=1.0)
        await store.create_session(sid, "support", [first], None)
        proxy.stall()  # the pool's one connection, idle now, stops taking its next long message
        big = Event(
            session_id=sid, seq=2, type="turn.started", at=2.0, data={"x": secrets.token_hex(2**20)}
        )
        async with asyncio.timeout(60):  # the kernel's own retransmissions would take minutes
            await store.commit(Commit(session_id=sid, expected_seq=1, events=[big]))
        assert [e.seq for e in await store.read_events(sid)] == [1, 2]
        assert (await store.read_events(sid))[1].data == big.data
    finally:
        await store.close()
        await proxy.close()


# -- a service file or the environment sets them ---------------------------------------------

SERVICE_SETTINGS = {"connect_timeout": "2", "keepalives_idle": "7"}


@pytest.fixture(autouse=True)
def no_libpq_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No service or connect timeout of the machine running the tests: each test sets its own."""
    for name in ("PGSERVICE", "PGSERVICEFILE", "PGSYSCONFDIR", "PGCONNECT_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)


def _service_file(path: Path, lines: dict[str, str], name: str = "signoff_svc") -> Path:
    body = "".join(f"{key}={value}\n" for key, value in lines.items())
    path.write_text(f"# a comment\n[other]\nkeepalives_idle=99\n\n[{name}]\n{body}")
    return path


def _without_settings_of(settings: dict[str, str], store: PostgresStore) -> None:
    """The store added none of `settings`' parameters (libpq takes them from elsewhere), and
    every other default."""
    params = _query(store)
    for key in settings:
        assert key not in params
    for key, value in TCP_DEFAULTS.items():
        if key not in settings:
            assert params[key] == str(value)
    resolved = resolved_settings(store._dsn)  # what libpq connects with
    assert {key: resolved[key] for key in settings} == settings


@pytest.mark.parametrize("named_by", ["url", "PGSERVICE"])
def test_a_service_file_setting_is_not_overridden(
    named_by: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGSERVICEFILE", str(_service_file(tmp_path / "svc", SERVICE_SETTINGS)))
    if named_by == "url":
        store = PostgresStore("postgresql://u@h/db?service=signoff_svc")
    else:
        monkeypatch.setenv("PGSERVICE", "signoff_svc")
        store = PostgresStore("postgresql://u@h/db")
    _without_settings_of(SERVICE_SETTINGS, store)
    assert store.connect_timeout == 2


def test_the_system_service_file_counts_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """libpq's other place for services: `pg_service.conf` in PGSYSCONFDIR."""
    _service_file(tmp_path / "pg_service.conf", {"tcp_user_timeout": "0"})
    monkeypatch.setenv("PGSYSCONFDIR", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path / "nobody"))  # no ~/.pg_service.conf before it
    store = PostgresStore("postgresql://u@h/db?service=signoff_svc")
    _without_settings_of({"tcp_user_timeout": "0"}, store)


def test_pgconnect_timeout_is_not_overridden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "3")
    store = PostgresStore("postgresql://u@h/db")
    _without_settings_of({"connect_timeout": "3"}, store)
    assert store.connect_timeout == 3
    # The URL's own value and a connect_timeout argument still win, as before.
    assert PostgresStore("postgresql://u@h/db?connect_timeout=9").connect_timeout == 9
    store = PostgresStore("postgresql://u@h/db", connect_timeout=4)
    assert _query(store)["connect_timeout"] == "4" and store.connect_timeout == 4


def test_the_url_still_wins_over_the_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGSERVICEFILE", str(_service_file(tmp_path / "svc", SERVICE_SETTINGS)))
    store = PostgresStore("postgresql://u@h/db?service=signoff_svc&keepalives_idle=60")
    assert _query(store)["keepalives_idle"] == "60" and store._dsn.count("keepalives_idle") == 1
    assert resolved_settings(store._dsn)["connect_timeout"] == "2"
    assert resolved_settings(store._dsn)["keepalives_idle"] == "60"


def test_a_service_setting_that_is_not_a_whole_number_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGSERVICEFILE", str(_service_file(tmp_path / "svc", {"keepalives": "x"})))
    with pytest.raises(StoreError, match="keepalives='x' .from the service file"):
        PostgresStore("postgresql://u@h/db?service=signoff_svc")


def test_a_service_that_is_not_defined_changes_nothing_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """libpq refuses it when connecting, naming it; until then the defaults are added."""
    monkeypatch.setenv("PGSERVICEFILE", str(_service_file(tmp_path / "svc", SERVICE_SETTINGS)))
    store = PostgresStore("postgresql://u@h/db?service=missing")
    assert _query(store)["keepalives_idle"] == str(TCP_DEFAULTS["keepalives_idle"])


@pytest.mark.skipif(not LINUX, reason="reads the socket's settings with Linux's names")
@pytest.mark.parametrize("named_by", ["url", "PGSERVICE"])
async def test_a_store_connects_through_a_service_with_its_settings(
    pg_store_url: str, named_by: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole connection comes from the service: the server, and the settings signoff leaves
    to it, which reach the connection's socket."""
    server = conninfo_to_dict(pg_store_url)
    where = {k: str(server[k]) for k in ("host", "port", "user", "dbname")}
    path = _service_file(tmp_path / "svc", {**where, **SERVICE_SETTINGS})
    monkeypatch.setenv("PGSERVICEFILE", str(path))
    if named_by == "url":
        url = "postgresql://?service=signoff_svc&pool_max=1"
    else:
        monkeypatch.setenv("PGSERVICE", "signoff_svc")
        url = "postgresql://?pool_max=1"
    store = PostgresStore(url)
    want = {**TCP_DEFAULTS, "keepalives_idle": 7}
    try:
        await store.open()
        assert store._pool is not None
        async with store._pool.connection() as pooled:
            params = pooled.info.get_parameters()
            assert (params["connect_timeout"], params["dbname"]) == ("2", where["dbname"])
            assert _settings(pooled) == (want, want)
            cursor = await pooled.execute("SELECT current_database()")
            assert await cursor.fetchone() == (where["dbname"],)
    finally:
        await store.close()
