"""Subagents: `delegate()`, a workflow tool that runs a turn of another agent in a child session.

The child is an ordinary session whose `session.created` names the parent. When the child waits
for a person, the parent asks the same requests (`source="child"`, each with a `ChildRef` back
to the child's request); an answer given through the parent settles the child's request (under
the child's own policies) and resumes the child's turn, and the parent's model only runs again
once the child's turn has finished and its text became the delegate call's result. The call
creates, drives and cancels its child through the runtime's `RuntimeHost` (`_runtime_host`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, Protocol, runtime_checkable

from pydantic import AfterValidator, Field

from ._agent import StandIn, unpriced
from ._answers import Reply, check_asking_tools, check_delegate_tools, check_text
from ._cancellation import cancelled_by
from ._child_sessions import CHILD_KEY, cancel_orphan, child_id
from ._exceptions import (
    SessionBusy,
    SessionExpired,
    SignoffError,
    StoreError,
    UnknownAgent,
    UnknownSession,
    UnknownTool,
    UsageError,
)
from ._recording import TurnStopped
from ._results import GenerateResult
from ._runtime_host import MAX_DEPTH, RuntimeHost, SubagentFailed
from ._state_parts import CHILD_STEP
from ._sweeps import one_of_many
from ._text import NOTHING_SAID, is_blank
from ._tool_context import ToolContext
from ._tools import TOOL_NAME, Tool
from ._types import ChildRef, InputRequest
from .stores import SessionSummary
from .stores._swept_rows import Swept, readable_sessions

if TYPE_CHECKING:
    from ._agent import Agent
    from ._runtime import Runtime

__all__ = [
    "MAX_DEPTH",
    "STEERED",
    "RuntimeHost",
    "SubagentFailed",
    "delegate",
    "delegate_tools",
    "is_delegate",
    "missing_targets",
    "sweep_orphans",
    "tool_gone",
    "unpriced_delegates",
]


log = logging.getLogger("signoff.runtime")

STEERED = "the parent turn was steered by a new message"
"""The reason a delegated turn's `turn.cancelled` records when a message steered its parent."""


@runtime_checkable
class _DelegateJournal(Protocol):
    """The parts of the engine's call journal a delegate call needs (see `_CallJournal`)."""

    can_ask: bool
    turn_source: str
    turn_id: str | None
    turn_seq: int
    failed: SignoffError | None

    @property
    def host(self) -> Any: ...

    @property
    def session_id(self) -> str: ...

    def steered(self) -> bool: ...

    async def mirror(
        self, child: str, child_agent: str, requests: Sequence[InputRequest]
    ) -> int: ...

    async def park(self) -> NoReturn: ...


def delegate(agent: str, *, name: str | None = None, description: str | None = None) -> Tool:
    """A tool that hands the model's `message` to `agent` and returns the text of the turn it
    runs: what each of its replies said, joined by a blank line, as `generate` returns it.

    Each call runs one turn of `agent` in its own child session (created once per call, so a
    replay or a restart reuses it). Requests the child makes are asked on the parent session
    too; answering them there resumes the child without calling the parent's model.
    """
    if not isinstance(agent, str) or not agent:
        raise UsageError(f"delegate() needs the name of an agent, not {agent!r}")
    tool_name = agent if name is None else name
    if not isinstance(tool_name, str) or not TOOL_NAME.fullmatch(tool_name):
        raise UsageError(
            f"delegate({agent!r}): {tool_name!r} is not a valid tool name (1 to 64 ASCII "
            "letters, digits, _ or -); pass name="
        )

    async def run(
        ctx: ToolContext,
        message: Annotated[
            str,
            Field(min_length=1, description="The task for the agent."),
            AfterValidator(_said),
        ],
    ) -> Any:
        return await _run(ctx, agent, message)

    if description is not None and not isinstance(description, str):
        raise UsageError(f"delegate({agent!r}): description must be text, not {description!r}")
    about = description or (
        f"Delegate a task to the {agent!r} agent: send it a message; returns its final answer."
    )
    tool = Tool(run, name=tool_name, description=about, workflow=True)
    _targets[tool] = agent
    return tool


def is_delegate(tool: Tool) -> bool:
    """Whether `tool` is one `delegate()` made, whose calls each run a child session's turn."""
    return tool in _targets


