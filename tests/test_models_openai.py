"""`OpenAIChat` against a scripted OpenAI-compatible server on loopback, through the real SDK: the
request it sends and how it reads the response."""

from __future__ import annotations

import json
from typing import Any

import pytest

import signoff as so
from signoff.models import ToolSpec
from signoff.models._openai import is_openai_host, max_tokens_key
from signoff.models._provider import OPENAI_CACHED_PRICES, OPENAI_PRICES, lookup_price

from ._models import REFUND_SCHEMA, request
from ._models_openai import fake, model
from .fakes.llm import API_KEY, openai_completion, openai_tool_call

__all__ = ["fake", "model"]  # the fixtures, used by name


async def test_conversation_and_tools_reach_the_server_in_chat_format(fake, model) -> None:
    fake.strict = False  # the formatting of a conversation no real one has (call_d answers nothing)
    fake.queue(openai_completion("ok"))
    refund = ToolSpec(
        name="issue_refund", description="Refund an order.", input_schema=REFUND_SCHEMA
    )
    await model.complete(
        request(
            so.UserMessage(text="Refund order 1042"),
            so.AssistantMessage(
                text="Checking.",
                tool_calls=[
                    so.ToolCall(name="lookup_order", input={"order_id": "1042"}, id="call_a"),
                    so.ToolCall(name="issue_refund", input={"order_id": "1042"}, id="call_b"),
                ],
            ),
            so.ToolResultMessage(
                call_id="call_a", tool_name="lookup_order", content={"total": 180.0}
            ),
            so.ToolResultMessage(
                call_id="call_b",
                tool_name="issue_refund",
                content={"denied": True, "reason": "too much", "by": "policy"},
                is_error=True,
            ),
            so.AssistantMessage(tool_calls=[so.ToolCall(name="x", input={}, id="call_c")]),
            so.ToolResultMessage(
                call_id="call_c", tool_name="x", content={"error": "boom"}, is_error=True
            ),
            so.ToolResultMessage(call_id="call_d", tool_name="x", content="plain text"),
            instructions="You help customers.",
            tools=[refund],
        )
    )
    [got] = fake.received
    assert got.path == "/v1/chat/completions"
    assert got.headers["authorization"] == f"Bearer {API_KEY}"
    body = got.body
    assert body["model"] == "gpt-4.1-mini"
    assert body["messages"] == [
        {"role": "system", "content": "You help customers."},
        {"role": "user", "content": "Refund order 1042"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "lookup_order", "arguments": '{"order_id": "1042"}'},
                },
                {
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "issue_refund", "arguments": '{"order_id": "1042"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": '{"total": 180.0}'},
        {
            "role": "tool",
            "tool_call_id": "call_b",
            "content": "DENIED: the call to issue_refund was not run. "
            '{"denied": true, "reason": "too much", "by": "policy"}',
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_c", "type": "function", "function": {"name": "x", "arguments": "{}"}}
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_c",
            "content": 'ERROR: the call to x failed. {"error": "boom"}',
        },
        {"role": "tool", "tool_call_id": "call_d", "content": "plain text"},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "issue_refund",
                "description": "Refund an order.",
                "parameters": REFUND_SCHEMA,
            },
        }
    ]
    assert "temperature" not in body and "max_tokens" not in body


async def test_arguments_go_back_as_a_json_object_whatever_the_model_wrote(fake, model) -> None:
    """Ollama and vLLM parse the arguments of each earlier call as an object: one the model
    wrote unparsable went back as written, and every later request of the session was
    refused (400), retries and new turns alike. It goes back under `_unparsed_arguments`, and
    input that is no object under `input`."""
    fake.queue(openai_completion("ok"))
    broken = '{"order_id": "1042"'
    calls = [
        so.ToolCall(name="f", input={"_unparsed_arguments": broken}, id="call_a"),
        so.ToolCall(name="f", input=[1], id="call_b"),
        so.ToolCall(name="f", input={"a": "é"}, id="call_c"),
    ]
    results = [so.ToolResultMessage(call_id=c.id or "", tool_name="f", content="ok") for c in calls]
    await model.complete(request(so.AssistantMessage(tool_calls=calls), *results))
    [assistant] = [m for m in fake.bodies[0]["messages"] if m["role"] == "assistant"]
    sent = [c["function"]["arguments"] for c in assistant["tool_calls"]]
    assert sent == [
        json.dumps({"_unparsed_arguments": broken}),
        '{"input": [1]}',
        '{"a": "é"}',
    ]


