"""`signoff serve`: the HTTP API and dashboard, with the channels it can notify."""

from __future__ import annotations

import asyncio
import errno
import signal
import socket
import sys
import unicodedata
from typing import Annotated

import typer

from .._exceptions import (
    SignoffError,
    UsageError,
)
from .._runtime import Runtime
from .._text import is_utf8
from .._types import Principal
from ..stores import Store
from ._app import (
    LeaseTtlOption,
    LogLevelOption,
    StoreOption,
    app,
    fail,
    misuse,
    run,
    set_but_empty,
    set_or_unset,
)
from ._commands import ClosedOutput
from ._loading import load_runtime, split_target
from ._numbers import number_of_seconds, seconds, whole
from ._serve_channels import (
    exported_empty,
    refuse_empty_values,
    refuse_missing_secrets,
    refuse_stray_channel_options,
    slack_channels,
    webhook_channels,
)
from ._store_files import own_store, unopened_like
from ._stuck import ctrl_c_in_sqlite
from ._waiting import open_when_up

PORT = whole(0, 65535)
WORKERS = whole(0, 100_000)
MAX_STREAMS = whole(1, 100_000)
MAX_BODY_SIZE = whole(1, 1 << 30)
MAX_CONNECTIONS = whole(1, 1_000_000)
KEEP_ALIVE_TIMEOUT = seconds(0.1, 3600)


