"""A tool's input and results as JSON: the bound on a result's size, NaN and infinities as null,
sets in a stable order, keys JSON cannot keep apart, and the masked secrets a reviewer's form
gives back."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Secret, SecretBytes, SecretStr
from pydantic_core import to_jsonable_python

from ._events import FITS_BITS, check_digits, dumps
from ._exceptions import UsageError

if TYPE_CHECKING:
    from ._agent import Limits
    from ._tools import Tool

MAX_RESULT_BYTES = 1 << 20
"""The default bound on a tool's or step's result as JSON (`Limits.max_result_bytes`)."""

MAX_INPUT_DEPTH = 100
"""How deeply a tool call's input may nest (objects and lists), as a person's answer may: deeper
input pydantic cannot show a reviewer (past about 250 levels) and Python's recursion limit stops
on its way back to the model."""

UNPARSED_ARGUMENTS = "_unparsed_arguments"
"""The key under which a model provider passes on tool-call arguments that are not plain JSON
(`models`): a leading underscore can name no tool parameter, and `Tool.validate` tells the
model its arguments could not be read."""

__all__ = [
    "MAX_INPUT_DEPTH",
    "MAX_RESULT_BYTES",
    "UNPARSED_ARGUMENTS",
    "copied",
    "holds_mask",
    "json_size",
    "jsonable",
    "key_not_text",
    "nests_deeper",
    "non_finite",
    "over_limit",
    "result_bound",
    "sets_sorted",
]


def sets_sorted(value: Any, form: Any) -> Any:
    """`form` (the JSON dump of `value`) with the lists that hold a set of `value` sorted."""
    if isinstance(value, set | frozenset) and isinstance(form, list):
        return sorted(form, key=lambda item: json.dumps(item, sort_keys=True))
    if isinstance(value, dict) and isinstance(form, dict) and len(value) == len(form):
        pairs = zip(form.items(), value.values(), strict=True)
        return {k: sets_sorted(v, f) for (k, f), v in pairs}
    if isinstance(value, list | tuple) and isinstance(form, list) and len(value) == len(form):
        return [sets_sorted(v, f) for v, f in zip(value, form, strict=True)]
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


def copied(value: Any) -> Any:
    """A copy of journaled JSON, as the log gives it back: a JSON round trip, three times as
    fast as `copy.deepcopy` for a result of a megabyte. Text, a number, a bool or None is its
    own copy: nothing can change it."""
    if value is None or type(value) in _IMMUTABLE:
        return value
    return json.loads(json.dumps(value))


_IMMUTABLE = frozenset({str, int, float, bool})


def nests_deeper(value: Any, limit: int = MAX_INPUT_DEPTH) -> bool:
    """Whether `value` holds objects or lists more than `limit` levels deep (the outermost is
    level 1); a value that holds itself does. Counted without recursion."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list | tuple):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False


def jsonable(value: Any) -> Any:
    """`value` as plain JSON data, with NaN and infinities as null (as pydantic writes them in
    JSON): what a tool hands back is stored and streamed, and strict JSON readers refuse them.
    A key that is not text is written as JSON writes it (`1` as `"1"`), so the run sees what it
    will see resumed; two keys of a dict (in dicts, lists and tuples) that write as the same
    text (`1` and `"1"`) are a `UsageError`, as one would be lost. An integer too long to write
    as JSON text is `TooLarge`."""
    form = to_jsonable_python(value)  # a new structure: nothing of `value` is shared
    if key_not_text(value) is not None:
        _no_clash(value, form)
    return _finite(form) if _unfinished(form) else form


def key_not_text(value: Any) -> str | None:
    """What names the first key of `value`'s dicts (in its dicts, lists and tuples) that is not
    text, or None: stored as JSON it would come back as text, so a value handed to signoff (an
    answer, a model's call) would read one way live and another resumed."""
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key in item:
                if not isinstance(key, str):
                    return f"key {cut_repr(key)} ({type(key).__name__}) is not text"
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return None


def cut_repr(value: Any, most: int = 60) -> str:
    """`repr(value)`, cut to about `most` characters for a message."""
    shown = repr(value)
    return shown if len(shown) <= most else shown[:most] + "…"


def json_size(value: Any) -> int:
    """How many bytes `value` takes as stored JSON (UTF-8, compact)."""
    text = dumps(value)
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def result_bound(tool: Tool | None, limits: Limits) -> int:
    """The bound on `tool`'s results: its own `max_result_bytes`, or else (as for a tool the
    agent no longer has) its agent's `limits`."""
    return (None if tool is None else tool.max_result_bytes) or limits.max_result_bytes


def over_limit(
    what: str, value: Any, limit: int, *, tail: str = "(max_result_bytes); return less"
) -> str | None:
    """Why `value` may not be stored (its JSON is over `limit` bytes, ending with `tail`, the
    setting to blame and what to do), or None when it fits."""
    if isinstance(value, str) and len(value) * 4 + 2 <= limit:
        return None  # fits however it encodes: no need to measure
    size = json_size(value)
    if size <= limit:
        return None
    return f"{what} {size} bytes, over the limit of {limit} bytes {tail}"


def _unfinished(form: Any) -> bool:
    """Whether `form` holds a float `_finite` turns to null or an integer it must count the
    digits of: most results hold neither, and are kept as pydantic wrote them."""
    stack: list[Any] = [form]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is dict:
            stack.extend(item.values())
        elif kind is list:
            stack.extend(item)
        elif kind is float:
            if not math.isfinite(item):
                return True
        elif kind is int and item.bit_length() > FITS_BITS:
            return True
    return False


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, int):
        if value.bit_length() > FITS_BITS:
            check_digits(value)
        return value
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _no_clash(value: Any, form: Any) -> None:
    """Raise `UsageError` if a dict of `value` (in its dicts, lists and tuples) has fewer keys
    in `form`, pydantic's JSON form of it: two of its keys were written as the same text."""
    stack: list[tuple[Any, Any]] = [(value, form)]
    while stack:
        original, written = stack.pop()
        if isinstance(original, dict) and isinstance(written, dict):
            if len(original) != len(written):
                raise UsageError(_clash(original))
            stack.extend(zip(original.values(), written.values(), strict=True))
        elif isinstance(original, list | tuple) and isinstance(written, list):
            if len(original) == len(written):
                stack.extend(zip(original, written, strict=True))


def _clash(original: dict[Any, Any]) -> str:
    """Which two keys of `original` JSON writes as the same text."""
    first: dict[str, Any] = {}
    for key in original:
        try:
            text = next(iter(to_jsonable_python({key: None})))
        except Exception:  # pragma: no cover - pydantic wrote the whole dict, so each key too
            continue
        if text in first:
            keys = f"{cut_repr(first[text])} and {cut_repr(key)}"
            return (
                f"the value has two keys that JSON writes as the same text ({keys}, both "
                f"{cut_repr(text)}): one would be lost; make its keys text, each its own"
            )
        first[text] = key
    return "the value has two keys that JSON writes as the same text"  # pragma: no cover


def non_finite(
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
        found = non_finite(item, (*loc, key if isinstance(key, (str, int)) else str(key)))
        if found is not None:
            return found
    return None
