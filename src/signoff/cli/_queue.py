"""`signoff pending`, `sessions`, `approve`, `deny`, `answer`: the queue and its answers."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import shlex
import time
from collections.abc import Sequence
from typing import Annotated, NoReturn

import typer
from rich import box
from rich.table import Table

from .._agent import Agent
from .._audit_trail import response_policy_recorded
from .._eligibility import refusal
from .._exceptions import (
    AnswerError,
    InvalidAnswer,
    SignoffError,
    UnknownRequest,
    UnknownSession,
    UsageError,
)
from .._queue_page import counted_page, readable_pending
from .._runtime import Runtime
from .._session_page import session_page, shown_total
from .._text import HIDDEN, escape_as_json
from .._types import InputRequest, InputResponse
from .._unlisted import unlisted
from ..channels.terminal import compact_json, duration, printable
from ..stores import PendingFilter, SessionSummary, SQLiteStore
from ._app import (
    AsOption,
    NoModel,
    RuntimeArgument,
    StoreOption,
    answer_flags,
    app,
    clip,
    ctrl_c_interrupts,
    driving,
    err,
    error_text,
    misuse,
    out,
    parse_principal,
    refuse_empty_filters,
    refuse_empty_ids,
    refuse_undecodable,
    run,
    say_cut,
    shown_of,
    shown_store,
    store_args,
    store_of,
)
from ._asker import answering, as_hint
from ._loading import load_runtime, split_target
from ._numbers import whole
from ._store_files import existing_store, reading_store, refuse_unmade_schema
from ._tables import cell, fit, print_table
from ._unanswerable import unanswerable

LIMIT = whole(1, 100_000)
OFFSET = whole(0, 2**63 - 1)  # as `Runtime.pending` and `Runtime.sessions` take it
OffsetOption = Annotated[
    int,
    typer.Option(
        "--offset",
        metavar="N",
        parser=OFFSET,
        help=f"Skip this many first, to page on ({OFFSET.range}).",
    ),
]


@app.command()
def pending(
    target: RuntimeArgument = None,
    store: StoreOption = None,
    agent: Annotated[
        str | None, typer.Option("--agent", metavar="NAME", help="Only this agent's.")
    ] = None,
    tool: Annotated[
        str | None, typer.Option("--tool", metavar="NAME", help="Only approvals of this tool.")
    ] = None,
    session: Annotated[
        str | None, typer.Option("--session", metavar="SESSION_ID", help="Only this session's.")
    ] = None,
    limit: Annotated[
        int,
        typer.Option(
            "--limit", metavar="N", parser=LIMIT, help=f"At most this many ({LIMIT.range})."
        ),
    ] = 100,
    offset: OffsetOption = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List the open requests across sessions, oldest first.

    --offset skips that many of them, to page through the rest. When --limit or --offset leaves
    some out, a line on stderr says which were shown of how many (the JSON keeps its shape)."""

    async def go() -> None:
        with misuse():
            refuse_undecodable({"--agent": agent, "--tool": tool, "--session": session})
            refuse_empty_filters({"--agent": agent, "--tool": tool, "--session": session})
        async with Runtime([], store=reading_store(store_of(target, store))) as runtime:
            # Like `Runtime.pending`: what can no longer be answered (a session past its TTL, a
            # request past its deadline, a mirror of one) is left out, and so from the total.
            now = runtime.now()
            flt = PendingFilter(
                agent=agent,
                tool_name=tool,
                session_id=session,
                live_at=now,
                limit=limit,
                offset=offset,
            )
            read = functools.partial(readable_pending, runtime.store)  # a damaged row left out
            hidden = await unlisted(runtime.store, flt, now, read)
            flt = dataclasses.replace(flt, excluded=tuple(hidden))
            requests, more, counted = await counted_page(runtime, flt)  # of one snapshot
            # At least those up to the page's end; a page short of the limit ends the listing.
            total = offset + len(requests) if requests else 0
            if more or (offset and not requests):  # cut, or past the end (as the API's total)
                total = max(counted, total)
            if session is not None and not requests and await runtime.store.head(session) is None:
                raise UnknownSession(session)  # a mistyped id, not a session with none open
        with ctrl_c_interrupts():  # a long table takes seconds to lay out, and never awaits
            _print_queue(requests, total, offset, now, as_json)

    run(go())


SESSION_STATUSES = ("idle", "running", "waiting", "failed", "cancelled")


