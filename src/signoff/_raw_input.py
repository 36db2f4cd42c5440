"""A tool's raw input (the model's arguments, an edit, a form: JSON each) and the code that may
see it: which schemas let a validator or the body reach its own dicts and lists, and a copy of
it for them, so that what they change stays theirs and the call's input is as the model gave it."""

from __future__ import annotations

import marshal
from typing import Any

from ._core_schema import VALUE_KEYS, schema_nodes

__all__ = ["raw_copy", "shares_raw"]

_SEES_RAW = frozenset({"function-before", "function-wrap", "function-plain"})
"""Validators that get the input as it was given (a model validator in before or wrap mode is
one of these too), where an after validator gets what validation made."""

_KEEPS_RAW = frozenset({"any", "is-instance"})
"""Schema types whose value is the input's own object (`Any`, a bare `list`'s items,
`InstanceOf[...]`): a validator after them, or the body, holds it."""


def shares_raw(schema: Any) -> bool:
    """Whether code may see or change the raw input a pydantic core schema validates: a
    validator that sees it (`_SEES_RAW`), a model's own `__init__` (its keyword arguments), or a
    value kept as it was given (`_KEEPS_RAW`, extra fields a model allows). Input of any other
    schema is made anew by validation: such a tool needs no copy of it, each call. A tagged
    union's discriminator function sees the raw input too."""
    for item, _ in schema_nodes(schema, skip=_NOT_SCHEMAS):
        kind = item.get("type")
        if isinstance(kind, str) and kind in _SEES_RAW | _KEEPS_RAW or item.get("custom_init"):
            return True
        if kind == "tagged-union" and callable(item.get("discriminator")):
            return True  # a discriminator function gets the raw input, and may change it
        if "allow" in (item.get("extra_behavior"), item.get("extra_fields_behavior")):
            return True
    return False


_NOT_SCHEMAS = VALUE_KEYS | {"serialization"}
"""Keys whose values are no schemas of input (a serializer's, a default, `json_schema_extra`):
a default `{"type": ["bug"]}` read as a node's type failed every call (a list is unhashable)."""


def raw_copy(raw: Any) -> Any:
    """A copy of raw input, nothing of it shared: plain data (dicts, lists, text, numbers) by
    `marshal`, exact and at C speed (a NaN, a huge integer, a lone surrogate too); input with
    anything else in it (a Python caller's object) as its dicts and lists copied, the rest as
    it was."""
    try:
        return marshal.loads(marshal.dumps(raw))
    except (ValueError, TypeError):  # an object marshal does not write, or nesting too deep
        return _containers_copied(raw)


def _containers_copied(raw: Any) -> Any:
    """`raw` with each dict and list in it a new one (one held twice, or inside itself, copied
    once), anything else as it was; walked without recursion."""
    copies: dict[int, Any] = {}
    stack: list[tuple[Any, Any]] = []

    def of(value: Any) -> Any:
        if type(value) not in (dict, list):
            return value
        if id(value) not in copies:
            copies[id(value)] = {} if type(value) is dict else []
            stack.append((value, copies[id(value)]))  # filled in when taken from the stack
        return copies[id(value)]

    top = of(raw)
    while stack:
        item, mine = stack.pop()
        if type(item) is dict:
            mine.update((key, of(value)) for key, value in item.items())
        else:
            mine.extend(of(value) for value in item)
    return top