@app.command()
def serve(
    ctx: typer.Context,
    target: Annotated[
        str, typer.Argument(metavar="MODULE:RUNTIME", help="A Runtime or Agent to serve.")
    ],
    host: Annotated[
        str, typer.Option("--host", metavar="HOST", help="Interface to listen on.")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", metavar="PORT", parser=PORT, help=f"TCP port ({PORT.range}).")
    ] = 8000,
    token: Annotated[
        list[str] | None,
        typer.Option(
            "--token",
            envvar="SIGNOFF_TOKENS",
            callback=set_or_unset("SIGNOFF_TOKENS"),
            metavar="SECRET=PRINCIPAL_ID",
            help="API token as SECRET=PRINCIPAL_ID (repeatable). Without one: localhost dev mode.",
        ),
    ] = None,
    store: StoreOption = None,
    webhook: Annotated[
        list[str] | None,
        typer.Option(
            "--webhook",
            metavar="URL",
            help="POST signed request events to this http(s) URL (repeatable).",
        ),
    ] = None,
    webhook_secret: Annotated[
        str | None,
        typer.Option(
            "--webhook-secret",
            envvar="SIGNOFF_WEBHOOK_SECRET",
            metavar="SECRET",
            help="Secret that signs webhook deliveries (Signoff-Signature).",
        ),
    ] = None,
    webhook_backfill: Annotated[
        bool,
        typer.Option(
            "--webhook-backfill",
            help="On the webhook channel's first start on its --channel-state, send "
            "request.opened for the requests already open (default: it starts from now).",
        ),
    ] = False,
    slack_channel: Annotated[
        str | None,
        typer.Option(
            "--slack-channel",
            metavar="CHANNEL_ID",
            # `\\[` keeps rich from taking `[slack]` for markup and dropping it
            help="Post requests to this Slack channel id (needs pip install 'signoff\\[slack]').",
        ),
    ] = None,
    slack_token: Annotated[
        str | None,
        typer.Option(
            "--slack-token",
            envvar="SLACK_BOT_TOKEN",
            metavar="TOKEN",
            help="The Slack bot token.",
        ),
    ] = None,
    slack_signing_secret: Annotated[
        str | None,
        typer.Option(
            "--slack-signing-secret",
            envvar="SLACK_SIGNING_SECRET",
            metavar="SECRET",
            help="The Slack app's signing secret (checks button clicks).",
        ),
    ] = None,
    slack_users_by_email: Annotated[
        bool,
        typer.Option(
            "--slack-users-by-email",
            help="A Slack user acts as the --token principal named by their confirmed Slack "
            "email (token:alice@corp.example), so four eyes and a quorum see one person "
            "wherever they answer; the bot needs users:read and users:read.email.",
        ),
    ] = False,
    slack_external_team: Annotated[
        list[str] | None,
        typer.Option(
            "--slack-external-team",
            metavar="TEAM_ID",
            help="With --slack-users-by-email, also map users of this Slack Connect partner's "
            "workspace or organization (repeatable); others outside the app's own act as "
            "slack:TEAM:USER, as their admin sets their email.",
        ),
    ] = None,
    secret: Annotated[
        str | None,
        typer.Option(
            "--secret",
            envvar="SIGNOFF_SECRET",
            callback=set_or_unset("SIGNOFF_SECRET"),
            metavar="SECRET",
            help="Keys the dashboard's CSRF tokens (the same in every process serving it); "
            "without it they are bound to the sign-in's token alone.",
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            metavar="N",
            parser=WORKERS,
            help="Turns run at a time in this process for sessions with work no request is "
            "running (answered from elsewhere, or left by a process that died), "
            f"{WORKERS.range}; 0 for none (default: 4, or 0 for a runtime that leaves its turns "
            "to workers).",
        ),
    ] = None,
    lease_ttl: LeaseTtlOption = None,
    max_streams: Annotated[
        int | None,
        typer.Option(
            "--max-streams",
            envvar="SIGNOFF_MAX_STREAMS",
            callback=set_or_unset("SIGNOFF_MAX_STREAMS"),
            metavar="N",
            parser=MAX_STREAMS,
            help="Event streams one caller may hold open at once in this process (the sessions' "
            f"and the dashboard's), {MAX_STREAMS.range}; one more is 429 too_many_streams "
            "(default: 100).",
            show_default=False,
        ),
    ] = None,
    max_body_size: Annotated[
        int | None,
        typer.Option(
            "--max-body-size",
            envvar="SIGNOFF_MAX_BODY_SIZE",
            callback=set_or_unset("SIGNOFF_MAX_BODY_SIZE"),
            metavar="BYTES",
            parser=MAX_BODY_SIZE,
            help=f"Largest request body taken, in bytes, {MAX_BODY_SIZE.range}; a larger one is "
            "413 payload_too_large (default: 4194304, 4 MiB).",
            show_default=False,
        ),
    ] = None,
    max_connections: Annotated[
        int | None,
        typer.Option(
            "--max-connections",
            envvar="SIGNOFF_MAX_CONNECTIONS",
            callback=set_or_unset("SIGNOFF_MAX_CONNECTIONS"),
            metavar="N",
            parser=MAX_CONNECTIONS,
            help="Connections (idle ones and event streams included) or running requests this "
            f"process holds before it answers a new request 503 at once, {MAX_CONNECTIONS.range} "
            "(default: no bound).",
            show_default=False,
        ),
    ] = None,
    keep_alive_timeout: Annotated[
        float | None,
        typer.Option(
            "--keep-alive-timeout",
            envvar="SIGNOFF_KEEP_ALIVE_TIMEOUT",
            callback=set_or_unset("SIGNOFF_KEEP_ALIVE_TIMEOUT"),
            metavar="SECONDS",
            parser=KEEP_ALIVE_TIMEOUT,
            help="Seconds an idle connection is kept open after a response, "
            f"{KEEP_ALIVE_TIMEOUT.range} (default: 5).",
            show_default=False,
        ),
    ] = None,
    log_level: LogLevelOption = "info",
    sign_in_lifetime: Annotated[
        float | None,
        typer.Option(
            "--sign-in-lifetime",
            metavar="SECONDS",
            parser=number_of_seconds,
            help="How long a dashboard sign-in lasts, a positive number (default: 43200, 12 "
            "hours).",
        ),
    ] = None,
    metrics: Annotated[
        bool,
        typer.Option(
            "--metrics",
            envvar="SIGNOFF_METRICS",
            callback=set_or_unset("SIGNOFF_METRICS"),
            # `\\[` keeps rich from taking `[metrics]` for markup and dropping it
            help="Serve Prometheus metrics at /metrics (needs pip install "
            "'signoff\\[metrics]'), to --metrics-token or, in dev mode, localhost.",
        ),
    ] = False,
    metrics_token: Annotated[
        str | None,
        typer.Option(
            "--metrics-token",
            envvar="SIGNOFF_METRICS_TOKEN",
            metavar="SECRET",
            help="Bearer token that may read /metrics and nothing else (with --metrics).",
        ),
    ] = None,
    channel_state: Annotated[
        str | None,
        typer.Option(
            "--channel-state",
            metavar="FILE",
            help="SQLite file keeping channel delivery positions across restarts. Processes on "
            "one store deliver once whatever their state (one posts, holding a claim in the "
            "store, the others stand by); sharing this file, a standby takes over at once, "
            "else when the claim lapses (30 s). Default: in memory.",
        ),
    ] = None,
) -> None:
    """Serve the runtime over HTTP: REST under /v1, live events, the dashboard at /_signoff.

    Needs pip install 'signoff\\[server]'. With --webhook or --slack-channel the queue is also
    posted to those channels. Started while its database is down, it waits for it before
    listening (SIGTERM ends the wait)."""
    if isinstance(sys.stdout, ClosedOutput):
        # Said now, as any command's closed output: with --port 0 the banner, printed once
        # listening, failed inside the server's start-up with a traceback of 90 lines.
        raise OSError(errno.EBADF, "standard output is closed")
    try:
        from ..server import TokenAuth
        from ..server import serve as run_server
        from ..server._app import MAX_BODY_SIZE as BODY_DEFAULT
        from ..server._serve import KEEP_ALIVE_TIMEOUT as KEEP_ALIVE_DEFAULT
        from ..server._sign_ins import SIGN_IN_LIFETIME, lifetime_of
        from ..server._stream_slots import MAX_STREAMS as STREAMS_DEFAULT
    except UsageError as exc:  # the server extra is missing: its install hint
        fail(exc)
    except ImportError as exc:
        fail(
            UsageError(
                f"signoff serve needs the server extra: pip install 'signoff[server]' ({exc})"
            )
        )
    if metrics:
        from ..server._metrics import exporter_type

        try:  # a missing extra, as the server's above: no mistake of the command line
            exporter_type()
        except UsageError as exc:
            fail(exc)
    try:
        with misuse():  # the command line's own mistakes, before the runtime is imported
            split_target(target)
            refuse_empty_values(host, channel_state, slack_channel, slack_external_team)
            auth = None if not token else TokenAuth(_token_principals(token))
            refuse_stray_channel_options(
                ctx, bool(webhook), slack_channel is not None, slack_users_by_email
            )
            _check_metrics(ctx, metrics, metrics_token, auth)
            refuse_missing_secrets(
                bool(webhook), webhook_secret, slack_channel, slack_token, slack_signing_secret
            )
            channels = webhook_channels(webhook, webhook_secret, backfill=webhook_backfill)
            if channel_state is not None and "://" in channel_state:  # as --store takes
                url = channel_state
                raise UsageError(
                    f"--channel-state takes the path of a SQLite file, not a URL: {url!r}"
                )
            if secret is not None and not secret:  # `--secret "$UNSET"`
                raise UsageError("the server's secret (--secret) must not be empty")
            if secret is not None and not is_utf8(secret):  # not shown: it is a secret
                raise UsageError("the server's secret (--secret) is not valid UTF-8 text")
            lifetime = SIGN_IN_LIFETIME
            if sign_in_lifetime is not None:
                try:
                    lifetime = lifetime_of(sign_in_lifetime)
                except UsageError:
                    raise UsageError(
                        "--sign-in-lifetime must be a positive, finite number of seconds, "
                        f"not {sign_in_lifetime:g}"
                    ) from None
        runtime = load_runtime(target, store)
        if lease_ttl is not None:
            runtime = runtime._replaced(lease_ttl=lease_ttl)
        channels += slack_channels(
            slack_channel,
            slack_token if slack_channel is not None else None,
            slack_signing_secret if slack_channel is not None else None,
            by_email=slack_users_by_email,
            external_teams=slack_external_team,
            principals=[p.principal_id for p in _token_principals(token or []).values()],
        )
        _check_address(host, port)
    except SignoffError as exc:
        fail(exc)
    # Open the store once before the server starts: a store it cannot use (a newer schema, a
    # wrong password) is then one red line, not a traceback from the server's startup; one whose
    # database is down is waited for.
    up = [False]
    run(_check_store(runtime.store, up))
    if not up[0]:
        raise typer.Exit(0)  # SIGTERM while waiting for the database
    try:
        # a second signal while the server is held in SQLite (a turn it cut short giving its
        # lease back on a file another process holds locked) ends it at once
        with ctrl_c_in_sqlite(presses=2, stops=(signal.SIGINT, signal.SIGTERM)):
            run_server(
                runtime,
                host=host,
                port=port,
                auth=auth,
                channels=channels,
                channel_state=channel_state,
                secret=secret,
                workers=workers,
                sign_in_lifetime=lifetime,
                max_streams=STREAMS_DEFAULT if max_streams is None else max_streams,
                max_body_size=BODY_DEFAULT if max_body_size is None else max_body_size,
                log_level=log_level,
                metrics=metrics,
                metrics_token=metrics_token if metrics else None,
                max_connections=max_connections,
                keep_alive_timeout=KEEP_ALIVE_DEFAULT
                if keep_alive_timeout is None
                else keep_alive_timeout,
            )
    except SignoffError as exc:  # e.g. a channel state file that cannot be opened
        fail(exc)


