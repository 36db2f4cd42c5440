"""signoff's own options in a PostgreSQL URL (`?schema=…&pool_max=…`), and the URL as error
messages show it."""

from __future__ import annotations

import os
import re
from typing import Any, TypeVar
from urllib.parse import SplitResult, unquote, unquote_plus, urlencode, urlsplit

import psycopg
from psycopg import conninfo as _conninfo
from psycopg import pq

from ..._exceptions import StoreError, UsageError
from ..._settings import seconds, whole

__all__ = [
    "CONNECT_TIMEOUT",
    "SCHEMA_NAME",
    "TCP_DEFAULTS",
    "check_parameters",
    "describe",
    "number",
    "resolved_settings",
    "schema_name",
    "split_options",
    "unparsable",
    "with_schema",
    "with_libpq_defaults",
]

N = TypeVar("N", int, float)

SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,50}")  # fullmatch: "$" takes a trailing newline

_SCHEMA_RULE = (
    "schema name must be lowercase [a-z0-9_], not start with a digit, and be at most 51 "
    "characters long"
)
"""What `SCHEMA_NAME` asks, all of it: a name too long, or starting with a digit, was told only
to be lowercase, which it was."""


def schema_name(argument: str | None, options: dict[str, str]) -> str:
    """The store's schema: the `schema` argument, else the URL's `?schema=`, else "signoff". A
    bad argument is the developer's misuse (`UsageError`); a bad URL value is a `StoreError`,
    an empty one too (an unset variable, say), rather than quietly the default's store."""
    if argument is not None:
        if not isinstance(argument, str) or not SCHEMA_NAME.fullmatch(argument):
            raise UsageError(f"{_SCHEMA_RULE}: {argument!r}")
        return argument
    schema = options.get("schema", "signoff")
    if not schema:
        raise StoreError(
            'URL option schema is empty: name a schema, or leave the option out for "signoff"'
        )
    if not SCHEMA_NAME.fullmatch(schema):
        raise StoreError(f"{_SCHEMA_RULE}: {schema!r}")
    return schema


_OPTIONS = (
    "schema",
    "pool_min",
    "pool_max",
    "pool_timeout",
    "request_pool_timeout",
    "outage_grace",
    "operation_timeout",
)


def _unsplit(parts: SplitResult, query: list[str]) -> str:
    """The URL again with `query`, keeping its `//` when it names no host (`postgresql:///db`,
    `postgresql://?service=name`): `urlunsplit` drops it, and libpq then refuses the URL."""
    tail = f"?{'&'.join(query)}" if query else ""
    tail += f"#{parts.fragment}" if parts.fragment else ""
    return f"{parts.scheme}://{parts.netloc}{parts.path}{tail}"


def split_options(url: str) -> tuple[str, dict[str, str]]:
    """signoff's own query parameters (`?schema=…&pool_max=…`) apart from libpq's, which are
    kept as written (libpq does not read `+` as a space); a URL that cannot be parsed (an
    unclosed `[` of an IPv6 host) is a `StoreError` naming it, not a ValueError, and without the
    URL, which may hold a password; so is one holding a lone surrogate (a byte of a command line
    that is not UTF-8), which libpq cannot be given."""
    try:
        url.encode("utf-8")
    except UnicodeEncodeError:
        raise StoreError("invalid PostgreSQL URL: it is not valid UTF-8 text") from None
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise StoreError(f"invalid PostgreSQL URL: {exc}") from None
    unencoded = _unencoded_credentials(url)
    if unencoded is not None:
        raise StoreError(unencoded)
    if not parts.query:
        return url, {}
    ours: dict[str, str] = {}
    theirs: list[str] = []
    for piece in parts.query.split("&"):
        key, _, value = piece.partition("=")
        if unquote_plus(key) in _OPTIONS:
            if unquote_plus(key) in ours:  # else the last one silently won
                raise StoreError(f"URL option {unquote_plus(key)} is given twice")
            ours[unquote_plus(key)] = unquote_plus(value)
        elif piece:
            theirs.append(piece)
    if not ours:
        return url, {}
    return _unsplit(parts, theirs), ours


_ENCODED = {"@": "%40", "/": "%2F", "?": "%3F", "#": "%23"}


def _unencoded_credentials(url: str) -> str | None:
    """Why the user name or password of `url` cannot be read as written (an "@", "/", "?" or
    "#" in it not percent-encoded), without the URL; None if it can. libpq takes them up to the
    first "@" unless a "/" comes first, and then the rest as the host: a password's "@" made
    the text after it a host name, shown in every error and taken for a server that is down;
    its "/" made the text before it a port and the text after it part of the database name,
    shown as such; its "?" or "#" got signoff's own settings appended inside the password."""
    rest = url.partition("://")[2]
    stop = re.search("[@/]", rest)
    if stop is not None and stop.group() == "@":
        userinfo = rest[: stop.start()]
        hosts = re.split("[/?#]", rest[stop.end() :], maxsplit=1)[0]
        found = next((c for c in "?#" if c in userinfo), "@" if "@" in hosts else None)
    else:  # no user name as libpq reads it: an "@" before the query follows a password's "/"
        found = "/" if "@" in re.split("[?#]", rest, maxsplit=1)[0] else None
    if found is None:
        return None
    return (
        f'invalid PostgreSQL URL: a "{found}" in its user name or password must be written '
        f'{_ENCODED[found]} (percent-encoded, as must "@", "/", "?", "#" and "%" there); the URL '
        "is not shown, as it may hold the password"
    )


