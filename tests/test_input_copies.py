"""`own_copy`: a validated input's models and containers copied, each level, and every other
object shared as it is."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, deque
from typing import Any, NamedTuple

import pydantic

from signoff._input_copies import own_copy


class Account:
    """An object of the app's own: shared, never copied."""


class Line(pydantic.BaseModel, frozen=True):
    sku: str
    tags: tuple[str, ...] = ()


class Order(pydantic.BaseModel, extra="allow"):
    lines: list[Line]
    account: Any
    notes: dict[str, list[str]]


@dataclasses.dataclass(frozen=True)
class Box:
    items: list[int]


class Pair(NamedTuple):
    left: list[int]
    right: Account


def test_models_and_containers_are_copied_and_other_objects_shared() -> None:
    account = Account()
    order = Order(lines=[Line(sku="a")], account=account, notes={"x": ["1"]}, memo=["m"])
    seen = own_copy(order)
    assert seen == order and seen is not order
    assert seen.account is account
    assert seen.lines is not order.lines and seen.notes["x"] is not order.notes["x"]
    seen.lines.append(Line(sku="b"))
    seen.notes["x"].append("2")
    seen.memo.append("n")  # an extra field's value: copied too
    assert order.lines == [Line(sku="a")] and order.notes == {"x": ["1"]}
    assert order.model_extra == {"memo": ["m"]}
    assert seen.model_fields_set == order.model_fields_set


def test_dataclasses_tuples_sets_deques_and_dict_kinds_keep_their_kind() -> None:
    account = Account()
    value: dict[str, Any] = {
        "box": Box(items=[1]),
        "pair": Pair([1], account),
        "plain": ([1], account),
        "lines": {Line(sku="a")},
        "frozen": frozenset({Line(sku="b")}),
        "recent": deque([[1]], maxlen=3),
        "ordered": OrderedDict(a=[1]),
        "raw": bytearray(b"ab"),
    }
    seen = own_copy(value)
    assert seen == value
    assert isinstance(seen["box"], Box) and seen["box"].items is not value["box"].items
    assert isinstance(seen["pair"], Pair) and seen["pair"].right is account
    assert seen["pair"].left is not value["pair"].left
    assert seen["plain"][0] is not value["plain"][0] and seen["plain"][1] is account
    assert seen["lines"] == {Line(sku="a")} and seen["lines"] is not value["lines"]
    assert type(seen["frozen"]) is frozenset
    assert seen["recent"].maxlen == 3 and seen["recent"][0] is not value["recent"][0]
    assert type(seen["ordered"]) is OrderedDict
    assert seen["ordered"]["a"] is not value["ordered"]["a"]
    assert seen["raw"] is not value["raw"]


def test_a_structure_reached_twice_or_holding_itself_is_copied_once() -> None:
    shared = [1]
    looped: list[Any] = [shared, shared]
    looped.append(looped)
    seen = own_copy(looped)
    assert seen[0] is seen[1] and seen[0] is not shared
    assert seen[2] is seen


class Cached(pydantic.BaseModel):
    items: list[str]
    _lines: list[str] = pydantic.PrivateAttr(default_factory=list)

    @pydantic.model_validator(mode="after")
    def _fill(self) -> Cached:
        self._lines.extend(self.items)
        return self


@dataclasses.dataclass
class Derived:
    items: list[int]

    def __post_init__(self) -> None:
        self.total = [sum(self.items)]


def test_private_attributes_derived_attributes_and_wrapped_values_are_copied_too() -> None:
    """What a reader may change in place besides fields: a model's private attributes, what a
    dataclass's `__post_init__` set, the value a `Secret` hides, a `UserList`'s or a
    `ChainMap`'s contents."""
    from collections import ChainMap, UserList

    value: dict[str, Any] = {
        "cached": Cached(items=["x", "y"]),
        "derived": Derived(items=[1, 2]),
        "secret": pydantic.Secret[list[str]](["k"]),
        "user": UserList([[1]]),
        "chain": ChainMap({"a": [1]}),
    }
    seen = own_copy(value)
    seen["cached"]._lines.append("added")
    seen["derived"].total.append(0)
    seen["secret"].get_secret_value().append("added")
    seen["user"][0].append(2)
    seen["chain"]["a"].append(2)
    assert value["cached"]._lines == ["x", "y"] and seen["cached"]._lines == ["x", "y", "added"]
    assert value["derived"].total == [3]
    assert value["secret"].get_secret_value() == ["k"]
    assert value["user"] == UserList([[1]]) and type(seen["user"]) is UserList
    assert value["chain"]["a"] == [1] and type(seen["chain"]) is ChainMap
