"""`ToolContext`, what a tool receives as its optional first parameter, and the `Journal` the
engine gives it, so that `ctx.ask()` and `ctx.step()` are recorded and replayed."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import types
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, NoReturn, Protocol

from ._approval import SessionInfo
from ._exceptions import TooLarge, UsageError
from ._option_names import shadowed_number, twin_labels
from ._steps import raise_recorded
from ._sync import failure, thread_to_end
from ._text import is_blank, is_utf8
from ._tool_json import copied
from ._tool_signals import (
    ApprovalRequired,
    InputUnavailable,
    QuestionWithdrawn,
    misuse_in_step,
)
from ._types import Answer, Option, Principal, make_options

__all__ = ["MAX_STEP_NAME_CHARS", "Journal", "ReplayError", "ToolContext"]


class ReplayError(UsageError):
    """A workflow tool asked or stepped in a different order than it recorded."""

    code = "replay_error"


class Journal(Protocol):
    """What the engine gives a `ToolContext` so `ask` and `step` are recorded and replayed."""

    can_ask: bool

    @property
    def keyed(self) -> bool:
        """Entries are keyed by kind, name and occurrence (else by position: older calls)."""
        ...

    def entries(self) -> Sequence[dict[str, Any] | None]: ...

    def lookup(self, request_id: str) -> tuple[str, dict[str, Any] | None]: ...

    def asked(self, request_id: str) -> tuple[list[Option], bool] | None:
        """The options and `allow_text` question `request_id` was asked with (None: unknown)."""
        ...

    async def run_step(
        self,
        index: int,
        name: str,
        run: Callable[[], Awaitable[Any]],
        *,
        plain: bool = False,
        child: bool = False,
    ) -> Any: ...

    def lost(self) -> bool:
        """Whether the session's lease was lost: nothing the call does can be recorded now."""
        ...

    def bound_question(self, question: str, options: list[Option]) -> None:
        """Raise `TooLarge` for a question over its bounds (too many options, too many bytes)."""
        ...

    async def open_question(
        self, index: int, question: str, options: list[Option], allow_text: bool
    ) -> str: ...

    async def park(self) -> NoReturn: ...

    async def settle(self) -> None: ...


MAX_STEP_NAME_CHARS = 1000
"""The longest name `ctx.step()` takes: every step's name is journaled in the session's log
(and read back on each replay), so a name is a label, not the data the step handles."""

REPLAY_GRACE = 2.0
"""Seconds a new entry waits, on replay, for sibling branches to reach the entries they
recorded (they may first await what is not journaled, a read say) before it is a ReplayError."""

_GRACE_PER_WAIT = 0.1
"""The most of `REPLAY_GRACE` one wait of 0.02 s counts, however long it took: a loop stalled
for longer (a busy machine, a blocking call) gave the siblings no more time to get anywhere."""

_IN_STEP: contextvars.ContextVar[tuple[ToolContext, str] | None] = contextvars.ContextVar(
    "signoff_in_step", default=None
)
"""The context and name of the step whose function is running (in this task and those it
starts): that function may not step or ask through the same context."""


_GENERATES = inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR


def _generates(fn: Any) -> bool:
    """`inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn)`, read straight from
    a plain function's code: the two took a third of a replayed step's time (every step is
    checked, replayed or not)."""
    if type(fn) is types.FunctionType:
        return bool(fn.__code__.co_flags & _GENERATES)
    return inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn)