async def test_no_tools_no_system_and_options_are_sent(fake) -> None:
    fake.queue(openai_completion("ok"))
    async with so.models.OpenAIChat(
        "llama3.2",
        base_url=fake.base_url,
        api_key=API_KEY,
        max_retries=0,
        temperature=0.2,
        max_tokens=300,
        params={"seed": 7},
    ) as m:
        await m.complete(request())
    body = fake.bodies[0]
    assert body["messages"] == [{"role": "user", "content": "hello"}]
    assert "tools" not in body
    # a compatible server gets the classic name; only api.openai.com gets max_completion_tokens
    assert (body["temperature"], body["max_tokens"], body["seed"]) == (0.2, 300, 7)
    assert "max_completion_tokens" not in body


def test_only_openai_itself_gets_max_completion_tokens() -> None:
    assert max_tokens_key("api.openai.com") == "max_completion_tokens"
    assert max_tokens_key("127.0.0.1") == "max_tokens"
    assert max_tokens_key("my-vllm.internal") == "max_tokens"


@pytest.mark.parametrize(
    ("host", "openai_itself"),
    [
        ("eu.api.openai.com", True),  # the EU data-residency host
        ("us.api.openai.com", True),
        ("API.OpenAI.com", True),
        ("api.openai.com.", True),
        ("openai.com", False),
        ("evil-api.openai.com", False),
        ("api.openai.com.example", False),
        ("evil-api.openai.com.example", False),
        ("eu.api.openai.com.evil.example", False),
        ("xapi.openai.com", False),
    ],
)
def test_openai_regional_hosts_are_openai_itself(host: str, openai_itself: bool) -> None:
    """`eu.api.openai.com` was sent the classic `max_tokens`, which OpenAI's reasoning models
    refuse; a host that only looks like OpenAI's is not taken for it."""
    assert is_openai_host(host) is openai_itself
    assert max_tokens_key(host) == ("max_completion_tokens" if openai_itself else "max_tokens")


async def test_text_usage_and_cost_are_extracted(fake) -> None:
    fake.queue(openai_completion("Hello there", usage=(1000, 500)))
    async with so.models.OpenAIChat(
        "local-model",
        base_url=fake.base_url,
        api_key=API_KEY,
        max_retries=0,
        price_per_mtok=(2.0, 8.0),
    ) as m:
        r = await m.complete(request())
    assert r.text == "Hello there"
    assert r.tool_calls == []
    assert (r.usage.input_tokens, r.usage.output_tokens) == (1000, 500)
    assert r.usage.cost_usd == pytest.approx((1000 * 2.0 + 500 * 8.0) / 1e6)


async def test_known_models_are_priced_and_unknown_ones_cost_nothing(fake) -> None:
    fake.queue(openai_completion("a", usage=(1_000_000, 1_000_000)))
    fake.queue(openai_completion("b", usage=(1_000_000, 1_000_000)))
    for name, expected in (("gpt-4.1-mini-2025-04-14", 0.40 + 1.60), ("qwen2.5:7b", 0.0)):
        async with so.models.OpenAIChat(
            name, base_url=fake.base_url, api_key=API_KEY, max_retries=0
        ) as m:
            r = await m.complete(request())
        assert r.usage.cost_usd == pytest.approx(expected)


def cached_completion(text: str, prompt: int, cached: int, out: int) -> dict[str, object]:
    body = openai_completion(text, usage=(prompt, out))
    body["usage"]["prompt_tokens_details"] = {"cached_tokens": cached}
    return body


async def test_cached_input_tokens_cost_the_cached_price(fake) -> None:
    """OpenAI bills the prompt's cached tokens (`prompt_tokens_details.cached_tokens`, part of
    `prompt_tokens`) at a discount: gpt-4.1-mini's $0.10 against $0.40 per million. Before,
    all 1,000,000 prompt tokens counted at $0.40 ($2.00 in all, not $1.75)."""
    for _ in range(3):
        fake.queue(cached_completion("a", 1_000_000, 250_000, 1_000_000))
    async with so.models.OpenAIChat(
        "gpt-4.1-mini", base_url=fake.base_url, api_key=API_KEY, max_retries=0
    ) as m:
        r = await m.complete(request())
    assert r.usage.input_tokens == 1_000_000  # the cached ones are still input tokens
    assert r.usage.cost_usd == pytest.approx(0.75 * 0.40 + 0.25 * 0.10 + 1.60)
    # A price of one's own: cached tokens cost the input price, unless their price is given.
    for cached_price, expected in ((None, 1.0 + 2.0), (0.5, 0.75 + 0.125 + 2.0)):
        async with so.models.OpenAIChat(
            "gpt-4.1-mini",
            base_url=fake.base_url,
            api_key=API_KEY,
            max_retries=0,
            price_per_mtok=(1.0, 2.0),
            cached_price_per_mtok=cached_price,
        ) as m:
            r = await m.complete(request())
        assert r.usage.cost_usd == pytest.approx(expected)
    # A count of cached tokens over the prompt's (a gateway's slip) gives no cost back.
    fake.queue(cached_completion("a", 1000, 5000, 0))
    async with so.models.OpenAIChat(
        "local",
        base_url=fake.base_url,
        api_key=API_KEY,
        max_retries=0,
        price_per_mtok=(1.0, 2.0),
        cached_price_per_mtok=0.5,
    ) as m:
        r = await m.complete(request())
    assert r.usage.cost_usd == pytest.approx(1000 * 0.5 / 1e6)


