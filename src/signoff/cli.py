"""The `signoff` command: chat with an agent, work the approval queue, read a session's log.

Every command reports a signoff error as one red line naming its class and exits with status 1.
"""

from __future__ import annotations

import asyncio
import dataclasses
import getpass
import importlib
import json
import os
import sys
import time
from collections.abc import Coroutine
from datetime import datetime
from typing import Annotated, Any, NoReturn

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ._agent import Agent
from ._events import Event
from ._exceptions import (
    AnswerError,
    ModelError,
    NotAllowed,
    SignoffError,
    UnknownRequest,
    UsageError,
)
from ._results import GenerateResult
from ._runtime import Runtime
from ._types import InputRequest, InputResponse, ModelResponse, Principal
from .channels.terminal import TerminalChannel, compact_json, duration
from .models import ModelRequest, Scripted
from .stores import DEFAULT_URL, PendingFilter

__all__ = ["app", "load_runtime", "local_principal", "main", "parse_principal"]

app = typer.Typer(
    name="signoff",
    help="Run agents that stop for people: chat, answer approvals, read session logs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        envvar="SIGNOFF_STORE",
        help=f"Store URL (sqlite:///path or postgresql://...). Default: {DEFAULT_URL}.",
        show_default=False,
    ),
]


def main() -> None:
    """Entry point of the `signoff` console script."""
    app()


def _out() -> Console:
    return Console(highlight=False)


def _err() -> Console:
    return Console(stderr=True, highlight=False)


def _fail(exc: BaseException) -> NoReturn:
    message = str(exc).strip() or "(no message)"
    _err().print(
        f"[bold red]error:[/] [red]{type(exc).__name__}: {escape(message)}[/]", soft_wrap=True
    )
    raise typer.Exit(1)


def _run(coro: Coroutine[Any, Any, None]) -> None:
    """Run one command's coroutine, turning signoff errors into one red line and exit 1."""
    try:
        asyncio.run(coro)
    except SignoffError as exc:
        _fail(exc)
    except KeyboardInterrupt:
        _err().print("[dim]interrupted[/]")
        raise typer.Exit(130) from None


def _version(value: bool) -> None:
    if value:
        from . import __version__

        typer.echo(f"signoff {__version__}")
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
    authenticator, sep, principal_id = value.partition(":")
    if not sep:
        authenticator, principal_id = "local", value
    if not authenticator or not principal_id:
        raise UsageError(f"--as takes AUTHENTICATOR:ID such as dev:dev or ID, not {value!r}")
    return Principal(authenticator=authenticator, principal_id=principal_id)


AsOption = Annotated[
    str | None,
    typer.Option(
        "--as",
        envvar="SIGNOFF_PRINCIPAL",
        help="Act as AUTHENTICATOR:ID (default: local:<your user name>). Requests may be "
        "answered only by the principal whose turn asked.",
        show_default=False,
    ),
]


def load_runtime(target: str, store: str | None = None) -> Runtime:
    """Import `MODULE:ATTRIBUTE` (a `Runtime` or an `Agent`); `store` replaces its store URL."""
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise UsageError(
            f"expected MODULE:ATTRIBUTE such as examples.support:runtime, got {target!r}"
        )
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)  # like `python -m`: modules of the current directory load
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (
            module_name == exc.name or module_name.startswith(exc.name + ".")
        ):
            raise UsageError(
                f"cannot import {module_name!r}: no such module in {cwd} or the installed packages"
            ) from None
        raise UsageError(f"importing {module_name!r} failed: {exc}") from exc
    except SignoffError:
        raise
    except Exception as exc:
        raise UsageError(f"importing {module_name!r} failed: {type(exc).__name__}: {exc}") from exc
    obj: Any = module
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UsageError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if callable(obj) and not isinstance(obj, (Agent, Runtime)):
        obj = obj()  # a factory: `def make_runtime() -> Runtime`
    if isinstance(obj, Agent):
        return Runtime([obj], store=store)
    if isinstance(obj, Runtime):
        if store is None:
            return obj
        return Runtime(
            list(obj.agents.values()),
            store=store,
            clock=obj.clock,
            lease_ttl=obj.lease_ttl,
            lease_wait=obj.lease_wait,
            poll_interval=obj.poll_interval,
        )
    raise UsageError(f"{target} is a {type(obj).__name__}, not a signoff Runtime or Agent")


