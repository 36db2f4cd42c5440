"""`signoff delete`: erase a finished session and its subagents' sessions from the store, as
`Runtime.delete_session` does, after asking at the terminal (or with `--yes`); a store of an
older schema is refused, not upgraded before the answer."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Annotated

import typer

from .._exceptions import StoreBusy, StoreError, StoreUnavailable, UsageError
from .._option_names import folded
from .._runtime import Runtime
from .._text import is_utf8
from .._types import Principal
from ..channels.terminal import TerminalChannel, printable
from ..stores import SQLiteStore
from ._app import (
    RuntimeArgument,
    SessionArgument,
    StoreOption,
    app,
    as_option,
    ctrl_c_interrupts,
    misuse,
    out,
    parse_principal,
    refuse_empty_ids,
    refuse_undecodable,
    run,
)
from ._loading import load_runtime, split_target
from ._store_files import existing_store, reading_store, refuse_unmade_schema

__all__ = ["delete", "store_runtime"]

DeleterOption = Annotated[
    str | None,
    as_option("Who deletes it, as the audit trail records (default: local:<your user name>)."),
]


@app.command()
def delete(
    session_id: SessionArgument,
    target: RuntimeArgument = None,
    reason: Annotated[
        str | None,
        typer.Option("--reason", metavar="TEXT", help="Why (recorded in the audit trail)."),
    ] = None,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Delete without asking (as a script must).")
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Delete it unfinished too, its open requests with it: for a session no cancel "
            "can finish (a damaged one). Still refused while a drive holds its lease.",
        ),
    ] = False,
    store: StoreOption = None,
    acting_as: DeleterOption = None,
) -> None:
    """Delete a finished session and its subagents' sessions, for good.

    Everything the store keeps of them goes (events, requests, answers, audit entries); the
    audit stream store:deletions records who deleted what, when and why. A session with a turn
    running or waiting on people is refused: cancel it first (or, where that fails, --force).
    Asks before deleting, unless --yes; without a terminal to ask at, --yes is needed."""
    with misuse():
        refuse_undecodable({"SESSION_ID": session_id, "--reason": reason})
        refuse_empty_ids({"SESSION_ID": session_id})
        principal = parse_principal(acting_as)
        if target:
            split_target(target)
        if not yes and not _can_ask():
            raise UsageError("there is no terminal to ask for confirmation at: pass --yes")
    run(_delete(session_id, target, store, reason, yes, principal, force=force))


def _confirmed(terminal: TerminalChannel, question: str) -> bool:
    """Whether the person answers y to `question` (Rich markup; no by default, and at the end
    of input). Read as `signoff chat` reads its prompts: one Ctrl-C ends the command at once
    (asyncio's own handler only cancels its task, which a blocking read never sees)."""
    while True:
        with ctrl_c_interrupts():
            answer = terminal.read(f"{question} [dim]\\[y/N][/] ")
        if answer is None:
            terminal.console.print()
            return False
        answer = folded(answer) if is_utf8(answer) else answer  # a byte not UTF-8: never y
        if answer in ("y", "yes"):
            return True
        if answer in ("", "n", "no"):
            return False
        terminal.console.print("  [red]answer y or n[/]")


def _can_ask() -> bool:
    """Whether a person can be asked: standard input is a terminal (not closed: `<&-`, which
    Python gives as None, raised AttributeError)."""
    return sys.stdin is not None and sys.stdin.isatty()


def _agentless(url: str) -> Runtime:
    return Runtime([], store=url)


async def store_runtime(
    target: str | None,
    store: str | None,
    *,
    bare: Callable[[str], Runtime] = _agentless,
    upgrade: bool = True,
) -> Runtime:
    """The runtime a command that deletes or cancels acts through: MODULE:RUNTIME's, or
    `bare`'s on --store (one of no agents); a SQLite file that is not there, or a PostgreSQL
    database or `?schema=` with no signoff schema, is refused (a mistyped path or name), not
    created empty. Without `upgrade` (a command that asks first), its store opens as a reading
    command's does (`reading_store`): an older schema is a `SchemaVersionError`, not upgraded
    before the answer, which would lock out the older processes still using it."""
    loaded = load_runtime(target, store) if target else None
    if not upgrade:
        reading = reading_store(store if loaded is None else loaded.store)
        return (loaded or bare(reading.url)).with_store(reading)
    if loaded is not None and isinstance(loaded.store, SQLiteStore):
        existing_store(loaded.store.url)
    url = existing_store(store) if loaded is None else None
    await refuse_unmade_schema(loaded.store if loaded is not None else str(url))
    return loaded or bare(str(url))


async def _delete(
    session_id: str,
    target: str | None,
    store: str | None,
    reason: str | None,
    yes: bool,
    principal: Principal,
    *,
    force: bool = False,
) -> None:
    console = out()
    runtime = await store_runtime(target, store, upgrade=False)
    # The question's look writes nothing: MODULE:RUNTIME's read would record a passed TTL (and
    # its tool settings) before the answer. One of no agents shows the state as recorded.
    async with Runtime([], store=runtime.store) as looking:
        try:  # an unknown id: UnknownSession, asked nothing
            state = await looking.state(session_id)
            about = f"{printable(state.agent)}, {state.status}, {state.seq} events"
        except (StoreUnavailable, StoreBusy):
            raise
        except StoreError as exc:
            if not force:
                raise
            # Damaged, as --force is for: said as it is, rather than read.
            about = f"damaged: {printable(str(exc))[:200]}"
        if not yes:
            # Refused all the same (a turn running, or waiting on people, in it or under it):
            # said now, not after the question; what changes since, the deletion refuses.
            refused = await looking._deletion_refusal(session_id, force=force)
            if refused is not None:
                raise refused
            shown = (
                f"Delete session {printable(session_id)} ({about}) and its subagents' "
                "sessions, for good?"
            )
            if not _confirmed(TerminalChannel(console), shown):
                console.print("Nothing deleted.")
                raise typer.Exit(1)
    async with runtime:
        deleted = await runtime.delete_session(session_id, by=principal, reason=reason, force=force)
    others = deleted[1:]
    also = f" and {len(others)} subagent session(s): {', '.join(others)}" if others else ""
    console.print(f"[green]deleted[/] {session_id}{also}; recorded in the audit trail")
