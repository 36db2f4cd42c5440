"""`create_app`: the ASGI application (REST under `/v1`, SSE, the dashboard at `/_signoff`)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from importlib.resources import files
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import RedirectResponse, Response
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

from .. import __version__
from .._exceptions import SignoffError, StoreError, UsageError
from .._runtime import Runtime
from .._settings import flag, positive_seconds
from .._sweeping import SweepDrives
from .._sync import is_async
from .._work_waits import Failing
from ._api import router as api_router
from ._auth import (
    DASHBOARD_PREFIX,
    AccessRule,
    Authenticator,
    DevAuth,
    default_access,
    is_dashboard,
)
from ._context import ServerContext
from ._dashboard import SignIn
from ._dashboard import router as dashboard_router
from ._errors import ApiError, add_error_body, error_response, install_error_handlers
from ._head import HeadAsGet
from ._headers import SecurityHeaders, ServerTime
from ._health import router as health_router
from ._limits import BodyLimit, OneFraming
from ._links import add_links
from ._login import router as login_router
from ._login import sign_in_redirect
from ._message_page import dashboard_error, error_page, wants_page
from ._metrics import Observed, Scraping
from ._metrics import router as metrics_router
from ._pages import csrf_key
from ._prompt import PromptStore
from ._session_end import router as session_end_router
from ._sign_ins import SIGN_IN_LIFETIME, lifetime_of
from ._stream_slots import MAX_STREAMS, max_streams_of

__all__ = ["MAX_BODY_SIZE", "MAX_POLL_INTERVAL", "AppChannels", "create_app"]

MAX_BODY_SIZE = 4 * 1024 * 1024
"""The default cap on a request body, in bytes; a larger one is refused (413
`payload_too_large`)."""

log = logging.getLogger("signoff.server")


def _log_failure(task: asyncio.Task[None]) -> None:
    """Log the in-process workers' loop ending with an error, when it does, not at shutdown."""
    if not task.cancelled() and task.exception() is not None:
        log.error("the in-process workers stopped", exc_info=task.exception())


async def _unless_stopped(work: asyncio.Future[Any], stop: asyncio.Event) -> bool:
    """Wait for `work` unless `stop` is set first, which cancels it; whether it ended."""
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:  # cancelled here too (a forced stop): neither is left running
        stopped.cancel()
        if not work.done():
            work.cancel()
            await asyncio.wait([work])
    return not work.cancelled()


def _note_gone(context: ServerContext, task: asyncio.Task[None]) -> None:
    """Mark the server's store gone when the in-process workers stopped for that (`StoreGone`,
    which only a restart mends), so `/healthz` fails and a supervisor restarts the process, as
    `signoff worker` ends then."""
    if not task.cancelled():
        context.met(task.exception())


class AppChannels(Protocol):
    """What `create_app(channels=...)` takes: a `signoff.channels.ChannelHub`."""

    @property
    def routers(self) -> Sequence[Any]: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


MAX_POLL_INTERVAL = 3600.0
"""The longest `poll_interval`, in seconds: a stream polling less often would seem dead, and
one near 1e306 overflowed every stream's `retry:` line (a 500 for each)."""

MAX_HEARTBEAT = 3600.0
"""The longest `heartbeat`, in seconds: a stream quiet longer would seem dead (proxies cut it
sooner), a stream opened with a cookie would go that long without checking its sign-in, and it
is the `Retry-After` of a 429 `too_many_streams`."""

_BEARER = "bearerAuth"
"""The OpenAPI security scheme of the API's routes: an `Authorization: Bearer <token>` header."""


def _add_bearer(doc: dict[str, Any]) -> None:
    """Declare the bearer token the API's routes need, so the interactive docs can send one and
    generated clients know to; health checks, metrics (its own token) and the dashboard's pages
    are not in the document or need none."""
    doc.setdefault("components", {})["securitySchemes"] = {
        _BEARER: {"type": "http", "scheme": "bearer", "description": "An API token."}
    }
    for path, item in doc.get("paths", {}).items():
        if path.startswith("/v1/"):
            for operation in item.values():
                operation["security"] = [{_BEARER: []}]


