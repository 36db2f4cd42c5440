"""`serve`: load `module:runtime`, build the app and run it under uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import logging
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._exceptions import SignoffError, UsageError
from .._logs import LOG_LEVELS, log_to_stderr
from .._runtime import Runtime
from .._settings import seconds, whole
from ._app import MAX_BODY_SIZE
from ._auth import Authenticator, is_loopback
from ._sign_ins import SIGN_IN_LIFETIME
from ._stream_slots import MAX_STREAMS

if TYPE_CHECKING:
    from ..channels import Channel

__all__ = ["DEFAULT_STORE", "UNACKED_HEARTBEATS", "drop_unacknowledged", "load_runtime", "serve"]

DEFAULT_STORE = "sqlite:///.signoff/state.db"

DEFAULT_WORKERS = 4
"""Turns a served runtime that runs its turns in process drives at a time outside requests."""

KEEP_ALIVE_TIMEOUT = 5.0
"""Seconds an idle connection is kept open after a response (uvicorn's default)."""

MAX_CONNECTIONS = 1_000_000
"""The largest `max_connections` taken: far above what one process serves."""

STALLED_GRACE = 2.0
"""Seconds a stopping server waits for a client that has stopped reading before dropping it."""

SWEEP_GRACE = 30.0
"""Seconds a graceful stop waits for the turns the deadline sweep (no in-process workers)
drives before cutting them short, their leases given back for the next process."""

UNACKED_HEARTBEATS = 3
"""Heartbeats (45 s) the data a connection sent may go unacknowledged by the client's machine
before the kernel drops the connection (`TCP_USER_TIMEOUT`, Linux): a network path cut without
a close (a NAT or firewall that forgot it) otherwise holds an event stream, and its caller's
stream slot, for the kernel's 15 minutes of retransmissions, its keep-alives piling up unsent."""


def load_runtime(target: str, store: str | None = None) -> Runtime:
    """Import `module:attribute` (a `Runtime`, or a function returning one).

    With `store`, the runtime's agents are served from that store instead.
    """
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"expected MODULE:RUNTIME (e.g. examples.support:runtime), not {target!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import {module_name!r}: {exc}") from exc
    try:
        obj: Any = getattr(module, attr)
    except AttributeError:
        raise UsageError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not isinstance(obj, Runtime) and callable(obj):
        try:
            obj = obj()
        except SignoffError:
            raise
        except Exception as exc:  # the factory's own failure, named in one line
            raise UsageError(f"{target}() failed: {type(exc).__name__}: {exc}") from exc
        if inspect.iscoroutine(obj):
            obj.close()  # never run: no "was never awaited" warning beside the error
            raise UsageError(
                f"{target}() is a coroutine: a runtime factory must be a plain function "
                "returning a signoff Runtime"
            )
    if not isinstance(obj, Runtime):
        raise UsageError(f"{target} is a {type(obj).__name__}, not a signoff Runtime")
    return obj if store is None else obj.with_store(store)


