"""The blocking client's connections: one dropped without `close()` closes them as it is
collected, as its loop's thread is stopped, instead of leaving sockets for the garbage
collector to warn about."""

from __future__ import annotations

import gc
import warnings
from pathlib import Path

from signoff.server import Client

from .test_server_common import served


def test_a_blocking_client_dropped_unclosed_closes_its_connections(tmp_path: Path) -> None:
    with served(f"sqlite:///{tmp_path}/state.db") as base:
        c = Client(base, token="alice-token")
        assert c.pending()[1] == 0  # a pooled keep-alive connection is left open
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            del c
            gc.collect()
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert leaks == []


def test_a_closed_blocking_client_is_not_closed_again_when_collected(tmp_path: Path) -> None:
    with served(f"sqlite:///{tmp_path}/state.db") as base:
        with Client(base, token="alice-token") as c:
            assert c.sessions()[1] == 0
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            del c
            gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []
