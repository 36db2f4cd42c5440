"""The form a reviewer approves must show what the tool gets (`Tool.shown_form`, `unlike`): a
field left out of the input's JSON form (`exclude=True`) is refused when the tool is made, and a
call whose form, validated again, is other input (a serializer that masks a value) is not asked
but ends with an error result the model reads. Before, the reviewer approved a form without the
field, or with the mask, and the body ran with the value they never saw."""

# No `from __future__ import annotations`: the tools' hints name types local to a test.
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import AfterValidator, AliasChoices, BaseModel, Field, PlainSerializer, SecretStr

import signoff as so
from signoff.testing import Capture, call_tools, reply, scripted_agent, sqlite_runtime, tool_results

ALICE = so.Principal(authenticator="test", principal_id="alice")

Card = Annotated[str, PlainSerializer(lambda v: "****" + v[-4:], when_used="json")]


class _Order(BaseModel):
    id: str
    note: str = Field(default="", exclude=True)


def _pay_memo(to: str, memo: Annotated[str, Field(exclude=True)] = "") -> str:
    """Pay."""
    return to


def _pay_order(to: str, order: _Order | None = None) -> str:
    """Pay."""
    return to


def _pay_if(to: str, memo: Annotated[str, Field(exclude_if=lambda v: v == "")] = "") -> str:
    """Pay."""
    return to


@pytest.mark.parametrize(
    ("fn", "field"), [(_pay_memo, "memo"), (_pay_order, "note"), (_pay_if, "memo")]
)
def test_a_field_left_out_of_the_json_form_is_refused_when_the_tool_is_made(
    fn: Any, field: str
) -> None:
    """`exclude=True` (on a parameter, or on a field of a model in one) or `exclude_if`: the
    reviewer's form never shows the value the model gave, which the body got."""
    with pytest.raises(so.UsageError, match=f"field '{field}' is excluded from the input's JSON"):
        so.tool(fn, approval=so.always())


