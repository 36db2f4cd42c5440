"""Who is calling: pluggable authenticators, and the rule for who may see a session.

An authenticator turns a request into a `Principal` (or `None`: not authenticated). Built in:
`TokenAuth` (bearer API tokens; the server also honours the dashboard's sign-in cookie, made
from one of them, see `_sign_ins`) and `DevAuth` (localhost only, everyone is one dev principal).

Visibility rule (`default_access`): a caller may see a session when the caller is its
initiator, or both carry the same `tenant` attribute, or the caller has `admin: true`.
Sessions started without a principal (from Python, by the application itself) belong to no
tenant: only callers without a `tenant` attribute, or admins, see them.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol, runtime_checkable
from urllib.parse import urlsplit

from starlette.requests import HTTPConnection

from .._answers import blank_identity, principal_too_large
from .._exceptions import UsageError
from .._types import Principal
from ..stores import InitiatorFilter

__all__ = [
    "DASHBOARD_PREFIX",
    "HOST_TOKEN_COOKIE",
    "TOKEN_COOKIE",
    "AccessRule",
    "Authenticator",
    "DevAuth",
    "Naming",
    "TokenAuth",
    "default_access",
    "default_filter",
    "may_see",
    "token_digest",
]

TOKEN_COOKIE = "signoff_token"
HOST_TOKEN_COOKIE = "__Host-signoff_token"
"""The sign-in cookie over https: a browser takes a `__Host-` cookie only from this very host
(`Secure`, `Path=/`, no `Domain`), so a page of a sibling domain cannot plant one."""
DASHBOARD_PREFIX = "/_signoff"
_log = logging.getLogger("signoff.server")
_told: set[int] = set()  # the access rules whose awaitable answer was logged (`may_see`)

AccessRule = Callable[[Principal, Principal | None], bool]
"""`(caller, session_initiator) -> bool`: may the caller see the session? A plain function:
the server asks it without awaiting, in a thread (`create_app` refuses an async one)."""


def may_see(access: AccessRule, caller: Principal, initiator: Principal | None) -> bool:
    """The access rule's answer: True only for True. Anything else that is not False shows the
    session to no one and is logged once a rule: an awaitable (a plain function that returns
    one, `lambda c, i: rule(c, i)` of an async `rule`, which the server does not await) or a
    value such as "no", whose truth showed every session to every caller."""
    seen: object = access(caller, initiator)
    if isinstance(seen, bool):
        return seen
    if inspect.iscoroutine(seen):
        seen.close()  # never awaited, and never warned of
    if id(access) not in _told:  # once a rule: a listing asks it of every session
        _told.add(id(access))
        _log.error(
            "the access rule returned %s, not True or False: no session it is asked about "
            "is shown (make the rule a plain function returning a bool)",
            _shown(seen),
        )
    return False


class Naming:
    """Checks that the principals an authenticator answers name someone, logging each problem
    once (not once a request: one authenticator's mistake fails every request alike)."""

    def __init__(self, auth: object) -> None:
        self.auth = auth
        self.told: set[str] = set()

    def __call__(self, principal: Principal) -> Principal | None:
        """`principal`, or None when it names no one (a blank `authenticator` or
        `principal_id`, as an authenticator reading a missing header as "" answers: every such
        caller would be one person) or is too large to record."""
        problem = blank_identity(principal)
        kind = problem or "too large"
        if problem is None:
            problem = principal_too_large(principal)
        if problem is None:
            return principal
        if kind not in self.told:
            self.told.add(kind)
            _log.error(
                "the authenticator %s answered a principal that %s %s; the requests it answers "
                "so are served as unauthenticated (401): fix the authenticator",
                _name_of(self.auth),
                "is" if kind == "too large" else "names no one:",
                problem,
            )
        return None


def _name_of(auth: object) -> str:
    """How the log names an authenticator: its function's or its class's name."""
    name = getattr(auth, "__name__", None)
    return name if isinstance(name, str) else type(auth).__qualname__


def _shown(value: object) -> str:
    """`value` for the log: its repr, cut short (a rule may return anything, a whole record)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


@runtime_checkable
class Authenticator(Protocol):
    """Turns a request into the principal making it, or `None` when it is not authenticated.
    A plain one is called in a thread (it may block), an async one awaited on the loop."""

    def __call__(
        self, request: HTTPConnection
    ) -> Principal | None | Awaitable[Principal | None]: ...


class TokenAuth:
    """Bearer API tokens from configuration, each mapped to a principal.

    The token is read from `Authorization: Bearer <token>`. The dashboard's sign-in form trades
    a token for a signed, expiring sign-in cookie (never the token itself), which the server
    honours for this authenticator's tokens, only for reads and for the dashboard, whose forms
    carry a CSRF token (`sign_in_cookie`).
    """

    def __init__(self, tokens: Mapping[str, Principal]) -> None:
        # Errors name a token by its position: they end up in logs, and a token is a secret.
        for number, (token, principal) in enumerate(tokens.items(), 1):
            if not isinstance(token, str) or not token:
                raise UsageError("API tokens must be non-empty strings")
            if not _carried(token):
                raise UsageError(
                    f"API token #{number} is not printable ASCII without spaces around it, "
                    "so no request could carry it"
                )
            if not isinstance(principal, Principal):
                raise UsageError(f"API token #{number}: {principal!r} is not a Principal")
            problem = blank_identity(principal)
            if problem is not None:
                raise UsageError(f"API token #{number}'s principal names no one: {problem}")
            problem = principal_too_large(principal)
            if problem is not None:
                raise UsageError(f"API token #{number}'s principal is {problem}")
        self.tokens = dict(tokens)

    def __call__(self, request: HTTPConnection) -> Principal | None:
        token = bearer_token(request)
        if token is None:
            return None
        return self.lookup(token)

    def lookup(self, token: str) -> Principal | None:
        """The principal of `token`, compared in constant time: digests are compared, so the
        time taken does not tell how long a configured token is either."""
        sent = token_digest(token)
        found = None
        for known, principal in self.tokens.items():
            if hmac.compare_digest(token_digest(known), sent):
                found = principal
        return found


def token_digest(token: str) -> bytes:
    """A token's SHA-256, which is what is compared (and kept, for the metrics token)."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def _carried(token: str) -> bool:
    """Whether an `Authorization` header and the sign-in's cookie can carry `token` as is."""
    return token.isascii() and token.isprintable() and token == token.strip()


class DevAuth:
    """Development mode: requests from the loopback interface only, all as one dev principal.

    The request must also name this machine in its `Host` header (`localhost`, `127.0.0.1`,
    `[::1]`, ...): otherwise a web page on another site could reach the server through DNS
    rebinding, from a browser on this machine, and act as the dev principal. A browser's
    request that names another origin in its `Origin` header is refused too: a page of another
    site (or another port) may POST here without a preflight, e.g. a bodiless cancel.
    """

    def __init__(self, principal: Principal | None = None) -> None:
        problem = None if principal is None else blank_identity(principal)
        if problem is not None:
            raise UsageError(f"DevAuth's principal names no one: {problem}")
        self.principal = principal or Principal(
            authenticator="dev",
            principal_id="dev",
            attributes={"name": "Developer", "admin": True},
        )

    def __call__(self, request: HTTPConnection) -> Principal | None:
        client = request.client
        if client is None or not is_loopback(client.host):
            return None
        host = request.headers.get("host", "localhost")
        if not is_loopback(host_name(host)):
            return None
        origin = request.headers.get("origin")
        if origin is not None and _netloc(origin) != host.strip().lower():
            return None  # sent by a page of another origin
        return self.principal


def _netloc(origin: str) -> str | None:
    """The `host[:port]` an `Origin` header names, or None when it names none (`null`)."""
    try:
        return urlsplit(origin.strip()).netloc.lower() or None
    except ValueError:  # e.g. an unclosed IPv6 bracket
        return None


def token_cookie(request: HTTPConnection) -> str:
    """The name of the sign-in cookie for this request: the `__Host-` one over https."""
    return HOST_TOKEN_COOKIE if request.url.scheme == "https" else TOKEN_COOKIE


def sign_in_cookie(request: HTTPConnection) -> str | None:
    """The sign-in cookie's value, where it may stand for the caller: not beside a bearer token,
    and only for reads and the dashboard's own paths. Over https only the `__Host-` cookie."""
    if bearer_token(request) is not None or not _cookie_allowed(request):
        return None
    return request.cookies.get(token_cookie(request)) or None


def _cookie_allowed(request: HTTPConnection) -> bool:
    """Reads, and the dashboard's own paths (not e.g. `/_signoffs`, which is not the dashboard)."""
    method = request.scope.get("method", "GET")
    return method in ("GET", "HEAD") or is_dashboard(request.url.path)


def is_dashboard(path: str) -> bool:
    """Whether `path` is the dashboard's: its prefix itself or below it."""
    return path == DASHBOARD_PREFIX or path.startswith(DASHBOARD_PREFIX + "/")


def bearer_token(request: HTTPConnection) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def host_name(host: str) -> str:
    """The name in a `Host` header, without its port or IPv6 brackets."""
    host = host.strip()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def is_loopback(host: str) -> bool:
    name = host.lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):  # RFC 6761: always loopback
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def default_access(caller: Principal, initiator: Principal | None) -> bool:
    """The documented visibility rule: initiator, same tenant, or admin."""
    if caller.attributes.get("admin") is True:
        return True
    tenant = caller.attributes.get("tenant")
    if initiator is None:
        return tenant is None
    if caller.same_as(initiator):
        return True
    return tenant is not None and tenant == initiator.attributes.get("tenant")


def default_filter(caller: Principal) -> InitiatorFilter | None:
    """The sessions `default_access` shows a caller who is not an admin, as a store filter: its
    own, its tenant's, or with no tenant those started without a principal. None when the store
    cannot tell them (a tenant that is not text, which Python's `==` compares)."""
    tenant = caller.attributes.get("tenant")
    if tenant is not None and not isinstance(tenant, str):
        return None
    return InitiatorFilter(principal=caller, tenant=tenant, anonymous=tenant is None)
