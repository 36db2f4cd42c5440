"""Checks that the `postgres` extra is installed, so that importing the PostgreSQL store without
it is one `UsageError` naming the install line, whichever of its modules is imported first."""

from __future__ import annotations

from ..._exceptions import UsageError

__all__: list[str] = []

try:
    import psycopg  # noqa: F401
    import psycopg_pool  # noqa: F401
except ImportError as exc:  # also a psycopg that cannot load libpq: its reason is kept
    raise UsageError(
        f"PostgreSQL support needs psycopg and psycopg_pool ({exc}): "
        "pip install 'signoff[postgres]'"
    ) from exc
