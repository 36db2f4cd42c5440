"""A tool's input that Python refuses is validated as the JSON it is (`Tool.validate`,
pydantic's JSON mode): the model's arguments, a reviewer's edit and a form validated again.
Validated as Python alone, a strict model (`ConfigDict(strict=True)`, common to stop `"5"`
becoming 5, or `Strict()` fields) refused every call: a date, a UUID or an enum's value is text
in JSON, a tuple an array, and Python's strict mode wants the objects ("Input should be an
instance of Currency"). Validated as JSON alone, a lax tool got other values than it had: a
`str | UUID` a UUID (smart union), so Python mode comes first."""

# No `from __future__ import annotations`: the tools' hints name types local to a test.
import datetime as dt
import enum
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    ValidationInfo,
)

import signoff as so
from signoff.testing import Capture, call_tools, reply, scripted_agent, sqlite_runtime, tool_results

ALICE = so.Principal(authenticator="test", principal_id="alice")
ORDER = "12345678-1234-5678-1234-567812345678"


class Currency(enum.StrEnum):
    EUR = "EUR"
    USD = "USD"


class Refund(BaseModel):
    model_config = ConfigDict(strict=True)
    amount: int
    currency: Currency
    when: dt.date
    order: uuid.UUID


@so.tool
async def refund(r: Refund) -> str:
    """Refund."""
    return f"refunded {r.amount} {r.currency.value} on {r.when} for {r.order}"


@so.tool(approval=so.always())
async def book(
    day: Annotated[dt.date, Strict()], slot: Annotated[tuple[int, int], Strict()]
) -> str:
    """Book a slot."""
    return f"booked {day} {slot}"


GOOD = {"amount": 5, "currency": "EUR", "when": "2024-05-01", "order": ORDER}


async def _results(tmp_path: Path, tool: so.Tool, *inputs: dict[str, Any]) -> list[Any]:
    """What the model read of calls of `tool` with `inputs`, each approved as proposed."""
    seen = Capture(reply("done"))
    calls = [so.ToolCall(id=f"c{i}", name=tool.name, input=given) for i, given in enumerate(inputs)]
    agent = scripted_agent("a", [call_tools(*calls), seen], tools=[tool])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        if r.pending:
            approve = [so.Decision(id=p.id, approved=True) for p in r.pending]
            r = await rt.generate(session_id=r.session_id, approvals=approve, auth=ALICE)
        assert r.status == "completed", r
    return [(result.is_error, result.content) for result in tool_results(seen.last)]


async def test_a_strict_models_json_input_runs(tmp_path: Path) -> None:
    """What the schema tells the model to send: an enum's value, a date and a UUID as text."""
    [(failed, content)] = await _results(tmp_path, refund, {"r": GOOD})
    assert (failed, content) == (False, f"refunded 5 EUR on 2024-05-01 for {ORDER}")


async def test_a_strict_model_still_refuses_what_json_does_not_give(tmp_path: Path) -> None:
    """`"5"` for an int, as JSON's strict mode refuses it: the strictness asked for stays."""
    [(failed, content)] = await _results(tmp_path, refund, {"r": {**GOOD, "amount": "5"}})
    assert failed and content["details"][0]["loc"] == ["r", "amount"], content


async def test_strict_fields_of_a_gated_call_are_asked_and_run(tmp_path: Path) -> None:
    """A form validated again (what a reviewer is shown, what the approval binds) is JSON too."""
    [(failed, content)] = await _results(tmp_path, book, {"day": "2024-05-01", "slot": [9, 10]})
    assert (failed, content) == (False, "booked 2024-05-01 (9, 10)")


async def test_an_edit_of_strict_fields_is_taken(tmp_path: Path) -> None:
    seen = Capture(reply("done"))
    proposal = call_tools(
        so.ToolCall(id="c1", name="book", input={"day": "2024-05-01", "slot": [9, 10]})
    )
    agent = scripted_agent("a", [proposal, seen], tools=[book])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        [req] = r.pending
        edit = {"day": "2024-05-02", "slot": [11, 12]}
        answer = so.Decision(id=req.id, approved=True, edited_input=edit)
        r = await rt.generate(session_id=r.session_id, approvals=[answer], auth=ALICE)
        assert r.status == "completed", r
    [result] = tool_results(seen.last)
    assert result.content["result"] == "booked 2024-05-02 (11, 12)"


def test_what_json_cannot_carry_is_validated_as_before() -> None:
    """A lone surrogate, or an integer of more digits than JSON reads back, is validated as
    Python; NaN is still named as no finite number."""

    def take(text: str, n: int, x: float = 0.0) -> str:
        """Take."""
        return text

    tool = so.tool(take)
    big = 10**5000
    validated = tool.validate({"text": "\ud800", "n": big})
    assert (validated.text, validated.n) == ("\ud800", big)  # type: ignore[attr-defined]
    with pytest.raises(ValidationError) as raised:
        tool.validate({"text": "a", "n": 1, "x": float("nan")})
    assert raised.value.errors()[0]["type"] == "finite_number"


