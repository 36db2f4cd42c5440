"""Extended thinking across a tool loop: thinking blocks go back with their tool use, are left
out when thinking is off, and a turn parked on OpenAI is approved on Claude with thinking."""

from __future__ import annotations

from pathlib import Path

import signoff as so

from ._models import lookup_order, request, support_agent
from ._models_anthropic import THOUGHT, fake, tool_use
from .fakes.llm import (
    API_KEY,
    FakeLLM,
    anthropic_message,
    openai_completion,
    openai_tool_call,
)

__all__ = ["fake"]  # the fixture, used by name


async def test_thinking_blocks_go_back_with_their_tool_use(fake, tmp_path: Path) -> None:
    # With thinking on, the API refuses a tool_result whose tool_use message lost its thinking
    # block, so every turn that used a tool failed at its second call.
    thinking = {"type": "thinking", "thinking": "The order is 1042.", "signature": "sig=="}
    redacted = {"type": "redacted_thinking", "data": "opaque=="}
    fake.queue(
        anthropic_message(
            thinking, redacted, tool_use("toolu_l", "lookup_order", {"order_id": "1"})
        ),
        anthropic_message(thinking, "It costs 180."),
    )
    model = so.models.Anthropic(
        "claude-haiku-4-5",
        base_url=fake.base_url,
        api_key=API_KEY,
        max_retries=0,
        max_tokens=4096,
        params={"thinking": {"type": "enabled", "budget_tokens": 1024}},
    )
    agent = so.Agent(name="support", model=model, tools=[lookup_order])
    async with model, so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="What did order 1 cost?")
        assert (r.status, r.error, r.text) == ("completed", None, "It costs 180.")
    assistant = fake.bodies[1]["messages"][1]
    assert assistant == {
        "role": "assistant",
        "content": [thinking, redacted, tool_use("toolu_l", "lookup_order", {"order_id": "1"})],
    }


def thinking_model(fake: FakeLLM, thinking: bool = True) -> so.models.Anthropic:
    params = {"thinking": {"type": "enabled", "budget_tokens": 1024}} if thinking else None
    return so.models.Anthropic(
        "claude-haiku-4-5",
        base_url=fake.base_url,
        api_key=API_KEY,
        max_retries=0,
        max_tokens=4096,
        params=params,
    )


def tool_turn(call_id: str, *, reasoning: bool) -> list[so.Message]:
    """A user's prompt, the model's call (with or without its thinking) and the call's result."""
    call = so.ToolCall(name="lookup_order", input={"order_id": "1"}, id=call_id)
    return [
        so.UserMessage(text="What did order 1 cost?"),
        so.AssistantMessage(tool_calls=[call], reasoning=[THOUGHT] if reasoning else []),
        so.ToolResultMessage(call_id=call_id, tool_name="lookup_order", content={"total": 180}),
    ]


async def test_a_tool_turn_without_thinking_continues_with_thinking_turned_off(fake) -> None:
    # A turn parked by another model (OpenAI, or Claude without thinking) and resumed here with
    # thinking on: the API refuses its tool_use message, which has no thinking block to start
    # with, so every later request of the turn failed with a 400. It is sent without thinking.
    fake.queue(anthropic_message("It costs 180."))
    async with thinking_model(fake) as model:
        r = await model.complete(request(*tool_turn("call_1", reasoning=False)))
    assert r.text == "It costs 180."
    [body] = fake.bodies
    assert "thinking" not in body
    assert body["messages"][1]["content"] == [tool_use("call_1", "lookup_order", {"order_id": "1"})]


async def test_thinking_blocks_are_left_out_when_thinking_is_off(fake) -> None:
    # A turn parked by Claude with thinking on and resumed by a model without it: the API
    # refuses thinking blocks in the last turn when thinking is off (earlier ones are dropped
    # too, as the API ignores them).
    fake.queue(anthropic_message("It costs 180."))
    conversation = [*tool_turn("toolu_0", reasoning=True), *tool_turn("toolu_1", reasoning=True)]
    async with thinking_model(fake, thinking=False) as model:
        await model.complete(request(*conversation))
    [body] = fake.bodies
    sent = [b["type"] for m in body["messages"] for b in m["content"]]
    assert "thinking" not in sent and sent.count("tool_use") == 2


async def test_thinking_stays_on_through_a_tool_loop_that_thinks_only_first(fake) -> None:
    # Without interleaved thinking Claude thinks once per turn: the later calls of its tool loop
    # come without thinking blocks, which the API accepts as the turn starts with one.
    fake.queue(anthropic_message("It costs 180."))
    again = so.ToolCall(name="lookup_order", input={"order_id": "2"}, id="toolu_2")
    conversation = [
        *tool_turn("toolu_1", reasoning=True),
        so.AssistantMessage(tool_calls=[again]),
        so.ToolResultMessage(call_id="toolu_2", tool_name="lookup_order", content={"total": 1}),
    ]
    async with thinking_model(fake) as model:
        await model.complete(request(*tool_turn("toolu_0", reasoning=False), *conversation))
    [body] = fake.bodies
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert body["messages"][3]["content"][0] == THOUGHT


async def test_a_turn_parked_on_openai_is_approved_on_claude_with_thinking(
    fake, tmp_path: Path
) -> None:
    # The approved call was proposed by OpenAI, so its message has no thinking block: that
    # request goes without thinking, and the next turn, a new one, thinks again.
    store = f"sqlite:///{tmp_path}/s.db"
    with FakeLLM("openai", strict=True) as openai_fake:
        call = openai_tool_call("call_r", "issue_refund", {"order_id": "1", "amount": 5})
        openai_fake.queue(openai_completion(None, [call]))
        openai = so.models.OpenAIChat(
            "gpt-4.1-mini", base_url=openai_fake.base_url, api_key=API_KEY
        )
        async with openai, so.Runtime([support_agent(openai)], store=store) as rt:
            r = await rt.generate("support", prompt="Refund order 1")
            [approval] = r.pending
    fake.queue(anthropic_message("Refunded."), anthropic_message(THOUGHT, "Anything else?"))
    async with (
        thinking_model(fake) as claude,
        so.Runtime([support_agent(claude)], store=store) as rt,
    ):
        decision = so.Decision(id=approval.id, approved=True)
        r = await rt.generate(session_id=r.session_id, approvals=[decision])
        assert (r.status, r.error, r.text) == ("completed", None, "Refunded.")
        r = await rt.generate(session_id=r.session_id, prompt="Thanks")
        assert (r.status, r.error, r.text) == ("completed", None, "Anything else?")
    resumed, next_turn = fake.bodies
    assert "thinking" not in resumed
    assert next_turn["thinking"] == {"type": "enabled", "budget_tokens": 1024}
