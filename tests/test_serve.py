"""`signoff.server.serve` and `load_runtime`: a store given replaces only the runtime's store."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import signoff as so
from signoff.server import create_app, load_runtime, serve
from signoff.server._context import ServerContext
from signoff.server._serve import SWEEP_GRACE

from ._cli import offline_runtime
from .test_server_common import auth, make_runtime, server_processes


def test_load_runtime_keeps_the_runtimes_settings_on_another_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    moved = load_runtime("tests._cli:offline_runtime", url)
    assert moved.store.url == url
    assert moved.inline is False
    assert (moved.lease_ttl, moved.lease_wait, moved.poll_interval) == (7.0, 3.0, 0.3)
    assert moved.clock is time.time


def test_serve_a_runtime_on_the_store_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`serve(runtime, store=URL)` serves the runtime's agents from URL, as `serve("m:rt",
    store=URL)` does, instead of ignoring the store it was given."""
    import uvicorn

    served: list[Any] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: served.append(self.config.app))
    url = f"sqlite:///{tmp_path}/s.db"
    for target in (offline_runtime(), "tests._cli:offline_runtime"):
        serve(target, store=url)
        ctx = served.pop().state.signoff
        assert isinstance(ctx, ServerContext)
        assert ctx.runtime.store.url == url, target
        assert ctx.runtime.inline is False
        assert sorted(ctx.runtime.agents) == ["support"]
    # without one, the runtime given is served as it is
    runtime = offline_runtime()
    serve(runtime)
    assert served.pop().state.signoff.runtime is runtime


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"port": -1}, "port must be a whole number from 0 to 65535, not -1"),
        ({"port": 65_536}, "port must be a whole number from 0 to 65535, not 65536"),
        ({"port": "8000"}, "port must be a whole number from 0 to 65535, not '8000'"),
        ({"port": True}, "port must be a whole number from 0 to 65535, not True"),
        ({"host": None}, "host must be a host name or address, not None"),
        ({"log_level": "loud"}, "log_level must be one of critical, error, warning, info,"),
        ({"max_connections": 0}, "max_connections must be a whole number from 1 to 1000000"),
        ({"max_connections": 2.5}, "max_connections must be a whole number from 1 to"),
        ({"keep_alive_timeout": 0}, "keep_alive_timeout must be a number of seconds, from 0.1"),
        ({"keep_alive_timeout": float("inf")}, "keep_alive_timeout must be a number of seconds"),
        ({"keep_alive_timeout": "5"}, "keep_alive_timeout must be a number of seconds"),
    ],
)
def test_serve_refuses_an_address_or_log_level_before_opening_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: dict[str, Any], message: str
) -> None:
    """uvicorn refused these only once the app was built (a bare KeyError for the log level, a
    failed start for the port); now they are refused first, and nothing is created."""
    import uvicorn

    served: list[Any] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: served.append(self))
    with pytest.raises(so.UsageError, match=f"^{message}"):
        serve("tests._cli:offline_runtime", store=f"sqlite:///{tmp_path}/s.db", **setting)
    assert served == [] and not (tmp_path / "s.db").exists()


def test_serve_waits_for_its_sweeps_turns_as_long_as_its_docs_say(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`serve` owns the signals (a second one forces the stop), so its graceful stop waits for
    the turns its deadline sweep drives, `SWEEP_GRACE` seconds at most, as README says; an app
    of `create_app` alone, under its own server, waits for none."""
    import uvicorn

    served: list[Any] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: served.append(self.config.app))
    serve(offline_runtime())
    assert served[0].state.signoff.background.grace == SWEEP_GRACE == 30
    assert create_app(offline_runtime(), dev=True).state.signoff.background.grace == 0
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert "and so, within 30 s, do those its deadline sweep" in readme


@pytest.mark.parametrize(
    ("host", "shown"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("0.0.0.0", "127.0.0.1"),
        ("", "127.0.0.1"),  # every interface, as "0.0.0.0"
        ("::1", "[::1]"),
        ("localhost", "localhost"),
    ],
)
def test_serve_prints_a_dashboard_url_that_opens(
    host: str, shown: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The URL printed is one a browser opens: it was `http://:8123` for every interface and
    `http://::1:8123` for an IPv6 address, which needs brackets."""
    import uvicorn

    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: None)
    serve(offline_runtime(), host=host, port=8123)
    assert f"dashboard at http://{shown}:8123/_signoff " in capsys.readouterr().out


def test_signoff_serve_runs_a_turn_answered_from_another_process(tmp_path: Path) -> None:
    """`signoff serve` has in-process workers (DESIGN, Execution): a turn whose answer was only
    recorded elsewhere (`respond(resume=False)`, as `signoff approve` without a runtime does) is
    run by the server, not left unfinished until someone else touches the session."""
    store = f"sqlite:///{tmp_path}/state.db"
    with server_processes(store, 1, "alice-token=alice") as (base,):
        with httpx.Client(base_url=base, headers=auth("alice-token"), timeout=10) as c:
            r = c.post("/v1/sessions", json={"agent": "support", "message": "Refund 1042"})
            assert r.status_code == 201, r.text
            sid = r.json()["session_id"]
            (request,) = r.json()["pending"]
            alice = so.Principal(authenticator="token", principal_id="alice")

            async def record() -> None:
                async with make_runtime(store) as rt:
                    answer = so.InputResponse(request_id=request["id"], option_id="approve")
                    await rt.respond(sid, [answer], principal=alice, resume=False)

            asyncio.run(record())
            deadline = time.monotonic() + 20
            turn: dict[str, Any] = {"status": "waiting"}
            while turn["status"] == "waiting" and time.monotonic() < deadline:
                time.sleep(0.1)
                turn = c.get(f"/v1/sessions/{sid}").json()["turn"]
            assert turn["status"] == "completed", turn
            events = c.get(f"/v1/sessions/{sid}/events", params={"follow": "false"}).text
            assert events.count("event: tool.completed") == 1


@pytest.mark.parametrize("workers", [-1, 1.5, True, "2"])
def test_create_app_refuses_a_worker_count_that_is_not_a_whole_number(workers: Any) -> None:
    with pytest.raises(so.UsageError, match="workers"):
        create_app(offline_runtime(), dev=True, workers=workers)
