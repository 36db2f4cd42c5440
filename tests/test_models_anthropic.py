"""`Anthropic` against a scripted messages-API server on loopback, through the real SDK: the
request it sends and how it reads the response."""

from __future__ import annotations

from pathlib import Path

import pytest

import signoff as so
from signoff.models import ToolSpec
from signoff.models._provider import ANTHROPIC_PRICES, lookup_price

from ._models import REFUND_SCHEMA, request, support_agent
from ._models_anthropic import fake, model, tool_use
from .fakes.llm import (
    API_KEY,
    anthropic_message,
)

__all__ = ["fake", "model"]  # the fixtures, used by name


async def test_conversation_and_tools_reach_the_server_as_content_blocks(fake, model) -> None:
    fake.queue(anthropic_message("ok"))
    refund = ToolSpec(
        name="issue_refund", description="Refund an order.", input_schema=REFUND_SCHEMA
    )
    await model.complete(
        request(
            so.UserMessage(text="Refund order 1042"),
            so.AssistantMessage(
                text="Checking.",
                tool_calls=[
                    so.ToolCall(name="lookup_order", input={"order_id": "1042"}, id="toolu_a"),
                    so.ToolCall(name="issue_refund", input={"order_id": "1042"}, id="toolu_b"),
                ],
            ),
            so.ToolResultMessage(
                call_id="toolu_a", tool_name="lookup_order", content={"total": 180.0}
            ),
            so.ToolResultMessage(
                call_id="toolu_b",
                tool_name="issue_refund",
                content={"denied": True, "reason": "too much", "by": "policy"},
                is_error=True,
            ),
            so.UserMessage(text="Actually, only half."),
            so.AssistantMessage(tool_calls=[so.ToolCall(name="ping", input={}, id="toolu_c")]),
            so.ToolResultMessage(call_id="toolu_c", tool_name="ping", content=""),
            instructions="You help customers.",
            tools=[refund],
        )
    )
    [got] = fake.received
    assert got.path == "/v1/messages"
    assert API_KEY in (got.headers.get("x-api-key"), got.headers.get("authorization", "")[7:])
    assert "anthropic-version" in got.headers
    body = got.body
    assert body["model"] == "claude-haiku-4-5"
    assert body["max_tokens"] == 1024
    assert body["system"] == "You help customers."
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Refund order 1042"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                tool_use("toolu_a", "lookup_order", {"order_id": "1042"}),
                tool_use("toolu_b", "issue_refund", {"order_id": "1042"}),
            ],
        },
        {
            # results answer the calls first, then the user's next words, in one user message
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_a", "content": '{"total": 180.0}'},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_b",
                    "content": '{"denied": true, "reason": "too much", "by": "policy"}',
                    "is_error": True,
                },
                {"type": "text", "text": "Actually, only half."},
            ],
        },
        {"role": "assistant", "content": [tool_use("toolu_c", "ping", {})]},
        # an empty result is sent without content: an empty text would be refused
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_c"}]},
    ]
    assert body["tools"] == [
        {"name": "issue_refund", "description": "Refund an order.", "input_schema": REFUND_SCHEMA}
    ]


