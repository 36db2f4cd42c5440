"""What an approved call runs with (`_tool_calls`): the input the reviewer approved, as the tool
validated it when it was proposed, whatever the tool's parameter types do to a value on the way
(aliases, secrets, validators that change a value)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
from pydantic import AfterValidator, BaseModel, Field, SecretStr

import signoff as so
from signoff.testing import Capture, call_tools, reply, scripted_agent, sqlite_runtime, tool_results

from ._approved_elsewhere import approved_elsewhere

ALICE = so.Principal(authenticator="test", principal_id="alice")
_COUNTER = itertools.count()  # module level: tool hints are resolved in the module


async def _approve(
    tmp_path: Path, tool: so.Tool, proposed: dict[str, Any], edit: dict[str, Any] | None = None
) -> tuple[so.InputRequest, so.ToolResultMessage]:
    """Run one call of `tool` with `proposed` input, approve it (with `edit`, if any) and return
    the approval request and the result the model read."""
    seen = Capture(reply("ok"))
    proposal = call_tools(so.ToolCall(id="c1", name=tool.name, input=proposed))
    agent = scripted_agent("a", [proposal, seen], tools=[tool])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        assert r.status == "waiting"
        [req] = r.pending
        approve = so.Decision(id=req.id, approved=True, edited_input=edit)
        done = await rt.generate(session_id=r.session_id, approvals=[approve], auth=ALICE)
        assert done.status == "completed"
    [result] = tool_results(seen.last)
    return req, result


async def test_an_approved_call_to_a_tool_with_an_aliased_parameter_runs(tmp_path: Path) -> None:
    """A parameter with an alias is shown to the model (and the reviewer) by its alias: the
    approved call runs with it, rather than failing as invalid input once approved."""
    got: list[str] = []

    @so.tool(approval=so.always())
    async def refund(order: Annotated[str, Field(alias="orderId")]) -> str:
        """Refund an order."""
        got.append(order)
        return "refunded"

    req, result = await _approve(tmp_path, refund, {"orderId": "1042"})
    assert req.input == {"orderId": "1042"}
    assert not result.is_error, result.content
    assert got == ["1042"] and result.content == "refunded"


async def test_an_edited_input_with_an_aliased_parameter_runs(tmp_path: Path) -> None:
    """A reviewer's edit of an aliased parameter is recorded by the alias, and the call runs
    with the edited value."""
    got: list[str] = []

    @so.tool(approval=so.always())
    async def refund(order: Annotated[str, Field(alias="orderId")]) -> str:
        """Refund an order."""
        got.append(order)
        return "refunded"

    _, result = await _approve(tmp_path, refund, {"orderId": "1042"}, edit={"orderId": "7"})
    assert not result.is_error, result.content
    assert got == ["7"] and result.content["edited_input"] == {"orderId": "7"}


async def test_an_approved_call_gets_the_secret_the_model_passed_not_its_mask(
    tmp_path: Path,
) -> None:
    """A `SecretStr` parameter is masked for the reviewer, but the tool receives the value the
    model proposed, not the mask."""
    got: list[str] = []

    @so.tool(approval=so.always())
    async def login(token: SecretStr) -> str:
        """Log in."""
        got.append(token.get_secret_value())
        return "in"

    req, result = await _approve(tmp_path, login, {"token": "s3cret"})
    assert req.input == {"token": "**********"}
    assert got == ["s3cret"] and not result.is_error


async def test_an_approved_call_runs_with_the_value_the_reviewer_saw(tmp_path: Path) -> None:
    """A validator that changes a value runs once, as when the call was proposed: the tool gets
    the value the reviewer approved, not that value validated a second time."""
    got: list[int] = []

    @so.tool(approval=so.always())
    async def pay(cents: Annotated[int, AfterValidator(lambda v: v * 100)]) -> str:
        """Pay."""
        got.append(cents)
        return "paid"

    req, result = await _approve(tmp_path, pay, {"cents": 5})
    assert req.input == {"cents": 500}
    assert got == [500] and not result.is_error


async def test_an_approved_call_whose_input_validates_differently_now_does_not_run(
    tmp_path: Path,
) -> None:
    """When the proposed input no longer validates to what the reviewer approved (a validator
    that is not deterministic), the call fails closed: the tool does not run with input nobody
    approved."""
    got: list[str] = []

    @so.tool(approval=so.always())
    async def tag(label: Annotated[str, AfterValidator(lambda v: f"{v}-{next(_COUNTER)}")]) -> str:
        """Tag."""
        got.append(label)
        return "tagged"

    req, result = await _approve(tmp_path, tag, {"label": "x"})
    assert req.input["label"].startswith("x-")
    assert got == [] and result.is_error
    assert "approved" in result.content["error"]


async def test_an_edit_the_tool_would_not_run_with_is_refused(tmp_path: Path) -> None:
    """An edit whose validated form validates again to something else (here a validator that
    scales the value) is refused when answered, with the request still pending, rather than
    approved and then failed."""

    @so.tool(approval=so.always())
    async def pay(cents: Annotated[int, AfterValidator(lambda v: v * 100)]) -> str:
        """Pay."""
        return "paid"

    agent = scripted_agent(
        "a",
        [call_tools(so.ToolCall(id="c1", name="pay", input={"cents": 5})), reply("ok")],
        tools=[pay],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        [req] = r.pending
        edit = so.Decision(id=req.id, approved=True, edited_input={"cents": 7})
        with pytest.raises(so.InvalidAnswer, match="cannot be edited"):
            await rt.generate(session_id=r.session_id, approvals=[edit], auth=ALICE)
        [still] = (await rt.state(r.session_id)).pending_requests()
        assert still.id == req.id


async def test_an_edit_that_keeps_a_secret_s_mask_is_refused(tmp_path: Path) -> None:
    """An edit made from the form the reviewer saw keeps a secret's mask ('**********'), which
    validates again to itself: it is refused, not run with the mask as the secret."""
    got: list[str] = []

    @so.tool(approval=so.always())
    async def pay(token: SecretStr, cents: int) -> str:
        """Pay."""
        got.append(token.get_secret_value())
        return "paid"

    proposal = call_tools(so.ToolCall(id="c1", name="pay", input={"token": "s3", "cents": 5}))
    agent = scripted_agent("a", [proposal, reply("ok")], tools=[pay])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        [req] = r.pending
        assert req.input == {"token": "**********", "cents": 5}
        edit = so.Decision(id=req.id, approved=True, edited_input={**req.input, "cents": 7})
        with pytest.raises(so.InvalidAnswer, match="cannot be edited"):
            await rt.generate(session_id=r.session_id, approvals=[edit], auth=ALICE)
        [still] = (await rt.state(r.session_id)).pending_requests()
        assert still.id == req.id
    assert got == []


class _Order:
    """What a validator may turn a parameter into: an object with no JSON form."""

    def __init__(self, ref: str) -> None:
        self.ref = ref


# What pydantic warns of, dumping the object in Python mode, is only a warning outside the tests.
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")
async def test_a_call_whose_validated_input_has_no_json_form_is_not_asked_and_fails(
    tmp_path: Path,
) -> None:
    """A validator that turns input into an object with no JSON form leaves nothing to show a
    reviewer: the call ends with an error the model reads, instead of pydantic's serialization
    error escaping the drive and leaving the session running for good."""
    got: list[str] = []

    @so.tool(approval=so.always())
    async def refund(order: Annotated[str, AfterValidator(_Order)]) -> str:
        """Refund an order."""
        got.append(order.ref)  # type: ignore[attr-defined]
        return "refunded"

    seen = Capture(reply("sorry"))
    proposal = call_tools(so.ToolCall(id="c1", name="refund", input={"order": "7"}))
    agent = scripted_agent("a", [proposal, seen, reply("again")], tools=[refund])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert r.status == "completed" and r.pending == []
        [result] = tool_results(seen.last)
        assert result.is_error and "JSON" in result.content["error"]
        assert (await rt.generate(session_id=r.session_id, prompt="more")).status == "completed"
    assert got == []


def _order_for_obj(value: str) -> Any:
    return _Order(value) if value == "obj" else value


@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")
async def test_an_edit_with_no_json_form_is_refused(tmp_path: Path) -> None:
    """An edit a validator turns into an object with no JSON form cannot be recorded: it is
    refused as an invalid answer, not pydantic's serialization error."""

    @so.tool(approval=so.always())
    async def refund(order: Annotated[str, AfterValidator(_order_for_obj)]) -> str:
        """Refund an order."""
        return "refunded"

    proposal = call_tools(so.ToolCall(id="c1", name="refund", input={"order": "7"}))
    agent = scripted_agent("a", [proposal, reply("ok")], tools=[refund])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        [req] = r.pending
        edit = so.Decision(id=req.id, approved=True, edited_input={"order": "obj"})
        with pytest.raises(so.InvalidAnswer, match="no JSON form"):
            await rt.generate(session_id=r.session_id, approvals=[edit], auth=ALICE)
        [still] = (await rt.state(r.session_id)).pending_requests()
        assert still.id == req.id


