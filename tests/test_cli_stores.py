"""The CLI against stores it cannot or must not use: malformed, foreign or non-UTF-8 URLs,
files that are no store, a directory, a FIFO, a missing file, an older store's schema."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from signoff.cli import app
from tests._cli import (
    ROOT,
    TARGET,
    invoke,
    log,
    park,
    pg_schemas,
    url,
)

__all__ = ["url"]  # the fixture, used by name


@pytest.mark.parametrize("command", [["pending"], ["events", "ses_x"], ["db", "upgrade"]])
def test_a_malformed_postgresql_url_is_one_line_without_its_password(command: list[str]) -> None:
    """A URL the URL parser rejects (an unclosed IPv6 bracket) is a StoreError line, not a
    ValueError traceback, and the password in it is not printed."""
    result = invoke(*command, "--store", "postgresql://bob:s3cret@[::1:5432/x")
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: StoreError: invalid PostgreSQL URL"), result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert "s3cret" not in result.output


@pytest.mark.parametrize("command", [["pending"], ["events", "ses_x"], ["db", "upgrade"]])
def test_a_postgresql_url_that_is_not_utf8_is_one_line(command: list[str]) -> None:
    """A URL holding a byte that is not UTF-8 (a lone surrogate once Python decodes argv) is a
    StoreError line, not a UnicodeEncodeError traceback from the driver, without its password."""
    result = invoke(*command, "--store", "postgresql://bob:s3cret@db\udcff.example/x")
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: StoreError: invalid PostgreSQL URL"), result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert "s3cret" not in result.output


@pytest.mark.parametrize(
    "store",
    [
        "postgresql+psycopg://bob:s3cret@db.example/x",  # a SQLAlchemy URL
        "mysql://bob:s3cret@db.example/x",
        "pg://db.example/x?sslmode=require&password=s3cret",
    ],
)
def test_an_unknown_store_url_is_named_without_its_password(store: str) -> None:
    result = invoke("pending", "--store", store)
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: UsageError: unknown store URL"), result.stderr
    assert "db.example" in result.stderr
    assert "s3cret" not in result.output


def test_reading_commands_leave_a_file_that_is_not_a_store_alone(tmp_path: Path) -> None:
    """An empty file, or another program's SQLite database, is refused by the reading and
    answering commands instead of getting signoff's tables written into it."""
    empty = tmp_path / "empty.db"
    empty.touch()
    other = tmp_path / "other.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY)")
    conn.commit()
    conn.close()
    for path in (empty, other):
        before = path.read_bytes()
        for args in (["pending"], ["sessions"], ["events", "ses_x"], ["approve", "req_x"]):
            result = invoke(*args, "--store", f"sqlite:///{path}")
            assert result.exit_code == 1, (args, result.output)
            assert result.stderr.startswith(f"error: UsageError: {path} is not a signoff store")
            assert path.read_bytes() == before, args


def test_reading_commands_open_a_store_whose_path_is_not_utf8(tmp_path: Path) -> None:
    """A store path holding a byte that is not UTF-8, which `db upgrade`, `chat` and `worker`
    create and use: the reading and answering commands raised a UnicodeEncodeError traceback
    checking that it was a store, and still refuse another program's database there."""
    path = tmp_path / os.fsdecode(b"state-\xff.db")
    store = f"sqlite:///{path}"
    session_id, request_id = park(store)
    for args in (
        ["pending", "--json"],
        ["sessions", "--json"],
        ["events", session_id],
        ["db", "status"],
        ["approve", request_id],
    ):
        result = invoke(*args, "--store", store)
        assert result.exit_code == 0, (args, result.output)
        assert "Traceback" not in result.output
    assert "approval.settled" in [e.type for e in log(store, session_id)]
    other = tmp_path / os.fsdecode(b"other-\xff.db")
    conn = sqlite3.connect(os.fsencode(other))
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY)")
    conn.commit()
    conn.close()
    result = invoke("pending", "--store", f"sqlite:///{other}")
    assert result.exit_code == 1, result.output
    assert "is not a signoff store" in result.stderr, result.output