def _pick_agent(runtime: Runtime, name: str | None) -> Agent:
    if name is not None:
        return runtime.agent(name)
    if len(runtime.agents) == 1:
        return next(iter(runtime.agents.values()))
    known = ", ".join(runtime.agents) or "none"
    raise UsageError(f"this runtime has several agents ({known}): choose one with --agent")


class _NoModel:
    """The model of an agent this process only settles answers for; it is never called."""

    def __init__(self, agent: str) -> None:
        self.agent = agent

    async def complete(self, request: ModelRequest) -> ModelResponse:
        raise ModelError(
            f"this process has no model for agent {self.agent!r}: pass MODULE:RUNTIME to resume"
        )


# -- chat -------------------------------------------------------------------------------------


class _Chat:
    """One terminal conversation with one agent: messages in, inline prompts, answers out."""

    def __init__(
        self, runtime: Runtime, agent: Agent, console: Console, principal: Principal
    ) -> None:
        self.runtime = runtime
        self.agent = agent
        self.console = console
        self.channel = TerminalChannel(console)
        self.principal = principal
        self.session_id: str | None = None
        self.seen = 0

    async def run(self, session_id: str | None) -> None:
        self.header()
        if session_id is not None and not await self.reopen(session_id):
            return
        while True:
            line = self.channel.read_message()
            if line is None or line in ("/exit", "/quit"):
                if line is None:
                    self.console.print()
                return
            if not line:
                continue
            try:
                with self.console.status(f"{self.agent.name} is working..."):
                    if line == "/retry" and self.session_id is not None:
                        result = await self.runtime.generate(session_id=self.session_id)
                    elif self.session_id is None:
                        result = await self.runtime.generate(
                            self.agent.name, line, auth=self.principal
                        )
                        self.session_id = result.session_id
                        self.console.print(f"[dim]session {result.session_id}[/]")
                    else:
                        result = await self.runtime.generate(
                            session_id=self.session_id, prompt=line, auth=self.principal
                        )
                if not await self.follow(result):
                    return
            except SignoffError as exc:
                self.console.print(f"[red]{type(exc).__name__}: {escape(str(exc))}[/]")

    def header(self) -> None:
        store = getattr(self.runtime.store, "url", type(self.runtime.store).__name__)
        self.console.print(
            f"[bold]signoff chat[/] · agent [bold cyan]{escape(self.agent.name)}[/] · "
            f"store {escape(store)}"
        )
        if isinstance(self.agent.model, Scripted):
            self.console.print(
                "[yellow]demo model:[/] Scripted: offline, scripted replies (no LLM is called)"
            )
        else:
            self.console.print(f"model: {escape(repr(self.agent.model))}")
        self.console.print(
            "[dim]Type a message; /retry resumes a failed turn; Ctrl-D or /exit leaves.[/]"
        )

    async def reopen(self, session_id: str) -> bool:
        """Pick up an existing session where it stands; False if the person left."""
        state = await self.runtime.state(session_id)
        if state.agent != self.agent.name:
            raise UsageError(f"session {session_id!r} belongs to agent {state.agent!r}")
        self.session_id = session_id
        self.seen = state.seq
        self.console.print(f"[dim]session {session_id} (resumed)[/]")
        turn = state.turn
        if turn is None or turn.status in ("completed", "cancelled"):
            return True
        if turn.status == "failed" and not turn.retryable:
            self.console.print(f"[red]the last turn failed: {escape(_error_text(turn.error))}[/]")
            return True
        with self.console.status(f"{self.agent.name} is working..."):
            result = await self.runtime.generate(session_id=session_id)
        return await self.follow(result)

    async def follow(self, result: GenerateResult) -> bool:
        """Answer the turn's requests inline until it ends; False if the person left."""
        answered: set[str] = set()
        while True:
            await self.trace(result.session_id)
            if result.status != "waiting" or not result.pending:
                break
            open_requests = [r for r in result.pending if r.id not in answered]
            if not open_requests:  # e.g. approvals=N: the others must answer now
                ids = ", ".join(r.id for r in result.pending)
                self.console.print(
                    f"[yellow]the turn waits for other people to answer {ids}[/]; "
                    f"`signoff chat ... --session {result.session_id}` continues it later"
                )
                return False
            request = open_requests[0]
            answer = self.channel.ask(request)
            if answer is None:
                later = (
                    f"`signoff approve {request.id}` or `signoff deny {request.id}`"
                    if request.kind == "tool-approval"
                    else f"`signoff answer {request.id} --option ID` or `--text TEXT`"
                )
                self.console.print(
                    f"\n[yellow]left {request.id} pending[/]; answer it later with {later}"
                )
                return False
            answered.add(request.id)
            try:
                with self.console.status(f"{self.agent.name} is working..."):
                    result = await self.runtime.respond(
                        result.session_id, [answer], principal=self.principal
                    )
            except NotAllowed as exc:
                self.console.print(f"[red]{type(exc).__name__}: {escape(str(exc))}[/]")
                self.console.print("[dim]answer as the asker with --as AUTHENTICATOR:ID[/]")
                return False
            except AnswerError as exc:  # someone else answered first, or it closed meanwhile
                self.console.print(f"[red]{type(exc).__name__}: {escape(str(exc))}[/]")
                result = await self.runtime.generate(session_id=result.session_id)
        self.report(result)
        return True

    async def trace(self, session_id: str) -> None:
        """Print what tools did since the last look, one dim line each."""
        async for event in self.runtime.events(session_id, after=self.seen, follow=False):
            self.seen = event.seq
            if event.type == "tool.completed":
                self.console.print(f"  [dim]{escape(_tool_line(event.data))}[/]")

    def report(self, result: GenerateResult) -> None:
        if result.status == "completed":
            self.console.print(f"[bold cyan]{escape(self.agent.name)}:[/] {escape(result.text)}")
        elif result.status == "failed":
            retry = " (type /retry to resume it)" if result.retryable else ""
            self.console.print(
                f"[red]the turn failed: {escape(_error_text(result.error))}{retry}[/]"
            )
        elif result.status == "running":
            self.console.print("[yellow]another process is running this session's turn[/]")
        elif result.status == "cancelled":
            self.console.print("[yellow]the turn was cancelled[/]")
        elif result.status == "waiting":
            self.console.print("[yellow]the turn is waiting[/]")