async def test_an_approval_a_tool_asks_for_shows_its_validated_input(tmp_path: Path) -> None:
    """An approval raised from inside the tool (`ctx.request_approval`) shows the reviewer the
    input as the tool validated it, as a policy's approval does: a secret masked, not the
    model's raw arguments with the secret in clear."""

    @so.tool
    async def transfer(ctx: so.ToolContext, amount: float, token: SecretStr) -> str:
        """Transfer."""
        ctx.request_approval({"why": "large"})

    proposal = call_tools(
        so.ToolCall(id="c1", name="transfer", input={"amount": "180", "token": "s3cret"})
    )
    agent = scripted_agent("a", [proposal, reply("ok")], tools=[transfer])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        [req] = r.pending
        events = [e async for e in rt.events(r.session_id, follow=False)]
    assert req.source == "tool" and req.payload == {"why": "large"}
    assert req.input == {"amount": 180.0, "token": "**********"}
    assert "s3cret" not in str([e.data for e in events if e.type == "input.requested"])


@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")
async def test_an_approval_a_tool_asks_for_with_no_json_input_fails_the_call(
    tmp_path: Path,
) -> None:
    """A tool asking approval for input a validator made an object with no JSON form gets an
    error result; nothing is asked."""

    @so.tool
    async def refund(ctx: so.ToolContext, order: Annotated[str, AfterValidator(_Order)]) -> str:
        """Refund an order."""
        ctx.request_approval()

    seen = Capture(reply("sorry"))
    proposal = call_tools(so.ToolCall(id="c1", name="refund", input={"order": "7"}))
    agent = scripted_agent("a", [proposal, seen], tools=[refund])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert r.status == "completed" and r.pending == []
    [result] = tool_results(seen.last)
    assert result.is_error and "no JSON form" in result.content["error"]