def serve(
    target: str | Runtime,
    host: str = "127.0.0.1",
    port: int = 8000,
    store: str | None = None,
    *,
    auth: Authenticator | None = None,
    log_level: str = "info",
    channels: Sequence[Channel] = (),
    channel_state: str | Path | None = None,
    secret: str | bytes | None = None,
    workers: int | None = None,
    sign_in_lifetime: float = SIGN_IN_LIFETIME,
    max_streams: int = MAX_STREAMS,
    max_body_size: int = MAX_BODY_SIZE,
    metrics: bool = False,
    metrics_token: str | None = None,
    max_connections: int | None = None,
    keep_alive_timeout: float = KEEP_ALIVE_TIMEOUT,
) -> None:
    """Serve a runtime over HTTP until interrupted; dev mode (localhost only) without `auth`.
    With `store`, the runtime's agents are served from that store instead.

    `channels` (Slack, webhooks, ...) follow the queue while the server runs, from one
    `ChannelHub` whose delivery positions live in `channel_state` (a SQLite file; in memory if
    None, so a restart starts at the end of the queue). Of the processes on one file one
    delivers and the others stand by; in memory, every process delivers everything. `secret`
    keys the dashboard's CSRF tokens (see `create_app`). `workers` turns at a time run in this
    process for sessions with work no request is running (see `create_app`); by default 4 for a
    runtime that runs its turns in process, 0 for one that leaves them to workers (`inline=False`).
    A dashboard sign-in lasts `sign_in_lifetime` seconds, one caller may hold `max_streams`
    event streams open at once, and a request body may be `max_body_size` bytes (see
    `create_app`). `metrics` serves Prometheus metrics at `/metrics` to admins and to
    `metrics_token` (see `create_app`). `log_level` is uvicorn's, and signoff's own loggers'
    too, which go to stderr timestamped unless logging is set up already (a handler on the root
    or `signoff` logger).

    `max_connections` (uvicorn's `limit_concurrency`; None: no bound) answers a request 503 at
    once while the process holds that many connections (the request's own, idle and event
    streams included) or runs that many requests, so a flood is refused instead of piling up;
    an idle connection is closed `keep_alive_timeout` seconds after its last response, and one
    whose data goes unacknowledged for three heartbeats (45 s: a network cut) is dropped. None
    of these times a client that sends its request slowly: see docs/server.md, "Slow and idle
    clients".
    """
    import uvicorn

    from ._app import create_app

    # Checked before anything is opened: uvicorn would fail only once the app started.
    whole("port", port, least=0, most=65_535)
    if not isinstance(host, str):
        raise UsageError(f"host must be a host name or address, not {host!r}")
    if log_level not in LOG_LEVELS:
        raise UsageError(f"log_level must be one of {', '.join(LOG_LEVELS)}, not {log_level!r}")
    if max_connections is not None:
        whole("max_connections", max_connections, least=1, most=MAX_CONNECTIONS)
    seconds("keep_alive_timeout", keep_alive_timeout, least=0.1, most=3600)
    log_to_stderr(log_level)  # the in-process workers' and channels' lines, as uvicorn's
    if isinstance(target, Runtime):
        runtime = target if store is None else target.with_store(store)
    else:
        runtime = load_runtime(target, store)
    hub = None
    if channels:
        from ..channels import ChannelHub

        hub = ChannelHub(runtime, channels, state=channel_state)
    if workers is None:
        workers = DEFAULT_WORKERS if runtime.inline else 0
    app = create_app(
        runtime,
        auth=auth,
        dev=auth is None,
        close_runtime=True,
        channels=hub,
        secret=secret,
        workers=workers,
        sign_in_lifetime=sign_in_lifetime,
        max_streams=max_streams,
        max_body_size=max_body_size,
        metrics=metrics,
        metrics_token=metrics_token,
    )
    if auth is None and not is_loopback(host):
        print(
            "signoff: dev mode accepts requests from localhost only; pass API tokens to serve "
            "other machines",
            file=sys.stderr,
        )
    if port != 0:  # else once listening, on the port the system chose
        print(_banner(host, port))
    context = app.state.signoff
    context.background.grace = SWEEP_GRACE  # a second signal cuts the wait short (`handle_exit`)

    class Server(uvicorn.Server):
        """Uvicorn, which ends the open event streams when it begins to stop: its graceful
        shutdown waits for every response to finish, and a followed stream never does."""

        signalled: asyncio.AbstractEventLoop | None = None  # where a forced stop cancels
        unwritten: OSError | None = None  # the banner's, raised once the server has stopped

        async def startup(self, sockets: Any = None) -> None:
            self.signalled = asyncio.get_running_loop()
            await super().startup(sockets)
            if self.started:
                drop_unacknowledged(self, UNACKED_HEARTBEATS * context.heartbeat)

        async def main_loop(self) -> None:
            if port == 0:  # listening: the banner names the port the system chose
                bound = self.servers[0].sockets[0].getsockname()[1]
                try:
                    print(_banner(host, bound), flush=True)
                except OSError as exc:  # its output gone (a full disk, no reader any more)
                    # Stopped, its shutdown run, and raised as it returns, for the caller to end
                    # it as any output's: raised in the start-up, uvicorn logged a traceback.
                    self.unwritten = exc
                    return
            await super().main_loop()

        def handle_exit(self, sig: int, frame: Any) -> None:
            # uvicorn forces the stop only on a second SIGINT; a second SIGTERM (a supervisor
            # that gave up waiting) or a SIGTERM after Ctrl-C stops it at once too.
            if self.should_exit:
                self.force_exit = True
            super().handle_exit(sig, frame)
            if self.force_exit:  # the lifespan's shutdown may be waiting for them, unbounded
                context.background.cut_short()
                loop = self.signalled
                if hub is not None and loop is not None and not loop.is_closed():
                    # What the hub's stop waits for: a poll, the turns its channels resumed (a
                    # Slack click's), unsent webhooks; on the loop, as this is a signal handler.
                    loop.call_soon_threadsafe(hub.cut_short)

        async def shutdown(self, sockets: Any = None) -> None:
            context.closing = True
            context.background.stopping()  # no new turns claimed or swept while it drains
            dropping = asyncio.create_task(self.drop_stalled())
            try:
                await super().shutdown(sockets)
            finally:
                dropping.cancel()
            if self.force_exit:
                await self.cut_short()

        async def cut_short(self) -> None:
            """Cancel the requests and the app's own work (in-process workers, the sweep's
            turns, the turns its channels resumed) still running on a forced stop, and give them
            a moment to unwind (a turn gives its lease back): a SIGTERM uvicorn raises again as
            it returns ends the process at once, before `asyncio.run` would cancel them."""
            tasks = [*self.server_state.tasks, *context.background.tasks]
            running = [task for task in tasks if not task.done()]
            for task in running:
                task.cancel()
            if hub is not None:  # none left unless uvicorn skipped the lifespan's shutdown
                running += hub.cut_short()  # cancelled there, once
            if running:
                await asyncio.wait(running, timeout=STALLED_GRACE)

        async def drop_stalled(self) -> None:
            """Abort, after a grace, the connections whose client has stopped reading: their
            response waits to write (a stream cannot see the server stopping), and the
            shutdown would wait for them for ever, even once the app has finished."""
            await asyncio.sleep(STALLED_GRACE)
            while True:
                for connection in list(self.server_state.connections):
                    flow = getattr(connection, "flow", None)
                    transport = getattr(connection, "transport", None)
                    if transport is not None and getattr(flow, "write_paused", False):
                        transport.abort()
                await asyncio.sleep(0.25)

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        limit_concurrency=max_connections,
        timeout_keep_alive=keep_alive_timeout,  # type: ignore[arg-type]  # any number works
    )
    server = Server(config)
    cut_short = _CutShort(server)
    errors = logging.getLogger("uvicorn.error")
    errors.addFilter(cut_short)
    try:
        server.run()
    finally:
        errors.removeFilter(cut_short)
    if server.unwritten is not None:
        raise server.unwritten


