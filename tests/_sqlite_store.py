"""The SQLite store tests' store on a fresh file and the events, requests and sessions they
commit.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.stores import SQLiteStore

__all__ = ["count", "event", "new_session", "store"]


def event(sid: str, seq: int, type: Any = "session.waiting", **data: Any) -> so.Event:
    return so.Event(session_id=sid, seq=seq, type=type, at=float(seq), data=data)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(f"sqlite:///{tmp_path / 'state.db'}")
    await s.open()
    yield s
    await s.close()


async def new_session(store: SQLiteStore, sid: str, agent: str = "a") -> None:
    await store.create_session(sid, agent, [event(sid, 1, "session.created", agent=agent)], None)


async def count(store: SQLiteStore, table: str) -> int:
    row = store.conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()
    return int(row[0])
