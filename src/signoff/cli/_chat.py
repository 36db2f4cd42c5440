"""`signoff chat`: talk to an agent at the terminal, answering its approvals and questions."""

from __future__ import annotations

import shlex
import sys
from typing import Annotated

import typer
from rich.console import Console

from .._agent import Agent
from .._eligibility import excluded_requester, refusal
from .._exceptions import (
    AnswerError,
    InvalidAnswer,
    NotAllowed,
    SignoffError,
    StoreError,
    TooLarge,
    UnknownTool,
    UsageError,
)
from .._mirrors import deciding_way
from .._prompts import check_prompt
from .._results import GenerateResult
from .._runtime import Runtime
from .._state import SessionState, starts_queued, turn_over
from .._subagents import tool_gone
from .._text import is_blank
from .._types import InputRequest, InputResponse, Principal
from ..channels._base import QUEUED_NOTE
from ..channels.terminal import TerminalChannel, printable
from ..models import Scripted
from ..stores import SQLiteStore
from ._app import (
    AsOption,
    StoreOption,
    answer_flags,
    app,
    ctrl_c_interrupts,
    driving,
    error_text,
    misuse,
    out,
    parse_principal,
    pick_agent,
    refuse_empty_ids,
    refuse_undecodable,
    run,
    shown_store,
    store_args,
    tool_line,
)
from ._asker import asker_hint
from ._loading import load_runtime, split_target
from ._store_files import own_store

_HELP = (
    "[dim]/retry resumes a turn whose model call failed, keeping the answers already given; "
    "/exit, /quit or Ctrl-D leaves (a request left open stays pending); Ctrl-C stops at once. "
    "Anything else is a message to the agent.[/]"
)


_LEAVE = ("/exit", "/quit")


class _ChatChannel(TerminalChannel):
    """The terminal channel of chat, where `/exit` or `/quit` typed at an approval's or a
    question's prompt leaves the request pending, as Ctrl-D does, rather than being taken as
    a free-text answer (which the turn would go on with) or refused as no y or n."""

    asking = False

    def ask(self, request: InputRequest) -> InputResponse | None:
        self.asking = True
        try:
            return super().ask(request)
        finally:
            self.asking = False

    def read(self, prompt: str) -> str | None:
        line = super().read(prompt)
        return None if self.asking and line in _LEAVE else line


