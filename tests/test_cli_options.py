"""`signoff serve` and `signoff worker` options at their edges: a port in use or 0, tokens it
would misread, the sign-in lifetime, webhook backfill, lease TTL and worker counts, an async
runtime factory; the stream bound, body cap and lease TTL from options or the environment."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

import signoff as so
from tests._cli import (
    ROOT,
    TARGET,
    agent,
    invoke,
    refused_usage,
    url,
)

__all__ = ["url"]  # the fixture, used by name


def test_serve_on_a_port_in_use_is_one_line(url: str) -> None:
    """A port another process listens on is one UsageError line naming the address, exit 1,
    before anything starts: not uvicorn's log of a failed startup and its exit status 3."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = invoke("serve", TARGET, "--store", url, "--port", str(port))
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith(f"error: UsageError: cannot listen on 127.0.0.1:{port}: ")
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize(
    ("tokens", "error"),
    [
        (["s3cret-1=alice", "s3cret-1=bob"], "--token gives one secret to two principals"),
        (["s3cret-1"], "--token takes SECRET=PRINCIPAL_ID"),
        # `--token "$(cat tokens.txt)"`: the second line made part of the first id, never valid
        (["s3cret-1=carol\ns3cret-2=dave"], "token #1 of --token holds a line break"),
        (["s3cret-1=carol", "s3cret 2=dave"], "token #2 of --token holds a line break"),
        (["s3cret-1=carol\x1b[2J"], "token #1 of --token holds a line break or control"),
    ],
)
def test_serve_refuses_a_token_it_would_misread_without_printing_it(
    tokens: list[str], error: str, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One secret given to two principals (alice's token would act as bob) is refused rather
    than the last one silently winning, and no refusal prints the secret into a log."""
    import uvicorn

    started: list[object] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: started.append(self))
    args = [a for token in tokens for a in ("--token", token)]
    result = invoke("serve", TARGET, "--store", url, "--port", "0", *args)
    assert refused_usage(result).startswith(f"Invalid value: {error}"), result.output
    assert "s3cret" not in result.output and started == []


def test_serve_keeps_a_base64_secret_s_padding_in_the_secret(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`openssl rand -base64 32` ends in `=`: `--token "$SECRET=alice"` was split at its first
    `=`, so the server took the secret without its padding, for a principal named `=alice`,
    and refused the token as given. The padding stays the secret's; an id may still hold `=`."""
    import uvicorn

    served: list[Any] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: served.append(self.config.app))
    one, two = "c2VjcmV0LTE=", "c2VjcmV0LTIzNA=="  # one and two bytes of padding
    args = ["--token", f"{one}=alice", "--token", f"{two}=bob", "--token", "s3cret=uid=carol"]
    args += ["--token", "s3cret-4=Jane Doe", "--token", "s3cret-5=Ann\u00a0Lee"]  # ids with spaces
    result = invoke("serve", TARGET, "--store", url, "--port", "0", *args)
    assert result.exit_code == 0, result.output
    auth = served[0].state.signoff.auth
    tried = (one, two, "s3cret", one[:-1], two[:-2], "s3cret-4", "s3cret-5")
    found = {t: auth.lookup(t) for t in tried}
    assert {t: p.principal_id for t, p in found.items() if p is not None} == {
        one: "alice",
        two: "bob",
        "s3cret": "uid=carol",
        "s3cret-4": "Jane Doe",
        "s3cret-5": "Ann\u00a0Lee",
    }


def test_serve_sets_the_dashboards_sign_in_lifetime(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--sign-in-lifetime SECONDS` is `create_app(sign_in_lifetime=)`; without it the default
    (12 hours) holds."""
    import uvicorn

    from signoff.server._sign_ins import SIGN_IN_LIFETIME

    served: list[Any] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: served.append(self.config.app))
    for args, lifetime in (([], SIGN_IN_LIFETIME), (["--sign-in-lifetime", "900"], 900.0)):
        result = invoke("serve", TARGET, "--store", url, "--port", "0", *args)
        assert result.exit_code == 0, result.output
        assert served.pop().state.signoff.sign_in_lifetime == lifetime


def test_serve_webhook_backfill_is_the_channels_backfill(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--webhook-backfill` is `WebhookChannel(backfill=True)`; without it the channel starts
    from now."""
    import signoff.server
    from signoff.channels import WebhookChannel

    served: list[list[Any]] = []
    monkeypatch.setattr(signoff.server, "serve", lambda rt, **kw: served.append(kw["channels"]))
    hook = ["--webhook", "http://127.0.0.1:9/hook", "--webhook-secret", "s"]
    for args, backfill in (([], False), (["--webhook-backfill"], True)):
        result = invoke("serve", TARGET, "--store", url, "--port", "0", *hook, *args)
        assert result.exit_code == 0, result.output
        [channel] = served.pop()
        assert isinstance(channel, WebhookChannel) and channel.backfill is backfill


@pytest.mark.parametrize("bad", ["0", "-5", "inf", "nan"])
def test_serve_refuses_a_sign_in_lifetime_that_is_not_positive_and_finite(
    bad: str, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lifetime `create_app` would refuse is one UsageError line naming the option, before the
    server starts (not a traceback from building the app)."""
    import uvicorn

    started: list[object] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: started.append(self))
    result = invoke("serve", TARGET, "--store", url, "--port", "0", "--sign-in-lifetime", bad)
    message = refused_usage(result)
    assert message.startswith("Invalid value: --sign-in-lifetime must be"), result.output
    assert started == []


def test_serve_refuses_a_sign_in_lifetime_that_is_not_a_number(url: str) -> None:
    """A word where the seconds go is refused by the option's own parsing (exit 2)."""
    result = invoke("serve", TARGET, "--store", url, "--sign-in-lifetime", "12h")
    assert result.exit_code == 2, result.output
    assert "--sign-in-lifetime" in result.output


def test_an_async_runtime_factory_is_refused_by_the_commands_without_a_stray_warning(
    tmp_path: Path,
) -> None:
    """`signoff worker` (and chat, pending, serve) load their target with the CLI's own loader,
    which called an async factory and reported the coroutine as the wrong type, leaving it
    unawaited ("coroutine 'make' was never awaited" beside the error)."""
    from signoff.cli import load_runtime

    (tmp_path / "async_worker_factory.py").write_text("async def make():\n    return None\n")
    sys.path.insert(0, str(tmp_path))
    try:
        # filterwarnings = error: a coroutine left unawaited would fail the test at collection.
        with pytest.raises(so.UsageError, match=r"async_worker_factory:make\(\) is a coroutine"):
            load_runtime("async_worker_factory:make")
        import gc

        gc.collect()
    finally:
        sys.path.remove(str(tmp_path))


@pytest.mark.parametrize(
    ("ttl", "bound"), [("0.001", "0.1"), ("0.05", "0.1"), ("86401", "86400"), ("nan", "86400")]
)
def test_worker_refuses_a_lease_ttl_out_of_its_range_with_a_usage_error(
    url: str, tmp_path: Path, ttl: str, bound: str
) -> None:
    """Exit status 2 naming the option and the bound passed, before the store is touched: a TTL
    near one renewal's round trip would lose every lease on a store only a little slow."""
    result = invoke("worker", TARGET, "--store", url, "--lease-ttl", ttl)
    assert result.exit_code == 2, result.output
    assert "--lease-ttl" in result.output and bound in result.output, result.output
    assert not (tmp_path / "state.db").exists()


def test_worker_help_names_the_lease_ttl_range() -> None:
    result = invoke("worker", "--help")
    assert result.exit_code == 0, result.output
    assert "from 0.1 to 86400" in " ".join(result.output.split())


def test_serve_refuses_more_workers_than_a_worker_runs(url: str) -> None:
    result = invoke("serve", TARGET, "--store", url, "--workers", "100001")
    assert result.exit_code == 2, result.output
    assert "--workers" in result.output and "100000" in result.output, result.output


def test_serve_on_port_0_prints_the_port_it_listens_on(url: str) -> None:
    """`--port 0` (any free port) prints the port the system chose once it listens, not
    `http://127.0.0.1:0/_signoff`, which opens nothing."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "signoff", "serve", TARGET, "--port", "0", "--store", url],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        found = re.search(r"dashboard at http://127\.0\.0\.1:(\d+)/_signoff ", banner)
        assert found is not None and found[1] != "0", banner
        reply = httpx.get(f"http://127.0.0.1:{found[1]}/v1/openapi.json", timeout=10)
        assert reply.status_code == 200
    finally:
        proc.terminate()
        proc.communicate(timeout=20)


def served_app(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The apps `signoff serve` builds, each appended as the server would start it."""
    import uvicorn

    served: list[Any] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: served.append(self.config.app))
    return served


