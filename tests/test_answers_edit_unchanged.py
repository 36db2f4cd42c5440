"""An edit runs as the reviewer gave it or is refused (`_answers`, `edit_changed`): a validator
that changes a value (`min(v, 1000)`) or a nested model that ignores a misspelt key changed the
edit silently before, so the body ran with, and the record said, what no one approved."""

# No `from __future__ import annotations`: the tools' hints name types local to a test.
import re
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import AfterValidator, BaseModel, RootModel

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


@so.tool(approval=so.always())
async def notify(
    order_ids: Annotated[list[int], AfterValidator(sorted)],
    groups: dict[str, frozenset[int]] = {},  # noqa: B006 - pydantic copies it
) -> str:
    """Notify."""
    ran.append((order_ids, groups))
    return "ok"


async def _notify(tmp_path: Path, edit: dict[str, Any]) -> None:
    """Propose a notification, approve it with `edit`: raises what the answer raised."""
    ran.clear()
    proposed = {"order_ids": [1]}
    agent = scripted_agent(
        "a",
        [call_tools(so.ToolCall(id="c1", name="notify", input=proposed)), reply("done")],
        tools=[notify],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        [req] = r.pending
        answer = so.Decision(id=req.id, approved=True, edited_input=edit)
        assert (
            await rt.generate(session_id=r.session_id, approvals=[answer], auth=ALICE)
        ).status == "completed"


@pytest.mark.parametrize(("edit", "first"), [([3, 1, 2], 1), ([10, 9], 9)])
async def test_a_list_a_validator_reorders_is_refused(
    tmp_path: Path, edit: list[int], first: int
) -> None:
    """A `list[int]` its validator sorts: `[3, 1, 2]` ran as `[1, 2, 3]`, taken for a set's
    items in JSON text's order, where `[10, 9]` (whose numbers' order is not that) was refused.
    A list's order is its own: both are refused."""
    changed = f"the edit's 'order_ids.0' comes out as {first}, not as the edit gives it"
    with pytest.raises(so.InvalidAnswer, match=re.escape(changed)):
        await _notify(tmp_path, {"order_ids": edit})
    assert ran == []


async def test_a_sets_items_in_a_dict_may_come_in_any_order(tmp_path: Path) -> None:
    await _notify(tmp_path, {"order_ids": [2, 7], "groups": {"vip": [3, 1, 2], "new": []}})
    assert ran == [([2, 7], {"vip": frozenset({1, 2, 3}), "new": frozenset()})]


def test_edit_changed_takes_a_sorted_list_for_a_sets_items_only() -> None:
    from signoff._tool_json import edit_changed

    class Input(BaseModel):
        ids: list[int]
        tags: set[int]

    validated = Input(ids=[1, 2, 3], tags={1, 2, 3})
    form = {"ids": [1, 2, 3], "tags": [1, 2, 3]}
    assert edit_changed({"ids": [1, 2, 3], "tags": [3, 1, 2]}, form, validated) is None
    assert edit_changed({"ids": [3, 1, 2], "tags": [1, 2, 3]}, form, validated) == (
        ("ids", 0),
        1,
        False,
    )


class _Tags(RootModel[set[int]]):
    pass


class _Kind(Enum):
    A = "a"


def test_edit_changed_finds_the_value_under_keys_that_are_not_text() -> None:
    """A list its validator sorts under a dict keyed by numbers or an Enum (the JSON form's key
    `"1"` holds the value of key `1`) is compared item by item, as under text keys: before,
    nothing was found there, and the list was taken for a set's items (it ran sorted)."""
    from signoff._tool_json import edit_changed

    class Input(BaseModel):
        by_number: dict[int, list[int]]
        by_kind: dict[_Kind, list[int]]

    validated = Input(by_number={1: [1, 2, 3]}, by_kind={_Kind.A: [1, 2, 3]})
    form = {"by_number": {"1": [1, 2, 3]}, "by_kind": {"a": [1, 2, 3]}}
    assert edit_changed({"by_number": {"1": [3, 1, 2]}}, form, validated) == (
        ("by_number", "1", 0),
        1,
        False,
    )
    assert edit_changed({"by_kind": {"a": [3, 1, 2]}}, form, validated) == (
        ("by_kind", "a", 0),
        1,
        False,
    )


def test_edit_changed_takes_a_sets_items_in_any_order_inside_a_root_model() -> None:
    """A set wrapped in a `RootModel`: its items may come in any order, as a plain set's."""
    from signoff._tool_json import edit_changed

    class Input(BaseModel):
        tags: _Tags

    validated = Input(tags=_Tags({1, 2, 3}))
    assert edit_changed({"tags": [3, 1, 2]}, {"tags": [1, 2, 3]}, validated) is None


@so.tool(approval=so.always())
async def rebatch(batches: dict[int, Annotated[list[int], AfterValidator(sorted)]]) -> str:
    """Rebatch."""
    ran.append(batches)
    return "ok"


async def test_a_list_a_validator_sorts_under_a_number_key_is_refused(tmp_path: Path) -> None:
    ran.clear()
    agent = scripted_agent(
        "a",
        [call_tools(so.ToolCall(id="c1", name="rebatch", input={"batches": {"1": [5]}}))],
        tools=[rebatch],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        [req] = r.pending
        answer = so.Decision(id=req.id, approved=True, edited_input={"batches": {"1": [3, 1, 2]}})
        with pytest.raises(so.InvalidAnswer, match=re.escape("'batches.1.0' comes out as 1")):
            await rt.generate(session_id=r.session_id, approvals=[answer], auth=ALICE)
    assert ran == []
