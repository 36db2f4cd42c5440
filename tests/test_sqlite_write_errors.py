"""A SQLite write that the `sqlite3` module itself refuses (a value of a type it cannot bind)
is named for what it is, not hidden behind an `AttributeError` from reading an error code
that only SQLite's own errors carry."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import signoff as so

from .test_server_common import ALICE, make_agents


async def test_a_value_sqlite_cannot_bind_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    """`sqlite3.ProgrammingError` has no `sqlite_errorcode`: the check for a write refused for
    want of permission read it, and an `AttributeError` hid the real error."""
    path = tmp_path / "s.db"
    async with so.Runtime(make_agents(), store=f"sqlite:///{path}") as rt:
        sid = (await rt.generate("support", prompt="Refund order 1042", auth=ALICE)).session_id
        owner: object = {"not": "a string"}
        with pytest.raises(so.UsageError) as caught:
            await rt.store.acquire_lease(sid, owner, 30.0, time.time() + 3600)  # type: ignore[arg-type]
    message = str(caught.value)
    assert str(path) in message and "dict" in message, message
    assert not isinstance(caught.value, so.StoreError)
