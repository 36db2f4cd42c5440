"""A tool's input and results as JSON: the bound on a result's size, NaN and infinities as null,
sets in a stable order, keys JSON cannot keep apart (in results and in input), input JSON cannot
write, the masked secrets a reviewer's form gives back, and whether that form, validated again,
is the input the tool gets."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, RootModel, Secret, SecretBytes, SecretStr
from pydantic_core import PydanticSerializationError, to_jsonable_python

from ._events import FITS_BITS, check_digits, dumps
from ._exceptions import UsageError
from ._input_sets import as_set, json_key, python_dump
from ._json_keys import as_json_keys, check_keys, key_not_text
from ._text import cut
from ._types import same_json

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
    "edit_changed",
    "holds_iterator",
    "holds_mask",
    "is_mask",
    "json_size",
    "jsonable",
    "kept",
    "key_not_text",
    "keys_alike",
    "nests_deeper",
    "over_limit",
    "own_input",
    "recorded_bound",
    "result_bound",
    "unlike",
    "unwritable",
]


_MASK = "**********"
"""How pydantic shows a secret as JSON, as a reviewer sees it."""


def is_mask(value: Any) -> bool:
    """Whether a value of a reviewer's form is a secret's mask, which holds no value of it."""
    return isinstance(value, str) and value == _MASK


def holds_mask(validated: BaseModel) -> bool:
    """Whether validated input holds a secret whose value is its mask: what a reviewer's form
    gives back for a secret, which a tool must not be run with."""
    seen: set[int] = set()  # a container walked once: one inside itself looped for ever
    stack: list[Any] = [python_dump(validated)]
    while stack:
        value = stack.pop()
        if isinstance(value, SecretStr | SecretBytes | Secret):
            if value.get_secret_value() in (_MASK, _MASK.encode()):
                return True
        elif isinstance(value, dict | list | tuple | set | frozenset) and id(value) not in seen:
            seen.add(id(value))
            stack.extend(value.values() if isinstance(value, dict) else value)
    return False


def copied(value: Any) -> Any:
    """A copy of journaled JSON, as the log gives it back: a JSON round trip, three times as
    fast as `copy.deepcopy` for a result of a megabyte. Written as the log writes it (not as
    `\\u` escapes, which JSON reads back as one character where two surrogates were). Text, a
    number, a bool or None is its own copy: nothing can change it."""
    if value is None or type(value) in _IMMUTABLE:
        return value
    return json.loads(dumps(value))


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
    A key that is not text is written as JSON writes it (`1` as `"1"`, `None` as `"null"`), so
    the run sees what it will see resumed; two keys of a dict (wherever its JSON form has
    objects: dicts, lists, tuples, models, dataclasses) that write as the same text (`1` and
    `"1"`) are a `UsageError`, as one would be lost, and so is a value with no JSON form. An
    integer too long to write as JSON text is `TooLarge`."""
    form = _json_form(value)  # a new structure: nothing of `value` is shared
    if check_keys(value):
        form = _json_form(as_json_keys(value))
    return _finite(form) if _unfinished(form) else form


def _json_form(value: Any) -> Any:
    """pydantic's JSON form of `value`, or a `UsageError` saying why it has none: the same
    error on every run, so a step's failure replays as it was raised."""
    try:
        return to_jsonable_python(value)
    except (PydanticSerializationError, ValueError, TypeError, RecursionError) as exc:
        raise UsageError(
            f"the value has no JSON form ({type(exc).__name__}: {cut(str(exc), 200)}); "
            "return plain data: dicts, lists, text, numbers, booleans, None, or a pydantic model"
        ) from None


_MOST_BYTES_A_CHAR = 6
"""The most bytes one character of a string takes as stored JSON: a control character (below
U+0020, but for five with a short escape) is written as a six-character `\\u` escape."""


def json_size(value: Any) -> int:
    """How many bytes `value` takes as stored JSON (UTF-8, compact)."""
    text = dumps(value)
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def result_bound(tool: Tool | None, limits: Limits) -> int:
    """The bound on `tool`'s results: its own `max_result_bytes`, or else (as for a tool the
    agent no longer has) its agent's `limits`."""
    return (None if tool is None else tool.max_result_bytes) or limits.max_result_bytes


def recorded_bound(limit: int) -> int | None:
    """A call's result bound as a request records it: None for the default, which any runtime
    applies (and an older signoff cannot read the field), else the bound."""
    return None if limit == MAX_RESULT_BYTES else limit


def over_limit(
    what: str, value: Any, limit: int, *, tail: str = "(max_result_bytes); return less"
) -> str | None:
    """Why `value` may not be stored (its JSON is over `limit` bytes, ending with `tail`, the
    setting to blame and what to do), or None when it fits."""
    if isinstance(value, str) and len(value) * _MOST_BYTES_A_CHAR + 2 <= limit:
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


