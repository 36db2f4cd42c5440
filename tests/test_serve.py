"""`signoff.server.serve` and `load_runtime`: a store given replaces only the runtime's store."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from signoff.server import load_runtime, serve
from signoff.server._context import ServerContext

from .test_cli import offline_runtime


def test_load_runtime_keeps_the_runtimes_settings_on_another_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    moved = load_runtime("tests.test_cli:offline_runtime", url)
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
    for target in (offline_runtime(), "tests.test_cli:offline_runtime"):
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
