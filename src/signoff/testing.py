"""Helpers for testing agents built on signoff: record tool executions, script models, fake time.

log = ExecutionLog()

@log.tool(approval=so.always())
async def issue_refund(order_id: str, amount: float) -> dict[str, float]:
    return {"refunded": amount}

seen = Capture(reply("Done."))
first = call_tools(call("issue_refund", order_id="1", amount=5))
agent = scripted_agent("support", [first, seen], tools=[issue_refund])
...
assert log.count("issue_refund") == 1 and tool_results(seen.last)[0].content == {"refunded": 5}
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Any, TypedDict, Unpack, overload

from pydantic import BaseModel
from pydantic_core import PydanticSerializationError

from ._agent import Agent, Limits
from ._approval import Guardrail
from ._events import Event
from ._exceptions import UsageError
from ._runtime import Runtime
from ._settings import finite
from ._tool_context import ToolContext
from ._tools import RunAs, Tool, ToolApproval
from ._types import InputRequest, Message, ModelResponse, ToolCall, ToolResultMessage, Usage
from .models import Scripted
from .models._scripted import Step, misfit
from .stores import PendingFilter, Store
from .stores._pending import first_seen
from .stores.sqlite._url import sqlite_url

__all__ = [
    "Capture",
    "Execution",
    "ExecutionLog",
    "Flaky",
    "ManualClock",
    "RecordingTool",
    "RuntimeOptions",
    "StoreContents",
    "call",
    "call_tools",
    "reply",
    "scripted_agent",
    "sqlite_runtime",
    "store_contents",
    "timeline",
    "tool_results",
]


# -- recording tool executions -------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Execution:
    """One time a tool body started: which call, under which idempotency key, with what input.

    `replay` is true when the body started again over what its call journaled before (a
    workflow tool resumed once its question was answered: its steps return their recorded
    results rather than run again).
    """

    tool_name: str
    session_id: str
    call_id: str
    idempotency_key: str
    input: dict[str, Any]
    principal_id: str | None = None
    replay: bool = False


def _execution(raw: bytes, path: Path, number: int) -> Execution:
    """The execution line `number` of the log at `path` records; a line it cannot read (another
    signoff's, or a file that is no execution log) is a `UsageError`, never skipped: a count
    that left it out would lie."""
    where = f"execution log {path}, line {number}"
    try:
        line = raw.decode()
    except UnicodeDecodeError as exc:
        raise UsageError(f"{where}: not UTF-8 text ({exc})") from None
    try:
        fields = json.loads(line)
    except ValueError as exc:
        raise UsageError(f"{where}: not JSON ({exc})") from None
    if not isinstance(fields, dict):
        raise UsageError(f"{where}: not a JSON object but {type(fields).__name__}")
    unknown = sorted(set(fields) - {f.name for f in dataclass_fields(Execution)})
    if unknown:
        raise UsageError(f"{where}: keys an Execution does not have: {', '.join(unknown)}")
    try:
        return Execution(**fields)
    except TypeError as exc:  # a key it needs is missing
        raise UsageError(f"{where}: {exc}") from None


def _check_log_file(path: str | os.PathLike[str]) -> None:
    """Refuse a log file in no existing directory, also where a symlink points (dangling or
    in a loop): taken, every recording tool's call failed before its body ran, the model read
    that as the tool's error, and a count of 0 proved nothing."""
    target = Path(os.path.realpath(path))  # through symlinks, those dangling too
    if target.is_symlink():  # realpath stops at a loop
        raise UsageError(f"ExecutionLog's file {str(path)!r} is a symlink loop")
    for where in (Path(path).absolute().parent, target.parent):
        if not where.is_dir():
            raise UsageError(
                f"ExecutionLog's file {str(path)!r} is in no existing directory: make "
                f"{str(where)!r} first"
            )


class ExecutionLog:
    """Records every execution of the tools it made; with `path`, shared across processes.

    A file-backed log appends one JSON line per execution, so a test can count executions made
    by a child process that was killed half-way.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        if path is not None and (
            not isinstance(path, str | os.PathLike) or not str(path) or Path(path).is_dir()
        ):
            # A directory (or "", which is "."), taken, failed every recording tool's call
            # before its body ran; another type was a bare TypeError.
            raise UsageError(f"ExecutionLog takes the path of a file to append to, not {path!r}")
        if path is not None:
            _check_log_file(path)
        self.path = None if path is None else Path(path)
        self._executions: list[Execution] = []

    def record(self, execution: Execution) -> None:
        """Add one execution (the log's tools call this); a file-backed log appends its line
        in one write, so processes sharing the file do not interleave."""
        if self.path is None:
            self._executions.append(execution)
            return
        line = (json.dumps(asdict(execution), sort_keys=True) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    @property
    def executions(self) -> list[Execution]:
        """Every execution so far, oldest first."""
        if self.path is None:
            return list(self._executions)
        if not self.path.exists():
            return []
        lines = self.path.read_bytes().splitlines()
        return [_execution(line, self.path, n) for n, line in enumerate(lines, 1) if line.strip()]

    def of(self, tool_name: str | None = None, *, replays: bool = True) -> list[Execution]:
        """The executions (of `tool_name`, if given), oldest first; `replays=False` leaves out
        a workflow tool's body replaying its journal (`Execution.replay`)."""
        return [
            e
            for e in self.executions
            if (tool_name is None or e.tool_name == tool_name) and (replays or not e.replay)
        ]

    def count(self, tool_name: str | None = None, *, replays: bool = True) -> int:
        """How many executions ran (of `tool_name`, if given): 1 proves exactly-once. A
        workflow tool's body starts again after each answer: `replays=False` counts first runs."""
        return len(self.of(tool_name, replays=replays))

    def keys(self, tool_name: str | None = None, *, replays: bool = True) -> list[str]:
        """The idempotency keys executions ran under, in order."""
        return [e.idempotency_key for e in self.of(tool_name, replays=replays)]

    def clear(self) -> None:
        """Forget every execution so far (a file-backed log deletes its file; one reached
        through a symlink, the file it names, not the link, which the next write made a file
        of its own)."""
        self._executions.clear()
        if self.path is not None and self.path.exists():
            Path(os.path.realpath(self.path)).unlink()

    @overload
    def tool(self, fn: Callable[..., Any] | Tool, /) -> RecordingTool: ...

    @overload
    def tool(
        self,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        approval: ToolApproval = None,
        run_as: RunAs = "requester",
        max_result_bytes: int | None = None,
    ) -> Callable[[Callable[..., Any]], RecordingTool]: ...

    def tool(
        self,
        fn: Callable[..., Any] | Tool | None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        approval: ToolApproval = None,
        run_as: RunAs = "requester",
        max_result_bytes: int | None = None,
    ) -> RecordingTool | Callable[[Callable[..., Any]], RecordingTool]:
        """Like `@so.tool`, but every execution is recorded in this log.

        Given a tool your code already made with `@so.tool`, returns a copy of it (same name,
        schema and approval) that records its executions: `log.tool(shop.issue_refund)`.
        """
        options = {
            "name": name,
            "description": description,
            "approval": approval,
            "max_result_bytes": max_result_bytes,
        }
        given = [k for k, v in options.items() if v is not None]
        given += ["run_as"] if run_as != "requester" else []
        if fn is not None and given:  # they would be dropped, unsaid
            raise UsageError(
                f"log.tool(fn) takes no {', '.join(given)}: decorate the function with "
                f"@log.tool({given[0]}=...) (a copy of an @so.tool keeps its own settings)"
            )
        if isinstance(fn, Tool):
            if type(fn) not in (Tool, RecordingTool):
                raise UsageError(
                    f"log.tool records tools made with @so.tool, not a {type(fn).__name__} "
                    f"({fn!r}), whose calls it would not run as they are"
                )
            copy = object.__new__(RecordingTool)
            copy.__dict__.update(vars(fn))
            copy.log = self
            return copy
        if fn is not None:
            return RecordingTool(fn, log=self)

        def wrap(f: Callable[..., Any]) -> RecordingTool:
            return RecordingTool(
                f,
                log=self,
                name=name,
                description=description,
                approval=approval,
                run_as=run_as,
                max_result_bytes=max_result_bytes,
            )

        return wrap


class RecordingTool(Tool):
    """A `Tool` that records each execution (before its body runs) in an `ExecutionLog`."""

    def __init__(self, fn: Callable[..., Any], *, log: ExecutionLog, **kwargs: Any) -> None:
        super().__init__(fn, **kwargs)
        self.log = log

    async def invoke(self, ctx: ToolContext, validated: BaseModel) -> Any:
        current = ctx.session.auth.current
        journal = ctx._journal  # what the call recorded before this run: a replay if anything
        replay = journal is not None and any(e is not None for e in journal.entries())
        self.log.record(
            Execution(
                tool_name=self.name,
                session_id=ctx.session.id,
                call_id=ctx.call_id,
                idempotency_key=ctx.idempotency_key(),
                input=_recorded(validated),
                principal_id=None if current is None else current.principal_id,
                replay=replay,
            )
        )
        return await super().invoke(ctx, validated)


def _recorded(validated: BaseModel) -> dict[str, Any]:
    """The call's input as JSON: a field a validator made an object with no JSON form (a
    connection handle) by its `str`, as tracing shows it; the tool takes it all the same."""
    try:
        return validated.model_dump(mode="json")
    except PydanticSerializationError:
        plain = validated.model_dump(warnings=False)  # secrets stay masked, as `str` shows them
        return dict(json.loads(json.dumps(plain, default=str)))


# -- scripting models ----------------------------------------------------------------------------


def call(name: str, /, *, call_id: str | None = None, **input: Any) -> ToolCall:
    """A tool call the scripted model proposes: `call("issue_refund", amount=180)`; every keyword
    is the tool's input (`id=` too) but `call_id`, the call's own id (the engine gives one if
    none)."""
    return ToolCall(name=name, input=input, id=call_id)


def call_tools(*calls: ToolCall, text: str = "", usage: Usage | None = None) -> ModelResponse:
    """A model response proposing `calls`, with optional text said before them."""
    return ModelResponse(text=text, tool_calls=list(calls), usage=usage or Usage())


def reply(text: str, *, usage: Usage | None = None) -> ModelResponse:
    """A final model response: text and no tool calls."""
    return ModelResponse(text=text, usage=usage or Usage())


def _respond(helper: str, respond: object) -> None:
    """A step's answer is a response or a function of the conversation returning one; refused
    now, not as a TypeError failing the turn at the model call."""
    if not (isinstance(respond, ModelResponse) or callable(respond)):
        raise UsageError(
            f"{helper}: respond is a {type(respond).__name__}: pass a ModelResponse (e.g. "
            "reply(...)) or a function of the conversation returning one"
        )
    if isinstance(respond, ModelResponse):
        return
    signature = misfit(respond)
    if signature is not None:
        raise UsageError(
            f"{helper}: respond is a function {signature}: it takes the conversation (one "
            "argument, the list of messages) and returns a ModelResponse"
        )


class Capture:
    """A scripted step that remembers every conversation it is shown, then answers.

    `respond` is a response, or a function of the conversation returning one.
    """

    def __init__(
        self,
        respond: ModelResponse | Callable[[list[Message]], ModelResponse] | None = None,
    ) -> None:
        self.respond = respond if respond is not None else reply("done")
        _respond("Capture", self.respond)
        self.conversations: list[list[Message]] = []

    def __call__(self, conversation: list[Message]) -> ModelResponse:
        self.conversations.append(list(conversation))
        if isinstance(self.respond, ModelResponse):
            return self.respond
        return self.respond(conversation)

    @property
    def last(self) -> list[Message]:
        """The conversation of the latest call; fails if the step was never called."""
        if not self.conversations:
            raise AssertionError("the captured step was never called by the model")
        return self.conversations[-1]


class Flaky:
    """A scripted step that raises `error` (an exception or its class) for its first `failures`
    calls, then answers; its calls are counted across every session it serves, in this process."""

    def __init__(
        self,
        respond: ModelResponse | Callable[[list[Message]], ModelResponse],
        *,
        failures: int = 1,
        error: Exception | type[Exception] | None = None,
    ) -> None:
        _respond("Flaky", respond)
        if not (isinstance(failures, int) and not isinstance(failures, bool) and failures >= 0):
            raise UsageError(f"Flaky: failures must be a whole number from 0, not {failures!r}")
        raisable = isinstance(error, type) and issubclass(error, Exception)
        if not (error is None or isinstance(error, Exception) or raisable):
            # A string failed the turn with "exceptions must derive from BaseException"; a
            # KeyboardInterrupt broke out of the runtime rather than fail the model call.
            raise UsageError(f"Flaky: error must be an Exception to raise, not {error!r}")
        if isinstance(error, type):
            try:  # raised as `raise cls`, which makes it with no arguments, mid-turn
                error()
            except Exception as exc:
                raise UsageError(
                    f"Flaky: {error.__name__} cannot be made without arguments ({exc}): "
                    f"give an instance, such as {error.__name__}(...)"
                ) from None
        self.respond = respond
        self.failures = failures
        self.error = error or ConnectionError("model unavailable")
        self.calls = 0

    def __call__(self, conversation: list[Message]) -> ModelResponse:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        if isinstance(self.respond, ModelResponse):
            return self.respond
        return self.respond(conversation)


def scripted_agent(
    name: str,
    steps: Sequence[Step],
    *,
    tools: Sequence[Tool] = (),
    guardrails: Sequence[Guardrail] = (),
    limits: Limits | None = None,
    instructions: str = "",
    repeat_last: bool = False,
    cut_at_cap: bool = False,
) -> Agent:
    """An `Agent` whose model is `Scripted(steps)`."""
    return Agent(
        name=name,
        model=Scripted(steps, repeat_last=repeat_last, cut_at_cap=cut_at_cap),
        instructions=instructions,
        tools=tools,
        guardrails=guardrails,
        limits=limits,
    )


def tool_results(messages: Sequence[Message]) -> list[ToolResultMessage]:
    """The tool results in a conversation, in order."""
    return [m for m in messages if isinstance(m, ToolResultMessage)]


# -- time and the store --------------------------------------------------------------------------


class ManualClock:
    """A clock for `Runtime(clock=...)` that only moves forward, when told to."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        if not finite(start):  # "x" was a bare TypeError
            raise UsageError(f"start must be a finite time, not {start!r}")
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        """Move the clock `seconds` forward (0 or more) and return the new time."""
        if not (finite(seconds) and seconds >= 0):
            # Backwards or to NaN, deadlines and leases mean nothing (NaN: AppendConflict).
            raise UsageError(f"seconds must be a finite number from 0, not {seconds!r}")
        if not finite(self.now + seconds):  # two finite times may add up to inf
            raise UsageError(f"advancing {self.now!r} by {seconds!r} passes the largest time")
        self.now += seconds
        return self.now


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreContents:
    """Everything a store holds about one session; compare two to prove nothing changed."""

    head: int | None
    events: list[dict[str, Any]]
    requests: list[tuple[str, str]] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)


async def store_contents(store: Store, session_id: str) -> StoreContents:
    """Read a session's events, its requests with their statuses and the whole pending queue,
    each in full (the requests page after page)."""
    head = await store.head(session_id)
    events = [] if head is None else await store.read_events(session_id)
    every = await _every(store, PendingFilter(session_id=session_id, status=None))
    queue = await _every(store, PendingFilter())
    return StoreContents(
        head=head,
        events=[e.to_dict() for e in events],
        requests=[(r.id, r.status) for r in every],
        pending=[r.id for r in queue],
    )


async def _every(store: Store, flt: PendingFilter) -> list[InputRequest]:
    """Every request `flt` picks, read page after page (past the last one read) until the
    store gives an empty one: a store may give fewer than the limit it was asked for."""
    found: list[InputRequest] = []
    seen: set[str] = set()  # a request listed again past a deleted one's cursor
    flt = replace(flt, limit=1000)
    while page := await store.pending(flt):
        found += first_seen(page, seen)
        flt = replace(flt, after=(page[-1].created_at, page[-1].id))
    return found


def sqlite_runtime(
    directory: str | os.PathLike[str], *agents: Agent, **kwargs: Unpack[RuntimeOptions]
) -> Runtime:
    """A `Runtime` for `agents` on the SQLite file `state.db` in `directory` (e.g. pytest's
    tmp_path), made if new; another call on the same directory opens the same store, as a
    restarted process would."""
    if "store" in kwargs:  # was a bare TypeError: "got multiple values for keyword argument"
        raise UsageError(
            "sqlite_runtime makes its own store (state.db in the directory): pass store= to "
            "so.Runtime(...) instead"
        )
    if not isinstance(directory, str | os.PathLike):  # was a bare TypeError from Path()
        raise UsageError(
            f"sqlite_runtime takes the directory to put state.db in (pytest's tmp_path), not "
            f"{directory!r}"
        )
    where = Path(directory)
    if "://" in str(directory) or (where.exists() and not where.is_dir()):
        # A URL was taken for a path (./sqlite:/.../state.db made); a file was sqlite3's
        # "unable to open database file" at the first call.
        raise UsageError(
            f"sqlite_runtime takes the directory to put state.db in (pytest's tmp_path), not "
            f"{str(directory)!r}"
        )
    return Runtime(list(agents), store=sqlite_url(where / "state.db"), **kwargs)


class RuntimeOptions(TypedDict, total=False):
    """The keyword arguments of `Runtime(...)` but `store`, which `sqlite_runtime` passes on:
    a misspelt one is a type error, not a TypeError when the test runs."""

    clock: Callable[[], float]
    lease_ttl: float
    lease_wait: float
    cache_size: int
    poll_interval: float
    inline: bool
    tracer_provider: Any
    trace_content: bool


def timeline(events: Sequence[Event]) -> list[str]:
    """One short line per event (type and its key fields), to assert what happened, in order.

    `tool.completed lookup ok`, `input.requested question:Proceed?`, `input.resolved cancelled`,
    `approval.settled cancel`, `turn.message queued:Hi`; other types are just their name.
    """
    lines = []
    for e in events:
        d = e.data
        if e.type in ("tool.started", "tool.completed"):
            status = f" {d['status']}" if e.type == "tool.completed" else ""
            lines.append(f"{e.type} {d['tool_name']}{status}")
        elif e.type == "tool.step":
            lines.append(f"tool.step {d['tool_name']}:{d['name']}")
        elif e.type == "input.requested":
            asked = [
                f"{r['kind']}:{r.get('question') or (r.get('action') or {}).get('tool_name')}"
                for r in d["requests"]
            ]
            lines.append(f"input.requested {', '.join(asked)}")
        elif e.type == "input.resolved":
            lines.append(f"input.resolved {d['outcome']}")
        elif e.type == "approval.settled":
            lines.append(f"approval.settled {d['decision']}")
        elif e.type == "turn.message":
            lines.append(f"turn.message {'queued:' if d.get('queued') else ''}{d['message']}")
        else:
            lines.append(e.type)
    return lines
