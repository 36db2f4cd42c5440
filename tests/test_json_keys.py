"""Object keys in what signoff stores as JSON: JSON keys are text, so a value whose keys are
not is either written as its JSON form before the run sees it (what tools and steps return) or
refused by name where it enters (answers, model responses, principals); two keys that would
write as the same text are always refused, in plain dicts and in the dicts of models and
dataclasses. `None` is written `"null"`, as `json.dumps` writes it. The live run and a resumed
one see the same value."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from pydantic import BaseModel, field_serializer

import signoff as so
from signoff._payloads import encode
from signoff._tool_json import jsonable
from signoff.testing import call, call_tools, reply, scripted_agent, store_contents

CLASH: dict[Any, str] = {1: "a", "1": "b"}


def test_jsonable_refuses_keys_that_write_as_the_same_text() -> None:
    for value in (CLASH, [{"x": CLASH}], ({True: 1, "true": 2},), {"o": {None: 1, "null": 2}}):
        with pytest.raises(so.UsageError, match="two keys that JSON writes as the same text"):
            jsonable(value)
    assert jsonable({1: "a", 2: {3: "b"}}) == {"1": "a", "2": {"3": "b"}}
    assert jsonable({"1": "a", "x": [{"2": 1}]}) == {"1": "a", "x": [{"2": 1}]}


def test_jsonable_writes_keys_as_json_does() -> None:
    """pydantic wrote `None` as `"None"` (and NaN as `"nan"`), where `json.dumps` (and so an
    answer recorded, or any JSON reader) writes `"null"`: a `None` key and a `"None"` one were
    refused as a clash, and a `"null"` one was not."""
    keys = {None: 1, 7: 2, 1.5: 3, False: 4, float("nan"): 5, float("inf"): 6, -float("inf"): 7}
    value = {"plain": keys, "nested": [({None: {None: "x"}},)]}
    assert jsonable(value) == json.loads(json.dumps(value))
    assert jsonable({None: 1, "None": 2}) == {"null": 1, "None": 2}
    assert jsonable(Box(data={None: [Pair(left={None: 1}, right={})]})) == {
        "data": {"null": [{"left": {"null": 1}, "right": {}}]}
    }


class Box(BaseModel):
    data: dict[Any, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class Pair:
    left: dict[Any, Any]
    right: dict[Any, Any]


@pytest.mark.parametrize(
    "value",
    [
        Box(data=CLASH),
        Pair(left={}, right=CLASH),
        [{"x": Box(data={"deeper": Pair(left=CLASH, right={})})}],
        Box(data={None: 1, "null": 2}),
    ],
)
def test_jsonable_refuses_clashing_keys_inside_models_and_dataclasses(value: Any) -> None:
    """Only dicts reached through dicts, lists and tuples were checked: inside a model or a
    dataclass, `{1: "a", "1": "b"}` lost a key without a word."""
    with pytest.raises(so.UsageError, match="two keys that JSON writes as the same text"):
        jsonable(value)


class Looped(BaseModel):
    """A model whose field holds itself, which its serializer writes as text."""

    looped: Any
    data: dict[Any, Any]

    @field_serializer("looped")
    def _shown(self, value: Any) -> str:
        return "looped"


def test_a_model_field_its_serializer_writes_otherwise_may_hold_itself() -> None:
    """The keys of a model's fields are looked at where JSON has none of them too: what such
    a field holds is walked once each, not for ever."""
    looped: list[Any] = []
    looped.append(looped)
    assert jsonable(Looped(looped=looped, data={None: 1})) == {
        "looped": "looped",
        "data": {"null": 1},
    }
    with pytest.raises(so.UsageError, match="two keys that JSON writes as the same text"):
        jsonable(Looped(looped=looped, data=CLASH))


def test_a_value_with_no_json_form_is_a_usage_error() -> None:
    """A step that returned bytes that are not UTF-8 failed live with a `UnicodeDecodeError`
    but replayed as `StepFailed` (its arguments are no JSON): the same named error now."""
    for value in (b"\xff", range(3), {"x": object()}):
        with pytest.raises(so.UsageError, match="the value has no JSON form"):
            jsonable(value)
    looped: list[Any] = []
    looped.append(looped)
    with pytest.raises(so.UsageError, match="Circular reference"):
        jsonable(looped)


def test_a_request_body_with_a_key_that_is_not_text_is_refused_before_it_is_sent() -> None:
    with pytest.raises(so.InvalidAnswer, match="key 1 .int. is not text"):
        encode("/v1/sessions/s/approvals", {"decisions": [{"id": "r", "value": {1: "a"}}]})
    with pytest.raises(so.UsageError, match="key 1 .int. is not text"):
        encode("/v1/sessions", {"metadata": {"x": [CLASH]}})
    assert encode("/v1/sessions", {"a": {"1": [1]}}) == b'{"a": {"1": [1]}}'


async def test_a_tool_result_with_clashing_keys_is_the_calls_error(store_url: str) -> None:
    seen: list[Any] = []

    @so.tool
    async def lookup() -> Any:
        """Look up."""
        return CLASH

    def look(conversation: list[Any]) -> so.ModelResponse:
        seen.append(conversation[-1].content)
        return reply("done")

    agent = scripted_agent("a", [call_tools(call("lookup")), look], tools=[lookup])
    async with so.Runtime([agent], store=store_url) as rt:
        done = await rt.generate("a", prompt="go")
        assert done.status == "completed"
        events = [e async for e in rt.events(done.session_id, follow=False)]
    ended = next(e.data for e in events if e.type == "tool.completed")
    assert ended["status"] == "error"
    assert "two keys that JSON writes as the same text" in str(ended["result"])
    assert seen == [ended["result"]]


async def test_a_tool_result_with_number_keys_is_seen_live_as_it_is_stored(
    store_url: str,
) -> None:
    seen: list[Any] = []

    @so.tool
    async def lookup() -> Any:
        """Look up."""
        return {1: "a", 2: {3: "b"}}

    def look(conversation: list[Any]) -> so.ModelResponse:
        seen.append(conversation[-1].content)
        return reply("done")

    agent = scripted_agent("a", [call_tools(call("lookup")), look], tools=[lookup])
    async with so.Runtime([agent], store=store_url) as rt:
        done = await rt.generate("a", prompt="go")
        events = [e async for e in rt.events(done.session_id, follow=False)]
    ended = next(e.data for e in events if e.type == "tool.completed")
    assert ended["result"] == {"1": "a", "2": {"3": "b"}} == seen[0]


async def seen_live_and_resumed(store_url: str, result: Any) -> list[Any]:
    """What the model reads of a tool's `result`: live, and in a new runtime that resumes the
    session after a question parked it (as another process would)."""
    seen: list[Any] = []

    @so.tool
    async def lookup() -> Any:
        """Look up."""
        return result

    @so.tool
    async def confirm(ctx: so.ToolContext) -> str:
        """Confirm."""
        return (await ctx.ask("go on?", options=["yes", "no"])).value

    def read(conversation: list[Any]) -> so.ModelResponse:
        seen.append(next(m.content for m in conversation if isinstance(m, so.ToolResultMessage)))
        return call_tools(call("confirm")) if len(seen) == 1 else reply("done")

    def agent() -> so.Agent:
        return scripted_agent(
            "a", [call_tools(call("lookup")), read, read], tools=[lookup, confirm]
        )

    async with so.Runtime([agent()], store=store_url) as rt:
        parked = await rt.generate("a", prompt="go")
    async with so.Runtime([agent()], store=store_url) as rt:
        answer = so.InputResponse(request_id=parked.pending[0].id, option_id="yes")
        done = await rt.respond(parked.session_id, [answer])
    assert done.status == "completed" and len(seen) == 2
    return seen


async def test_none_keys_read_as_null_live_and_resumed(store_url: str) -> None:
    """A `None` key came back `"None"` (pydantic's word), where JSON and a recorded answer
    say `"null"`; a model's or dataclass's dict is written the same way."""
    seen = await seen_live_and_resumed(
        store_url, {None: 1, "n": Box(data={None: Pair(left={None: 2}, right={1: 3})})}
    )
    wanted = {"null": 1, "n": {"data": {"null": {"left": {"null": 2}, "right": {"1": 3}}}}}
    assert seen == [wanted, wanted]


async def test_a_tool_result_with_clashing_keys_in_a_model_is_the_calls_error(
    store_url: str,
) -> None:
    seen = await seen_live_and_resumed(store_url, [Box(data={"rows": [CLASH]})])
    assert seen[0] == seen[1]
    assert "two keys that JSON writes as the same text" in seen[0]["error"]


async def test_a_step_result_with_clashing_keys_fails_the_step_on_replay_too(
    store_url: str,
) -> None:
    failures: list[str] = []

    @so.tool
    async def flow(ctx: so.ToolContext) -> str:
        """A workflow."""
        try:
            await ctx.step("fetch", lambda: {"rows": [CLASH]})
        except so.UsageError as exc:
            failures.append(str(exc))
        answer = await ctx.ask("go on?", options=["yes", "no"])
        return answer.value

    agent = scripted_agent("a", [call_tools(call("flow")), reply("done")], tools=[flow])
    async with so.Runtime([agent], store=store_url) as rt:
        parked = await rt.generate("a", prompt="go")
        assert parked.status == "waiting" and len(failures) == 1
        answer = so.InputResponse(request_id=parked.pending[0].id, option_id="yes")
        done = await rt.respond(parked.session_id, [answer])
        assert done.status == "completed"
    assert len(failures) == 2 and failures[0] == failures[1]
    assert "two keys that JSON writes as the same text" in failures[0]


async def test_steps_whose_results_clash_in_a_model_or_have_no_json_form_fail_alike_on_replay(
    store_url: str,
) -> None:
    """A step returning a dataclass whose dict had two keys written alike returned one of them;
    one returning bytes that are not UTF-8 raised `UnicodeDecodeError` live and `StepFailed`
    when replayed. Both are a `UsageError`, live and replayed, with the same message."""
    failures: list[tuple[str, type[BaseException], str]] = []
    results: dict[str, Any] = {"pair": Pair(left=CLASH, right={}), "bytes": b"\xff"}

    @so.tool
    async def flow(ctx: so.ToolContext) -> str:
        """A workflow."""
        for name, result in results.items():
            try:
                await ctx.step(name, lambda r=result: r)
            except Exception as exc:
                failures.append((name, type(exc), str(exc)))
        return (await ctx.ask("go on?", options=["yes", "no"])).value

    def agent() -> so.Agent:
        return scripted_agent("a", [call_tools(call("flow")), reply("done")], tools=[flow])

    async with so.Runtime([agent()], store=store_url) as rt:
        parked = await rt.generate("a", prompt="go")
        assert parked.status == "waiting" and len(failures) == 2
    async with so.Runtime([agent()], store=store_url) as rt:
        answer = so.InputResponse(request_id=parked.pending[0].id, option_id="yes")
        assert (await rt.respond(parked.session_id, [answer])).status == "completed"
    assert failures[:2] == failures[2:]
    assert [kind for _, kind, _ in failures] == [so.UsageError] * 4
    assert "two keys that JSON writes as the same text" in failures[0][2]
    assert "the value has no JSON form (UnicodeDecodeError" in failures[1][2]


@pytest.mark.parametrize("value", [{1: "a"}, CLASH, {"ok": [{None: True}]}])
async def test_an_answers_value_with_keys_that_are_not_text_is_refused_and_stores_nothing(
    store_url: str, value: Any
) -> None:
    """Recorded, `{1: "a"}` would reach the live run as it is and a resumed one as `{"1": "a"}`;
    `{1: "a", "1": "b"}` failed with a bare TypeError."""

    @so.tool
    async def refund(ctx: so.ToolContext, amount: int) -> None:
        """Refund."""
        ctx.request_approval({"amount": amount})

    agent = scripted_agent("a", [call_tools(call("refund", amount=5)), reply("ok")], tools=[refund])
    async with so.Runtime([agent], store=store_url) as rt:
        parked = await rt.generate("a", prompt="go")
        rid = parked.pending[0].id
        before = await store_contents(rt.store, parked.session_id)
        with pytest.raises(so.InvalidAnswer, match="is not text") as caught:
            await rt.generate(
                session_id=parked.session_id,
                approvals=[so.Decision(id=rid, approved=True, value=value)],
            )
        assert caught.value.request_ids == [rid]
        with pytest.raises(so.InvalidAnswer, match="is not text"):
            answer = so.InputResponse(request_id=rid, option_id="approve", value=value)
            await rt.respond(parked.session_id, [answer])
        assert await store_contents(rt.store, parked.session_id) == before
        done = await rt.generate(
            session_id=parked.session_id,
            approvals=[so.Decision(id=rid, approved=True, value={"1": "a"})],
        )
        assert done.status == "completed"


async def test_an_edit_with_keys_that_are_not_text_is_refused(store_url: str) -> None:
    @so.tool(approval=so.always())
    async def tag(labels: dict[str, Any]) -> str:
        """Tag."""
        return "tagged"

    agent = scripted_agent(
        "a", [call_tools(call("tag", labels={"x": 1})), reply("ok")], tools=[tag]
    )
    async with so.Runtime([agent], store=store_url) as rt:
        parked = await rt.generate("a", prompt="go")
        rid = parked.pending[0].id
        before = await store_contents(rt.store, parked.session_id)
        edit = {"labels": {"x": {1: "a", "1": "b"}}}
        with pytest.raises(so.InvalidAnswer, match="is not text"):
            await rt.generate(
                session_id=parked.session_id,
                approvals=[so.Decision(id=rid, approved=True, edited_input=edit)],
            )
        assert await store_contents(rt.store, parked.session_id) == before


async def test_a_model_call_whose_input_has_a_key_that_is_not_text_is_a_model_error(
    store_url: str,
) -> None:
    @so.tool
    async def lookup(query: Any) -> str:
        """Look up."""
        return "found"

    bad = so.ToolCall(name="lookup", input={"query": {7: "seven"}})
    agent = scripted_agent("a", [call_tools(bad), reply("ok")], tools=[lookup])
    async with so.Runtime([agent], store=store_url) as rt:
        failed = await rt.generate("a", prompt="go")
        assert failed.status == "failed"
        assert failed.error is not None and "is not text" in str(failed.error)
        events = [e async for e in rt.events(failed.session_id, follow=False)]
        assert not [e for e in events if e.type == "model.completed"]


@pytest.mark.parametrize(
    ("query", "problem"),
    [
        (Box(data={7: "seven"}), "key 7 (int) is not text"),
        (Pair(left={}, right=CLASH), "key 1 (int) is not text"),
        ([Box(data={"a\ud800": 1})], "key 'a\\ud800' is not valid Unicode text"),
    ],
)
async def test_a_model_call_whose_input_holds_a_model_with_keys_not_text_is_a_model_error(
    store_url: str, query: Any, problem: str
) -> None:
    """Only dicts reached through dicts, lists and tuples were looked at: a model or dataclass
    in a call's input went past, its dict recorded as JSON writes it (two keys written alike,
    one lost without a word), or, with a lone surrogate in a key, failing the tool's question
    with a bare UnicodeEncodeError after the tool ran."""
    ran: list[Any] = []

    @so.tool
    async def lookup(query: Any) -> str:
        """Look up."""
        ran.append(query)
        return "found"

    bad = so.ToolCall(name="lookup", input={"query": query})
    agent = scripted_agent("a", [call_tools(bad), reply("ok")], tools=[lookup])
    async with so.Runtime([agent], store=store_url) as rt:
        failed = await rt.generate("a", prompt="go")
        assert failed.status == "failed" and ran == []
        assert failed.error is not None and problem in failed.error["message"]
        events = [e async for e in rt.events(failed.session_id, follow=False)]
        assert not [e for e in events if e.type == "model.completed"]


async def test_reasoning_with_a_key_that_is_not_text_is_a_model_error(store_url: str) -> None:
    response = call_tools(call("lookup"))
    response = response.model_copy(update={"reasoning": [{"type": "thinking", "x": {1: "a"}}]})

    @so.tool
    async def lookup() -> str:
        """Look up."""
        return "found"

    agent = scripted_agent("a", [response, reply("ok")], tools=[lookup])
    async with so.Runtime([agent], store=store_url) as rt:
        failed = await rt.generate("a", prompt="go")
        assert failed.status == "failed" and failed.error is not None
        assert "reasoning that is not plain JSON: its key 1 (int)" in failed.error["message"]


@pytest.mark.parametrize("gated", [False, True])
async def test_a_model_call_whose_input_has_a_key_with_a_lone_surrogate_is_a_model_error(
    store_url: str, gated: bool
) -> None:
    """pydantic cannot write such a key as JSON: for a gated tool, showing the call to a
    reviewer raised a bare UnicodeEncodeError out of `generate`, and every resume raised it
    again (the session stayed running for good); an ungated tool ran with it (and a question it
    asked failed). A lone surrogate in a value is kept as it is, as in a tool's result."""
    ran: list[Any] = []

    @so.tool(approval=so.always() if gated else None)
    async def lookup(query: Any) -> str:
        """Look up."""
        ran.append(query)
        return "found"

    bad = so.ToolCall(name="lookup", input={"query": {"a\ud800": "x"}})
    agent = scripted_agent("a", [call_tools(bad), reply("ok")], tools=[lookup])
    async with so.Runtime([agent], store=store_url) as rt:
        failed = await rt.generate("a", prompt="go")
        assert failed.status == "failed" and ran == []
        assert failed.error is not None and failed.error["code"] == "model_error"
        assert "key 'a\\ud800' is not valid Unicode text" in failed.error["message"]
        events = [e async for e in rt.events(failed.session_id, follow=False)]
        assert not [e for e in events if e.type == "model.completed"]
    good = so.ToolCall(name="lookup", input={"query": {"a": "x\ud800"}})
    agent = scripted_agent("a", [call_tools(good), reply("ok")], tools=[lookup])
    async with so.Runtime([agent], store=store_url) as rt:
        done = await rt.generate("a", prompt="go")
        if gated:
            rid = done.pending[0].id
            done = await rt.generate(
                session_id=done.session_id, approvals=[so.Decision(id=rid, approved=True)]
            )
        assert done.status == "completed" and ran == [{"a": "x\ud800"}]


def test_a_principal_whose_attributes_have_a_key_that_is_not_text_is_refused() -> None:
    from signoff._answers import check_principal

    who = so.Principal(principal_id="ann", authenticator="t", attributes={"teams": {1: "ops"}})
    with pytest.raises(so.UsageError, match="is not text"):
        check_principal(who, "principal")
