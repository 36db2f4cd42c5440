"""Sets in a tool's validated input: whether its model may make one at all, its Python dump
where a set's items dump to dicts, its JSON form (which a reviewer approves and an approval
binds) with each set sorted, as a set's own order is another in each process (hash
randomization), and whether a form bound shows the same sets."""

from __future__ import annotations

import dataclasses
import json
from decimal import Decimal
from fractions import Fraction
from typing import Any
from uuid import UUID

from pydantic import BaseModel, RootModel
from pydantic_core import PydanticSerializationError, to_jsonable_python

from ._core_schema import may_make
from ._json_keys import in_order
from ._types import same_json

__all__ = [
    "SetItems",
    "as_set",
    "json_key",
    "may_hold_sets",
    "python_dump",
    "sets_alike",
    "sets_sorted",
]


class SetItems(list[Any]):
    """A set in a Python dump (`python_dump`) whose items dump to what no set holds (dicts):
    its items' dumps, in the set's own order."""


def python_dump(validated: BaseModel, *, by_alias: bool | None = None, include: Any = None) -> Any:
    """`validated.model_dump(by_alias=..., include=...)`; where pydantic cannot make it, as a
    set's items dump to dicts (a set of frozen models or dataclasses: `TypeError`, unhashable),
    each such set as a `SetItems` of its items' dumps, every other field dumped as pydantic
    dumps it. Checks of validated input read this dump (`unwritable`, a secret's mask), and
    `sets_sorted` where the schema declares sets: failing, they refused every call of a tool
    whose input pydantic validates."""
    try:
        return validated.model_dump(by_alias=by_alias, include=include)
    except TypeError as exc:
        if not _unhashable(exc):
            raise
    if isinstance(validated, RootModel):
        return _dumped(validated.root, by_alias)
    cls = type(validated)
    extra = list(validated.__pydantic_extra__ or {})
    names = [*cls.__pydantic_fields__, *extra, *cls.__pydantic_computed_fields__]
    dumped: dict[Any, Any] = {}
    for name in names if include is None else [n for n in names if n in include]:
        try:  # {} for a field left out of its dump (excluded)
            dumped.update(validated.model_dump(by_alias=by_alias, include={name}))
        except TypeError as exc:
            if not _unhashable(exc):
                raise
            info = cls.__pydantic_fields__.get(name)
            aliased = cls.model_config.get("serialize_by_alias") if by_alias is None else by_alias
            key = (info.serialization_alias or name) if aliased and info is not None else name
            dumped[key] = _dumped(getattr(validated, name), by_alias)
    return dumped


