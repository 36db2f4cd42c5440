"""PostgreSQL behind a proxy (pgbouncer) whose server is down: the proxy accepts the login and
answers the first statement with an error of its own (SQLSTATE 08P01, "pgbouncer cannot connect
to server", "server login has been failing"). That is the server being down, as a connection
refused is when signoff connects to it directly: `StoreUnavailable` naming the proxy's answer,
at once when the store opens, after the outage grace once it is open."""

from __future__ import annotations

import time
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