def _check_address(host: str, port: int) -> None:
    """Bind `host`:`port` as the server will (every address it resolves to, reusing one in
    TIME_WAIT) and let go: a port in use or a host that is not this machine's is then one line,
    not uvicorn's log of a failed startup and its exit status 3."""
    try:
        found = socket.getaddrinfo(
            host or None,  # "" is every interface, as for the server's own bind
            port,
            type=socket.SOCK_STREAM,
            flags=socket.AI_PASSIVE,
        )
    except (socket.gaierror, UnicodeError) as exc:
        raise UsageError(f"cannot listen on {host}:{port}: no such host ({exc})") from None
    for family, kind, proto, _, address in found:
        try:
            probe = socket.socket(family, kind, proto)
        except OSError:
            continue  # a family this machine lacks (IPv6): the server skips it too
        with probe:
            try:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(address)
            except OSError as exc:
                raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


async def _check_store(store: Store, up: list[bool]) -> None:
    """Open and close a store like `store` (SQLite or PostgreSQL; other stores are left alone),
    waiting while its database is down; `up[0]` is False if SIGTERM came first. It is opened as
    the runtime would open it: in its schema, with its settings (`connect_timeout`,
    `busy_timeout`), and upgrading it only if `store` would."""
    probe = unopened_like(store, migrate=getattr(store, "auto_migrate", True))
    if probe is None:
        up[0] = True
        return
    own_store(probe)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    runtime = Runtime([], store=probe)
    try:
        up[0] = await open_when_up(runtime, stop, lambda line: typer.echo(line, err=True))
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        await runtime.close()


