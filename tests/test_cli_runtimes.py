"""`MODULE:RUNTIME` on every command that opens a store (`_app.store_of`, `load_runtime`): the
reading and schema commands take one too, for its store (`signoff pending` could not), which
`--store` or `SIGNOFF_STORE` replaces as for `serve`; and a runtime of the wrong form, or one
that is not there, is the same error whatever the command, before any store is opened."""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main
import uvicorn

from signoff.cli import app
from signoff.stores.sqlite import STORE_SCHEMA

from ._cli import invoke, park, pg_schemas, refused_usage, runtime_module, tenant_runtime

T = "{target}"

COMMANDS = [
    ["chat", T],
    ["serve", T],
    ["worker", T],
    ["pending", T],
    ["sessions", T],
    ["events", "ses_x", T],
    ["approve", "req_x", T],
    ["deny", "req_x", T],
    ["answer", "req_x", T, "--text", "hi"],
    ["cancel", "ses_x", T],
    ["delete", "ses_x", T, "--yes"],
    ["prune", "--older-than", "90d", T, "--yes"],
    ["db", "upgrade", T],
    ["db", "status", T],
]
"""Every command, each with `MODULE:RUNTIME` where it takes it: all of them open a store."""


def naming(command: list[str], target: str) -> list[str]:
    return [target if word == T else word for word in command]


