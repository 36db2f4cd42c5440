"""The embedded default store (`sqlite:///…`): one SQLite file in WAL mode."""

from __future__ import annotations

from ._schema import PAGE_SIZE, STORE_SCHEMA, WAL_CHECKPOINT_PAGES
from ._store import TURN_NAMED_EVERY, SQLiteStore
from ._transactions import waiting_for_lock

__all__ = [
    "PAGE_SIZE",
    "SQLiteStore",
    "STORE_SCHEMA",
    "TURN_NAMED_EVERY",
    "WAL_CHECKPOINT_PAGES",
    "waiting_for_lock",
]