class _Chat:
    """One terminal conversation with one agent: messages in, inline prompts, answers out."""

    def __init__(
        self,
        runtime: Runtime,
        agent: Agent,
        console: Console,
        principal: Principal,
        *,
        target: str,
        acting_as: str | None = None,
        store: str | None = None,
    ) -> None:
        self.runtime = runtime
        self.target = target
        self.store = store  # as given (`--store`, `SIGNOFF_STORE`), over the runtime's own
        self.acting_as = acting_as
        self.agent = agent
        self.console = console
        # Deadlines are shown by the runtime's clock, which set them (the database's on PostgreSQL).
        self.channel: TerminalChannel = _ChatChannel(console, clock=runtime.now)
        self.principal = principal
        self.session_id: str | None = None
        self.seen = 0
        self.refused = False  # a message or an answer (never given after) was refused
        self.failed = False  # a turn failed and no /retry resumed it since

    @property
    def undone(self) -> bool:
        """Whether something typed was not carried out: chat then exits with status 1, so a
        script feeding it from a pipe can tell (an error at a terminal is seen and shrugged off)."""
        return self.refused or self.failed

    async def run(self, session_id: str | None) -> None:
        # a session it cannot continue is refused before anything is printed, the error alone
        state = None if session_id is None else await self.resumable(session_id)
        self.header()
        if state is not None and not await self.reopen(state):
            return
        while True:
            with ctrl_c_interrupts():
                line = self.channel.read_message()
            if line is None or line in _LEAVE:
                if line is None:
                    self.console.print()
                return
            if is_blank(line):  # says nothing, as an empty line
                continue
            if line == "/help":
                self.console.print(_HELP)
                continue
            try:
                if line == "/retry" and (why := await self.nothing_to_retry()):
                    self.console.print(f"[yellow]nothing to retry: {why}[/]")
                    continue
                if self.session_id is None:
                    check_prompt(line)  # a message refused leaves no session behind
                    # Opened and named before the first turn: one a failure or Ctrl-C cuts
                    # short is then resumed by /retry or `chat --session`, not lost.
                    self.session_id = await self.runtime.create_session(
                        self.agent.name, auth=self.principal
                    )
                    self.console.print(f"[dim]session {self.session_id}[/]")
                with self.console.status(f"{printable(self.agent.name)} is working..."):
                    if line == "/retry":
                        self.failed = False  # the failed turn resumes; `report` says how it ends
                        result = await self.runtime.generate(session_id=self.session_id)
                    else:
                        result = await self.runtime.generate(
                            session_id=self.session_id, prompt=line, auth=self.principal
                        )
                if not await self.follow(result):
                    return
            except SignoffError as exc:
                self.console.print(f"[red]{type(exc).__name__}: {printable(str(exc))}[/]")
                if line == "/retry" or isinstance(exc, StoreError):
                    # A store failure may cut short a turn the message began: /retry resumes
                    # it if so (and says there is nothing to resume if not).
                    self.failed = True
                else:
                    self.refused = True  # what the message said is never done

    async def nothing_to_retry(self) -> str | None:
        """Why `/retry` has nothing to resume, or None when it has: resuming a turn that ended
        would only print its last answer again, as if the agent had answered anew, unless a
        message queued behind it never started, which `/retry` then starts (as `reopen` does)."""
        if self.session_id is None:
            return "type a message to begin"
        state = await self.runtime.state(self.session_id)
        turn = state.turn
        if starts_queued(state):  # another process ended the turn and died before it started
            self.say_queued(state)
            return None
        if turn is None or turn.status in ("completed", "cancelled"):
            return f"the last turn {turn.status if turn else 'never started'}"
        if turn.status == "failed" and not turn.retryable:
            return f"the last turn failed for good ({printable(error_text(turn.error))})"
        return None

    def answer_args(self, request: InputRequest) -> str:
        """The arguments that answer `request` from another terminal as this chat would: its
        store and principal, and the runtime when only the tool's response policy can decide."""
        args = [request.id]
        url = getattr(self.runtime.store, "url", None)
        if request.response_policy:
            # The store only as typed: the runtime's own URL, password masked, would not open.
            args += [self.target, *(store_args(self.store) if self.store else [])]
        elif isinstance(url, str):
            args += store_args(url)
        if self.acting_as is not None:
            args += ["--as", self.acting_as]
        return printable(shlex.join(args))

    def header(self) -> None:
        url = getattr(self.runtime.store, "url", None)
        if isinstance(url, str):
            store = shown_store(self.runtime.store.url)  # with a schema given apart
        else:
            store = type(self.runtime.store).__name__
        self.console.print(
            f"[bold]signoff chat[/] · agent [bold cyan]{printable(self.agent.name)}[/] · "
            f"store {printable(store)}"
        )
        if isinstance(self.agent.model, Scripted):
            self.console.print(
                "[yellow]demo model:[/] Scripted: offline, scripted replies (no LLM is called)"
            )
        else:
            self.console.print(f"model: {printable(repr(self.agent.model))}")
        self.console.print(
            "[dim]Type a message; /retry resumes a failed turn; Ctrl-D or /exit leaves; "
            "/help for more.[/]"
        )

    async def resumable(self, session_id: str) -> SessionState:
        """The state of the session `--session` names, if this chat can continue it: one that
        does not exist, or of another agent, is refused, and one past its TTL (`SessionExpired`,
        which each message would meet) unless a live drive runs its turn on (`_ended`), as the
        dashboard judges it; this reads only."""
        state = await self.runtime._state(session_id)
        if state.agent != self.agent.name:
            how = (
                f"pass --agent {state.agent}"
                if state.agent in self.runtime.agents
                else f"which this runtime does not have (it has: {', '.join(self.runtime.agents)})"
            )
            raise UsageError(f"session {session_id!r} belongs to agent {state.agent!r}: {how}")
        expired = await self.runtime._ended(state, self.runtime.now())
        if expired is not None:
            raise expired
        return state

    async def reopen(self, state: SessionState) -> bool:
        """Pick up an existing session where it stands, running what it has to do (its turn, or
        the message queued behind a turn that ended); False if the person left."""
        session_id = state.id
        self.session_id = session_id
        self.seen = state.seq
        self.console.print(f"[dim]session {session_id} (resumed)[/]")
        turn = state.turn
        if turn is None:
            return True
        if turn.status == "failed" and not turn.retryable:
            self.console.print(f"[red]the last turn failed: {printable(error_text(turn.error))}[/]")
        if turn_over(turn):
            if not starts_queued(state):
                return True
            # Its process died before the message queued behind it started: resuming the
            # session starts it (`generate` drives it, as a worker would).
            self.say_queued(state)
        with self.console.status(f"{printable(self.agent.name)} is working..."):
            result = await self.runtime.generate(session_id=session_id)
        return await self.follow(result)

    def say_queued(self, state: SessionState) -> None:
        """Say that the messages queued behind the session's ended turn start now."""
        n = len(state.queued)
        which = "the message" if n == 1 else f"the {n} messages"
        which += " queued behind it " + ("starts" if n == 1 else "start")
        self.console.print(f"[dim]the last turn ended; {which} now[/]")

    @property
    def in_memory(self) -> bool:
        """Whether the store lives in this process alone (`sqlite:///:memory:`): what is left
        pending there is lost when chat exits, and no command elsewhere can answer it."""
        store = self.runtime.store
        return isinstance(store, SQLiteStore) and store.path == ":memory:"

    async def for_others(self, request: InputRequest) -> str | None:
        """Why `request` waits for someone other than this chat's person, who four eyes bars
        from settling their own call (as the dashboard shows instead of its buttons): asking
        them could only be refused, whatever they typed."""
        rt = self.runtime
        if not excluded_requester((await deciding_way(rt.store, request))[-1], self.principal):
            return None
        refused = await refusal(rt.agents, rt.store, request, self.principal)
        return None if refused is None else f"{refused}: someone else must approve it"

    def say_waiting(self, session_id: str, others: list[str], *, start: str = "") -> None:
        """Say that the turn, left here, waits for other people to answer `others`, and where
        it goes on: `chat --session`, unless the store is this process's memory."""
        later = (
            "its store is this process's memory (sqlite:///:memory:): it is lost when chat exits"
            if self.in_memory
            else f"`signoff chat ... --session {session_id}` continues it later"
        )
        self.console.print(
            f"{start}[yellow]the turn waits for other people to answer {', '.join(others)}[/]; "
            + later
        )

    async def steer_past(self, session_id: str, others: list[str]) -> GenerateResult | None:
        """Read a message from the requester four eyes bars from their own call, which the turn
        waits on: sent (`Runtime.send`, as any surface sends one), it withdraws what the turn
        waits on and the model reads it. None if they leave it waiting (`/exit` or Ctrl-D)."""
        it = "it" if len(others) == 1 else "them"
        self.console.print(
            f"[dim]type a message to withdraw {it} and steer the turn, or /exit to leave "
            f"{it} waiting[/]"
        )
        while True:
            with ctrl_c_interrupts():
                line = self.channel.read_message()
            if line is None or line in _LEAVE:
                self.say_waiting(session_id, others, start="" if line else "\n")
                return None
            if is_blank(line):
                continue
            if line == "/help":
                self.console.print(_HELP)
                continue
            if line == "/retry":  # nothing failed: the turn waits on people
                self.console.print(f"[yellow]nothing to retry: the turn waits on {others[0]}[/]")
                continue
            try:
                with self.console.status(f"{printable(self.agent.name)} is working..."):
                    result = await self.runtime.send(session_id, line, principal=self.principal)
            except StoreError:
                raise  # it may have cut short the turn it steered: chat's /retry resumes it
            except SignoffError as exc:  # not delivered (an approve of theirs, too large...)
                self.console.print(f"[red]{type(exc).__name__}: {printable(str(exc))}[/]")
                self.refused = True
                continue
            if result.queued:  # the turn serves someone else: the message waits behind it
                self.console.print(f"[yellow]{QUEUED_NOTE}[/]")
                self.say_waiting(session_id, others)
                return None
            return result

    async def cannot_answer(self, request: InputRequest) -> str | None:
        """Why no answer to `request` given here could be taken, for one who may answer it: a
        mirror whose delegate tool a deploy took from its parent's agent, or a question whose
        asking call's tool it took (`tool_gone`, as the dashboard shows it instead of its
        buttons). One who may not is asked as before, and told `NotAllowed` with the command
        the asker runs."""
        rt = self.runtime
        if await refusal(rt.agents, rt.store, request, self.principal) is not None:
            return None
        gone = await tool_gone(rt, await deciding_way(rt.store, request))
        return None if gone is None else gone[0]

    async def follow(self, result: GenerateResult) -> bool:
        """Answer the turn's requests inline until it ends; False if the person left."""
        answered: set[str] = set()
        unanswered: set[str] = set()  # refused, and not answered since: the chat may leave them
        try:
            return await self._follow(result, answered, unanswered)
        finally:
            self.refused = self.refused or bool(unanswered)

    async def _follow(
        self, result: GenerateResult, answered: set[str], unanswered: set[str]
    ) -> bool:
        unanswerable: set[str] = set()  # refused `UnknownTool` here, said so and not asked again
        theirs: set[str] = set()  # for others to answer (four eyes), said so and not asked
        while True:
            await self.trace(result.session_id)
            if result.status != "waiting" or not result.pending:
                break
            # as a typed message answers them: a session-limit prompt first, else as asked
            open_requests = sorted(
                (r for r in result.pending if r.id not in answered | unanswerable | theirs),
                key=lambda r: r.kind != "session-limit",
            )
            others = [r.id for r in result.pending if r.id not in unanswerable]
            if not open_requests and theirs & set(others):  # a message of theirs withdraws it
                steered = await self.steer_past(result.session_id, others)
                if steered is None:
                    return False
                result = steered
                continue
            if not open_requests and others:  # e.g. approvals=N: the others must answer now
                self.say_waiting(result.session_id, others)
                return False
            if not open_requests:  # each said how it can be settled instead
                return False
            request = open_requests[0]
            why = await self.for_others(request)
            if why is not None:  # waits for others, as a quorum this chat voted in does
                self.console.print(f"[yellow]{printable(why)}[/]")
                theirs.add(request.id)
                continue
            why = await self.cannot_answer(request)
            if why is not None:
                self.console.print(f"[yellow]{printable(why)}[/]")
                unanswerable.add(request.id)
                continue
            with ctrl_c_interrupts():
                answer = self.channel.ask(request)
            if answer is None and self.in_memory:
                self.console.print(
                    f"\n[yellow]left {request.id} pending[/]; its store is this process's memory "
                    "(sqlite:///:memory:), so it is lost when chat exits: no command can answer "
                    "it later"
                )
                return False
            if answer is None:
                where = self.answer_args(request)
                later = (
                    f"`signoff approve {where}` or `signoff deny {where}`"
                    if request.kind == "tool-approval"
                    else f"`signoff answer {where} " + "` or `".join(answer_flags(request)) + "`"
                )
                self.console.print(
                    f"\n[yellow]left {request.id} pending[/]; answer it later with {later}"
                )
                return False
            answered.add(request.id)
            try:
                with self.console.status(f"{printable(self.agent.name)} is working..."):
                    result = await self.runtime.respond(
                        result.session_id, [answer], principal=self.principal
                    )
            except NotAllowed as exc:
                self.console.print(f"[red]{type(exc).__name__}: {printable(str(exc))}[/]")
                # The store only as typed: the runtime's own URL, password masked, would not open.
                on = store_args(self.store) if self.store else []
                again = shlex.join(["chat", self.target, "--session", result.session_id, *on])
                hint = asker_hint(again, request, self.principal)
                if hint is not None:
                    self.console.print(f"[dim]{printable(hint)}[/]")
                self.refused = True
                return False
            except UnknownTool as exc:  # a deploy took the tool since `cannot_answer`
                self.console.print(f"[red]{type(exc).__name__}: {printable(str(exc))}[/]")
                answered.discard(request.id)
                unanswerable.add(request.id)
                unanswered.add(request.id)
            except AnswerError as exc:  # someone else answered first, or it closed meanwhile
                self.console.print(f"[red]{type(exc).__name__}: {printable(str(exc))}[/]")
                result = await self.runtime.generate(session_id=result.session_id)
            except (InvalidAnswer, TooLarge) as exc:  # what was typed cannot be taken: ask again
                self.console.print(f"[red]{type(exc).__name__}: {printable(str(exc))}[/]")
                answered.discard(request.id)
                unanswered.add(request.id)
            else:
                unanswered.discard(request.id)
        self.report(result)
        return True

    async def trace(self, session_id: str) -> None:
        """Print what tools did since the last look, one dim line each."""
        async for event in self.runtime.events(session_id, after=self.seen, follow=False):
            self.seen = event.seq
            if event.type == "tool.completed":
                self.console.print(f"  [dim]{printable(tool_line(event.data))}[/]")

    def report(self, result: GenerateResult) -> None:
        if result.status == "completed":
            self.console.print(
                f"[bold cyan]{printable(self.agent.name)}:[/] {printable(result.text)}"
            )
        elif result.status == "failed":
            self.failed = True
            retry = " (type /retry to resume it)" if result.retryable else ""
            self.console.print(
                f"[red]the turn failed: {printable(error_text(result.error))}{retry}[/]"
            )
        elif result.status == "running":
            self.console.print("[yellow]another process is running this session's turn[/]")
        elif result.status == "cancelled":
            self.console.print("[yellow]the turn was cancelled[/]")
        elif result.status == "waiting":
            self.console.print("[yellow]the turn is waiting[/]")