async def test_a_call_approved_after_its_tool_gained_a_parameter_does_not_run(
    tmp_path: Path,
) -> None:
    """A new deploy whose tool has a parameter more (with a default) than when the call was
    asked would run it with input the reviewer never saw: it ends with an error instead."""
    got: list[str] = []

    async def refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    async def refund_v2(order_id: str, mode: str = "full") -> str:
        """Refund an order."""
        got.append(mode)
        return "refunded"

    proposal = call_tools(so.ToolCall(id="c1", name="refund", input={"order_id": "7"}))
    v1 = so.Tool(refund, approval=so.always())
    async with sqlite_runtime(tmp_path, scripted_agent("a", [proposal], tools=[v1])) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        [req] = r.pending
    seen = Capture(reply("ok"))
    v2 = so.Tool(refund_v2, name="refund", approval=so.always())
    agent = scripted_agent("a", [proposal, seen], tools=[v2])
    async with sqlite_runtime(tmp_path, agent) as rt:
        approve = so.Decision(id=req.id, approved=True)
        done = await rt.generate(session_id=r.session_id, approvals=[approve], auth=ALICE)
        assert done.status == "completed"
    [result] = tool_results(seen.last)
    assert got == [] and result.is_error
    assert "parameters changed" in result.content["error"]


@pytest.mark.parametrize("raised", [False, True], ids=["policy", "tool"])
async def test_a_response_policy_sees_the_input_the_tool_validated(
    tmp_path: Path, raised: bool
) -> None:
    """A response policy reads the call's input as the tool validated it when proposed: the
    secret itself and a scaled value scaled once, not the reviewer's JSON form validated
    again (the mask, the value scaled twice)."""
    seen: list[tuple[str, int]] = []

    def check(ctx: so.ResponseContext) -> Literal["allowed"]:
        given = ctx.request.tool_input
        seen.append((given.token.get_secret_value(), given.cents))
        return "allowed"

    async def pay(
        ctx: so.ToolContext, token: SecretStr, cents: Annotated[int, AfterValidator(_scaled)]
    ) -> str:
        """Pay."""
        if raised:
            ctx.request_approval()
        return "paid"

    request = None if raised else so.always()
    tool = so.Tool(pay, approval=so.ApprovalSpec(request, response=check))
    proposal = call_tools(so.ToolCall(id="c1", name="pay", input={"token": "s3", "cents": 5}))
    agent = scripted_agent("a", [proposal, reply("ok")], tools=[tool])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        [req] = r.pending
        await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=req.id, approved=True)], auth=ALICE
        )
    assert seen == [("s3", 500)]


