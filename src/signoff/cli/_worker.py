"""`signoff worker` and `signoff db`: run turns in the background, manage the schema."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Annotated

import typer

from .._exceptions import StoreError
from .._logs import log_to_stderr
from .._runtime import Runtime
from ..channels.terminal import printable
from ..stores import DEFAULT_URL, SQLiteStore
from ..stores.sqlite._schema import STORE_SCHEMA as SQLITE_SCHEMA
from ._app import (
    LeaseTtlOption,
    LogLevelOption,
    RuntimeArgument,
    StoreOption,
    app,
    misuse,
    out,
    run,
    shown_store,
    store_of,
)
from ._commands import Group
from ._loading import load_runtime, split_target
from ._numbers import seconds, whole
from ._store_files import own_store, reading_store, unopened_like
from ._stuck import ctrl_c_in_sqlite
from ._waiting import open_when_up

if TYPE_CHECKING:
    from ..stores.postgres import PostgresStore

CONCURRENCY = whole(1, 100_000)
IDLE_WAIT = seconds(0.01, 60)
SWEEP_EVERY = seconds(0.1, 3600)


@app.command()
def worker(
    target: Annotated[
        str, typer.Argument(metavar="MODULE:RUNTIME", help="A Runtime or Agent whose turns to run.")
    ],
    store: StoreOption = None,
    concurrency: Annotated[
        int,
        typer.Option(
            "--concurrency",
            metavar="N",
            parser=CONCURRENCY,
            help=(
                f"Turns driven at once ({CONCURRENCY.range}); on PostgreSQL the pool grows to "
                "N + 2 connections unless the URL sets pool_max."
            ),
        ),
    ] = 16,
    lease_ttl: LeaseTtlOption = None,
    idle_wait: Annotated[
        float,
        typer.Option(
            "--idle-wait",
            metavar="SECONDS",
            parser=IDLE_WAIT,
            help=f"Longest sleep between claims, {IDLE_WAIT.range}.",
        ),
    ] = 0.5,
    sweep_every: Annotated[
        float,
        typer.Option(
            "--sweep-every",
            metavar="SECONDS",
            parser=SWEEP_EVERY,
            help=f"Seconds between deadline sweeps, {SWEEP_EVERY.range}.",
        ),
    ] = 5.0,
    log_level: LogLevelOption = "info",
) -> None:
    """Run turns only (no HTTP): claim sessions that have work under a lease and drive them.

    SIGTERM or Ctrl-C stops it gracefully (turns in flight finish or park, starting no message
    queued behind them; a claim the store holds up, its file locked or its server down, is not
    waited for; a second signal stops at once, interrupting them and giving their leases back).
    A tool's result the store refused (the database restarting) is recorded by this worker,
    which takes the session's lease again meanwhile (another worker may take it first, and run
    the tool again, if it lapsed: the log says so), and before it exits, retried for up to a
    minute then; one it cannot record is logged as an error and ends it with exit status 1.
    Started while its database is down, it waits for it (logging each retry); a store failing
    later is logged once and retried, one whose file was deleted or replaced (`StoreGone`)
    ends it with exit status 1.
    """
    import logging
    import os
    import signal

    with misuse():
        split_target(target)
    log_to_stderr(log_level)
    log = logging.getLogger("signoff.worker")
    # A SIGTERM while the app is imported, before the loop's handler is set, killed it (exit
    # 143, nothing said): kept, and taken as the first stop once the handlers are set.
    early: list[int] = []

    def while_loading(signum: int, _frame: object) -> None:
        if early:  # a second one stops at once, as it does once running
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        early.append(signum)

    signal.signal(signal.SIGTERM, while_loading)

    async def go() -> None:
        # inline=False: expired deadlines only make sessions runnable; claims drive them
        runtime = load_runtime(target, store)._replaced(lease_ttl=lease_ttl, inline=False)
        own_store(runtime.store)
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
        for signum in early[:1]:
            on_signal(signum)
        # a second signal held in SQLite ends it at once; set after the loop's handlers, whose
        # wakeup fd it passes each signal on to
        with ctrl_c_in_sqlite(presses=2, stops=(signal.SIGINT, signal.SIGTERM)):
            try:
                if not await open_when_up(runtime, stop, log.warning):
                    log.info("worker stopped")
                    return
            except BaseException:
                await runtime.close()
                raise
            async with runtime:
                # Its agents: it claims only their sessions, and leaves any other's to sit idle.
                log.info(
                    "worker %s on %s, concurrency %d, lease %.1fs, agents: %s",
                    runtime.owner,
                    shown_store(runtime.store.url),  # with a schema given apart
                    concurrency,
                    runtime.lease_ttl,
                    ", ".join(sorted(runtime.agents)) or "none",
                )
                await runtime.work(
                    concurrency=concurrency, stop=stop, idle_wait=idle_wait, sweep_every=sweep_every
                )
            log.info("worker stopped")

    try:
        run(go())
    except asyncio.CancelledError:
        raise typer.Exit(130) from None


db_app = typer.Typer(help="Manage the store's schema.", no_args_is_help=True, cls=Group)
app.add_typer(db_app, name="db")


@db_app.command("upgrade")
def db_upgrade(target: RuntimeArgument = None, store: StoreOption = None) -> None:
    """Create or migrate the store's schema to this signoff's version (PostgreSQL or SQLite);
    exit status 1, as `db status`, when the store then lacks a table, index or function of it
    (dropped by hand), naming them."""

    async def go() -> None:
        given = store_of(target, store)
        given = DEFAULT_URL if given is None else given  # "" (an unset variable) is refused
        url = given if isinstance(given, str) else given.url
        if url.startswith(("postgresql://", "postgres://")):
            from ..stores.postgres import PostgresStore  # a UsageError without the extra

            # a runtime's store with its settings (`connect_timeout`), not the defaults
            postgres = unopened_like(given, migrate=False)
            assert isinstance(postgres, PostgresStore)
            before, after = await postgres.migrate()
            # which database, and which schema of it (`?schema=`, which the URL shown leaves out)
            where = f"{shown_store(url)}, schema {postgres.schema!r}"
            await _said_migrated(postgres, before, after, where)
            return
        own_store(url)
        async with Runtime([], store=unopened_like(given, migrate=True)) as runtime:
            sqlite = runtime.store
            assert isinstance(sqlite, SQLiteStore)  # a URL of neither kind was refused
            before, after = await sqlite.migrate()
            await _said_migrated(sqlite, before, after, sqlite.url)

    run(go())


@db_app.command("status")
def db_status(target: RuntimeArgument = None, store: StoreOption = None) -> None:
    """Check the store's schema against this signoff's, changing nothing: exit status 0 when it
    is up to date, 1 (naming what to do) when it has none, an older or a newer one, or lacks a
    table or index of it (dropped by hand)."""

    async def go() -> None:
        # never created nor upgraded, as the reading commands
        opened = reading_store(store_of(target, store))
        await opened.open()  # an older, newer or missing schema: its SchemaVersionError
        try:
            if isinstance(opened, SQLiteStore):
                version, where = SQLITE_SCHEMA, opened.url
            else:
                from ..stores.postgres import PostgresStore
                from ..stores.postgres._schema import STORE_SCHEMA as POSTGRES_SCHEMA

                assert isinstance(opened, PostgresStore)
                version = POSTGRES_SCHEMA
                where = f"{shown_store(opened.url)}, schema {opened.schema!r}"
            await _refuse_damaged(opened, version, where)
            out().print(f"schema is up to date (version {version}) ({printable(where)})")
        finally:
            await opened.close()

    run(go())


async def _said_migrated(
    store: SQLiteStore | PostgresStore, before: int, after: int, where: str
) -> None:
    """Print what `db upgrade` did to the store at `where`, then refuse it as `db status` does
    if it lacks part of its schema: "up to date" with exit status 0 read as healthy."""
    # printable: a path may hold a byte that is not UTF-8, which a terminal cannot take
    said = f"{_migrated(before, after)} ({printable(where)})"
    if before != after:  # a migration committed is said, damaged or not
        out().print(said)
    await _refuse_damaged(store, after, where)
    if before == after:
        out().print(said)


async def _refuse_damaged(store: SQLiteStore | PostgresStore, version: int, where: str) -> None:
    """Raise a `StoreError` naming the tables, indexes and functions of the schema at `version`
    that the store at `where` lacks, dropped by hand: no migration makes them again."""
    missing = await store.schema_missing()
    if missing:
        raise StoreError(
            f"{printable(where)} has schema version {version} but lacks "
            f"{_listed(missing)}, dropped outside signoff: the store is damaged. Restore "
            "it from a backup; no `signoff db upgrade` makes them again"
        )


def _migrated(before: int, after: int) -> str:
    """What `db upgrade` did, from the schema versions before and after it."""
    if before == 0:
        return f"schema created (version {after})"
    if before == after:
        return f"schema is up to date (version {after})"
    return f"schema upgraded from version {before} to {after}"


def _listed(names: list[str]) -> str:
    """`a`, `a and b`, `a, b and c`."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
