"""`GET /metrics`: Prometheus metrics of one server process, with `create_app(metrics=True)`.

Off by default, and then nothing of it runs. On, each HTTP request is counted by its route's
template and timed (`Observed`), and a scrape reads the runtime's own counts and the count of
open requests an admin's queue shows, given a short time: a store that does not answer makes
`signoff_store_up` 0, not a failed scrape.

Who may scrape: an admin (`admin: true`), as the figures span every tenant, as only an admin's
view of the sessions does; or the bearer token given as `metrics_token`, which opens this route
and nothing else, so a scraper need not hold a token that can approve anything.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .._exceptions import UsageError
from ._auth import TokenAuth, bearer_token, token_digest
from ._context import ServerContext, get_context
from ._errors import ApiError
from ._throttle import client_of, too_many
from ._waits import within

if TYPE_CHECKING:
    from .._types import Principal
    from ._exporter import Exporter

__all__ = ["STORE_TIMEOUT", "Observed", "Scraping", "check_token", "exporter_type", "router"]

STORE_TIMEOUT = 2.0
"""Seconds a scrape waits for the store's count of open requests (as `/readyz` waits for its
read): a scrape times out soon (10 s by default in Prometheus)."""

UNROUTED = "unrouted"
"""The route label of a request no route took: an unknown path, a body refused up front, or a
static file of the dashboard (a mount, which sets no route on the scope)."""

log = logging.getLogger("signoff.server")

router = APIRouter(include_in_schema=False)


def exporter_type() -> type[Exporter]:
    """`Exporter`, or a `UsageError` naming the extra to install if `prometheus_client` is
    missing: asked when the app is made, so the server fails at startup, not at a scrape."""
    try:
        from ._exporter import Exporter
    except ImportError as exc:
        if not (exc.name or "").startswith("prometheus_client"):
            raise
        raise UsageError(
            f"metrics need prometheus_client ({exc}): pip install 'signoff[metrics]'"
        ) from exc
    return Exporter


class Scraping:
    """What `/metrics` serves, and to whom: an app's exporter and its scrape token's digest."""

    def __init__(self, ctx: ServerContext, token: str | None) -> None:
        if token is not None:
            check_token(token, ctx.auth)
        self.exporter = exporter_type()(ctx.runtime._counts, ctx.streams)
        if token is not None:
            ctx.scrape_digest = token_digest(token)

    async def check(self, ctx: ServerContext, request: Request) -> None:
        """Let the scrape token or an admin through; 401 or 403 `admin_only` otherwise. A token
        sent that is neither counts as a guess (`failures`): under `TokenAuth` as any wrong
        token does; under an app's own authenticator here, once it named no one (an admin
        behind a proxy forwarding a bearer of its own is served, not throttled)."""
        sent = bearer_token(request)
        # Of two Authorization headers, which one counts is each reader's guess: neither.
        alone = len(request.headers.getlist("authorization")) == 1
        guess = ctx.scrape_digest is not None and sent is not None and alone
        if guess and not isinstance(ctx.auth, TokenAuth):
            caller = await self._named_or_scraper(ctx, request, sent)
            if caller is None:
                return
        else:
            if guess:
                self._held(ctx, request)
                if ctx.scrape_token(sent):
                    return
            caller = await ctx.require(request)  # `TokenAuth` counts a token no one has
        if not ctx.sees_every_request(caller):  # under an app's own access rule, no one does
            raise ApiError(
                403,
                "admin_only",
                "the metrics count every tenant's activity: scrape them with an admin's token "
                "(under the default access rule) or the metrics token",
            )

    async def _named_or_scraper(
        self, ctx: ServerContext, request: Request, sent: str | None
    ) -> Principal | None:
        """None for the scrape token, compared first (the app's authenticator never sees it);
        else the caller the authenticator names. Any other token
        it names no one is a guess, counted, and refused (429 while the address is held)."""
        wait = ctx.failures.retry_after(client_of(request))
        if ctx.scrape_token(sent):  # held, the right token is refused as a wrong one is
            if wait is not None:
                raise too_many(wait)
            return None
        try:
            return await ctx.require(request)
        except ApiError as exc:
            if exc.status != 401:
                raise
            if wait is not None:
                raise too_many(wait) from None
            ctx.failures.failed(client_of(request))
            raise

    @staticmethod
    def _held(ctx: ServerContext, request: Request) -> None:
        """429 while the caller's address is held for its guesses."""
        wait = ctx.failures.retry_after(client_of(request))
        if wait is not None:
            raise too_many(wait)


def check_token(token: object, auth: object) -> None:
    """Refuse a scrape token no request could carry, or one that is also an API token of `auth`
    (it would open more than `/metrics`): a `UsageError` that never shows it. `signoff serve`
    asks too, before it opens the store."""
    if not isinstance(token, str) or not token:
        raise UsageError("metrics_token must be a non-empty string or None")
    if not (token.isascii() and token.isprintable() and token == token.strip()):
        raise UsageError(
            "metrics_token is not printable ASCII without spaces around it, so no "
            "request could carry it (not shown, as it is a secret)"
        )
    if isinstance(auth, TokenAuth) and auth.lookup(token) is not None:
        raise UsageError("metrics_token is also an API token: give the scraper a token of its own")


class Observed:
    """ASGI middleware counting and timing each HTTP request by its route's template (which
    the router sets on the scope), method and status class: one that raised too, timed until
    it did."""

    def __init__(self, app: ASGIApp, exporter: Exporter) -> None:
        self.app = app
        self.exporter = exporter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        status: int | None = None
        seconds: float | None = None

        async def sending(message: Message) -> None:
            nonlocal status, seconds
            if message["type"] == "http.response.start" and status is None:
                status = message["status"]
                seconds = time.perf_counter() - began
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            if seconds is None:  # it raised (the server answers 500): timed until then
                seconds = time.perf_counter() - began
            route = getattr(scope.get("route"), "path_format", None) or UNROUTED
            self.exporter.answered(scope["method"], route, status, seconds)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """The process's metrics, for an admin or the scrape token; Prometheus text, or
    OpenMetrics if asked for."""
    ctx = get_context(request)
    scraping: Scraping = request.app.state.signoff_metrics
    await scraping.check(ctx, request)
    exporter = scraping.exporter
    open_requests: int | None = None
    try:
        open_requests = await within(_counted(ctx), STORE_TIMEOUT)
    except Exception as exc:  # the scrape still answers: `signoff_store_up` says it failed
        ctx.met(exc)  # a `StoreGone` fails `/healthz` from now on, as on `/readyz`
        log.debug("metrics: counting open requests failed", exc_info=exc)
    body, content_type = exporter.render(request.headers.get("accept", ""), open_requests)
    return Response(body, media_type=content_type)


async def _counted(ctx: ServerContext) -> int:
    """The open requests of every session, as an admin's queue counts them."""
    await ctx.runtime.open()
    return await ctx.open_requests_count()