@app.command()
def chat(
    target: Annotated[
        str, typer.Argument(metavar="MODULE:RUNTIME", help="A Runtime or Agent to load.")
    ],
    agent: Annotated[
        str | None,
        typer.Option(
            "--agent", metavar="NAME", help="Agent to talk to (if the runtime has several)."
        ),
    ] = None,
    session: Annotated[
        str | None,
        typer.Option(
            "--session",
            metavar="SESSION_ID",
            help="Continue this session (with its agent) instead of a new one.",
        ),
    ] = None,
    store: StoreOption = None,
    acting_as: AsOption = None,
) -> None:
    """Talk to an agent in the terminal; approvals are asked inline as `(y/N)` prompts.

    Exit status 1 when something typed was not carried out: a message or an answer refused
    (and never given after), or a turn that failed and that no /retry resumed; 0 otherwise,
    also when a request is left pending."""
    undone = False

    async def go() -> None:
        nonlocal undone
        with misuse():
            refuse_undecodable({"--agent": agent, "--session": session})
            refuse_empty_ids({"--agent": agent, "--session": session})
            principal = parse_principal(acting_as)
            split_target(target)
        if sys.stdin is None:  # started with it closed (`<&-`): `input()` would raise
            raise UsageError("chat reads what you type from standard input, which is closed")
        runtime = driving(load_runtime(target, store))
        own_store(runtime.store)
        if not runtime.agents:
            raise UsageError(f"{target} has no agents to chat with")
        # --session names its agent, so a runtime of several needs no --agent to continue it
        by_session = session is not None and agent is None and len(runtime.agents) > 1
        picked = None if by_session else pick_agent(runtime, agent)
        console = out()
        async with runtime:
            if picked is None:
                # read only: `Runtime.state` would record a passed TTL, which `resumable` refuses
                owner = (await runtime._state(str(session))).agent
                # one it lacks: any of its agents, which `reopen` then refuses, naming them
                picked = runtime.agents.get(owner) or next(iter(runtime.agents.values()))
            chat = _Chat(
                runtime, picked, console, principal, target=target, acting_as=acting_as, store=store
            )
            await chat.run(session)
            undone = chat.undone

    run(go())
    if undone:
        raise typer.Exit(1)
