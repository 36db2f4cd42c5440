"""Tool definitions: `@tool`, `Tool`, `ToolContext` and the `ApprovalRequired` signal."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any, NoReturn, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from pydantic_core import to_jsonable_python

from ._approval import ApprovalPolicy, SessionInfo, as_policy
from ._exceptions import UsageError

__all__ = ["ApprovalRequired", "Tool", "ToolContext", "tool"]


class ApprovalRequired(Exception):
    """Raised inside a tool to park the turn until a person decides; not a failure.

    The reviewer's decision becomes the call's result; the tool body does not run again.
    """

    def __init__(self, payload: Any = None) -> None:
        super().__init__(payload)
        self.payload = payload

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.payload,))


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
    ) -> None:
        self.session = session
        self.call_id = call_id
        self.tool_name = tool_name
        self._key = idempotency_key
        self.abort_signal = abort_signal or asyncio.Event()

    def idempotency_key(self, name: str | None = None) -> str:
        """A key stable across replays and processes for this call (and `name` within it)."""
        return self._key if name is None else f"{self._key}:{name}"

    def request_approval(self, payload: Any = None) -> NoReturn:
        """Park the turn until a person decides; the decision becomes this call's result."""
        raise ApprovalRequired(payload)


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
    ) -> None:
        if not callable(fn):
            raise UsageError(f"a tool needs a function, not {fn!r}")
        if run_as not in ("requester", "approver"):
            raise UsageError(f"run_as must be 'requester' or 'approver', not {run_as!r}")
        self.fn = fn
        self.name = name or fn.__name__
        if not self.name.replace("_", "").replace("-", "").isalnum():
            raise UsageError(f"tool name {self.name!r} must be letters, digits, _ or -")
        self.description = description or _describe(fn)
        self.approval: ApprovalPolicy = as_policy(approval)
        self.run_as = run_as
        self.is_async = inspect.iscoroutinefunction(fn)
        self.takes_context, self.input_model = _input_model(fn, self.name)

    def __repr__(self) -> str:
        return f"Tool({self.name!r}, approval={self.approval.describe()})"

    def json_schema(self) -> dict[str, Any]:
        """The input schema as the model sees it."""
        schema = self.input_model.model_json_schema()
        schema.pop("title", None)
        return schema

    def validate(self, raw: Any) -> BaseModel:
        """Validate model-proposed input; raises `pydantic.ValidationError`."""
        if not isinstance(raw, dict):
            raise ValidationError.from_exception_data(
                self.input_model.__name__,
                [{"type": "model_type", "loc": (), "input": raw, "ctx": {"class_name": "dict"}}],
            )
        return self.input_model.model_validate(raw)

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
        return to_jsonable_python(result)


def _describe(fn: Callable[..., Any]) -> str:
    doc = inspect.getdoc(fn) or ""
    return doc.split("\n\n", 1)[0].replace("\n", " ").strip()


def _input_model(fn: Callable[..., Any], name: str) -> tuple[bool, type[BaseModel]]:
    sig = inspect.signature(fn)
    try:
        hints = get_type_hints(fn)
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
        default = ... if p.default is p.empty else p.default
        fields[p.name] = (hints[p.name], default)
    model = create_model(f"{name}_input", __base__=_Input, **fields)
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
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    approval: object = None,
    run_as: str = "requester",
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turn a function into a `Tool`: hints give the schema, the docstring the description."""
    if fn is not None:
        return Tool(fn)

    def wrap(f: Callable[..., Any]) -> Tool:
        return Tool(f, name=name, description=description, approval=approval, run_as=run_as)

    return wrap
