"""What a run sees of a value is what a resumed run sees, in any process: a tool's result and a
step's as the model and the tool read them, a model's call input, an approval payload, a
decision's value and a caller's attributes (tests/_live_resumed.py). Each is either refused by
name where it enters, or seen live as its JSON form, which is what the log gives back."""

from __future__ import annotations

import enum
from collections import OrderedDict

import pytest

from ._live_resumed import CHANNELS, is_json, probe, same


class Level(enum.IntEnum):
    HIGH = 3


class Tag(str):
    """Text of a class of its own: JSON gives back a plain `str`."""


ODD = {
    "tuple": ("a", (1, 2.5)),
    "int enum": [Level.HIGH],
    "str subclass": {"k": Tag("x")},
    "ordered dict": OrderedDict([("b", 1), ("a", (2,))]),
}
"""Values that are JSON to `json.dumps` but not of JSON's types: a decision's value, a caller's
attributes and a model's call input reached the live run as they were (a tuple, an IntEnum),
and a resumed one as JSON gave them back (a list, an int)."""


@pytest.mark.parametrize("name", list(ODD))
async def test_values_json_holds_as_other_types_are_seen_as_json_live_and_resumed(
    store_url: str, name: str
) -> None:
    outcomes = await probe(store_url, ODD[name])
    differ = {
        channel: seen
        for channel, seen in outcomes.items()
        if seen.refused is not None or not same(seen.live, seen.resumed) or not is_json(seen.live)
    }
    assert differ == {}
    assert set(outcomes) == set(CHANNELS)