def drop_unacknowledged(server: Any, seconds: float) -> None:
    """Have the kernel drop a connection of uvicorn's `server` whose sent data goes `seconds`
    unacknowledged (`TCP_USER_TIMEOUT`, where the system has it): set on its listening sockets,
    which the connections they accept inherit, and on the connections taken already."""
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    if option is None:
        return
    taken = [getattr(c, "transport", None) for c in list(server.server_state.connections)]
    sockets = [s for listening in server.servers for s in listening.sockets]
    sockets += [t.get_extra_info("socket") for t in taken if t is not None]
    for sock in sockets:
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):  # a connection closed meanwhile
                sock.setsockopt(socket.IPPROTO_TCP, option, round(seconds * 1000))


class _CutShort(logging.Filter):
    """Leaves out uvicorn's tracebacks of what a forced stop (a second Ctrl-C) cancels, a turn
    in flight or the app's lifespan: no application error, and the turn's lease is given back."""

    def __init__(self, server: Any) -> None:
        super().__init__()
        self.server = server

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.server.force_exit:
            return True
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, asyncio.CancelledError):
            return False
        # The lifespan's, which Starlette hands uvicorn as text (a traceback's last line).
        last = record.getMessage().rstrip().rpartition("\n")[2]
        return last != "asyncio.exceptions.CancelledError"


def _banner(host: str, port: int) -> str:
    """The line naming where the dashboard is, as a URL a browser opens: every interface as
    this machine's loopback address, an IPv6 address in brackets."""
    shown = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"
    return f"signoff: dashboard at http://{shown}:{port}/_signoff  (API: /v1, docs: /v1/docs)"
