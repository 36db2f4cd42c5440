"""Checks of a tool's input model made once, when the tool is made: what its schema must hold
for providers, and what pydantic would run or show wrongly. Apart from `_tools` so that one
keeps to the tool."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from ._core_schema import VALUE_KEYS, schema_nodes
from ._exceptions import UsageError
from ._sync import is_async

__all__ = [
    "asks_strict",
    "check_async_functions",
    "check_shown_fields",
    "give_arrays_items",
    "short_repr",
]


def give_arrays_items(schema: Any) -> None:
    """Give each array in `schema` that has none an `items`: OpenAI refuses an array without
    one, which pydantic makes of a tuple (`prefixItems` alone), so every call failed. Its
    `prefixItems` (and `maxItems`) still say what each place holds."""
    if isinstance(schema, list):
        for item in schema:
            give_arrays_items(item)
        return
    if not isinstance(schema, dict):
        return
    if schema.get("type") == "array" and "items" not in schema:
        places = schema.get("prefixItems") or []
        kinds = [p for i, p in enumerate(places) if p not in places[:i]]
        schema["items"] = kinds[0] if len(kinds) == 1 else ({"anyOf": kinds} if kinds else {})
    for value in schema.values():
        give_arrays_items(value)


def asks_strict(schema: Any) -> bool:
    """Whether a core schema may refuse from Python what JSON gives it: strict validation
    anywhere (`ConfigDict(strict=True)`, `Strict()`, `Field(strict=True)`), or a type that takes
    only instances from Python and builds one from JSON (`InstanceOf[...]`, a custom type's
    `json_or_python_schema`). Read on schema nodes and configs only, not in values a schema holds
    (a field's default, `json_schema_extra` in `metadata`). Walked without recursion, each
    container once."""
    for item, key in schema_nodes(schema, VALUE_KEYS):
        node = "type" in item or key == "config"
        if node and (item.get("strict") is True or item.get("type") == "json-or-python"):
            return True
    return False


def check_async_functions(model: type[BaseModel], name: str) -> None:
    """Refuse an async validator (or serializer) anywhere in the input's schema: pydantic calls
    it without awaiting, and its coroutine became the value, so the check never ran and the body
    got a coroutine for its argument (or, to be approved, the input could not be shown)."""
    found = [
        item["function"]
        for item, _ in schema_nodes(model.__pydantic_core_schema__)
        if callable(item.get("function"))
    ]
    for fn in found:
        if is_async(fn):
            shown = getattr(fn, "__qualname__", None) or repr(fn)
            raise UsageError(
                f"tool {name!r}: the validator {shown} is async; pydantic calls validators "
                "without awaiting them, so its check would never run: make it a plain def"
            )


_FIELDS = ("model-field", "dataclass-field", "typed-dict-field")
_NOT_INPUT = ("return_schema", "json_schema_input_schema")
"""Schemas in a core schema of no input the tool gets: what a serializer returns, what a
validator's JSON schema says it takes."""


def check_shown_fields(model: type[BaseModel], name: str) -> None:
    """Refuse a field (a parameter, or one of a model in one) left out of the input's JSON form
    (`exclude=True`, `exclude_if`): a reviewer approving a call would not see the value the
    model gave it, which the tool gets; or named there other than the model reads it
    (`_check_names`). Its core schema is walked, each container once."""
    for item, key in schema_nodes(model.__pydantic_core_schema__, _NOT_INPUT):
        if item.get("type") in _FIELDS and (
            item.get("serialization_exclude") or item.get("serialization_exclude_if")
        ):
            field = item.get("name", key)
            raise UsageError(
                f"tool {name!r}: field {field!r} is excluded from the input's JSON form "
                "(exclude=True or exclude_if), which a reviewer approves, yet the tool "
                "would get it: drop the exclusion, or take the value other than from the "
                "model"
            )
        if item.get("type") in _FIELDS:
            _check_names(item, item.get("name", key), name)


def _check_names(field: dict[str, Any], key: Any, name: str) -> None:
    """Refuse a field read from the model by one name and shown to a reviewer by another
    (`validation_alias`, `serialization_alias`): the form named it other than the schema the
    model is shown, so an edit in it was refused and a filled-in approved call never ran."""
    read = _one_name(field.get("validation_alias", key))
    shown_as = field.get("serialization_alias", key)
    if read == shown_as:
        return
    raise UsageError(
        f"tool {name!r}: field {key!r} is read from the model as {short_repr(read)} but shown to "
        f"a reviewer as {shown_as!r}: give it one name, `Field(alias=...)` (no AliasChoices or "
        "AliasPath), so the form a reviewer approves names it as the model does"
    )


def _one_name(alias: Any) -> Any:
    """A validation alias that names one key (`AliasChoices("to")`, `AliasPath("to")`, in the
    core schema `[["to"]]` and `["to"]`) as that key; any other as it is."""
    if isinstance(alias, list) and len(alias) == 1 and isinstance(alias[0], list):
        alias = alias[0]
    if isinstance(alias, list) and len(alias) == 1 and isinstance(alias[0], str):
        return alias[0]
    return alias


def short_repr(value: Any) -> str:
    """`repr(value)`, cut to 60 characters: a value named in an error."""
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "…"
