"""Tool definitions: `@tool` and `Tool`, a function the model may call, its input schema from
the function's type hints and its description from the docstring."""

from __future__ import annotations

import functools
import inspect
import json
import re
import warnings
from collections.abc import Callable, Iterator
from typing import Any, Literal, TypeAlias, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, PydanticUserError, ValidationError, create_model
from pydantic_core import PydanticSerializationError, to_json

from ._approval import ApprovalArg, ApprovalPolicy, as_policy
from ._core_schema import may_make, schema_nodes
from ._exceptions import UsageError
from ._input_schema import (
    asks_strict,
    check_async_functions,
    check_shown_fields,
    give_arrays_items,
    short_repr,
)
from ._input_sets import may_hold_sets, python_dump, sets_sorted
from ._plain_json import plainly_written
from ._raw_input import raw_copy, shares_raw
from ._response import DEFAULT_RESPONSE_TIMEOUT, ApprovalSpec, ResponsePolicy
from ._sync import called_off_loop, failure, is_async
from ._tool_context import ToolContext
from ._tool_json import (
    MAX_INPUT_DEPTH,
    UNPARSED_ARGUMENTS,
    holds_iterator,
    jsonable,
    kept,
    keys_alike,
    unlike,
    unwritable,
)

# The tool names OpenAI and Anthropic take.
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")

__all__ = ["TOOL_NAME", "RunAs", "Tool", "ToolApproval", "Unshown", "tool"]


class Unshown(Exception):
    """Validated input whose JSON form, validated again, is other input: a reviewer approving
    that form would not see what the tool gets (a field it leaves out or shows otherwise)."""


RunAs: TypeAlias = Literal["requester", "approver"]
"""Whom an approved call runs as: the principal whose turn asked (the default), or, as an
explicit opt-in, the one who approved it."""

ToolApproval: TypeAlias = "ApprovalArg | ApprovalSpec"
"""What a tool's `approval=` takes: a policy in any form `ApprovalArg` names, or an
`ApprovalSpec` (when to ask and who may answer)."""

