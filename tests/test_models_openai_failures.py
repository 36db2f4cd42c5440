"""`OpenAIChat` when the server fails or answers what the API does not promise: HTTP errors,
timeouts, retries, cut-off and filtered replies, bodies that are not JSON, absurd numbers."""

from __future__ import annotations

import json
import socket
import threading
import time
import traceback
from pathlib import Path

import openai
import pytest

import signoff as so
from signoff.models import _provider

from ._models import request, support_agent
from ._models_openai import fake, model
from .fakes.llm import API_KEY, Received, Reply, openai_completion, openai_tool_call

__all__ = ["fake", "model"]  # the fixtures, used by name


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


async def test_a_slow_server_times_out_as_a_model_error(
    fake, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The SDK's own timeout, alone: the reply is held until the call has failed, and the call's
    # bound (twice the timeout, from the call's start) is off. On a loaded machine the loop
    # stalled past both between the call's start and its request going out, and the bound won:
    # "gave up after 0.4 s" (the bound is tested below, where the SDK reads on).
    monkeypatch.setattr(_provider, "call_bound", lambda client, params=None: None)
    failed = threading.Event()

    def held(got: Received) -> Reply:
        failed.wait(10)
        return Reply(openai_completion("late"))

    fake.queue(held)
    async with so.models.OpenAIChat(
        "m", base_url=fake.base_url, api_key=API_KEY, max_retries=0, timeout=0.2
    ) as m:
        try:
            with pytest.raises(so.ModelError, match="timed out") as info:
                await m.complete(request())
        finally:
            failed.set()
    assert isinstance(info.value.__cause__, openai.APITimeoutError)


async def test_a_server_that_trickles_its_answer_times_out_as_a_model_error(
    fake, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each byte comes in time for the SDK's read timeout, so without a bound on the whole call
    # the turn (and its session's lease) was held for as long as the server kept trickling.
    # The bound alone: the SDK's read timeout (60 s here) cannot end the call first, as at
    # 0.3 s it did when a loaded machine held the fake's thread between two bytes ("timed out").
    # The bound is the one of timeout=0.3, max_retries=0 (test_the_bound_of_a_call).
    monkeypatch.setattr(_provider, "call_bound", lambda client, params=None: 0.6)
    fake.queue(Reply(openai_completion("late " * 200), trickle=0.05))
    async with so.models.OpenAIChat(
        "m", base_url=fake.base_url, api_key=API_KEY, max_retries=0, timeout=60
    ) as m:
        started = time.monotonic()
        with pytest.raises(so.ModelError, match=r"gave up after 0.6 s \(timeout=60, max_retr"):
            await m.complete(request())
    # The call gives up at 0.6 s; the trickle would take 50 s and more (a byte each 0.05 s).
    assert time.monotonic() - started < 10


async def test_a_read_timeout_turned_off_or_raised_per_call_leaves_the_call_unbounded(
    fake,
) -> None:
    """The bound on a whole call came from the client's timeout alone: a read timeout turned
    off (`openai.Timeout(None, connect=...)`) was bounded by its connect timeout, and a longer
    `params={"timeout": ...}` (the SDK call's own) by the model's; both gave up on a reply the
    SDK would have waited for (here after 4 s, past the old bound of 2 x 2 s), blaming the
    server. (`test_the_bound_of_a_call` checks the bound itself.)"""

    def slow(got: Received) -> Reply:
        time.sleep(4.5)
        return Reply(openai_completion("late"))

    unbounded = openai.AsyncOpenAI(
        base_url=fake.base_url,
        api_key=API_KEY,
        max_retries=0,
        timeout=openai.Timeout(None, connect=2.0),
    )
    fake.queue(slow)
    async with so.models.OpenAIChat("m", client=unbounded) as m:
        assert (await m.complete(request())).text == "late"
    await unbounded.close()
    fake.queue(slow)
    async with so.models.OpenAIChat(
        "m",
        base_url=fake.base_url,
        api_key=API_KEY,
        max_retries=0,
        timeout=2.0,
        params={"timeout": 60.0},
    ) as m:
        assert (await m.complete(request())).text == "late"


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


@pytest.mark.parametrize(
    ("reply", "said"),
    [
        (
            Reply(
                b"<html><head><title>413 Request Entity Too Large</title><style>body{x:1}"
                b"</style></head><body><h1>413 Request Entity Too Large</h1><hr>nginx</body>"
                b"</html>",
                413,
                {"Content-Type": "text/html"},
            ),
            "HTTP 413: 413 Request Entity Too Large 413 Request Entity Too Large nginx",
        ),
        (
            Reply(b"upstream connect error", 502, {"Content-Type": "text/plain"}),
            "HTTP 502: upstream connect error",
        ),
        (Reply({"detail": "Not Found"}, 404), "HTTP 404: Not Found (check the model name"),
        (
            Reply({"detail": [{"loc": ["body", "model"], "msg": "field required"}]}, 422),
            'HTTP 422: {"detail": [{"loc": ["body", "model"], "msg": "field required"}]}',
        ),
    ],
    ids=["html-page", "plain-text", "fastapi-detail", "fastapi-422"],
)
async def test_an_error_body_of_another_shape_is_shown(
    fake, model, reply: Reply, said: str
) -> None:
    # The openai SDK names only the status ("Error code: 413") unless the body is
    # {"error": {"message": ...}}: what a proxy's page or a FastAPI-based server said was lost.
    fake.queue(reply)
    with pytest.raises(so.ModelError) as info:
        await model.complete(request())
    assert said in str(info.value)
    assert "Error code" not in str(info.value)


async def test_client_errors_are_not_retried(fake) -> None:
    fake.queue(Reply({"error": {"message": "bad tools", "type": "invalid_request_error"}}, 400))
    async with so.models.OpenAIChat(
        "m", base_url=fake.base_url, api_key=API_KEY, max_retries=2
    ) as m:
        with pytest.raises(so.ModelError, match="HTTP 400: invalid_request_error: bad tools"):
            await m.complete(request())
    assert len(fake.received) == 1


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


async def test_a_reply_cut_at_the_context_length_as_mistral_says_it_is_never_whole(
    fake, model
) -> None:
    # Mistral's API ends a reply cut at the model's context length with finish_reason
    # "model_length": its half answer passed for a whole one, and its half call ran.
    cut_text = openai_completion("The refund of order 1042 is")
    cut_call = openai_completion(
        None, [openai_tool_call("call_1", "issue_refund", '{"order_id": "1042", "am')]
    )
    nothing = openai_completion("")
    for body in (cut_text, cut_call, nothing):
        body["choices"][0]["finish_reason"] = "model_length"
    fake.queue(cut_text, cut_call, nothing)
    r = await model.complete(request())
    assert (r.text, r.cut_off) == ("The refund of order 1042 is", "max_tokens")
    with pytest.raises(so.ModelError, match=r"context length in a tool call \(finish_reason mod"):
        await model.complete(request())
    with pytest.raises(so.ModelError, match=r"context length before any answer"):
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


@pytest.mark.parametrize(
    ("finish", "text", "calls"),
    [
        ("length", None, [openai_tool_call("call_1", "issue_refund", '{"order_id": "1')]),
        ("length", "", None),
        ("content_filter", None, None),
        ("error", "The refund is", None),
        ("stop", None, [{"id": "call_1", "type": "function", "function": {"arguments": "{}"}}]),
    ],
    ids=["cut-call", "cut-before-answer", "filtered", "error", "nameless-call"],
)
async def test_a_reply_refused_after_it_was_billed_carries_its_usage(
    fake, model, finish, text, calls
) -> None:
    # The provider generated (and billed) this reply: the turn it fails counts what it cost.
    body = openai_completion(text, calls, usage=(1200, 800))
    body["choices"][0]["finish_reason"] = finish
    fake.queue(body)
    with pytest.raises(so.ModelError) as info:
        await model.complete(request())
    cost = (1200 * 0.40 + 800 * 1.60) / 1_000_000  # gpt-4.1-mini's list price
    assert info.value.usage == so.Usage(input_tokens=1200, output_tokens=800, cost_usd=cost)


async def test_a_call_that_got_no_reply_carries_no_usage(fake, model) -> None:
    fake.queue(Reply({"error": {"message": "upstream exploded"}}, 500), Reply(b"<html>", 200))
    for _ in range(2):
        with pytest.raises(so.ModelError) as info:
            await model.complete(request())
        assert info.value.usage is None


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
        # So did content that is neither text nor a list of parts, or parts of the wrong shape.
        ("content", 5, "content that is neither text nor a list of parts: int"),
        ("content", {"text": "hello"}, "content that is neither text nor a list of parts: dict"),
        ("content", ["hello"], "a content part that is not an object: str"),
        ("content", [{"type": "text", "text": 5}], "a text part whose text is not text: int"),
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


async def test_content_parts_are_read_as_their_text(fake, model) -> None:
    body = openai_completion(None)
    parts = [
        {"type": "text", "text": "Hello"},
        {"type": "image_url", "text": None},
        {"type": "text", "text": "!"},
    ]
    body["choices"][0]["message"]["content"] = parts
    fake.queue(body)
    assert (await model.complete(request())).text == "Hello!"


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


@so.tool
async def search(query: str = "", limit: int = 10) -> list[str]:
    """Search the catalogue."""
    return []


def test_arguments_passed_on_unparsed_are_one_error_saying_they_could_not_be_read() -> None:
    """Validated as input, they told the model only that `_unparsed_arguments`, a parameter it
    never sent, is not permitted (a tool whose parameters are all optional), or that the
    parameters it sent are missing."""
    import pydantic

    with pytest.raises(pydantic.ValidationError) as info:
        search.validate({"_unparsed_arguments": '{"query": "coffee grin'})
    [error] = info.value.errors(include_url=False)
    assert (error["type"], error["loc"]) == ("json_invalid", ())
    assert "could not be read as a JSON object" in error["msg"]


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
    sent = assistant["tool_calls"][0]["function"]["arguments"]
    assert json.loads(sent) == {"_unparsed_arguments": raw}  # a JSON object, what it wrote in it
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
    sent = assistant["tool_calls"][0]["function"]["arguments"]
    assert json.loads(sent) == {"_unparsed_arguments": raw}  # a JSON object, what it wrote in it
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


GATEWAY_TOKEN = "gw-token-5f1c9e2a7b"


@pytest.mark.parametrize(
    "reply",
    [
        Reply({"error": {"message": f"Incorrect API key provided: {API_KEY}"}}, 401),
        Reply({"error": {"message": f"key {API_KEY} is over its quota"}}),  # a 200
        Reply({"error": {"message": f"no route for token {GATEWAY_TOKEN}"}}, 403),
    ],
    ids=["401", "200-error", "gateway-header"],
)
async def test_a_server_echoing_the_key_does_not_get_it_recorded(
    fake, tmp_path: Path, reply: Reply
) -> None:
    # A server or gateway that echoes the credential it was sent in its error had it stored in
    # the turn's failure, which anyone who may read the session reads (and the dashboard shows).
    fake.queue(reply)
    env = {
        "OPENAI_API_KEY": API_KEY,
        "OPENAI_BASE_URL": fake.base_url,
        "OPENAI_CUSTOM_HEADERS": f"cf-aig-authorization: Bearer {GATEWAY_TOKEN}",
    }
    model = so.models.OpenAIChat("gpt-4.1-mini", env=env, max_retries=0)
    async with model, so.Runtime([support_agent(model)], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="hi")
        assert (r.status, r.retryable) == ("failed", True)
        assert r.error is not None and "[redacted]" in r.error["message"]
        logged = json.dumps([e.data for e in await rt.store.read_events(r.session_id)])
    assert fake.received[0].headers["cf-aig-authorization"] == f"Bearer {GATEWAY_TOKEN}"
    assert API_KEY not in logged and GATEWAY_TOKEN not in logged


async def test_the_key_echoed_is_in_no_message_of_the_errors_traceback(fake, model) -> None:
    # A trace with content on records the stack, and a logged error its traceback: both show
    # the SDK's error the ModelError was raised from, which quotes the server.
    fake.queue(Reply({"error": {"message": f"Incorrect API key provided: {API_KEY}"}}, 401))
    with pytest.raises(so.ModelError) as info:
        await model.complete(request())
    assert isinstance(info.value.__cause__, openai.AuthenticationError)
    shown = "".join(traceback.format_exception(info.value))
    assert "Incorrect API key provided: [redacted]" in shown and API_KEY not in shown
