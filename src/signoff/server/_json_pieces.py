"""A value's compact JSON written in pieces of bounded size, never built whole.

An event stream writes a large event's frame in pieces, so a client that stops reading holds
one piece of it in the server (and the event itself), not the whole frame: a 4 MiB message of
control characters is 25 MB of JSON once escaped. The pieces join into exactly what
`json.dumps(value, separators=(",", ":"))` returns (ASCII: every other character escaped), so
the wire is the same; only how much of it is in memory at once changes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

__all__ = ["PIECE", "json_pieces"]

PIECE = 64 << 10
"""The most characters of JSON one piece holds."""

_WIDEST = 12
"""The most characters one character of a string becomes in JSON: `\\ud83d\\ude00`."""


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def json_pieces(value: Any, most: int = PIECE) -> Iterator[str]:
    """`value`'s compact JSON, in pieces of at most `most` characters (from 64) that join into
    `json.dumps(value, separators=(",", ":"))`. A value whose JSON cannot be that large is
    one piece, written by `json.dumps` at once."""
    if most < 64:
        raise ValueError(f"a piece holds at least 64 characters, not {most}")
    held: list[str] = []
    size = 0
    for part in _parts(value, most):
        if held and size + len(part) > most:
            yield "".join(held)
            held, size = [], 0
        held.append(part)
        size += len(part)
    if held:
        yield "".join(held)


_AT_ONCE = 4
"""A value whose JSON may take up to this many pieces is written by `json.dumps` at once and
cut: parted further, a 60 KB event of many small items took 4.8x as long to frame."""


def _parts(value: Any, most: int) -> Iterator[str]:
    """`value`'s JSON in parts of at most `most` characters each (joined by `json_pieces`)."""
    if _within(value, most) >= 0:
        yield _dumps(value)
    elif _within(value, _AT_ONCE * most) >= 0:
        text = _dumps(value)
        for start in range(0, len(text), most):
            yield text[start : start + most]
    elif isinstance(value, str):
        step = most // _WIDEST
        yield '"'
        for start in range(0, len(value), step):
            yield _dumps(value[start : start + step])[1:-1]
        yield '"'
    elif isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            yield _dumps(value)  # keys JSON turns into strings (numbers): never in an event
            return
        yield "{"
        for i, (key, item) in enumerate(value.items()):
            if i:
                yield ","
            yield from _parts(key, most)
            yield ":"
            yield from _parts(item, most)
        yield "}"
    elif isinstance(value, list | tuple):
        yield "["
        for i, item in enumerate(value):
            if i:
                yield ","
            yield from _parts(item, most)
        yield "]"
    else:  # a number that large: json.dumps writes it, as it would anyway
        yield _dumps(value)


def _within(value: Any, budget: int) -> int:
    """What is left of `budget` after the most characters `value`'s JSON may take, or a
    negative number as soon as it may take more (counted no further)."""
    if isinstance(value, str):
        return budget - 2 - _WIDEST * len(value)
    if isinstance(value, dict):
        budget -= 1 + len(value)
        for key, item in value.items():
            if budget < 0:
                return budget
            budget = _within(item, _within(key, budget - 3))  # a key not a string is quoted
        return budget
    if isinstance(value, list | tuple):
        budget -= 1 + len(value)
        for item in value:
            if budget < 0:
                return budget
            budget = _within(item, budget)
        return budget
    if isinstance(value, int) and value.bit_length() > 64:  # JSON writes an int of any size
        return budget - 3 - value.bit_length() // 3  # its digits, and a sign
    return budget - 32  # a number, a bool, null: 32 characters at most (`-1.7976931348623157e+308`)
