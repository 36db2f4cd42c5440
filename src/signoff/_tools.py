"""Tool definitions: `@tool`, `Tool`, `ToolContext` and the `ApprovalRequired` signal."""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NoReturn, Protocol, get_type_hints, overload

from pydantic import (
    BaseModel,
    ConfigDict,
    PydanticUserError,
    Secret,
    SecretBytes,
    SecretStr,
    ValidationError,
    create_model,
)
from pydantic_core import to_jsonable_python

from ._approval import ApprovalPolicy, SessionInfo, as_policy
from ._events import dumps
from ._exceptions import UsageError
from ._response import ApprovalSpec, ResponsePolicy
from ._steps import raise_recorded
from ._types import Answer, Option, Principal, make_options

# The tool names OpenAI and Anthropic take.
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")

MAX_RESULT_BYTES = 1 << 20
"""The default bound on a tool's or step's result as JSON (`Limits.max_result_bytes`)."""

__all__ = [
    "ApprovalRequired",
    "InputUnavailable",
    "Journal",
    "MAX_RESULT_BYTES",
    "QuestionWithdrawn",
    "TOOL_NAME",
    "ReplayError",
    "Tool",
    "ToolContext",
    "holds_mask",
    "json_size",
    "jsonable",
    "over_limit",
    "tool",
]


class QuestionWithdrawn(Exception):  # a signal, not an error
    """Raised by `ctx.ask()` when its question was withdrawn (a steering message, a cancel)."""

    def __init__(self, request_id: str, outcome: str) -> None:
        super().__init__(f"question {request_id} was withdrawn ({outcome})")
        self.request_id = request_id
        self.outcome = outcome

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.request_id, self.outcome))


class InputUnavailable(Exception):  # a signal, not an error
    """Raised by `ctx.ask()` when no person can answer (for example a scheduled turn)."""


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

    async def run_step(self, index: int, name: str, run: Callable[[], Awaitable[Any]]) -> Any: ...

    async def open_question(
        self, index: int, question: str, options: list[Option], allow_text: bool
    ) -> str: ...

    async def park(self) -> NoReturn: ...

    async def settle(self) -> None: ...


class ApprovalRequired(Exception):
    """Raised inside a tool to park the turn until a person decides; not a failure.

    The reviewer's decision becomes the call's result; the tool body does not run again.
    `call_id` names the call that asks (`ctx.request_approval` fills it in); a signal naming
    another call opens no request, since an approval is bound to the exact call.
    """

    def __init__(self, payload: Any = None, *, call_id: str | None = None) -> None:
        if call_id is not None and not isinstance(call_id, str):
            raise UsageError(f"call_id must be the call's id (a str), not {call_id!r}")
        super().__init__(payload)
        self.payload = payload
        self.call_id = call_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_signal, (self.payload, self.call_id))


