"""A quick look at validated input before the detailed checks of what JSON cannot write
(`unwritable`, `keys_alike`): plain input, nearly all of it, has nothing for them to find, and
they keep each value's path as they walk, several times the cost of looking."""

from __future__ import annotations

from typing import Any

__all__ = ["plainly_written"]

_SCALARS = frozenset({str, int, bool, type(None), bytes})
_SEQUENCES = frozenset({list, tuple, set, frozenset})


def plainly_written(value: Any) -> bool:
    """Whether a dump of validated input is plainly JSON: each float finite, each dict's keys
    text, each container met once (so none inside itself), and no subclass of a float or a
    container (a set's items as `SetItems`), whose case the detailed checks decide. False
    asks them, which then name what they find or find nothing. Walked without recursion."""
    seen: set[int] = set()
    stack = [value]
    pop, more = stack.pop, stack.extend
    while stack:
        item = pop()
        kind = type(item)
        if kind in _SCALARS:
            continue
        if kind is float:
            if item - item != 0.0:  # NaN or an infinity (inf - inf is NaN)
                return False
            continue
        if kind is dict:
            if id(item) in seen:
                return False
            seen.add(id(item))
            for key in item:
                if type(key) is not str:
                    return False
            more(item.values())
        elif kind in _SEQUENCES:
            if id(item) in seen:
                return False
            seen.add(id(item))
            more(item)
        elif isinstance(item, float | dict | list | tuple | set | frozenset):
            return False
        else:
            continue  # any other value (a date, a Decimal, a secret) holds nothing they look for
    return True
