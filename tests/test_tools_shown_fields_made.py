"""Tools the shown-form checks refused wrongly when made (`_check_names`, `_check_shown_fields`):
a field read by `AliasChoices("to")` (or `AliasPath("to")`) and shown as "to" names one key
both ways (the core schema writes it `[["to"]]`, compared with "to"); a model with
`exclude=True` used only as what a serializer returns, or as a validator's JSON schema input,
is no input the tool gets."""

# No `from __future__ import annotations`: the tools' hints name types local to a test.
from typing import Annotated

import pytest
from pydantic import AliasChoices, AliasPath, BaseModel, Field, PlainSerializer, PlainValidator

import signoff as so


class _Hidden(BaseModel):
    a: int
    secret: int = Field(default=0, exclude=True)


def _choice(
    to: Annotated[str, Field(validation_alias=AliasChoices("to"), serialization_alias="to")],
) -> str:
    """Send."""
    return to


def _path(
    to: Annotated[str, Field(validation_alias=AliasPath("to"), serialization_alias="to")],
) -> str:
    """Send."""
    return to


def _returned(
    x: Annotated[str, PlainSerializer(lambda v: _Hidden(a=len(v)), return_type=_Hidden)],
) -> str:
    """Send."""
    return x


def _described(x: Annotated[str, PlainValidator(str, json_schema_input_type=_Hidden)]) -> str:
    """Send."""
    return x


@pytest.mark.parametrize("fn", [_choice, _path])
def test_a_field_read_by_one_alias_choice_of_its_shown_name_is_made(fn: object) -> None:
    tool = so.tool(fn, approval=so.always())  # type: ignore[call-overload]
    assert tool.approved_form(tool.validate({"to": "al"})) == {"to": "al"}


@pytest.mark.parametrize("fn", [_returned, _described])
def test_a_model_with_an_excluded_field_that_is_no_input_is_made(fn: object) -> None:
    so.tool(fn, approval=so.always())  # type: ignore[call-overload]


def test_an_excluded_field_of_input_beside_one_is_still_refused() -> None:
    def both(
        x: Annotated[str, PlainValidator(str, json_schema_input_type=_Hidden)], h: _Hidden
    ) -> str:
        """Send."""
        return x

    with pytest.raises(so.UsageError, match="field 'secret' is excluded from the input's JSON"):
        so.tool(both, approval=so.always())