def unwritable(value: Any) -> tuple[tuple[str | int, ...], Any] | None:
    """Where validated input holds what JSON cannot write, and what: NaN or an infinity (pydantic
    parses "NaN" and "1e400" into floats: such input would slip past `amount > 100` and reach
    the reviewer as null), or a dict, list, tuple or set inside itself (a validator may make
    one: walked by recursion, it raised `RecursionError` out of the drive). Walked without
    recursion, each container once: one held twice, not inside itself, is no cycle."""
    inside: set[int] = set()  # the containers the walk is in
    done: set[int] = set()
    stack: list[tuple[Any, tuple[str | int, ...], bool]] = [(value, (), False)]
    while stack:
        item, where, leaving = stack.pop()
        if leaving:
            inside.discard(id(item))
            done.add(id(item))
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                return where, item
            continue
        if isinstance(item, dict):
            items: Any = item.items()
        elif isinstance(item, list | tuple | set | frozenset):
            items = enumerate(item)
        else:
            continue
        if id(item) in inside:
            return where, item
        if id(item) in done:
            continue
        inside.add(id(item))
        stack.append((item, where, True))
        children = [
            (v, (*where, k if isinstance(k, str | int) else str(k)), False) for k, v in items
        ]
        stack.extend(reversed(children))  # the first found first, as the input reads
    return None


def keys_alike(value: Any) -> tuple[tuple[str | int, ...], Any, Any, str] | None:
    """Where validated input (with no container inside itself: `unwritable`) has a dict with two
    keys pydantic writes as the same JSON text (`1` and `"1"`, `True` and `"true"`), which two,
    and the text: its JSON form, which a reviewer approves and the records keep, would hold one
    of them where the tool body gets both. A dict with a key pydantic cannot write (a frozenset)
    is skipped: its input has no JSON form to show at all, which `Tool.approved_form` raises."""
    done: set[int] = set()
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        item, where = stack.pop()
        if not isinstance(item, dict | list | tuple | set | frozenset) or id(item) in done:
            continue
        done.add(id(item))
        if not isinstance(item, dict):
            stack.extend(reversed([(v, (*where, i)) for i, v in enumerate(item)]))
            continue
        if any(type(key) is not str for key in item):
            found = _alike(item)
            if found is not None:
                first, second, text = found
                return (*where, _loc(second)), first, second, text
        stack.extend(reversed([(v, (*where, _loc(k))) for k, v in item.items()]))
    return None


def _alike(item: dict[Any, Any]) -> tuple[Any, Any, str] | None:
    """The first two keys of `item` pydantic writes as the same text, and the text."""
    keys = list(item)
    try:
        written = to_jsonable_python([{key: None} for key in keys])
    except (PydanticSerializationError, ValueError, TypeError):
        return None
    first: dict[str, Any] = {}
    for key, one in zip(keys, written, strict=True):
        text = next(iter(one))
        if text in first:
            return first[text], key, text
        first[text] = key
    return None


def _loc(key: Any) -> str | int:
    return key if isinstance(key, str | int) else str(key)


def unlike(validated: Any, again: Any, form: Any) -> tuple[tuple[str | int, ...], bool] | None:
    """Where `form` (validated input's JSON form, as a reviewer sees it) does not show what the
    tool gets, and whether there it leaves the value out (a field excluded from JSON): where
    `again` (the form validated again) is other input than `validated`, unless the form holds
    that value as it is (plain JSON a validator changes again each time it runs, as one that
    scales a number). A secret whose value in `again` is its mask is alike (a reviewer sees a
    secret masked, by design). Fields are compared as the tool gets them, excluded ones too;
    walked without recursion, each pair once."""
    seen: set[tuple[int, int]] = set()
    stack: list[tuple[Any, Any, Any, tuple[str | int, ...], bool]] = [
        (validated, again, form, (), False)
    ]
    while stack:
        one, other, shown, where, left_out = stack.pop()
        if isinstance(one, _Kept):
            # A lazy iterator its form used up: what it gave, against what `again`'s gives.
            one = one.items
            try:
                other = list(other) if isinstance(other, Iterator) else other
            except (Exception, SystemExit):  # an item of the form is no valid input
                return where, left_out
        if isinstance(one, SecretStr | SecretBytes | Secret) and type(one) is type(other):
            value = other.get_secret_value()
            if value not in (_MASK, _MASK.encode()) and one.get_secret_value() != value:
                return where, left_out
            continue
        if type(one) is not type(other):
            pass
        elif isinstance(one, BaseModel | dict | list | tuple) or _is_dataclass(one):
            if (id(one), id(other)) in seen:
                continue
            seen.add((id(one), id(other)))
            pairs = _pairs(one, other, shown, where, left_out)
            if pairs is not None:
                stack.extend(reversed(pairs))  # the first found first, as the input reads
                continue
        elif one == other:
            continue
        if not (shown is not _ABSENT and _plain(one) and same_json(one, shown)):
            return where, left_out
    return None