def test_every_command_is_listed_and_takes_a_runtime() -> None:
    """A command added later is listed here, and so checked below, or this fails."""
    root: Any = typer.main.get_command(app)
    every = {
        (name, *([sub] if sub else []))
        for name, command in root.commands.items()
        for sub in getattr(command, "commands", None) or [""]
    }
    listed = {tuple(c[: 2 if c[0] == "db" else 1]) for c in COMMANDS}
    assert listed == every
    for words in listed:
        command = root
        for word in words:
            command = command.commands[word]
        assert [p.metavar for p in command.params if p.param_type_name == "argument"][-1] == (
            "MODULE:RUNTIME"
        ), words


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_runtime_of_the_wrong_form_is_the_same_usage_error_everywhere(
    command: list[str], tmp_path: Path
) -> None:
    store = f"sqlite:///{tmp_path}/s.db"
    said = refused_usage(invoke(*naming(command, "no-colon"), "--store", store))
    assert said == (
        "Invalid value: expected MODULE:RUNTIME such as examples.support:runtime, got 'no-colon'"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_runtime_that_is_not_there_is_the_same_error_everywhere(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Imported even where `--store` replaces its store, before the store is opened: a
    mistyped runtime is never read past."""
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: None)  # never reached
    store = f"sqlite:///{tmp_path}/s.db"
    result = invoke(*naming(command, "tests._cli:nothing"), "--store", store)
    assert result.exit_code == 1, result.output
    assert result.stderr == "error: UsageError: module 'tests._cli' has no attribute 'nothing'\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("module", "source", "said"),
    [
        ("t_none", "make = None\n", "t_none:make is a NoneType"),
        (
            "t_factory_none",
            "def make():\n    return None\n",
            "t_factory_none:make() returned a value that is a NoneType",
        ),
        (
            "t_factory_str",
            "def make():\n    return 'app'\n",
            "t_factory_str:make() returned a value that is a str",
        ),
    ],
)
def test_a_runtime_factory_returning_no_runtime_is_told_from_no_runtime(
    module: str, source: str, said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A factory that returned None was told "t_factory_none:make is a NoneType", of a name
    that is a function: the line says the factory ran and what it returned."""
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    result = invoke("sessions", f"{module}:make", "--store", f"sqlite:///{tmp_path}/s.db")
    assert result.exit_code == 1, result.output
    assert result.stderr == f"error: UsageError: {said}, not a signoff Runtime or Agent\n"


@pytest.mark.parametrize(
    ("source", "said"),
    [
        (
            "import sys\nsys.exit(0)\n",
            "importing '{module}' exited (sys.exit(0)): it runs a script when imported (a "
            "script's run goes under if __name__ == '__main__':)",
        ),
        (
            "import sys\ndef make():\n    sys.exit()\n",
            "{module}:make() exited (sys.exit()) instead of returning a signoff Runtime or Agent",
        ),
    ],
    ids=["import", "factory"],
)
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_runtime_whose_module_or_factory_exits_is_one_line_not_a_silent_stop(
    command: list[str], source: str, said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script whose run calls `sys.exit` where it is imported (or a factory that does): the
    command stopped there with the script's status, 0 for `sys.exit(0)`, saying nothing, so
    `signoff approve REQ app:runtime` exited 0 without approving; now one line, status 1."""
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: None)  # never reached
    module = f"t_exits_{uuid.uuid4().hex}"
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    store = f"sqlite:///{tmp_path}/s.db"
    result = invoke(*naming(command, f"{module}:make"), "--store", store)
    assert result.exit_code == 1, result.output
    assert result.stderr == f"error: UsageError: {said.format(module=module)}\n"
    assert not (tmp_path / "s.db").exists()  # no store opened


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ("tests/_cli.py", "tests._cli:nothing"),
        ("./tests/_cli", "tests._cli:nothing"),
        ("_cli.py", "_cli:nothing"),
        ("/srv/app/agents.py", "run the command in the file's directory, with agents:nothing"),
        ("../app/agents", "run the command in the file's directory, with agents:nothing"),
    ],
)
@pytest.mark.parametrize("command", [["chat", T], ["approve", "req_x", T]], ids=["chat", "approve"])
def test_a_file_path_given_as_the_module_is_told_the_module_s_name(
    command: list[str], given: str, named: str, tmp_path: Path
) -> None:
    """`signoff chat app.py:runtime` (or `./app:runtime`, `pkg/app.py:runtime`), an easy first
    mistake, said no such module, or for `./app` that a relative import needs a package: it
    now names the dotted module to give instead; nothing is opened."""
    store = f"sqlite:///{tmp_path}/s.db"
    result = invoke(*naming(command, f"{given}:nothing"), "--store", store)
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        f"error: UsageError: cannot import {given!r}: that is a file path, and MODULE:RUNTIME "
        f"takes a module's dotted name, as python -m does: {named}\n"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def own_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """A module of a runtime whose own store is a file of `tmp_path`: (MODULE:RUNTIME, URL)."""
    url = f"sqlite:///{tmp_path}/own.db"
    return runtime_module(tmp_path, monkeypatch, "own_runtime", repr(url)), url


def test_the_reading_commands_read_the_runtimes_own_store(own_store: tuple[str, str]) -> None:
    target, url = own_store
    path = url.removeprefix("sqlite:///")
    assert invoke("db", "upgrade", target).stdout.startswith("schema created")
    session_id, request_id = park(url)
    listed = invoke("pending", target, "--json")
    assert [r["id"] for r in json.loads(listed.stdout)] == [request_id], listed.output
    rows = invoke("sessions", target, "--json")
    assert [r["id"] for r in json.loads(rows.stdout)] == [session_id], rows.output
    log = invoke("events", session_id, target, "--json")
    assert json.loads(log.stdout.splitlines()[0])["type"] == "session.created", log.output
    status = invoke("db", "status", target)
    assert status.stdout == f"schema is up to date (version {STORE_SCHEMA}) ({url})\n"
    assert Path(path).exists()


def test_store_and_its_variable_replace_the_runtimes_own(
    own_store: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As for `serve`, `worker` and `chat`: the runtime's store only when neither is given."""
    target, url = own_store
    session_id, _ = park(url)
    other = tmp_path / "other.db"
    for how in ("option", "variable"):
        if how == "option":
            result = invoke("pending", target, "--store", f"sqlite:///{other}")
        else:
            monkeypatch.setenv("SIGNOFF_STORE", f"sqlite:///{other}")
            result = invoke("pending", target)
        assert result.exit_code == 1, result.output
        assert result.stderr.startswith(f"error: UsageError: no store at {other}"), how
    monkeypatch.setenv("SIGNOFF_STORE", url)
    rows = invoke("sessions", target, "--json")
    assert [r["id"] for r in json.loads(rows.stdout)] == [session_id]
    assert not other.exists()


def test_a_runtimes_store_of_another_schema_is_the_one_read_and_upgraded(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runtime whose store names its schema as an argument (`PostgresStore(url, schema=)`,
    not `?schema=` in its URL): the schema commands upgrade and check that schema, and the
    reading commands read it, never the default schema of the same database."""

    target = tenant_runtime(tmp_path, monkeypatch, "schema_runtime", pg_url)
    upgraded = invoke("db", "upgrade", target)
    assert upgraded.stdout.startswith("schema created"), upgraded.output
    assert "schema 'tenant_a'" in upgraded.stdout
    schemas = pg_schemas(pg_url)
    assert "tenant_a" in schemas and "signoff" not in schemas
    status = invoke("db", "status", target)
    assert status.exit_code == 0 and "schema 'tenant_a'" in status.stdout, status.output
    session_id, request_id = park(f"{pg_url}?schema=tenant_a")
    listed = invoke("pending", target, "--json")
    assert [r["id"] for r in json.loads(listed.stdout)] == [request_id], listed.output
    rows = invoke("sessions", target, "--json")
    assert [r["id"] for r in json.loads(rows.stdout)] == [session_id], rows.output


@pytest.mark.parametrize("command", [["chat"], ["sessions"], ["worker"]])
def test_the_readme_s_script_named_as_a_runtime_is_one_line_saying_why(
    command: list[str], tmp_path: Path
) -> None:
    """The README's *In Python* example saved as `app.py` and named as `app:agent`, which it
    defines: its `asyncio.run(main())` runs on import, inside the command's event loop, and
    fails. That said only "asyncio.run() cannot be called from a running event loop", then, as
    the process exited, two lines of "coroutine 'main' was never awaited"; now one line that
    says where a script's run goes, and nothing is written."""
    import os
    import subprocess
    import sys

    from ._docs import ROOT, blocks

    script = blocks("README.md", "python")[0]
    assert "\nasyncio.run(main())\n" in script and "\nagent = so.Agent(" in script
    (tmp_path / "app.py").write_text(script)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    env.pop("SIGNOFF_STORE", None)
    done = subprocess.run(
        [sys.executable, "-m", "signoff", *command, "app:agent"],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr == (
        "error: UsageError: importing 'app' failed: RuntimeError: asyncio.run() cannot be called "
        "from a running event loop (it runs asyncio.run() when imported: a script's run goes "
        "under if __name__ == '__main__':)\n"
    )
    assert [p.name for p in tmp_path.iterdir() if p.name != "__pycache__"] == ["app.py"]


# -- a runtime's store opened with its own settings --------------------------------------------

PG_SETTINGS = (
    "schema='tenant_a', connect_timeout=1, operation_timeout=7, grace=3, timeout=9, "
    "request_timeout=2, min_size=2, max_size=4, poll_interval=0.5"
)
"""A runtime's `PostgresStore` settings other than its URL's, none of them the default."""


@pytest.fixture
def blackhole() -> Iterator[int]:
    """The port of a socket that listens and never accepts nor answers: a hung server, to which
    a connection is made (by the kernel) and then waits for libpq's `connect_timeout`."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield sock.getsockname()[1]


def pg_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, port: int) -> str:
    """A module of a runtime whose `PostgresStore` at `port` has `PG_SETTINGS`."""
    url = f"postgresql://u:pw@127.0.0.1:{port}/db"
    return runtime_module(
        tmp_path,
        monkeypatch,
        "pg_settings_runtime",
        f"PostgresStore({url!r}, {PG_SETTINGS})",
        imported="from signoff.stores.postgres import PostgresStore",
    )


def connected(monkeypatch: pytest.MonkeyPatch, *, refused: bool) -> list[Any]:
    """The PostgreSQL stores that go on to connect (each time), recorded; with `refused`, each
    connection is refused at once as by a wrong password (a `StoreError`, not waited out)."""
    import psycopg

    from signoff.stores.postgres._connections import Connections

    stores: list[Any] = []
    real = Connections._connect_raw

    async def recorded(self: Connections, **where: Any) -> Any:
        stores.append(self)
        if refused:
            raise psycopg.OperationalError('FATAL:  password authentication failed for user "u"')
        return await real(self, **where)

    monkeypatch.setattr(Connections, "_connect_raw", recorded)
    return stores


def assert_own_settings(store: Any) -> None:
    from psycopg.conninfo import conninfo_to_dict

    assert conninfo_to_dict(store._dsn)["connect_timeout"] == "1"
    assert store.schema == "tenant_a"
    assert (store.operation_timeout, store.timeout, store.request_timeout) == (7, 9, 2)
    assert store.poll_interval == 0.5
    # One connection kept, not the runtime's least: a command needs a connection or two.
    assert (store.min_size, store.max_size) == (1, 4)
    assert store._outage.grace == 3


@pytest.mark.parametrize(
    "command",
    [
        ["pending", T],
        ["sessions", T],
        ["events", "ses_x", T],
        ["db", "status", T],
        ["db", "upgrade", T],
        ["prune", "--older-than", "90d", T, "--dry-run"],
        ["prune", "--older-than", "90d", T, "--yes"],
        ["approve", "req_x", T],
        ["deny", "req_x", T],
        ["answer", "req_x", T, "--text", "hi"],
        ["cancel", "ses_x", T],
        ["delete", "ses_x", T, "--yes"],
        ["serve", T, "--port", "0"],
    ],
    ids=lambda c: " ".join(w for w in c if "{" not in w),
)
def test_a_runtimes_postgres_store_is_opened_with_its_own_settings(
    command: list[str], blackhole: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`signoff pending app:runtime` opened a store made again from the runtime's store's URL,
    which leaves out the settings given as arguments (`PostgresStore(url, connect_timeout=1)`):
    the command waited libpq's 5 s on a hung server where the runtime waits 2, and so did each
    command's store, the schema probe of the answering ones and `serve`'s check. Each now
    connects with the runtime's settings, upgrading nothing unless it is `serve`'s own store."""
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: None)  # never reached
    target = pg_runtime(tmp_path, monkeypatch, blackhole)
    stores = connected(monkeypatch, refused=True)
    result = invoke(*naming(command, target))
    assert result.exit_code == 1, result.output
    assert "password authentication failed" in result.stderr
    assert stores
    for store in stores:
        assert_own_settings(store)
        assert store.auto_migrate is (command[0] == "serve")


def test_a_command_on_a_hung_server_fails_as_its_runtime_would(
    blackhole: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hunt's case: a server that takes the connection and never answers. `pending` fails
    as the runtime would, after the runtime's `connect_timeout`, not libpq's default."""
    target = pg_runtime(tmp_path, monkeypatch, blackhole)
    stores = connected(monkeypatch, refused=False)
    result = invoke("pending", target)
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: StoreUnavailable: cannot connect to PostgreSQL"), (
        result.stderr
    )
    assert "timeout expired" in result.stderr
    assert stores
    for store in stores:
        assert_own_settings(store)


@pytest.mark.parametrize(
    "command",
    [
        ["pending", T],
        ["sessions", T],
        ["events", "{session}", T],
        ["db", "status", T],
        ["db", "upgrade", T],
        ["prune", "--older-than", "90d", T, "--dry-run"],
        ["approve", "{request}", T],
        ["serve", T, "--port", "0"],
    ],
    ids=lambda c: " ".join(w for w in c if "{" not in w),
)
def test_a_runtimes_sqlite_store_is_opened_with_its_busy_timeout(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`SQLiteStore(path, busy_timeout=…)`: the reading and schema commands and `serve`'s check
    waited SQLite's locks the default 30 s, not the runtime's; they now wait its own."""
    from signoff.stores.sqlite._connection import Connection

    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: None)
    url = f"sqlite:///{tmp_path}/own.db"
    session_id, request_id = park(url)
    target = runtime_module(
        tmp_path,
        monkeypatch,
        "busy_runtime",
        f"SQLiteStore({url!r}, busy_timeout=0.25)",
        imported="from signoff.stores import SQLiteStore",
    )
    opened: list[Connection] = []
    real = Connection._open

    def recorded(self: Connection, upgrade: bool | None) -> None:
        opened.append(self)
        real(self, upgrade)

    monkeypatch.setattr(Connection, "_open", recorded)
    words = [w.format(session=session_id, request=request_id) for w in naming(command, target)]
    result = invoke(*words)
    assert result.exit_code == 0, result.output
    assert opened
    assert [store.busy_timeout for store in opened] == [0.25] * len(opened)


def test_a_runtimes_store_of_another_kind_is_read_from_its_url_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that is neither of signoff's has no settings the CLI knows: the reading commands
    open a store of its URL, as they always did, and never call it."""
    url = f"sqlite:///{tmp_path}/own.db"
    _, request_id = park(url)
    (tmp_path / "elsewhere_store.py").write_text(
        "class Elsewhere:\n"
        f"    url = {url!r}\n"
        "    async def open(self):\n"
        "        raise AssertionError('opened')\n"
        "    async def close(self):\n"
        "        pass\n"
    )
    target = runtime_module(
        tmp_path,
        monkeypatch,
        "elsewhere_runtime",
        "Elsewhere()",
        imported="from elsewhere_store import Elsewhere",
    )
    listed = invoke("pending", target, "--json")
    assert [r["id"] for r in json.loads(listed.stdout)] == [request_id], listed.output
    status = invoke("db", "status", target)
    assert status.exit_code == 0, status.output


def test_a_copy_of_a_runtimes_store_keeps_one_connection_whatever_its_pool() -> None:
    """A pool the runtime sizes from its URL (`?pool_min=16`) and its code (`max_size=32`):
    the copy a command opens dropped both sizes and took the URL's least with the default
    most, 16 above 10, refused; and `?pool_min=8` overridden by `min_size=1` opened 8."""
    from signoff.cli._store_files import unopened_like
    from signoff.stores.postgres import PostgresStore

    for store, most in [
        (PostgresStore("postgresql://u@127.0.0.1:1/db?pool_min=16", max_size=32), 32),
        (PostgresStore("postgresql://u@127.0.0.1:1/db?pool_min=8", min_size=1), 10),
        (PostgresStore("postgresql://u@127.0.0.1:1/db?pool_max=3"), 3),
    ]:
        copy = unopened_like(store, migrate=False)
        assert isinstance(copy, PostgresStore) and copy is not store
        assert (copy.min_size, copy.max_size) == (1, most)
