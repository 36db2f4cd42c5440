"""Validated input JSON cannot write, as a tool's validator may make it: a value inside itself is
invalid input the model reads, a key JSON cannot write leaves nothing to ask a reviewer about,
and a validator's own error is invalid input too. None of them fails the drive, which left the
turn running with no `turn.failed`, every retry failing the same way. Two keys JSON writes as
the same text are invalid input too: the reviewer was shown one, the body got both."""

# No `from __future__ import annotations`: the tools' hints name validators local to a test.
import math
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import AfterValidator, BaseModel, SecretStr, ValidationError

import signoff as so
from signoff._tool_json import holds_mask, keys_alike, unwritable
from signoff.testing import Capture, call_tools, reply, scripted_agent, sqlite_runtime, tool_results

ALICE = so.Principal(authenticator="test", principal_id="alice")


def _dict_in_itself(value: Any) -> dict[str, Any]:
    held: dict[str, Any] = {"a": 1}
    held["self"] = held
    return held


def _list_in_itself(value: Any) -> list[Any]:
    held: list[Any] = [1]
    held.append(held)
    return held


def _frozenset_key(value: Any) -> dict[Any, int]:
    return {frozenset({1}): 1}


def _keep(
    made: Any, ran: list[Any] | None = None, approval: so.ApprovalPolicy | None = None
) -> so.Tool:
    """A tool `keep(x)` whose `x` goes through the validator `made`, gated by `approval`
    (always asks by default); the body adds each `x` it gets to `ran`."""

    @so.tool(approval=approval or so.always())
    async def keep(x: Annotated[Any, AfterValidator(made)]) -> str:
        """Keep x."""
        if ran is not None:
            ran.append(x)
        return "kept"

    return keep


async def _one_call(tmp_path: Path, tool: so.Tool) -> tuple[so.ToolResultMessage, str]:
    """Run one call of `tool` (no tracer), then another message in the same session: the result
    the model read, and the status of the turn the second message ran."""
    seen = Capture(reply("sorry"))
    proposal = call_tools(so.ToolCall(id="c1", name=tool.name, input={"x": {}}))
    agent = scripted_agent("a", [proposal, seen, reply("again")], tools=[tool])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        assert (r.status, r.pending) == ("completed", [])
        again = await rt.generate(session_id=r.session_id, prompt="more", auth=ALICE)
    [result] = tool_results(seen.last)
    return result, again.status


async def _approved_after(
    tmp_path: Path, tool: so.Tool, given: dict[str, Any], turn: dict[str, bool]
) -> tuple[so.InputRequest, so.ToolResultMessage]:
    """Propose one call of `tool` with input `given`, turn its validator `turn["on"]` once it
    is asked, then approve it: the request asked, and the result the model read."""
    seen = Capture(reply("sorry"))
    proposal = call_tools(so.ToolCall(id="c1", name=tool.name, input=given))
    agent = scripted_agent("a", [proposal, seen], tools=[tool])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        [req] = r.pending
        turn["on"] = True
        approve = so.Decision(id=req.id, approved=True)
        done = await rt.generate(session_id=r.session_id, approvals=[approve], auth=ALICE)
        assert done.status == "completed"
    [result] = tool_results(seen.last)
    return req, result


@pytest.mark.parametrize("approval", [so.never(), so.always()], ids=["runs", "asks"])
@pytest.mark.parametrize("made", [_dict_in_itself, _list_in_itself])
async def test_input_a_validator_made_hold_itself_is_invalid_input(
    tmp_path: Path, made: Any, approval: so.ApprovalPolicy
) -> None:
    """A validator that makes a value inside itself: walking it for NaN recursed until
    `RecursionError` escaped the drive. It is invalid input the model reads; the turn goes on."""
    ran: list[Any] = []
    result, again = await _one_call(tmp_path, _keep(made, ran, approval))
    assert result.is_error and result.content["error"] == "invalid input"
    [detail] = result.content["details"]
    assert detail["type"] == "value_error" and detail["loc"][0] == "x"
    held = f"a {made(None).__class__.__name__} inside itself, which JSON cannot write"
    assert detail["msg"] == f"Value error, a validator of keep made the value {held}"
    assert again == "completed" and ran == []


