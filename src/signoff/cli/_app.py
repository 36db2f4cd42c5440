"""The `signoff` Typer app and what every command shares: the store option, error output,
the runtime a command names (loaded by `_loading`) and the local principal.

Every command reports a signoff error as one red line naming its class and exits with status 1;
a misuse of the command line found before anything runs is refused as Click refuses one it
parses, with the command's usage and exit status 2.
"""

from __future__ import annotations

import asyncio
import getpass
import logging
import os
import re
import signal
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console

from .._agent import Agent, StandIn
from .._answers import blank_identity
from .._exceptions import (
    ModelError,
    SignoffError,
    UnknownRequest,
    UnknownSession,
    UsageError,
)
from .._leasing import LEASE_TTL_MAX, LEASE_TTL_MIN
from .._logs import LOG_LEVELS
from .._runtime import Runtime
from .._text import is_utf8
from .._types import InputRequest, ModelResponse, Principal
from ..channels.terminal import compact_json, printable
from ..models import ModelRequest
from ..stores import DEFAULT_URL, Store, _without_password
from ._commands import Group, closed_pipe
from ._loading import load_runtime, split_target
from ._numbers import seconds
from ._stuck import ctrl_c_in_sqlite

app = typer.Typer(
    name="signoff",
    help="Run agents that stop for people: chat, answer approvals, read session logs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=Group,
)


def set_or_unset(envvar: str) -> Callable[..., Any]:
    """The callback of an option whose variable, set but empty, is refused as the empty option
    is: Click takes it for an unset one, so `SIGNOFF_STORE=$DATABASE_URL` with the variable
    unset would quietly act on the default store (or as the local user) instead. The option
    typed on the command line wins over the variable, empty or not."""

    def check(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
        # By name: newer Typer vendors Click, so its ParameterSource is not click's own enum.
        typed = getattr(ctx.get_parameter_source(param.name or ""), "name", None) == "COMMANDLINE"
        if not typed and os.environ.get(envvar) == "":
            raise typer.BadParameter(set_but_empty(envvar))
        return value

    return check


def set_but_empty(envvar: str, instead: str = "unset it for the default") -> str:
    """What a command says of its variable `envvar` set but empty, where `instead` is the way
    out other than a value."""
    return f"{envvar} is set but empty: give it a value, or {instead}"


StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        envvar="SIGNOFF_STORE",
        callback=set_or_unset("SIGNOFF_STORE"),
        metavar="URL",
        help="Store URL (sqlite:///path or postgresql://...); replaces MODULE:RUNTIME's own. "
        f"Default: the runtime's, else {DEFAULT_URL}.",
        show_default=False,
    ),
]
"""Every command's store: the same option, variable and precedence over a runtime's own."""

RuntimeArgument = Annotated[
    str | None,
    typer.Argument(
        metavar="MODULE:RUNTIME",
        help="A Runtime or Agent whose store to use (its own, unless --store replaces it).",
        show_default=False,
    ),
]
"""The runtime a command that only reads or manages the store may name, for its store."""

SessionArgument = Annotated[
    str,
    typer.Argument(
        metavar="SESSION_ID", help="The session's id (ses_...), as 'signoff sessions' lists it."
    ),
]
"""The session a command acts on (`events`, `cancel`, `delete`)."""


def log_level_of(value: object) -> str:
    """A log level as `serve` and `worker` take it (uvicorn's names, any case)."""
    level = str(value).strip().lower()
    if level not in LOG_LEVELS:
        raise typer.BadParameter(f"{str(value)!r} is not one of {', '.join(LOG_LEVELS)}")
    return level


LogLevelOption = Annotated[
    str,
    typer.Option(
        "--log-level",
        envvar="SIGNOFF_LOG_LEVEL",
        callback=set_or_unset("SIGNOFF_LOG_LEVEL"),
        metavar="LEVEL",
        parser=log_level_of,
        help=f"Least level logged to stderr: {', '.join(LOG_LEVELS)}.",
    ),
]


LEASE_TTL = seconds(LEASE_TTL_MIN, LEASE_TTL_MAX)

LeaseTtlOption = Annotated[
    float | None,
    typer.Option(
        "--lease-ttl",
        envvar="SIGNOFF_LEASE_TTL",
        callback=set_or_unset("SIGNOFF_LEASE_TTL"),
        metavar="SECONDS",
        parser=LEASE_TTL,
        help=f"Seconds a session's lease lasts without renewal, {LEASE_TTL.range}: a turn left "
        "by a process that died is resumed after it (default: the runtime's, 30 unless it sets "
        "one).",
        show_default=False,
    ),
]
"""`serve`'s and `worker`'s lease TTL, which replaces the loaded runtime's `lease_ttl`."""


