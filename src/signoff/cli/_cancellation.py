"""`signoff cancel`: cancel a session's running or waiting turn, as `Runtime.cancel` does, from
a terminal or a script; its open requests are withdrawn and who cancelled it is recorded."""

from __future__ import annotations

from typing import Annotated

import typer

from .._agent import Agent
from .._results import GenerateResult
from .._runtime import Runtime
from .._session_cache import check_agent_name
from .._types import Principal
from ..channels.terminal import printable
from ._app import (
    NoModel,
    RuntimeArgument,
    SessionArgument,
    StoreOption,
    app,
    as_option,
    misuse,
    out,
    parse_principal,
    refuse_empty_ids,
    refuse_undecodable,
    run,
)
from ._deletion import store_runtime
from ._loading import split_target

__all__ = ["cancel"]

CancellerOption = Annotated[
    str | None,
    as_option("Who cancels it, as the session's trace records (default: local:<your user name>)."),
]


class _Recorder(Runtime):
    """A runtime that records a cancel for agents it does not have: each is looked up as a
    stand-in whose model is never called, and is not one of its agents, so nothing here drives
    a turn (a parent's delegate call going on, a message queued behind the cancelled turn): a
    process running the agent (a worker) does."""

    def __init__(self, store: str) -> None:
        super().__init__([], store=store, inline=False)
        self._stand_ins: dict[str, Agent] = {}

    def agent(self, name: str) -> Agent:
        check_agent_name(name)
        if name not in self._stand_ins:
            self._stand_ins[name] = Agent(name=name, model=NoModel(name))
        return self._stand_ins[name]


@app.command()
def cancel(
    session_id: SessionArgument,
    target: RuntimeArgument = None,
    reason: Annotated[
        str | None,
        typer.Option("--reason", metavar="TEXT", help="Why (recorded with the cancel)."),
    ] = None,
    turn: Annotated[
        str | None,
        typer.Option(
            "--turn",
            metavar="TURN_ID",
            help="Cancel this turn only: once another has started, nothing is cancelled.",
        ),
    ] = None,
    store: StoreOption = None,
    acting_as: CancellerOption = None,
) -> None:
    """Cancel the session's running or waiting turn; its open requests are withdrawn.

    Who cancels (--as) and why (--reason) are recorded in the session's trace. A session with
    nothing to cancel is left as it is (exit 0, said so). Without MODULE:RUNTIME the cancel is
    only recorded: a message queued behind the turn, or a parent session's delegate call, goes
    on in a process running the agent (a worker)."""
    with misuse():
        refuse_undecodable({"SESSION_ID": session_id, "--reason": reason, "--turn": turn})
        refuse_empty_ids({"SESSION_ID": session_id, "--turn": turn})
        principal = parse_principal(acting_as)
        if target:
            split_target(target)
    run(_cancel(session_id, target, store, reason, turn, principal))


async def _cancel(
    session_id: str,
    target: str | None,
    store: str | None,
    reason: str | None,
    turn: str | None,
    principal: Principal,
) -> None:
    console = out()
    async with await store_runtime(target, store, bare=_Recorder) as runtime:
        state = await runtime.state(session_id)  # an unknown id: UnknownSession
        before = None if state.turn is None else (state.turn.id, state.turn.status)
        result = await runtime.cancel(session_id, reason, principal=principal, turn_id=turn)
        # The requests the cancel withdrew, as recorded: not those open before it, of which a
        # passed deadline it records first closes some (`expired`), behind a mirror too.
        withdrawn = 0
        if result.cancelled:
            async for event in runtime.events(session_id, state.seq, follow=False):
                cancels = event.type == "input.resolved" and event.turn_id == result.turn_id
                withdrawn += cancels and event.data.get("outcome") == "cancelled"
    console.print(_told(session_id, turn, before, withdrawn, result))


def _told(
    session_id: str,
    turn: str | None,
    before: tuple[str, str] | None,
    withdrawn: int,
    result: GenerateResult,
) -> str:
    """What the cancel did, in one line: `before` is the turn the session had (id, status),
    `withdrawn` how many requests the cancel withdrew."""
    sid, tid = printable(session_id), printable(result.turn_id or "")
    # `cancelled`: this call recorded the cancel (one racing it may have, the state before
    # read as either).
    if result.cancelled:
        said = f"; {withdrawn} open request(s) withdrawn" if withdrawn else ""
        return f"[green]cancelled[/] turn {tid} of {sid}{said}"
    if turn is not None and result.turn_id != turn:
        now = f"its turn is {tid} ({result.status})" if result.turn_id else "it has no turn"
        return f"Turn {printable(turn)} is not the current turn of {sid}: {now}; nothing cancelled."
    return f"Nothing to cancel: {sid} is {result.status}; nothing changed."
