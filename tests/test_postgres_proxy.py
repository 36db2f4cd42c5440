"""PostgreSQL behind a proxy (pgbouncer) whose server is down: the proxy accepts the login and
answers the first statement with an error of its own (SQLSTATE 08P01, "pgbouncer cannot connect
to server", "server login has been failing"). That is the server being down, as a connection
refused is when signoff connects to it directly: `StoreUnavailable` naming the proxy's answer,
at once when the store opens, after the outage grace once it is open."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from signoff._exceptions import StoreUnavailable
from signoff.stores.postgres import PostgresStore

from ._pg_proxy import pg_proxy

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
    """A real pgbouncer on a free loopback port, in front of a port no server listens on
    (scripts/setup installs Debian's pgbouncer)."""
    binary = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
    )
    if binary is None:
        pytest.fail("pgbouncer is not installed: run scripts/setup (apt-get install pgbouncer)")
    directory = Path(tempfile.mkdtemp(prefix="signoff-pgbouncer-"))
    as_pg: list[str] = []
    if os.geteuid() == 0:  # pgbouncer refuses to run as root
        as_pg = ["runuser", "-u", "postgres", "--"]
    port, nobody = _free_port(), _free_port()
    (directory / "users.txt").write_text('"postgres" ""\n')
    (directory / "pgbouncer.ini").write_text(
        f"[databases]\n* = host=127.0.0.1 port={nobody}\n[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {directory / 'users.txt'}\npool_mode = session\n"
        "ignore_startup_parameters = extra_float_digits,options\n"
    )
    directory.chmod(0o755)
    for path in (directory, directory / "users.txt", directory / "pgbouncer.ini"):
        if as_pg:
            shutil.chown(path, "postgres")
    proc = subprocess.Popen(
        [*as_pg, binary, str(directory / "pgbouncer.ini")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        until = time.monotonic() + 10
        while True:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if proc.poll() is not None or time.monotonic() > until:
                pytest.fail("pgbouncer did not start")
            time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(directory, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