def _tool_line(data: dict[str, Any]) -> str:
    name, status, result = data.get("tool_name"), data.get("status"), data.get("result")
    if status == "denied":
        why = (result or {}).get("reason") if isinstance(result, dict) else None
        return f"{name} denied" + (f": {why}" if why else "")
    if status == "error":
        error = result.get("error") if isinstance(result, dict) else result
        return f"{name} failed: {_clip(str(error))}"
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
    return f"{name} -> {_clip(compact_json(result))}{extra}"


def _clip(text: str, width: int = 100) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _error_text(error: dict[str, Any] | None) -> str:
    if not error:
        return "unknown error"
    return str(error.get("message") or error.get("code") or error)


@app.command()
def chat(
    target: Annotated[
        str, typer.Argument(metavar="MODULE:RUNTIME", help="A Runtime or Agent to load.")
    ],
    agent: Annotated[
        str | None, typer.Option("--agent", help="Agent to talk to (if the runtime has several).")
    ] = None,
    session: Annotated[
        str | None, typer.Option("--session", help="Continue this session instead of a new one.")
    ] = None,
    store: Annotated[
        str | None,
        typer.Option(
            "--store", envvar="SIGNOFF_STORE", help="Store URL; replaces the runtime's own."
        ),
    ] = None,
    acting_as: AsOption = None,
) -> None:
    """Talk to an agent in the terminal; approvals are asked inline as `(y/N)` prompts."""

    async def go() -> None:
        principal = parse_principal(acting_as)
        runtime = load_runtime(target, store)
        picked = _pick_agent(runtime, agent)
        console = Console(highlight=False, soft_wrap=True)
        async with runtime:
            await _Chat(runtime, picked, console, principal).run(session)

    _run(go())