def delegate_tools(tools: Mapping[str, Tool]) -> list[str]:
    """The names of the delegate tools among an agent's `tools`."""
    return [name for name, tool in tools.items() if is_delegate(tool)]


async def tool_gone(rt: Runtime, way: Sequence[InputRequest]) -> tuple[str, ChildRef | None] | None:
    """Why an answer through `way` (`deciding_way`: the mirrors down to the request answered) is
    refused `UnknownTool`, as the runtime judges each: a parent's agent no longer has the
    delegate tool its call ran (`check_delegate_tools`), with the subagent's request that can
    still be answered; or the agent of the request itself no longer has the tool whose call
    asked it (`check_asking_tools`), with none. Reads only, so a dashboard card or a chat
    prompt offers no answer that could only fail."""
    for request in way:
        if request.child is None and request.source != "ask":
            continue  # asked by no call's body (an approval): nothing to judge, nothing read
        try:
            state = await rt._state(request.session_id)
        except UnknownSession:
            continue  # deleted since
        agent = rt.agents.get(state.agent)
        if agent is None or isinstance(agent.model, StandIn):
            continue  # refused as `UnknownAgent` instead, or judged by no real agent's tools
        reply = [Reply(request.id, None, None)]
        try:
            if request.child is None:
                check_asking_tools(state, agent.tools, reply)
            else:
                check_delegate_tools(state, delegate_tools(agent.tools), reply)
        except UnknownTool as exc:
            return str(exc), request.child
    return None


def unpriced_delegates(agents: Mapping[str, Agent]) -> str | None:
    """Why `agents` cannot run together, if one bounds its cost (`max_cost_usd`) and delegates,
    directly or through its subagents, to an agent among them whose model (or a tool's `auto()`
    reviewer) counts every response as free (`unpriced`): what that subagent spent would count
    as nothing against the budget."""
    for agent in agents.values():
        if agent.limits.cost_bound is None:
            continue
        seen, below = {agent.name}, [agent]
        while below:
            for tool in below.pop().tools.values():
                target = _targets.get(tool)
                if target is None or target in seen or target not in agents:
                    continue
                seen.add(target)
                child = agents[target]
                # Its own model, or the auto() reviewer of one of its tools.
                models = [child.model, *(t.approval.reviewer() for t in child.tools.values())]
                free = next((m for m in models if unpriced(m)), None)
                if free is not None:
                    return (
                        f"agent {agent.name!r} bounds its cost (max_cost_usd) and delegates to "
                        f"{target!r}, whose model {free!r} has no price signoff knows: what it "
                        "spends would count as free against that budget; give it "
                        "price_per_mtok=(input_usd, output_usd) per million tokens ((0, 0) if "
                        "it is free)"
                    )
                below.append(child)
    return None


def missing_targets(agents: Mapping[str, Agent]) -> list[str]:
    """What is wrong with running `agents` together when one delegates to an agent not among
    them: a runtime creates and runs its delegate calls' child sessions itself, so each such
    call it runs fails, as a tool error the model reads. One line per delegate tool."""
    return [
        f"agent {agent.name!r} delegates to {target!r} (tool {tool.name!r}), which this runtime "
        f"does not have: the calls it runs fail (it has: {', '.join(agents)})"
        for agent in agents.values()
        for tool in agent.tools.values()
        if (target := _targets.get(tool)) is not None and target not in agents
    ]


def _said(message: str) -> str:
    """The task must say something (`is_blank`) and fit in a prompt (`check_text`): one that
    does not is refused before the child session is created, so the model is told and no
    session is left without a turn."""
    try:  # first: a lone surrogate is invalid, not blank
        check_text(message, "the task")
    except SignoffError as exc:
        raise ValueError(str(exc)) from None
    if is_blank(message):
        raise ValueError(NOTHING_SAID.format(what="the task"))
    return message


_targets: weakref.WeakKeyDictionary[Tool, str] = weakref.WeakKeyDictionary()
"""The agent each `delegate()` tool hands its calls to."""