@app.command()
def sessions(
    target: RuntimeArgument = None,
    store: StoreOption = None,
    agent: Annotated[
        str | None, typer.Option("--agent", metavar="NAME", help="Only this agent's.")
    ] = None,
    status: Annotated[
        str | None,
        typer.Option(
            "--status", metavar="STATUS", help="idle, running, waiting, failed or cancelled."
        ),
    ] = None,
    limit: Annotated[
        int,
        typer.Option(
            "--limit", metavar="N", parser=LIMIT, help=f"At most this many ({LIMIT.range})."
        ),
    ] = 50,
    offset: OffsetOption = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List sessions, most recently active first.

    --offset skips that many of them, to page through the rest. When --limit or --offset leaves
    some out, a line on stderr says which were shown of how many (the JSON keeps its shape)."""
    with misuse():
        refuse_undecodable({"--agent": agent})
        refuse_empty_filters({"--agent": agent})
        if status is not None and status not in SESSION_STATUSES:
            raise UsageError(f"--status takes one of {', '.join(SESSION_STATUSES)}, not {status!r}")

    async def go() -> None:
        async with Runtime([], store=reading_store(store_of(target, store))) as runtime:
            now = runtime.now()
            probes: dict[str, bool] = {}  # lease probes of the page, which the total reuses
            rows = await session_page(runtime, agent, status, limit + 1, offset, now, probes)
            # At least those up to the page's end; a page short of the limit ends the listing.
            total = offset + len(rows) if rows else 0
            if len(rows) > limit or (offset and not rows):  # cut, or past the end
                rows = rows[:limit]
                # counted as the page lists them: one a passed TTL left unrecorded as `failed`
                counted = await shown_total(runtime, agent, status, now, probes)
                total = max(counted, total)  # a session created since the page
        with ctrl_c_interrupts():  # a long table takes seconds to lay out, and never awaits
            _print_sessions(rows, total, offset, as_json)

    run(go())


def _print_sessions(rows: list[SessionSummary], total: int, offset: int, as_json: bool) -> None:
    """`signoff sessions`' output: `rows`, of `total` sessions, from the `offset`th."""
    say_cut(len(rows), total, offset)
    if as_json:
        typer.echo(json.dumps([dataclasses.asdict(r) for r in rows], indent=2))
        return
    console = out()
    if not rows:
        console.print(
            f"No sessions past the first {total}." if offset and total else "No sessions."
        )
        return
    table = Table(
        title=f"Sessions ({shown_of(len(rows), total, offset)})",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        show_edge=False,
    )
    for column in ("Session", "Agent", "Status", "Events", "Last active"):
        table.add_column(column, no_wrap=True, overflow="ellipsis")
    for r in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.updated_at))
        table.add_row(cell(r.id), cell(r.agent), cell(r.status), cell(str(r.head)), cell(when))
    print_table(console, table, fit(console, table, give_way=1))  # cut the agent's name


def _print_queue(
    requests: list[InputRequest], total: int, offset: int, now: float, as_json: bool
) -> None:
    """`signoff pending`'s output: `requests`, of `total` open ones from the `offset`th, their
    ages as of `now`."""
    say_cut(len(requests), total, offset)
    if as_json:
        typer.echo(json.dumps([r.model_dump(mode="json") for r in requests], indent=2))
        return
    console = out()
    if not requests:
        console.print(
            f"No pending requests past the first {total}."
            if offset and total
            else "No pending requests."
        )
        return
    table, cut = _queue_table(requests, total, offset, now)
    print_table(console, table, fit(console, table))
    if cut:
        console.print(
            f"Inputs and questions are cut at {_SHOWN} characters: --json shows them whole."
        )


_SHOWN = 200  # characters of a request's input or question in the queue's table