def refuse_undecodable(values: dict[str, str | None]) -> None:
    """Refuse a command-line value holding a byte that is not UTF-8 (Python passes it on as a
    lone surrogate): no id or name can hold one, and the store cannot even look it up."""
    for what, value in values.items():
        if not is_utf8(value or ""):
            raise UsageError(f"{what} {value!r} is not valid UTF-8 text")


def refuse_empty_filters(values: dict[str, str | None]) -> None:
    """Refuse a listing filter given empty (`--agent "$AGENT"` with the variable unset): no
    agent, tool or session has an empty name, so it would list nothing, as if none were open."""
    names = {"--agent": "an agent's name", "--tool": "a tool's name", "--session": "a session id"}
    for what, value in values.items():
        if value == "":
            raise UsageError(f"{what} takes {names.get(what, 'a value')}, not ''")


def refuse_empty_ids(values: dict[str, str | None]) -> None:
    """Refuse an id or name given empty (`signoff approve "$REQ"` with the variable unset): it
    was looked up, and said to be unknown, as if the store had lost it."""
    for what, value in values.items():
        if value == "":
            raise UsageError(f"{what} is empty: give one (was a variable it came from unset?)")


@contextmanager
def misuse() -> Iterator[None]:
    """A `UsageError` raised inside is a mistake on the command line, found before anything ran
    (a value of the wrong form, options that do not go together): it is refused as Click refuses
    a value out of range, with the command's usage and exit status 2."""
    try:
        yield
    except UsageError as exc:
        raise typer.BadParameter(str(exc)) from None


def shown_store(url: str) -> str:
    """The store URL as the CLI prints or logs it: a PostgreSQL URL without its password,
    whether in the user part or a `?password=` parameter."""
    if url.startswith(("postgresql://", "postgres://")):
        from ..stores.postgres._url import describe

        return describe(url)
    return url


def store_args(url: str) -> list[str]:
    """`--store URL` for a command a hint prints, to open the store this one opened: none for
    the default store or the one `SIGNOFF_STORE` names (run where this was, it opens that one,
    password and all), else the URL as given with any password shown as `***`, to be filled in
    (the URL `shown_store` prints leaves it and the driver's options out, and cannot connect)."""
    if url == DEFAULT_URL or url == os.environ.get("SIGNOFF_STORE"):
        return []
    return ["--store", _without_password(url)]