class ToolContext:
    """What a tool receives as its optional first parameter."""

    def __init__(
        self,
        *,
        session: SessionInfo,
        call_id: str,
        tool_name: str,
        idempotency_key: str,
        abort_signal: asyncio.Event | None = None,
        journal: Journal | None = None,
    ) -> None:
        self.session = session
        self.call_id = call_id
        self.tool_name = tool_name
        self._key = idempotency_key
        self.abort_signal = abort_signal or asyncio.Event()
        self._journal = journal
        self._cursor = 0  # places claimed this run (the position of entries journaled by one)
        self._seen: dict[tuple[str, str], int] = {}  # (kind, name): occurrences claimed this run
        # The keyed entries no branch of this run has claimed yet, by kind, name and occurrence
        # (in the journal's order), and how many of the journal's entries they were taken from:
        # each claim is a look-up, not a scan of every entry (N steps replayed cost N²).
        self._left: dict[tuple[str, str, Any], dict[str, Any]] = {}
        self._indexed = 0

    def _outside_steps(self, kind: str) -> None:
        """Refuse `ctx.step()`/`ctx.ask()` from a step's own function: a question would park
        inside the step, which the body's park waits for (a drive hung for ever), and an inner
        step is never replayed, as the outer one replays whole (a later entry's ReplayError)."""
        running = _IN_STEP.get()
        if running is not None and running[0] is self:
            raise misuse_in_step(
                UsageError(
                    f"ctx.{kind}() inside step {running[1]!r}: a step's function may not step "
                    "or ask (call them from the tool's body)"
                )
            )

    def _next(self, kind: str, name: str) -> tuple[int, dict[str, Any] | None]:
        """Claim the journal place of this `kind`/`name` and return it with what it recorded.

        A call's entries are keyed by kind, name and occurrence (the nth step of that name), so
        concurrent branches (asyncio.gather) find their own entries in whatever order they get
        there. Calls journaled before keys existed (`Journal.keyed` false) replay by position,
        as they were recorded.
        """
        if self._journal is None:
            raise UsageError(f"ctx.{kind}() needs a context given by the signoff engine")
        position = self._cursor
        self._cursor += 1
        if self._journal.keyed:
            self._index()
            n = self._seen.get((kind, name), 0)
            self._seen[(kind, name)] = n + 1
            return n, self._left.pop((kind, name, n), None)
        entries = self._journal.entries()
        entry = entries[position] if position < len(entries) else None
        if entry is not None and (entry["kind"] != kind or entry["name"] != name):
            raise self._diverged(kind, name, position, entry)
        return position, entry

    def _diverged(
        self, kind: str, name: str, position: int, recorded: dict[str, Any]
    ) -> ReplayError:
        return ReplayError(
            f"tool {self.tool_name!r} (call {self.call_id}) replayed {kind} {name!r} at "
            f"position {position + 1}, but recorded {recorded['kind']} {recorded['name']!r} "
            "there; a workflow tool must ask and step in the same order on every run"
        )

    def _index(self) -> None:
        """Take into `_left` the keyed entries journaled since it was last brought up to date
        that no branch of this run has claimed (an entry claimed this run is recorded after its
        claim, so in a run only the first call finds any). A journal shorter than what was taken
        (a state read again) is taken again from its start."""
        assert self._journal is not None
        entries = self._journal.entries()
        if len(entries) < self._indexed:
            self._left, self._indexed = {}, 0
        for i in range(self._indexed, len(entries)):
            e = entries[i]
            if e is not None and self._seen.get((e["kind"], e["name"]), 0) <= e.get("n", 0):
                self._left.setdefault((e["kind"], e["name"], e.get("n")), e)
        self._indexed = len(entries)

    def _as_asked(
        self,
        entry: dict[str, Any],
        options: Any,
        opts: list[Option],
        allow_text: bool,
        refused: UsageError | None,
    ) -> tuple[list[Option], UsageError | None]:
        """The options of a question asked before, as it was asked: those without an id take
        the ids they were asked with, matched by what they show (`make_options(asked=...)`), as
        ids made by position and clash suffixes differ when the same come in another order; and
        an older signoff made an option id of 0 or "" from the label, and `str()`-ed any other,
        where ids are checked now. Those replay as they were asked, not as a `ReplayError`."""
        assert self._journal is not None
        asked = self._journal.asked(entry["request_id"])
        if asked is None or (refused is None and _same_choice(asked, (opts, allow_text))):
            return opts, refused
        for older in (False, True):
            try:
                again = make_options(options, before_ids_checked=older, asked=asked[0])
            except ValueError:
                continue
            if _same_choice(asked, (again, allow_text)):
                return again, None
        return opts, refused

    def _pass_over(self, kind: str, name: str) -> None:
        """Take as reached an entry an older version of the body recorded next and this one no
        longer makes (a delegate call's `subagent.turn`), so the body's end does not take it
        for one the body failed to reach (`_reached_all`)."""
        if self._journal is None:
            return
        if self._journal.keyed:
            self._index()
            n = self._seen.get((kind, name), 0)
            if self._left.pop((kind, name, n), None) is not None:
                self._seen[(kind, name)] = n + 1
            return
        entries = self._journal.entries()
        entry = entries[self._cursor] if self._cursor < len(entries) else None
        if entry is not None and (entry["kind"], entry["name"]) == (kind, name):
            self._cursor += 1

    def _reached_all(self) -> None:
        """At the body's return: `ReplayError` if it left an entry it recorded unreached (a
        branch taken on a read that is not journaled, say), as a step or question it reaches
        in another order is one: the effects of what it skipped happened, and its result says
        otherwise."""
        if self._journal is None:
            return
        if self._journal.keyed:
            left = self._unreplayed()
        else:
            left = [e for e in self._journal.entries()[self._cursor :] if e is not None]
        if left:
            raise ReplayError(
                f"tool {self.tool_name!r} (call {self.call_id}) returned without replaying "
                f"{left[0]['kind']} {left[0]['name']!r}, which it recorded; a workflow tool must "
                "ask and step in the same order on every run"
            )

    def _unreplayed(self) -> list[dict[str, Any]]:
        """Recorded entries no branch of this run has reached yet."""
        self._index()
        return list(self._left.values())

    async def _replayed_first(self, kind: str, name: str) -> None:
        """Before a new entry, let sibling branches replay what they recorded (they may be
        behind this one now, awaiting a read before their step); one that no branch reaches
        within `REPLAY_GRACE` seconds of the last one reached means the tool changed:
        ReplayError, and the new entry is not run. Those seconds are counted as the loop ran
        (`_GRACE_PER_WAIT`): on the wall clock alone, a stall longer than the grace ended it
        before a sibling whose read had come back could run."""
        assert self._journal is not None
        if not self._journal.keyed:
            return
        position = self._cursor - 1  # claimed just before this is called, with no await between
        loop = asyncio.get_running_loop()
        left, idle, waited = self._unreplayed(), 0, 0.0
        while left:
            if idle >= 20 and waited >= REPLAY_GRACE:
                raise self._diverged(kind, name, position, left[0])
            # A few loop passes first (a sibling's replay needs no more), then real waits.
            before = loop.time()
            await asyncio.sleep(0 if idle < 20 else 0.02)
            now = self._unreplayed()
            if len(now) < len(left):
                idle, waited = 0, 0.0
            else:
                idle += 1
                waited += min(loop.time() - before, _GRACE_PER_WAIT)
            left = now

    async def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run a side effect once and journal its result; a replay returns the recorded result.

        A step that raises is journaled too, and its replay raises the same exception again
        (`StepFailed` when it cannot be rebuilt) instead of running the step again. Replay finds
        a step by its name and occurrence: concurrent branches that step under the same name
        must reach it in the same order on every run, so give each its own name. The step's
        own function may not step or ask (`UsageError`); a plain one runs in a thread. `name`
        and `fn` are positional only, so `fn` may take keyword arguments of those names; a name
        over `MAX_STEP_NAME_CHARS` characters raises `TooLarge`, and nothing runs (one journaled
        before that limit replays).
        """
        return await self._step(name, fn, args, kwargs)

    async def _step(
        self,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        child: bool = False,
    ) -> Any:
        """`step`; `child` marks it as a delegate call's creation of its child session (the
        runtime's own, `_subagents`): a tool's step of the same name makes no session its child."""
        # The name is journaled as JSON and looked up by it on replay: a tuple came back a list
        # (unhashable, so the replay failed after the step had run), a number was no name.
        if not isinstance(name, str) or not name:
            raise UsageError(f"ctx.step() needs a name (non-empty text), not {name!r}")
        if not callable(fn):
            raise UsageError(f"ctx.step({name!r}, fn): fn must be a function, not {fn!r}")
        if _generates(fn):
            # Its body would not run: its result, the generator, has no JSON form to journal.
            raise UsageError(
                f"ctx.step({name!r}, fn): fn is a generator function; a step returns its result "
                "(collect what it yields into a list)"
            )
        self._outside_steps("step")
        index, entry = self._next("step", name)
        if entry is None and len(name) > MAX_STEP_NAME_CHARS:  # nothing is run or journaled
            # Only a new step: one journaled before the limit (a call parked across the
            # upgrade) replays as it was recorded.
            raise TooLarge(
                f"ctx.step(): a step name of {len(name)} characters, over the limit of "
                f"{MAX_STEP_NAME_CHARS} ({name[:40]!r}...); name the step, not its data"
            )
        if entry is not None:
            if entry.get("error") is not None:
                raise_recorded(name, entry["error"])
            # A copy: the entry is the session's state, which a tool changing it would change.
            return copied(entry["result"])
        await self._replayed_first("step", name)
        journal = self._journal
        assert journal is not None

        stopped = False  # the body was cancelled while the step's thread ran on

        async def run() -> Any:
            nonlocal stopped
            running = _IN_STEP.set((self, name))
            try:
                if inspect.iscoroutinefunction(fn):
                    result = await fn(*args, **kwargs)
                else:  # in a thread, as a sync tool: blocking, it would stop lease renewals
                    work, stopped = await thread_to_end(fn, journal.lost, *args, **kwargs)
                    result = work.result()
                if inspect.isawaitable(result):
                    result = await result
            except BaseException as exc:  # its SystemExit: the step's failure, not the end
                failed = failure(exc)
                if failed is None:
                    raise
                raise failed from exc
            finally:
                _IN_STEP.reset(running)
            return result

        try:
            plain = not inspect.iscoroutinefunction(fn)  # its thread runs on, cancelled or not
            journaled = await journal.run_step(index, name, run, plain=plain, child=child)
        finally:
            if stopped:  # its effect (or failure) is journaled now: the cancel goes on
                raise asyncio.CancelledError
        return copied(journaled)  # as journaled

    async def ask(
        self,
        question: str,
        options: Iterable[str | Option | dict[str, Any]] | None = None,
        allow_text: bool = True,
    ) -> Answer:
        """Ask a person and park the turn durably until they answer; returns their answer.

        More than `MAX_OPTIONS` options, or a question and options over the tool's
        `max_result_bytes` as JSON, raise `TooLarge` and ask nothing."""
        if not isinstance(question, str) or not question.strip():
            raise UsageError("ctx.ask() needs a non-empty question")
        if isinstance(options, Iterable) and not isinstance(options, (str, bytes, Mapping)):
            # Read once: a replay makes them again (`_as_asked`), which a generator used up
            # would make none of (a ReplayError, the person's answer lost).
            options = list(options)
        if not isinstance(allow_text, bool):
            # "no" is true, so it passed the check below, and the request read it as False.
            raise UsageError(f"ctx.ask(): allow_text must be True or False, not {allow_text!r}")
        refused: UsageError | None = None
        try:
            opts = make_options(options)
        except ValueError as exc:
            refused, opts = UsageError(f"ctx.ask(): {exc}"), []
        if refused is None and not opts and not allow_text:
            raise UsageError("ctx.ask() without options must allow free text")
        self._outside_steps("ask")
        index, entry = self._next("ask", question)
        if entry is not None:  # asked before: perhaps by an older signoff, with its option ids
            opts, refused = self._as_asked(entry, options, opts, allow_text, refused)
        if refused is not None:
            raise refused
        journal = self._journal
        assert journal is not None
        if entry is None:
            _askable(question, opts)
            if not journal.can_ask:
                raise InputUnavailable("this session has no person to ask")
            # Refused before waiting for siblings to replay: on replay this branch's own later
            # entries are not reached until it goes on (a ReplayError after the grace).
            journal.bound_question(question, opts)
            await self._replayed_first("ask", question)
            await journal.open_question(index, question, opts, allow_text)
            await journal.park()
        request_id = entry["request_id"] if entry else ""
        asked = journal.asked(request_id) if entry else None
        if asked is not None and not _same_choice(asked, (opts, allow_text)):
            raise ReplayError(
                f"tool {self.tool_name!r} (call {self.call_id}) replayed ask {question!r} with "
                "other options (or free text allowed or not) than it was asked with, so its "
                "answer is to another question; a workflow tool must ask the same on every run"
            )
        status, resolution = journal.lookup(request_id)
        if status == "pending":
            await journal.park()
        if not journal.keyed:
            # When first asked, this branch parked while sibling branches (asyncio.gather) went
            # on to their own asks: on replay they go first too, so each takes its position.
            await journal.settle()
        resolution = resolution or {}
        if resolution.get("outcome") != "answered":
            raise QuestionWithdrawn(request_id, str(resolution.get("outcome")))
        answer = resolution.get("answer") or {}
        by = resolution.get("by")
        return Answer(
            value=answer.get("value", ""),
            option_id=answer.get("option_id"),
            text=answer.get("text"),
            # Who answered, without the channel attributes they arrived with (as in eve).
            responder=None if by is None else Principal.model_validate({**by, "attributes": {}}),
        )

    def idempotency_key(self, name: str | None = None) -> str:
        """A key stable across replays and processes for this call (and `name` within it):
        `<session>:<n>:<call id>`, the id's `%` and `:` escaped, then `:<name>`, so no two calls'
        keys are alike, named or not. A call keeps the key it started with (an older signoff's)."""
        return self._key if name is None else f"{self._key}:{name}"

    def request_approval(self, payload: Any = None) -> NoReturn:
        """Park the turn until a person decides; the decision becomes this call's result."""
        raise ApprovalRequired(payload, call_id=self.call_id)


def _askable(question: str, options: list[Option]) -> None:
    """Refuse a new question a person cannot read or answer: one that shows nothing, an option
    whose label or id shows nothing (only invisible characters: an empty button), two options
    whose labels read the same (`twin_labels`), a label `#2` that takes the reply naming the
    second option (`shadowed_number`), or a question or description no UTF-8 transport can send
    (a lone surrogate). Only a new one: a question recorded before these checks replays as it
    was asked."""
    if is_blank(question):
        raise UsageError("ctx.ask() needs a non-empty question")
    if not is_utf8(question):
        raise UsageError("ctx.ask(): the question is not valid Unicode text")
    for i, option in enumerate(options, 1):
        for field in ("label", "id"):
            if is_blank(getattr(option, field)):
                raise UsageError(f"ctx.ask(): option #{i} has a blank {field}")
        if not is_utf8(option.description or ""):
            raise UsageError(f"ctx.ask(): option #{i}'s description is not valid Unicode text")
    problem = twin_labels(options) or shadowed_number(options)
    if problem is not None:
        raise UsageError(f"ctx.ask(): {problem}")


def _same_choice(asked: tuple[list[Option], bool], now: tuple[list[Option], bool]) -> bool:
    """Whether a question replayed offers what it was answered from: the same options (in any
    order: one built from a set may come in another) and free text allowed or not alike."""
    return asked[1] == now[1] and {o.id: o for o in asked[0]} == {o.id: o for o in now[0]}
