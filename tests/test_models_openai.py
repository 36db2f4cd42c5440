"""`OpenAIChat` against a scripted OpenAI-compatible server on loopback, through the real SDK."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import openai
import pytest

import signoff as so
from signoff.models import ModelRequest, ToolSpec
from signoff.models._openai import max_tokens_key
from signoff.models._provider import OPENAI_PRICES, lookup_price

from .fakes.llm import API_KEY, FakeLLM, Received, Reply, openai_completion, openai_tool_call

REFUND_SCHEMA = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}, "amount": {"type": "number"}},
    "required": ["order_id", "amount"],
}


@pytest.fixture
def fake() -> Iterator[FakeLLM]:
    with FakeLLM("openai", strict=True) as server:
        yield server


@pytest.fixture
async def model(fake: FakeLLM) -> AsyncIterator[so.models.OpenAIChat]:
    m = so.models.OpenAIChat("gpt-4.1-mini", base_url=fake.base_url, api_key=API_KEY, max_retries=0)
    yield m
    await m.aclose()


def request(*messages: so.Message, instructions: str = "", tools: list[ToolSpec] | None = None):
    return ModelRequest(
        session_id="ses_test",
        agent="support",
        instructions=instructions,
        messages=list(messages) or [so.UserMessage(text="hello")],
        tools=tools or [],
        response_index=0,
    )


# -- the request sent -----------------------------------------------------------------------


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


# -- the response read ----------------------------------------------------------------------


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


def test_price_lookup_accepts_date_suffixes_only() -> None:
    assert lookup_price("gpt-4o", OPENAI_PRICES) == (2.50, 10.00)
    assert lookup_price("gpt-4o-mini", OPENAI_PRICES) == (0.15, 0.60)
    assert lookup_price("gpt-4o-2024-08-06", OPENAI_PRICES) == (2.50, 10.00)
    assert lookup_price("gpt-4o-latest", OPENAI_PRICES) == (2.50, 10.00)
    assert lookup_price("o3-pro", OPENAI_PRICES) is None  # not priced as o3
    assert lookup_price("gpt-4o-audio-preview", OPENAI_PRICES) is None


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


# -- failures -------------------------------------------------------------------------------


async def test_server_error_becomes_model_error_with_the_cause(fake, model) -> None:
    fake.queue(Reply({"error": {"message": "upstream exploded", "type": "server_error"}}, 500))
    with pytest.raises(so.ModelError) as info:
        await model.complete(request())
    message = str(info.value)
    assert "HTTP 500" in message and "upstream exploded" in message
    assert "'gpt-4.1-mini'" in message and fake.base_url in message
    assert isinstance(info.value.__cause__, openai.InternalServerError)
    assert len(fake.received) == 1  # max_retries=0: no retry


async def test_a_bad_key_is_a_model_error_naming_the_status(fake) -> None:
    async with so.models.OpenAIChat(
        "gpt-4.1-mini", base_url=fake.base_url, api_key="wrong", max_retries=0
    ) as m:
        with pytest.raises(so.ModelError, match=r"HTTP 401: .*\(check the API key\)") as info:
            await m.complete(request())
    assert isinstance(info.value.__cause__, openai.AuthenticationError)


async def test_connection_refused_is_a_model_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with so.models.OpenAIChat(
        "m", base_url=f"http://127.0.0.1:{port}/v1", api_key=API_KEY, max_retries=0
    ) as m:
        with pytest.raises(so.ModelError, match="cannot connect") as info:
            await m.complete(request())
    assert isinstance(info.value.__cause__, openai.APIConnectionError)


async def test_a_slow_server_times_out_as_a_model_error(fake) -> None:
    def slow(got: Received) -> Reply:
        time.sleep(1.0)
        return Reply(openai_completion("late"))

    fake.queue(slow)
    async with so.models.OpenAIChat(
        "m", base_url=fake.base_url, api_key=API_KEY, max_retries=0, timeout=0.2
    ) as m:
        with pytest.raises(so.ModelError, match="timed out") as info:
            await m.complete(request())
    assert isinstance(info.value.__cause__, openai.APITimeoutError)


async def test_a_server_that_trickles_its_answer_times_out_as_a_model_error(fake) -> None:
    # Each byte comes in time for the SDK's read timeout, so without a bound on the whole call
    # the turn (and its session's lease) was held for as long as the server kept trickling.
    fake.queue(Reply(openai_completion("late " * 200), trickle=0.05))
    async with so.models.OpenAIChat(
        "m", base_url=fake.base_url, api_key=API_KEY, max_retries=0, timeout=0.3
    ) as m:
        started = time.monotonic()
        with pytest.raises(so.ModelError, match=r"gave up after 0.6 s \(timeout=0.3, max_retr"):
            await m.complete(request())
    assert time.monotonic() - started < 3


async def test_transient_errors_are_retried_with_backoff(fake) -> None:
    # retry-after-ms keeps the SDK's backoff short; 503 and 429 are both transient
    fast = {"retry-after-ms": "5"}
    fake.queue(
        Reply({"error": {"message": "busy"}}, 503, fast),
        Reply({"error": {"message": "slow down"}}, 429, fast),
        openai_completion("finally"),
    )
    async with so.models.OpenAIChat(
        "m", base_url=fake.base_url, api_key=API_KEY, max_retries=2
    ) as m:
        r = await m.complete(request())
    assert r.text == "finally"
    assert len(fake.received) == 3
    assert fake.bodies[0] == fake.bodies[2]


async def test_client_errors_are_not_retried(fake) -> None:
    fake.queue(Reply({"error": {"message": "bad tools", "type": "invalid_request_error"}}, 400))
    async with so.models.OpenAIChat(
        "m", base_url=fake.base_url, api_key=API_KEY, max_retries=2
    ) as m:
        with pytest.raises(so.ModelError, match="HTTP 400: invalid_request_error: bad tools"):
            await m.complete(request())
    assert len(fake.received) == 1


# -- construction ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"temperature": -1}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"price_per_mtok": (1.0,)}, "price_per_mtok"),
        ({"price_per_mtok": (1.0, -2.0)}, "price_per_mtok"),
        ({"max_retries": -1}, "max_retries"),
        ({"timeout": 0}, "timeout"),
        ({"timeout": float("nan")}, "timeout"),  # passed `<= 0`: no bound on the call
        ({"timeout": float("inf")}, "timeout"),
        ({"temperature": float("nan")}, "temperature"),  # sent to the provider as NaN
    ],
)
def test_bad_arguments_are_usage_errors(kwargs, match) -> None:
    with pytest.raises(so.UsageError, match=match):
        so.models.OpenAIChat("m", base_url="http://127.0.0.1:1/v1", **kwargs)


def test_a_model_name_is_required() -> None:
    with pytest.raises(so.UsageError, match="model name"):
        so.models.OpenAIChat("")


async def test_client_and_base_url_together_are_a_usage_error() -> None:
    client = openai.AsyncOpenAI(api_key="x", base_url="http://127.0.0.1:1/v1")
    try:
        with pytest.raises(so.UsageError, match="either client"):
            so.models.OpenAIChat("m", client=client, base_url="http://127.0.0.1:2/v1")
    finally:
        await client.close()


def test_a_missing_key_is_a_usage_error_unless_a_base_url_is_given(monkeypatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(so.UsageError, match="OPENAI_API_KEY"):
        so.models.OpenAIChat("gpt-4.1-mini")
    so.models.OpenAIChat("llama3.2", base_url="http://127.0.0.1:11434/v1")  # Ollama needs none
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:11434/v1")
    assert "11434" in repr(so.models.OpenAIChat("llama3.2"))


def test_a_missing_sdk_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "openai", None)
    with pytest.raises(so.UsageError, match=r"pip install 'signoff\[openai\]'"):
        so.models.OpenAIChat("gpt-4.1-mini", api_key="x")


async def test_a_client_passed_in_is_used_and_left_open(fake) -> None:
    fake.strict = False  # the last call sends no messages at all
    client = openai.AsyncOpenAI(api_key=API_KEY, base_url=fake.base_url, max_retries=0)
    fake.queue(openai_completion("one"), openai_completion("two"))
    m = so.models.OpenAIChat("m", client=client)
    assert (await m.complete(request())).text == "one"
    await m.aclose()
    assert not client.is_closed()
    assert (await client.chat.completions.create(model="m", messages=[])).choices
    await client.close()


async def test_one_model_serves_two_live_event_loops(
    fake: FakeLLM, model: so.models.OpenAIChat
) -> None:
    # Runtime's *_sync twins run on a loop of their own; an HTTP pool cannot cross loops.
    fake.queue(*(openai_completion(t) for t in ("main", "thread", "main again")))
    assert (await model.complete(request())).text == "main"

    def in_another_loop() -> str:
        async def call() -> str:
            try:
                return (await model.complete(request())).text
            finally:
                await model.aclose()  # closes this loop's client only

        return asyncio.run(call())

    assert await asyncio.to_thread(in_another_loop) == "thread"
    assert (await model.complete(request())).text == "main again"


# -- end to end, through an agent -----------------------------------------------------------


@so.tool(approval=so.always())
async def issue_refund(order_id: str, amount: float) -> dict[str, object]:
    """Refund an order."""
    return {"refunded": amount, "order_id": order_id}


def support_agent(model: so.models.OpenAIChat) -> so.Agent:
    return so.Agent(
        name="support", model=model, instructions="You help customers.", tools=[issue_refund]
    )


async def test_an_approved_call_round_trips_through_the_sdk(fake, model, tmp_path: Path) -> None:
    fake.queue(
        openai_completion(
            "Let me refund that.",
            [openai_tool_call("call_abc", "issue_refund", {"order_id": "1042", "amount": 180})],
            usage=(100, 20),
        ),
        openai_completion("Refunded 180.", usage=(150, 10)),
    )
    async with so.Runtime([support_agent(model)], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="Refund order 1042")
        assert r.status == "waiting"
        [req] = r.pending
        assert (req.tool_name, req.call_id) == ("issue_refund", "call_abc")
        assert req.input == {"order_id": "1042", "amount": 180.0}
        assert len(fake.received) == 1  # the model is not called while the call waits

        r = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=req.id, approved=True)]
        )
        assert r.status == "completed" and r.text.endswith("Refunded 180.")
        state = await rt.state(r.session_id)
        assert (state.usage.input_tokens, state.usage.output_tokens) == (250, 30)

    first, second = fake.bodies
    assert first["messages"] == [
        {"role": "system", "content": "You help customers."},
        {"role": "user", "content": "Refund order 1042"},
    ]
    [tool] = first["tools"]
    assert tool["type"] == "function"
    assert tool["function"]["name"] == "issue_refund"
    assert tool["function"]["description"] == "Refund an order."
    assert set(tool["function"]["parameters"]["properties"]) == {"order_id", "amount"}
    assert second["messages"][2:] == [
        {
            "role": "assistant",
            "content": "Let me refund that.",
            "tool_calls": [
                {
                    "id": "call_abc",
                    "type": "function",
                    "function": {
                        "name": "issue_refund",
                        "arguments": '{"order_id": "1042", "amount": 180}',
                    },
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_abc",
            "content": '{"refunded": 180.0, "order_id": "1042"}',
        },
    ]


async def test_a_denial_and_its_reason_reach_the_model(fake, model, tmp_path: Path) -> None:
    fake.queue(
        openai_completion(
            None, [openai_tool_call("call_d", "issue_refund", {"order_id": "9", "amount": 5000})]
        ),
        openai_completion("Sorry, the refund was declined."),
    )
    async with so.Runtime([support_agent(model)], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="Refund order 9")
        r = await rt.generate(
            session_id=r.session_id,
            approvals=[so.Decision(id=r.pending[0].id, approved=False, reason="over the limit")],
        )
        assert r.status == "completed"
    tool_message = fake.bodies[1]["messages"][-1]
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "call_d"
    assert tool_message["content"].startswith("DENIED: the call to issue_refund was not run.")
    assert "over the limit" in tool_message["content"]


async def test_a_server_error_fails_the_turn_retryably(fake, model, tmp_path: Path) -> None:
    fake.queue(Reply({"error": {"message": "model overloaded"}}, 500))
    async with so.Runtime([support_agent(model)], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="hi")
        assert r.status == "failed" and r.retryable is True
        assert r.error is not None and r.error["code"] == "model_error"
        assert "HTTP 500" in r.error["message"] and "model overloaded" in r.error["message"]

        fake.queue(openai_completion("Hello!"))
        r = await rt.generate(session_id=r.session_id)  # the retry resumes the same turn
        assert (r.status, r.text) == ("completed", "Hello!")
    assert fake.bodies[0]["messages"] == fake.bodies[1]["messages"]


async def test_malformed_arguments_become_a_tool_error_the_model_sees(
    fake, model, tmp_path: Path
) -> None:
    raw = '{"order_id": "1042", "amount": 18'
    fake.queue(
        openai_completion(None, [openai_tool_call("call_bad", "issue_refund", raw)]),
        openai_completion("Sorry, let me retry that."),
    )
    async with so.Runtime([support_agent(model)], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="Refund order 1042")
        # no approval is asked for a call that cannot be validated, and it never runs
        assert (r.status, r.pending) == ("completed", [])
        events = [e async for e in rt.events(r.session_id, after=0, follow=False)]
    completed = [e.data for e in events if e.type == "tool.completed"]
    assert [(d["call_id"], d["status"]) for d in completed] == [("call_bad", "error")]
    assistant, tool_message = fake.bodies[1]["messages"][-2:]
    # the malformed text goes back exactly as the model wrote it
    assert assistant["tool_calls"][0]["function"]["arguments"] == raw
    assert tool_message["tool_call_id"] == "call_bad"
    content = tool_message["content"]
    assert content.startswith("ERROR: the call to issue_refund failed.")
    details = json.loads(content.split("failed. ", 1)[1])
    assert details["error"] == "invalid input"
    assert ["_unparsed_arguments"] in [d["loc"] for d in details["details"]]


# -- picking a model from the environment ---------------------------------------------------


async def test_from_env_reaches_a_compatible_server_by_name(fake: FakeLLM) -> None:
    env = {"SIGNOFF_MODEL": "qwen3:8b", "OPENAI_BASE_URL": fake.base_url, "OPENAI_API_KEY": API_KEY}
    m = so.models.from_env(env=env)
    assert isinstance(m, so.models.OpenAIChat)
    fake.queue(openai_completion("hi from qwen"))
    try:
        assert (await m.complete(request())).text == "hi from qwen"
    finally:
        await m.aclose()
    assert fake.bodies[0]["model"] == "qwen3:8b"


async def test_from_env_with_env_reads_nothing_from_the_process(fake, monkeypatch) -> None:
    # The process points elsewhere, with an organization, a project and a header of its own:
    # none of it may reach a model made from an explicit env.
    with FakeLLM("openai") as elsewhere:
        monkeypatch.setenv("OPENAI_BASE_URL", elsewhere.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-the-process-key")
        monkeypatch.setenv("OPENAI_ORG_ID", "org-of-the-process")
        monkeypatch.setenv("OPENAI_PROJECT_ID", "proj-of-the-process")
        monkeypatch.setenv("OPENAI_CUSTOM_HEADERS", "X-Process: yes\nX-Both: process")
        env = {
            "SIGNOFF_MODEL": "qwen3:8b",
            "OPENAI_BASE_URL": fake.base_url,
            "OPENAI_API_KEY": API_KEY,
            "OPENAI_PROJECT_ID": "proj-given",
            "OPENAI_CUSTOM_HEADERS": "X-Both: given",
        }
        fake.queue(openai_completion("from the given server"))
        m = so.models.from_env(env=env)
        assert isinstance(m, so.models.OpenAIChat)
        try:
            assert (await m.complete(request())).text == "from the given server"
        finally:
            await m.aclose()
        # and without a base URL in env, the SDK's default, not the process's
        m = so.models.from_env(env={"OPENAI_API_KEY": API_KEY})
        assert isinstance(m, so.models.OpenAIChat)
        assert "api.openai.com" in str(m._clients.get().base_url)
        await m.aclose()
        assert elsewhere.received == []
    [got] = fake.received
    assert got.headers["authorization"] == f"Bearer {API_KEY}"
    assert "openai-organization" not in got.headers
    assert got.headers["openai-project"] == "proj-given"
    assert got.headers["x-both"] == "given"
    assert "x-process" not in got.headers


def test_a_model_made_with_a_client_takes_no_env() -> None:
    client = openai.AsyncOpenAI(api_key="k")
    with pytest.raises(so.UsageError, match="either client= or"):
        so.models.OpenAIChat("m", client=client, env={})


def test_from_env_picks_the_provider() -> None:
    fallback = so.models.Scripted([so.ModelResponse(text="demo")])
    pick = so.models.from_env
    assert pick(fallback, env={}) is fallback
    m = pick(fallback, env={"OPENAI_API_KEY": "k"})
    assert isinstance(m, so.models.OpenAIChat) and m.model == "gpt-4.1-mini"
    m = pick(fallback, env={"ANTHROPIC_API_KEY": "k", "OPENAI_API_KEY": "k"})
    assert isinstance(m, so.models.Anthropic) and m.model == "claude-haiku-4-5"
    # Anthropic, like OpenAI, wants a key (a model made without one fails at construction)
    m = pick(env={"SIGNOFF_MODEL": "claude-opus-4-1", "ANTHROPIC_API_KEY": "k"})
    assert isinstance(m, so.models.Anthropic) and m.model == "claude-opus-4-1"
    m = pick(env={"SIGNOFF_MODEL": "anthropic:my-claude-proxy", "ANTHROPIC_API_KEY": "k"})
    assert isinstance(m, so.models.Anthropic) and m.model == "my-claude-proxy"
    m = pick(env={"SIGNOFF_MODEL": "openai:gpt-4o", "OPENAI_API_KEY": "k"})
    assert isinstance(m, so.models.OpenAIChat) and m.model == "gpt-4o"
    m = pick(env={"OPENAI_BASE_URL": "http://127.0.0.1:11434/v1"})
    assert isinstance(m, so.models.OpenAIChat) and "11434" in repr(m)
    with pytest.raises(so.UsageError, match="names no model"):
        pick(env={"SIGNOFF_MODEL": "openai:"})
    with pytest.raises(so.UsageError, match="no model configured"):
        pick(env={})


def test_importing_signoff_does_not_import_the_sdks() -> None:
    code = "import sys, signoff; print('openai' in sys.modules, 'anthropic' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


async def test_params_the_sdk_does_not_know_are_a_usage_error(fake: FakeLLM) -> None:
    async with so.models.OpenAIChat(
        "m", base_url=fake.base_url, api_key=API_KEY, params={"temprature": 0.1}
    ) as m:
        with pytest.raises(so.UsageError, match="temprature"):
            await m.complete(request())
    assert fake.received == []
    with pytest.raises(so.UsageError, match="params may not set messages"):
        so.models.OpenAIChat("m", api_key="k", params={"messages": []})


@pytest.mark.parametrize("stream", [True, False])
def test_params_may_not_ask_for_a_stream(stream) -> None:
    # A streamed reply was parsed as a whole one: every turn failed with "returned no choices".
    with pytest.raises(so.UsageError, match="params may not set stream"):
        so.models.OpenAIChat("m", api_key="k", params={"stream": stream})


@so.tool
async def lookup_order(order_id: str) -> dict[str, object]:
    """Look an order up."""
    return {"order_id": order_id, "total": 180.0}


async def test_parallel_tool_calls_each_get_their_tool_message(
    fake: FakeLLM, model: so.models.OpenAIChat, tmp_path: Path
) -> None:
    fake.queue(
        openai_completion(
            None,
            [
                openai_tool_call("call_look", "lookup_order", {"order_id": "1042"}),
                openai_tool_call("call_pay", "issue_refund", {"order_id": "1042", "amount": 180}),
            ],
        ),
        openai_completion("Done."),
    )
    agent = so.Agent(name="support", model=model, tools=[lookup_order, issue_refund])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="Refund order 1042")
        assert [p.call_id for p in r.pending] == ["call_pay"]  # the lookup ran meanwhile
        r = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=r.pending[0].id, approved=True)]
        )
        assert r.status == "completed"
    assistant, *results = fake.bodies[1]["messages"][1:]
    assert [c["id"] for c in assistant["tool_calls"]] == ["call_look", "call_pay"]
    assert [(m["role"], m["tool_call_id"]) for m in results] == [
        ("tool", "call_look"),
        ("tool", "call_pay"),
    ]
    assert json.loads(results[0]["content"]) == {"order_id": "1042", "total": 180.0}


async def test_a_call_left_open_by_a_cancelled_turn_gets_a_result_before_the_next_prompt(
    fake: FakeLLM, model: so.models.OpenAIChat, tmp_path: Path
) -> None:
    # A call with no tool message makes the API refuse every later request of the session.
    fake.queue(
        openai_completion(
            None,
            [
                openai_tool_call("call_look", "lookup_order", {"order_id": "1042"}),
                openai_tool_call("call_pay", "issue_refund", {"order_id": "1042", "amount": 180}),
            ],
        ),
        openai_completion("Hello again."),
    )
    agent = so.Agent(name="support", model=model, tools=[lookup_order, issue_refund])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="Refund order 1042")
        r = await rt.cancel(r.session_id, "changed my mind")
        assert r.status == "cancelled"
        r = await rt.generate(session_id=r.session_id, prompt="hello")
        assert (r.status, r.error, r.text) == ("completed", None, "Hello again.")
    look, pay, prompt = fake.bodies[1]["messages"][2:]
    assert (look["tool_call_id"], pay["tool_call_id"]) == ("call_look", "call_pay")
    assert pay["content"].startswith("CANCELLED: the call to issue_refund has no result.")
    assert prompt == {"role": "user", "content": "hello"}


# -- replies a real server can send that are not what the API promises ------------------------


async def test_a_tool_call_cut_off_at_the_token_limit_is_a_model_error(fake, model) -> None:
    # the arguments of the call the limit cut are incomplete; none of the response's calls run
    body = openai_completion(
        None,
        [
            openai_tool_call("call_1", "issue_refund", {"order_id": "10", "amount": 5}),
            openai_tool_call("call_2", "issue_refund", '{"order_id": "11", "amo'),
        ],
    )
    body["choices"][0]["finish_reason"] = "length"
    fake.queue(body)
    with pytest.raises(so.ModelError, match="cut off at the token limit in a tool call"):
        await model.complete(request())


async def test_text_cut_off_at_the_token_limit_is_returned(fake, model) -> None:
    body = openai_completion("A long answer that")
    body["choices"][0]["finish_reason"] = "length"
    fake.queue(body)
    assert (await model.complete(request())).text == "A long answer that"


@pytest.mark.parametrize(
    ("finish", "match"),
    [
        ("length", r"cut off at the token limit before any answer \(finish_reason length\)"),
        ("tool_calls", r"ended for tool calls \(finish_reason tool_calls\) but sent none"),
    ],
)
async def test_a_reply_that_stopped_early_with_nothing_in_it_is_a_model_error(
    fake, model, finish, match
) -> None:
    # A reasoning model can spend max_tokens on reasoning alone, and a compatible server whose
    # tool parser failed sends tool_calls with no calls: the empty text passed for the answer.
    body = openai_completion("")
    body["choices"][0]["finish_reason"] = finish
    fake.queue(body)
    with pytest.raises(so.ModelError, match=match):
        await model.complete(request())


async def test_an_empty_reply_that_stopped_normally_is_returned(fake, model) -> None:
    fake.queue(openai_completion(""))
    assert (await model.complete(request())).text == ""


@pytest.mark.parametrize("finish", [[], {}, ["length"]])
async def test_a_finish_reason_that_is_not_text_is_ignored(fake, model, finish) -> None:
    # A list or an object as finish_reason raised a bare TypeError (unhashable) from the adapter.
    body = openai_completion("")
    body["choices"][0]["finish_reason"] = finish
    fake.queue(body)
    assert (await model.complete(request())).text == ""


@pytest.mark.parametrize(
    ("text", "calls"),
    [(None, None), ("", None), ("Sure:", [openai_tool_call("call_1", "x", {"a": 1})])],
    ids=["null", "empty", "a tool call"],
)
async def test_a_filtered_reply_with_no_text_or_with_a_tool_call_is_a_model_error(
    fake, model, text, calls
) -> None:
    # an empty answer would pass for the model's own; half a call would run
    body = openai_completion(text, calls)
    body["choices"][0]["finish_reason"] = "content_filter"
    fake.queue(body)
    with pytest.raises(so.ModelError, match=r"was filtered \(finish_reason content_filter\)"):
        await model.complete(request())


@pytest.mark.parametrize(
    ("text", "calls", "error"),
    [
        ("", None, {"code": 502, "message": "Upstream provider error"}),
        ("The refund is", None, {"code": 502, "message": "Upstream provider error"}),
        (None, [openai_tool_call("call_1", "x", '{"a": 1')], None),
    ],
    ids=["empty", "partial-text", "partial-call"],
)
async def test_a_choice_that_ended_in_an_error_is_a_model_error(
    fake, model, text, calls, error
) -> None:
    # A gateway (OpenRouter) reports a generation that failed midway as finish_reason "error",
    # with the error on the choice: its empty or partial text passed for the model's answer.
    body = openai_completion(text, calls)
    body["choices"][0]["finish_reason"] = "error"
    if error is not None:
        body["choices"][0]["error"] = error
    fake.queue(body)
    with pytest.raises(so.ModelError, match=r"ended in an error \(finish_reason error\)") as info:
        await model.complete(request())
    if error is not None:
        assert "Upstream provider error" in str(info.value)


async def test_a_filtered_reply_with_text_is_returned_as_text(fake, model) -> None:
    body = openai_completion("Here is the start of")
    body["choices"][0]["finish_reason"] = "content_filter"
    fake.queue(body)
    assert (await model.complete(request())).text == "Here is the start of"


async def test_choices_that_are_not_a_list_are_a_model_error(fake, model) -> None:
    body = openai_completion("x")
    body["choices"] = {"0": body["choices"][0]}
    fake.queue(body)
    with pytest.raises(so.ModelError, match="returned no choices"):
        await model.complete(request())


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        # A number there raised TypeError from the loop over the calls, not a ModelError.
        ("tool_calls", 5, "tool_calls that are not a list"),
        ("tool_calls", "call", "tool_calls that are not a list"),
        # A message that is not an object passed for an empty answer.
        (None, "hello", "returned no message"),
        (None, ["hello"], "returned no message"),
    ],
)
async def test_a_message_of_the_wrong_shape_is_a_model_error(
    fake, model, field, value, said
) -> None:
    body = openai_completion("x")
    if field is None:
        body["choices"][0]["message"] = value
    else:
        body["choices"][0]["message"][field] = value
    fake.queue(body)
    with pytest.raises(so.ModelError, match=said):
        await model.complete(request())


async def test_a_refusal_that_is_not_text_is_ignored(fake, model) -> None:
    body = openai_completion(None)
    body["choices"][0]["message"]["refusal"] = 5
    fake.queue(body)
    assert (await model.complete(request())).text == ""


@pytest.mark.parametrize(
    "raw",
    [
        '{"order_id": "1", "amount": NaN}',
        '{"order_id": "1", "amount": Infinity}',
        '{"order_id": "1", "amount": -Infinity}',
        '{"order_id": "1", "amount": 1, "x": ' + "[" * 5000 + "]" * 5000 + "}",
        '{"order_id": "1", "amount": 1e400}',
        '{"order_id": "1", "amount": -1e400}',
    ],
    ids=["nan", "infinity", "-infinity", "too-deep", "overflow", "-overflow"],
)
async def test_arguments_that_are_not_plain_json_are_passed_on_unparsed(fake, model, raw) -> None:
    fake.queue(openai_completion(None, [openai_tool_call("call_1", "f", raw)]))
    r = await model.complete(request())
    assert r.tool_calls == [so.ToolCall(name="f", input={"_unparsed_arguments": raw}, id="call_1")]


async def test_a_nan_amount_cannot_slip_past_an_approval_predicate(
    fake, model, tmp_path: Path
) -> None:
    # NaN > 100 is false: parsed as a number, the call would run without asking anyone
    ran: list[float] = []

    @so.tool(approval=lambda input: input.amount > 100)
    async def refund(order_id: str, amount: float) -> dict[str, object]:
        """Refund an order."""
        ran.append(amount)
        return {"refunded": amount}

    raw = '{"order_id": "1042", "amount": NaN}'
    fake.queue(
        openai_completion(None, [openai_tool_call("call_nan", "refund", raw)]),
        openai_completion("Let me try again."),
    )
    agent = so.Agent(name="support", model=model, tools=[refund])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="Refund order 1042")
        assert (r.status, r.pending) == ("completed", [])
    assert ran == []
    assistant, tool_message = fake.bodies[1]["messages"][-2:]
    assert assistant["tool_calls"][0]["function"]["arguments"] == raw  # as the model wrote it
    assert tool_message["content"].startswith("ERROR: the call to refund failed.")


async def test_a_number_too_large_for_a_float_is_a_tool_error_not_a_failed_turn(
    fake, model, tmp_path: Path
) -> None:
    # 1e400 was read as infinity, which the log refuses: the whole turn failed, and every retry
    # of a model that writes it again failed too, instead of the model being told.
    raw = '{"order_id": "1042", "amount": 1e400}'
    fake.queue(
        openai_completion(None, [openai_tool_call("call_big", "issue_refund", raw)]),
        openai_completion("Let me try again."),
    )
    async with so.Runtime([support_agent(model)], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="Refund order 1042")
        assert (r.status, r.error, r.pending) == ("completed", None, [])
    assistant, tool_message = fake.bodies[1]["messages"][-2:]
    assert assistant["tool_calls"][0]["function"]["arguments"] == raw  # as the model wrote it
    assert tool_message["content"].startswith("ERROR: the call to issue_refund failed.")


@pytest.mark.parametrize(
    "body",
    [b"{not json", b"", b"[" * 100_000 + b"]" * 100_000, b'{"choices": "\xff\xfe"}'],
    ids=["invalid", "empty", "too-deep", "not-utf8"],
)
async def test_a_body_that_is_not_json_is_a_model_error(fake, model, body: bytes) -> None:
    fake.queue(Reply(body))
    with pytest.raises(so.ModelError, match="returned a body that is not JSON"):
        await model.complete(request())


async def test_a_page_that_is_not_json_is_a_model_error_showing_it(fake, model) -> None:
    # A proxy's error page with status 200: the SDK hands back its text, which said only
    # "returned no choices".
    page = b"<html><body>Gateway Timeout</body></html>"
    fake.queue(Reply(page, headers={"Content-Type": "text/html"}))
    with pytest.raises(so.ModelError, match="returned a body that is not JSON") as info:
        await model.complete(request())
    assert "Gateway Timeout" in str(info.value)


async def test_a_body_cut_short_is_a_model_error_saying_so(fake, model) -> None:
    fake.queue(Reply(openai_completion("a long answer"), cut_at=40))
    with pytest.raises(so.ModelError, match="the connection broke") as info:
        await model.complete(request())
    assert isinstance(info.value.__cause__, openai.APIConnectionError)


async def test_a_body_that_cannot_be_decoded_is_not_called_a_connection_failure(
    fake, model
) -> None:
    # A proxy that labels a plain body gzip: the server answered, so "cannot connect" (check
    # the address) sent people the wrong way.
    fake.queue(Reply(openai_completion("hi"), headers={"Content-Encoding": "gzip"}))
    with pytest.raises(so.ModelError, match="the body could not be decoded") as info:
        await model.complete(request())
    assert "cannot connect" not in str(info.value)


async def test_a_body_cut_short_is_retried_like_other_transient_failures(fake) -> None:
    fake.queue(Reply(openai_completion("lost"), cut_at=40), openai_completion("whole"))
    async with so.models.OpenAIChat(
        "m", base_url=fake.base_url, api_key=API_KEY, max_retries=1
    ) as m:
        assert (await m.complete(request())).text == "whole"


async def test_negative_usage_counts_nothing(fake, model) -> None:
    body = openai_completion("x")
    body["usage"] = {"prompt_tokens": -1000, "completion_tokens": "5"}
    fake.queue(body)
    usage = (await model.complete(request())).usage
    assert (usage.input_tokens, usage.output_tokens, usage.cost_usd) == (0, 0, 0.0)


async def test_absurd_usage_counts_nothing(fake, model) -> None:
    # more tokens than any model reads (and than JSON readers hold exactly); a count past a
    # float's range made computing the cost raise a bare OverflowError
    body = openai_completion("x")
    body["usage"] = {"prompt_tokens": 10**320, "completion_tokens": 2**53}
    fake.queue(body)
    usage = (await model.complete(request())).usage
    assert (usage.input_tokens, usage.output_tokens, usage.cost_usd) == (0, 0, 0.0)


async def test_a_number_too_long_to_read_is_a_model_error(fake, model) -> None:
    body = json.dumps(openai_completion("x")).replace(
        '"prompt_tokens": 10', '"prompt_tokens": 1' + "0" * 5000
    )
    fake.queue(Reply(body.encode()))
    with pytest.raises(so.ModelError, match="returned a body that cannot be read: ValueError"):
        await model.complete(request())


@so.tool
async def garbled() -> str:
    """Return text holding a lone surrogate, as a badly decoded file can."""
    return "caf\udce9"


async def test_a_lone_surrogate_in_the_conversation_does_not_poison_the_session(
    fake, model, tmp_path: Path
) -> None:
    # JSON may escape a lone surrogate; it cannot be sent as UTF-8, so every later call failed
    fake.queue(
        openai_completion("bad \ud800 text"),
        openai_completion(None, [openai_tool_call("call_g", "garbled", {})]),
        openai_completion("Read it."),
    )
    agent = so.Agent(name="support", model=model, tools=[garbled])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="hi")
        assert r.status == "completed"
        r = await rt.send(r.session_id, "read the file")
        assert (r.status, r.error, r.text) == ("completed", None, "Read it.")
    messages = fake.bodies[2]["messages"]
    assert messages[1] == {"role": "assistant", "content": "bad \ufffd text"}
    assert messages[-1]["content"] == "caf\ufffd"
