"""Which tools' input code may see or keep as given (`shares_raw`), whose validation is of a
copy of it (`raw_copy`), and that the copy is exact: plain tools, whose input validation makes
anew, are not copied at each call."""

# No `from __future__ import annotations`: the tools' hints name types local to a test.
import math
import re
from typing import Annotated, Any

import pytest
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    InstanceOf,
    PlainSerializer,
    PlainValidator,
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
