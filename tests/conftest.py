"""Shared fixtures: a throwaway PostgreSQL 15 cluster and one `store` fixture for every backend.

The cluster is started once per test session, only if a test asks for PostgreSQL: `initdb` and
`pg_ctl` (as the `postgres` OS user when we are root) into a temporary directory, on a free
loopback port, with `fsync=off`. Every test gets a database of its own, made while the test
before it ran. Everything is removed at the end, also when tests fail.
Set `SIGNOFF_TEST_PG_URL` to an admin URL of an existing server to use it instead. A missing
PostgreSQL fails the tests loudly; it never skips them.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest
from psycopg import conninfo

from signoff.stores import SQLiteStore, Store
from signoff.stores.postgres import PostgresStore

from ._forks import Scripts

# The longest test files are handed to the pytest-xdist workers first (`durations.json`).
from ._order import pytest_collection_modifyitems as pytest_collection_modifyitems

# The "signoff proof" summary, with each pytest-xdist worker's tally sent to the controller.
from ._proof import pytest_sessionfinish as pytest_sessionfinish
from ._proof import pytest_terminal_summary as pytest_terminal_summary
from ._proof import pytest_testnodedown as pytest_testnodedown

# A suite started in the background by a shell without job control (`cmd &` in a script, as CI
# runners and `nohup` do) inherits SIGINT ignored, and so would every child a test spawns: the
# tests that press Ctrl-C at a child need it delivered as at a shell, whoever started the suite.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

PG_BIN = Path(os.environ.get("SIGNOFF_PG_BIN", "/usr/lib/postgresql/15/bin"))
STORE_KINDS = ["sqlite", "postgres"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgCluster:
    """A PostgreSQL server for the tests: one we started (and will remove) or one we were given."""

    def __init__(self, admin_url: str, directory: Path | None = None) -> None:
        self.admin_url = admin_url
        self.directory = directory
        self.ours = directory is not None
        self._template: str | None = None
        self._maker: ThreadPoolExecutor | None = None
        self._spares: dict[str | None, Future[str]] = {}
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._pg_ctl: list[str] = []

    @classmethod
    def start(cls) -> PgCluster:
        """initdb + pg_ctl start into a fresh temporary directory, on a free loopback port."""
        if not (PG_BIN / "initdb").exists():
            pytest.fail(
                f"PostgreSQL 15 is not installed ({PG_BIN}/initdb is missing): run ./scripts/setup "
                "as root, or `apt-get install -y postgresql-15`",
                pytrace=False,
            )
        as_pg: list[str] = []
        if os.geteuid() == 0:  # initdb refuses to run as root
            if subprocess.run(["id", "postgres"], capture_output=True).returncode != 0:
                subprocess.run(
                    ["useradd", "--system", "--no-create-home", "postgres"],
                    check=True,
                    capture_output=True,
                )
            as_pg = ["runuser", "-u", "postgres", "--"]
        directory = Path(tempfile.mkdtemp(prefix="signoff-pg-"))
        cluster = cls("", directory)
        atexit.register(cluster.stop)  # belt and braces, if the fixture's teardown never runs
        try:
            directory.chmod(0o755)
            if as_pg:
                shutil.chown(directory, "postgres")
            data = directory / "data"
            cluster._run(
                [
                    *as_pg,
                    str(PG_BIN / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    "postgres",
                    "-A",
                    "trust",
                    "-E",
                    "UTF8",
                    "--locale=C.UTF-8",
                    "--no-sync",
                ]
            )
            for _attempt in range(3):
                port = _free_port()
                options = (
                    f"-p {port} -k {directory} -c listen_addresses=127.0.0.1 -c fsync=off "
                    "-c full_page_writes=off -c max_connections=200"
                )
                started = subprocess.run(
                    [
                        *as_pg,
                        str(PG_BIN / "pg_ctl"),
                        "-D",
                        str(data),
                        "-l",
                        str(directory / "server.log"),
                        "-w",
                        "-s",
                        "-o",
                        options,
                        "start",
                    ],
                    cwd=directory,
                    capture_output=True,
                    text=True,
                )
                if started.returncode == 0:
                    cluster._pg_ctl = [
                        *as_pg,
                        str(PG_BIN / "pg_ctl"),
                        "-D",
                        str(data),
                        "-l",
                        str(directory / "server.log"),
                        "-w",
                        "-s",
                        "-o",
                        options,
                    ]
                    cluster.admin_url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
                    cluster._watch(as_pg)
                    return cluster
            log = (directory / "server.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"pg_ctl start failed: {started.stderr}\n{log}")
        except BaseException:
            cluster.stop()
            raise

    def _watch(self, as_pg: list[str]) -> None:
        """A detached watchdog that removes the cluster if this process dies without doing so
        (SIGKILL, a crash): the server must not outlive the test run."""
        assert self.directory is not None
        d = shlex.quote(str(self.directory))
        stop = " ".join(
            shlex.quote(a) for a in [*as_pg, str(PG_BIN / "pg_ctl"), "-D", f"{self.directory}/data"]
        )
        script = (
            f"while kill -0 {os.getpid()} 2>/dev/null && [ -d {d} ]; do sleep 1; done; "
            f"if [ -d {d} ]; then {stop} -m immediate -s stop; rm -rf {d}; fi"
        )
        self._watchdog = subprocess.Popen(
            ["sh", "-c", script],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def halt(self) -> None:
        """Stop the server as an operator would (`pg_ctl stop -m fast`), keeping its data, so that
        `resume()` starts it again on the same port: a restart or an outage."""
        assert self.ours and self._pg_ctl, "only a cluster these tests started can be halted"
        self._run([*self._pg_ctl, "-m", "fast", "stop"])

    def resume(self) -> None:
        """Start again the server `halt()` stopped."""
        assert self.ours and self._pg_ctl, "only a cluster these tests started can be resumed"
        self._run([*self._pg_ctl, "start"])

    def standby(self) -> PgCluster:
        """A hot standby of this cluster (`pg_basebackup -R`, streaming), on a port of its own:
        read-only, as a database is after a failover to it. Stop it with its `stop()`."""
        assert self.ours and self.directory is not None, "only a cluster these tests started"
        as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        directory = Path(tempfile.mkdtemp(prefix="signoff-pg-standby-"))
        standby = PgCluster("", directory)
        try:
            directory.chmod(0o755)
            if as_pg:
                shutil.chown(directory, "postgres")
            data = directory / "data"
            base = [str(PG_BIN / "pg_basebackup"), "-d", self.admin_url, "-D", str(data), "-R"]
            standby._run([*as_pg, *base, "-X", "stream", "-c", "fast", "--no-sync"])
            port = _free_port()
            options = (
                f"-p {port} -k {directory} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c max_connections=200"
            )
            log = str(directory / "server.log")
            standby._run(
                [*as_pg, str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", log, "-w", "-s"]
                + ["-o", options, "start"]
            )
        except BaseException:
            standby.stop()
            raise
        standby.admin_url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        return standby

    def _run(self, args: list[str]) -> None:
        result = subprocess.run(args, cwd=self.directory, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")

    def stop(self) -> None:
        """Stop the server we started and remove its directory; idempotent."""
        maker, self._maker = self._maker, None
        if maker is not None:
            maker.shutdown(wait=True, cancel_futures=True)
        directory, self.directory = self.directory, None
        if directory is None:
            return
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.kill()
            watchdog.wait()
        if (directory / "data" / "postmaster.pid").exists():
            as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
            subprocess.run(
                [*as_pg, str(PG_BIN / "pg_ctl"), "-D", str(directory / "data"), "-m", "immediate"]
                + ["-s", "stop"],
                cwd=directory,
                capture_output=True,
            )
        shutil.rmtree(directory, ignore_errors=True)

    def url(self, dbname: str) -> str:
        params = conninfo.conninfo_to_dict(self.admin_url)
        params["dbname"] = dbname
        host = params.get("host", "127.0.0.1")
        user = params.get("user", "postgres")
        password = f":{params['password']}" if params.get("password") else ""
        return f"postgresql://{user}{password}@{host}:{params.get('port', 5432)}/{dbname}"

    def create_database(self, template: str | None = None) -> str:
        name = f"signoff_test_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            # FILE_COPY (PostgreSQL 15+) is the fastest way to copy a tiny template with fsync off.
            strategy = " STRATEGY FILE_COPY" if self.ours else ""
            source = f' TEMPLATE "{template}"' if template else ""
            conn.execute(f'CREATE DATABASE "{name}"{source}{strategy}'.encode())
        return name

    def fresh_database(self, template: str | None = None) -> str:
        """A new database like `create_database(template)`, made while the test before ran: the
        copy (~0.2 s, mostly the server's checkpoint) overlaps with test code instead of adding
        to it. The next one is started at once; each is used by one test only."""
        if not self.ours:
            return self.create_database(template)
        if self._maker is None:
            self._maker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pg-spare")
        spare = self._spares.pop(template, None)
        name = spare.result() if spare is not None else self.create_database(template)
        self._spares[template] = self._maker.submit(self.create_database, template)
        return name

    def migrated_template(self) -> str:
        """A database with signoff's schema applied, to copy for each test (made once)."""
        if self._template is None:
            name = self.create_database()
            asyncio.run(PostgresStore(self.url(name)).migrate())
            self._template = name
        return self._template

    def drop_database(self, name: str) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    """The PostgreSQL server of this test session (started on first use, removed at the end)."""
    given = os.environ.get("SIGNOFF_TEST_PG_URL")
    if given:
        yield PgCluster(given)
        return
    cluster = PgCluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def pg_url(pg_cluster: PgCluster) -> Iterator[str]:
    """The URL of a fresh, empty database of its own for this test."""
    name = pg_cluster.fresh_database()
    try:
        yield pg_cluster.url(name)
    finally:
        with contextlib.suppress(psycopg.Error):
            pg_cluster.drop_database(name)


@pytest.fixture
def pg_store_url(pg_cluster: PgCluster) -> Iterator[str]:
    """The URL of a database of its own for this test, with signoff's schema already in it."""
    if pg_cluster.ours:
        name = pg_cluster.fresh_database(template=pg_cluster.migrated_template())
    else:
        name = pg_cluster.create_database()
    try:
        yield pg_cluster.url(name)
    finally:
        with contextlib.suppress(psycopg.Error):
            pg_cluster.drop_database(name)


@pytest.fixture
async def pg(pg_store_url: str) -> AsyncIterator[PostgresStore]:
    """An opened PostgreSQL store on a database of its own with signoff's schema, closed after
    the test."""
    store = PostgresStore(pg_store_url)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture(params=STORE_KINDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store URL for each backend: a SQLite file in tmp_path, a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'state.db'}"
    return str(request.getfixturevalue("pg_store_url"))


def make_store(url: str) -> Store:
    """A store instance for a URL, not opened."""
    if url.startswith("sqlite://"):
        return SQLiteStore(url)
    return PostgresStore(url)


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[Store]:
    """An opened store of each backend, closed after the test."""
    s = make_store(store_url)
    await s.open()
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture(scope="session")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scripts]:
    """`python -c` children forked from one process that imported signoff (tests/_forks.py)."""
    forked = Scripts(tmp_path_factory.mktemp("scripts"))
    try:
        yield forked
    finally:
        forked.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Close the Chromium the browser test files share once the next test does not use it (or
    the run stops here), after this test's own fixtures (its pages) are torn down."""
    try:
        yield
    finally:
        stops = nextitem is None or bool(item.session.shouldstop or item.session.shouldfail)
        if stops or "browser" not in getattr(nextitem, "fixturenames", ()):
            browsers = sys.modules.get("tests._dashboard_browser")
            if browsers is not None:
                browsers.close_browser()


@pytest.fixture(autouse=True)
def _demo_shop_refunds_nothing_yet() -> None:
    """The example's refunds (`examples.support.REFUNDS`, kept in its module) start empty in each
    test: a test that approved order 1042's refund in this worker made the next one that did,
    through the CLI in-process, refuse it as refunded already."""
    shop = sys.modules.get("examples.support")
    if shop is not None:
        shop.REFUNDS.clear()