# Why arguments a provider passed on unparsed (`UNPARSED_ARGUMENTS`) cannot be used.
_UNREAD = (
    "the arguments could not be read as a JSON object (broken or cut-off JSON, NaN, Infinity, a "
    f"number too large for a float, or nesting deeper than {MAX_INPUT_DEPTH} levels); send them "
    "again as plain JSON"
)


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
        approval: ToolApproval = None,
        run_as: RunAs = "requester",
        workflow: bool | None = None,
        max_result_bytes: int | None = None,
    ) -> None:
        if not callable(fn):
            raise UsageError(f"a tool needs a function, not {fn!r}")
        if isinstance(fn, type):
            # Its calls made instances, and its schema came from its class attributes.
            raise UsageError(
                f"the class {fn.__name__} is not a tool: pass a function, or an instance of a "
                "class with a __call__ method"
            )
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
        if name is None and not isinstance(getattr(fn, "__name__", None), str):
            raise UsageError(
                f"a {type(fn).__name__} has no __name__: give the tool a name (name=...)"
            )
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
        self.response_timeout = DEFAULT_RESPONSE_TIMEOUT
        if isinstance(approval, ApprovalSpec):
            self.response_policy = approval.response
            self.response_timeout = approval.timeout
            approval = approval.request
        self.approval: ApprovalPolicy = as_policy(approval)
        self.run_as = run_as
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            # Its body never ran: the call's result was the generator object, an error.
            raise UsageError(
                f"tool {self.name!r} is a generator function: a tool returns its result "
                "(collect what it yields into a list)"
            )
        self.is_async = is_async(fn)
        self.takes_context, self.input_model, schema = _input_model(fn, self.name)
        schema.pop("title", None)
        self._schema = schema  # built once, when the model was checked
        self._sets: tuple[bool, bool] | None = None  # whether its schema declares a set, and
        # whether its validated input may hold one (`may_hold_sets`)
        self._lazy: bool | None = None
        self._iterating: bool | None = None  # whether code may put an iterator in its input
        self._shares: bool | None = None  # whether code may see or keep its raw input's objects
        # Whether its model asks for strictness (which error to tell of input both modes refuse).
        self._strict = asks_strict(self.input_model.__pydantic_core_schema__)
        # A workflow tool may ask people things; approvals of its siblings wait for it.
        self.workflow = self.takes_context if workflow is None else workflow

    def __repr__(self) -> str:
        return f"Tool({self.name!r}, approval={self.approval.describe()})"

    def json_schema(self) -> dict[str, Any]:
        """The input schema as the model sees it (built once, when the tool was made)."""
        return self._schema

    def validate(self, raw: Any) -> BaseModel:
        """Validate model-proposed input (or an edit, or a form: JSON each) as Python, or as the
        JSON it is where Python refuses it (a strict model: `_validated`); raises
        `pydantic.ValidationError`, also for any other error a validator raises on it
        (`SystemExit` too) and for a value JSON cannot write (NaN, one inside itself)."""
        if not isinstance(raw, dict):
            raise ValidationError.from_exception_data(
                self.input_model.__name__,
                [{"type": "model_type", "loc": (), "input": raw, "ctx": {"class_name": "dict"}}],
            )
        if set(raw) == {UNPARSED_ARGUMENTS}:
            # Read as input, it told the model of a parameter it never sent and of missing ones.
            raise ValidationError.from_exception_data(
                self.input_model.__name__,
                [{"type": "json_invalid", "loc": (), "input": raw, "ctx": {"error": _UNREAD}}],
            )
        if self._shares is None:
            self._shares = shares_raw(self.input_model.__pydantic_core_schema__)
        try:
            validated = _validated(self.input_model, raw, self._strict, self._shares)
            dumped = python_dump(validated)
        except ValidationError:
            raise
        except BaseException as raised:
            # pydantic passes on what a validator raises other than ValueError: raised here, it
            # would fail the drive and leave its session running for good; a `SystemExit` (a
            # stray `sys.exit()`, argparse) would end the process, out of the event loop. So
            # would any other that is no `Exception`, but a cancel or a Ctrl-C (`failure`).
            exc = raised if isinstance(raised, Exception) else failure(raised)
            if exc is None:
                raise
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
        if plainly_written(dumped):
            return validated
        bad = unwritable(dumped)
        if bad is not None:
            loc, value = bad
            if isinstance(value, float):
                error: Any = {"type": "finite_number", "loc": loc, "input": value}
            else:
                held = f"a {type(value).__name__} inside itself, which JSON cannot write"
                ctx = {"error": f"a validator of {self.name} made the value {held}"}
                error = {"type": "value_error", "loc": loc, "input": value, "ctx": ctx}
            raise ValidationError.from_exception_data(self.input_model.__name__, [error])
        alike = keys_alike(dumped)
        if alike is not None:
            # Its JSON form, which a reviewer approves and the records keep, would hold one key
            # where the body gets both: what runs would not be what was approved.
            loc, first, second, text = alike
            ctx = {"error": f"{self.name}'s input has {_keys_alike(first, second, text)}"}
            error = {"type": "value_error", "loc": loc, "input": second, "ctx": ctx}
            raise ValidationError.from_exception_data(self.input_model.__name__, [error])
        return validated

    def approved_form(self, validated: BaseModel) -> dict[str, Any]:
        """Validated input as a reviewer sees it and an approval binds it: JSON, by the names
        the model is shown (aliases), so that it validates again to the same input; a set the
        schema declares sorted, and one a validator made whose order is another in each process
        (hash randomization), its form as before where it was stable (`sets_sorted`). Raises
        `PydanticSerializationError` if it has no JSON form."""
        try:
            form = validated.model_dump(mode="json", by_alias=True)
        except (ValueError, TypeError, RecursionError) as exc:
            if isinstance(exc, PydanticSerializationError):
                raise
            # pydantic's own for a key JSON cannot write (a frozenset) or a value too deep:
            # raised as they are, they failed the drive and left its session running.
            raise PydanticSerializationError(f"{type(exc).__name__}: {exc}") from None
        if self._sets is None:  # a set is an array of unique items to JSON schema
            declared = "uniqueItems" in json.dumps(self.json_schema())
            self._sets = declared, may_hold_sets(self.input_model.__pydantic_core_schema__)
        declared, held = self._sets
        if not (declared or held):
            return form
        dumped = python_dump(validated, by_alias=True) if declared else None  # as forms were
        return sets_sorted(validated, dumped, form)  # type: ignore[no-any-return]

    @property
    def lazy(self) -> bool:
        """Whether the input holds a lazy iterable (an `Iterable[...]` parameter, which pydantic
        validates to an iterator): its JSON form uses the iterator up, so a form taken before
        the body runs would hand the body an empty one."""
        if self._lazy is None:
            self._lazy = _generates(self.input_model.__pydantic_core_schema__)
        return self._lazy

    def holds_lazy(self, validated: Any) -> bool:
        """Whether `validated` (input of this tool) holds an iterator that one reading uses up:
        an `Iterable[...]` parameter's (`lazy`), or one a validator made (`AfterValidator(iter)`),
        which the declared types do not tell. Each reader of such an input gets its own
        validation of it (`own_input`)."""
        if self.lazy:
            return True
        if self._iterating is None:
            self._iterating = _may_iterate(self.input_model.__pydantic_core_schema__)
        return self._iterating and holds_iterator(validated)

    def shown_form(self, validated: BaseModel) -> dict[str, Any]:
        """`approved_form`, for a reviewer: it must validate again to `validated` (a secret's
        mask aside), so that what they approve is what runs. Raises `Unshown` if it does not (a
        field the form leaves out or shows otherwise, a validator that changes it again), and
        `PydanticSerializationError` if it has no JSON form. Asked of gated calls only."""
        if self.holds_lazy(validated):
            kept(validated)  # its form uses the iterators up (`own_input`): their items compare
        form = self.approved_form(validated)
        try:
            again = self.validate(form)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(part) for part in error["loc"]) or "the input"
            raise Unshown(
                f"validated again, its JSON form is not valid input ({where}: {error['msg']}): "
                "a field the form leaves out or shows otherwise (a serializer, an alias)"
            ) from None
        found = unlike(validated, again, form)
        if found is None:
            return form
        loc, left_out = found
        where = ".".join(str(part) for part in loc) or "the input"
        if left_out:
            raise Unshown(f"its JSON form leaves out {where!r} (excluded), which the tool gets")
        raise Unshown(
            f"its JSON form shows {where!r} otherwise than the tool gets it: validated again, it "
            "gives another value (a serializer that shows less than the value, or a validator "
            "that changes it again)"
        )

    async def invoke(self, ctx: ToolContext, validated: BaseModel) -> Any:
        """Run the body with validated input; returns its result as JSON-able data."""
        kwargs = {name: getattr(validated, name) for name in type(validated).model_fields}
        args = (ctx,) if self.takes_context else ()
        return jsonable(await called_off_loop(self.fn, *args, **kwargs))