_ABSENT = object()
"""Where the form has no value for a value the tool gets."""


def _pairs(
    one: Any, other: Any, shown: Any, where: tuple[str | int, ...], left_out: bool
) -> list[tuple[Any, Any, Any, tuple[str | int, ...], bool]] | None:
    """What `unlike` compares inside two containers of a type, with the form's part for each;
    None if they do not hold the same keys or as many items."""

    def part(key: Any) -> Any:
        if isinstance(shown, dict):
            return shown.get(key, _ABSENT) if isinstance(key, str) else _ABSENT
        if isinstance(shown, list) and isinstance(key, int) and key < len(shown):
            return shown[key]
        return _ABSENT

    if isinstance(one, BaseModel):
        pairs: list[tuple[Any, Any, Any, tuple[str | int, ...], bool]] = []
        for name, info in type(one).model_fields.items():
            out = left_out or bool(info.exclude) or getattr(info, "exclude_if", None) is not None
            key = info.serialization_alias or name
            pairs.append((getattr(one, name), getattr(other, name), part(key), (*where, name), out))
        extra = one.__pydantic_extra__ or {}, other.__pydantic_extra__ or {}
        if extra[0] or extra[1]:
            pairs.append((*extra, shown, where, left_out))
        return pairs
    if _is_dataclass(one):
        names = [field.name for field in dataclasses.fields(one)]
        return [(getattr(one, n), getattr(other, n), part(n), (*where, n), left_out) for n in names]
    if isinstance(one, dict):
        if one.keys() != other.keys():
            return None
        return [(v, other[k], part(k), (*where, _loc(k)), left_out) for k, v in one.items()]
    if len(one) != len(other):
        return None
    both = enumerate(zip(one, other, strict=True))
    return [(v, w, part(i), (*where, i), left_out) for i, (v, w) in both]


def _plain(value: Any) -> bool:
    """Whether `value` is plain JSON (text keys, lists, no objects), as its form holds it."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if any(type(key) is not str for key in item):
                return False
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif not (item is None or type(item) in (str, int, float, bool)):
            return False
    return True


def _is_dataclass(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def own_input(tool: Tool, raw: Any, validated: BaseModel) -> BaseModel:
    """`validated` (of `raw`) for one more reader, or for a lazy input (`Tool.holds_lazy`) `raw`
    validated anew: whoever reads a lazy input (a policy, a guardrail, a reviewer's form, the
    body) uses up its iterators, so each gets its own. Raises `ValidationError` as
    `Tool.validate` does."""
    return tool.validate(raw) if tool.holds_lazy(validated) else validated


def holds_iterator(value: Any) -> bool:
    """Whether validated input holds an iterator anywhere (a model's field or extra, a
    dataclass's, a container's item), which one reading uses up; looked at, not read. Walked
    without recursion, each container once."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind in _PLAIN:
            continue
        if kind is dict:
            items: Any = item.values()
        elif kind is list or kind is tuple:
            items = item
        elif isinstance(item, Iterator):
            return True
        elif isinstance(item, BaseModel):
            items = [*item.__dict__.values(), *(item.__pydantic_extra__ or {}).values()]
        elif _is_dataclass(item):
            items = [getattr(item, f.name) for f in dataclasses.fields(item)]
        elif isinstance(item, dict):
            items = item.values()
        elif isinstance(item, list | tuple | set | frozenset):
            items = item
        else:
            continue
        if id(item) not in seen:
            seen.add(id(item))
            stack.extend(items)
    return False


_PLAIN = frozenset({str, int, float, bool, type(None), bytes})
"""Types of values with nothing inside, passed over at once (most of an input's)."""


class _Kept(Iterator[Any]):
    """A lazy iterator of validated input (an `Iterable[...]` parameter), keeping the items it
    gives: its JSON form uses it up, and `unlike` compares what it held."""

    def __init__(self, inner: Iterator[Any]) -> None:
        self.inner = inner
        self.items: list[Any] = []

    def __next__(self) -> Any:
        item = kept(next(self.inner))
        self.items.append(item)
        return item