def _refuse_taken_paths(served: Sequence[Any], router: Any) -> None:
    """Refuse a channel's route whose path and method a route `served` already serves (another
    channel's: two `SlackChannel`s on the default paths; or the app's own): Starlette serves
    only the first, so the second channel's clicks and replies went to the first, which did
    not know them, and was answered 200 with nothing done."""
    for new in getattr(router, "routes", ()):
        path, methods = getattr(new, "path", None), getattr(new, "methods", None)
        if not isinstance(path, str):
            continue
        for old in served:
            regex, taken = getattr(old, "path_regex", None), getattr(old, "methods", None)
            if regex is None or not regex.match(path):
                continue
            if methods is None or taken is None or set(methods) & set(taken):
                raise UsageError(
                    f"a channel's route {'/'.join(sorted(methods or ['*']))} {path} is served "
                    f"already ({getattr(old, 'path', path)}): give each channel its own paths "
                    "(SlackChannel's path= and events_path=; a Slack app has one of each, so "
                    "each SlackChannel is its own Slack app)"
                )


class WholeFiles(StaticFiles):
    """The dashboard's script and style, each sent whole: a `Range` is ignored (RFC 9110 lets a
    server), as Starlette answered a malformed or unsatisfiable one with a bare text 400 or 416,
    no error code, and the files are a few KB."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kept = [(k, v) for k, v in scope["headers"] if k.lower() not in (b"range", b"if-range")]
        await super().__call__({**scope, "headers": kept}, receive, send)


def create_app(
    runtime: Runtime,
    *,
    auth: Authenticator | None = None,
    dev: bool = False,
    access: AccessRule = default_access,
    poll_interval: float = 0.25,
    heartbeat: float = 15.0,
    close_runtime: bool = False,
    channels: AppChannels | None = None,
    sweep_every: float | None = 5.0,
    max_body_size: int = MAX_BODY_SIZE,
    secret: str | bytes | None = None,
    workers: int = 0,
    sign_in_lifetime: float = SIGN_IN_LIFETIME,
    max_streams: int = MAX_STREAMS,
    metrics: bool = False,
    metrics_token: str | None = None,
) -> FastAPI:
    """Build the app serving `runtime`.

    Pass an authenticator (e.g. `TokenAuth({...})`), or `dev=True` for the localhost-only dev
    principal; one of them is required. `access` decides who may see which session. A plain
    authenticator and the access rule are called in a thread, so one that blocks stalls no other
    request. Streams
    poll the store every `poll_interval` seconds (an hour at most) and send a comment after
    `heartbeat` idle ones (an hour at most too).
    `channels` (a `ChannelHub`) follows the queue while the app runs; its routes (e.g. Slack's
    interactivity endpoint) are mounted on the app. Every `sweep_every` seconds the app applies
    passed request deadlines (`Runtime.expire_due`), and goes on with the turns they make
    runnable in the background; None turns that off (workers do it too). As the app shuts
    down those turns are cut short, their leases given back for the next process (`serve`
    waits up to 30 s for them first).
    A request body over `max_body_size` bytes is refused with 413 `payload_too_large`.
    `secret` keys the dashboard's CSRF tokens, which are bound to the sign-in's credential, and
    its sign-in cookies; set one (the same in every process), above all when the
    authenticator's sign-ins carry no credential. A dashboard sign-in lasts `sign_in_lifetime`
    seconds (12 hours by default) unless signed out first. One caller may hold `max_streams`
    event streams open at once (the sessions' and the dashboard's); one more is 429
    `too_many_streams`.
    `workers` runs that many turns at a time in this process for any session with work
    (`Runtime.work`): one answered from elsewhere (`signoff approve` without a runtime) or left
    running by a process that died. Workers apply passed deadlines too, every `sweep_every`
    seconds (5 if None), in place of the app's own sweep.
    `metrics=True` serves Prometheus metrics at `/metrics` to admins, and to a bearer
    `metrics_token` that opens that route alone (`pip install 'signoff[metrics]'`; a
    `UsageError` here without it).
    """
    flag("dev", dev)  # "false" from an environment variable was taken for its truth
    flag("close_runtime", close_runtime)
    if auth is None:
        if not dev:
            raise UsageError("create_app() needs auth=... (e.g. TokenAuth) or dev=True")
        auth = DevAuth()
    elif dev:
        raise UsageError("pass either auth=... or dev=True, not both")
    elif not callable(auth):  # else every request was a 500 (`auth=...` copied as it is, say)
        raise UsageError(f"auth must be an authenticator (e.g. TokenAuth), not {auth!r}")
    elif isinstance(auth, type):  # called, it made one of itself out of each request: a 400/500
        raise UsageError(
            f"auth is the class {auth.__name__}, not an authenticator: pass an instance "
            f"({auth.__name__}(...))"
        )
    if isinstance(access, type):  # an instance of it, asked as a bool, let every caller see all
        raise UsageError(
            f"access is the class {access.__name__}, not a rule: pass a function (caller, "
            f"initiator) -> bool, or an instance ({access.__name__}(...)) whose __call__ is one"
        )
    if not callable(access):
        raise UsageError(f"access must be a function (caller, initiator) -> bool, not {access!r}")
    if is_async(access):  # its coroutine, never awaited, was taken for True: every session seen
        raise UsageError(
            f"access must be a plain function (caller, initiator) -> bool, not {access!r}, an "
            "async one: the server asks it without awaiting (make it a plain def)"
        )
    if not isinstance(runtime, Runtime):
        raise UsageError(f"create_app() serves a signoff Runtime, not {runtime!r}")
    if channels is not None and not (
        hasattr(channels, "routers")
        and all(callable(getattr(channels, name, None)) for name in ("start", "stop"))
    ):  # else an AttributeError here, or at the app's start
        raise UsageError(f"channels must be a ChannelHub, not {channels!r}")
    if not (positive_seconds(poll_interval) and positive_seconds(heartbeat)):  # also NaN
        raise UsageError("poll_interval and heartbeat must be positive seconds")
    if poll_interval > MAX_POLL_INTERVAL:  # a stream's `retry:` line is it in milliseconds
        raise UsageError(
            f"poll_interval must be at most {MAX_POLL_INTERVAL:g} seconds, not {poll_interval!r}"
        )
    if heartbeat > MAX_HEARTBEAT:
        raise UsageError(f"heartbeat must be at most {MAX_HEARTBEAT:g} seconds, not {heartbeat!r}")
    if sweep_every is not None and not positive_seconds(sweep_every):
        raise UsageError(f"sweep_every must be positive seconds or None, not {sweep_every!r}")
    if isinstance(max_body_size, bool) or not isinstance(max_body_size, int) or max_body_size < 1:
        raise UsageError(f"max_body_size must be a positive number of bytes, not {max_body_size!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise UsageError(f"workers must be a whole number from 0, not {workers!r}")
    sign_in_lifetime = lifetime_of(sign_in_lifetime)
    max_streams = max_streams_of(max_streams)
    flag("metrics", metrics)
    if metrics_token is not None and not metrics:
        raise UsageError("metrics_token is given but metrics is off (metrics=True)")
    if metrics is True and metrics_token is None and access is not default_access:
        # No caller's view is every tenant's under an app's own rule: nobody could scrape.
        raise UsageError(
            "metrics under an app's own access rule need a metrics_token: admins scrape them "
            "only under the default rule"
        )

    async def _sweep(every: float, stop: asyncio.Event, grace: float) -> None:
        # The turns its deadlines make runnable run in the background, not inside the sweep:
        # a slow one would hold up every deadline passing after it until it ended. Once `stop`
        # is set it sweeps and starts no more drives, and waits up to `grace` seconds for those
        # running; then (or cancelled: a forced stop) it cuts them short.
        drives = SweepDrives(runtime, stopping=stop.is_set)
        # The store down (an outage, no bug): said once, and once more when it works again.
        failing = Failing("applying request deadlines", log)
        try:
            with drives.handing():
                while not stop.is_set():
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(every):
                            await stop.wait()
                    if stop.is_set():
                        break
                    sweeping = asyncio.ensure_future(runtime.expire_due())
                    if not await _unless_stopped(sweeping, stop):
                        break  # cut short by the stop: the next process sweeps it again
                    error = sweeping.exception()
                    if isinstance(error, StoreError):  # retried at the next tick
                        failing.failed(error, every)
                    elif error is not None:
                        log.error("applying request deadlines failed", exc_info=error)
                    else:
                        failing.worked()
            await drives.settle(grace)
        finally:
            await drives.aclose()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await runtime.open()
        if channels is not None:
            await channels.start()
        background = context.background
        stop = background.stop_event()
        if workers and runtime.agents:  # a runtime of no agents has no turns to work on
            every = 5.0 if sweep_every is None else sweep_every
            working = background.start(
                runtime.work(concurrency=workers, stop=stop, sweep_every=every)
            )
            working.add_done_callback(_log_failure)
            working.add_done_callback(functools.partial(_note_gone, app.state.signoff))
            sweeper = None
        else:
            working = None
            sweeper = None
            if sweep_every is not None:
                sweeper = background.start(_sweep(sweep_every, stop, background.grace))
        try:
            yield
        finally:
            # Turns in flight finish or park (the workers', and the sweep's for up to its
            # grace), their leases released, and none is claimed or swept from now on.
            stop.set()
            # Not `await`ed: a forced stop cancels them (`Background.cut_short`), their turns cut
            # short and their leases given back, and this goes on at once.
            if sweeper is not None:
                if not background.grace:  # not under `serve`: its turns cut short, as before
                    sweeper.cancel()
                await asyncio.wait([sweeper])
            if working is not None:
                await asyncio.wait([working])  # its failure is logged (`_log_failure`)
            if channels is not None:
                await channels.stop()
            if close_runtime:
                await runtime.close()

    app = FastAPI(
        title="signoff",
        version=__version__,
        description="Agents that stop for people: sessions, approvals, questions and their "
        'live event stream. Errors are `{"error": {"code", "message"}}` with a stable '
        "code.",
        lifespan=lifespan,
        openapi_url="/v1/openapi.json",
        docs_url="/v1/docs",
        redoc_url=None,
        # Starlette would answer `/v1/requests/` with a 307 to an absolute URL built from the
        # Host header (plain http:// behind a proxy terminating TLS): it is an unknown path.
        redirect_slashes=False,
    )
    context = ServerContext(
        runtime=runtime,
        auth=auth,
        access=access,
        secret=csrf_key(secret),
        keyless=secret is None,
        poll_interval=poll_interval,
        heartbeat=heartbeat,
        sign_in_lifetime=sign_in_lifetime,
        max_streams=max_streams,
    )
    app.add_middleware(PromptStore)
    app.add_middleware(BodyLimit, max_bytes=max_body_size)
    app.add_middleware(OneFraming)
    app.add_middleware(SecurityHeaders)
    app.add_middleware(ServerTime, now=runtime.now)
    if metrics:  # inside `HeadAsGet`, whose copy of a HEAD's scope gets the route it runs
        app.state.signoff_metrics = Scraping(context, metrics_token)
        app.add_middleware(Observed, exporter=app.state.signoff_metrics.exporter)
    app.add_middleware(HeadAsGet)  # outermost: HEAD gets every header GET would
    app.state.signoff = context
    install_error_handlers(app)

    async def on_sign_in(request: Request, exc: Exception) -> Response:
        return await sign_in_redirect(request)

    async def on_api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        if is_dashboard(request.url.path):
            response = await dashboard_error(request, exc.status, exc.code, exc.message)
        else:
            response = error_response(exc.status, exc.code, exc.message, **exc.extra)
        response.headers.update(exc.headers)
        return response

    def as_page(handler: Any) -> Any:
        """`handler`'s JSON error, shown as a page to a browser on a dashboard address."""

        async def handle(request: Request, exc: Exception) -> Response:
            response: Response = await handler(request, exc)
            if not (is_dashboard(request.url.path) and wants_page(request)):
                return response
            error = json.loads(bytes(response.body))["error"]
            page = await error_page(request, response.status_code, error["code"], error["message"])
            for name in ("retry-after", "allow"):
                if name in response.headers:
                    page.headers[name] = response.headers[name]
            return page

        return handle

    app.add_exception_handler(SignIn, on_sign_in)
    app.add_exception_handler(ApiError, on_api_error)
    for kind in (SignoffError, StarletteHTTPException):
        app.add_exception_handler(kind, as_page(app.exception_handlers[kind]))
    own_routers = [api_router, dashboard_router, session_end_router, login_router, health_router]
    own_routers += [metrics_router] if metrics else []
    for own in own_routers:
        app.include_router(own)
    served = [route for r in own_routers for route in r.routes]
    for channel_router in () if channels is None else channels.routers:
        _refuse_taken_paths(served, channel_router)
        served.extend(channel_router.routes)
        app.include_router(channel_router)
    static = files("signoff.server").joinpath("static")
    app.mount(
        f"{DASHBOARD_PREFIX}/static", WholeFiles(directory=str(static)), name="signoff-static"
    )

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            doc = add_error_body(doc)
            # The agents are this server's: name them, so clients and fuzzers know them.
            body = doc.get("components", {}).get("schemas", {}).get("CreateSession")
            if body is not None:
                body["properties"]["agent"]["enum"] = sorted(runtime.agents)
            add_links(doc)
            if not dev:
                _add_bearer(doc)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse(f"{DASHBOARD_PREFIX}/")

    return app