def _rebuild_signal(payload: Any, call_id: str | None) -> ApprovalRequired:
    """Unpickle an `ApprovalRequired` (its `call_id` is keyword-only)."""
    return ApprovalRequired(payload, call_id=call_id)


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
        entries = self._journal.entries()
        if self._journal.keyed:
            n = self._seen.get((kind, name), 0)
            self._seen[(kind, name)] = n + 1
            found = [
                e
                for e in entries
                if e is not None and (e["kind"], e["name"], e.get("n")) == (kind, name, n)
            ]
            return n, found[0] if found else None
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

    def _unreplayed(self) -> list[dict[str, Any]]:
        """Recorded entries no branch of this run has reached yet."""
        assert self._journal is not None
        return [
            e
            for e in self._journal.entries()
            if e is not None and self._seen.get((e["kind"], e["name"]), 0) <= e.get("n", 0)
        ]

    async def _replayed_first(self, kind: str, name: str) -> None:
        """Before a new entry, let sibling branches replay what they recorded (they may be
        behind this one now); one that no branch reaches means the tool changed: ReplayError."""
        assert self._journal is not None
        if not self._journal.keyed:
            return
        position = self._cursor - 1  # claimed just before this is called, with no await between
        left, idle = self._unreplayed(), 0
        while left:
            if idle == 20:
                raise self._diverged(kind, name, position, left[0])
            await asyncio.sleep(0)
            now = self._unreplayed()
            idle = 0 if len(now) < len(left) else idle + 1
            left = now

    async def step(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a side effect once and journal its result; a replay returns the recorded result.

        A step that raises is journaled too, and its replay raises the same exception again
        (`StepFailed` when it cannot be rebuilt) instead of running the step again. Replay finds
        a step by its name and occurrence: concurrent branches that step under the same name
        must reach it in the same order on every run, so give each its own name.
        """
        # The name is journaled as JSON and looked up by it on replay: a tuple came back a list
        # (unhashable, so the replay failed after the step had run), a number was no name.
        if not isinstance(name, str) or not name:
            raise UsageError(f"ctx.step() needs a name (non-empty text), not {name!r}")
        if not callable(fn):
            raise UsageError(f"ctx.step({name!r}, fn): fn must be a function, not {fn!r}")
        index, entry = self._next("step", name)
        if entry is not None:
            if entry.get("error") is not None:
                raise_recorded(name, entry["error"])
            return entry["result"]
        await self._replayed_first("step", name)
        assert self._journal is not None

        async def run() -> Any:
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
            return jsonable(result)

        return await self._journal.run_step(index, name, run)

    async def ask(
        self,
        question: str,
        options: Sequence[str | Option | dict[str, Any]] | None = None,
        allow_text: bool = True,
    ) -> Answer:
        """Ask a person and park the turn durably until they answer; returns their answer."""
        if not isinstance(question, str) or not question.strip():
            raise UsageError("ctx.ask() needs a non-empty question")
        try:
            opts = make_options(options)
        except ValueError as exc:
            raise UsageError(f"ctx.ask(): {exc}") from None
        if not opts and not allow_text:
            raise UsageError("ctx.ask() without options must allow free text")
        index, entry = self._next("ask", question)
        journal = self._journal
        assert journal is not None
        if entry is None:
            if not journal.can_ask:
                raise InputUnavailable("this session has no person to ask")
            await self._replayed_first("ask", question)
            await journal.open_question(index, question, opts, allow_text)
            await journal.park()
        request_id = entry["request_id"] if entry else ""
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
        """A key stable across replays and processes for this call (and `name` within it)."""
        return self._key if name is None else f"{self._key}:{name}"

    def request_approval(self, payload: Any = None) -> NoReturn:
        """Park the turn until a person decides; the decision becomes this call's result."""
        raise ApprovalRequired(payload, call_id=self.call_id)


def _sets_sorted(value: Any, form: Any) -> Any:
    """`form` (the JSON dump of `value`) with the lists that hold a set of `value` sorted."""
    if isinstance(value, set | frozenset) and isinstance(form, list):
        return sorted(form, key=lambda item: json.dumps(item, sort_keys=True))
    if isinstance(value, dict) and isinstance(form, dict) and len(value) == len(form):
        pairs = zip(form.items(), value.values(), strict=True)
        return {k: _sets_sorted(v, f) for (k, f), v in pairs}
    if isinstance(value, list | tuple) and isinstance(form, list) and len(value) == len(form):
        return [_sets_sorted(v, f) for v, f in zip(value, form, strict=True)]
    return form


_MASK = "**********"
"""How pydantic shows a secret as JSON, as a reviewer sees it."""


def holds_mask(validated: BaseModel) -> bool:
    """Whether validated input holds a secret whose value is its mask: what a reviewer's form
    gives back for a secret, which a tool must not be run with."""
    stack: list[Any] = [validated.model_dump()]
    while stack:
        value = stack.pop()
        if isinstance(value, SecretStr | SecretBytes | Secret):
            if value.get_secret_value() in (_MASK, _MASK.encode()):
                return True
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list | tuple | set | frozenset):
            stack.extend(value)
    return False