@pytest.mark.parametrize("value", [-1, "0.1", True, float("nan"), float("inf")])
@pytest.mark.parametrize("name", ["cached_price_per_mtok", "cache_write_price_per_mtok"])
def test_a_cached_price_that_is_not_a_price_is_refused(value: Any, name: str) -> None:
    with pytest.raises(so.UsageError, match=name):
        so.models.OpenAIChat("m", base_url="http://127.0.0.1:9/v1", api_key="k", **{name: value})


async def test_a_gateways_cache_writes_cost_their_price(fake) -> None:
    """OpenRouter's usage-accounting example: 194 prompt tokens, 100 of them written to the
    cache (`prompt_tokens_details.cache_write_tokens`), which Anthropic's models behind it bill
    at 1.25x the input price. Before, all 194 counted at the input price ($0.000582 of input,
    not $0.000657) and `cache_write_price_per_mtok` did not exist."""
    body = openai_completion("a", usage=(194, 2))
    body["usage"]["prompt_tokens_details"] = {
        "cached_tokens": 0,
        "cache_write_tokens": 100,
        "audio_tokens": 0,
    }
    fake.queue(body, body)
    prices = {"price_per_mtok": (3.0, 15.0), "cache_write_price_per_mtok": 3.75}
    async with so.models.OpenAIChat(
        "anthropic/claude-sonnet-4",
        base_url=fake.base_url,
        api_key=API_KEY,
        max_retries=0,
        **prices,  # type: ignore[arg-type]
    ) as m:
        r = await m.complete(request())
        assert m.least_input_price_per_mtok == 3.0
    assert r.usage.input_tokens == 194  # the written ones are still input tokens
    assert r.usage.cost_usd == pytest.approx((94 * 3.0 + 100 * 3.75 + 2 * 15.0) / 1e6)
    # Without a price for them, writes cost the input price, as before.
    async with so.models.OpenAIChat(
        "m", base_url=fake.base_url, api_key=API_KEY, max_retries=0, price_per_mtok=(3.0, 15.0)
    ) as m:
        r = await m.complete(request())
    assert r.usage.cost_usd == pytest.approx((194 * 3.0 + 2 * 15.0) / 1e6)
    # Counts past the prompt's (a gateway's slip) give no cost back: writes fill what reads left.
    body["usage"]["prompt_tokens_details"] = {"cached_tokens": 150, "cache_write_tokens": 100}
    fake.queue(body)
    async with so.models.OpenAIChat(
        "m",
        base_url=fake.base_url,
        api_key=API_KEY,
        max_retries=0,
        cached_price_per_mtok=0.3,
        **prices,  # type: ignore[arg-type]
    ) as m:
        r = await m.complete(request())
    assert r.usage.cost_usd == pytest.approx((150 * 0.3 + 44 * 3.75 + 2 * 15.0) / 1e6)


def test_price_lookup_accepts_date_suffixes_only() -> None:
    assert lookup_price("gpt-4o", OPENAI_PRICES) == (2.50, 10.00)
    assert lookup_price("gpt-4o-mini", OPENAI_PRICES) == (0.15, 0.60)
    assert lookup_price("gpt-4o-2024-08-06", OPENAI_PRICES) == (2.50, 10.00)
    assert lookup_price("gpt-4o-latest", OPENAI_PRICES) == (2.50, 10.00)
    assert lookup_price("o3-pro", OPENAI_PRICES) is None  # not priced as o3
    assert lookup_price("gpt-4o-audio-preview", OPENAI_PRICES) is None


