"""Who is calling: the principal a request's bearer token or sign-in cookie names, throttled
against guesses, as a part of `ServerContext`."""

from __future__ import annotations

import hmac
import inspect
from typing import TYPE_CHECKING, Any, cast

from starlette.requests import HTTPConnection

from .._exceptions import StoreError
from .._runtime import Runtime
from .._sync import in_thread, is_async
from .._types import Principal
from ._auth import (
    Authenticator,
    DevAuth,
    Naming,
    TokenAuth,
    bearer_token,
    sign_in_cookie,
    token_digest,
)
from ._errors import ApiError
from ._sign_ins import Grant, Honoured, SignOuts, checked
from ._throttle import Failures, client_of, too_many

__all__ = ["Callers"]

_UNKNOWN = object()

TOKEN_REQUIRED = "authenticate with a bearer token (Authorization header)"
TOKEN_REFUSED = "the bearer token sent is not one this server accepts (mistyped, or revoked)"
SCRAPE_TOKEN_ONLY = "the metrics token opens /metrics only: call the API with an API token"
DEV_REFUSED = (
    "dev mode serves only requests from this machine, addressed to localhost, 127.0.0.1 or "
    "[::1] and not sent by a page of another origin; serve others with --token "
    "(create_app(auth=TokenAuth(...)))"
)


def _credentials(request: HTTPConnection) -> int:
    """How many `Authorization` headers the request carries."""
    return len(request.headers.getlist("authorization"))


class Callers:
    """Authenticates requests: a part of `ServerContext`, whose fields these are."""

    __slots__ = ()

    runtime: Runtime
    auth: Authenticator
    secret: bytes
    sign_in_lifetime: float
    keyless: bool
    scrape_digest: bytes | None
    sign_outs: SignOuts
    failures: Failures
    honoured: Honoured
    naming: Naming

    if TYPE_CHECKING:  # `ServerContext.met`

        def met(self, exc: BaseException | None) -> None: ...

    async def principal(self, request: HTTPConnection) -> Principal | None:
        """The caller, or `None` when the authenticator does not recognise it or answers a
        principal naming no one (asked once per request: a page and its CSRF token must agree
        on who is signed in)."""
        known: Any = getattr(request.state, "signoff_principal", _UNKNOWN)
        if known is not _UNKNOWN:
            return cast(Principal | None, known)
        if _credentials(request) > 1:
            # Which one counts is the reader's guess (ours the first, a proxy's maybe the last):
            # no one, and no sign-in cookie beside them either.
            request.state.signoff_principal = None
            return None
        guessed = isinstance(self.auth, TokenAuth) and bearer_token(request) is not None
        if guessed:
            wait = self.failures.retry_after(client_of(request))
            if wait is not None:
                request.state.signoff_principal = None  # an error page asks again: no one
                raise too_many(wait)
        result: Any = await self._authenticate(request)
        if result is not None and not isinstance(result, Principal):
            raise TypeError(f"the authenticator returned {result!r}, not a Principal or None")
        found: Principal | None = result
        if found is None and guessed and not self.scrape_token(bearer_token(request)):
            self.failures.failed(client_of(request))
        if found is not None:  # not a guess when it names no one: the server's own mistake
            found = self.naming(found)
        if found is None:
            grant = await self.sign_in(request)
            found = None if grant is None else self.naming(grant.principal)
        request.state.signoff_principal = found
        return found

    def scrape_token(self, token: str | None) -> bool:
        """Whether `token` is the metrics token, compared in constant time."""
        digest = self.scrape_digest
        if digest is None or token is None:
            return False
        return hmac.compare_digest(token_digest(token), digest)

    async def _authenticate(self, request: HTTPConnection) -> Any:
        """The authenticator's answer: an `async` one (or a built-in one, which does no I/O) on
        the loop, a plain one in a thread, so a slow directory lookup stalls no other request
        or stream; an awaitable it returns is awaited here."""
        auth = self.auth
        if type(auth) in (TokenAuth, DevAuth) or is_async(auth):
            result: Any = auth(request)
        else:
            # Its SystemExit or KeyboardInterrupt is its failure, not the server's end.
            result = await in_thread(auth, request)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def sign_in(self, request: HTTPConnection) -> Grant | None:
        """The dashboard sign-in the request's cookie holds, if it is valid (made by this
        server for a `TokenAuth` token still configured, within its lifetime) and was not
        signed out in any process serving the store."""
        value = sign_in_cookie(request)
        if value is None or not isinstance(self.auth, TokenAuth):
            return None
        if self.keyless:  # a cookie may be a guess: bounded like a bearer token
            wait = self.failures.retry_after(client_of(request))
            if wait is not None and value not in self.honoured:  # refused before it is read
                request.state.signoff_principal = None  # an error page asks again: no one
                raise too_many(wait)
        now = self.runtime.now()
        grant, guess = checked(self.secret, self.auth, value, now, self.sign_in_lifetime)
        if grant is None:
            if guess and self.keyless:
                self.failures.failed(client_of(request))
            return None
        await self.runtime.open()
        if await self.sign_outs.revoked(self.runtime.store, grant, now):
            return None
        if self.keyless:
            self.honoured.add(value)
        request.state.signoff_sign_in = grant
        return grant

    async def sign_in_ended(self, request: HTTPConnection) -> bool:
        """Whether the sign-in that authenticated this request (a stream, which lasts) has
        expired or been signed out since. A store failure reads as not yet: the stream's own
        reads wait for the store, and this is asked again."""
        grant = getattr(request.state, "signoff_sign_in", None)
        if not isinstance(grant, Grant):
            return False
        now = self.runtime.now()
        if grant.issued <= now - self.sign_in_lifetime:
            return True
        try:
            return await self.sign_outs.revoked(self.runtime.store, grant, now)
        except StoreError as exc:
            self.met(exc)
            return False

    async def sign_out(self, grant: Grant) -> None:
        """Revoke a sign-in for every process serving the store."""
        await self.runtime.open()
        await self.sign_outs.revoke(self.runtime.store, grant, self.runtime.now())

    async def require(self, request: HTTPConnection) -> Principal:
        principal = await self.principal(request)
        if principal is None:
            count = _credentials(request)
            if count > 1:
                message = f"send one Authorization header, not {count}"
                raise ApiError(401, "unauthenticated", message)
            # dev mode has no token to ask for: say what it serves instead
            if isinstance(self.auth, DevAuth):
                message = DEV_REFUSED
            # a scraper sent to the wrong path; under `TokenAuth` only, where a guess counts
            # (else telling the scrape token from others here would let it be guessed freely)
            elif isinstance(self.auth, TokenAuth) and self.scrape_token(bearer_token(request)):
                message = SCRAPE_TOKEN_ONLY
            elif bearer_token(request) is not None:  # a token, refused: not "send one"
                message = TOKEN_REFUSED
            else:
                message = TOKEN_REQUIRED
            raise ApiError(401, "unauthenticated", message)
        return principal