def with_schema(url: str, schema: str) -> str:
    """`url` naming `schema` in its `?schema=` (replacing one it names): the URL of a store
    given its schema as an argument, for what opens that store again from its URL alone."""
    dsn, options = split_options(url)
    if options.get("schema", "signoff") == schema:
        return url
    options["schema"] = schema
    parts = urlsplit(dsn)
    query = [*filter(None, parts.query.split("&")), urlencode(options)]
    return _unsplit(parts, query)


def check_parameters(dsn: str) -> None:
    """A `StoreError` for a query parameter libpq does not know (a misspelt option of signoff's,
    `pool_size`) or a port that is no port, when the store is made: either would otherwise fail
    every connection, and look like a database that is down."""
    try:
        params = _conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        if "query parameter" in str(exc):  # it quotes the parameter's name alone
            hint = f"signoff's own options are {', '.join(_OPTIONS)}"
            if "key/value separator" in str(exc):  # `options=-csearch_path=x`
                hint = f'percent-encode an "=" in a value as %3D; {hint}'
            raise StoreError(f"invalid PostgreSQL URL: {exc}".strip() + f" ({hint})") from None
        raise StoreError(unparsable(exc)) from None
    # libpq refuses a port that is no port only when connecting, as if the server were down:
    # `signoff worker` and `serve` would wait for it forever.
    for port in str(params.get("port") or "").split(","):
        if port and not (_DIGITS.fullmatch(port) and 1 <= int(port) <= 65535):
            raise StoreError(
                f"invalid PostgreSQL URL: port {port!r} is not a whole number from 1 to 65535"
            )
    refused = _refused_setting(params)
    if refused is not None:
        raise StoreError(refused)


def unparsable(exc: psycopg.Error) -> str:
    """What libpq says of a URL it cannot parse, up to the first text it quotes: a token that
    is not percent-encoded (`%` or a space in a password), or the whole URL, password and all
    (which may hold a quote itself)."""
    said = " ".join(str(exc).split()).split('"')[0].rstrip(" :")
    said = re.sub(" in$", "", said) or "libpq cannot parse it"
    return (
        f"invalid PostgreSQL URL: {said} (percent-encode a character of the user name or "
        'password that is not a letter, digit, "-", ".", "_" or "~"; the URL is not shown, as '
        "it may hold the password)"
    )


_REFUSAL = re.compile(
    r'^invalid (?:integer value .* for connection option "(?P<option>\w+)"'
    r"|(?P<name>\w+) value\b|(?P<port>port) number\b)"
)
_HOSTS = re.compile(r"^could not match (\d+) port numbers to 1 hosts")


def _refused_setting(params: dict[str, Any]) -> str | None:
    """What libpq says of a setting it refuses (`sslmode=bogus`, `PGPORT=abc`), naming where it
    came from: the URL, the environment or a service file; None if it refuses none. libpq checks
    them only when it starts connecting, and a refusal then read as a database that is down
    (`signoff worker` waited for it forever): a connection is started toward a Unix socket path
    that does not exist, which libpq refuses at once, before any socket, if a setting is bad."""
    hosts = 1
    for _ in range(2):
        probe_hosts = ",".join(["/nonexistent/signoff-probe"] * hosts)
        probing = {**params, "host": probe_hosts, "hostaddr": ""}
        probe = pq.PGconn.connect_start(_conninfo.make_conninfo("", **probing).encode())
        try:
            said = probe.error_message.decode("utf-8", "replace").strip()
            envvars = {o.keyword.decode(): o.envvar for o in probe.info}
        finally:
            probe.finish()
        matched = _HOSTS.match(said)
        if matched is None:
            break
        hosts = int(matched.group(1))  # the URL's ports are for as many hosts as there are
    refused = _REFUSAL.match(said)
    if refused is None:
        return None
    name = refused.group("name") or refused.group("option") or refused.group("port")
    envvar = (envvars.get(name) or b"").decode()
    if name in params:
        return f"invalid PostgreSQL URL: {said} (URL option {name})"
    if envvar and envvar in os.environ:
        return f"invalid PostgreSQL setting: {said} ({envvar} in the environment)"
    return f"invalid PostgreSQL setting: {said} ({name} in the service file)"


CONNECT_TIMEOUT = 5
"""Seconds libpq may take to connect (per host of the URL) unless something else sets it: a
server that accepts the connection and never answers would otherwise hold `open()` for
psycopg's 130 s."""

TCP_DEFAULTS = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 20_000,
}
"""libpq's TCP settings unless something else sets them: a connection quiet for 10 s is probed every
5 s, and one whose probes or data the server's machine has not acknowledged for 20 s
(milliseconds here) is ended (after 3 unanswered probes where `tcp_user_timeout` is missing),
so a connection a NAT or firewall dropped fails in about 20 s, not after the kernel's 15
minutes of retransmissions. A slow query is not cut short: the server's kernel acknowledges
while it runs. The probes also keep a NAT's mapping of an idle pooled connection alive."""