@pytest.mark.parametrize("asked", ["gpt-4o-2024-05-13", "gpt-4o"])
async def test_a_snapshot_listed_at_other_prices_than_its_base_is_priced_as_listed(
    fake, asked: str
) -> None:
    """gpt-4o-2024-05-13 is listed at $5 / $15 with no cached-input discount, where gpt-4o is
    at $2.50 / $10 (and $1.25 cached): the date suffix had it counted at gpt-4o's prices, asked
    for by name or named by the reply; the other snapshots stay at their base's."""
    assert lookup_price("gpt-4o-2024-05-13", OPENAI_PRICES) == (5.00, 15.00)
    assert lookup_price("gpt-4o-2024-05-13", OPENAI_CACHED_PRICES) == 5.00
    assert lookup_price("gpt-4o-2024-11-20", OPENAI_PRICES) == (2.50, 10.00)
    assert lookup_price("gpt-4o-2024-11-20", OPENAI_CACHED_PRICES) == 1.25
    body = openai_completion("hi", usage=(1_000_000, 1_000_000), model="gpt-4o-2024-05-13")
    body["usage"]["prompt_tokens_details"] = {"cached_tokens": 400_000}
    fake.queue(body)
    async with so.models.OpenAIChat(
        asked, base_url=fake.base_url, api_key=API_KEY, max_retries=0
    ) as m:
        r = await m.complete(request())
    assert r.usage.cost_usd == pytest.approx(5.00 + 15.00)


async def test_tool_calls_are_parsed_with_their_ids(fake, model) -> None:
    fake.queue(
        openai_completion(
            None,
            [
                openai_tool_call("call_1", "lookup_order", {"order_id": "1042"}),
                openai_tool_call("call_2", "ping", ""),
                openai_tool_call("call_3", "issue_refund", '{"order_id": "1042", "amount": '),
                openai_tool_call("", "noid", "{}"),
            ],
        )
    )
    r = await model.complete(request())
    assert r.text == ""
    assert r.tool_calls == [
        so.ToolCall(name="lookup_order", input={"order_id": "1042"}, id="call_1"),
        so.ToolCall(name="ping", input={}, id="call_2"),
        so.ToolCall(
            name="issue_refund",
            input={"_unparsed_arguments": '{"order_id": "1042", "amount": '},
            id="call_3",
        ),
        so.ToolCall(name="noid", input={}, id=None),
    ]


async def test_arguments_sent_as_an_object_are_accepted(fake, model) -> None:
    # some OpenAI-compatible servers send an object where OpenAI sends a JSON string
    body = openai_completion(None, [openai_tool_call("call_1", "f", "{}")])
    body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = {"a": 1}
    fake.queue(body)
    r = await model.complete(request())
    assert r.tool_calls == [so.ToolCall(name="f", input={"a": 1}, id="call_1")]


async def test_a_refusal_is_returned_as_text(fake, model) -> None:
    body = openai_completion(None)
    body["choices"][0]["message"]["refusal"] = "I can't help with that."
    fake.queue(body)
    assert (await model.complete(request())).text == "I can't help with that."


async def test_a_response_without_choices_is_a_model_error(fake, model) -> None:
    fake.queue({"id": "x", "object": "chat.completion", "choices": []})
    with pytest.raises(so.ModelError, match="returned no choices"):
        await model.complete(request())


@pytest.mark.parametrize(
    ("body", "said"),
    [
        # a gateway passing on an upstream failure with status 200
        ({"error": {"message": "upstream timed out", "type": "server_error"}}, "server_error: "),
        ({"error": "no healthy upstream"}, ""),
        # vLLM and other compatible servers' own error shape
        ({"object": "error", "message": "upstream timed out", "code": 500}, ""),
        # a FastAPI-based server's or proxy's (it said only "returned no choices")
        ({"detail": "upstream timed out"}, ""),
    ],
)
async def test_a_200_carrying_an_error_is_a_model_error_that_says_it(
    fake, model, body, said
) -> None:
    # It said only "returned no choices", hiding what the server said went wrong.
    fake.queue(body)
    with pytest.raises(so.ModelError) as info:
        await model.complete(request())
    detail = body["error"] if isinstance(body.get("error"), str) else "upstream timed out"
    assert f"returned an error instead of a completion: {said}{detail}" in str(info.value)


async def test_a_tool_call_without_a_name_is_a_model_error(fake, model) -> None:
    fake.queue(openai_completion(None, [openai_tool_call("call_1", "", "{}")]))
    with pytest.raises(so.ModelError, match="tool call with no name"):
        await model.complete(request())
