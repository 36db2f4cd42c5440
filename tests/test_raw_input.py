"""Which tools' input code may see or keep as given (`shares_raw`), whose validation is of a
copy of it (`raw_copy`), and that the copy is exact: plain tools, whose input validation makes
anew, are not copied at each call."""

# No `from __future__ import annotations`: the tools' hints name types local to a test.
import dataclasses
import math
import re
from typing import Annotated, Any, Literal

import pytest
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    InstanceOf,
    PlainSerializer,
    PlainValidator,
    Tag,
    WrapValidator,
    field_validator,
    model_validator,
)

import signoff as so
from signoff import _tools
from signoff._raw_input import raw_copy, shares_raw


class _Before(BaseModel):
    x: int

    @model_validator(mode="before")
    @classmethod
    def _seen(cls, data: Any) -> Any:
        return data


class _Wrap(BaseModel):
    x: int

    @model_validator(mode="wrap")
    @classmethod
    def _seen(cls, data: Any, handler: Any) -> Any:
        return handler(data)


class _FieldBefore(BaseModel):
    x: list[int]

    @field_validator("x", mode="before")
    @classmethod
    def _seen(cls, value: Any) -> Any:
        return value


class _Init(BaseModel):
    x: int

    def __init__(self, **data: Any) -> None:
        super().__init__(**data)


class _Extra(BaseModel):
    model_config = ConfigDict(extra="allow")
    x: int


class _After(BaseModel):
    x: list[int]

    @model_validator(mode="after")
    def _seen(self) -> "_After":
        return self


class _Plain(BaseModel):
    x: list[int]
    y: dict[str, list[str]] = Field(default_factory=dict)


SHARING: list[Any] = [
    _Before,
    _Wrap,
    _FieldBefore,
    _Init,
    _Extra,
    Any,
    list,  # its items as they were given
    dict[str, Any],
    InstanceOf[list],  # type: ignore[type-arg]
    Annotated[list[int], BeforeValidator(list)],
    Annotated[list[int], WrapValidator(lambda v, h: h(v))],
    Annotated[list[int], PlainValidator(list)],
]
MADE_ANEW: list[Any] = [
    _After,
    _Plain,
    list[int],
    dict[str, list[str]],
    Annotated[list[int], AfterValidator(sorted)],
    Annotated[list[int], PlainSerializer(sorted)],  # a serializer sees validated input only
]


def _tool(hint: Any) -> so.Tool:
    def use(value: hint) -> str:
        """Use it."""
        return ""

    return so.tool(use)


def _named(hint: Any) -> str:
    """A hint's repr without addresses, the same in each xdist worker (they collect alike)."""
    return re.sub(r" at 0x[0-9a-f]+", "", repr(hint))


@pytest.mark.parametrize("hint", SHARING, ids=_named)
def test_code_that_sees_or_keeps_raw_input_is_found(hint: Any) -> None:
    assert shares_raw(_tool(hint).input_model.__pydantic_core_schema__)


@pytest.mark.parametrize("hint", MADE_ANEW, ids=_named)
def test_input_validation_makes_anew_is_not(hint: Any) -> None:
    assert not shares_raw(_tool(hint).input_model.__pydantic_core_schema__)


def test_only_a_tool_whose_code_sees_raw_input_validates_a_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A plain tool pays nothing at each call; one with a before validator a copy each time."""
    copies: list[Any] = []

    def counted(raw: Any) -> Any:
        copies.append(raw)
        return raw_copy(raw)

    monkeypatch.setattr(_tools, "raw_copy", counted)
    given = {"value": [3, 1]}
    _tool(_Plain).validate({"value": {"x": [1]}})
    _tool(list[int]).validate(given)
    assert copies == []
    _tool(Annotated[list[int], BeforeValidator(list)]).validate(given)
    assert copies == [given]


def test_a_copy_is_exact_and_shares_nothing() -> None:
    """NaN, a huge integer, a lone surrogate, a bool and a nested list as they were; a value
    held twice is one value twice in the copy."""
    shared = [1, 2]
    raw = {"n": math.nan, "big": 10**400, "s": "\ud800", "b": True, "l": [[shared], shared]}
    copy = raw_copy(raw)
    assert copy.keys() == raw.keys() and math.isnan(copy["n"])
    assert (copy["big"], copy["s"], copy["b"]) == (10**400, "\ud800", True)
    assert type(copy["b"]) is bool and copy["l"] == [[[1, 2]], [1, 2]]
    assert copy["l"] is not raw["l"] and copy["l"][1] is not shared
    assert copy["l"][0][0] is copy["l"][1]


def test_input_holding_objects_copies_its_dicts_and_lists() -> None:
    """A Python caller's object (none of JSON) is kept as it is; the dicts and lists around
    it are new, one inside itself too."""
    thing = object()
    raw: dict[str, Any] = {"thing": thing, "items": [{"a": [1]}]}
    raw["self"] = raw
    copy = raw_copy(raw)
    assert copy["thing"] is thing and copy["self"] is copy
    assert copy["items"] == [{"a": [1]}] and copy["items"][0]["a"] is not raw["items"][0]["a"]
    deep: list[Any] = []
    for _ in range(5000):  # deeper than marshal writes
        deep = [deep]
    assert raw_copy(deep) is not deep


class _Card(BaseModel):
    kind: Literal["card"] = "card"
    number: str


class _Bank(BaseModel):
    kind: Literal["bank"]
    iban: str


def _kind(value: Any) -> Any:
    """A discriminator that fills in a kind the input left out, in the input itself."""
    if isinstance(value, dict):
        return value.setdefault("kind", "card")
    return getattr(value, "kind", None)


_Method = Annotated[
    Annotated[_Card, Tag("card")] | Annotated[_Bank, Tag("bank")], Discriminator(_kind)
]


@dataclasses.dataclass
class _Clamp:
    """A callable dataclass as a validator: `eq=True` makes it unhashable."""

    lo: int
    hi: int

    def __call__(self, value: int) -> int:
        return max(self.lo, min(self.hi, value))


def _filtered(query: str, filters: dict[str, list[str]] = {"type": ["bug"]}) -> str:  # noqa: B006
    """Search with filters whose default holds a "type" key, as JSON-schema-like data does."""
    return query


def _clamped(level: Annotated[int, AfterValidator(_Clamp(0, 10))]) -> str:
    """Set a level."""
    return str(level)


def _paid(method: _Method, amount: int) -> str:
    """Pay."""
    return str(amount)


def test_schemas_holding_odd_values_validate_and_share_as_they_should() -> None:
    """A default whose dict has a "type" list, read as a schema node's type, failed every call
    with a bare TypeError (unhashable), as did a callable dataclass validator (unhashable, looked
    up among the empty-value factories); a discriminator function sees the raw input, and one
    filling in a kind changed the call's own input."""
    filtered = so.tool(_filtered)
    assert not shares_raw(filtered.input_model.__pydantic_core_schema__)
    assert filtered.validate({"query": "x"}).filters == {"type": ["bug"]}  # type: ignore[attr-defined]
    clamped = so.tool(_clamped, approval=so.always())
    level = clamped.validate({"level": 50})
    assert not clamped.holds_lazy(level) and clamped.shown_form(level) == {"level": 10}
    paid = so.tool(_paid)
    assert shares_raw(paid.input_model.__pydantic_core_schema__)
    raw = {"method": {"number": "4111"}, "amount": 5}
    assert paid.validate(raw).method.kind == "card"  # type: ignore[attr-defined]
    assert raw == {"method": {"number": "4111"}, "amount": 5}