@app.command()
def serve(
    target: Annotated[
        str, typer.Argument(metavar="MODULE:RUNTIME", help="A Runtime or Agent to serve.")
    ],
    host: Annotated[str, typer.Option("--host", help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="TCP port.")] = 8000,
    token: Annotated[
        list[str] | None,
        typer.Option(
            "--token",
            envvar="SIGNOFF_TOKENS",
            help="API token as SECRET=PRINCIPAL_ID (repeatable). Without one: localhost dev mode.",
        ),
    ] = None,
    store: Annotated[
        str | None,
        typer.Option(
            "--store", envvar="SIGNOFF_STORE", help="Store URL; replaces the runtime's own."
        ),
    ] = None,
    webhook: Annotated[
        list[str] | None,
        typer.Option(
            "--webhook",
            help="POST signed request events to this http(s) URL (repeatable).",
        ),
    ] = None,
    webhook_secret: Annotated[
        str | None,
        typer.Option(
            "--webhook-secret",
            envvar="SIGNOFF_WEBHOOK_SECRET",
            help="Secret that signs webhook deliveries (Signoff-Signature).",
        ),
    ] = None,
    slack_channel: Annotated[
        str | None,
        typer.Option("--slack-channel", help="Post requests to this Slack channel id."),
    ] = None,
    slack_token: Annotated[
        str | None,
        typer.Option("--slack-token", envvar="SLACK_BOT_TOKEN", help="The Slack bot token."),
    ] = None,
    slack_signing_secret: Annotated[
        str | None,
        typer.Option(
            "--slack-signing-secret",
            envvar="SLACK_SIGNING_SECRET",
            help="The Slack app's signing secret (checks button clicks).",
        ),
    ] = None,
    channel_state: Annotated[
        str | None,
        typer.Option(
            "--channel-state",
            help="SQLite file keeping channel delivery positions across restarts "
            "(default: in memory, a restart starts at the end of the queue).",
        ),
    ] = None,
) -> None:
    """Serve the runtime over HTTP: REST under /v1, live events, the dashboard at /_signoff.

    With --webhook or --slack-channel the queue is also posted to those channels."""
    try:
        from .server import TokenAuth
        from .server import serve as run_server
    except ImportError as exc:
        _fail(
            UsageError(
                f"signoff serve needs the server extra: pip install 'signoff[server]' ({exc})"
            )
        )
    try:
        runtime = load_runtime(target, store)
        auth = None
        if token:
            principals: dict[str, Principal] = {}
            for item in token:
                secret, sep, who = item.partition("=")
                if not sep or not secret or not who:
                    raise UsageError(f"--token takes SECRET=PRINCIPAL_ID, not {item!r}")
                principals[secret] = Principal(authenticator="token", principal_id=who)
            auth = TokenAuth(principals)
        channels = _serve_channels(
            webhook, webhook_secret, slack_channel, slack_token, slack_signing_secret
        )
    except SignoffError as exc:
        _fail(exc)
    run_server(
        runtime, host=host, port=port, auth=auth, channels=channels, channel_state=channel_state
    )


