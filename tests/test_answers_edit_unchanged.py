"""An edit runs as the reviewer gave it or is refused (`_answers`, `edit_changed`): a validator
that changes a value (`min(v, 1000)`) or a nested model that ignores a misspelt key changed the
edit silently before, so the body ran with, and the record said, what no one approved."""

# No `from __future__ import annotations`: the tools' hints name types local to a test.
import re
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import AfterValidator, BaseModel

import signoff as so
from signoff.testing import call_tools, reply, scripted_agent, sqlite_runtime

ALICE = so.Principal(authenticator="test", principal_id="alice")


class _Addr(BaseModel):
    street: str
    unit: str | None = None


ran: list[Any] = []


@so.tool(approval=so.always())
async def refund(
    order: str,
    amount: Annotated[int, AfterValidator(lambda v: min(v, 1000))],
    ship_to: _Addr,
    tags: set[str] = set(),  # noqa: B006 - pydantic copies it
) -> str:
    """Refund."""
    ran.append((order, amount, ship_to, tags))
    return "ok"


async def _edit(tmp_path: Path, edit: dict[str, Any]) -> None:
    """Propose a refund, approve it with `edit`: raises what the answer raised (the request
    still pending)."""
    ran.clear()
    proposed = {"order": "1", "amount": 50, "ship_to": {"street": "Main"}}
    agent = scripted_agent(
        "a",
        [call_tools(so.ToolCall(id="c1", name="refund", input=proposed)), reply("done")],
        tools=[refund],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        [req] = r.pending
        answer = so.Decision(id=req.id, approved=True, edited_input=edit)
        try:
            done = await rt.generate(session_id=r.session_id, approvals=[answer], auth=ALICE)
        except so.InvalidAnswer:
            [still] = (await rt.state(r.session_id)).pending_requests()
            assert still.id == req.id
            raise
        assert done.status == "completed"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            {"order": "1", "amount": 5000, "ship_to": {"street": "Main"}},
            "the edit's 'amount' comes out as 1000, not as the edit gives it",
        ),
        (
            {"order": "1", "amount": 50, "ship_to": {"street": "Main", "appartment": "4B"}},
            "the edit's 'ship_to.appartment' is dropped (a key the tool does not take)",
        ),
    ],
    ids=["value-changed", "key-dropped"],
)
async def test_an_edit_validation_changes_is_refused(
    tmp_path: Path, edit: dict[str, Any], message: str
) -> None:
    with pytest.raises(so.InvalidAnswer, match=re.escape(message)):
        await _edit(tmp_path, edit)
    assert ran == []


async def test_an_edit_validation_keeps_runs(tmp_path: Path) -> None:
    """Keys the edit leaves out are the form's (`unit`) and a set's items may come in any
    order: neither is a change."""
    await _edit(
        tmp_path, {"order": "2", "amount": 70, "ship_to": {"street": "Elm"}, "tags": ["b", "a"]}
    )
    assert ran == [("2", 70, _Addr(street="Elm"), {"a", "b"})]


def test_edit_changed_names_the_first_change() -> None:
    from signoff._tool_json import edit_changed  # here: code without it fails this test alone

    form = {"a": [1, {"b": 2, "c": 3}], "d": True}
    assert edit_changed({"a": [1, {"b": 2}]}, form) is None
    assert edit_changed({"a": [1, {"b": 4}], "d": 1}, form) == (("a", 1, "b"), 2, False)
    assert edit_changed({"d": 1}, form) == (("d",), True, False)  # 1 is not true
    assert edit_changed({"a": [1]}, form) == (("a",), form["a"], False)
    assert edit_changed({"x": 1}, form) == (("x",), None, True)