async def test_a_conversation_that_used_tools_is_sent_with_stand_ins_when_none_are_left(
    fake,
) -> None:
    # The API refuses tool_use/tool_result blocks in a request without `tools` (a 400 on every
    # later call of the session): the tools the conversation names are declared, taking any
    # input, and `tool_choice` none keeps the model from calling them, whatever params chose.
    fake.queue(anthropic_message("ok"), anthropic_message("ok"))
    calls: list[so.Message] = [
        so.UserMessage(text="Refund order 1042"),
        so.AssistantMessage(
            tool_calls=[
                so.ToolCall(name="lookup_order", input={"order_id": "1042"}, id="toolu_a"),
                so.ToolCall(name="multi.tool", input={}, id="toolu_b"),  # a made-up name
            ]
        ),
        so.ToolResultMessage(call_id="toolu_a", tool_name="lookup_order", content={"t": 1}),
        so.ToolResultMessage(call_id="toolu_b", tool_name="multi.tool", content="", is_error=True),
        so.AssistantMessage(
            tool_calls=[so.ToolCall(name="lookup_order", input={"order_id": "7"}, id="toolu_c")]
        ),
        so.ToolResultMessage(call_id="toolu_c", tool_name="lookup_order", content={"t": 2}),
        so.UserMessage(text="thanks"),
    ]
    chosen = {"tool_choice": {"type": "auto"}, "extra_body": {"tool_choice": {"type": "any"}}}
    async with so.models.Anthropic(
        "claude-haiku-4-5", base_url=fake.base_url, api_key=API_KEY, params=chosen
    ) as m:
        assert (await m.complete(request(*calls))).text == "ok"
        lookup = ToolSpec(name="lookup_order", description="Look.", input_schema=REFUND_SCHEMA)
        assert (await m.complete(request(*calls, tools=[lookup]))).text == "ok"
    stand_in = {
        "description": "No longer available: this conversation used it earlier.",
        "input_schema": {"type": "object"},
    }
    bare, given = fake.bodies
    assert bare["tools"] == [
        {"name": "lookup_order", **stand_in},
        {"name": "multi_tool", **stand_in},  # as the conversation names it on the wire
    ]
    assert bare["tool_choice"] == {"type": "none"}
    assert [b["type"] for m in bare["messages"] for b in m["content"]] == [
        "text", "tool_use", "tool_use", "tool_result", "tool_result", "tool_use", "tool_result",
        "text",
    ]  # fmt: skip
    # With tools of its own, the request is as it was: theirs, and the choice params made.
    assert given["messages"] == bare["messages"]
    assert [t["name"] for t in given["tools"]] == ["lookup_order"]
    assert given["tool_choice"] == {"type": "any"}  # extra_body's, over params'


async def test_roles_alternate_and_the_first_message_is_the_users(fake, model) -> None:
    fake.queue(anthropic_message("ok"))
    await model.complete(
        request(
            # a window may begin with an assistant message; an empty one is left out
            so.AssistantMessage(text="Earlier answer."),
            so.UserMessage(text="first"),
            so.AssistantMessage(text=""),
            so.UserMessage(text="second"),
        )
    )
    body = fake.bodies[0]
    assert "system" not in body and "tools" not in body
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "(continued)"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Earlier answer."}]},
        {
            "role": "user",
            "content": [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}],
        },
    ]


async def test_options_are_sent(fake) -> None:
    fake.queue(anthropic_message("ok"))
    async with so.models.Anthropic(
        "claude-haiku-4-5",
        base_url=fake.base_url,
        api_key=API_KEY,
        max_retries=0,
        max_tokens=4000,
        params={"stop_sequences": ["END"], "extra_body": {"top_k": 5}},
    ) as m:
        await m.complete(request())
    body = fake.bodies[0]
    assert (body["max_tokens"], body["stop_sequences"], body["top_k"]) == (4000, ["END"], 5)


async def test_text_tool_uses_and_usage_are_extracted(fake) -> None:
    fake.queue(
        anthropic_message(
            {"type": "thinking", "thinking": "hmm", "signature": "sig"},
            "Let me look. ",
            tool_use("toolu_1", "lookup_order", {"order_id": "1042"}),
            "And refund.",
            tool_use("toolu_2", "issue_refund", {"order_id": "1042", "amount": 5}),
            usage={
                "input_tokens": 1000,
                "output_tokens": 200,
                "cache_creation_input_tokens": 400,
                "cache_read_input_tokens": 2000,
            },
        )
    )
    async with so.models.Anthropic(
        "my-proxy-model",
        base_url=fake.base_url,
        api_key=API_KEY,
        max_retries=0,
        price_per_mtok=(3.0, 15.0),
    ) as m:
        r = await m.complete(request())
    assert r.text == "Let me look. And refund."
    assert r.tool_calls == [
        so.ToolCall(name="lookup_order", input={"order_id": "1042"}, id="toolu_1"),
        so.ToolCall(name="issue_refund", input={"order_id": "1042", "amount": 5}, id="toolu_2"),
    ]
    assert (r.usage.input_tokens, r.usage.output_tokens) == (1000 + 400 + 2000, 200)
    # cache writes cost 1.25x the input price, cache reads 0.1x
    expected = (1000 * 3.0 + 400 * 3.0 * 1.25 + 2000 * 3.0 * 0.1 + 200 * 15.0) / 1e6
    assert r.usage.cost_usd == pytest.approx(expected)