def _dumped(value: Any, by_alias: bool | None) -> Any:
    """`value`, a part of validated input whose dump pydantic cannot make, dumped: a set as a
    `SetItems`, a model by `python_dump`, a dataclass, list, tuple or dict by its parts."""
    if isinstance(value, BaseModel):
        return python_dump(value, by_alias=by_alias)
    if isinstance(value, set | frozenset):
        return SetItems(_dumped(item, by_alias) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        own = getattr(type(value), "__pydantic_serializer__", None)  # a pydantic dataclass's
        try:
            return own.to_python(value, by_alias=by_alias) if own else _fields(value, by_alias)
        except TypeError as exc:
            if not _unhashable(exc):
                raise
            return _fields(value, by_alias)
    if isinstance(value, dict):
        return {key: _dumped(item, by_alias) for key, item in value.items()}
    if isinstance(value, list | tuple):
        items = [_dumped(item, by_alias) for item in value]
        return items if isinstance(value, list) else tuple(items)
    return value


def _unhashable(exc: TypeError) -> bool:
    """Whether pydantic failed to put a dumped item in a set (Python's "unhashable type"), not
    a serializer of the tool's failing on its own, which is raised as it was."""
    return "unhashable type" in str(exc)


def _fields(value: Any, by_alias: bool | None) -> dict[str, Any]:
    """A dataclass's fields dumped (`_dumped`), by name."""
    return {f.name: _dumped(getattr(value, f.name), by_alias) for f in dataclasses.fields(value)}


def sets_sorted(value: Any, dumped: Any, form: Any) -> Any:
    """`form` (validated input's JSON form) with each list that shows a set in an order another
    process may not give sorted: where `dumped` (the input's Python dump, or None) holds a set
    (one the schema declares), by each item's JSON text, as such a set always was; else where
    `value` (the validated input) holds one whose order may vary (`_seeded`: text, bytes, a
    date...), whatever the schema says (a validator's `set`, a serializer's `list(s)`), as a
    result's set is (`in_order`). Any other list is left as it was, so a form an older signoff
    hashed still binds. A set's items that hold sets are sorted first."""
    while isinstance(value, RootModel):  # its JSON form is its root's
        value = value.root
    if isinstance(form, dict):
        keys = dumped.values() if isinstance(dumped, dict) and len(dumped) == len(form) else None
        inner = [None] * len(form) if keys is None else list(keys)  # paired by place, as ever
        parts = _parts(value)
        return {
            k: sets_sorted(parts.get(k), d, f) if isinstance(f, dict | list) else f
            for (k, f), d in zip(form.items(), inner, strict=True)
        }
    if not isinstance(form, list):
        return form
    held = isinstance(value, set | frozenset) and len(value) == len(form)
    values: Any = value if isinstance(value, list | tuple) and len(value) == len(form) else None
    if held and any(isinstance(f, dict | list) for f in form) and _iterated(value, form):
        values = list(value)  # the form shows it item by item, in its order
    dumps = dumped if isinstance(dumped, list | tuple) and len(dumped) == len(form) else None
    if values is not None or dumps is not None:
        vs = [None] * len(form) if values is None else values
        ds = [None] * len(form) if dumps is None else dumps
        form = [
            sets_sorted(v, d, f) if isinstance(f, dict | list) else f
            for v, d, f in zip(vs, ds, form, strict=True)
        ]
    if isinstance(dumped, set | frozenset | SetItems):
        return sorted(form, key=_set_order)
    return in_order(form) if held and _seeded(value) else form


def _seeded(items: set[Any] | frozenset[Any]) -> bool:
    """Whether a set's order may be another in another process: some item's hash is not its
    value's alone (text, bytes, a date, a `StrEnum`, a model: hash randomization, or an
    address), or is a NaN's (its address). A set of numbers (an `IntEnum` too) and UUIDs, in
    tuples and frozensets, iterates alike in every process: its form, unsorted, was always
    stable, and is kept as it was."""
    stack = list(items)
    while stack:
        item = stack.pop()
        if isinstance(item, tuple | frozenset) and type(item).__hash__ in _OF_ITEMS:
            stack.extend(item)
        elif type(item).__hash__ not in _FIXED_HASH or item != item:  # NaN
            return True
    return False


_FIXED_HASH: tuple[Any, ...] = tuple(
    kind.__hash__ for kind in (int, float, complex, Decimal, Fraction, UUID)
)
"""Hashes that are a function of the value alone, the same in every process (`bool`'s and an
`IntEnum`'s are `int`'s). Not None's: its hash was its address before Python 3.12, and a form
must not depend on the Python version, so a set holding None is sorted on every version."""

_OF_ITEMS = (tuple.__hash__, frozenset.__hash__)
"""Hashes that are their items' (a `NamedTuple`'s too)."""


def _parts(value: Any) -> dict[Any, Any]:
    """What `value` (validated input, a part of it) holds under each key of its JSON form: a
    model's fields by the names the form shows, a dict's values by their keys' JSON text."""
    if isinstance(value, BaseModel):
        fields = type(value).__pydantic_fields__
        shown = {info.serialization_alias or n: getattr(value, n) for n, info in fields.items()}
        return {**(value.__pydantic_extra__ or {}), **shown}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        named = getattr(type(value), "__pydantic_fields__", None) or {}
        plain = {f.name: getattr(value, f.name, None) for f in dataclasses.fields(value)}
        return {**plain, **{i.serialization_alias or n: plain.get(n) for n, i in named.items()}}
    if not isinstance(value, dict):
        return {}
    if all(type(key) is str for key in value):
        return value
    # A key that is not text (a number, an Enum) is shown by its JSON form (None: it has none).
    return {json_key(key): v for key, v in value.items()}


def _set_order(item: Any) -> str:
    return json.dumps(item, sort_keys=True)


def _iterated(value: set[Any] | frozenset[Any], form: list[Any]) -> bool:
    """Whether `form` shows the set `value` item by item in its own order, each as its JSON
    form: so an item of the form is that of the set's item in its place."""
    try:
        return same_json(to_jsonable_python(list(value), by_alias=True), form)
    except (PydanticSerializationError, ValueError, TypeError, RecursionError):
        return False


def as_set(given: list[Any], shown: list[Any], held: bool) -> bool:
    """Whether `shown` is `given` sorted as `approved_form` sorts a set's items (by their JSON
    text), or, where the input is known to hold a set (`held`), its items in any order: a set
    is shown sorted as a result's set is, or in its own order where that is every process's
    (`sets_sorted`)."""
    try:
        ordered = sorted(given, key=_set_order)
        if held:
            return same_json(ordered, sorted(shown, key=_set_order))
    except (TypeError, ValueError):
        return False
    return ordered != given and same_json(ordered, shown)


def sets_alike(stored: Any, form: Any, value: Any) -> bool:
    """Whether `stored` (the form an approval bound) is `form` (the JSON form of `value`,
    validated input, now) but for the order of a set's items: where `value` holds a set, its
    items in any order (`as_set`), sets among them too, as an older signoff bound a set in its
    own order (the same in each process where PYTHONHASHSEED is pinned); anywhere else the
    same JSON, a list's items in their order. Walked without recursion but in a set's items."""
    stack: list[tuple[Any, Any, Any]] = [(stored, form, value)]
    while stack:
        one, shown, value = stack.pop()
        while isinstance(value, RootModel):  # its JSON form is its root's
            value = value.root
        if isinstance(one, dict) and isinstance(shown, dict):
            if one.keys() != shown.keys():
                return False
            parts = _parts(value)
            stack.extend((v, shown[k], parts.get(k)) for k, v in one.items())
        elif isinstance(one, list) and isinstance(shown, list) and len(one) == len(shown):
            if isinstance(value, set | frozenset) and len(value) == len(shown):
                depth = _sets_within(value)
                mine = sorted(_exact(_unordered(item, depth)) for item in one)
                if mine != sorted(_exact(_unordered(item, depth)) for item in shown):
                    return False
                continue
            inner = value if isinstance(value, list | tuple) and len(value) == len(one) else None
            values = [None] * len(one) if inner is None else inner
            stack.extend(zip(one, shown, values, strict=True))
        elif _exact(one) != _exact(shown):  # `5` is not `5.0`: the approval's hash tells them
            return False
    return True


def _exact(value: Any) -> str:
    """A JSON value's text, keys sorted: what an approval's hash tells apart (`5` from `5.0`,
    `true` from `1`), where `same_json` takes numbers by value."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _sets_within(value: set[Any] | frozenset[Any]) -> int:
    """How many levels of sets a set's items are (`set[frozenset[str]]`: 1): the lists that
    show those are sets too, their items in any order."""
    depth = 0
    level: Any = value
    while level and all(isinstance(item, set | frozenset) for item in level):
        depth += 1
        level = frozenset().union(*level)
    return depth


def _unordered(item: Any, depth: int) -> Any:
    """A set's item as its form shows it, each list in it that shows a set (`depth` levels of
    them: `_sets_within`) sorted by its items' JSON text."""
    if depth and isinstance(item, list):
        return sorted((_unordered(inner, depth - 1) for inner in item), key=_set_order)
    return item


def json_key(key: Any) -> str | None:
    """The text a dict's key is shown by in its JSON form, as pydantic writes it."""
    try:
        plain = to_jsonable_python(key)
    except (PydanticSerializationError, ValueError):
        return None
    return plain if isinstance(plain, str) else json.dumps(plain)


def may_hold_sets(schema: Any) -> bool:
    """Whether input a core schema validates may hold a set (or frozenset), whatever the JSON
    schema says (`may_make`): a tool whose input cannot is not walked for sets at each call."""
    return may_make(schema, ("set", "frozenset"), _holds_set)


def _holds_set(value: Any) -> bool:
    """Whether a default holds a set anywhere in its containers."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, set | frozenset):
            return True
        if isinstance(item, dict | list | tuple) and id(item) not in seen:
            seen.add(id(item))
            stack.extend(item.values() if isinstance(item, dict) else item)
        elif isinstance(item, BaseModel) and id(item) not in seen:
            seen.add(id(item))
            stack.extend(vars(item).values())
    return False