@so.tool
async def lookup(
    order: str | uuid.UUID,
    path: Path | str,
    body: bytes | str,
    amount: Decimal | str,
    parts: list[bytes | str],
) -> str:
    """Look up."""
    return " ".join(type(v).__name__ for v in (order, path, body, amount, *parts))


async def test_a_lax_tool_gets_what_it_got_before(tmp_path: Path) -> None:
    """Validated as Python first: JSON mode's smart union took the typed member over `str` for
    text (a UUID, a `PosixPath`, bytes, a `Decimal`), and a body testing `isinstance(x, str)`
    broke."""
    given = {"order": ORDER, "path": "/tmp/x", "body": "hi", "amount": "1.5", "parts": ["a"]}
    [(failed, content)] = await _results(tmp_path, lookup, given)
    assert (failed, content) == (False, "str str str str str")


def test_a_validator_of_a_lax_tool_reads_python_mode() -> None:
    modes: list[str] = []

    def noted(value: str, info: ValidationInfo) -> str:
        modes.append(info.mode)
        return value

    def take(text: Annotated[str, AfterValidator(noted)]) -> str:
        """Take."""
        return text

    tool = so.tool(take)
    tool.validate({"text": "a"})
    tool.shown_form(tool.validate({"text": "b"}))  # its form validated again
    assert modes == ["python"] * 3


class _Line(BaseModel):
    sku: str


def test_input_both_modes_refuse_is_told_as_python_tells_it() -> None:
    """What the model read before, for a lax tool; a strict model's JSON error alone, as its
    Python error also named what JSON gave right ("an instance of Currency")."""

    def order(line: _Line) -> str:
        """Order."""
        return ""

    with pytest.raises(ValidationError) as raised:
        so.tool(order).validate({"line": "abc"})
    [error] = raised.value.errors()
    assert error["msg"] == "Input should be a valid dictionary or instance of _Line"
    with pytest.raises(ValidationError) as raised:
        refund.validate({"r": {**GOOD, "amount": "5"}})
    assert [e["loc"] for e in raised.value.errors()] == [("r", "amount")]


def test_input_a_lax_tool_refuses_is_validated_once() -> None:
    """Refused as Python, a lax tool's input was validated again as JSON, which takes nothing
    Python refuses: its validators ran twice (an audit one recorded the call twice)."""
    seen: list[str] = []

    def audit(value: str) -> str:
        seen.append(value)
        return value

    def refund(order_id: Annotated[str, AfterValidator(audit)], amount: int) -> str:
        """Refund."""
        return order_id

    tool = so.tool(refund)
    tool.validate({"order_id": "A1", "amount": 5})
    assert seen == ["A1"]
    seen.clear()
    with pytest.raises(ValidationError) as raised:
        tool.validate({"order_id": "A1", "amount": "lots"})
    assert seen == ["A1"]  # once, not twice
    assert [e["type"] for e in raised.value.errors()] == ["int_parsing"]


def test_json_schema_extra_strict_asks_no_strictness() -> None:
    """A field's `json_schema_extra={"strict": True}`, text for the JSON schema alone, made a
    tool count as strict: its input validated again as JSON, its JSON error told."""
    from signoff._input_schema import asks_strict

    class Note(BaseModel):
        n: int = Field(json_schema_extra={"strict": True})

    def note(note: Note) -> str:
        """Note."""
        return ""

    assert not asks_strict(so.tool(note).input_model.__pydantic_core_schema__)
    assert asks_strict(Refund.__pydantic_core_schema__)  # a strict one still is


def test_a_default_holding_strict_is_no_strictness_and_instance_of_takes_json() -> None:
    """A default value `{"strict": True}` (data, not a schema) made a tool count as strict. And
    `InstanceOf[...]` takes only an instance from Python but builds one from JSON: a lax model
    holding one was validated as Python alone, refusing the object its schema asks the model
    for ("an instance of Point")."""
    from datetime import date

    from pydantic import InstanceOf

    from signoff._input_schema import asks_strict

    class Odd(BaseModel):
        n: dict[str, bool] = Field(default={"strict": True})

    assert not asks_strict(Odd.__pydantic_core_schema__)

    class Point(BaseModel):
        x: int

    def place(p: InstanceOf[Point], on: InstanceOf[date]) -> str:
        """Place."""
        return ""

    made = so.tool(place)
    got = made.validate({"p": {"x": 1}, "on": "2024-01-02"})
    assert (got.p, got.on) == (Point(x=1), date(2024, 1, 2))  # type: ignore[attr-defined]