def test_a_value_held_twice_is_no_cycle() -> None:
    shared = {"n": 1.5}
    assert unwritable({"a": shared, "b": [shared, shared]}) is None
    found = unwritable({"a": shared, "b": [shared, float("nan")]})
    assert found is not None and found[0] == ("b", 1) and math.isnan(found[1])


def test_the_first_non_finite_number_is_named_as_the_input_reads() -> None:
    assert unwritable({"a": [1.0, float("inf")], "b": float("nan")}) == (("a", 1), float("inf"))


# pydantic leaves the default out of the schema it shows the model, and warns.
@pytest.mark.timeout(5)  # it looped for ever walking the default
@pytest.mark.filterwarnings("ignore::pydantic.json_schema.PydanticJsonSchemaWarning")
def test_a_default_that_holds_itself_is_refused_when_the_tool_is_made() -> None:
    """It raised `RecursionError` as the tool was made, where other defaults JSON cannot hold
    are a `UsageError` naming the parameter."""
    held: dict[str, Any] = {}
    held["self"] = held

    def keep(x: Any = held) -> str:
        """Keep x."""
        return "kept"

    with pytest.raises(so.UsageError, match="a dict inside itself, which JSON cannot write"):
        so.tool(keep)


def test_a_validator_raising_runtime_error_is_a_validation_error() -> None:
    def boom(value: Any) -> Any:
        raise RuntimeError("boom")

    @so.tool
    async def keep(x: Annotated[Any, AfterValidator(boom)]) -> str:
        """Keep x."""
        return "kept"

    with pytest.raises(ValidationError, match="RuntimeError: boom"):
        keep.validate({"x": 1})


async def test_a_validator_raising_once_approved_fails_the_call_not_the_turn(
    tmp_path: Path,
) -> None:
    """A validator that raises `RuntimeError` when the approved call is validated again: the
    call ends as invalid input, as a tool body's error ends it, and the turn goes on."""
    state = {"on": False}

    def checked(value: Any) -> Any:
        if state["on"]:
            raise RuntimeError("boom")
        return value

    _, result = await _approved_after(tmp_path, _keep(checked), {"x": 1}, state)
    assert result.is_error and result.content["error"] == "invalid input"
    assert "RuntimeError: boom" in result.content["details"][0]["msg"]


async def test_a_call_whose_input_has_a_key_json_cannot_write_is_not_asked(
    tmp_path: Path,
) -> None:
    """A validator that makes a frozenset a key: showing the reviewer its JSON form raised
    pydantic's `TypeError` out of the drive. The call ends with an error the model reads."""
    result, again = await _one_call(tmp_path, _keep(_frozenset_key))
    assert result.is_error and "no JSON form to show a reviewer" in result.content["error"]
    assert "TypeError" in result.content["error"] and again == "completed"


async def test_an_approved_call_whose_input_has_no_json_form_now_does_not_run(
    tmp_path: Path,
) -> None:
    """A validator that makes a key JSON cannot write only once the call is approved: checking
    the input was the one approved raised `TypeError` out of the drive. It was not: the call
    does not run, and the turn goes on."""
    state = {"on": False}
    ran: list[Any] = []

    def later(value: Any) -> Any:
        return _frozenset_key(value) if state["on"] else value

    _, result = await _approved_after(tmp_path, _keep(later, ran), {"x": 1}, state)
    assert result.is_error and "other input than was approved" in result.content["error"]
    assert ran == []


class _Login(BaseModel):
    token: SecretStr
    more: Any = None


@pytest.mark.timeout(5)  # it looped for ever, its stack growing
def test_a_masked_secret_is_found_in_input_that_holds_itself() -> None:
    held: dict[str, Any] = {}
    held["self"] = held
    assert not holds_mask(_Login(token=SecretStr("s3cret"), more=held))
    assert holds_mask(_Login(token=SecretStr("**********"), more=held))


def _int_and_text(value: Any) -> dict[Any, str]:
    return {1: "a", "1": "b"}


def _bool_and_text(value: Any) -> list[Any]:
    return [{"ok": {True: "x", "true": "y"}}]


