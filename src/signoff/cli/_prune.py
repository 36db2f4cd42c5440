"""`signoff prune`: retention from the command line, as `Runtime.prune` does it: the finished
sessions last active more than a duration ago deleted, a bounded batch at a time, after asking
at the terminal (or with `--yes`); `--dry-run` lists them and deletes nothing."""

from __future__ import annotations

import math
import re
from typing import Annotated

import typer

from .._exceptions import UsageError
from .._runtime import Runtime
from .._types import Principal
from ..channels.terminal import TerminalChannel, printable
from . import _deletion
from ._app import (
    RuntimeArgument,
    StoreOption,
    app,
    err,
    misuse,
    out,
    parse_principal,
    refuse_empty_filters,
    refuse_undecodable,
    run,
    store_of,
)
from ._deletion import DeleterOption, store_runtime
from ._loading import split_target
from ._numbers import whole
from ._store_files import reading_store

__all__ = ["duration", "prune"]

_LIMIT = whole(1, 1_000_000)

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")


def duration(value: object) -> float:
    """Seconds from `90d`, `12h`, `30m`, `3600s` or a plain number of seconds (`3600`), else
    `typer.BadParameter` (exit 2)."""
    text = str(value).strip()
    found = _DURATION.fullmatch(text)
    seconds = float(found[1]) * _UNITS[found[2] or "s"] if found else math.nan
    if not math.isfinite(seconds):
        raise typer.BadParameter(
            f"{text!r} is not a duration such as 90d, 12h, 30m, 3600s or 3600 (seconds)"
        )
    return seconds


@app.command()
def prune(
    older_than: Annotated[
        float,
        typer.Option(
            "--older-than",
            metavar="DURATION",
            parser=duration,
            help="Delete sessions last active longer ago than this: 90d, 12h, 30m, 3600s.",
            show_default=False,
        ),
    ],
    target: RuntimeArgument = None,
    store: StoreOption = None,
    agent: Annotated[
        str | None,
        typer.Option("--agent", metavar="NAME", help="Only this agent's sessions."),
    ] = None,
    limit: Annotated[
        int,
        typer.Option(
            "--limit",
            metavar="N",
            parser=_LIMIT,
            help=f"Delete at most N sessions, the oldest first ({_LIMIT.range}); the rest wait "
            "for the next run.",
        ),
    ] = 1000,
    reason: Annotated[
        str | None,
        typer.Option("--reason", metavar="TEXT", help="Why (recorded in the audit trail)."),
    ] = None,
    acting_as: DeleterOption = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List the sessions it would delete; delete none.")
    ] = False,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Delete without asking (as a script must).")
    ] = False,
) -> None:
    """Delete the finished sessions last active longer ago than --older-than, for good.

    A session goes with its subagents' sessions if it is finished (idle, failed, cancelled, or
    its TTL passed) and none of them was active since, oldest first, at most --limit of them;
    each deletion is recorded in the audit stream store:deletions. Live sessions, and any
    active since they were listed, are skipped, the next taken in their place; one that cannot
    be read (damaged) is named and left, with exit status 1 (delete --force deletes it). Asks
    before deleting, unless --yes or --dry-run; without a terminal to ask at, --yes is needed."""
    with misuse():
        refuse_undecodable({"--agent": agent, "--reason": reason})
        refuse_empty_filters({"--agent": agent})
        principal = parse_principal(acting_as)
        if target:
            split_target(target)
        if not (yes or dry_run or _deletion._can_ask()):
            raise UsageError("there is no terminal to ask for confirmation at: pass --yes")
    run(_prune(target, store, older_than, agent, limit, reason, principal, dry_run, yes))