_WHOLE = ("connect_timeout", *TCP_DEFAULTS)


def resolved_settings(dsn: str) -> dict[str, str]:
    """The values of `connect_timeout` and `TCP_DEFAULTS`' parameters libpq connects with for
    `dsn`: the URL's, else the service's (`service=`, else `PGSERVICE`, looked up in
    `PGSERVICEFILE` or `~/.pg_service.conf`, then `pg_service.conf` in `PGSYSCONFDIR`), else
    the environment's (`PGCONNECT_TIMEOUT`). Only libpq knows all of that, and it works it out
    when it starts connecting: a connection is started with an `sslmode` it refuses, so it
    stops right after, before any socket (toward a Unix socket path that does not exist,
    besides)."""
    try:
        params = _conninfo.conninfo_to_dict(dsn)
    except psycopg.Error:
        return {}  # libpq says what is wrong with it when connecting
    params.update(host="/nonexistent/signoff-probe", hostaddr="", sslmode="signoff-probe")
    probe = pq.PGconn.connect_start(_conninfo.make_conninfo("", **params).encode())
    try:
        resolved = {o.keyword.decode(): o.val for o in probe.info if o.val is not None}
    finally:
        probe.finish()
    return {key: resolved[key].decode() for key in _WHOLE if key in resolved}


def with_libpq_defaults(dsn: str, connect_timeout: float | None) -> tuple[str, int]:
    """`dsn` (a libpq URL) with `CONNECT_TIMEOUT` and `TCP_DEFAULTS` added where nothing sets
    them (not the URL, nor its service, nor `PGCONNECT_TIMEOUT`: libpq would let the URL's
    value win over those), and the connect timeout it ends up with; a `connect_timeout` given
    here wins over all of them. The timeout returned is the one waited (`timeout_from_conninfo`:
    1 is 2, 0 is 130). A value of these that is set must be a whole number, as libpq
    would refuse it only when connecting, and then as if the server were down (a `StoreError`;
    a bad `connect_timeout` argument is a `UsageError`)."""
    parts = urlsplit(dsn)
    pieces = [piece for piece in parts.query.split("&") if piece]
    given: dict[str, str] = {}
    for piece in pieces:
        key, _, value = piece.partition("=")
        given[unquote(key)] = unquote(value)
    for key in _WHOLE:
        if key in given and not _DIGITS.fullmatch(given[key]):
            raise StoreError(f"URL option {key}={given[key]!r} must be a whole number, 0 or more")
    elsewhere = {k: v for k, v in resolved_settings(dsn).items() if k not in given}
    for key, value in elsewhere.items():
        if not _DIGITS.fullmatch(value.strip()):
            raise StoreError(
                f"libpq option {key}={value!r} (from the service file or PGCONNECT_TIMEOUT) "
                "must be a whole number, 0 or more"
            )
    if connect_timeout is not None:
        seconds("connect_timeout", connect_timeout)  # an argument: UsageError, as `timeout`'s
        limit = max(1, int(connect_timeout))  # libpq counts whole seconds
        pieces = [p for p in pieces if unquote(p.partition("=")[0]) != "connect_timeout"]
        pieces.append(f"connect_timeout={limit}")
    elif "connect_timeout" in given:
        limit = int(given["connect_timeout"])
    elif "connect_timeout" in elsewhere:
        limit = int(elsewhere["connect_timeout"])
    else:
        limit = CONNECT_TIMEOUT
        pieces.append(f"connect_timeout={limit}")
    for key, default in TCP_DEFAULTS.items():
        if (
            key in given
            or key in elsewhere
            or (key == "tcp_user_timeout" and pq.version() < 120000)
        ):
            continue  # set by the user, or a libpq older than 12, which lacks it
        pieces.append(f"{key}={default}")
    # What libpq and psycopg wait: 2 s at least, and 130 s for 0 (libpq's "no limit").
    waits = _conninfo.timeout_from_conninfo({"connect_timeout": str(limit)})
    return _unsplit(parts, pieces), waits


_DIGITS = re.compile("[0-9]{1,9}")


def number(options: dict[str, str], key: str, kind: type[N], default: N) -> N:
    """URL option `key` as a positive, finite number of `kind` (a whole one for `int`: a pool
    size), or `default` if the URL does not set it; a `StoreError` naming it if it is not."""
    if key not in options:
        return default
    text = options[key]
    try:
        value = kind(text)
    except ValueError:
        if kind is int:  # "2.5" or "many" for a pool size
            whole(f"URL option {key}", text, least=1, shown=repr(text), error=StoreError)
        raise StoreError(f"URL option {key}={text!r} is not a number") from None
    if kind is int:
        return whole(f"URL option {key}", value, least=1, shown=repr(text), error=StoreError)
    # NaN (no comparison is true of it) and inf are refused too
    seconds(f"URL option {key}", value, shown=repr(text), error=StoreError)
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
