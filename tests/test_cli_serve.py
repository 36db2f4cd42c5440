"""`signoff serve` (`_serve`) as a process: approving from the command line what it parked, its
channel options and secrets, a store it cannot open, PostgreSQL down when it starts."""

from __future__ import annotations

import http.server
import json
import queue
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from signoff.channels.webhooks import verify_webhook

from ._cli import (
    ROOT,
    TARGET,
    _free_port,
    invoke,
    pg_schemas,
    refused_usage,
    runtime_module,
    tenant_runtime,
)


@pytest.mark.parametrize("given", ["sqlite:///hub.db", "postgresql://db/hub"])
def test_serve_refuses_a_store_url_as_its_channel_state_file(
    given: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--channel-state` takes a file path: a URL, as `--store` takes, was made a relative path,
    so `sqlite:///hub.db` became the file `hub.db` in a new folder `sqlite:` of the working
    directory, where no other process looking for `hub.db` would find it."""
    monkeypatch.chdir(tmp_path)
    store = f"sqlite:///{tmp_path}/state.db"
    hook = ("--webhook", "http://127.0.0.1:9/hook", "--webhook-secret", "s")
    result = invoke(
        "serve", TARGET, "--store", store, "--port", "0", *hook, "--channel-state", given
    )
    assert refused_usage(result) == (
        f"Invalid value: --channel-state takes the path of a SQLite file, not a URL: {given!r}"
    )
    assert list(tmp_path.iterdir()) == []


def test_serve_names_a_store_or_channel_state_it_cannot_open(tmp_path: Path) -> None:
    newer = tmp_path / "newer.db"
    conn = sqlite3.connect(newer)
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    conn.execute("INSERT INTO meta VALUES ('schema', '999')")
    conn.commit()
    conn.close()
    result = invoke("serve", TARGET, "--store", f"sqlite:///{newer}", "--port", "0")
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: SchemaVersionError: "), result.output
    assert len(result.stderr.strip().splitlines()) == 1
    (tmp_path / "file").write_text("not a directory")
    store = f"sqlite:///{tmp_path}/state.db"
    with_channels = ("--port", "0", "--webhook", "http://127.0.0.1:9/hook", "--webhook-secret", "s")
    result = invoke(
        "serve",
        TARGET,
        "--store",
        store,
        *with_channels,
        "--channel-state",
        str(tmp_path / "file" / "hub.db"),
    )
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: StoreError: cannot open the channel state")
    folder = tmp_path / "channels"
    folder.mkdir()
    result = invoke(
        "serve", TARGET, "--store", store, *with_channels, "--channel-state", str(folder)
    )
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        f"error: StoreError: cannot open the channel state {folder}: it is a directory, not a "
        "file\n"
    )
    assert list(folder.iterdir()) == []


PROVIDER_VARIABLES = ("SIGNOFF_MODEL", "OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY")


class WebhookReceiver:
    """A loopback HTTP server that keeps the verified payload of every webhook delivery."""

    def __init__(self, secret: str = "s3cret") -> None:
        received: queue.Queue[dict[str, Any]] = queue.Queue()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.put(verify_webhook(secret, dict(self.headers), body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.received = received
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def wait_for(self, event: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            payload = self.received.get(timeout=max(0.01, deadline - time.monotonic()))
            if payload["type"] == event:
                return payload

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_serve_then_approve_from_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in PROVIDER_VARIABLES:  # the example's offline demo model, here and in the server
        monkeypatch.delenv(name, raising=False)
    url = f"sqlite:///{tmp_path}/state.db"
    port = _free_port()
    hooks = WebhookReceiver()
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("signoff")), "serve", "examples.support:runtime"]
        + ["--port", str(port), "--store", url]
        + ["--webhook", hooks.url, "--webhook-secret", "s3cret"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert server.stdout is not None
        banner = server.stdout.readline()
        assert f"dashboard at http://127.0.0.1:{port}/_signoff" in banner
        base = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{base}/openapi.json", timeout=2).raise_for_status()
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "server did not start"
                time.sleep(0.05)
        created = httpx.post(
            f"{base}/sessions",
            json={"agent": "support", "message": "refund order 1042, it arrived broken"},
            timeout=10,
        )
        assert created.status_code == 201, created.text
        body = created.json()
        assert body["status"] == "waiting"
        session_id = body["session_id"]
        pending = json.loads(invoke("pending", "--store", url, "--json").stdout)
        assert [p["session_id"] for p in pending] == [session_id]
        request_id = pending[0]["id"]
        opened = hooks.wait_for("request.opened")  # the --webhook channel, signed
        assert opened["request"]["id"] == request_id
        asker = pending[0]["requested_by"]

        result = invoke(
            "approve",
            request_id,
            "examples.support:runtime",
            "--store",
            url,
            "--as",
            f"{asker['authenticator']}:{asker['principal_id']}",
        )
        assert result.exit_code == 0, result.output
        assert "support: Done. I've refunded 180.00 for order 1042" in result.output

        seen = httpx.get(f"{base}/sessions/{session_id}", timeout=10)
        assert seen.status_code == 200
        assert "Done. I've refunded 180.00" in seen.text
        assert json.loads(invoke("pending", "--store", url, "--json").stdout) == []
        resolved = hooks.wait_for("request.resolved")
        assert resolved["request"]["id"] == request_id
    finally:
        hooks.close()
        server.terminate()
        server.wait(timeout=30)
        if server.stdout is not None:
            server.stdout.close()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--webhook", "http://127.0.0.1:9/hook"], "--webhook needs --webhook-secret"),
        (["--webhook-secret", "s3cret"], "no --webhook URL"),
        (["--webhook-backfill"], "--webhook-backfill is given but no --webhook URL"),
        (["--webhook", "ftp://example/hook", "--webhook-secret", "s"], "must be http(s)"),
        (["--slack-channel", "C0123"], "--slack-channel needs --slack-token"),
        (["--slack-channel", "C0123", "--slack-token", "xoxb-1"], "--slack-signing-secret"),
        (["--slack-token", "xoxb-1"], "--slack-token is given but no --slack-channel"),
        (["--slack-signing-secret", "s"], "--slack-signing-secret is given but no --slack-channel"),
        (["--slack-users-by-email"], "--slack-users-by-email is given but no --slack-channel"),
        (["--slack-external-team", "T0P"], "--slack-external-team is given but no --slack-users"),
        (["--channel-state", "hub.db"], "--channel-state is given but no --webhook or --slack"),
    ],
)
def test_serve_refuses_incomplete_channel_options(
    args: list[str], message: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import uvicorn

    for name in ("SIGNOFF_WEBHOOK_SECRET", "SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET"):
        monkeypatch.delenv(name, raising=False)
    started: list[Any] = []  # a server wrongly started must not listen until the test times out
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: started.append(self))
    store = f"sqlite:///{tmp_path}/state.db"
    result = invoke("serve", "examples.support:runtime", "--store", store, *args)
    assert message in refused_usage(result)
    assert started == [] and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("secret", "problem"),
    [("whsec_abc\n", "has spaces or a newline around it"), (" ", "is blank")],
)
@pytest.mark.parametrize("exported", [False, True])
@pytest.mark.parametrize(
    ("channel", "flag", "envvar"),
    [
        (["--webhook", "http://127.0.0.1:9/hook"], "--webhook-secret", "SIGNOFF_WEBHOOK_SECRET"),
        (
            ["--slack-channel", "C0123", "--slack-token", "xoxb-1"],
            "--slack-signing-secret",
            "SLACK_SIGNING_SECRET",
        ),
    ],
)
def test_serve_refuses_a_signing_secret_with_blanks_around_it_unshown(
    secret: str,
    problem: str,
    exported: bool,
    channel: list[str],
    flag: str,
    envvar: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """SIGNOFF_WEBHOOK_SECRET read from a file written by `echo` ends in a newline: `serve`
    signed every delivery with it, and each receiver answered 401, a final refusal; a Slack
    signing secret with it refused every click Slack sent. Refused before the server starts,
    naming the option, not the secret."""
    import uvicorn

    started: list[Any] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: started.append(self))
    monkeypatch.delenv(envvar, raising=False)
    args = list(channel)
    if exported:
        monkeypatch.setenv(envvar, secret)
    else:
        args += [flag, secret]
    store = f"sqlite:///{tmp_path}/state.db"
    result = invoke("serve", "examples.support:runtime", "--store", store, *args)
    message = refused_usage(result)
    assert f"{flag} (or {envvar}) {problem}" in message
    assert "whsec_" not in result.output
    assert started == []


def test_serve_ignores_channel_secrets_exported_for_channels_it_does_not_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A secret exported in the environment (for another command, or a later run) is not an
    error without its channel; the same secret given on the command line is (see above)."""
    import uvicorn

    served: list[Any] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: served.append(self.config.app))
    monkeypatch.setenv("SIGNOFF_WEBHOOK_SECRET", "s3cret")
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-1")
    monkeypatch.setenv("SLACK_SIGNING_SECRET", "s")
    result = invoke("serve", "examples.support:runtime", "--store", f"sqlite:///{tmp_path}/s.db")
    assert result.exit_code == 0, result.output
    assert len(served) == 1


