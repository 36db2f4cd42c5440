"""Tool-call input nested deeper than a person's answer may be (100 levels): from `OpenAIChat` and
`Anthropic` a tool error the model reads, from any other model a failed turn, never recorded as
it came (pydantic could not show it to a reviewer past about 250 levels, and sending it back to
Claude passed Python's recursion limit: either left the session broken for good)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

import signoff as so

from ._models import request
from ._models_anthropic import tool_use
from .fakes.llm import API_KEY, FakeLLM, anthropic_message, openai_completion, openai_tool_call

ran: list[object] = []


@so.tool(approval=so.always())
async def store_doc(doc: dict[str, Any]) -> str:
    """Store a document."""
    ran.append(doc)
    return "stored"


@so.tool
async def keep_doc(doc: dict[str, Any]) -> str:
    """Keep a document."""
    ran.append(doc)
    return "kept"


def nested(depth: int) -> Any:
    """A value of `depth` objects, one inside the other (the outermost is level 1)."""
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.fixture
async def openai_model() -> AsyncIterator[tuple[FakeLLM, so.models.OpenAIChat]]:
    with FakeLLM("openai", strict=True) as fake:
        async with so.models.OpenAIChat(
            "gpt-4.1-mini", base_url=fake.base_url, api_key=API_KEY, max_retries=0
        ) as model:
            yield fake, model


@pytest.fixture
async def anthropic_model() -> AsyncIterator[tuple[FakeLLM, so.models.Anthropic]]:
    with FakeLLM("anthropic", strict=True) as fake:
        async with so.models.Anthropic(
            "claude-haiku-4-5", base_url=fake.base_url, api_key=API_KEY, max_retries=0
        ) as model:
            yield fake, model


async def test_openai_arguments_nested_too_deeply_are_passed_on_unparsed(openai_model) -> None:
    fake, model = openai_model
    fits, deep = json.dumps(nested(100)), json.dumps(nested(101))
    fake.queue(
        openai_completion(
            None, [openai_tool_call("c1", "f", fits), openai_tool_call("c2", "f", deep)]
        )
    )
    r = await model.complete(request())
    assert [c.input for c in r.tool_calls] == [nested(100), {"_unparsed_arguments": deep}]


async def test_an_anthropic_input_nested_too_deeply_is_passed_on_unparsed(anthropic_model) -> None:
    fake, model = anthropic_model
    fake.queue(
        anthropic_message(tool_use("t1", "f", nested(100)), tool_use("t2", "f", nested(101)))
    )
    r = await model.complete(request())
    fits, deep = (c.input for c in r.tool_calls)
    assert fits == nested(100)
    assert deep == {"_unparsed_arguments": json.dumps(nested(101))}


async def test_a_deep_openai_input_to_a_gated_tool_is_a_tool_error(
    openai_model, store_url: str
) -> None:
    # Validated, it was shown to a reviewer: pydantic refused to serialize it (a bare
    # ValueError), which escaped the drive and left the session running for good.
    fake, model = openai_model
    ran.clear()
    raw = json.dumps({"doc": nested(300)})
    fake.queue(
        openai_completion(None, [openai_tool_call("call_deep", "store_doc", raw)]),
        openai_completion("That document is too deep; I will not store it."),
    )
    agent = so.Agent(name="a", model=model, tools=[store_doc])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="store it")
        assert (r.status, r.pending) == ("completed", [])
        assert r.text.endswith("I will not store it.")
    assert ran == []
    assistant, result = fake.bodies[1]["messages"][-2:]
    sent = assistant["tool_calls"][0]["function"]["arguments"]
    assert json.loads(sent) == {"_unparsed_arguments": raw}  # a JSON object, what it wrote in it
    assert result["content"].startswith("ERROR: the call to store_doc failed.")
    assert '"type": "json_invalid"' in result["content"]
    assert "_unparsed" not in result["content"]


async def test_a_deep_anthropic_input_is_a_tool_error_and_the_session_goes_on(
    anthropic_model, store_url: str
) -> None:
    # Recorded as it came, it failed every later call of the session with a RecursionError
    # while the conversation was made ready to send.
    fake, model = anthropic_model
    ran.clear()
    fake.queue(
        anthropic_message(tool_use("toolu_deep", "keep_doc", {"doc": nested(600)})),
        anthropic_message("Too deep to store."),
        anthropic_message("Hello again."),
    )
    agent = so.Agent(name="a", model=model, tools=[keep_doc])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="store it")
        assert (r.status, r.text) == ("completed", "Too deep to store.")
        r = await rt.generate(session_id=r.session_id, prompt="hi")
        assert (r.status, r.text) == ("completed", "Hello again.")
    assert ran == []
    call = fake.bodies[1]["messages"][1]["content"][0]
    assert call["input"] == {"_unparsed_arguments": json.dumps({"doc": nested(600)})}
    [result] = fake.bodies[1]["messages"][2]["content"]
    assert (result["tool_use_id"], result["is_error"]) == ("toolu_deep", True)


DEEP_CALL = so.ToolCall(name="store_doc", input={"doc": nested(300)}, id="call_1")
FLAT_CALL = so.ToolCall(name="store_doc", input={"doc": {}}, id="call_1")


@pytest.mark.parametrize(
    ("response", "match"),
    [
        (so.ModelResponse(tool_calls=[DEEP_CALL]), "input nests deeper than 100 levels"),
        # Sent back to Claude with thinking on, it would pass the recursion limit there too.
        (
            so.ModelResponse(tool_calls=[FLAT_CALL], reasoning=[{"type": "x", "x": nested(600)}]),
            "reasoning nested deeper than 100 levels",
        ),
    ],
    ids=["input", "reasoning"],
)
async def test_any_other_models_deep_input_fails_the_turn_retryably(
    store_url: str, response: so.ModelResponse, match: str
) -> None:
    ran.clear()
    billed = response.model_copy(update={"usage": so.Usage(input_tokens=7)})
    model = so.models.Scripted([billed])
    agent = so.Agent(name="a", model=model, tools=[store_doc])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="store it")
        assert (r.status, r.retryable, r.pending) == ("failed", True, [])
        assert r.error is not None and r.error["code"] == "model_error"
        assert match in r.error["message"]
        types = [e.type async for e in rt.events(r.session_id, follow=False)]
        assert "model.completed" not in types and types[-2:] == ["turn.failed", "session.waiting"]
        assert (await rt.state(r.session_id)).usage.input_tokens == 7  # billed all the same

        model.steps = [so.ModelResponse(text="Which document?")]
        r = await rt.generate(session_id=r.session_id)
        assert (r.status, r.text) == ("completed", "Which document?")
    assert ran == []


async def test_input_at_the_depth_limit_reaches_the_reviewer(tmp_path) -> None:
    fits = so.ToolCall(name="store_doc", input={"doc": nested(99)}, id="call_1")
    model = so.models.Scripted([so.ModelResponse(tool_calls=[fits])])
    agent = so.Agent(name="a", model=model, tools=[store_doc])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("a", prompt="store it")
        assert r.status == "waiting"
        [req] = r.pending
        assert req.action is not None and req.action.input == {"doc": nested(99)}