def body_refused(app: Any, size: int) -> bool:
    """Whether `app` refuses a request body of `size` bytes as too large (413)."""
    from starlette.testclient import TestClient

    reply = TestClient(app).post("/v1/sessions", content=b"x" * size)  # no lifespan: no store
    return reply.status_code == 413 and reply.json()["error"]["code"] == "payload_too_large"


def test_serve_sets_the_stream_bound_body_cap_and_lease_ttl(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--max-streams`, `--max-body-size` and `--lease-ttl` are `create_app(max_streams=,
    max_body_size=)` and the served runtime's `lease_ttl`; without them the defaults hold."""
    from signoff.server._app import MAX_BODY_SIZE
    from signoff.server._stream_slots import MAX_STREAMS

    served = served_app(monkeypatch)
    result = invoke("serve", TARGET, "--store", url, "--port", "0")
    assert result.exit_code == 0, result.output
    app = served.pop()
    assert app.state.signoff.streams.per_caller == MAX_STREAMS == 100
    assert app.state.signoff.runtime.lease_ttl == 30.0  # the runtime's own
    assert not body_refused(app, 1000) and body_refused(app, MAX_BODY_SIZE + 1)
    options = ["--max-streams", "3", "--max-body-size", "1000", "--lease-ttl", "7.5"]
    result = invoke("serve", TARGET, "--store", url, "--port", "0", *options)
    assert result.exit_code == 0, result.output
    app = served.pop()
    assert app.state.signoff.streams.per_caller == 3
    assert app.state.signoff.runtime.lease_ttl == 7.5
    assert body_refused(app, 1001) and not body_refused(app, 1000)


def test_serve_reads_the_limits_from_the_environment_and_the_options_win(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = served_app(monkeypatch)
    monkeypatch.setenv("SIGNOFF_MAX_STREAMS", "5")
    monkeypatch.setenv("SIGNOFF_MAX_BODY_SIZE", "2000")
    monkeypatch.setenv("SIGNOFF_LEASE_TTL", "12")
    result = invoke("serve", TARGET, "--store", url, "--port", "0")
    assert result.exit_code == 0, result.output
    app = served.pop()
    assert app.state.signoff.streams.per_caller == 5
    assert app.state.signoff.runtime.lease_ttl == 12.0
    assert body_refused(app, 2001) and not body_refused(app, 2000)
    result = invoke("serve", TARGET, "--store", url, "--port", "0", "--max-streams", "9")
    assert result.exit_code == 0, result.output
    assert served.pop().state.signoff.streams.per_caller == 9


@pytest.mark.parametrize(
    ("variable", "option", "value", "range_"),
    [
        ("SIGNOFF_MAX_STREAMS", "--max-streams", "0", "a whole number from 1 to 100000"),
        ("SIGNOFF_MAX_STREAMS", "--max-streams", "-3", "a whole number from 1 to 100000"),
        ("SIGNOFF_MAX_BODY_SIZE", "--max-body-size", "0", "a whole number from 1 to 1073741824"),
        ("SIGNOFF_MAX_BODY_SIZE", "--max-body-size", "4MiB", "a whole number from 1 to"),
        ("SIGNOFF_LEASE_TTL", "--lease-ttl", "0", "a number of seconds from 0.1 to 86400"),
        ("SIGNOFF_LEASE_TTL", "--lease-ttl", "-30", "a number of seconds from 0.1 to 86400"),
        ("SIGNOFF_MAX_CONNECTIONS", "--max-connections", "0", "a whole number from 1 to 1000000"),
        ("SIGNOFF_MAX_CONNECTIONS", "--max-connections", "-1", "a whole number from 1 to"),
        ("SIGNOFF_MAX_CONNECTIONS", "--max-connections", "many", "a whole number from 1 to"),
        ("SIGNOFF_KEEP_ALIVE_TIMEOUT", "--keep-alive-timeout", "0", "a number of seconds from 0.1"),
        ("SIGNOFF_KEEP_ALIVE_TIMEOUT", "--keep-alive-timeout", "-5", "a number of seconds from"),
        ("SIGNOFF_KEEP_ALIVE_TIMEOUT", "--keep-alive-timeout", "nan", "a number of seconds from"),
        ("SIGNOFF_KEEP_ALIVE_TIMEOUT", "--keep-alive-timeout", "5s", "a number of seconds from"),
    ],
)
def test_serve_refuses_a_limit_out_of_range_from_the_environment_as_from_the_option(
    variable: str,
    option: str,
    value: str,
    range_: str,
    url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A value that is not positive, typed or exported, is a usage error (exit status 2) naming
    the option (and the variable it came from) and its range, before anything is opened."""
    served = served_app(monkeypatch)
    said = f"Invalid value for '{option}' (env var: '{variable}'): '{value}' is not {range_}"
    message = refused_usage(invoke("serve", TARGET, "--store", url, option, value))
    assert message.startswith(said), message
    monkeypatch.setenv(variable, value)
    assert refused_usage(invoke("serve", TARGET, "--store", url)) == message
    assert served == [] and list(tmp_path.iterdir()) == []


def test_worker_reads_its_lease_ttl_from_the_environment(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`SIGNOFF_LEASE_TTL` is `--lease-ttl` for `signoff worker` too; the option wins, and an
    exported 0 is refused as a typed one is."""
    leases: list[float] = []

    async def work(self: so.Runtime, **kw: Any) -> None:
        leases.append(self.lease_ttl)

    monkeypatch.setattr(so.Runtime, "work", work)
    monkeypatch.setenv("SIGNOFF_LEASE_TTL", "4.5")
    for args, lease in (([], 4.5), (["--lease-ttl", "60"], 60.0)):
        result = invoke("worker", TARGET, "--store", url, *args)
        assert result.exit_code == 0, result.output
        assert leases.pop() == lease
    monkeypatch.setenv("SIGNOFF_LEASE_TTL", "0")
    message = refused_usage(invoke("worker", TARGET, "--store", url))
    assert "(env var: 'SIGNOFF_LEASE_TTL'): '0' is not a number of seconds from 0.1" in message


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        ("serve", ["SIGNOFF_LEASE_TTL", "SIGNOFF_MAX_STREAMS", "SIGNOFF_MAX_BODY_SIZE"]),
        ("worker", ["SIGNOFF_LEASE_TTL"]),
    ],
)
def test_the_help_shows_the_limits_with_their_range_default_and_variable(
    command: str, shown: list[str]
) -> None:
    from signoff.server._app import MAX_BODY_SIZE
    from signoff.server._stream_slots import MAX_STREAMS

    result = invoke(command, "--help")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.replace("│", " ").split())
    for variable in shown:
        assert f"[env var: {variable}]" in text, (variable, text)
    assert "from 0.1 to 86400" in text and "30 unless it sets one" in text
    if command == "serve":
        assert (
            f"from 1 to 100000; one more is 429 too_many_streams (default: {MAX_STREAMS})" in text
        )
        assert f"payload_too_large (default: {MAX_BODY_SIZE}, 4 MiB)" in text


class Stamped(so.Runtime):
    """A runtime subclass a module builds: the copies `--store` and `--lease-ttl` make keep it,
    overrides and all."""

    async def work(self, *args: Any, **kwargs: Any) -> None:
        worked.append(self)  # a worker's loop that ends at once


worked: list[Stamped] = []


def stamped() -> Stamped:
    """The factory the commands load (`tests.test_cli_options:stamped`); its default store is
    replaced by `--store` before anything opens it."""
    return Stamped([agent])


def test_worker_and_serve_keep_a_runtime_subclass(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`signoff worker --lease-ttl` and `serve --store --lease-ttl` rebuilt a subclass the
    module built as a plain `Runtime`, losing its overrides: the worker ran `Runtime.work`."""

    async def plain_loop(self: so.Runtime, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("the worker ran a plain Runtime's loop, not the subclass's")

    monkeypatch.setattr(so.Runtime, "work", plain_loop)
    worked.clear()
    target = "tests.test_cli_options:stamped"
    result = invoke("worker", target, "--store", url, "--lease-ttl", "5")
    assert result.exit_code == 0, result.output
    (runtime,) = worked
    assert type(runtime) is Stamped and (runtime.lease_ttl, runtime.inline) == (5.0, False)
    assert runtime.store.url == url
    served = served_app(monkeypatch)
    result = invoke("serve", target, "--store", url, "--port", "0", "--lease-ttl", "7.5")
    assert result.exit_code == 0, result.output
    runtime = served.pop().state.signoff.runtime
    assert type(runtime) is Stamped and (runtime.lease_ttl, runtime.inline) == (7.5, True)
    assert runtime.store.url == url
