"""Stores: the `Store` protocol and its backends (`sqlite` built in, `postgres` as an extra)."""

from __future__ import annotations

import os
import re

from ._base import (
    READ_BYTES,
    Commit,
    FaultHook,
    Loaded,
    PendingFilter,
    Resolve,
    SessionSummary,
    Store,
    StoredRequest,
)
from ._initiators import InitiatorFilter
from ._prompt import promptly
from .sqlite import SQLiteStore

__all__ = [
    "Commit",
    "FaultHook",
    "InitiatorFilter",
    "Loaded",
    "PendingFilter",
    "READ_BYTES",
    "Resolve",
    "SQLiteStore",
    "SessionSummary",
    "Store",
    "StoredRequest",
    "open_store",
    "promptly",
]

DEFAULT_URL = "sqlite:///.signoff/state.db"


def open_store(store: str | Store | None) -> Store:
    """A store from a URL (`sqlite:///…`, `postgresql://…`) or an instance, unchanged."""
    from .._exceptions import UsageError

    if store is None:
        return SQLiteStore(DEFAULT_URL)
    if not isinstance(store, str):
        if isinstance(store, type):  # its `open` is a function of an instance: a TypeError
            raise UsageError(
                f"store must be a URL (sqlite:///path, postgresql://…) or a Store, not the class "
                f"{store.__name__}: make one ({store.__name__}(url))"
            )
        # A Path (whose `open` is a file's) or a number failed only when first used.
        if isinstance(store, (os.PathLike, bytes)) or not callable(getattr(store, "open", None)):
            raise UsageError(
                f"store must be a URL (sqlite:///path, postgresql://…) or a Store, not {store!r}"
            )
        return store
    if store.startswith("sqlite://"):
        return SQLiteStore(store)
    if store.startswith(("postgresql://", "postgres://")):
        # without the extra, a UsageError naming `pip install 'signoff[postgres]'`
        from .postgres import PostgresStore  # type: ignore[import-not-found,unused-ignore]

        return PostgresStore(store)  # type: ignore[no-any-return,unused-ignore]
    raise UsageError(
        f"unknown store URL {_without_password(store)!r}: use sqlite:///path or postgresql://…"
    )


def _without_password(url: str) -> str:
    """`url` with any password (`user:PASSWORD@`, `password=…`) masked: the URL of a store this
    signoff does not know, e.g. a SQLAlchemy `postgresql+psycopg://`, is still named in errors."""
    url = re.sub(r"(//[^/?#@:]*):[^/?@]*@", r"\1:***@", url)
    # libpq reads a parameter's value up to the next "&": a "#" in it starts no fragment.
    return re.sub(r"(?i)(password=)[^&]*", r"\1***", url)
