"""`Anthropic` when the server fails or answers what the API does not promise: errors, timeouts,
retries, cut-off and refused replies, bodies that are not JSON, absurd usage counts."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import anthropic
import httpx
import pytest

import signoff as so
from signoff.models import _provider

from ._models import request, support_agent
from ._models_anthropic import THOUGHT, fake, model, tool_use
from .fakes.llm import (
    API_KEY,
    Received,
    Reply,
    anthropic_message,
)

__all__ = ["fake", "model"]  # the fixtures, used by name


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


async def test_connection_refused_and_timeouts_are_model_errors(
    fake, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with so.models.Anthropic(
        "c", base_url=f"http://127.0.0.1:{port}", api_key=API_KEY, max_retries=0
    ) as m:
        with pytest.raises(so.ModelError, match="cannot connect") as info:
            await m.complete(request())
    assert isinstance(info.value.__cause__, anthropic.APIConnectionError)

    # The SDK's own timeout, alone: the reply is held until the call has failed, and the call's
    # bound (twice the timeout, from the call's start) is off. On a loaded machine the loop
    # stalled past both between the call's start and its request going out, and the bound won:
    # "gave up after 0.4 s" (the bound is tested below, where the SDK waits on).
    monkeypatch.setattr(_provider, "call_bound", lambda client, params=None: None)
    failed = threading.Event()

    def held(got: Received) -> Reply:
        failed.wait(10)
        return Reply(anthropic_message("late"))

    fake.queue(held)
    async with so.models.Anthropic(
        "c", base_url=fake.base_url, api_key=API_KEY, max_retries=0, timeout=0.2
    ) as m:
        try:
            with pytest.raises(so.ModelError, match="timed out") as timed_out:
                await m.complete(request())
        finally:
            failed.set()
    assert isinstance(timed_out.value.__cause__, anthropic.APITimeoutError)


async def test_a_long_retry_after_is_not_waited_for_longer_than_the_call_may_take(
    fake, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The SDK waits as long as Retry-After says (up to 49 days; a wait past 120 s is not made at
    # all, test_models_retry_after.py): an overloaded API holding the turn, and its session,
    # for minutes. The call gives up at its bound, retryably.
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
    fake.queue(Reply(overloaded, 529, {"retry-after": "100"}), anthropic_message("late"))
    # The bound alone: the SDK's read timeout (60 s here) cannot end the first attempt, as at
    # 0.3 s it did when a loaded machine held the fake's thread (the SDK retried, and the second
    # reply came back). The bound is the one of timeout=0.3, max_retries=1.
    monkeypatch.setattr(_provider, "call_bound", lambda client, params=None: 1.5)
    async with so.models.Anthropic(
        "claude-haiku-4-5", base_url=fake.base_url, api_key=API_KEY, max_retries=1, timeout=60
    ) as m:
        started = time.monotonic()
        with pytest.raises(so.ModelError, match=r"gave up after 1.5 s \(timeout=60, max_r"):
            await m.complete(request())
    assert time.monotonic() - started < 10  # it gives up at 1.5 s, not the 100 s it was asked
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


@pytest.mark.parametrize(
    ("stop", "blocks"),
    [
        ("refusal", []),
        ("max_tokens", [tool_use("toolu_1", "issue_refund", {"order_id": "1"})]),
        ("max_tokens", [THOUGHT]),
        ("end_turn", [{"type": "tool_use", "id": "toolu_1", "input": {}}]),
    ],
    ids=["refused", "cut-call", "thought-only", "nameless-call"],
)
async def test_a_reply_refused_after_it_was_billed_carries_its_usage(
    fake, model, stop, blocks
) -> None:
    # The provider generated (and billed) this reply: the turn it fails counts what it cost.
    usage = {
        "input_tokens": 1000,
        "cache_creation_input_tokens": 200,
        "cache_read_input_tokens": 3000,
        "output_tokens": 800,
    }
    body = anthropic_message(*blocks, usage=usage)
    body["stop_reason"] = stop
    fake.queue(body)
    with pytest.raises(so.ModelError) as info:
        await model.complete(request())
    # claude-haiku-4-5's list price ($1 / $5), cache writes at 1.25x and reads at 0.1x
    cost = (1000 * 1.0 + 200 * 1.0 * 1.25 + 3000 * 1.0 * 0.1 + 800 * 5.0) / 1_000_000
    assert info.value.usage == so.Usage(input_tokens=4200, output_tokens=800, cost_usd=cost)


async def test_a_call_that_got_no_reply_carries_no_usage(fake, model) -> None:
    fake.queue(Reply({"type": "error", "error": {"type": "api_error", "message": "boom"}}, 500))
    with pytest.raises(so.ModelError) as info:
        await model.complete(request())
    assert info.value.usage is None


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


@pytest.mark.parametrize(
    ("block", "said"),
    [
        ("Hello", "a content block that is not an object: str"),
        (None, "a content block that is not an object: NoneType"),
        (["Hello"], "a content block that is not an object: list"),
        ({"type": "text", "text": ["Hello"]}, "a text block whose text is not text: list"),
        ({"type": "text"}, "a text block whose text is not text: NoneType"),
    ],
)
async def test_a_content_block_of_the_wrong_shape_is_a_model_error(
    fake, model, block, said
) -> None:
    # Skipped, it passed for an empty answer that ended the turn, saying nothing of why.
    body = anthropic_message()
    body["content"] = [block]
    fake.queue(body)
    with pytest.raises(so.ModelError, match=said) as info:
        await model.complete(request())
    assert info.value.usage == so.Usage(input_tokens=10, output_tokens=5, cost_usd=0.000035)


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
    assert '"type": "json_invalid"' in result["content"]
    assert "_unparsed" not in result["content"]


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
    fake.queue(anthropic_message("x", usage=usage_body))
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


@pytest.mark.parametrize("setting", ["ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"])
async def test_a_server_echoing_the_key_does_not_get_it_recorded(
    fake, tmp_path: Path, setting: str
) -> None:
    # A server or gateway that echoes the credential it was sent in its error had it stored in
    # the turn's failure, which anyone who may read the session reads (and the dashboard shows).
    body = {"type": "error", "error": {"type": "authentication_error", "message": API_KEY}}
    fake.queue(Reply(body, 401))
    env = {setting: API_KEY, "ANTHROPIC_BASE_URL": fake.base_url}
    model = so.models.Anthropic("claude-haiku-4-5", env=env, max_retries=0)
    async with model, so.Runtime([support_agent(model)], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="hi")
        assert (r.status, r.retryable) == ("failed", True)
        assert r.error is not None
        assert "HTTP 401: authentication_error: [redacted]" in r.error["message"]
        logged = json.dumps([e.data for e in await rt.store.read_events(r.session_id)])
    assert API_KEY not in logged


def test_the_bound_of_a_call() -> None:
    """Twice the timeout per attempt and the timeout per wait between two: what the calls above
    give up at (timeout=0.3: 0.6 s with no retry, 1.5 s with one), for any form of timeout."""
    assert _provider.call_bound(SimpleNamespace(timeout=0.3, max_retries=0)) == pytest.approx(0.6)
    assert _provider.call_bound(SimpleNamespace(timeout=0.3, max_retries=1)) == pytest.approx(1.5)
    timeout = httpx.Timeout(0.3, read=2.0)
    assert _provider.call_bound(SimpleNamespace(timeout=timeout, max_retries=0)) == 4.0
    assert _provider.call_bound(SimpleNamespace(timeout=None, max_retries=0)) is None
    # The SDK call's own timeout (`params`) in place of the client's; a wait left unbounded
    # (None, or a part of a Timeout None) leaves the call unbounded.
    client = SimpleNamespace(timeout=60.0, max_retries=0)
    assert _provider.call_bound(client, {"timeout": 0.3}) == pytest.approx(0.6)
    assert _provider.call_bound(client, {"timeout": None}) is None
    assert _provider.call_bound(client, {"seed": 1}) == 120.0
    unbounded = httpx.Timeout(None, connect=5.0)
    assert _provider.call_bound(SimpleNamespace(timeout=unbounded, max_retries=2)) is None