@pytest.mark.parametrize("by_email", [False, True])
def test_serve_maps_slack_users_to_token_principals_by_email(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, by_email: bool
) -> None:
    """`--slack-users-by-email`: a Slack user with the confirmed email alice@corp.example acts
    as `token:alice@corp.example`, the principal `--token SECRET=alice@corp.example` gives her
    on the API and the dashboard; without it, as `slack:<team>:<user>`."""
    import uvicorn

    import signoff as so
    from signoff.channels import slack

    made: list[Any] = []

    class Recorded(slack.SlackChannel):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(slack, "SlackChannel", Recorded)
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: None)
    args = ["--slack-channel", "C0123", "--slack-token", "xoxb-1", "--slack-signing-secret", "s"]
    args += ["--token", "t0k3n=alice@corp.example"]
    store = f"sqlite:///{tmp_path}/s.db"
    result = invoke(
        "serve", "examples.support:runtime", "--store", store, *args,
        *(["--slack-users-by-email"] if by_email else []),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (channel,) = made
    user = {"id": "U1", "is_email_confirmed": True, "profile": {"email": "alice@corp.example"}}
    if not by_email:
        assert channel.identities.identify is None
        return
    found = channel.identities.identify("T1", "U1", user)
    assert found == so.Principal(authenticator="token", principal_id="alice@corp.example")
    assert channel.identities.external == frozenset()


def test_serve_maps_the_slack_users_of_the_external_teams_it_is_given(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`--slack-external-team` (repeatable): the Slack Connect partners whose users
    `--slack-users-by-email` maps too (`SlackChannel(external_teams=...)`)."""
    import uvicorn

    from signoff.channels import slack

    made: list[Any] = []

    class Recorded(slack.SlackChannel):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(slack, "SlackChannel", Recorded)
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: None)
    args = ["--slack-channel", "C0123", "--slack-token", "xoxb-1", "--slack-signing-secret", "s"]
    args += ["--slack-users-by-email", "--slack-external-team", "T0P"]
    args += ["--slack-external-team", "E0Q"]
    result = invoke(
        "serve", "examples.support:runtime", "--store", f"sqlite:///{tmp_path}/s.db", *args
    )
    assert result.exit_code == 0, result.output
    (channel,) = made
    assert channel.identities.external == frozenset({"T0P", "E0Q"})


def test_serve_maps_a_slack_email_to_the_token_principal_in_its_own_case(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`--token "$T=Alice@Corp.example"`: her Slack account (`alice@corp.example`, as Slack
    gives it) acts as that very principal; it was `token:alice@corp.example`, someone else to
    four eyes and a quorum, so she could approve her own call from Slack."""
    import uvicorn

    import signoff as so
    from signoff.channels import slack

    made: list[Any] = []

    class Recorded(slack.SlackChannel):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(slack, "SlackChannel", Recorded)
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: None)
    args = ["--slack-channel", "C0123", "--slack-token", "xoxb-1", "--slack-signing-secret", "s"]
    args += ["--token", "t0k3n=Alice@Corp.example", "--slack-users-by-email"]
    result = invoke(
        "serve", "examples.support:runtime", "--store", f"sqlite:///{tmp_path}/s.db", *args
    )
    assert result.exit_code == 0, result.output
    (channel,) = made
    user = {"id": "U1", "is_email_confirmed": True, "profile": {"email": "alice@corp.example"}}
    found = channel.identities.identify("T1", "U1", user)
    assert found == so.Principal(authenticator="token", principal_id="Alice@Corp.example")


@pytest.mark.parametrize("how", ["option", "env"])
def test_serve_keys_the_dashboards_csrf_tokens_with_its_secret(
    how: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Processes serving one dashboard must share the secret of its CSRF tokens: `--secret`
    (or SIGNOFF_SECRET) gives it to `signoff serve`."""
    import uvicorn

    from signoff.server._pages import csrf_key

    served: list[Any] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: served.append(self.config.app))
    args = ["serve", "examples.support:runtime", "--store", f"sqlite:///{tmp_path}/s.db"]
    if how == "option":
        args += ["--secret", "shared"]
    else:
        monkeypatch.setenv("SIGNOFF_SECRET", "shared")
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert served[0].state.signoff.secret == csrf_key("shared")


@pytest.mark.parametrize("secret", ["", "s\udcff"])  # unset; a byte that is not UTF-8
def test_serve_refuses_an_empty_secret_in_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, secret: str
) -> None:
    """`--secret "$UNSET"` (or one holding a byte that is not UTF-8, which was a
    UnicodeEncodeError traceback) is a misused command line, and the server does not start."""
    import uvicorn

    started: list[Any] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: started.append(self))
    store = f"sqlite:///{tmp_path}/s.db"
    result = invoke("serve", "examples.support:runtime", "--store", store, "--secret", secret)
    assert refused_usage(result).startswith("Invalid value: the server's secret")
    assert started == [] and list(tmp_path.iterdir()) == []


_HOOK = ["--webhook", "http://127.0.0.1:9/hook", "--webhook-secret", "s"]
_SLACK = ["--slack-channel", "C0123", "--slack-token", "xoxb-1", "--slack-signing-secret", "s"]


@pytest.mark.parametrize(
    ("args", "option"),
    [
        ([*_HOOK, "--channel-state", ""], "--channel-state"),
        ([*_SLACK, "--channel-state", ""], "--channel-state"),
        (["--channel-state", ""], "--channel-state"),
        (["--slack-channel", ""], "--slack-channel"),
        ([*_SLACK, "--slack-users-by-email", "--slack-external-team", ""], "--slack-external-team"),
        (["--host", ""], "--host"),
    ],
    ids=["state-webhook", "state-slack", "state-alone", "slack", "external-team", "host"],
)
def test_serve_refuses_an_empty_channel_state_slack_channel_or_host(
    args: list[str], option: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`--channel-state "$STATE"` with the variable unset kept the channels' delivery positions
    in memory (lost on restart), `--slack-channel "$CHANNEL"` served with Slack off though its
    secrets were exported, and `--host "$HOST"` listened on every interface rather than this
    machine's alone: each said nothing, where `--webhook ""` and `--secret ""` are refused."""
    import uvicorn

    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-1")
    monkeypatch.setenv("SLACK_SIGNING_SECRET", "s")
    started: list[Any] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: started.append(self))
    store = f"sqlite:///{tmp_path}/s.db"
    result = invoke("serve", "examples.support:runtime", "--store", store, "--port", "0", *args)
    message = refused_usage(result)
    assert message.startswith(f"Invalid value: {option} is empty"), message
    assert "unset" in message, message
    assert started == [] and list(tmp_path.iterdir()) == []


def test_serve_started_while_postgres_is_down_waits_for_it(tmp_path: Path) -> None:
    """`signoff serve` started before its database waits for it, saying so on stderr (no
    traceback), then serves; SIGTERM while it waits ends it at once, with status 0."""
    import os
    import signal

    from .conftest import PgCluster

    cluster = PgCluster.start()
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    try:
        cluster.halt()
        ports = [_free_port(), _free_port()]
        for i, port in enumerate(ports):
            out = tmp_path / f"serve-{i}.log"
            with out.open("wb") as f:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "signoff", "serve", TARGET, "--port", str(port)]
                    + ["--store", cluster.admin_url],
                    cwd=ROOT,
                    env=env,
                    stdout=f,
                    stderr=subprocess.STDOUT,
                )
            procs.append((proc, out))
        for proc, out in procs:
            deadline = time.monotonic() + 30
            while "waiting for the store" not in out.read_text():
                assert proc.poll() is None, out.read_text()
                assert time.monotonic() < deadline, out.read_text()
                time.sleep(0.05)
        stopped, stopped_out = procs[1]
        stopped.send_signal(signal.SIGTERM)
        assert stopped.wait(timeout=5) == 0, stopped_out.read_text()
        cluster.resume()
        proc, out = procs[0]
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, out.read_text()
            try:
                httpx.get(f"http://127.0.0.1:{ports[0]}/v1/openapi.json", timeout=2)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, out.read_text()
                time.sleep(0.05)
        assert "the store is up" in out.read_text()
        assert "Traceback" not in out.read_text()
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.terminate()
            proc.wait(timeout=10)
        cluster.stop()


