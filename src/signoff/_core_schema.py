"""Walking a pydantic core schema: each of its objects once, in order, without recursion (a
default that holds itself, or a schema nested as deep as a model may be, ends no walk)."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import Any

__all__ = ["schema_nodes"]


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