def _none_and_text(value: Any) -> dict[Any, int]:
    return {None: 1, "None": 2}  # pydantic writes None as "None" in a reviewer's form


_ALIKE = {
    _int_and_text: (("x", "1"), "1 and '1', both '1'"),
    _bool_and_text: (("x", 0, "ok", "true"), "True and 'true', both 'true'"),
    _none_and_text: (("x", "None"), "None and 'None', both 'None'"),
}


@pytest.mark.parametrize("approval", [so.never(), so.always()], ids=["runs", "asks"])
@pytest.mark.parametrize("made", list(_ALIKE))
async def test_input_with_two_keys_json_writes_alike_is_invalid_input(
    tmp_path: Path, made: Any, approval: so.ApprovalPolicy
) -> None:
    """A validator that makes a dict with keys `1` and `"1"`: the reviewer was asked about
    `{"1": "b"}` (the hash bound that) and the approved body ran with both keys; ungated, the
    body ran with input its JSON form does not hold. It is invalid input: nothing is asked and
    nothing runs, and the turn goes on."""
    ran: list[Any] = []
    result, again = await _one_call(tmp_path, _keep(made, ran, approval))
    assert result.is_error and result.content["error"] == "invalid input"
    [detail] = result.content["details"]
    loc, keys = _ALIKE[made]
    assert detail["type"] == "value_error" and tuple(detail["loc"]) == loc
    assert f"two keys that JSON writes as the same text ({keys})" in detail["msg"]
    assert detail["msg"].startswith("Value error, keep's input has a dict with")
    assert again == "completed" and ran == []


async def test_an_approved_call_whose_validator_makes_keys_alike_then_does_not_run(
    tmp_path: Path,
) -> None:
    """A validator that makes two keys alike only once the call is approved: the body would get
    a key the reviewer never saw. The call ends as invalid input and does not run."""
    state = {"on": False}
    ran: list[Any] = []

    def later(value: Any) -> Any:
        return _int_and_text(value) if state["on"] else value

    req, result = await _approved_after(tmp_path, _keep(later, ran), {"x": {"1": "b"}}, state)
    assert req.action is not None and req.action.input == {"x": {"1": "b"}}
    assert result.is_error and result.content["error"] == "invalid input"
    assert ran == []


async def test_keys_that_are_not_text_but_write_apart_are_valid(tmp_path: Path) -> None:
    """`dict[int, str]` takes `{"1": "a"}` as `{1: "a"}`: each key writes as its own text, so
    the reviewer's form (`{"1": "a"}`) validates again to what the body gets, and it runs."""
    ran: list[Any] = []

    @so.tool(approval=so.always())
    async def keep(x: dict[int, str]) -> str:
        """Keep x."""
        ran.append(x)
        return "kept"

    proposal = call_tools(so.ToolCall(id="c1", name="keep", input={"x": {"1": "a", "2": "b"}}))
    agent = scripted_agent("a", [proposal, reply("done")], tools=[keep])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        [req] = r.pending
        assert req.action is not None and req.action.input == {"x": {"1": "a", "2": "b"}}
        approve = so.Decision(id=req.id, approved=True)
        done = await rt.generate(session_id=r.session_id, approvals=[approve], auth=ALICE)
        assert done.status == "completed"
    assert ran == [{1: "a", 2: "b"}]


def test_keys_alike_are_found_where_the_input_reads_them() -> None:
    shared = {"n": 1}
    assert keys_alike({"a": shared, "b": [shared, {1: 2.0, 1.5: 3}]}) is None
    found = keys_alike({"a": [{"x": 1}, ({2: "p", "2": "q"},)]})
    assert found == (("a", 1, 0, "2"), 2, "2", "2")
    # A key with no JSON form at all is left to the reviewer's form, which raises for it.
    assert keys_alike({frozenset({1}): 1, "1": 2}) is None


def test_a_default_with_keys_json_writes_alike_is_refused_when_the_tool_is_made() -> None:
    def keep(x: Any = {1: "a", "1": "b"}) -> str:  # noqa: B006
        """Keep x."""
        return "kept"

    with pytest.raises(so.UsageError, match="two keys that JSON writes as the same text"):
        so.tool(keep)