class _Console(Console):
    """A console that stops the command as `closed_pipe` says when its reader has gone: Rich's
    own way is exit status 1, as for an error."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        closed_pipe()


def out() -> Console:
    """The console for what a command prints: a line is never wrapped at the terminal's width
    (or a pipe's 80 columns), so the ids in it stay whole for a script; tables are laid out."""
    return _Console(highlight=False, soft_wrap=True)


def err() -> Console:
    return _Console(stderr=True, highlight=False)


def fail(exc: BaseException) -> NoReturn:
    """Print `exc` as one red line (a multi-line message, e.g. a driver's, is joined, and the
    notes added to it follow: a prune's failed sync) and exit 1."""
    texts = [str(exc), *(str(note) for note in getattr(exc, "__notes__", ()))]
    joined = [
        " ".join(line.strip() for line in text.splitlines() if line.strip()) for text in texts
    ]
    message = "; ".join(text for text in joined if text) or "(no message)"
    message += _other_kind_of_id(exc)
    err().print(
        f"[bold red]error:[/] [red]{type(exc).__name__}: {printable(message)}[/]", soft_wrap=True
    )
    raise typer.Exit(1)


def answer_flags(request: InputRequest) -> list[str]:
    """The `signoff answer` options that can answer `request`: `--option ID` only when it has
    options and `--text TEXT` only when it takes free text, so no hint names one it refuses."""
    flags = ["--option ID"] if request.options else []
    if request.allow_text:
        flags.append("--text TEXT")
    return flags or ["--option ID", "--text TEXT"]


def _other_kind_of_id(exc: BaseException) -> str:
    """What to run instead when an unknown id is of the other kind (`signoff approve ses_...`,
    `signoff events req_...`), an easy first mistake: the ids say which they are."""
    if isinstance(exc, UnknownSession) and exc.session_id.startswith("req_"):
        return " (that is a request id: `signoff pending` shows the session of an open one)"
    if isinstance(exc, UnknownRequest) and len(exc.request_ids) == 1:
        (given,) = exc.request_ids
        if given.startswith("ses_"):
            return (
                f" (that is a session id: `signoff pending --session {given}` lists its requests)"
            )
    return ""


def say_cut(shown: int, total: int, offset: int = 0) -> None:
    """Say on stderr that `--limit` or `--offset` left some out of a listing, so a script
    reading its JSON on stdout can tell, without a change to that JSON's shape: which rows were
    shown of how many (`showing 101-200 of 5321`), and the `--offset` of the next page if any.
    Nothing is said when the list is whole."""
    if not offset:
        if total <= shown:
            return
        say = f"showing {shown} of {total}: pass a higher --limit to see more"
    elif not shown:  # as the API's page past the end: no rows, the total, no error
        past = f": --offset {offset} is past the end" if offset >= total else ""
        say = f"showing none of {total}{past}"
    else:
        say = f"showing {offset + 1}-{offset + shown} of {total}"
        if total > offset + shown:
            say += f": pass --offset {offset + shown} to see more"
    err().print(say, soft_wrap=True)


def shown_of(shown: int, total: int, offset: int = 0) -> str:
    """A listing table's count, as `say_cut` words it: `120` (the whole list), `50 of 120`
    (cut by `--limit`), or `51-100 of 120` (from `--offset`)."""
    if offset:
        return f"{offset + 1}-{offset + shown} of {total}"
    return str(total) if total <= shown else f"{shown} of {total}"


def run(coro: Coroutine[Any, Any, None]) -> None:
    """Run one command's coroutine, turning signoff errors into one red line and exit 1."""
    _quiet_driver()
    try:
        with ctrl_c_in_sqlite():
            asyncio.run(coro)
    except SignoffError as exc:
        fail(exc)
    except KeyboardInterrupt:
        err().print("[dim]interrupted[/]")
        raise typer.Exit(130) from None


def _quiet_driver() -> None:
    """Keep psycopg's pool from printing each failed reconnection on stderr (several a second
    while PostgreSQL is down) through Python's last-resort handler, where a command says what
    failed in one line; logging set up for them (`worker`, `serve`, an application) has them."""
    driver = logging.getLogger("psycopg")
    if not any(type(h) is logging.NullHandler for h in driver.handlers):
        driver.addHandler(logging.NullHandler())


def _version(value: bool) -> None:
    if value:
        from .. import __version__

        try:
            typer.echo(f"signoff {__version__}")
        except BrokenPipeError:  # before any command runs: `Group.invoke` is not there yet
            closed_pipe()
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Show the version."),
    ] = False,
) -> None:
    """Run agents that stop for people: chat, answer approvals, read session logs."""


# -- loading a runtime ------------------------------------------------------------------------


def local_principal() -> Principal:
    """The person at this terminal: the operating-system user, as a `local` principal."""
    try:
        user = getpass.getuser()
    except Exception:
        user = f"uid-{os.getuid()}" if hasattr(os, "getuid") else "unknown"
    return Principal(authenticator="local", principal_id=user)


def parse_principal(value: str | None) -> Principal:
    """`AUTHENTICATOR:ID` (or just `ID`, as a `local` principal); None means the local user."""
    if value is None:
        return local_principal()
    refuse_undecodable({"--as": value})
    authenticator, sep, principal_id = value.partition(":")
    if not sep:
        authenticator, principal_id = "local", value
    if not authenticator or not principal_id:
        raise UsageError(f"--as takes AUTHENTICATOR:ID such as dev:dev or ID, not {value!r}")
    principal = Principal(authenticator=authenticator, principal_id=principal_id)
    problem = blank_identity(principal)  # `--as " "`: refused by every answer, every message
    if problem is not None:
        raise UsageError(f"--as {value!r} names no one: {problem}")
    if any(part != part.strip() for part in (authenticator, principal_id)):
        # `bob ` is another principal than `bob` (a second vote in a quorum), printed alike.
        raise UsageError(f"--as {value!r} has spaces around a name: write it without them")
    return principal


def as_option(help: str) -> Any:
    """`--as AUTHENTICATOR:ID` (or `SIGNOFF_PRINCIPAL`): who a command acts as, with `help`."""
    return typer.Option(
        "--as",
        envvar="SIGNOFF_PRINCIPAL",
        callback=set_or_unset("SIGNOFF_PRINCIPAL"),
        metavar="AUTHENTICATOR:ID",
        help=help,
        show_default=False,
    )