def _validated(
    model: type[BaseModel], raw: dict[str, Any], strict: bool, shares: bool
) -> BaseModel:
    """`raw` (a model's arguments, a reviewer's edit, a form: JSON each) validated as Python, as
    a tool's input always was, so a lax tool gets what it got (`str | UUID` the text sent, a
    validator's `info.mode` "python"). A strict model (`strict` True) that refuses it is tried
    as the JSON it is, which it takes and Python refuses (a date, UUID or enum's value as text,
    a tuple as an array), as is one whose type takes only instances from Python and builds one
    from JSON (`InstanceOf[...]`: `asks_strict` says both); when both fail, the JSON error is
    raised, as its Python error names fields sent right ("an instance of"). Any other model is
    not tried again: JSON gives it nothing Python refuses, and its validators ran twice on input
    it refused. Where code may see or keep the objects of `raw` (`shares`: `shares_raw`), it is
    given a copy: a validator changing them in place changed the call's input, which a body's
    re-run, an approval's check and the model's next request got, and the log did not."""
    given = raw_copy(raw) if shares else raw
    if not strict:
        return model.model_validate(given)
    try:
        return model.model_validate(given)
    except ValidationError as as_python:
        failed = as_python
    try:
        text = to_json(raw, inf_nan_mode="constants")  # NaN as NaN, as Python mode takes it
        return model.model_validate_json(text)
    except PydanticSerializationError:  # a lone surrogate: no JSON to validate
        pass
    except ValidationError as as_json:
        # A huge integer JSON does not read back is `json_invalid`: no error of the input.
        unread = [(e["type"], e["loc"]) for e in as_json.errors()] == [("json_invalid", ())]
        if not unread:
            failed = as_json
    raise failed