def test_answering_with_a_runtime_refuses_a_store_that_does_not_exist(tmp_path: Path) -> None:
    """`approve REQUEST_ID MODULE:RUNTIME` with a mistyped --store is refused like the same
    command without the runtime, instead of creating an empty store there."""
    typo = tmp_path / "sate.db"
    for args in (["approve", "req_x"], ["deny", "req_x"], ["answer", "req_x", "--text", "hi"]):
        result = invoke(*args, TARGET, "--store", f"sqlite:///{typo}")
        assert result.exit_code == 1, (args, result.output)
        assert result.stderr.startswith(f"error: UsageError: no store at {typo}"), result.stderr
        assert "serve, worker, chat and db upgrade create one" in result.stderr  # every way
        assert not typo.exists(), args


@pytest.mark.parametrize("command", [["db", "upgrade"], ["pending"], ["approve", "req_x"]])
def test_an_empty_store_option_is_refused_not_the_default(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--store "$DATABASE_URL"` with the variable unset is refused, as by chat, worker and
    serve: `db upgrade` used to create and migrate .signoff/state.db here instead, reporting
    success while the intended database stayed unmigrated."""
    monkeypatch.chdir(tmp_path)
    result = invoke(*command, "--store", "")
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: UsageError: unknown store URL ''"), result.output
    assert not (tmp_path / ".signoff").exists()


@pytest.mark.parametrize(
    "command",
    [["pending"], ["events", "ses_x"], ["approve", "req_x"], ["db", "upgrade"], ["worker", TARGET]],
)
def test_a_store_path_that_is_a_directory_is_named_as_one(
    command: list[str], tmp_path: Path
) -> None:
    """`--store sqlite:///DIR` (a folder where the file was meant) says the path is a directory,
    not SQLite's "unable to open database file"; the folder is left as it was."""
    result = invoke(*command, "--store", f"sqlite:///{tmp_path}")
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        f"error: StoreError: cannot open SQLite store {tmp_path}: it is a directory, not a file\n"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [["db", "upgrade"], ["pending"], ["chat", TARGET]])
def test_a_store_path_ending_in_a_slash_is_refused(command: list[str], tmp_path: Path) -> None:
    """`--store sqlite:///DIR/` (a folder meant, or a file named with a slash after it): SQLite
    opened `DIR/` as the file `DIR`, so `db upgrade` or `chat` made a store file where a folder
    was meant, which `pending` with the same URL then said was no store."""
    (tmp_path / "old.db").write_bytes(b"")
    for path in (tmp_path / "new", tmp_path / "old.db"):
        result = CliRunner().invoke(app, [*command, "--store", f"sqlite:///{path}/"], input="")
        assert result.exit_code == 1, result.output
        assert result.stderr.startswith("error: StoreError: SQLite URL "), result.output
        assert "ends in '/'" in result.stderr, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.db"]
    assert (tmp_path / "old.db").read_bytes() == b""