def _serve_channels(
    webhooks: list[str] | None,
    webhook_secret: str | None,
    slack_channel: str | None,
    slack_token: str | None,
    slack_signing_secret: str | None,
) -> list[Any]:
    """The channels `serve` was asked for, each checked before the server starts."""
    channels: list[Any] = []
    if webhooks:
        if not webhook_secret:
            raise UsageError("--webhook needs --webhook-secret (or SIGNOFF_WEBHOOK_SECRET)")
        from .channels.webhooks import WebhookChannel

        channels.append(WebhookChannel(webhooks, webhook_secret))
    elif webhook_secret:
        raise UsageError("--webhook-secret is given but no --webhook URL")
    if slack_channel:
        if not slack_token or not slack_signing_secret:
            raise UsageError(
                "--slack-channel needs --slack-token and --slack-signing-secret "
                "(or SLACK_BOT_TOKEN and SLACK_SIGNING_SECRET)"
            )
        from .channels.slack import SlackChannel  # a UsageError with the install hint if missing

        channels.append(
            SlackChannel(slack_channel, token=slack_token, signing_secret=slack_signing_secret)
        )
    return channels


# -- the queue --------------------------------------------------------------------------------


@app.command()
def pending(
    store: StoreOption = None,
    agent: Annotated[str | None, typer.Option("--agent", help="Only this agent's.")] = None,
    tool: Annotated[str | None, typer.Option("--tool", help="Only approvals of this tool.")] = None,
    session: Annotated[str | None, typer.Option("--session", help="Only this session's.")] = None,
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=100_000, help="At most this many.")
    ] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List the open requests across sessions, oldest first."""

    async def go() -> None:
        async with Runtime([], store=store or DEFAULT_URL) as runtime:
            flt = PendingFilter(agent=agent, tool_name=tool, session_id=session, limit=limit)
            requests = await runtime.store.pending(flt)
            total = await runtime.store.count_pending(
                PendingFilter(agent=agent, tool_name=tool, session_id=session)
            )
        if as_json:
            typer.echo(json.dumps([r.model_dump(mode="json") for r in requests], indent=2))
            return
        console = _out()
        if not requests:
            console.print("No pending requests.")
            return
        console.print(_queue_table(requests, total))

    _run(go())


@app.command()
def sessions(
    store: StoreOption = None,
    agent: Annotated[str | None, typer.Option("--agent", help="Only this agent's.")] = None,
    status: Annotated[
        str | None,
        typer.Option("--status", help="idle, running, waiting, failed or cancelled."),
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=100_000, help="At most this many.")
    ] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List sessions, most recently active first."""

    async def go() -> None:
        async with Runtime([], store=store or DEFAULT_URL) as runtime:
            rows = await runtime.sessions(agent=agent, status=status, limit=limit)
        if as_json:
            typer.echo(json.dumps([dataclasses.asdict(r) for r in rows], indent=2))
            return
        console = _out()
        if not rows:
            console.print("No sessions.")
            return
        table = Table(title="Sessions", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        for column in ("Session", "Agent", "Status", "Events", "Last active"):
            table.add_column(column, no_wrap=True)
        for r in rows:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.updated_at))
            table.add_row(r.id, r.agent, r.status, str(r.head), when)
        console.print(table)

    _run(go())