async def _run(ctx: ToolContext, agent: str, message: str) -> Any:
    journal = getattr(ctx, "_journal", None)
    if not isinstance(journal, _DelegateJournal) or journal.host is None:
        raise UsageError(f"delegating to {agent!r} needs a call run by a signoff Runtime")
    try:
        return await _delegated(ctx, journal, agent, message)
    except StoreError as exc:
        # The store failed creating, starting or driving the child (the database down a
        # moment): the runtime's failure, not the call's outcome. The drive fails and records
        # nothing; a retry replays the call, which reuses the child.
        journal.failed = exc
        raise


async def _delegated(ctx: ToolContext, journal: _DelegateJournal, agent: str, message: str) -> Any:
    host: RuntimeHost = journal.host
    principal = ctx.session.auth.current
    who = None if principal is None else principal.model_dump(mode="json")
    source = journal.turn_source  # the parent turn's, as `_start_unstarted` takes it too
    key = ctx.idempotency_key(CHILD_KEY)
    task = (message, who, source)
    try:
        made = partial(host.create_child, turn=journal.turn_id, task=task)
        create = partial(_ours, journal, made)
        # Marked as the child's creation (`child`): a tool's own step of that name is not.
        child = await ctx._step(
            CHILD_STEP, create, (agent, journal.session_id, key), {}, child=True
        )
    except TurnStopped:  # the parent's turn ended after the child's creation, before its record
        await host.abandon_child(child_id(key), message, who, source, journal.turn_id)
        raise
    # The child's turn started with its session. This starts one an older signoff created and
    # died before starting (its `subagent.turn` step, journaled then, is passed over), and
    # cancels it if its parent's turn ended.
    ctx._pass_over("step", "subagent.turn")
    await _ours(journal, host.start_child, child, message, who, source)
    if journal.steered():
        return await _interrupted(host, journal, agent, child)
    try:
        result = await _driven(host, journal, ctx.abort_signal, agent, child)
    except UnknownAgent as exc:
        # The child has work its agent must do (an approval recorded without resuming, say):
        # the call is not over, so this drive fails and records nothing; a process with that
        # agent runs the child, and the call then takes its result.
        journal.failed = exc
        raise
    if isinstance(result, _Steered):
        return result.result
    if result.status == "waiting":
        if await journal.mirror(child, agent, result.pending):
            await journal.park()
        if journal.steered():
            return await _interrupted(host, journal, agent, child)
        raise SubagentFailed(f"agent {agent!r} (session {child}) waits on nothing to ask")
    return _ended(result, agent, child)