@pytest.mark.parametrize(
    "command",
    [["db", "upgrade"], ["chat", TARGET], ["worker", TARGET], ["serve", TARGET], ["pending"]],
)
def test_a_store_path_under_a_tilde_is_refused_and_nothing_made(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--store sqlite:///~/state.db` (the home directory meant) made a folder named `~` in the
    working directory and a store in it; `pending` then said there was none at `~/state.db`."""
    import uvicorn

    import signoff as so

    async def work(self: so.Runtime, **kw: object) -> None:
        return None

    monkeypatch.setattr(so.Runtime, "work", work)  # a worker that got so far stops
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: None)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, [*command, "--store", "sqlite:///~/state.db"], input="")
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: StoreError: SQLite URL path starts with '~'"), (
        result.output
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "command",
    [["pending"], ["events", "ses_x"], ["approve", "req_x"], ["db", "upgrade"], ["worker", TARGET]],
)
def test_a_store_path_that_is_a_fifo_is_named_as_one(command: list[str], tmp_path: Path) -> None:
    """A named pipe (or a device) where the store was meant is said to be no regular file, not
    "no signoff schema" nor SQLite's "disk I/O error" once it tried to write it."""
    fifo = tmp_path / "state.db"
    os.mkfifo(fifo)
    result = invoke(*command, "--store", f"sqlite:///{fifo}")
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        f"error: StoreError: cannot open SQLite store {fifo}: it is no regular file "
        "(a named pipe, device or socket)\n"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["state.db"]


UPGRADE_FIXTURES = ROOT / "tests" / "fixtures" / "upgrade"


OLDER = "0c4a186"  # store schema 4 on SQLite, migrations 1-5 on PostgreSQL


READING = [
    ["pending"],
    ["sessions"],
    ["events", "SESSION"],
    ["db", "status"],
    ["prune", "--older-than", "1d", "--dry-run"],
]


"""Every command that only reads the store; `SESSION` stands for a session the store holds."""


def _older_sqlite(tmp_path: Path) -> tuple[Path, str]:
    """A copy of a store an older signoff wrote (schema 4), and one of its session ids."""
    db = tmp_path / "state.db"
    db.write_bytes((UPGRADE_FIXTURES / f"sqlite-{OLDER}.db").read_bytes())
    manifest = json.loads((UPGRADE_FIXTURES / f"sqlite-{OLDER}.json").read_text())
    return db, manifest["sessions"]["one"]


def _sqlite_mark(db: Path) -> str:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return str(conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()[0])
    finally:
        conn.close()


@pytest.mark.parametrize("command", READING)
def test_a_reading_command_refuses_an_older_sqlite_store_and_changes_nothing(
    command: list[str], tmp_path: Path
) -> None:
    """`pending`, `sessions` and `events` never upgrade a store (which would lock out the older
    processes still using it): an older schema is one line saying what to run, and the file
    keeps every byte; `db upgrade` then lets them read it."""
    from signoff.stores.sqlite import STORE_SCHEMA

    db, session = _older_sqlite(tmp_path)
    before = db.read_bytes()
    args = [session if a == "SESSION" else a for a in command]
    result = invoke(*args, "--store", f"sqlite:///{db}")
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        f"error: SchemaVersionError: {db} is at store schema 4, this signoff needs "
        f"{STORE_SCHEMA}: run `signoff db upgrade` (once no older signoff uses it)\n"
    )
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.db"]
    assert invoke("db", "upgrade", "--store", f"sqlite:///{db}").exit_code == 0
    assert _sqlite_mark(db) == str(STORE_SCHEMA)
    result = invoke(*args, "--store", f"sqlite:///{db}")
    assert result.exit_code == 0, result.output


def test_a_writing_command_still_upgrades_an_older_sqlite_store(tmp_path: Path) -> None:
    """`approve` (like `deny`, `answer`, `chat`, `worker`, `serve`) opens the store as a runtime
    does: an older schema is upgraded, then the answer recorded."""
    from signoff.stores.sqlite import STORE_SCHEMA

    db, session = _older_sqlite(tmp_path)
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        (request,) = conn.execute(
            "SELECT r.id FROM requests r JOIN sessions s ON s.sk = r.sk "
            "WHERE s.id = ? AND r.status = 'pending'",
            (session,),
        ).fetchone()
    finally:
        conn.close()
    result = invoke("approve", request, "--store", f"sqlite:///{db}")
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"approved {request}"), result.output
    assert _sqlite_mark(db) == str(STORE_SCHEMA)