AsOption = Annotated[
    str | None,
    as_option(
        "Act as AUTHENTICATOR:ID (default: local:<your user name>). By default only the "
        "principal whose turn asked may answer its requests (anyone, for a turn asked with no "
        "principal); a tool's approval settings (a response policy, approvers=) can say otherwise."
    ),
]


def store_of(target: str | None, store: str | None) -> Store | str | None:
    """The store a command opens: `--store` (or `SIGNOFF_STORE`), else the store of the runtime
    `target` names, which the command opens again with its settings (`unopened_like`), not from
    its URL alone; else None, the default store. The runtime is imported even when `--store`
    replaces its store, so a wrong one is refused as every command refuses it."""
    loaded = runtime_of(target, store)
    return store if loaded is None else loaded.store


def runtime_of(target: str | None, store: str | None) -> Runtime | None:
    """The runtime `target` names, imported, `store` replacing its store; None for none."""
    if target is None:
        return None
    with misuse():
        split_target(target)
    return load_runtime(target, store)


@contextmanager
def ctrl_c_interrupts() -> Iterator[None]:
    """Let one Ctrl-C end what runs inside at once, in a command's event loop: asyncio's own
    handler only cancels the task, which a blocking read or a long table's layout never awaits.
    A Ctrl-C that came since the last await (asyncio's cancel, not yet delivered) ends it now."""
    previous = signal.getsignal(signal.SIGINT)
    swap = (
        previous not in (None, signal.SIG_IGN)  # None: set outside Python, so not restorable
        and threading.current_thread() is threading.main_thread()
    )
    if swap:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        task = asyncio.current_task()
        if swap and task is not None and task.cancelling():
            raise KeyboardInterrupt
        yield
    finally:
        if swap:
            signal.signal(signal.SIGINT, previous)


def driving(runtime: Runtime) -> Runtime:
    """`runtime` running its turns in this process, as `chat` and an answer given with
    `MODULE:RUNTIME` do: one that leaves them to workers (`inline=False`) only recorded them,
    and a person at the terminal waited on a worker that may not be running."""
    return runtime if runtime.inline else runtime._replaced(inline=True)


def pick_agent(runtime: Runtime, name: str | None) -> Agent:
    if name is not None:
        return runtime.agent(name)
    if len(runtime.agents) == 1:
        return next(iter(runtime.agents.values()))
    known = ", ".join(runtime.agents) or "none"
    raise UsageError(f"this runtime has several agents ({known}): choose one with --agent")


class NoModel(StandIn):
    """The model of an agent this process only settles answers for; it is never called."""

    async def complete(self, request: ModelRequest) -> ModelResponse:
        raise ModelError(
            f"this process has no model for agent {self.agent!r}: pass MODULE:RUNTIME to resume"
        )


# -- chat -------------------------------------------------------------------------------------


def tool_line(data: dict[str, Any]) -> str:
    name, status, result = data.get("tool_name"), data.get("status"), data.get("result")
    if status == "denied":
        why = (result or {}).get("reason") if isinstance(result, dict) else None
        return one_line(f"{name} denied" + (f": {why}" if why else ""))
    if status == "error":
        error = result.get("error") if isinstance(result, dict) else result
        return one_line(f"{name} failed: {clip(str(error))}")
    notes = []
    if (
        isinstance(result, dict)
        and "result" in result
        and ("approval" in result or "edited_input" in result)
    ):  # the engine puts the approval's reason and any edited input beside the result
        if "edited_input" in result:
            notes.append(f"ran with edited input {compact_json(result['edited_input'])}")
        approval = result.get("approval")
        if isinstance(approval, dict) and approval.get("reason"):
            notes.append(f"approved: {approval['reason']}")
        result = result["result"]
    extra = f" ({'; '.join(notes)})" if notes else ""
    return one_line(f"{name} -> {clip(compact_json(result))}{extra}")


_LINE_BREAKS = re.compile("[\n\r\u2028\u2029]")


def one_line(text: str) -> str:
    """`text` with its line breaks shown as `\\n` and the like: a line that stands for one
    event or call, whose reason or result a person or a model wrote, cannot print what reads
    as another (a made-up `tool.started` line under a denial)."""
    return _LINE_BREAKS.sub(lambda m: ascii(m.group())[1:-1], text)


def clip(text: str, width: int = 100) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def error_text(error: object) -> str:
    """A failure's text: its error object's message or code, or, in a hand-damaged log, whatever
    the value is (a bare string, a list), so one such event cannot end a listing."""
    if not error:
        return "unknown error"
    if isinstance(error, dict):
        return str(error.get("message") or error.get("code") or error)
    return str(error)