def _queue_table(requests: list[InputRequest], total: int) -> Table:
    now = time.time()
    shown = f"{len(requests)} of {total}" if total > len(requests) else str(total)
    table = Table(
        title=f"Pending requests ({shown})",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    table.add_column("Request / session", no_wrap=True)
    table.add_column("Agent / asked by", no_wrap=True, max_width=22, overflow="ellipsis")
    table.add_column("Tool / age", no_wrap=True, max_width=24, overflow="ellipsis")
    table.add_column("Input", overflow="fold", ratio=1)
    for r in requests:
        what = r.tool_name or r.question or r.kind
        shown_input = r.payload if r.payload is not None else r.input
        readable = "" if shown_input is None else json.dumps(shown_input, ensure_ascii=False)
        if r.kind != "tool-approval" and r.question:
            choices = ", ".join(f"{o.id}={o.label}" for o in r.options)
            readable = r.question + (f" ({choices})" if choices else "")
            readable += " or free text" if r.allow_text else ""
        asker = r.requested_by.principal_id if r.requested_by else "-"
        expiry = "" if r.expires_at is None else f"\nexpires in {duration(r.expires_at - now)}"
        table.add_row(
            f"{r.id}\n[dim]{r.session_id}[/]",
            f"{escape(r.agent)}\n[dim]{escape(asker)}[/]",
            f"{escape(what)}\n[dim]{duration(now - r.created_at)} ago{expiry}[/]",
            escape(_clip(readable, 200)),
        )
    return table


def _unknown_request(request_id: str, where: str) -> UnknownRequest:
    exc = UnknownRequest.__new__(UnknownRequest)
    AnswerError.__init__(exc, f"no request {request_id!r} in {where}", [request_id])
    return exc


async def _settle(
    request_id: str,
    answer: InputResponse,
    target: str | None,
    store: str | None,
    acting_as: str | None,
) -> None:
    """Answer one request by id: record it, and continue the turn here if a runtime is given."""
    principal = parse_principal(acting_as)
    loaded = load_runtime(target, store) if target else None
    console = _out()
    async with loaded or Runtime([], store=store or DEFAULT_URL) as runtime:
        stored = await runtime.store.get_request(request_id)
        if stored is None:
            raise _unknown_request(request_id, runtime.store.url)
        request = stored.request
        if loaded is None:
            # Record only: a process running the agent continues the turn later.
            settler = Runtime(
                [Agent(name=request.agent, model=_NoModel(request.agent))], store=runtime.store
            )
            result = await settler.respond(
                request.session_id, [answer], principal=principal, resume=False
            )
        else:
            with console.status("resuming the turn..."):
                result = await runtime.respond(request.session_id, [answer], principal=principal)
    outcome = result.outcomes[0] if result.outcomes else None
    what = request.tool_name or request.question or request.kind
    where = f"({escape(what)} in session {request.session_id})"
    if outcome is not None and not outcome.applied:
        console.print(f"{request_id} was already {outcome.outcome}; nothing changed.")
    elif answer.option_id == "approve" and request.kind == "tool-approval":
        console.print(f"[green]approved[/] {request_id} {where}")
    elif answer.option_id == "cancel" and request.kind == "tool-approval":
        console.print(f"[red]denied[/] {request_id} {where}")
    else:
        given = answer.option_id if answer.option_id is not None else compact_json(answer.text)
        console.print(f"[green]answered[/] {request_id} with {escape(given)} {where}")
    if result.status == "waiting" and result.pending:
        ids = ", ".join(r.id for r in result.pending)
        console.print(f"[yellow]the turn still waits on: {ids}[/]")
    elif loaded is None:
        console.print(
            f"[dim]The turn continues when a process running agent {escape(request.agent)!r} "
            f"picks it up, e.g. signoff chat MODULE:RUNTIME --session {request.session_id}[/]"
        )
    elif result.status == "completed":
        console.print(f"[bold cyan]{escape(request.agent)}:[/] {escape(result.text)}")
    elif result.status == "failed":
        console.print(f"[red]the turn failed: {escape(_error_text(result.error))}[/]")
    elif result.status == "running":
        console.print("[yellow]another process is running this session's turn[/]")


TargetArgument = Annotated[
    str | None,
    typer.Argument(
        metavar="MODULE:RUNTIME",
        help="Load this runtime to continue the turn here; otherwise only record the answer.",
    ),
]


@app.command()
def approve(
    request_id: Annotated[str, typer.Argument(metavar="REQUEST_ID")],
    target: TargetArgument = None,
    reason: Annotated[str | None, typer.Option("--reason", help="Why (recorded).")] = None,
    store: StoreOption = None,
    acting_as: AsOption = None,
) -> None:
    """Approve a pending request."""
    answer = InputResponse(request_id=request_id, option_id="approve", text=reason)
    _run(_settle(request_id, answer, target, store, acting_as))


@app.command()
def deny(
    request_id: Annotated[str, typer.Argument(metavar="REQUEST_ID")],
    target: TargetArgument = None,
    reason: Annotated[str | None, typer.Option("--reason", help="Why; the model reads it.")] = None,
    store: StoreOption = None,
    acting_as: AsOption = None,
) -> None:
    """Deny a pending request; the call never runs and the model reads the reason."""
    answer = InputResponse(request_id=request_id, option_id="cancel", text=reason)
    _run(_settle(request_id, answer, target, store, acting_as))


@app.command()
def answer(
    request_id: Annotated[str, typer.Argument(metavar="REQUEST_ID")],
    target: TargetArgument = None,
    option: Annotated[
        str | None, typer.Option("--option", help="The id of the chosen option.")
    ] = None,
    text: Annotated[
        str | None, typer.Option("--text", help="A free-text answer (if the question takes one).")
    ] = None,
    store: StoreOption = None,
    acting_as: AsOption = None,
) -> None:
    """Answer a question: choose an option by id, or give free text."""
    if (option is None) == (text is None):
        _fail(UsageError("answer takes exactly one of --option ID or --text TEXT"))
    response = InputResponse(request_id=request_id, option_id=option, text=text)
    _run(_settle(request_id, response, target, store, acting_as))


# -- the log ----------------------------------------------------------------------------------


def _summary(event: Event) -> str:
    d = event.data
    t = event.type
    if t == "session.created":
        return f"agent={d.get('agent')}"
    if t == "turn.started":
        return compact_json(d.get("message"))
    if t == "model.completed":
        calls = [f"{c['name']}({compact_json(c.get('input'))})" for c in d.get("tool_calls", [])]
        parts = ([compact_json(d["text"])] if d.get("text") else []) + calls
        return "; ".join(parts)
    if t == "turn.message":
        queued = " (queued)" if d.get("queued") else ""
        return compact_json(d.get("message")) + queued
    if t == "tool.started":
        return str(d.get("tool_name"))
    if t == "tool.step":
        return f"{d.get('tool_name')} step {d.get('name')} -> {compact_json(d.get('result'))}"
    if t == "approval.candidate":
        by = (d.get("by") or {}).get("principal_id", "-")
        return f"{d.get('request_id')} {d.get('decision')} by {by}: {d.get('outcome')}"
    if t == "tool.completed":
        return _tool_line(d)
    if t == "input.requested":
        return ", ".join(
            f"{r['id']} ({(r.get('action') or {}).get('tool_name') or r.get('kind')})"
            for r in d.get("requests", [])
        )
    if t == "turn.waiting":
        return f"on {d.get('on')}: {', '.join(d.get('request_ids', []))}"
    if t == "approval.settled":
        by = (d.get("by") or {}).get("principal_id", "-")
        why = f" ({d['reason']})" if d.get("reason") else ""
        return f"{d.get('request_id')} {d.get('decision')} by {by}{why}"
    if t == "input.resolved":
        return f"{d.get('request_id')} {d.get('outcome')}"
    if t == "turn.completed":
        return str(d.get("text", ""))  # the answer is the model.completed line before it
    if t == "turn.failed":
        retry = " (retryable)" if d.get("retryable") else ""
        return _error_text(d.get("error")) + retry
    if t == "turn.cancelled":
        return str(d.get("reason") or "")
    return ""


@app.command()
def events(
    session_id: Annotated[str, typer.Argument(metavar="SESSION_ID")],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new events (Ctrl-C stops).")
    ] = False,
    after: Annotated[
        int, typer.Option("--after", min=0, max=2**63 - 1, help="Start after this seq.")
    ] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    store: StoreOption = None,
) -> None:
    """Print a session's event log."""

    async def go() -> None:
        console = _out()
        async with Runtime([], store=store or DEFAULT_URL) as runtime:
            async for event in runtime.events(session_id, after, follow=follow):
                if as_json:
                    typer.echo(json.dumps(event.to_dict(), ensure_ascii=False))
                    continue
                at = datetime.fromtimestamp(event.at).strftime("%H:%M:%S")
                console.print(
                    f"{event.seq:>4}  [dim]{at}[/]  [bold]{event.type:<18}[/] "
                    f"{escape(_clip(_summary(event), 160))}",
                    soft_wrap=True,
                )
                if follow:
                    sys.stdout.flush()

    try:
        _run(go())
    except typer.Exit as exit_:
        if follow and exit_.exit_code == 130:
            raise typer.Exit(0) from None
        raise


