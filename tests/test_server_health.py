"""`/healthz` and `/readyz`, the probes an operator points a load balancer at: answered without
credentials, on both stores, writing nothing; readiness fails with a 503 and a stable code when
the store cannot answer (gone, or too slow for a probe) or the server is stopping."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import psycopg
import pytest

import signoff as so
from signoff.server import TokenAuth, _health, create_app
from signoff.server._context import ServerContext
from signoff.stores.sqlite._connection import READ_CHECK_EVERY

from ._dashboard import csrf_of
from .test_server_common import TOKENS, make_agents


@asynccontextmanager
async def probed(url: str) -> AsyncIterator[tuple[so.Runtime, httpx.AsyncClient, ServerContext]]:
    """A running app on the store at `url` and a client sending no credentials."""
    runtime = so.Runtime(make_agents(), store=url)
    app = create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None, close_runtime=True)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c,
    ):
        yield runtime, c, app.state.signoff


async def test_probes_answer_without_credentials_and_write_nothing(store_url: str) -> None:
    async with probed(store_url) as (runtime, c, _):
        before = (await runtime.store.count_sessions(), await runtime.store.audit_window())
        for path, body in (("/healthz", {"status": "ok"}), ("/readyz", {"status": "ready"})):
            r = await c.get(path)
            assert (r.status_code, r.json()) == (200, body), r.text
            head = await c.head(path)
            assert (head.status_code, head.content) == (200, b"")
        assert (await c.get("/v1/sessions")).status_code == 401  # the API still asks who
        assert (await runtime.store.count_sessions(), await runtime.store.audit_window()) == before
        spec = (await c.get("/v1/openapi.json")).json()
        assert not {"/healthz", "/readyz"} & set(spec["paths"])  # not part of the API


async def test_readyz_is_503_once_the_sqlite_file_is_gone(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    async with probed(f"sqlite:///{db}") as (_, c, _ctx):
        assert (await c.get("/readyz")).status_code == 200
        db.unlink()
        await asyncio.sleep(READ_CHECK_EVERY)  # reads check the file at most this often
        r = await c.get("/readyz")
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "store_gone"
        assert str(db) not in r.text  # where the store is stays in the server's log


async def test_a_store_gone_for_good_fails_liveness_so_the_process_is_restarted(
    tmp_path: Path,
) -> None:
    """The SQLite file deleted or replaced under the server (or its PostgreSQL schema dropped):
    only a restart mends it, as `signoff worker` exits then. `/healthz` stayed 200 for ever, so
    an orchestrator never restarted a server that could never be ready again."""
    db = tmp_path / "state.db"
    async with probed(f"sqlite:///{db}") as (_, c, _ctx):
        assert (await c.get("/healthz")).status_code == 200
        db.unlink()
        await asyncio.sleep(READ_CHECK_EVERY)
        assert (await c.get("/healthz")).status_code == 200  # not known yet: nothing read
        assert (await c.get("/readyz")).json()["error"]["code"] == "store_gone"
        for _ in range(2):  # from then on, for good
            r = await c.get("/healthz")
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "store_gone"
            assert str(db) not in r.text


async def test_a_table_dropped_from_a_current_schema_fails_readiness_not_liveness(
    pg_store_url: str,
) -> None:
    """A table dropped by hand from a PostgreSQL schema at this signoff's version: a restart
    migrates nothing, so `/healthz` stays 200 (it was 503 `store_gone` for good, restarted in a
    loop that could never mend it); `/readyz` says the store fails (`store_error`)."""
    async with probed(pg_store_url) as (_, c, _ctx):
        assert (await c.get("/readyz")).status_code == 200
        async with await psycopg.AsyncConnection.connect(pg_store_url, autocommit=True) as conn:
            await conn.execute("DROP TABLE signoff.sessions CASCADE")
        for _ in range(2):
            r = await c.get("/readyz")
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "store_error"
            assert (await c.get("/healthz")).status_code == 200


async def test_a_metrics_scrape_that_meets_the_store_gone_fails_liveness(tmp_path: Path) -> None:
    """A `/metrics` scrape whose count of open requests met the SQLite file deleted said
    `signoff_store_up 0` but left `/healthz` 200 until an API call met it too; as any request
    that meets it, it now fails liveness from then on, the scrape itself still answering."""
    db = tmp_path / "state.db"
    runtime = so.Runtime(make_agents(), store=f"sqlite:///{db}")
    app = create_app(
        runtime, auth=TokenAuth(TOKENS), sweep_every=None, close_runtime=True, metrics=True
    )
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c,
    ):
        admin = {"Authorization": "Bearer admin-token"}
        assert "signoff_store_up 1.0" in (await c.get("/metrics", headers=admin)).text
        assert (await c.get("/healthz")).status_code == 200
        db.unlink()
        await asyncio.sleep(READ_CHECK_EVERY)  # reads check the file at most this often
        scraped = await c.get("/metrics", headers=admin)
        assert scraped.status_code == 200, scraped.text
        assert "signoff_store_up 0.0" in scraped.text.splitlines()
        r = await c.get("/healthz")
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "store_gone"


async def test_a_dashboard_form_that_meets_the_store_gone_fails_liveness(tmp_path: Path) -> None:
    """A dashboard form refused for the store gone (`store_gone`, as its page or JSON) left
    `/healthz` 200: the refusal was drawn without the API's error handler, which notes it. An
    authenticator that reads nothing of the store (a bearer token here) lets the form reach it."""
    db = tmp_path / "state.db"
    async with probed(f"sqlite:///{db}") as (_, c, _ctx):
        c.headers["Authorization"] = "Bearer alice-token"
        csrf = csrf_of((await c.get("/_signoff/")).text)
        db.unlink()
        await asyncio.sleep(READ_CHECK_EVERY)  # reads check the file at most this often
        form = {"csrf": csrf, "agent": "support", "message": "Refund 1042"}
        r = await c.post("/_signoff/sessions", data=form, headers={"Accept": "application/json"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "store_gone", r.text
        r = await c.get("/healthz")
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "store_gone"


async def test_in_process_workers_stopped_by_a_store_gone_fail_liveness(tmp_path: Path) -> None:
    """The in-process workers meet the file replaced first and stop: the server went on serving
    with none, alive to its probe, until someone read its log."""
    db = tmp_path / "state.db"
    runtime = so.Runtime(make_agents(), store=f"sqlite:///{db}")
    app = create_app(runtime, auth=TokenAuth(TOKENS), workers=1, close_runtime=True)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c,
    ):
        assert (await c.get("/healthz")).status_code == 200
        db.unlink()
        deadline = time.monotonic() + 20
        while (r := await c.get("/healthz")).status_code == 200 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "store_gone"


async def test_readyz_gives_up_on_a_store_slower_than_a_probe(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_health, "READY_TIMEOUT", 0.05)
    async with probed(store_url) as (runtime, c, _):
        reads = runtime.store.head

        async def stalled(session_id: str) -> int | None:
            await asyncio.sleep(5)
            return await reads(session_id)

        monkeypatch.setattr(runtime.store, "head", stalled)
        r = await c.get("/readyz")
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "store_unavailable"
        assert r.headers["Retry-After"] == str(so.StoreUnavailable.retry_after)


async def test_readyz_answers_in_time_though_the_store_is_slow_to_give_up_its_call(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database host that froze: cancelling the read (psycopg then asks the server to cancel
    its query, which waits out its `connect_timeout`) took 10 s more, and `/readyz` answered
    after 12 s, not 2. The probe answers at its timeout; the call winds down behind it."""
    monkeypatch.setattr(_health, "READY_TIMEOUT", 0.05)
    async with probed(store_url) as (runtime, c, _):
        unwound, given_up = asyncio.Event(), asyncio.Event()

        async def frozen(session_id: str) -> int | None:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                await given_up.wait()  # giving up takes until the test says
                raise
            finally:
                unwound.set()
            return None

        monkeypatch.setattr(runtime.store, "head", frozen)
        began = time.monotonic()
        try:
            r = await asyncio.wait_for(c.get("/readyz"), 10)
            took = time.monotonic() - began
            assert not unwound.is_set()  # answered while the call still gives up
        finally:
            given_up.set()
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "store_unavailable"
        assert took < 1.5, took  # its timeout (0.05 s), not the 2 s one it has by default
        await asyncio.wait_for(unwound.wait(), 10)


async def test_readyz_is_503_while_the_server_stops(store_url: str) -> None:
    async with probed(store_url) as (_, c, ctx):
        ctx.closing = True  # what `signoff serve` sets when it begins to stop
        r = await c.get("/readyz")
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "shutting_down"
        assert "Retry-After" in r.headers
        assert (await c.get("/healthz")).status_code == 200
