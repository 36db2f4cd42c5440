"""`plainly_written`: the quick look that spares plain input the detailed checks of what JSON
cannot write. It must never pass input those checks would refuse."""

from __future__ import annotations

import math
from datetime import date
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from signoff._input_sets import SetItems
from signoff._plain_json import plainly_written
from signoff._tool_json import keys_alike, unwritable

_KEYS = st.one_of(st.text(max_size=3), st.integers(-3, 3), st.booleans())
_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),  # NaN and infinities too
    st.text(max_size=5),
    st.binary(max_size=3),
)
_VALUES = st.recursive(
    _LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(_KEYS, inner, max_size=4),
    ),
    max_leaves=25,
)


@given(_VALUES)
def test_input_it_passes_has_nothing_the_detailed_checks_refuse(value: Any) -> None:
    if plainly_written(value):
        assert unwritable(value) is None
        assert keys_alike(value) is None


class _Float(float):
    pass


def test_what_it_leaves_to_the_detailed_checks() -> None:
    inside: list[Any] = []
    inside.append(inside)
    shared = {"a": 1}
    for value in (
        {"amount": math.nan},
        [1.0, -math.inf],
        inside,
        {"x": shared, "y": shared},  # held twice, no cycle: the detailed checks pass it
        {1: "a", "1": "b"},
        {"rows": SetItems([{"a": 1}])},
        _Float(1.0),
    ):
        assert not plainly_written(value), value


def test_plain_input_passes() -> None:
    rows = [
        {"id": i, "name": "x", "tags": ["a", "b"], "amount": 1.5, "ok": True, "none": None}
        for i in range(3)
    ]
    assert plainly_written({"rows": rows, "blob": b"\x00", "when": date(2026, 12, 7)})