async def _ours(journal: _DelegateJournal, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """`fn(*args)`, a step of the runtime's own on its store: a `StoreError` it raises is the
    runtime's failure (`journal.failed`), not journaled as the step's, so a retry runs it again."""
    try:
        return await fn(*args)
    except StoreError as exc:
        journal.failed = exc
        raise


def _ended(result: GenerateResult, agent: str, child: str) -> Any:
    """The delegate call's result for the child's turn as it is now (not waiting)."""
    if result.status == "completed":
        return result.text
    if result.status == "cancelled":
        return {"cancelled": True, "agent": agent, "session_id": child}
    if result.status == "running":
        raise SessionBusy(f"session {child!r} of agent {agent!r} is busy elsewhere", child)
    error = result.error or {}
    raise SubagentFailed(
        f"agent {agent!r} (session {child}) failed: {error.get('message') or result.status}"
    )


async def _interrupted(host: RuntimeHost, journal: _DelegateJournal, agent: str, child: str) -> Any:
    """The parent's call was stopped while its child's turn was live: that turn is cancelled,
    for the parent's cancel (with its reason and canceller, read from the parent's log: it may
    have been made in another process) or as steered (the person wrote to the parent instead
    of answering). A turn that ended first keeps its result: its tools ran."""
    turn = (journal.session_id, journal.turn_id, journal.turn_seq)
    why = await cancelled_by(host.runtime.store, *turn)
    steered = (STEERED, None)
    result = await host.cancel_child(child, *(why or steered))
    if result.status in ("completed", "failed"):
        return _ended(result, agent, child)
    return {"interrupted": True, "session_id": child}


class _Steered:
    """The parent's call was aborted (a steering message, a cancel) while its child's turn ran:
    the call's `result` (`_interrupted`'s), the child's turn cancelled and its drive here over."""

    def __init__(self, result: Any) -> None:
        self.result = result


async def _driven(
    host: RuntimeHost, journal: _DelegateJournal, abort: asyncio.Event, agent: str, child: str
) -> GenerateResult | _Steered:
    """`host.drive_child`, until the parent's call is aborted (a steering message, a cancel)
    while the child's turn runs: its turn is then cancelled, as a steer cancels a waiting
    child (its tool sees its own abort signal), and the call's result is `_interrupted`'s once
    this drive of the child has stopped (at its next record)."""
    drive = asyncio.ensure_future(host.drive_child(child, agent, journal.session_id))
    aborted = asyncio.ensure_future(abort.wait())
    try:
        await asyncio.wait({drive, aborted}, return_when=asyncio.FIRST_COMPLETED)
        if drive.done():
            result: GenerateResult = drive.result()
            return result
        try:
            outcome = await _interrupted(host, journal, agent, child)  # one failed first raises
        finally:
            await drive  # its turn over, it stops at its next record
        return _Steered(outcome)
    except BaseException:  # this drive is cancelled or failed: the child's stops with it
        drive.cancel()
        with contextlib.suppress(BaseException):
            await drive
        raise
    finally:
        aborted.cancel()


_PAGE = 500  # sessions the orphan sweep reads per query (tests patch it)


async def sweep_orphans(rt: Runtime) -> int:
    """Cancel the live (running or waiting) delegated turns whose parent's turn ended: the
    process that cancelled the parent died before cancelling them, and a waiting one is never
    driven to find out. Where the store lists the orphaned children (a child whose parent waits
    for it costs nothing), those of every agent of this runtime are read: a process may run a
    child's agent without its parent's (`signoff worker` for it alone), and a cancel made where
    that agent is missing leaves the child to it. Else every running or waiting session of the
    agents this runtime's delegate tools name. Returns how many it cancelled."""
    query = getattr(rt.store, "orphaned_children", None)
    if query is not None:
        agents = sorted(rt.agents)
    else:
        targets = {
            _targets[tool]
            for spec in rt.agents.values()
            for tool in spec.tools.values()
            if tool in _targets
        }
        agents = sorted(targets & rt.agents.keys())
    rows: list[Swept] = []
    if query is not None and agents:
        rows = await _orphans(query, agents)
    elif query is None:
        for agent in agents:
            for status in ("running", "waiting"):
                rows += await _all(partial(_listed, rt, agent, status))
    cancelled = 0
    for row in readable_sessions(rows, log, "its orphaned turn not cancelled"):
        # One child it cannot cancel (or read) holds up neither the rest nor the deadlines the
        # sweep applies next: tried again at the next sweep. The store failing as a whole ends it.
        with (
            one_of_many(log, row.id, "its orphaned turn not cancelled"),
            contextlib.suppress(SessionExpired, UnknownSession),
        ):
            cancelled += await cancel_orphan(rt, await rt._state(row.id))
    return cancelled


async def _listed(rt: Runtime, agent: str, status: str, offset: int) -> list[SessionSummary]:
    return await rt.store.sessions(agent=agent, status=status, limit=_PAGE, offset=offset)


async def _orphans(query: Callable[..., Awaitable[list[Swept]]], agents: list[str]) -> list[Swept]:
    """Every orphan the store lists, `_PAGE` at a time by keyset (past the last id read): one
    another process cancels meanwhile shifts no later one out of the next page. A store whose
    `orphaned_children` takes no `after` is paged by offset."""
    params = inspect.signature(query).parameters.values()
    if not any(p.name == "after" or p.kind is p.VAR_KEYWORD for p in params):
        return await _all(lambda offset: query(agents, limit=_PAGE, offset=offset))
    rows: list[Swept] = []
    after: dict[str, str] = {}
    while True:
        got = await query(agents, limit=_PAGE, **after)
        rows += got
        if len(got) < _PAGE:
            return rows
        after = {"after": got[-1].id}


async def _all(page: Callable[[int], Awaitable[Sequence[Swept]]]) -> list[Swept]:
    """Every row of a listing, `_PAGE` at a time: all listed before any is cancelled, which would
    move the pages."""
    rows: list[Swept] = []
    offset = 0
    while True:
        got = await page(offset)
        rows += got
        if len(got) < _PAGE:
            return rows
        offset += _PAGE
