"""What a question a tool asks (`ctx.ask`) shows of its call's input: the input the body got,
as an approval it asked for shows it (a secret masked, by the names the model is shown),
wherever the request is read; never the model's raw arguments."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import AfterValidator, Field, PlainSerializer, SecretStr

import signoff as so
from signoff.testing import (
    Capture,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    tool_results,
)

from ._cli import invoke
from .test_server_common import ALICE, auth, in_process

MASKED = {"user": "u", "password": "**********"}
_TICKETS = itertools.count()  # module level: tool hints are resolved in the module


def _login_agent(got: list[str], name: str = "vault") -> so.Agent:
    """An agent whose one call, `login`, asks a person before it uses the secret it was given."""

    @so.tool
    async def login(ctx: so.ToolContext, user: str, password: SecretStr) -> str:
        """Log in once a person says so."""
        answer = await ctx.ask("Log in now?", options=["yes", "no"])
        got.append(password.get_secret_value())
        return answer.value

    proposal = call("login", call_id="c1", user="u", password="hunter2")
    return scripted_agent(name, [call_tools(proposal), reply("done")], tools=[login])


async def test_a_question_shows_a_secret_of_its_call_masked(store_url: str) -> None:
    """The request a tool's question opens shows a `SecretStr` argument masked, as an approval of
    the same input does, in the result, `rt.pending()`, the audit trail and `GET /v1/requests`;
    the answered body still gets the secret whole."""
    got: list[str] = []
    async with so.Runtime([_login_agent(got)], store=store_url) as rt:
        r = await rt.generate("vault", prompt="go", auth=ALICE)
        [asked] = r.pending
        assert asked.kind == "question" and asked.input == MASKED, asked.input
        assert asked.action is not None
        assert asked.action.input_hash == so.Action.of("c1", "login", MASKED).input_hash
        [listed] = await rt.pending()
        assert listed.input == MASKED
        trail = await rt.audit(session_id=r.session_id)
        requested = [e for e in trail if e.type == "input.requested"]
        assert requested and "hunter2" not in repr(requested)
    async with in_process(store_url) as (_, c):
        response = await c.get("/v1/requests", headers=auth("alice-token"))
        [item] = response.json()["items"]
        assert item["action"]["input"] == MASKED and "hunter2" not in response.text
    async with so.Runtime([_login_agent(got)], store=store_url) as rt:
        answer = so.InputResponse(request_id=asked.id, option_id="yes")
        done = await rt.respond(r.session_id, [answer], principal=ALICE)
        assert done.status == "completed"
    assert got == ["hunter2"]


def test_signoff_pending_json_shows_a_questions_secret_masked(tmp_path: Path) -> None:
    """`signoff pending --json` lists a tool's question with its call's secret masked."""
    url = f"sqlite:///{tmp_path}/state.db"
    rt = so.Runtime([_login_agent([])], store=url)
    try:
        assert rt.generate_sync("vault", "go", auth=ALICE).status == "waiting"
    finally:
        rt.close_sync()
    result = invoke("pending", "--json", "--store", url)
    assert result.exit_code == 0, result.output
    [item] = json.loads(result.stdout)
    assert item["kind"] == "question" and item["action"]["input"] == MASKED
    assert "hunter2" not in result.stdout


async def test_a_subagents_question_is_mirrored_with_its_secret_masked(tmp_path: Path) -> None:
    """A child's question mirrored on its parent shows the child call's secret masked, on both."""
    parent = scripted_agent(
        "desk",
        [call_tools(call("vault", call_id="d1", message="log in")), reply("ok")],
        tools=[so.delegate("vault")],
    )
    async with sqlite_runtime(tmp_path, parent, _login_agent([])) as rt:
        r = await rt.generate("desk", prompt="go", auth=ALICE)
        [mirror] = r.pending
        assert mirror.source == "child" and mirror.child is not None
        assert mirror.input == MASKED, mirror.input
        child = await rt.store.get_request(mirror.child.request_id)
        assert child is not None and child.request.input == MASKED
        assert "hunter2" not in repr(await rt.pending())


@pytest.mark.parametrize("edit", [None, {"order_id": "1042", "amount": 50.0}], ids=["as", "edit"])
async def test_a_question_of_an_approved_call_shows_the_input_it_runs_with(
    tmp_path: Path, edit: dict[str, Any] | None
) -> None:
    """A gated call that asks once approved shows the input the body got, bound by the same hash
    as the approval: the validated input (`500.0`, not the model's `"500"`), or the edit."""

    @so.tool(approval=so.always())
    async def refund(ctx: so.ToolContext, order_id: str, amount: float) -> str:
        """Refund an order, then ask whether to tell the customer."""
        answer = await ctx.ask(f"Refunded {amount}: tell the customer?", options=["yes", "no"])
        return answer.value

    proposal = call("refund", call_id="c1", order_id="1042", amount="500")
    agent = scripted_agent("a", [call_tools(proposal), reply("ok")], tools=[refund])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        [approval] = r.pending
        assert approval.input == {"order_id": "1042", "amount": 500.0}
        decision = so.InputResponse(request_id=approval.id, option_id="approve", edited_input=edit)
        r = await rt.respond(r.session_id, [decision], principal=ALICE)
        [question] = r.pending
    assert question.kind == "question" and question.action is not None
    bound = approval.action if edit is None else so.Action.of("c1", "refund", edit)
    assert bound is not None
    assert question.input == bound.input, question.input
    assert question.action.input_hash == bound.input_hash


def _ticket() -> str:
    return f"t-{next(_TICKETS)}"


async def test_a_question_asked_on_a_replay_shows_the_input_the_first_run_got(
    tmp_path: Path,
) -> None:
    """A second question, asked when the body runs again in another process once the first is
    answered, shows the same input, value generated by a `default_factory` and all, under the
    same hash: the call's input as the body got it, not validated anew."""

    @so.tool
    async def onboard(
        ctx: so.ToolContext, name: str, ticket: Annotated[str, Field(default_factory=_ticket)]
    ) -> str:
        """Onboard a customer, asking about the plan and the gift wrap."""
        plan = await ctx.ask("Which plan?", options=["basic", "pro"])
        wrap = await ctx.ask("Gift wrap?", options=["yes", "no"])
        return f"{ticket}:{plan.value}:{wrap.value}"

    agent = scripted_agent(
        "a", [call_tools(call("onboard", call_id="c1", name="Ada")), reply("ok")], tools=[onboard]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        [first] = r.pending
    assert first.input["name"] == "Ada" and first.input["ticket"].startswith("t-")
    async with sqlite_runtime(tmp_path, agent) as rt:
        answer = so.InputResponse(request_id=first.id, option_id="pro")
        r = await rt.respond(r.session_id, [answer], principal=ALICE)
        [second] = r.pending
    assert second.id != first.id and second.question == "Gift wrap?"
    assert second.action == first.action


async def test_a_question_shows_input_as_its_serializer_shows_it(tmp_path: Path) -> None:
    """Input whose JSON form shows a value otherwise than the tool gets it (a serializer hiding
    it) is shown by that form, as the JSON form of any input: not raw, the value in clear."""

    @so.tool
    async def unlock(
        ctx: so.ToolContext, pin: Annotated[str, PlainSerializer(lambda v: "hidden")]
    ) -> str:
        """Unlock the door once a person says so."""
        answer = await ctx.ask("Unlock?", options=["yes", "no"])
        return answer.value

    agent = scripted_agent(
        "a", [call_tools(call("unlock", call_id="c1", pin="8351")), reply("ok")], tools=[unlock]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        [asked] = r.pending
    assert asked.input == {"pin": "hidden"}, asked.input


class _Order:
    """What a validator may make of input: an object with no JSON form."""

    def __init__(self, ref: str) -> None:
        self.ref = ref


# What pydantic warns of, dumping the object in Python mode, is only a warning outside the tests.
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")
async def test_a_question_whose_input_has_no_json_form_masks_it_whole(tmp_path: Path) -> None:
    """Input a validator made an object with no JSON form has nothing to show: the question is
    asked all the same, its input masked whole rather than shown as the model gave it, and the
    body goes on once answered."""

    @so.tool
    async def refund(ctx: so.ToolContext, order: Annotated[str, AfterValidator(_Order)]) -> str:
        """Refund an order once a person says so."""
        answer = await ctx.ask("Refund it?", options=["yes", "no"])
        return f"{order.ref}:{answer.value}"  # type: ignore[attr-defined]

    seen = Capture(reply("ok"))
    agent = scripted_agent(
        "a", [call_tools(call("refund", call_id="c1", order="7")), seen], tools=[refund]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        [asked] = r.pending
        assert asked.input == "**********", asked.input
        assert asked.action == so.Action.of("c1", "refund", "**********")
        answer = so.InputResponse(request_id=asked.id, option_id="yes")
        done = await rt.respond(r.session_id, [answer], principal=ALICE)
        assert done.status == "completed"
    assert [m.content for m in tool_results(seen.last)] == ["7:yes"]


async def test_a_question_shows_a_lazy_input_and_the_body_still_reads_it_whole(
    tmp_path: Path,
) -> None:
    """An `Iterable` parameter (an iterator once validated) is shown by its items, validated
    anew, without using up the iterator the body reads."""

    @so.tool
    async def tally(ctx: so.ToolContext, items: Iterable[int]) -> int:
        """Sum the items once a person says so."""
        answer = await ctx.ask("Sum them?", options=["yes", "no"])
        assert answer.value == "yes"
        return sum(items)

    seen = Capture(reply("ok"))
    proposal = call_tools(call("tally", call_id="c1", items=[1, 2, 3]))
    agent = scripted_agent("a", [proposal, seen], tools=[tally])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        [asked] = r.pending
        assert asked.input == {"items": [1, 2, 3]}, asked.input
        answer = so.InputResponse(request_id=asked.id, option_id="yes")
        done = await rt.respond(r.session_id, [answer], principal=ALICE)
        assert done.status == "completed"
    assert [m.content for m in tool_results(seen.last)] == [6]