async def _proposed(
    tmp_path: Path, tool: so.Tool, proposed: dict[str, Any]
) -> tuple[list[so.InputRequest], so.ToolResultMessage | None]:
    """Run one call of `tool`: the requests it opened, and the result the model read if none."""
    seen = Capture(reply("sorry"))
    agent = scripted_agent(
        "a", [call_tools(so.ToolCall(id="c1", name=tool.name, input=proposed)), seen], tools=[tool]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        if r.pending:
            return r.pending, None
        assert r.status == "completed"
    [result] = tool_results(seen.last)
    return [], result


async def test_a_call_whose_form_masks_a_value_is_not_asked(tmp_path: Path) -> None:
    """A serializer shows "****1111" for the card: the reviewer would approve the mask and the
    body charge the whole number. The call ends with an error naming the field; nothing ran."""
    ran: list[Any] = []

    @so.tool(approval=so.always())
    async def charge(card: Card, amount: int) -> str:
        """Charge a card."""
        ran.append(card)
        return "ok"

    asked, result = await _proposed(tmp_path, charge, {"card": "4111111111111111", "amount": 5})
    assert asked == [] and result is not None and result.is_error
    error = result.content["error"]
    assert error.startswith("the input of charge cannot be shown to a reviewer as the tool")
    assert "shows 'card' otherwise than the tool gets it" in error
    assert ran == []


async def test_a_call_a_tool_asks_approval_for_whose_form_masks_a_value_fails(
    tmp_path: Path,
) -> None:
    """`ctx.request_approval` shows the input too: a masked one is not asked either."""

    @so.tool
    async def charge(ctx: so.ToolContext, card: Card) -> str:
        """Charge a card."""
        ctx.request_approval({"why": "large"})

    asked, result = await _proposed(tmp_path, charge, {"card": "4111111111111111"})
    assert asked == [] and result is not None and result.is_error
    assert "cannot be shown to a reviewer as the tool got it" in result.content["error"]


async def test_a_body_that_changes_its_input_then_asks_shows_what_the_model_sent(
    tmp_path: Path,
) -> None:
    """The request's input was the JSON form of the objects the body was handed, taken when it
    asked: a body that emptied and refilled its list (or set a key of its dict) showed the
    reviewer, and bound the approval to, input the model never sent, while the call's record
    kept what it sent."""

    @so.tool
    async def delete_files(ctx: so.ToolContext, paths: list[str], opts: dict[str, bool]) -> str:
        """Delete files."""
        paths.clear()  # a body that works through its list
        paths.append("/etc/passwd")
        opts.setdefault("force", True)
        ctx.request_approval({"why": "deleting"})

    sent = {"paths": ["/tmp/a"], "opts": {}}
    seen = Capture(reply("done"))
    agent = scripted_agent(
        "a",
        [call_tools(so.ToolCall(id="c1", name="delete_files", input=sent)), seen],
        tools=[delete_files],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        [req] = r.pending
        assert req.input == sent
        assert req.action == so.Action.of("c1", "delete_files", sent)  # its hash binds that
        state = await rt.state(r.session_id)
        assert state.turn is not None and state.turn.calls["c1"].input == sent
        approve = so.Decision(id=req.id, approved=True, input_hash=req.action.input_hash)
        done = await rt.generate(session_id=r.session_id, approvals=[approve], auth=ALICE)
        assert done.status == "completed"
    [result] = tool_results(seen.last)
    assert not result.is_error and result.content["approved"] is True, result


async def test_a_body_that_changes_its_input_then_asks_still_shows_no_mask(
    tmp_path: Path,
) -> None:
    """The form the reviewer is shown is what the body got, checked as any: a card the form
    masks is not asked for, whatever else the body changed in place."""

    @so.tool
    async def charge(ctx: so.ToolContext, card: Card, tags: list[str]) -> str:
        """Charge a card."""
        tags.append("seen")
        ctx.request_approval({"why": "large"})

    asked, result = await _proposed(tmp_path, charge, {"card": "4111111111111111", "tags": []})
    assert asked == [] and result is not None and result.is_error
    assert "shows 'card' otherwise than the tool gets it" in result.content["error"]


async def test_a_call_whose_form_is_its_value_is_asked_and_runs(tmp_path: Path) -> None:
    """What stays: a serializer's output that validates back to the value (the mask given as
    the card), a secret (masked by design) and a validator that changes a value each time it
    runs (the form holds the value the body gets) are asked, and run when approved."""
    ran: list[Any] = []

    @so.tool(approval=so.always())
    async def charge(
        card: Card,
        token: SecretStr,
        cents: Annotated[int, AfterValidator(lambda v: v * 100)],
        tags: set[str],
    ) -> str:
        """Charge a card."""
        ran.append((card, token.get_secret_value(), cents, tags))
        return "ok"

    proposed = {"card": "****1111", "token": "s3", "cents": 5, "tags": ["b", "a"]}
    seen = Capture(reply("done"))
    agent = scripted_agent(
        "a", [call_tools(so.ToolCall(id="c1", name="charge", input=proposed)), seen], tools=[charge]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        [req] = r.pending
        assert req.input == {
            "card": "****1111",
            "token": "**********",
            "cents": 500,
            "tags": ["a", "b"],
        }
        approve = so.Decision(id=req.id, approved=True)
        assert (
            await rt.generate(session_id=r.session_id, approvals=[approve], auth=ALICE)
        ).status == "completed"
    assert ran == [("****1111", "s3", 500, {"a", "b"})]


async def test_an_edit_whose_form_masks_the_value_given_is_refused(tmp_path: Path) -> None:
    """A reviewer edits the card to a whole number: its recorded form holds the mask, and the
    call would run with the mask, not the card they typed. Refused; the request stays."""
    ran: list[Any] = []

    @so.tool(approval=so.always())
    async def charge(card: Card, amount: int) -> str:
        """Charge a card."""
        ran.append(card)
        return "ok"

    proposal = call_tools(
        so.ToolCall(id="c1", name="charge", input={"card": "****1111", "amount": 5})
    )
    agent = scripted_agent("a", [proposal, reply("ok")], tools=[charge])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        [req] = r.pending
        edit = {"card": "4111111111111111", "amount": 5}
        answer = so.Decision(id=req.id, approved=True, edited_input=edit)
        with pytest.raises(so.InvalidAnswer, match="shows 'card' otherwise than the edit gives"):
            await rt.generate(session_id=r.session_id, approvals=[answer], auth=ALICE)
        [still] = (await rt.state(r.session_id)).pending_requests()
        assert still.id == req.id
    assert ran == []


async def test_auto_does_not_clear_a_call_whose_form_masks_a_value(tmp_path: Path) -> None:
    """`auto()` reviewed the masked form and cleared it: the body charged a card no reviewer
    saw. It asks a person without calling its model, and the call is then not asked either."""
    reviewer = so.models.Scripted(
        [so.ModelResponse(text=json.dumps({"verdict": "clear", "reason": "fine"}))]
    )
    ran: list[Any] = []

    @so.tool(approval=so.auto(reviewer))
    async def charge(card: Card, amount: int) -> str:
        """Charge a card."""
        ran.append(card)
        return "ok"

    asked, result = await _proposed(tmp_path, charge, {"card": "4111111111111111", "amount": 5})
    assert asked == [] and result is not None and result.is_error
    assert "cannot be shown to a reviewer" in result.content["error"]
    assert ran == []


def test_unlike_names_where_the_form_does_not_show_the_value() -> None:
    from signoff._tool_json import unlike  # here: code without it fails this test alone

    class Inner(BaseModel):
        a: int
        b: str = Field(default="", exclude=True)

    class Outer(BaseModel):
        items: list[Inner]
        key: SecretStr

    one = Outer(items=[Inner(a=1), Inner(a=2, b="x")], key=SecretStr("k"))
    form = one.model_dump(mode="json")
    again = Outer.model_validate(form)
    assert unlike(one, again, form) == (("items", 1, "b"), True)
    same = Outer(items=[Inner(a=1)], key=SecretStr("k"))
    form = same.model_dump(mode="json")
    assert unlike(same, Outer.model_validate(form), form) is None  # the mask is alike
    assert unlike(same, Outer(items=[Inner(a=1)], key=SecretStr("other")), form) == (
        ("key",),
        False,
    )


class _Mail(BaseModel):
    to: str = Field(validation_alias="recipient")


def _send_valias(to: Annotated[str, Field(validation_alias="recipient")]) -> str:
    """Send."""
    return to


def _send_choices(to: Annotated[str, Field(validation_alias=AliasChoices("to", "rcpt"))]) -> str:
    """Send."""
    return to


def _send_salias(to: Annotated[str, Field(serialization_alias="recipient")]) -> str:
    """Send."""
    return to


def _send_nested(mail: _Mail) -> str:
    """Send."""
    return mail.to


@pytest.mark.parametrize(
    ("fn", "read", "shown"),
    [
        (_send_valias, "'recipient'", "'to'"),
        (_send_choices, "[['to'], ['rcpt']]", "'to'"),
        (_send_salias, "'to'", "'recipient'"),
        (_send_nested, "'recipient'", "'to'"),
    ],
)
def test_a_field_read_by_one_name_and_shown_by_another_is_refused_when_the_tool_is_made(
    fn: Any, read: str, shown: str
) -> None:
    """The model was shown `recipient`, the reviewer `to`: an edit in the form shown was
    always refused, and with a generated value the approved call never ran."""
    message = f"field 'to' is read from the model as {read} but shown to a reviewer as {shown}"
    with pytest.raises(so.UsageError, match=re.escape(message)):
        so.tool(fn, approval=so.always())


async def test_a_field_with_one_alias_is_shown_by_it_and_runs(tmp_path: Path) -> None:
    """`Field(alias=...)` names the field alike both ways: asked by it, edited by it, run."""
    ran: list[Any] = []

    @so.tool(approval=so.always())
    async def send(
        to: Annotated[str, Field(alias="recipient")],
        ref: str = Field(default_factory=lambda: "r-1"),
    ) -> str:
        """Send."""
        ran.append((to, ref))
        return "ok"

    agent = scripted_agent(
        "a",
        [call_tools(so.ToolCall(id="c1", name="send", input={"recipient": "al"})), reply("ok")],
        tools=[send],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        [req] = r.pending
        assert req.input == {"recipient": "al", "ref": "r-1"}
        edit = so.Decision(id=req.id, approved=True, edited_input={**req.input, "recipient": "bo"})
        done = await rt.generate(session_id=r.session_id, approvals=[edit], auth=ALICE)
        assert done.status == "completed"
    assert ran == [("bo", "r-1")]


class _Rows(BaseModel):
    rows: Iterable[int]


@pytest.mark.parametrize("nested", [False, True], ids=["parameter", "nested"])
async def test_an_ungated_tool_gets_its_lazy_iterable_whole(tmp_path: Path, nested: bool) -> None:
    """An `Iterable[...]` parameter validates to an iterator, which a JSON form taken before the
    body ran (to show an approval it might ask for, or to keep what validation filled in) used
    up: the body summed nothing, with no error."""
    got: list[list[int]] = []

    @so.tool
    async def total(items: Iterable[int]) -> int:
        """Sum."""
        got.append(list(items))
        return sum(got[-1])

    @so.tool(name="total")
    async def total_rows(batch: _Rows) -> int:
        """Sum."""
        got.append(list(batch.rows))
        return sum(got[-1])

    given: dict[str, Any] = {"batch": {"rows": [1, 2, 3]}} if nested else {"items": [1, 2, 3]}
    tool = total_rows if nested else total
    seen = Capture(reply("done"))
    call = so.ToolCall(id="c1", name="total", input=given)
    agent = scripted_agent("a", [call_tools(call), seen], tools=[tool])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
    assert r.status == "completed"
    assert got == [[1, 2, 3]]
    assert [m.content for m in tool_results(seen.last)] == [6]
