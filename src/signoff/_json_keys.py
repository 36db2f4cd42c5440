"""Object keys that are not text, in values signoff writes as JSON: found wherever the value's
JSON form has objects (in dicts, lists, tuples, pydantic models and dataclasses), written as
JSON writes them (`None` as `"null"`), and two that would write as the same text refused. Sets
are written in one order whatever the process (`in_order`), not in their own, which hash
randomization makes another in each."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from typing import Any

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from ._exceptions import UsageError

__all__ = ["as_json_keys", "check_keys", "cut_repr", "in_order", "key_not_text"]

_PLAIN = (str, int, float, bool, type(None))
"""Types that hold no keys: skipped at once, as most of a value is made of them."""


def key_not_text(value: Any) -> str | None:
    """What names the first key of `value`'s dicts (in its dicts, lists and tuples) that is not
    text, or None: stored as JSON it would come back as text, so a value handed to signoff (an
    answer, a model's call) would read one way live and another resumed. A key holding a lone
    surrogate is not text either: pydantic cannot write it as JSON (a reviewer's form)."""
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key in item:
                if not isinstance(key, str):
                    return f"key {cut_repr(key)} ({type(key).__name__}) is not text"
                if not key.isascii() and _lone_surrogate(key):
                    return f"key {cut_repr(key)} is not valid Unicode text (a lone surrogate)"
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return None


def _lone_surrogate(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return True
    return False


def cut_repr(value: Any, most: int = 60) -> str:
    """`repr(value)`, cut to about `most` characters for a message."""
    shown = repr(value)
    return shown if len(shown) <= most else shown[:most] + "…"


def check_keys(value: Any) -> bool:
    """Raise `UsageError` if a dict of `value` has two keys that JSON writes as the same text
    (`1` and `"1"`): one would be lost. Returns whether `value` must be rebuilt by
    `as_json_keys` before pydantic writes it: a key written other than as pydantic writes it
    (`None`, NaN or an infinity), or a set. `value` has a JSON form, so its dicts, lists,
    tuples and sets hold no cycle; a model's or dataclass's fields may (in one its serializer
    writes otherwise), so they are walked apart (`_check_fields`)."""
    renamed = False
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is dict:
            for key in item:
                if type(key) is not str:
                    renamed = _check_dict(item) or renamed
                    break
            stack.extend(item.values())
        elif kind is list or kind is tuple:
            stack.extend(item)
        elif kind is set or kind is frozenset:
            renamed = True
            stack.extend(item)
        elif kind not in _PLAIN:
            renamed = _check_fields(item) or renamed
    return renamed


def _check_fields(value: Any) -> bool:
    """`check_keys` for what may hold a cycle: each dict, list, model and dataclass once."""
    renamed = False
    seen: set[int] = set()
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if type(item) in _PLAIN or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, dict):
            if not all(type(key) is str for key in item):
                renamed = _check_dict(item) or renamed
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif isinstance(item, set | frozenset):
            renamed = True
            stack.extend(item)
        elif isinstance(item, BaseModel):
            stack.extend(_model_values(item))
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            stack.extend(getattr(item, f.name) for f in dataclasses.fields(item))
    return renamed


def as_json_keys(value: Any, _path: frozenset[int] = frozenset()) -> Any:
    """`value` with its `None`, NaN and infinite keys as JSON writes them (`"null"`, `"NaN"`,
    `"Infinity"`), where pydantic would write `"None"`, `"nan"` and `"inf"`, and its sets as
    lists `in_order`: the rest of the value is rebuilt around them (a model or dataclass
    copied, never changed). What holds itself (in a field its serializer writes otherwise) is
    left as it is."""
    if type(value) in _PLAIN or id(value) in _path:
        return value
    path = _path | {id(value)}
    if isinstance(value, dict):
        return {_json_key(k): as_json_keys(v, path) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [as_json_keys(v, path) for v in value]
    if isinstance(value, set | frozenset):
        return in_order([as_json_keys(v, path) for v in value])
    if isinstance(value, BaseModel):
        fields = {k: as_json_keys(v, path) for k, v in value.__dict__.items()}
        extra = {k: as_json_keys(v, path) for k, v in (value.__pydantic_extra__ or {}).items()}
        return value.model_copy(update={**fields, **extra})
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        rebuilt = copy.copy(value)
        for f in dataclasses.fields(value):
            object.__setattr__(rebuilt, f.name, as_json_keys(getattr(value, f.name), path))
        return rebuilt
    return value


def _json_key(key: Any) -> Any:
    """`key` as JSON writes it when pydantic writes it otherwise, else `key` itself."""
    if key is None:
        return "null"
    if isinstance(key, float) and not math.isfinite(key):
        return "NaN" if math.isnan(key) else ("Infinity" if key > 0 else "-Infinity")
    return key


def _renamed(key: Any) -> bool:
    return key is None or (isinstance(key, float) and not math.isfinite(key))


def _check_dict(item: dict[Any, Any]) -> bool:
    """Raise `UsageError` if two keys of `item` write as the same text; returns whether one of
    them must be written by `_json_key`."""
    keys = list(item)
    written = to_jsonable_python([{key: None} for key in keys])
    first: dict[str, Any] = {}
    for key, one in zip(keys, written, strict=True):
        text = _json_key(key) if _renamed(key) else next(iter(one))
        if text in first:
            both = f"{cut_repr(first[text])} and {cut_repr(key)}"
            raise UsageError(
                f"the value has two keys that JSON writes as the same text ({both}, both "
                f"{cut_repr(text)}): one would be lost; make its keys text, each its own"
            )
        first[text] = key
    return any(_renamed(key) for key in keys)


def _model_values(model: BaseModel) -> list[Any]:
    """The values of `model`'s fields and extra fields that its JSON form holds."""
    fields = type(model).model_fields
    values = [v for k, v in model.__dict__.items() if not (k in fields and fields[k].exclude)]
    values.extend((model.__pydantic_extra__ or {}).values())
    return values


def in_order(items: list[Any]) -> list[Any]:
    """A set's `items` in the order its JSON lists them, the same in every process: text as
    text and numbers by value when they are all text or all finite numbers, else (kinds that
    do not compare, NaN, tuples, models) by each item's JSON text, which always compares."""
    forms = to_jsonable_python(items)
    if all(type(form) is str for form in forms):
        keys: list[Any] = forms
    elif all(type(form) in (int, float) and math.isfinite(form) for form in forms):
        keys = [(form, type(form) is float) for form in forms]  # 1 before 1.0, were both there
    else:
        try:
            keys = [json.dumps(form, sort_keys=True) for form in forms]
        except ValueError:  # an integer too long to write, which `jsonable` refuses anyway
            return items
    order = sorted(range(len(items)), key=keys.__getitem__)
    return [items[i] for i in order]