def _pg_version(url: str) -> int:
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT MAX(version) FROM signoff.schema_version").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("command", READING)
def test_a_reading_command_refuses_an_older_postgres_store_and_changes_nothing(
    command: list[str], pg_url: str
) -> None:
    """The same on PostgreSQL: the database stays at its migration, with its rows as they were."""
    import psycopg

    from signoff.stores.postgres._schema import STORE_SCHEMA
    from signoff.stores.postgres._url import describe
    from tests.conftest import PG_BIN

    restore = [str(PG_BIN / "psql"), "-q", "-v", "ON_ERROR_STOP=1", "-f", "-", pg_url]
    dump = (UPGRADE_FIXTURES / f"postgres-{OLDER}.sql").read_bytes()
    subprocess.run(restore, input=dump, check=True)
    session = json.loads((UPGRADE_FIXTURES / f"postgres-{OLDER}.json").read_text())["sessions"]
    tables = "SELECT table_name, column_name FROM information_schema.columns ORDER BY 1, 2"
    with psycopg.connect(pg_url) as conn:
        columns = conn.execute(tables).fetchall()
    args = [session["one"] if a == "SESSION" else a for a in command]
    result = invoke(*args, "--store", pg_url)
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        f"error: SchemaVersionError: PostgreSQL store {describe(pg_url)} (schema 'signoff') "
        "is at store schema 5, "
        f"this signoff needs {STORE_SCHEMA}: run `signoff db upgrade` (once no older signoff "
        "uses it)\n"
    )
    assert _pg_version(pg_url) == 5
    with psycopg.connect(pg_url) as conn:
        assert conn.execute(tables).fetchall() == columns
    assert invoke("db", "upgrade", "--store", pg_url).exit_code == 0
    assert _pg_version(pg_url) == STORE_SCHEMA
    result = invoke(*args, "--store", pg_url)
    assert result.exit_code == 0, result.output


def test_a_reading_command_names_the_postgres_schema_it_did_not_find(pg_url: str) -> None:
    """`?schema=` picks the schema, and the URL shown leaves it out: the error names it, or an
    operator whose default schema is upgraded reads that it has none."""
    from signoff.stores.postgres._schema import STORE_SCHEMA
    from signoff.stores.postgres._url import describe

    assert invoke("db", "upgrade", "--store", pg_url).exit_code == 0  # schema `signoff`
    result = invoke("pending", "--store", f"{pg_url}?schema=tenant_b")
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        f"error: SchemaVersionError: PostgreSQL store {describe(pg_url)} (schema 'tenant_b') has "
        f"no signoff schema (this signoff needs store schema {STORE_SCHEMA}): run `signoff db "
        "upgrade` to create it\n"
    )


ANSWERING = [["approve", "req_x"], ["deny", "req_x"], ["answer", "req_x", "--text", "hi"]]


@pytest.mark.parametrize("command", ANSWERING)
@pytest.mark.parametrize("with_runtime", [False, True])
def test_an_answering_command_leaves_a_postgres_schema_it_did_not_find_uncreated(
    command: list[str], with_runtime: bool, pg_url: str
) -> None:
    """A mistyped `?schema=` (or database): `approve` without a runtime opened the store as a
    `Runtime` does, which created the whole signoff schema there, and then said the request was
    unknown. It is refused as the reading commands refuse it (and as an answering command
    refuses a SQLite file that does not exist), nothing created."""
    from signoff.stores.postgres._schema import STORE_SCHEMA
    from signoff.stores.postgres._url import describe

    assert invoke("db", "upgrade", "--store", pg_url).exit_code == 0  # schema `signoff`
    before = pg_schemas(pg_url)
    args = [*command, TARGET] if with_runtime else command
    result = invoke(*args, "--store", f"{pg_url}?schema=tenant_typo")
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        f"error: SchemaVersionError: PostgreSQL store {describe(pg_url)} (schema 'tenant_typo') "
        f"has no signoff schema (this signoff needs store schema {STORE_SCHEMA}): run `signoff "
        "db upgrade` to create it\n"
    )
    assert pg_schemas(pg_url) == before
    # and a schema that is there is still found, and its unknown request named
    result = invoke(*args, "--store", pg_url)
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: UnknownRequest: no request 'req_x'"), result.stderr