async def _prune(
    target: str | None,
    store: str | None,
    older_than: float,
    agent: str | None,
    limit: int,
    reason: str | None,
    principal: Principal,
    dry_run: bool,
    yes: bool,
) -> None:
    console = out()
    if dry_run:  # a look changes nothing: an older schema is refused, not upgraded
        async with Runtime([], store=reading_store(store_of(target, store))) as looking:
            _, found, more, _ = await _batch(looking, older_than, agent, limit, reason, principal)
        for session_id in found:
            console.print(session_id, highlight=False)
        console.print(f"{len(found)} session(s) would be deleted; nothing deleted.")
        if more:
            console.print(f"(--limit {limit} reached: more are old enough.)")
        return
    # Opened as the --dry-run look is: an older schema refused, not upgraded before the
    # answer (which would lock out the older processes still using it).
    runtime = await store_runtime(target, store, upgrade=False)
    # Counted and asked through one of no agents on the same store (and clock): MODULE:RUNTIME's
    # opening records its tool settings, which an answer of no must not leave behind.
    async with Runtime([], store=runtime.store, clock=runtime.clock) as looking:
        # One moment for the question and the deletion: the cutoff read a minute later (the
        # person taking that long to answer) took in sessions the question had not counted.
        at = looking.now()
        _, found, _, _ = await _batch(looking, older_than, agent, limit, reason, principal, at=at)
        if not found:
            console.print("Nothing to delete: no finished session was last active that long ago.")
            return
        if not yes:
            shown = (
                f"Delete {len(found)} finished session(s) last active more than "
                f"{age(older_than)} ago, and their subagents' sessions, for good?"
            )
            # Read as `delete` asks: one Ctrl-C ends the command at once (a blocking confirm in
            # the event loop swallowed it, and a `y` typed afterwards went on to delete).
            if not _deletion._confirmed(TerminalChannel(console), shown):
                console.print("Nothing deleted.")
                raise typer.Exit(1)
    async with runtime:
        # At most as many as it asked about, each one old enough at that moment (one skipped
        # now, found live, lets the next oldest go in its place).
        deleted, listed, more, damaged = await _batch(
            runtime, older_than, agent, len(found), reason, principal, delete=True, at=at
        )
    skipped = len(listed) - len(deleted) - len(damaged)
    console.print(
        f"[green]deleted[/] {len(deleted)} session(s) and their subagents' sessions; recorded "
        "in the audit trail"
        + (f"; {skipped} skipped (live, or active since listed)" if skipped else "")
    )
    if more:
        console.print(f"--limit {limit} reached: older sessions remain for the next run.")
    if damaged:
        # Each run lists them again: a person mends or force-deletes them, so it exits 1. Why
        # each could not be read is the runtime's warning, logged above.
        err().print(
            f"[bold red]not deleted:[/] [red]{len(damaged)} session(s) that could not be read "
            f"(damaged): {printable(', '.join(damaged))}; `signoff delete --force SESSION_ID` "
            "deletes one[/]",
            soft_wrap=True,
        )
        raise typer.Exit(1)


async def _batch(
    runtime: Runtime,
    older_than: float,
    agent: str | None,
    limit: int,
    reason: str | None,
    principal: Principal,
    *,
    delete: bool = False,
    at: float | None = None,
) -> tuple[list[str], list[str], bool, dict[str, str]]:
    """One batch of `Runtime.prune` (its cutoff counted back from `at`, if given): deleted,
    listed, whether more were old enough, and those it could not read, with why."""
    return await runtime._prune(
        older_than=older_than,
        by=principal,
        reason=reason,
        limit=limit,
        agent=agent,
        dry_run=not delete,
        at=at,
    )


def age(seconds: float) -> str:
    """A duration as a person reads it: `90 days`, `12 hours`, `30 minutes`, `3600.5 seconds`
    (the largest unit it is a whole number of)."""
    for unit, size in (("day", 86400.0), ("hour", 3600.0), ("minute", 60.0)):
        if seconds >= size and (seconds / size).is_integer():
            count = int(seconds / size)
            return f"{count:,} {unit}{'' if count == 1 else 's'}"
    text = f"{seconds:,.6f}".rstrip("0").rstrip(".")
    if text == "0" and seconds:  # below a microsecond: as Python writes it
        text = repr(seconds)
    return text + (" second" if seconds == 1 else " seconds")