def _describe(fn: Callable[..., Any]) -> str:
    """The model's description of the tool: its docstring, as `inspect` cleans it, up to its
    first section for readers of the code (`Args:`, `Returns:`, `:param x:`...). Only its first
    paragraph was sent, so a rule in a later one (`amount` in cents) never reached the model."""
    doc = inspect.getdoc(fn) or ""
    section = _DOC_SECTION.search(doc)
    return (doc if section is None else doc[: section.start()]).strip()


_DOC_SECTION = re.compile(
    r"^(?:(?:Args|Arguments|Parameters|Params|Keyword Args|Returns?|Yields?|Raises|Examples?)"
    r"\s*:?\s*$|:(?:param|type|returns?|rtype|raises)\b)",
    re.MULTILINE,
)
"""A Google, NumPy or reST docstring section, which describes the code to its readers."""


def _hinted(fn: Callable[..., Any]) -> tuple[Callable[..., Any], set[str]]:
    """The function whose type hints describe calling `fn` (a partial's function, a callable
    object's `__call__`), and the names a partial binds by keyword, which the model never sets."""
    bound: set[str] = set()
    while isinstance(fn, functools.partial):
        bound.update(fn.keywords)
        fn = fn.func
    if not (inspect.isfunction(fn) or inspect.ismethod(fn) or inspect.isbuiltin(fn)):
        fn = type(fn).__call__  # a callable object: `Tool` checked callable(fn)
    return fn, bound