@pytest.mark.parametrize(
    ("url", "port"),
    [
        ("postgresql://u@127.0.0.1:notaport/db", "notaport"),
        ("postgresql://u@127.0.0.1:70000/db", "70000"),
        ("postgresql://u@127.0.0.1/db?port=abc", "abc"),
        ("postgresql://u@h1:5432,h2:-1/db", "-1"),
    ],
)
@pytest.mark.parametrize("command", ["sessions", "worker"])
def test_a_postgresql_url_with_a_port_that_is_no_port_is_refused_not_waited_for(
    url: str, port: str, command: str
) -> None:
    """libpq refuses such a port only when connecting, which signoff took for a database that
    is down: `signoff worker` waited for it forever ("waiting for the store"), the others
    printed StoreUnavailable. It is a `StoreError` naming the port, before any connection."""
    argv = [command, *(["tests._cli:agent"] if command == "worker" else []), "--store", url]
    done = subprocess.run(
        [sys.executable, "-m", "signoff", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr == (
        f"error: StoreError: invalid PostgreSQL URL: port {port!r} is not a whole number "
        "from 1 to 65535\n"
    ), done.stderr


@pytest.mark.parametrize(
    ("url", "env", "message"),
    [
        (
            "postgresql://u@127.0.0.1/db?sslmode=bogus",
            {},
            'invalid PostgreSQL URL: invalid sslmode value: "bogus" (URL option sslmode)',
        ),
        (
            "postgresql://u@127.0.0.1/db",
            {"PGPORT": "abc"},
            'invalid PostgreSQL setting: invalid integer value "abc" for connection option '
            '"port" (PGPORT in the environment)',
        ),
        (
            "postgresql://u@127.0.0.1/db",
            {"PGSSLMODE": "bogus"},
            'invalid PostgreSQL setting: invalid sslmode value: "bogus" (PGSSLMODE in the '
            "environment)",
        ),
    ],
)
@pytest.mark.parametrize("command", ["sessions", "worker"])
def test_a_postgresql_setting_libpq_refuses_is_refused_not_waited_for(
    url: str, env: dict[str, str], message: str, command: str
) -> None:
    """A bad `sslmode` (in the URL or `PGSSLMODE`) or a `PGPORT` that is no number read as a
    database that is down, as a bad port in the URL did: `signoff worker` waited for it forever.
    It is a `StoreError` naming the setting and where it came from, before any connection."""
    argv = [command, *(["tests._cli:agent"] if command == "worker" else []), "--store", url]
    done = subprocess.run(
        [sys.executable, "-m", "signoff", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr == f"error: StoreError: {message}\n", done.stderr


ASKING = {
    # what the command is given, and what it says once `db upgrade` upgraded the store
    "delete answered no": (["delete", "SESSION"], "SessionWaiting"),  # refused before asking
    "delete --force answered no": (["delete", "SESSION", "--force"], "Nothing deleted."),
    "delete --yes": (["delete", "SESSION", "--yes"], "SessionWaiting"),
    "delete an unknown id": (["delete", "ses_nope", "--yes"], "UnknownSession"),
    "delete MODULE:RUNTIME": (["delete", "SESSION", TARGET, "--yes"], "SessionWaiting"),
    "prune": (["prune", "--older-than", "1d"], "Nothing to delete"),
    "prune --yes": (["prune", "--older-than", "1d", "--yes"], "Nothing to delete"),
    "prune MODULE:RUNTIME": (["prune", "--older-than", "1d", TARGET, "--yes"], "Nothing to delete"),
}


def _schema_3_sqlite(tmp_path: Path) -> tuple[Path, str]:
    """A copy of a store signoff c6a7afd wrote (schema 3), and one of its (waiting) sessions."""
    db = tmp_path / "state.db"
    db.write_bytes((UPGRADE_FIXTURES / "sqlite-c6a7afd.db").read_bytes())
    manifest = json.loads((UPGRADE_FIXTURES / "sqlite-c6a7afd.json").read_text())
    return db, manifest["sessions"]["one"]


@pytest.mark.parametrize(("command", "then"), ASKING.values(), ids=ASKING.keys())
def test_a_command_that_asks_first_refuses_an_older_sqlite_store_and_changes_nothing(
    command: list[str], then: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`delete` and `prune` upgraded the store on opening, before they asked: an answer of no
    (or a mistyped id) had still locked out the older processes using it. They refuse an older
    schema as the reading commands do, with `--yes` too, asking nothing and writing nothing;
    once `db upgrade` upgraded it, they go on as before."""
    from signoff.cli import _deletion
    from signoff.stores.sqlite import STORE_SCHEMA

    monkeypatch.setattr(_deletion, "_can_ask", lambda: True)
    db, session = _schema_3_sqlite(tmp_path)
    before = db.read_bytes()
    args = [*(session if a == "SESSION" else a for a in command), "--store", f"sqlite:///{db}"]
    result = CliRunner().invoke(app, args, input="n\n")
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        f"error: SchemaVersionError: {db} is at store schema 3, this signoff needs "
        f"{STORE_SCHEMA}: run `signoff db upgrade` (once no older signoff uses it)\n"
    )
    assert result.stdout == ""  # nothing asked
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.db"]
    assert invoke("db", "upgrade", "--store", f"sqlite:///{db}").exit_code == 0
    result = CliRunner().invoke(app, args, input="n\n")
    assert then in result.output, result.output
    assert result.exit_code == (0 if then.startswith("Nothing to") else 1), result.output


def test_cancel_writes_without_asking_and_upgrades_an_older_sqlite_store(tmp_path: Path) -> None:
    """`cancel` asks nothing: it opens the store as `approve` does, an older schema upgraded."""
    from signoff.stores.sqlite import STORE_SCHEMA

    db, session = _schema_3_sqlite(tmp_path)
    result = invoke("cancel", session, "--store", f"sqlite:///{db}")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("cancelled turn "), result.output
    assert _sqlite_mark(db) == str(STORE_SCHEMA)


@pytest.mark.parametrize(
    "command", [["delete", "SESSION", "--yes"], ["prune", "--older-than", "1d", "--yes"]]
)
def test_a_command_that_asks_first_refuses_an_older_postgres_store_and_changes_nothing(
    command: list[str], pg_url: str
) -> None:
    """The same on PostgreSQL: the database stays at its migration, with its columns as they
    were."""
    import psycopg

    from signoff.stores.postgres._schema import STORE_SCHEMA
    from signoff.stores.postgres._url import describe
    from tests.conftest import PG_BIN

    restore = [str(PG_BIN / "psql"), "-q", "-v", "ON_ERROR_STOP=1", "-f", "-", pg_url]
    dump = (UPGRADE_FIXTURES / "postgres-c6a7afd.sql").read_bytes()
    subprocess.run(restore, input=dump, check=True)
    session = json.loads((UPGRADE_FIXTURES / "postgres-c6a7afd.json").read_text())["sessions"]
    tables = "SELECT table_name, column_name FROM information_schema.columns ORDER BY 1, 2"
    with psycopg.connect(pg_url) as conn:
        columns = conn.execute(tables).fetchall()
    args = [session["one"] if a == "SESSION" else a for a in command]
    result = invoke(*args, "--store", pg_url)
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        f"error: SchemaVersionError: PostgreSQL store {describe(pg_url)} (schema 'signoff') "
        f"is at store schema 4, this signoff needs {STORE_SCHEMA}: run `signoff db upgrade` "
        "(once no older signoff uses it)\n"
    )
    assert _pg_version(pg_url) == 4
    with psycopg.connect(pg_url) as conn:
        assert conn.execute(tables).fetchall() == columns


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["sessions", "tests._cli:agent"],
            b"error: UsageError: cannot load 'tests._cli:agent': the current directory no "
            b"longer exists",
        ),
        (
            ["db", "upgrade", "--store", "sqlite:///rel.db"],
            b"error: StoreError: cannot open SQLite store rel.db: the current directory no "
            b"longer exists",
        ),
    ],
    ids=["runtime", "relative-store"],
)
def test_a_working_directory_removed_is_one_line_not_a_traceback(
    tmp_path: Path, args: list[str], said: bytes
) -> None:
    """Run from a directory removed since (`cd` into it, then `rm -r` from elsewhere): loading
    a runtime (`os.getcwd`) and a relative store path (`abspath`) ended in a FileNotFoundError
    traceback."""
    gone = tmp_path / "gone"
    gone.mkdir()
    script = (
        "import os, runpy, sys; os.chdir(sys.argv[1]); os.rmdir(sys.argv[1]); "
        "sys.argv = ['signoff', *sys.argv[2:]]; runpy.run_module('signoff', run_name='__main__')"
    )
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    env.pop("SIGNOFF_STORE", None)
    proc = subprocess.run(
        [sys.executable, "-c", script, str(gone), *args],
        capture_output=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 1, proc
    assert proc.stderr.startswith(said), proc.stderr
    assert b"Traceback" not in proc.stderr
