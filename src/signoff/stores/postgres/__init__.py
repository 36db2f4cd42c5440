"""The PostgreSQL store (`postgresql://…`, `pip install 'signoff[postgres]'`)."""

from __future__ import annotations

from ._schema import MIGRATIONS, STORE_SCHEMA
from ._store import PostgresStore

__all__ = ["MIGRATIONS", "PostgresStore", "STORE_SCHEMA"]
