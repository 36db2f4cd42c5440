"""`Anthropic` against a scripted messages-API server on loopback, through the real SDK."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anthropic
import pytest

import signoff as so
from signoff.models import ModelRequest, ToolSpec
from signoff.models._provider import ANTHROPIC_PRICES, lookup_price

from .fakes.llm import (
    API_KEY,
    FakeLLM,
    Received,
    Reply,
    anthropic_message,
    openai_completion,
    openai_tool_call,
)

REFUND_SCHEMA = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}, "amount": {"type": "number"}},
    "required": ["order_id", "amount"],
}


def tool_use(call_id: str, name: str, input: object) -> dict[str, object]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": input}


THOUGHT = {"type": "thinking", "thinking": "Look the order up.", "signature": "sig=="}


@pytest.fixture
def fake() -> Iterator[FakeLLM]:
    with FakeLLM("anthropic", strict=True) as server:
        yield server


@pytest.fixture
async def model(fake: FakeLLM) -> AsyncIterator[so.models.Anthropic]:
    m = so.models.Anthropic(
        "claude-haiku-4-5", base_url=fake.base_url, api_key=API_KEY, max_retries=0
    )
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


# -- the response read ----------------------------------------------------------------------


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


async def test_known_models_are_priced(fake, model) -> None:
    fake.queue(anthropic_message("hi", usage={"input_tokens": 1_000_000, "output_tokens": 0}))
    assert (await model.complete(request())).usage.cost_usd == pytest.approx(1.0)
    assert lookup_price("claude-3-5-haiku-20241022", ANTHROPIC_PRICES) == (0.80, 4.00)
    assert lookup_price("claude-opus-4-1-20250805", ANTHROPIC_PRICES) == (15.0, 75.0)
    assert lookup_price("claude-sonnet-4-20250514", ANTHROPIC_PRICES) == (3.0, 15.0)
    assert lookup_price("claude-opus-9", ANTHROPIC_PRICES) is None


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


# -- failures -------------------------------------------------------------------------------


async def test_overloaded_becomes_a_model_error_naming_the_error_type(fake, model) -> None:
    body = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    fake.queue(Reply(body, 529))
    with pytest.raises(so.ModelError) as info:
        await model.complete(request())
    message = str(info.value)
    assert "HTTP 529: overloaded_error: Overloaded" in message
    assert "'claude-haiku-4-5'" in message and fake.base_url in message
    assert isinstance(info.value.__cause__, anthropic.APIStatusError)
    assert len(fake.received) == 1


@pytest.mark.parametrize(
    "reply",
    [
        Reply(
            ("<html>" + "x" * 3_000_000 + "</html>").encode(), 502, {"Content-Type": "text/html"}
        ),
        Reply({"type": "error", "error": {"type": "api_error", "message": "x" * 3_000_000}}, 500),
        Reply({"type": "error", "error": {"type": "api_error", "message": "x" * 3_000_000}}),
    ],
    ids=["html-page", "status-error", "200-error"],
)
async def test_an_error_of_megabytes_is_cut_not_stored_whole(
    fake, model, tmp_path: Path, reply: Reply
) -> None:
    # The server's text went whole into the turn's failure: megabytes in the log per retry,
    # past the bound max_response_bytes puts on what a model's reply may store.
    fake.queue(reply)
    async with so.Runtime([support_agent(model)], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="hi")
        assert (r.status, r.retryable) == ("failed", True)
        assert r.error is not None and r.error["code"] == "model_error"
        assert len(r.error["message"]) < 3000 and r.error["message"].endswith("[cut]")


async def test_a_request_the_sdk_refuses_to_send_is_a_usage_error(fake) -> None:
    # With a client of the SDK's default timeout, it refuses a max_tokens it expects to take over
    # ten minutes (some models: over 8192) before sending anything; that failed every turn as
    # "returned a body that cannot be read".
    client = anthropic.AsyncAnthropic(api_key=API_KEY, base_url=fake.base_url, max_retries=0)
    try:
        model = so.models.Anthropic("claude-opus-4-0", client=client, max_tokens=10_000)
        with pytest.raises(so.UsageError, match="the SDK refused the request") as info:
            await model.complete(request())
        assert "body" not in str(info.value)
    finally:
        await client.close()
    assert fake.received == []


async def test_a_bad_key_is_a_model_error(fake) -> None:
    async with so.models.Anthropic(
        "claude-haiku-4-5", base_url=fake.base_url, api_key="wrong", max_retries=0
    ) as m:
        with pytest.raises(
            so.ModelError, match=r"HTTP 401: authentication_error: .*API key"
        ) as info:
            await m.complete(request())
    assert isinstance(info.value.__cause__, anthropic.AuthenticationError)


async def test_connection_refused_and_timeouts_are_model_errors(fake) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with so.models.Anthropic(
        "c", base_url=f"http://127.0.0.1:{port}", api_key=API_KEY, max_retries=0
    ) as m:
        with pytest.raises(so.ModelError, match="cannot connect") as info:
            await m.complete(request())
    assert isinstance(info.value.__cause__, anthropic.APIConnectionError)

    def slow(got: Received) -> Reply:
        time.sleep(1.0)
        return Reply(anthropic_message("late"))

    fake.queue(slow)
    async with so.models.Anthropic(
        "c", base_url=fake.base_url, api_key=API_KEY, max_retries=0, timeout=0.2
    ) as m:
        with pytest.raises(so.ModelError, match="timed out") as timed_out:
            await m.complete(request())
    assert isinstance(timed_out.value.__cause__, anthropic.APITimeoutError)


async def test_a_long_retry_after_is_not_waited_for_longer_than_the_call_may_take(fake) -> None:
    # The SDK waits as long as Retry-After says (up to 49 days): an overloaded API holding the
    # turn, and its session, for an hour. The call gives up at its bound, retryably.
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
    fake.queue(Reply(overloaded, 529, {"retry-after": "3600"}), anthropic_message("late"))
    async with so.models.Anthropic(
        "claude-haiku-4-5", base_url=fake.base_url, api_key=API_KEY, max_retries=1, timeout=0.3
    ) as m:
        started = time.monotonic()
        with pytest.raises(so.ModelError, match=r"gave up after 1.5 s \(timeout=0.3, max_r"):
            await m.complete(request())
    assert time.monotonic() - started < 4
    assert len(fake.received) == 1


async def test_transient_errors_are_retried(fake) -> None:
    fast = {"retry-after-ms": "5"}
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    fake.queue(Reply(overloaded, 529, fast), anthropic_message("there"))
    async with so.models.Anthropic(
        "c", base_url=fake.base_url, api_key=API_KEY, max_retries=1
    ) as m:
        assert (await m.complete(request())).text == "there"
    assert len(fake.received) == 2


# -- construction ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_tokens": None}, "max_tokens is required"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"params": {"system": "x"}}, "params may not set system"),
        ({"params": {"stream": True}}, "params may not set stream"),
        ({"params": ["seed"]}, "params must be a mapping"),
        ({"price_per_mtok": "cheap"}, "price_per_mtok"),
        ({"max_retries": 1.5}, "max_retries"),
        ({"timeout": float("nan")}, "timeout"),  # passed `<= 0`: no bound on the call
        ({"timeout": float("inf")}, "timeout"),
    ],
)
def test_bad_arguments_are_usage_errors(kwargs, match) -> None:
    with pytest.raises(so.UsageError, match=match):
        so.models.Anthropic("claude-haiku-4-5", api_key="x", **kwargs)


async def test_a_missing_key_is_a_usage_error_unless_a_base_url_is_given(fake, monkeypatch) -> None:
    # as OpenAIChat: said when the model is made, not as an SDK complaint at every turn
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(so.UsageError, match="no API key; set ANTHROPIC_API_KEY"):
        so.models.Anthropic("claude-haiku-4-5")
    with pytest.raises(so.UsageError, match="ANTHROPIC_API_KEY"):
        so.models.from_env(env={"SIGNOFF_MODEL": "claude-haiku-4-5"})
    # a gateway on base_url may need none: the request is sent, and the fake wants a key
    async with so.models.Anthropic("claude-haiku-4-5", base_url=fake.base_url, max_retries=0) as m:
        with pytest.raises(so.ModelError, match="HTTP 401"):
            await m.complete(request())


async def test_from_env_with_env_reads_nothing_from_the_process(fake, monkeypatch) -> None:
    # ANTHROPIC_BASE_URL of the process was read by the SDK, past an explicit env=
    with FakeLLM("anthropic") as elsewhere:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", elsewhere.base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-the-process-key")
        monkeypatch.setenv("ANTHROPIC_CUSTOM_HEADERS", "X-Process: yes")
        env = {
            "SIGNOFF_MODEL": "claude-haiku-4-5",
            "ANTHROPIC_BASE_URL": fake.base_url,
            "ANTHROPIC_API_KEY": API_KEY,
            "ANTHROPIC_CUSTOM_HEADERS": "X-Given: yes",
        }
        fake.queue(anthropic_message("from the given server"))
        m = so.models.from_env(env=env)
        assert isinstance(m, so.models.Anthropic)
        try:
            assert (await m.complete(request())).text == "from the given server"
        finally:
            await m.aclose()
        # without a base URL in env, the SDK's default, not the process's
        m = so.models.from_env(env={"ANTHROPIC_API_KEY": API_KEY})
        assert isinstance(m, so.models.Anthropic)
        assert "api.anthropic.com" in str(m._clients.get().base_url)
        await m.aclose()
        # no key in env is no key, whatever the process has
        with pytest.raises(so.UsageError, match="no API key"):
            so.models.from_env(env={"SIGNOFF_MODEL": "claude-haiku-4-5"})
        assert elsewhere.received == []
    [got] = fake.received
    assert API_KEY in (got.headers.get("x-api-key"), got.headers.get("authorization", "")[7:])
    assert got.headers["x-given"] == "yes"
    assert "x-process" not in got.headers


async def test_an_auth_token_in_env_is_sent_as_a_bearer_token(fake) -> None:
    env = {"ANTHROPIC_AUTH_TOKEN": API_KEY, "ANTHROPIC_BASE_URL": fake.base_url}
    fake.queue(anthropic_message("ok"))
    async with so.models.Anthropic("claude-haiku-4-5", env=env, max_retries=0) as m:
        assert (await m.complete(request())).text == "ok"
    assert fake.received[0].headers["authorization"] == f"Bearer {API_KEY}"


def test_a_missing_sdk_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "anthropic", None)
    with pytest.raises(so.UsageError, match=r"pip install 'signoff\[anthropic\]'"):
        so.models.Anthropic("claude-haiku-4-5", api_key="x")


# -- end to end, through an agent -----------------------------------------------------------


@so.tool(approval=so.always())
async def issue_refund(order_id: str, amount: float) -> dict[str, object]:
    """Refund an order."""
    return {"refunded": amount, "order_id": order_id}


def support_agent(model: so.models.Model) -> so.Agent:
    return so.Agent(
        name="support", model=model, instructions="You help customers.", tools=[issue_refund]
    )


async def test_an_approved_tool_use_round_trips_through_the_sdk(
    fake, model, tmp_path: Path
) -> None:
    fake.queue(
        anthropic_message(
            "Refunding.", tool_use("toolu_01A", "issue_refund", {"order_id": "1042", "amount": 180})
        ),
        anthropic_message("Refunded 180."),
    )
    async with so.Runtime([support_agent(model)], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="Refund order 1042")
        assert r.status == "waiting"
        [req] = r.pending
        assert (req.tool_name, req.call_id) == ("issue_refund", "toolu_01A")
        assert len(fake.received) == 1
        r = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=req.id, approved=True)]
        )
        assert r.status == "completed" and r.text.endswith("Refunded 180.")

    first, second = fake.bodies
    assert first["system"] == "You help customers."
    [tool] = first["tools"]
    assert (tool["name"], tool["description"]) == ("issue_refund", "Refund an order.")
    assert set(tool["input_schema"]["properties"]) == {"order_id", "amount"}
    assert second["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Refund order 1042"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Refunding."},
                tool_use("toolu_01A", "issue_refund", {"order_id": "1042", "amount": 180}),
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01A",
                    "content": '{"refunded": 180.0, "order_id": "1042"}',
                }
            ],
        },
    ]


async def test_a_denial_reaches_the_model_as_an_error_result(fake, model, tmp_path: Path) -> None:
    fake.queue(
        anthropic_message(tool_use("toolu_d", "issue_refund", {"order_id": "9", "amount": 5000})),
        anthropic_message("Declined, sorry."),
    )
    async with so.Runtime([support_agent(model)], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="Refund order 9")
        r = await rt.generate(
            session_id=r.session_id,
            approvals=[so.Decision(id=r.pending[0].id, approved=False, reason="over the limit")],
        )
        assert r.status == "completed"
    [result] = fake.bodies[1]["messages"][-1]["content"]
    assert (result["type"], result["tool_use_id"], result["is_error"]) == (
        "tool_result",
        "toolu_d",
        True,
    )
    assert "over the limit" in result["content"]


async def test_a_server_error_fails_the_turn_retryably(fake, model, tmp_path: Path) -> None:
    fake.queue(Reply({"type": "error", "error": {"type": "api_error", "message": "boom"}}, 500))
    async with so.Runtime([support_agent(model)], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="hi")
        assert (r.status, r.retryable) == ("failed", True)
        assert r.error is not None and r.error["code"] == "model_error"
        assert "HTTP 500: api_error: boom" in r.error["message"]
        fake.queue(anthropic_message("Hello!"))
        r = await rt.generate(session_id=r.session_id)
        assert (r.status, r.text) == ("completed", "Hello!")


async def test_invalid_tool_input_becomes_an_error_result(fake, model, tmp_path: Path) -> None:
    fake.queue(
        anthropic_message(tool_use("toolu_x", "issue_refund", {"order_id": "1042"})),
        anthropic_message("I need the amount."),
    )
    async with so.Runtime([support_agent(model)], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="Refund order 1042")
        assert (r.status, r.pending) == ("completed", [])
    [result] = fake.bodies[1]["messages"][-1]["content"]
    assert (result["tool_use_id"], result["is_error"]) == ("toolu_x", True)
    assert "invalid input" in result["content"] and "amount" in result["content"]


@so.tool
async def lookup_order(order_id: str) -> dict[str, object]:
    """Look an order up."""
    return {"order_id": order_id, "total": 180.0}


async def test_parallel_tool_uses_come_back_as_one_user_message(
    fake: FakeLLM, model: so.models.Anthropic, tmp_path: Path
) -> None:
    fake.queue(
        anthropic_message(
            tool_use("toolu_look", "lookup_order", {"order_id": "1042"}),
            tool_use("toolu_pay", "issue_refund", {"order_id": "1042", "amount": 180}),
        ),
        anthropic_message("Done."),
    )
    agent = so.Agent(name="support", model=model, tools=[lookup_order, issue_refund])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="Refund order 1042")
        assert [p.call_id for p in r.pending] == ["toolu_pay"]  # the lookup ran meanwhile
        r = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=r.pending[0].id, approved=True)]
        )
        assert r.status == "completed"
    last = fake.bodies[1]["messages"][-1]
    assert last["role"] == "user"
    assert [(b["type"], b["tool_use_id"]) for b in last["content"]] == [
        ("tool_result", "toolu_look"),
        ("tool_result", "toolu_pay"),
    ]
    assert [b.get("is_error", False) for b in last["content"]] == [False, False]
    assert len(fake.bodies[1]["messages"]) == 3


async def test_a_call_left_open_by_a_cancelled_turn_gets_a_result_before_the_next_prompt(
    fake: FakeLLM, model: so.models.Anthropic, tmp_path: Path
) -> None:
    # A tool_use with no tool_result makes the API refuse every later request of the session.
    fake.queue(
        anthropic_message(
            tool_use("toolu_look", "lookup_order", {"order_id": "1042"}),
            tool_use("toolu_pay", "issue_refund", {"order_id": "1042", "amount": 180}),
        ),
        anthropic_message("Hello again."),
    )
    agent = so.Agent(name="support", model=model, tools=[lookup_order, issue_refund])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="Refund order 1042")
        r = await rt.cancel(r.session_id, "changed my mind")
        r = await rt.generate(session_id=r.session_id, prompt="hello")
        assert (r.status, r.error, r.text) == ("completed", None, "Hello again.")
    last = fake.bodies[1]["messages"][-1]
    assert [(b["type"], b.get("tool_use_id"), b.get("is_error")) for b in last["content"]] == [
        ("tool_result", "toolu_look", None),
        ("tool_result", "toolu_pay", True),
        ("text", None, None),
    ]
    assert '"cancelled": true' in last["content"][1]["content"]


# -- replies a real server can send that are not what the API promises ------------------------


async def test_a_tool_use_cut_off_at_max_tokens_is_a_model_error(fake, model) -> None:
    # the input of a tool_use block the limit cut is incomplete: it must never run
    body = anthropic_message("Refunding.", tool_use("toolu_1", "issue_refund", {"order_id": "10"}))
    body["stop_reason"] = "max_tokens"
    fake.queue(body)
    with pytest.raises(so.ModelError, match="cut off at max_tokens=1024 in a tool call"):
        await model.complete(request())


@pytest.mark.parametrize(
    "blocks",
    [(), ("I can't help with that.", tool_use("toolu_1", "issue_refund", {"order_id": "1"}))],
    ids=["nothing", "a tool call"],
)
async def test_a_refusal_with_no_text_or_with_a_tool_call_is_a_model_error(
    fake, model, blocks
) -> None:
    body = anthropic_message(*blocks)
    body["stop_reason"] = "refusal"
    fake.queue(body)
    with pytest.raises(so.ModelError, match="was refused"):
        await model.complete(request())


async def test_a_refusal_that_explains_itself_is_returned_as_text(fake, model) -> None:
    body = anthropic_message("I can't help with that.")
    body["stop_reason"] = "refusal"
    fake.queue(body)
    assert (await model.complete(request())).text == "I can't help with that."


async def test_a_tool_use_cut_off_by_the_context_window_is_a_model_error(fake, model) -> None:
    body = anthropic_message(tool_use("toolu_1", "issue_refund", {"order_id": "10"}))
    body["stop_reason"] = "model_context_window_exceeded"
    fake.queue(body)
    with pytest.raises(so.ModelError, match="cut off .*model_context_window_exceeded"):
        await model.complete(request())


@pytest.mark.parametrize(
    ("stop", "blocks", "match"),
    [
        ("max_tokens", [THOUGHT], r"stopped before any answer \(stop_reason max_tokens\)"),
        ("model_context_window_exceeded", [], r"\(stop_reason model_context_window_exceeded\)"),
        ("tool_use", [], r"stopped before any answer \(stop_reason tool_use\)"),
        ("pause_turn", [], r"stopped before any answer \(stop_reason pause_turn\)"),
    ],
)
async def test_a_reply_that_stopped_early_with_nothing_in_it_is_a_model_error(
    fake, model, stop, blocks, match
) -> None:
    # Thinking can spend all of max_tokens: the empty text passed for the answer.
    body = anthropic_message(*blocks)
    body["stop_reason"] = stop
    fake.queue(body)
    with pytest.raises(so.ModelError, match=match):
        await model.complete(request())


async def test_an_empty_reply_that_ended_its_turn_is_returned(fake, model) -> None:
    fake.queue(anthropic_message())
    assert (await model.complete(request())).text == ""


@pytest.mark.parametrize("odd", [[], {}, ["text"]])
async def test_a_block_type_or_stop_reason_that_is_not_text_is_ignored(fake, model, odd) -> None:
    # A list or an object there raised a bare TypeError (unhashable) from the adapter.
    body = anthropic_message("Hello", tool_use("toolu_1", "issue_refund", {"order_id": "1"}))
    body["content"].insert(0, {"type": odd, "text": "hidden"})
    body["stop_reason"] = odd
    fake.queue(body)
    response = await model.complete(request())
    assert response.text == "Hello"
    assert [(c.id, c.name) for c in response.tool_calls] == [("toolu_1", "issue_refund")]


async def test_text_cut_off_at_max_tokens_is_returned(fake, model) -> None:
    body = anthropic_message("A long answer that")
    body["stop_reason"] = "max_tokens"
    fake.queue(body)
    assert (await model.complete(request())).text == "A long answer that"


async def test_a_nan_in_a_tool_input_cannot_slip_past_an_approval_predicate(
    fake, model, tmp_path: Path
) -> None:
    ran: list[float] = []

    @so.tool(approval=lambda input: input.amount > 100)
    async def refund(order_id: str, amount: float) -> dict[str, object]:
        """Refund an order."""
        ran.append(amount)
        return {"refunded": amount}

    fake.queue(  # the fake writes NaN as Python's json does; the SDK reads it back as a float
        anthropic_message(tool_use("toolu_n", "refund", {"order_id": "1", "amount": float("nan")})),
        anthropic_message("Let me try again."),
    )
    agent = so.Agent(name="support", model=model, tools=[refund])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="Refund order 1")
        assert (r.status, r.pending) == ("completed", [])
    assert ran == []
    [result] = fake.bodies[1]["messages"][-1]["content"]
    assert (result["tool_use_id"], result["is_error"]) == ("toolu_n", True)
    assert "_unparsed_arguments" in result["content"]


@pytest.mark.parametrize(
    "body",
    [b"{not json", b"", b"[" * 100_000 + b"]" * 100_000, b'{"content": "\xff\xfe"}'],
    ids=["invalid", "empty", "too-deep", "not-utf8"],
)
async def test_a_body_that_is_not_json_is_a_model_error(fake, model, body: bytes) -> None:
    fake.queue(Reply(body))
    with pytest.raises(so.ModelError, match="returned a body that is not JSON"):
        await model.complete(request())


async def test_a_page_that_is_not_json_is_a_model_error_showing_it(fake, model) -> None:
    # A proxy's error page with status 200: the SDK hands back its text, which said only
    # "returned no content list".
    page = b"<html><body>Gateway Timeout</body></html>"
    fake.queue(Reply(page, headers={"Content-Type": "text/html"}))
    with pytest.raises(so.ModelError, match="returned a body that is not JSON") as info:
        await model.complete(request())
    assert "Gateway Timeout" in str(info.value)


async def test_a_body_cut_short_is_a_model_error_saying_so(fake, model) -> None:
    fake.queue(Reply(anthropic_message("a long answer"), cut_at=40))
    with pytest.raises(so.ModelError, match="the connection broke") as info:
        await model.complete(request())
    assert isinstance(info.value.__cause__, anthropic.APIConnectionError)


async def test_a_body_that_cannot_be_decoded_is_not_called_a_connection_failure(
    fake, model
) -> None:
    # A proxy that labels a plain body gzip: the server answered, so "cannot connect" (check
    # the address) sent people the wrong way.
    fake.queue(Reply(anthropic_message("hi"), headers={"Content-Encoding": "gzip"}))
    with pytest.raises(so.ModelError, match="the body could not be decoded") as info:
        await model.complete(request())
    assert "cannot connect" not in str(info.value)


async def test_negative_or_missing_usage_counts_nothing(fake, model) -> None:
    body = anthropic_message("x", usage={"input_tokens": -1_000_000, "output_tokens": 3})
    fake.queue(body, {**anthropic_message("y"), "usage": None})
    usage = (await model.complete(request())).usage
    assert (usage.input_tokens, usage.output_tokens) == (0, 3)
    assert usage.cost_usd == pytest.approx(3 * 5.0 / 1e6)
    usage = (await model.complete(request())).usage
    assert (usage.input_tokens, usage.output_tokens, usage.cost_usd) == (0, 0, 0.0)


async def test_absurd_usage_counts_nothing(fake, model) -> None:
    # a count past a float's range made computing the cost raise a bare OverflowError
    usage_body = {"input_tokens": 10**320, "output_tokens": 3, "cache_read_input_tokens": 2**60}
    fake.queue(anthropic_message("x", usage=usage_body))
    usage = (await model.complete(request())).usage
    assert (usage.input_tokens, usage.output_tokens) == (0, 3)
    assert usage.cost_usd == pytest.approx(3 * 5.0 / 1e6)


async def test_counts_written_as_whole_floats_are_counted(fake, model) -> None:
    # A gateway writing 120.0 had its usage counted as 0, so the session's token and cost
    # budgets were never spent (the OpenAI SDK reads such counts; Anthropic's leaves floats).
    usage_body = {"input_tokens": 120.0, "output_tokens": 30.0, "cache_read_input_tokens": 0.5}
    fake.queue(anthropic_message("x", usage=usage_body))  # type: ignore[arg-type]
    usage = (await model.complete(request())).usage
    assert (usage.input_tokens, usage.output_tokens) == (120, 30)
    assert isinstance(usage.input_tokens, int) and isinstance(usage.output_tokens, int)


async def test_a_lone_surrogate_in_the_conversation_is_sent_as_a_replacement(fake, model) -> None:
    fake.queue(anthropic_message("ok"))
    conversation: list[so.Message] = [
        so.UserMessage(text="caf\udce9"),
        so.AssistantMessage(text="bad \ud800"),
        so.UserMessage(text="go on"),
    ]
    await model.complete(request(*conversation, instructions="\udfff"))
    body = fake.bodies[0]
    assert body["system"] == "\ufffd"
    assert body["messages"][0]["content"] == [{"type": "text", "text": "caf\ufffd"}]
    assert body["messages"][1]["content"] == [{"type": "text", "text": "bad \ufffd"}]


@so.tool
async def blank() -> str:
    """Return nothing but whitespace."""
    return "\n"


async def test_blank_text_never_reaches_the_api(fake, model, tmp_path: Path) -> None:
    # The API refuses a text block of whitespace alone with a 400, so one blank user message or
    # a model's blank text before a tool_use made every later request of the session fail.
    # (A blank prompt is refused before any model sees it; a blank user message can still come
    # from a history written before that, or a custom message source.)
    fake.queue(
        anthropic_message("\n\n", tool_use("toolu_b", "blank", {})),
        anthropic_message("Nothing there."),
        anthropic_message("Still here."),
    )
    agent = so.Agent(name="support", model=model, tools=[blank])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="look")
        assert (r.status, r.error) == ("completed", None)
        assert r.text.endswith("Nothing there.")
    assert fake.bodies[1]["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "look"}]},
        {"role": "assistant", "content": [tool_use("toolu_b", "blank", {})]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_b"}]},
    ]
    assert (await model.complete(request(so.UserMessage(text="  ")))).text == "Still here."
    assert fake.bodies[2]["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "(empty message)"}]},
    ]


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
