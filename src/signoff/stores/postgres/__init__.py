"""The PostgreSQL store (`postgresql://…`, `pip install 'signoff[postgres]'`)."""

from __future__ import annotations

from . import _extra  # noqa: F401  (first: a UsageError naming the extra when it is missing)

# isort: split
from ._schema import MIGRATIONS, STORE_SCHEMA
from ._store import PostgresStore

__all__ = ["MIGRATIONS", "PostgresStore", "STORE_SCHEMA"]