# -- workers and the database -------------------------------------------------------------------


@app.command()
def worker(
    target: Annotated[
        str, typer.Argument(metavar="MODULE:RUNTIME", help="A Runtime or Agent whose turns to run.")
    ],
    store: Annotated[
        str | None,
        typer.Option(
            "--store", envvar="SIGNOFF_STORE", help="Store URL; replaces the runtime's own."
        ),
    ] = None,
    concurrency: Annotated[
        int,
        typer.Option("--concurrency", min=1, max=100_000, help="Turns driven at once."),
    ] = 16,
    lease_ttl: Annotated[
        float | None,
        typer.Option(
            "--lease-ttl",
            min=0.1,
            max=86_400,
            help="Seconds a claimed session stays ours without renewal (default: the runtime's).",
            show_default=False,
        ),
    ] = None,
    idle_wait: Annotated[
        float,
        typer.Option("--idle-wait", min=0.01, max=60, help="Longest sleep between claims."),
    ] = 0.5,
    sweep_every: Annotated[
        float,
        typer.Option("--sweep-every", min=0.1, max=3600, help="Seconds between deadline sweeps."),
    ] = 5.0,
) -> None:
    """Run turns only (no HTTP): claim sessions that have work under a lease and drive them.

    SIGTERM or Ctrl-C stops it gracefully (turns in flight finish or park; a second signal
    stops at once, leaving the leases to expire).
    """
    import logging
    import re
    import signal

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("signoff")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    log = logging.getLogger("signoff.worker")

    async def go() -> None:
        loaded = load_runtime(target, store)
        runtime = Runtime(
            list(loaded.agents.values()),
            store=loaded.store,
            clock=loaded.clock,
            lease_ttl=loaded.lease_ttl if lease_ttl is None else lease_ttl,
            lease_wait=loaded.lease_wait,
            poll_interval=loaded.poll_interval,
            inline=False,  # expired deadlines only make sessions runnable; claims drive them
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        main = asyncio.current_task()
        signals = 0

        def on_signal(signum: int) -> None:
            nonlocal signals
            signals += 1
            if signals == 1:
                log.info("%s: stopping after the running turns", signal.Signals(signum).name)
                stop.set()
            elif main is not None:
                log.warning("%s again: stopping now", signal.Signals(signum).name)
                main.cancel()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
        async with runtime:
            log.info(
                "worker %s on %s, concurrency %d, lease %.1fs",
                runtime.owner,
                re.sub(r"//([^:/@]*):[^@/]*@", r"//\1:***@", runtime.store.url),
                concurrency,
                runtime.lease_ttl,
            )
            await runtime.work(
                concurrency=concurrency, stop=stop, idle_wait=idle_wait, sweep_every=sweep_every
            )
        log.info("worker stopped")

    try:
        _run(go())
    except asyncio.CancelledError:
        raise typer.Exit(130) from None


db_app = typer.Typer(help="Manage the store's schema.", no_args_is_help=True)
app.add_typer(db_app, name="db")


@db_app.command("upgrade")
def db_upgrade(store: StoreOption = None) -> None:
    """Create or migrate the store's schema to this signoff's version (PostgreSQL or SQLite)."""

    async def go() -> None:
        url = store or DEFAULT_URL
        if url.startswith(("postgresql://", "postgres://")):
            try:
                from .stores.postgres import PostgresStore
            except ImportError as exc:
                raise UsageError(
                    "PostgreSQL support needs the extra: pip install 'signoff[postgres]'"
                ) from exc
            before, after = await PostgresStore(url, migrate=False).migrate()
            if before == after:
                typer.echo(f"schema is up to date (version {after})")
            else:
                typer.echo(f"schema upgraded from version {before} to {after}")
            return
        async with Runtime([], store=url) as runtime:  # SQLite creates its schema on open
            typer.echo(f"schema is up to date ({runtime.store.url})")

    _run(go())