def _check_metrics(ctx: typer.Context, metrics: bool, token: str | None, auth: object) -> None:
    """Refuse a `--metrics-token` the app would refuse (one of the `--token` secrets, say), and
    one typed without `--metrics`; one only exported is left unused."""
    if metrics:
        from ..server._metrics import check_token

        if token is not None and not token:  # `--metrics-token "$UNSET"`
            raise UsageError("the metrics token (--metrics-token) must not be empty")
        if exported_empty(token, "SIGNOFF_METRICS_TOKEN"):  # else no token: a scraper's is 401
            instead = "unset it to serve /metrics to admins alone"
            raise UsageError(set_but_empty("SIGNOFF_METRICS_TOKEN", instead))
        if token is not None:
            check_token(token, auth)
    elif getattr(ctx.get_parameter_source("metrics_token"), "name", None) == "COMMANDLINE":
        raise UsageError("--metrics-token is given but no --metrics")


def _split_token(item: str) -> tuple[str, str]:
    """`SECRET=PRINCIPAL_ID` as (secret, id), split at the last `=` of the first run of them:
    a base64 secret's padding (`openssl rand -base64 32` ends in `=`) stays the secret's, where
    the first `=` of all left the secret without it and began the id with it. An id may hold
    `=` (`uid=alice`); a secret, only as padding. ("", "") when either part is empty."""
    first = item.find("=")
    if first < 1:  # none, or no secret before it
        return "", ""
    last = first
    while last + 1 < len(item) and item[last + 1] == "=":
        last += 1
    return item[:last], item[last + 1 :]


def _token_principals(tokens: list[str]) -> dict[str, Principal]:
    """The principal of each `--token SECRET=PRINCIPAL_ID`; the value is never shown in an
    error, as a mistyped one may be the bare secret."""
    principals: dict[str, Principal] = {}
    for n, item in enumerate(tokens, 1):
        secret, who = _split_token(item)
        if not secret or not who:
            raise UsageError(
                f"--token takes SECRET=PRINCIPAL_ID, and token #{n} is not one "
                "(not shown, as it may hold a secret)"
            )
        if any(c.isspace() for c in secret) or any(
            unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in item
        ):
            # `--token "$(cat tokens.txt)"`: two lines made one token, the second never valid
            # (a principal id may hold a space: `s3cret=Jane Doe`)
            raise UsageError(
                f"token #{n} of --token holds a line break or control character, or a space "
                "in its secret (not shown, as it may hold a secret): give each token its own "
                "--token"
            )
        known = principals.get(secret)
        if known is not None and known.principal_id != who:
            raise UsageError(
                f"--token gives one secret to two principals ({known.principal_id!r} "
                f"and {who!r}): give each its own"
            )
        principals[secret] = Principal(authenticator="token", principal_id=who)
    return principals
