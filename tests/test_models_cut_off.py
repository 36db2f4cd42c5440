"""A reply the provider stopped short (its output limit, a content filter, a refusal) is marked:
its partial text ends the turn with `cut_off` on `model.completed` and on the result, and none of
its tool calls runs, for both adapters, `Scripted` and a model of one's own alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

import signoff as so
from signoff.server._models import turn_result
from signoff.testing import ExecutionLog, call, call_tools

from .fakes.llm import API_KEY, FakeLLM, anthropic_message, openai_completion, openai_tool_call

ALICE = so.Principal(authenticator="test", principal_id="alice")

log = ExecutionLog()


@log.tool
async def lookup_order(order_id: str) -> dict[str, object]:
    """Look an order up."""
    return {"order_id": order_id}


def stopped(body: dict[str, Any], flavor: str, reason: str) -> dict[str, Any]:
    if flavor == "openai":
        body["choices"][0]["finish_reason"] = reason
    else:
        body["stop_reason"] = reason
    return body


def provider_model(flavor: str, fake: FakeLLM) -> Any:
    kind = so.models.OpenAIChat if flavor == "openai" else so.models.Anthropic
    return kind("m", base_url=fake.base_url, api_key=API_KEY, max_retries=0, max_tokens=16)


def text_reply(flavor: str, text: str) -> dict[str, Any]:
    if flavor == "openai":
        return openai_completion(text, usage=(20, 16))
    return anthropic_message(text, usage={"input_tokens": 20, "output_tokens": 16})


async def model_events(rt: so.Runtime, session_id: str) -> list[so.Event]:
    return [e async for e in rt.events(session_id, follow=False) if e.type == "model.completed"]


@pytest.mark.parametrize(
    ("flavor", "reason", "cut"),
    [
        ("openai", "length", "max_tokens"),
        ("openai", "content_filter", "content_filter"),
        ("anthropic", "max_tokens", "max_tokens"),
        ("anthropic", "model_context_window_exceeded", "max_tokens"),
        ("anthropic", "refusal", "content_filter"),
    ],
)
async def test_a_text_answer_cut_short_is_marked_in_the_event_and_the_result(
    store_url: str, flavor: str, reason: str, cut: str
) -> None:
    """Before, 'The refund policy says you' passed for the whole answer: nothing in the events
    or the result told it from one the model finished. The next turn's complete answer clears
    the mark; a new process reading the log sees the same."""
    with FakeLLM(flavor, strict=True) as fake:
        fake.queue(
            stopped(text_reply(flavor, "The refund policy says you"), flavor, reason),
            text_reply(flavor, "Refunds take 5 days."),
        )
        model = provider_model(flavor, fake)
        agent = so.Agent(name="a", model=model)
        async with so.Runtime([agent], store=store_url) as rt:
            r = await rt.generate("a", prompt="refund policy?", auth=ALICE)
            assert (r.status, r.text, r.cut_off) == ("completed", "The refund policy says you", cut)
            assert turn_result(r).cut_off == cut
        async with so.Runtime([agent], store=store_url) as rt:  # another process
            [e] = await model_events(rt, r.session_id)
            assert e.data["cut_off"] == cut
            state = await rt.state(r.session_id)
            assert state.turn is not None and state.turn.cut_off == cut
            assert state.usage == so.Usage(input_tokens=20, output_tokens=16)
            r = await rt.generate(session_id=r.session_id, prompt="and?", auth=ALICE)
            assert (r.status, r.text, r.cut_off) == ("completed", "Refunds take 5 days.", None)
            assert "cut_off" not in (await model_events(rt, r.session_id))[-1].data
        await model.aclose()


async def test_an_anthropic_reply_cut_after_a_whole_tool_call_runs_none(store_url: str) -> None:
    """A tool_use block followed by text the limit cut: the call itself came whole, but the
    reply did not (before, the call ran). The turn fails retryably, counting what it cost."""
    log.clear()
    with FakeLLM("anthropic", strict=True) as fake:
        use = {"type": "tool_use", "id": "toolu_1", "name": "lookup_order"}
        fake.queue(
            stopped(
                anthropic_message(
                    {**use, "input": {"order_id": "7"}},
                    "and then I will",
                    usage={"input_tokens": 30, "output_tokens": 16},
                ),
                "anthropic",
                "max_tokens",
            )
        )
        model = provider_model("anthropic", fake)
        agent = so.Agent(name="a", model=model, tools=[lookup_order])
        async with so.Runtime([agent], store=store_url) as rt:
            r = await rt.generate("a", prompt="order 7?", auth=ALICE)
            assert (r.status, r.retryable) == ("failed", True)
            assert r.error is not None and r.error["message"] == (
                "ModelError: the model's reply was cut off (max_tokens) with 1 tool call(s): none "
                "is run"
            )
            assert await model_events(rt, r.session_id) == []
            assert (await rt.state(r.session_id)).usage.total_tokens == 46
        await model.aclose()
    assert log.count("lookup_order") == 0


@pytest.mark.parametrize("cut", ["max_tokens", "content_filter"])
async def test_a_scripted_or_own_reply_cut_short_runs_no_call(store_url: str, cut: Any) -> None:
    """`Scripted` (and any model of one's own) marks a reply with `cut_off`, as the adapters
    do: its calls never run; text alone ends the turn marked."""
    log.clear()
    usage = so.Usage(input_tokens=5, output_tokens=7)
    halted = call_tools(call("lookup_order", order_id="1"), usage=usage).model_copy(
        update={"cut_off": cut}
    )
    partial = so.ModelResponse(text="Half an ans", cut_off=cut)
    agents = [
        so.Agent(name="a", model=so.models.Scripted([halted]), tools=[lookup_order]),
        so.Agent(name="b", model=so.models.Scripted([partial]), tools=[lookup_order]),
    ]
    async with so.Runtime(agents, store=store_url) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        assert (r.status, r.retryable) == ("failed", True)
        assert r.error is not None and "none is run" in r.error["message"]
        assert (await rt.state(r.session_id)).usage == usage
        r = await rt.generate("b", prompt="go", auth=ALICE)
        assert (r.status, r.text, r.cut_off) == ("completed", "Half an ans", cut)
    assert log.count("lookup_order") == 0


async def test_a_cut_off_value_that_is_not_one_fails_the_step(store_url: str) -> None:
    odd = so.ModelResponse.model_construct(
        text="x", tool_calls=[], usage=so.Usage(), reasoning=[], cut_off=cast(Any, "tired")
    )
    agent = so.Agent(name="a", model=so.models.Scripted([odd]))
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        assert r.status == "failed"
        assert r.error is not None and "cut_off is 'tired'" in r.error["message"]


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
async def test_a_reply_that_ended_on_its_own_is_not_marked(flavor: str) -> None:
    with FakeLLM(flavor) as fake:
        if flavor == "openai":
            lookup = openai_tool_call("call_1", "lookup_order", {"order_id": "7"})
            fake.queue(openai_completion("ok"), openai_completion(None, [lookup]))
        else:
            use = {"type": "tool_use", "id": "t", "name": "lookup_order", "input": {}}
            fake.queue(anthropic_message("ok"), anthropic_message(use))
        async with provider_model(flavor, fake) as model:
            from ._models import request

            for _ in range(2):
                assert (await model.complete(request())).cut_off is None


@pytest.mark.parametrize(
    ("flavor", "reason", "why"),
    [
        ("openai", "content_filter", "was filtered (finish_reason content_filter)"),
        ("anthropic", "refusal", "was refused (stop_reason refusal)"),
    ],
)
async def test_a_filtered_reply_of_blank_text_fails_its_turn(
    tmp_path: Path, flavor: str, reason: str, why: str
) -> None:
    """A refused or filtered reply whose text is only whitespace has nothing usable in it, as a
    reply cut at the token limit with blank text does; it ended the turn as the answer."""
    with FakeLLM(flavor, strict=True) as fake:
        fake.queue(stopped(text_reply(flavor, " \n"), flavor, reason))
        model = provider_model(flavor, fake)
        agent = so.Agent(name="a", model=model)
        async with model, so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db") as rt:
            r = await rt.generate("a", prompt="refund policy?", auth=ALICE)
            assert (r.status, r.retryable, r.cut_off) == ("failed", True, None)
            assert r.error is not None and why in r.error["message"]
            assert await model_events(rt, r.session_id) == []
            assert (await rt.state(r.session_id)).usage.total_tokens == 36


async def test_an_openai_refusal_beside_blank_content_is_the_text() -> None:
    """Blank content beside the refusal the API sent: the refusal is what the model said."""
    with FakeLLM("openai") as fake:
        body = stopped(text_reply("openai", "  "), "openai", "content_filter")
        body["choices"][0]["message"]["refusal"] = "I can't help with that."
        fake.queue(body)
        async with provider_model("openai", fake) as model:
            from ._models import request

            response = await model.complete(request())
    assert (response.text, response.cut_off) == ("I can't help with that.", "content_filter")


async def test_an_openai_refusal_is_marked_as_anthropics_is(store_url: str) -> None:
    """`message.refusal` (content null, finish_reason stop) is the provider's refusal, as
    Anthropic's stop_reason refusal is, which was marked `content_filter` where this one was
    not: the turn completes with the refusal as its text, marked."""
    with FakeLLM("openai", strict=True) as fake:
        body = openai_completion(None)
        body["choices"][0]["message"]["refusal"] = "I'm sorry, I can't help with that."
        fake.queue(body)
        model = provider_model("openai", fake)
        async with model, so.Runtime([so.Agent(name="a", model=model)], store=store_url) as rt:
            r = await rt.generate("a", prompt="do the bad thing", auth=ALICE)
            assert (r.status, r.text, r.cut_off) == (
                "completed",
                "I'm sorry, I can't help with that.",
                "content_filter",
            )
            [e] = await model_events(rt, r.session_id)
            assert e.data["cut_off"] == "content_filter"


@pytest.mark.parametrize("refusal", ["", " \n", None])
async def test_a_blank_openai_refusal_marks_nothing(refusal: str | None) -> None:
    with FakeLLM("openai") as fake:
        body = openai_completion("Here you go.")
        body["choices"][0]["message"]["refusal"] = refusal
        fake.queue(body)
        async with provider_model("openai", fake) as model:
            from ._models import request

            response = await model.complete(request())
    assert (response.text, response.cut_off) == ("Here you go.", None)