async def test_writes_to_the_one_hour_cache_cost_twice_the_input_price(fake) -> None:
    """Anthropic bills a write to the 1-hour cache at 2x the input price, to the 5-minute one at
    1.25x; `cache_creation` splits `cache_creation_input_tokens` between them. Before, all
    writes counted at 1.25x."""
    fake.queue(
        anthropic_message(
            "hi",
            usage={
                "input_tokens": 100,
                "output_tokens": 10,
                "cache_creation_input_tokens": 3000,
                "cache_read_input_tokens": 500,
                "cache_creation": {
                    "ephemeral_5m_input_tokens": 1000,
                    "ephemeral_1h_input_tokens": 2000,
                },
            },
        )
    )
    async with so.models.Anthropic(
        "m", base_url=fake.base_url, api_key=API_KEY, max_retries=0, price_per_mtok=(3.0, 15.0)
    ) as m:
        r = await m.complete(request())
    assert r.usage.input_tokens == 100 + 3000 + 500
    expected = (100 * 3.0 + 1000 * 3.0 * 1.25 + 2000 * 3.0 * 2 + 500 * 0.3 + 10 * 15.0) / 1e6
    assert r.usage.cost_usd == pytest.approx(expected)


async def test_known_models_are_priced(fake, model) -> None:
    fake.queue(anthropic_message("hi", usage={"input_tokens": 1_000_000, "output_tokens": 0}))
    assert (await model.complete(request())).usage.cost_usd == pytest.approx(1.0)
    assert lookup_price("claude-3-5-haiku-20241022", ANTHROPIC_PRICES) == (0.80, 4.00)
    assert lookup_price("claude-opus-4-1-20250805", ANTHROPIC_PRICES) == (15.0, 75.0)
    assert lookup_price("claude-sonnet-4-20250514", ANTHROPIC_PRICES) == (3.0, 15.0)
    assert lookup_price("claude-opus-9", ANTHROPIC_PRICES) is None


def test_newer_models_are_priced_as_anthropic_lists_them() -> None:
    """Each at the price its page on platform.claude.com lists; a newer point release is not
    priced as the model whose name starts it (Opus 4.5 is not Opus 4's $15 / $75)."""
    assert lookup_price("claude-opus-4-5-20251101", ANTHROPIC_PRICES) == (5.0, 25.0)
    assert lookup_price("claude-opus-4-6", ANTHROPIC_PRICES) == (5.0, 25.0)
    assert lookup_price("claude-opus-4-8", ANTHROPIC_PRICES) == (5.0, 25.0)
    assert lookup_price("claude-sonnet-4-6", ANTHROPIC_PRICES) == (3.0, 15.0)
    assert lookup_price("claude-opus-5", ANTHROPIC_PRICES) == (5.0, 25.0)
    assert lookup_price("claude-opus-5-5", ANTHROPIC_PRICES) == (4.0, 20.0)
    assert lookup_price("claude-sonnet-5", ANTHROPIC_PRICES) == (2.0, 10.0)
    assert lookup_price("claude-sonnet-5-5", ANTHROPIC_PRICES) == (2.0, 10.0)
    assert lookup_price("claude-fable-5-1", ANTHROPIC_PRICES) == (10.0, 50.0)
    # no single list price ("from $0.10 / $0.50"): left to price_per_mtok=
    assert lookup_price("claude-haiku-5-5", ANTHROPIC_PRICES) is None


def test_the_claude_4_aliases_are_priced_as_their_models() -> None:
    """`claude-sonnet-4-0` and `claude-opus-4-0` are Anthropic's aliases of the Claude 4
    snapshots; no date suffix, so they were priced at nothing (and refused a cost budget)."""
    assert lookup_price("claude-sonnet-4-0", ANTHROPIC_PRICES) == (3.0, 15.0)
    assert lookup_price("claude-opus-4-0", ANTHROPIC_PRICES) == (15.0, 75.0)


async def test_a_body_without_content_is_a_model_error(fake, model) -> None:
    fake.queue({"id": "msg", "type": "message", "role": "assistant"})
    with pytest.raises(so.ModelError, match="no content list"):
        await model.complete(request())


async def test_a_200_carrying_an_error_is_a_retryable_turn_failure_that_says_it(
    fake, model, tmp_path: Path
) -> None:
    # A gateway passing on an upstream failure with status 200: the turn said only "returned
    # no content list", hiding what went wrong.
    body = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    fake.queue(body)
    async with so.Runtime([support_agent(model)], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="hi")
        assert (r.status, r.retryable) == ("failed", True)
        assert r.error is not None and r.error["code"] == "model_error"
        assert (
            "returned an error instead of a message: overloaded_error: Overloaded"
            in (r.error["message"])
        )
        fake.queue(anthropic_message("Hello!"))
        r = await rt.generate(session_id=r.session_id)
        assert (r.status, r.text) == ("completed", "Hello!")
