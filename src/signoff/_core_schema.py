"""Walking a pydantic core schema: each of its objects once, in order, without recursion (a
default that holds itself, or a schema nested as deep as a model may be, ends no walk)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from typing import Any

__all__ = ["VALUE_KEYS", "may_make", "schema_nodes"]


VALUE_KEYS = frozenset({"metadata", "default", "expected", "members", "cls", "examples"})
"""Keys of a core schema's nodes that hold values, not schemas (a field's default,
`json_schema_extra` in `metadata`): a `{"strict": True}` or `{"type": [...]}` there is data."""


def schema_nodes(schema: Any, skip: Collection[str] = ()) -> Iterator[tuple[dict[str, Any], Any]]:
    """Each dict in `schema`, once, in order, with the key it is under in the dict holding it
    (None in a list, or at the top); nothing under a key in `skip`."""
    seen: set[int] = set()
    stack: list[tuple[Any, Any]] = [(schema, None)]
    while stack:
        item, key = stack.pop()
        if not isinstance(item, dict | list | tuple) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, dict):
            yield item, key
            stack.extend(reversed([(v, k) for k, v in item.items() if k not in skip]))
        else:
            stack.extend(reversed([(v, None) for v in item]))


_MADE_BY_CODE = ("function", "default_factory")
"""Keys of a core schema whose callable makes a value: a validator, a serializer, a factory."""


def may_make(schema: Any, kinds: Collection[str], held: Callable[[Any], bool]) -> bool:
    """Whether input a core schema validates may hold a value of a schema type in `kinds` (a
    `set`, a `generator`), whatever the JSON schema says: one of those, a validator's or
    factory's value (`AfterValidator(set)`), a model's own `__init__` or `model_post_init`, a
    default `held` finds one in. JSON alone, which is all a tool is given, makes none where
    none of these is: nothing to look for, each call."""
    for item, _ in schema_nodes(schema):
        if item.get("type") in kinds or item.get("custom_init") or item.get("post_init"):
            return True
        if held(item.get("default")) or any(_made_by_code(item.get(k)) for k in _MADE_BY_CODE):
            return True
    return False


_EMPTY_MAKERS = frozenset({list, dict, tuple, str, bytes, int, float, bool})
"""Factories that make an empty or plain value, holding nothing code made."""


def _made_by_code(fn: Any) -> bool:
    """Whether `fn` is code that may make any value: any but pydantic's own (a `SecretStr`'s, a
    `Path`'s, a URL's validator, which make their own types), so a tool taking one of those
    is not walked at each call; nor an empty container's (`default_factory=list`)."""
    if not callable(fn) or any(fn is maker for maker in _EMPTY_MAKERS):  # fn may be unhashable
        return False
    module = getattr(fn, "__module__", None)
    return not (isinstance(module, str) and module.split(".")[0] in ("pydantic", "pydantic_core"))