def _input_model(fn: Callable[..., Any], name: str) -> tuple[bool, type[BaseModel], dict[str, Any]]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"tool {name!r}: cannot read its parameters: {exc}") from None
    hinted, bound = _hinted(fn)
    try:
        hints = get_type_hints(hinted, include_extras=True)
    except Exception as exc:
        raise UsageError(f"tool {name!r}: cannot resolve its type hints: {exc}") from exc
    params = [p for p in sig.parameters.values() if p.name not in bound]
    takes_context = False
    if params and (
        hints.get(params[0].name) is ToolContext
        or (params[0].name == "ctx" and params[0].name not in hints)
    ):
        takes_context = True
        if params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
            raise UsageError(
                f"tool {name!r}: the ToolContext parameter {params[0].name!r} must be positional "
                "(it is passed first, by position)"
            )
        params = params[1:]
    fields: dict[str, Any] = {}
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise UsageError(f"tool {name!r}: parameter {p.name!r} must be a named parameter")
        if p.name.startswith("_"):
            # pydantic keeps it private: out of the schema, so never passed to the body.
            raise UsageError(f"tool {name!r}: parameter {p.name!r} may not begin with '_'")
        if p.name.startswith("model_") and hasattr(BaseModel, p.name):
            raise UsageError(
                f"tool {name!r}: parameter {p.name!r} is a name pydantic uses; rename it"
            )
        if p.name not in hints:
            raise UsageError(f"tool {name!r}: parameter {p.name!r} needs a type hint")
        if hints[p.name] is ToolContext:
            raise UsageError(
                f"tool {name!r}: the ToolContext parameter {p.name!r} must be the first one"
            )
        default = ... if p.default is p.empty else p.default
        fields[p.name] = (hints[p.name], default)
    try:
        with warnings.catch_warnings():
            # `schema`, `json`...: they shadow pydantic's old methods, which nothing calls.
            warnings.filterwarnings("ignore", "Field name .* shadows an attribute", UserWarning)
            model = create_model(f"{name}_input", __base__=_Input, **fields)
        # Some types it validates but cannot describe (a callable): found now, not at each
        # model call of the agent; the schema built is the one the model is shown.
        schema = model.model_json_schema()
    except PydanticUserError as exc:  # a type pydantic cannot describe as JSON
        problem = str(exc).split("\n", 1)[0].split(". ", 1)[0]
        raise UsageError(
            f"tool {name!r}: its parameters must be JSON types (str, int, float, bool, lists, "
            f"dicts, pydantic models...): {problem}"
        ) from None
    check_async_functions(model, name)
    _check_defaults(model, name)
    check_shown_fields(model, name)
    for key in schema.get("properties", {}):
        if not _PROPERTY_NAME.fullmatch(key):
            # Anthropic refuses the request (every one of the agent's calls) over such a key.
            raise UsageError(
                f"tool {name!r}: its parameter {key!r} is a name providers refuse (letters, "
                "digits, '_', '.' and '-' only, at most 64): rename it, or give it an alias"
            )
    give_arrays_items(schema)
    try:  # a nested model's default of NaN or infinity, an object in `json_schema_extra`
        json.dumps(schema, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise UsageError(
            f"tool {name!r}: its input schema is not JSON, which every request to a model "
            f"sends ({exc}): a nested default of NaN or infinity, say"
        ) from None
    return takes_context, model, schema


_PROPERTY_NAME = re.compile(r"[a-zA-Z0-9_.-]{1,64}")
"""What Anthropic takes as a name of a tool's parameter (its input schema's property)."""


def _check_defaults(model: type[BaseModel], name: str) -> None:
    """Refuse a default its parameter's hint does not take (`count: int = "abc"`, a NaN): pydantic
    does not check defaults, so the model was shown it in the schema and a call leaving the
    parameter out ran the body with it (or failed as invalid input, for a NaN). Each is checked
    as an assignment to an instance built without validation: no second model to build."""
    blank = model.model_construct()
    for field, info in model.model_fields.items():
        if info.is_required():
            continue
        default = info.get_default(call_default_factory=True)
        try:
            model.__pydantic_validator__.validate_assignment(blank, field, default)
        except ValidationError as exc:
            problem = exc.errors()[0]["msg"]
        except Exception as exc:  # a validator raising other than ValueError: pydantic passes it
            problem = f"{type(exc).__name__}: {exc}"
        else:
            found = _unwritable_default(python_dump(blank, include={field}))
            if found is None:
                continue
            problem = found
        raise UsageError(
            f"tool {name!r}: the default {short_repr(default)} of parameter {field!r} is not "
            f"what its type hint takes ({problem}); give it a default of its type (`x: int | None "
            "= None` for none)"
        )


def _unwritable_default(dumped: Any) -> str | None:
    """What JSON cannot write of a default as validated, or None."""
    bad = unwritable(dumped)
    if bad is not None:
        if isinstance(bad[1], float):
            return "a number JSON cannot hold (NaN or infinity)"
        return f"a {type(bad[1]).__name__} inside itself, which JSON cannot write"
    alike = keys_alike(dumped)
    return None if alike is None else _keys_alike(*alike[1:])


def _keys_alike(first: Any, second: Any, text: str) -> str:
    """What is wrong with a dict whose keys `first` and `second` JSON writes as `text`."""
    both = f"{short_repr(first)} and {short_repr(second)}"
    return (
        f"a dict with two keys that JSON writes as the same text ({both}, both "
        f"{short_repr(text)}): its JSON form, which is shown and recorded, would keep one where "
        "the tool gets both; make its keys text, each its own"
    )


@overload
def tool(
    fn: Callable[..., Any],
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    approval: ToolApproval = None,
    run_as: RunAs = "requester",
    max_result_bytes: int | None = None,
) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    approval: ToolApproval = None,
    run_as: RunAs = "requester",
    max_result_bytes: int | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    approval: ToolApproval = None,
    run_as: RunAs = "requester",
    max_result_bytes: int | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turn a function into a `Tool`: hints give the schema, the docstring the description.
    `tool(fn, approval=...)` takes the same options as `@tool(approval=...)`."""

    def wrap(f: Callable[..., Any]) -> Tool:
        return Tool(
            f,
            name=name,
            description=description,
            approval=approval,
            run_as=run_as,
            max_result_bytes=max_result_bytes,
        )

    if fn is not None:
        # Its options too: they were dropped, so `tool(fn, approval=always)` ran unapproved.
        return wrap(fn)
    return wrap


def _may_iterate(schema: Any) -> bool:
    """Whether input a core schema validates may hold an iterator (`may_make`; a model or
    dataclass that is one): a tool whose input cannot is not walked for one at each call."""
    if may_make(schema, ("generator",), holds_iterator):
        return True
    return any(
        isinstance(cls := node.get("cls"), type) and issubclass(cls, Iterator)
        for node, _ in schema_nodes(schema)
    )


def _generates(schema: Any) -> bool:
    """Whether a pydantic-core schema validates anything to an iterator (`generator`)."""
    if isinstance(schema, dict):
        return schema.get("type") == "generator" or any(_generates(v) for v in schema.values())
    if isinstance(schema, (list, tuple)):
        return any(_generates(v) for v in schema)
    return False