def _scaled(value: int) -> int:
    return value * 100


class _Booking(BaseModel):
    sku: str
    ref: str = Field(default_factory=lambda: f"ref-{next(_COUNTER)}")


async def test_an_approved_call_with_a_generated_default_runs_with_the_value_approved(
    tmp_path: Path,
) -> None:
    """A value pydantic generates when the model leaves it out (a `default_factory`: an id, a
    timestamp) differs each time the model's input is validated: the approved call runs with
    the one the reviewer saw, and the secret the model gave, instead of never running."""
    got: list[tuple[_Booking, str]] = []

    @so.tool(approval=so.always())
    async def place(order: _Booking, token: SecretStr) -> str:
        """Place an order."""
        got.append((order, token.get_secret_value()))
        return "placed"

    req, result = await _approve(tmp_path, place, {"order": {"sku": "A1"}, "token": "s3"})
    assert not result.is_error, result.content
    [(order, token)] = got
    assert order.model_dump() == req.input["order"] and token == "s3"


def _new_token() -> SecretStr:
    return SecretStr(f"t{next(_COUNTER)}")


async def test_a_generated_secret_is_not_run_as_its_mask(tmp_path: Path) -> None:
    """A secret the model left out has only its mask in the approved form: the call does not
    run with the mask in its place (it fails, as any input no longer the one approved)."""
    got: list[str] = []

    @so.tool(approval=so.always())
    async def place(
        order: _Booking,
        token: Annotated[SecretStr, Field(default_factory=_new_token)],
    ) -> str:
        """Place an order."""
        got.append(token.get_secret_value())
        return "placed"

    req, result = await _approve(tmp_path, place, {"order": {"sku": "A1"}})
    assert req.input["token"] == "**********"
    assert got == [] and result.is_error and "approved" in result.content["error"]


async def test_an_approval_asked_before_the_approved_form_changed_still_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request asked by an earlier signoff, which bound the input as `model_dump(mode="json")`
    (by field names), runs once approved after the upgrade: for a tool with no alias or secret
    the form is the same (an int given for a float, keys in another order)."""
    got: list[tuple[float, dict[str, int]]] = []

    @so.tool(approval=so.always())
    async def pay(amount: float, split: dict[str, int]) -> str:
        """Pay."""
        got.append((amount, split))
        return "paid"

    seen = Capture(reply("ok"))
    proposed = {"split": {"b": 1, "a": 2}, "amount": 180}
    proposal = call_tools(so.ToolCall(id="c1", name="pay", input=proposed))
    agent = scripted_agent("a", [proposal, seen], tools=[pay])
    with monkeypatch.context() as old:
        old.setattr(so.Tool, "approved_form", lambda self, v: v.model_dump(mode="json"))
        async with sqlite_runtime(tmp_path, agent) as rt:
            r = await rt.generate("a", prompt="go", auth=ALICE)
            [req] = r.pending
    assert req.action is not None
    async with sqlite_runtime(tmp_path, agent) as rt:
        approve = so.Decision(id=req.id, approved=True, input_hash=req.action.input_hash)
        done = await rt.generate(session_id=r.session_id, approvals=[approve], auth=ALICE)
        assert done.status == "completed"
    [result] = tool_results(seen.last)
    assert not result.is_error, result.content
    assert got == [(180.0, {"b": 1, "a": 2})]


@so.tool(approval=so.always())
async def label(labels: set[str]) -> str:
    """Label."""
    return ",".join(sorted(labels))


LABELS = ["red", "green", "blue", "amber", "teal", "plum"]


def test_an_approved_call_with_a_set_runs_in_another_process(tmp_path: Path) -> None:
    """A set parameter is shown, and its approval bound, in a set order of its own: the order
    of a set of strings is another in each process (hash randomization), so an approval
    answered in another process (a worker, a server restarted since) never ran."""
    url = f"sqlite:///{tmp_path}/state.db"
    ran = approved_elsewhere(url, __name__, "label", {"labels": LABELS}, seeds=("1", "2"))
    assert ran == "ok " + ",".join(sorted(LABELS))
