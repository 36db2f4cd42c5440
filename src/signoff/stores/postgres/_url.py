"""signoff's own options in a PostgreSQL URL (`?schema=…&pool_max=…`), and the URL as error
messages show it."""

from __future__ import annotations

import math
import re
from typing import TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

try:
    import psycopg
    from psycopg import conninfo as _conninfo
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "PostgreSQL support needs the extra: pip install 'signoff[postgres]'"
    ) from exc

from ..._exceptions import StoreError

__all__ = ["SCHEMA_NAME", "describe", "number", "split_options"]

N = TypeVar("N", int, float)

SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,50}$")


_OPTIONS = (
    "schema",
    "pool_min",
    "pool_max",
    "pool_timeout",
    "request_pool_timeout",
    "outage_grace",
)


def split_options(url: str) -> tuple[str, dict[str, str]]:
    """signoff's own query parameters (`?schema=…&pool_max=…`) apart from libpq's; a URL that
    cannot be parsed (an unclosed `[` of an IPv6 host) is a `StoreError` naming it, not a
    ValueError, and without the URL, which may hold a password; so is one holding a lone
    surrogate (a byte of a command line that is not UTF-8), which libpq cannot be given."""
    try:
        url.encode("utf-8")
    except UnicodeEncodeError:
        raise StoreError("invalid PostgreSQL URL: it is not valid UTF-8 text") from None
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise StoreError(f"invalid PostgreSQL URL: {exc}") from None
    if not parts.query:
        return url, {}
    ours: dict[str, str] = {}
    theirs: list[tuple[str, str]] = []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key in _OPTIONS:
            ours[key] = value
        else:
            theirs.append((key, value))
    if not ours:
        return url, {}
    return urlunsplit(parts._replace(query=urlencode(theirs))), ours


def number(options: dict[str, str], key: str, kind: type[N], default: N) -> N:
    if key not in options:
        return default
    try:
        value = kind(options[key])
    except ValueError:
        raise StoreError(f"URL option {key}={options[key]!r} is not a number") from None
    if not 0 < value < math.inf:  # also NaN, which no comparison is true of
        raise StoreError(
            f"URL option {key} must be a positive, finite number, not {options[key]!r}"
        )
    return value


def describe(url: str) -> str:
    """The URL without its password, for error messages and logs; signoff's own options
    (`?schema=…`) are kept, as libpq cannot parse them and a schema names another store."""
    try:
        dsn, ours = split_options(url)
        params = _conninfo.conninfo_to_dict(dsn)
    except (psycopg.Error, StoreError):
        return "<unparsable PostgreSQL URL>"
    host = params.get("host") or params.get("hostaddr") or "localhost"
    port = params.get("port") or "5432"
    user = f"{params['user']}@" if params.get("user") else ""
    db = params.get("dbname") or ""
    query = f"?{urlencode(ours)}" if ours else ""
    return f"postgresql://{user}{host}:{port}/{db}{query}"