@pytest.mark.parametrize("item", ["s3cret-without-a-principal", "s3cret-value=", "tök€n=alice"])
def test_serve_names_no_secret_in_a_token_error(
    item: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A mistyped `--token` is refused by its position: the error (in a terminal's scrollback, a
    service's log) does not repeat the secret, and the server does not start."""
    import uvicorn

    started: list[Any] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: started.append(self))
    store = f"sqlite:///{tmp_path}/s.db"
    args = ["--token", "alice-token=alice", "--token", item]
    result = invoke("serve", "examples.support:runtime", "--store", store, *args)
    assert "#2" in refused_usage(result), result.output
    secret = item.partition("=")[0]
    assert secret not in result.output and "alice-token" not in result.output
    assert started == []


def test_serve_checks_the_schema_its_runtimes_store_names(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runtime whose store names its schema as an argument (`PostgresStore(url, schema=)`):
    the store `serve` opens before it listens is that schema, never the database's default one,
    which it would otherwise create (or, at another version, refuse to serve over)."""

    import uvicorn

    target = tenant_runtime(tmp_path, monkeypatch, "serve_schema_runtime", pg_url)
    started: list[Any] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: started.append(self))
    result = invoke("serve", target, "--port", "0")
    assert result.exit_code == 0, result.output
    assert len(started) == 1
    schemas = pg_schemas(pg_url)
    assert "tenant_a" in schemas and "signoff" not in schemas, schemas


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_serve_keeps_a_runtimes_store_that_must_not_migrate_unmigrated(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """A runtime whose store is made with `migrate=False` refuses a store without this
    signoff's schema rather than write one: `serve`'s look at the store before it listens
    opens it so too, and never creates (or upgrades) the schema the runtime was to spare."""

    import uvicorn

    if kind == "sqlite":
        db = tmp_path / "spared.db"
        made = f"SQLiteStore({f'sqlite:///{db}'!r}, migrate=False)"
        imported = "from signoff.stores import SQLiteStore"
    else:
        pg_url = str(request.getfixturevalue("pg_url"))
        made = f"PostgresStore({pg_url!r}, migrate=False)"
        imported = "from signoff.stores.postgres import PostgresStore"
    target = runtime_module(
        tmp_path, monkeypatch, "serve_unmigrated_runtime", made, imported=imported
    )
    started: list[Any] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: started.append(self))
    result = invoke("serve", target, "--port", "0")
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: SchemaVersionError: "), result.output
    assert "run `signoff db upgrade`" in result.stderr
    assert started == []
    if kind == "sqlite":
        tables: set[str] = set()
        if db.exists():
            conn = sqlite3.connect(db)
            try:
                rows = conn.execute("SELECT name FROM sqlite_master").fetchall()
            finally:
                conn.close()
            tables = {r[0] for r in rows}
        assert tables == set(), tables
    else:
        assert "signoff" not in pg_schemas(pg_url)