def kept(value: Any) -> Any:
    """`value`, validated input of its reader's own, with each lazy iterator in it made one
    that keeps its items (in place; one in a tuple is left as it is, and compares as unlike):
    its JSON form uses the iterators up, and `unlike` is to compare what they held. Walked
    without recursion."""
    if isinstance(value, Iterator):
        return _Kept(value)
    seen: set[int] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, BaseModel):
            slots: Any = item.__dict__  # a frozen model's fields too, as pydantic reads them
            if item.__pydantic_extra__:
                stack.append(item.__pydantic_extra__)
        elif _is_dataclass(item):
            slots = {f.name: getattr(item, f.name) for f in dataclasses.fields(item)}
        elif isinstance(item, dict | list):
            slots = item
        else:
            if isinstance(item, tuple):
                stack.extend(item)
            continue
        for key, inner in list(slots.items() if isinstance(slots, dict) else enumerate(slots)):
            if isinstance(inner, Iterator) and not isinstance(inner, _Kept):
                inner = _Kept(inner)
                if _is_dataclass(item):
                    object.__setattr__(item, key, inner)
                else:
                    slots[key] = inner
            else:
                stack.append(inner)
    return value


def edit_changed(
    given: Any, form: Any, validated: Any = None
) -> tuple[tuple[str | int, ...], Any, bool] | None:
    """Where an edit as a reviewer gave it (`given`, plain JSON) is not what its validated form
    (`form`) holds, the form's value there (for a dropped key, the name the form shows it by,
    if it is a field's own name), and whether the form dropped that key: a validator that
    changed a value (`min(v, 1000)`), a model that ignored a misspelt key. Keys the edit leaves
    out are the form's to fill; a list may come back in another order only where `validated`
    holds a set (or, sorted, where nothing tells: inside a set's items), so one a validator
    sorts is changed. A computed field of a model (in `validated`, the edit validated) is no
    input: the form shows it anew, so the edit's own (the stale one a dashboard posts back) is
    not compared."""
    stack: list[tuple[Any, Any, Any, tuple[str | int, ...]]] = [(given, form, validated, ())]
    while stack:
        one, shown, value, where = stack.pop()
        while isinstance(value, RootModel):  # its JSON form is its root's
            value = value.root
        if isinstance(one, dict) and isinstance(shown, dict):
            computed = _computed(value)
            for key in one:
                if key not in shown and key not in computed:
                    return (*where, key), _shown_as(value, key), True
            stack.extend(
                reversed(
                    [
                        (v, shown[k], _inner(value, k), (*where, k))
                        for k, v in one.items()
                        if k not in computed
                    ]
                )
            )
        elif isinstance(one, list) and isinstance(shown, list) and len(one) == len(shown):
            held = isinstance(value, set | frozenset)
            if (value is None or held) and as_set(one, shown, held):
                continue
            inner = value if isinstance(value, list | tuple) and len(value) == len(one) else None
            pairs = enumerate(zip(one, shown, strict=True))
            stack.extend(
                reversed(
                    [
                        (v, w, None if inner is None else inner[i], (*where, i))
                        for i, (v, w) in pairs
                    ]
                )
            )
        elif not same_json(one, shown):
            return where, shown, False
    return None


def _shown_as(value: Any, key: str) -> str | None:
    """The name the form shows a model's field by, if `key` is its own name and not that one
    (`populate_by_name` takes it, the form does not show it so)."""
    info = type(value).model_fields.get(key) if isinstance(value, BaseModel) else None
    return None if info is None else info.serialization_alias


def _computed(value: Any) -> set[str]:
    """The keys of a model's (or a pydantic dataclass's) computed fields in its JSON form, but
    a key a field of input is shown by too (a computed field aliased so): that one is input."""
    fields = getattr(type(value), "__pydantic_computed_fields__", None) or {}
    real = getattr(type(value), "__pydantic_fields__", None) or {}
    taken = {info.serialization_alias or info.alias or name for name, info in real.items()}
    return {info.alias or name for name, info in fields.items()} - taken - set(real)


def _inner(value: Any, key: str) -> Any:
    """What `value` (validated input, a part of it) holds under `key` of its JSON form."""
    if isinstance(value, BaseModel):
        for name, info in type(value).model_fields.items():
            if (info.serialization_alias or name) == key:
                return getattr(value, name)
        return (value.__pydantic_extra__ or {}).get(key)
    if _is_dataclass(value):
        fields = getattr(type(value), "__pydantic_fields__", None) or {}
        for name, info in fields.items():
            if (info.serialization_alias or name) == key:
                return getattr(value, name, None)
        return getattr(value, key, None)
    if not isinstance(value, dict):
        return None
    if key in value:
        return value[key]
    # A key that is not text (a number, an Enum) is shown by its JSON form.
    return next((v for k, v in value.items() if json_key(k) == key), None)
