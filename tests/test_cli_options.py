"""`signoff serve` and `signoff worker` options at their edges: a port in use or 0, tokens it
would misread, the sign-in lifetime, webhook backfill, lease TTL and worker counts, an async
runtime factory."""

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