class _Input(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Tool:
    """A function the model may call, with a pydantic input schema and an approval policy."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        approval: object = None,
        run_as: str = "requester",
        workflow: bool | None = None,
        max_result_bytes: int | None = None,
    ) -> None:
        if not callable(fn):
            raise UsageError(f"a tool needs a function, not {fn!r}")
        if max_result_bytes is not None and (
            isinstance(max_result_bytes, bool)
            or not isinstance(max_result_bytes, int)
            or max_result_bytes < 1
        ):
            raise UsageError(
                f"max_result_bytes must be a positive whole number, not {max_result_bytes!r}"
            )
        # None: the agent's `Limits.max_result_bytes` bounds this tool's results.
        self.max_result_bytes = max_result_bytes
        if run_as not in ("requester", "approver"):
            raise UsageError(f"run_as must be 'requester' or 'approver', not {run_as!r}")
        self.fn = fn
        self.name = fn.__name__ if name is None else name  # "" is refused, not the function's
        if not isinstance(self.name, str) or not TOOL_NAME.fullmatch(self.name):
            # What OpenAI and Anthropic take: any other name fails every request with a 400.
            raise UsageError(
                f"tool name {self.name!r} must be 1 to 64 ASCII letters, digits, _ or -"
            )
        if description is not None and not isinstance(description, str):
            # Else it reached the provider as it was, which refused every call of the agent.
            raise UsageError(f"tool {self.name!r}: description must be text, not {description!r}")
        self.description = description or _describe(fn)
        self.response_policy: ResponsePolicy | None = None
        self.response_timeout = 10.0
        if isinstance(approval, ApprovalSpec):
            self.response_policy = approval.response
            self.response_timeout = approval.timeout
            approval = approval.request
        self.approval: ApprovalPolicy = as_policy(approval)
        self.run_as = run_as
        self.is_async = inspect.iscoroutinefunction(fn)
        self.takes_context, self.input_model = _input_model(fn, self.name)
        self._schema: dict[str, Any] | None = None
        self._has_sets: bool | None = None
        # A workflow tool may ask people things; approvals of its siblings wait for it.
        self.workflow = self.takes_context if workflow is None else workflow

    def __repr__(self) -> str:
        return f"Tool({self.name!r}, approval={self.approval.describe()})"

    def json_schema(self) -> dict[str, Any]:
        """The input schema as the model sees it (computed once)."""
        if self._schema is None:
            schema = self.input_model.model_json_schema()
            schema.pop("title", None)
            self._schema = schema
        return self._schema

    def validate(self, raw: Any) -> BaseModel:
        """Validate model-proposed input; raises `pydantic.ValidationError`, also for any other
        error a validator raises on it."""
        if not isinstance(raw, dict):
            raise ValidationError.from_exception_data(
                self.input_model.__name__,
                [{"type": "model_type", "loc": (), "input": raw, "ctx": {"class_name": "dict"}}],
            )
        try:
            validated = self.input_model.model_validate(raw)
            dumped = validated.model_dump()
        except ValidationError:
            raise
        except Exception as exc:
            # pydantic passes on what a validator raises other than ValueError: raised here, it
            # would fail the drive and leave its session running for good.
            raise ValidationError.from_exception_data(
                self.input_model.__name__,
                [
                    {
                        "type": "value_error",
                        "loc": (),
                        "input": raw,
                        "ctx": {"error": f"{type(exc).__name__}: {exc}"},
                    }
                ],
            ) from None
        bad = _non_finite(dumped, ())
        if bad is not None:
            loc, value = bad
            raise ValidationError.from_exception_data(
                self.input_model.__name__,
                [{"type": "finite_number", "loc": loc, "input": value}],
            )
        return validated

    def approved_form(self, validated: BaseModel) -> dict[str, Any]:
        """Validated input as a reviewer sees it and an approval binds it: JSON, by the names
        the model is shown (aliases), so that it validates again to the same input; a set in
        sorted order, as its own order is another in each process (hash randomization)."""
        form = validated.model_dump(mode="json", by_alias=True)
        if self._has_sets is None:  # a set is an array of unique items to JSON schema
            self._has_sets = "uniqueItems" in json.dumps(self.json_schema())
        if not self._has_sets:
            return form
        return _sets_sorted(validated.model_dump(by_alias=True), form)  # type: ignore[no-any-return]

    async def invoke(self, ctx: ToolContext, validated: BaseModel) -> Any:
        """Run the body with validated input; returns its result as JSON-able data."""
        kwargs = {name: getattr(validated, name) for name in type(validated).model_fields}
        args = (ctx,) if self.takes_context else ()
        if self.is_async:
            result = await self.fn(*args, **kwargs)
        else:
            result = await asyncio.to_thread(self.fn, *args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
        return jsonable(result)


def jsonable(value: Any) -> Any:
    """`value` as plain JSON data, with NaN and infinities as null (as pydantic writes them in
    JSON): what a tool hands back is stored and streamed, and strict JSON readers refuse them.
    An int of more than 4300 digits raises ValueError: Python neither writes nor reads its JSON."""
    return _finite(to_jsonable_python(value))


_INT_DIGITS = 4300  # Python's default bound on an int's digits as text (sys.int_info)
_INT_TOO_BIG = 10**_INT_DIGITS


def json_size(value: Any) -> int:
    """How many bytes `value` takes as stored JSON (UTF-8, compact)."""
    text = dumps(value)
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def over_limit(what: str, value: Any, limit: int) -> str | None:
    """Why `value` may not be stored (its JSON is over `limit` bytes), or None when it fits."""
    if isinstance(value, str) and len(value) * 4 + 2 <= limit:
        return None  # fits however it encodes: no need to measure
    size = json_size(value)
    if size <= limit:
        return None
    return f"{what} {size} bytes, over the limit of {limit} bytes (max_result_bytes); return less"


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, int) and value.bit_length() > 14_000 and abs(value) >= _INT_TOO_BIG:
        # Stored, it failed the commit (or, in a process that raised the bound, every read).
        raise ValueError(
            f"an int of more than {_INT_DIGITS} digits has no JSON form signoff can store: "
            "return it as a string"
        )
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _non_finite(
    value: Any, loc: tuple[str | int, ...]
) -> tuple[tuple[str | int, ...], float] | None:
    """Where validated input holds NaN or an infinity (pydantic parses "NaN" and "1e400" into
    floats): such input would slip past `amount > 100` and reach the reviewer as null."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (loc, value)
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = _non_finite(item, (*loc, key if isinstance(key, (str, int)) else str(key)))
        if found is not None:
            return found
    return None


def _describe(fn: Callable[..., Any]) -> str:
    doc = inspect.getdoc(fn) or ""
    return doc.split("\n\n", 1)[0].replace("\n", " ").strip()


def _input_model(fn: Callable[..., Any], name: str) -> tuple[bool, type[BaseModel]]:
    sig = inspect.signature(fn)
    try:
        hints = get_type_hints(fn, include_extras=True)
    except Exception as exc:
        raise UsageError(f"tool {name!r}: cannot resolve its type hints: {exc}") from exc
    params = list(sig.parameters.values())
    takes_context = False
    if params and (
        hints.get(params[0].name) is ToolContext
        or (params[0].name == "ctx" and params[0].name not in hints)
    ):
        takes_context = True
        params = params[1:]
    fields: dict[str, Any] = {}
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise UsageError(f"tool {name!r}: parameter {p.name!r} must be a named parameter")
        if p.name not in hints:
            raise UsageError(f"tool {name!r}: parameter {p.name!r} needs a type hint")
        if hints[p.name] is ToolContext:
            raise UsageError(
                f"tool {name!r}: the ToolContext parameter {p.name!r} must be the first one"
            )
        default = ... if p.default is p.empty else p.default
        fields[p.name] = (hints[p.name], default)
    try:
        model = create_model(f"{name}_input", __base__=_Input, **fields)
        # Some types it validates but cannot describe (a callable): found now, not at each
        # model call of the agent.
        model.model_json_schema()
    except PydanticUserError as exc:  # a type pydantic cannot describe as JSON
        problem = str(exc).split("\n", 1)[0].split(". ", 1)[0]
        raise UsageError(
            f"tool {name!r}: its parameters must be JSON types (str, int, float, bool, lists, "
            f"dicts, pydantic models...): {problem}"
        ) from None
    return takes_context, model


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    approval: object = None,
    run_as: str = "requester",
    max_result_bytes: int | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    approval: object = None,
    run_as: str = "requester",
    max_result_bytes: int | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turn a function into a `Tool`: hints give the schema, the docstring the description."""
    if fn is not None:
        return Tool(fn)

    def wrap(f: Callable[..., Any]) -> Tool:
        return Tool(
            f,
            name=name,
            description=description,
            approval=approval,
            run_as=run_as,
            max_result_bytes=max_result_bytes,
        )

    return wrap
