"""An edit posted back whole, computed fields and all, runs with its input (`edit_changed`): a
dashboard posts the form it showed, so a changed `order.qty` comes with the stale
`order.total`, which the model computes anew. Before, the edit was refused as changed by
validation ("the edit's 'order.total' comes out as 7.5"). And an edit by a field's own name
(`populate_by_name`) is told the name the form shows, not that the tool does not take it."""

# No `from __future__ import annotations`: the tools' hints name types local to a test.
import re
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import AfterValidator, BaseModel, ConfigDict, computed_field
from pydantic.alias_generators import to_camel

import signoff as so
from signoff.testing import call_tools, reply, scripted_agent, sqlite_runtime

ALICE = so.Principal(authenticator="test", principal_id="alice")


class _Order(BaseModel):
    qty: int
    price: float

    @computed_field  # type: ignore[prop-decorator]
    @property
    def total(self) -> float:
        return self.qty * self.price


ran: list[Any] = []


@so.tool(approval=so.always())
async def buy(order: _Order, extra: list[_Order] = []) -> str:  # noqa: B006 - pydantic copies it
    """Buy."""
    ran.append((order.qty, [o.qty for o in extra]))
    return "ok"


async def _edit(tmp_path: Path, change: Any) -> None:
    """Propose a purchase, approve it with `change` of the form shown."""
    ran.clear()
    proposed = {"order": {"qty": 1, "price": 2.5}, "extra": [{"qty": 1, "price": 1.0}]}
    agent = scripted_agent(
        "a",
        [call_tools(so.ToolCall(id="c1", name="buy", input=proposed)), reply("done")],
        tools=[buy],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        [req] = r.pending
        assert req.input["order"] == {"qty": 1, "price": 2.5, "total": 2.5}
        answer = so.Decision(id=req.id, approved=True, edited_input=change(req.input))
        done = await rt.generate(session_id=r.session_id, approvals=[answer], auth=ALICE)
        assert done.status == "completed"


async def test_an_edit_with_a_stale_computed_field_runs_with_its_input(tmp_path: Path) -> None:
    def change(form: dict[str, Any]) -> dict[str, Any]:
        extra = [{**form["extra"][0], "qty": 4}]
        return {"order": {**form["order"], "qty": 3}, "extra": extra}  # totals stale

    await _edit(tmp_path, change)
    assert ran == [(3, [4])]


async def test_an_edit_that_misspells_a_key_beside_a_computed_field_is_still_refused(
    tmp_path: Path,
) -> None:
    def change(form: dict[str, Any]) -> dict[str, Any]:
        return {**form, "order": {**form["order"], "qtty": 3}}

    message = "the edit's 'order.qtty' is dropped (a key the tool does not take)"
    with pytest.raises(so.InvalidAnswer, match=re.escape(message)):
        await _edit(tmp_path, change)
    assert ran == []


def test_edit_changed_skips_the_computed_fields_of_the_validated_edit() -> None:
    from signoff._tool_json import edit_changed

    validated = buy.validate({"order": {"qty": 3, "price": 2.5}})
    form = buy.approved_form(validated)
    given = {"order": {"qty": 3, "price": 2.5, "total": 2.5}}
    assert edit_changed(given, form) == (("order", "total"), 7.5, False)  # without the model
    assert edit_changed(given, form, validated) is None
    given = {"order": {"qty": 3, "price": 2.0, "total": 7.5}}
    assert edit_changed(given, form, validated) == (("order", "price"), 2.5, False)


def test_a_computed_field_shown_by_an_input_fields_key_leaves_that_key_checked() -> None:
    """A computed field aliased as a field of input (`qty`): skipping the computed field's key
    skipped the input's, and an edit capped from 999 to 10 ran as 10 unrefused."""
    from signoff._tool_json import edit_changed

    class Capped(BaseModel):
        qty: Annotated[int, AfterValidator(lambda v: min(v, 10))]

        @computed_field(alias="qty")  # type: ignore[prop-decorator]
        @property
        def shown_qty(self) -> int:
            return self.qty

    given = {"qty": 999}
    validated = Capped.model_validate(given)
    form = validated.model_dump(mode="json", by_alias=True)
    assert edit_changed(given, form, validated) == (("qty",), 10, False)


class _Person(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)
    first_name: str


async def test_an_edit_by_a_fields_own_name_is_told_the_name_shown(tmp_path: Path) -> None:
    """`populate_by_name` takes `first_name`, but the form shows `firstName`: the refusal said
    the key was one the tool does not take."""

    @so.tool(approval=so.always())
    async def greet(person: _Person) -> str:
        """Greet."""
        return person.first_name

    agent = scripted_agent(
        "a",
        [call_tools(so.ToolCall(id="c1", name="greet", input={"person": {"firstName": "al"}}))],
        tools=[greet],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        [req] = r.pending
        edit = {"person": {"first_name": "bo"}}
        answer = so.Decision(id=req.id, approved=True, edited_input=edit)
        message = "the edit's 'person.first_name' is greet's field shown as 'firstName' in the form"
        with pytest.raises(so.InvalidAnswer, match=re.escape(message)):
            await rt.generate(session_id=r.session_id, approvals=[answer], auth=ALICE)