def _queue_table(
    requests: list[InputRequest], total: int, offset: int, now: float
) -> tuple[Table, bool]:
    """The queue as a table, its ages and deadlines as of `now`: the runtime's clock, which
    stamped and judges them (on PostgreSQL the database's, whatever this machine's says); and
    whether an input or a question in it is cut."""
    cut = False
    table = Table(
        title=f"Pending requests ({shown_of(len(requests), total, offset)})",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    ids = max(len(i) for r in requests for i in (r.id, r.session_id))
    table.add_column("Request / session", no_wrap=True, min_width=ids)  # whole: people copy them
    table.add_column("Agent / asked by", no_wrap=True, max_width=22, overflow="ellipsis")
    table.add_column("Tool / age", no_wrap=True, max_width=24, overflow="ellipsis")
    table.add_column("Input", overflow="fold", ratio=1)
    for r in requests:
        what = r.tool_name or r.question or r.kind
        shown_input = r.payload if r.payload is not None else r.input
        readable = "" if shown_input is None else json.dumps(shown_input, ensure_ascii=False)
        readable = HIDDEN.sub(escape_as_json, readable)  # what runs, as `compact_json` shows it
        if r.kind != "tool-approval" and r.question:
            choices = ", ".join(f"{o.id}={o.label}" for o in r.options)
            readable = r.question + (f" ({choices})" if choices else "")
            readable += " or free text" if r.allow_text else ""
        # as `--as` takes it: `ops` alone would read as `local:ops`, whom the answer refuses
        who = r.requested_by
        asker = f"{who.authenticator}:{who.principal_id}" if who else "-"
        expiry = "" if r.expires_at is None else f"\nexpires in {duration(r.expires_at - now)}"
        table.add_row(
            cell(r.id, "\n", (r.session_id, "dim")),
            cell(r.agent, "\n", (asker, "dim")),
            cell(what, "\n", (f"{duration(now - r.created_at)} ago{expiry}", "dim")),
            cell(clip(readable, _SHOWN)),
        )
        cut = cut or len(readable) > _SHOWN
    return table, cut


def _unknown_request(request_id: str, where: str) -> UnknownRequest:
    exc = UnknownRequest.__new__(UnknownRequest)
    AnswerError.__init__(exc, f"no request {request_id!r} in {where}", [request_id])
    return exc


_SETTLED = frozenset({"approved", "cancelled", "answered"})


def _wrong_kind(
    command: str, request: InputRequest, answer: InputResponse, where: Sequence[str]
) -> InvalidAnswer | None:
    """An answer of the wrong kind, refused naming the command that answers `request`, to run
    as printed (`where`: the MODULE:RUNTIME, `--store` and `--as` typed): a decision answers
    approvals only (`check_decided`), not a question whose options happen to be `approve` and
    `cancel` (with `--reason` it failed in the API's terms); `answer` with text or a question's
    option decides no approval (the engine's refusal names `option_id`)."""
    rid = shlex.join([request.id, *where])
    if command in ("approve", "deny") and request.kind != "tool-approval":
        what = request.question or request.kind
        return InvalidAnswer(
            f"{request.id} is a {request.kind} ({what}), not an approval: "
            f"signoff answer {rid} {' or '.join(answer_flags(request))}",
            [request.id],
        )
    if request.kind == "tool-approval" and answer.option_id not in ("approve", "cancel"):
        return InvalidAnswer(
            f"{request.id} is an approval ({request.tool_name}), not a question: "
            f"signoff approve {rid} or signoff deny {rid}",
            [request.id],
        )
    return None


async def _settle(
    command: str,
    request_id: str,
    answer: InputResponse,
    target: str | None,
    store: str | None,
    acting_as: str | None,
) -> None:
    """Answer one request by id: record it, and continue the turn here if a runtime is given."""
    with misuse():
        text_option = "--text" if command == "answer" else "--reason"
        refuse_undecodable(
            {"REQUEST_ID": request_id, "--option": answer.option_id, text_option: answer.text}
        )
        refuse_empty_ids({"REQUEST_ID": request_id})
        principal = parse_principal(acting_as)
        if target:
            split_target(target)
    loaded = driving(load_runtime(target, store)) if target else None
    if loaded is not None and isinstance(loaded.store, SQLiteStore):
        existing_store(loaded.store.url)  # a mistyped path is refused, not created empty
    url = existing_store(store) if loaded is None else None
    # nor a PostgreSQL database (or `?schema=`) with no signoff schema given one
    await refuse_unmade_schema(loaded.store if loaded is not None else str(url))
    console = out()
    async with loaded or Runtime([], store=url) as runtime:
        stored = await runtime.store.get_request(request_id)
        if stored is None:
            raise _unknown_request(request_id, shown_store(runtime.store.url))
        request = stored.request
        # Who may not answer it is told to run as the asker what answers it: what was typed,
        # with its flag, where the request takes it, on this runtime and store (a runtime's
        # own store is not named: its URL, password masked, would not open it); so too in
        # the `signoff chat` printed to continue the turn.
        if target:
            on_store = store_args(store) if store else []
        else:
            on_store = store_args(runtime.store.url)
        runs_on = [target, *on_store] if target else on_store
        as_typed = [] if acting_as is None else ["--as", acting_as]
        wrong = _wrong_kind(command, request, answer, [*runs_on, *as_typed])
        # Told only to who may answer it: the runtime refuses anyone else, as for any answer.
        # And only while it can be answered: else the command named would be refused in turn.
        if (
            wrong is not None
            and await refusal(runtime.agents, runtime.store, request, principal) is None
        ):
            raise await unanswerable(runtime, stored) or wrong
        on = "".join(f" {shlex.quote(arg)}" for arg in on_store)
        hinted = answering(command, request, None if wrong is not None else answer, runs_on)
        if loaded is None and (
            request.response_policy or await response_policy_recorded(runtime.store, request)
        ):
            raise UsageError(
                f"{request.tool_name} has a response policy that decides who may answer, and only "
                f"its runtime can run it: signoff {command} {request_id} MODULE:RUNTIME"
            )
        ran = False  # whether this command ran the turn on (only with a runtime)
        if loaded is None:
            # Record only: a process running the agent continues the turn later. A subagent's
            # mirror is settled in the child session (and its child's): their agents too.
            names = [request.agent]
            ref, seen = request.child, set()
            while ref is not None and ref.request_id not in seen:
                seen.add(ref.request_id)
                names.append(ref.agent)
                down = await runtime.store.get_request(ref.request_id)
                ref = None if down is None else down.request.child
            agents = [Agent(name=n, model=NoModel(n)) for n in dict.fromkeys(names)]
            settler = Runtime(agents, store=runtime.store)
            try:
                with as_hint(hinted, request, principal):
                    result = await settler.respond(
                        request.session_id, [answer], principal=principal, resume=False
                    )
            except asyncio.CancelledError:  # Ctrl-C: say whether the answer stands
                await _interrupted(runtime, request, None, on)
        else:
            head = await runtime.store.head(request.session_id)
            try:
                with console.status("resuming the turn..."), as_hint(hinted, request, principal):
                    result = await runtime.respond(
                        request.session_id, [answer], principal=principal
                    )
            except asyncio.CancelledError:  # Ctrl-C: say whether the answer stands
                await _interrupted(runtime, request, target, on)
            ran = await runtime.store.head(request.session_id) != head
    outcome = result.outcomes[0] if result.outcomes else None
    what = request.tool_name or request.question or request.kind
    where = f"({printable(what)} in session {request.session_id})"
    if outcome is not None and outcome.outcome == "counted":
        if outcome.applied:
            console.print(f"[green]counted[/] your approval of {request_id} ({outcome.reason})")
        else:
            console.print(f"You approved {request_id} before ({outcome.reason}); nothing changed.")
    elif outcome is not None and not outcome.applied and outcome.outcome in _SETTLED:
        console.print(f"{request_id} was already {outcome.outcome}; nothing changed.")
    elif outcome is not None and not outcome.applied:  # the response policy refused it
        # Not "it stays pending": one who may not answer is refused alike once it closed.
        why = f": {outcome.reason}" if outcome.reason else ""
        err().print(
            f"[bold red]error:[/] [red]{request_id}: your answer was not accepted "
            f"({printable(outcome.outcome + why)})[/]",
            soft_wrap=True,
        )
        raise typer.Exit(1)
    elif answer.option_id == "approve" and request.kind == "tool-approval":
        console.print(f"[green]approved[/] {request_id} {where}")
    elif answer.option_id == "cancel" and request.kind == "tool-approval":
        console.print(f"[red]denied[/] {request_id} {where}")
    else:
        given = answer.option_id if answer.option_id is not None else compact_json(answer.text)
        console.print(f"[green]answered[/] {request_id} with {printable(given)} {where}")
    if result.pending:  # `running` too: an approved call can run while another still waits
        ids = ", ".join(r.id for r in result.pending)
        console.print(f"[yellow]the turn still waits on: {ids}[/]")
    elif not ran and (
        result.status in ("completed", "cancelled")
        or (result.status == "failed" and not result.retryable)
    ):  # answered before, and its turn went on to end: nothing is left to run or show anew
        console.print(f"[dim]its turn has ended ({result.status})[/]")
    elif loaded is None:
        name = printable(repr(request.agent))  # quoted, then escaped: never read as markup
        console.print(
            f"[dim]The turn continues when a process running agent {name} "
            "picks it up: a signoff worker or signoff serve of its runtime does so by itself, "
            f"or signoff chat MODULE:RUNTIME --session {request.session_id}"
            f"{printable(on)}[/]"
        )
    elif result.status == "completed":
        console.print(f"[bold cyan]{printable(request.agent)}:[/] {printable(result.text)}")
    elif result.status == "failed":  # the answer stands; the run this command went on to fails
        resume = (
            f"; it resumes with signoff chat {shlex.quote(target or '')} "
            f"--session {request.session_id}{on}"
            if result.retryable
            else ""
        )
        err().print(
            "[bold red]error:[/] "
            f"[red]the turn failed: {printable(error_text(result.error) + resume)}[/]",
            soft_wrap=True,
        )
        raise typer.Exit(1)
    elif result.status == "running":
        console.print("[yellow]another process is running this session's turn[/]")
    elif result.status == "cancelled":  # by another process, or the session's TTL, meanwhile
        console.print("[yellow]the turn was cancelled[/]")
    else:  # `waiting` on nothing this command can name, `idle`: said, never left unsaid
        console.print(f"[dim]its turn is {result.status}[/]")


async def _interrupted(
    runtime: Runtime, request: InputRequest, target: str | None, on: str
) -> NoReturn:
    """Ctrl-C while the command recorded the answer or ran the turn on (`target`, its runtime):
    whether the answer was recorded before, as a bare "interrupted" left the person to find out,
    and how the turn goes on, in a `signoff chat` naming the store as typed (`on`: its
    arguments); exit 130, also when the store fails to tell."""
    try:
        async with asyncio.timeout(_TELL_WITHIN):  # a Ctrl-C is not to wait on a pool's timeout
            stored = await runtime.store.get_request(request.id)
    except (SignoffError, TimeoutError) as exc:
        why = "did not answer" if isinstance(exc, TimeoutError) else "failed"
        message = " ".join(str(exc).split()) or "(no message)"
        say = (
            f"interrupted: whether {request.id} was recorded is unknown, as the store {why}: "
            f"{type(exc).__name__}: {message}; signoff pending shows it while it is still open"
        )
    else:
        if stored is None or stored.status == "pending":
            say = f"interrupted: {request.id} is still pending"
        elif target is None:  # only recorded, as without a runtime the command does
            say = (
                f"interrupted: {request.id} is {stored.outcome or stored.status}, recorded; the "
                f"turn continues when a process running agent {request.agent!r} picks it up: a "
                "signoff worker or signoff serve of its runtime does so by itself, or signoff "
                f"chat MODULE:RUNTIME --session {request.session_id}{on}"
            )
        else:
            say = (
                f"interrupted: {request.id} is {stored.outcome or stored.status}, recorded; its "
                "turn stopped here and goes on in a signoff worker or serve of its runtime, or "
                f"with signoff chat {shlex.quote(target)} --session {request.session_id}{on}"
            )
    err().print(printable(say), soft_wrap=True)
    raise typer.Exit(130)


_TELL_WITHIN = 5.0
"""Seconds the Ctrl-C handler waits on the store to tell whether the answer was recorded."""


TargetArgument = Annotated[
    str | None,
    typer.Argument(
        metavar="MODULE:RUNTIME",
        help="Load this runtime to continue the turn here; otherwise only record the answer.",
    ),
]


RequestArgument = Annotated[
    str,
    typer.Argument(
        metavar="REQUEST_ID",
        help="The request's id (req_...), as 'signoff pending' lists it.",
        show_default=False,
    ),
]


@app.command()
def approve(
    request_id: RequestArgument,
    target: TargetArgument = None,
    reason: Annotated[
        str | None, typer.Option("--reason", metavar="TEXT", help="Why (recorded).")
    ] = None,
    store: StoreOption = None,
    acting_as: AsOption = None,
) -> None:
    """Approve a pending tool call.

    A question is answered with `signoff answer`."""
    answer = InputResponse(request_id=request_id, option_id="approve", text=reason)
    run(_settle("approve", request_id, answer, target, store, acting_as))


@app.command()
def deny(
    request_id: RequestArgument,
    target: TargetArgument = None,
    reason: Annotated[
        str | None, typer.Option("--reason", metavar="TEXT", help="Why; the model reads it.")
    ] = None,
    store: StoreOption = None,
    acting_as: AsOption = None,
) -> None:
    """Deny a pending tool call; the call never runs and the model reads the reason.

    A question is answered with `signoff answer`."""
    answer = InputResponse(request_id=request_id, option_id="cancel", text=reason)
    run(_settle("deny", request_id, answer, target, store, acting_as))


@app.command()
def answer(
    request_id: RequestArgument,
    target: TargetArgument = None,
    option: Annotated[
        str | None, typer.Option("--option", metavar="ID", help="The id of the chosen option.")
    ] = None,
    text: Annotated[
        str | None,
        typer.Option(
            "--text", metavar="TEXT", help="A free-text answer (if the question takes one)."
        ),
    ] = None,
    store: StoreOption = None,
    acting_as: AsOption = None,
) -> None:
    """Answer a question: choose an option by id, or give free text."""
    if (option is None) == (text is None):
        with misuse():
            raise UsageError("answer takes exactly one of --option ID or --text TEXT")
    response = InputResponse(request_id=request_id, option_id=option, text=text)
    run(_settle("answer", request_id, response, target, store, acting_as))
