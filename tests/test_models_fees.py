"""What a model call costs beyond its tokens' list price, through the real SDKs against loopback
fakes: Anthropic's web searches (`usage.server_tool_use.web_search_requests`, $10 per 1,000 by
default, `web_search_price_per_1k=`), and a gateway's own bill (OpenRouter's `usage.cost`), used
in place of the computed price and recorded as such (`cost_reported`). The budget tests run on
both stores."""

from __future__ import annotations

import math
from typing import Any

import pytest

import signoff as so
from signoff.testing import ExecutionLog

from ._models import request
from .fakes.llm import API_KEY, FakeLLM, anthropic_message, openai_completion, openai_tool_call

ALICE = so.Principal(authenticator="test", principal_id="alice")


def searched(n: int, text: str = "Found it.") -> dict[str, Any]:
    """A messages-API reply after `n` web searches of the server tool."""
    usage = {
        "input_tokens": 1000,
        "output_tokens": 100,
        "server_tool_use": {"web_search_requests": n},
    }
    return anthropic_message(text, usage=usage)


async def test_anthropic_web_searches_cost_their_price() -> None:
    """Three searches cost $0.03 beside the tokens (before, nothing: $0.0045, not $0.0345), at
    `web_search_price_per_1k` when given, and are counted for a model of no known token price."""
    with FakeLLM("anthropic") as fake:
        fake.queue(searched(3), searched(3), searched(3), searched(0))
        tokens = (1000 * 3.0 + 100 * 15.0) / 1e6
        for price, expected in (
            ({}, tokens + 0.03),
            ({"web_search_price_per_1k": 25}, tokens + 0.075),
            ({"price_per_mtok": None}, 0.03),  # "m" has no list price: the searches still cost
            ({}, tokens),
        ):
            args: dict[str, Any] = {"price_per_mtok": (3.0, 15.0), **price}
            async with so.models.Anthropic(
                "m", base_url=fake.base_url, api_key=API_KEY, max_retries=0, **args
            ) as m:
                r = await m.complete(request())
            assert r.usage.cost_usd == pytest.approx(expected)
            assert not r.cost_reported
    assert so.models.Anthropic("m", api_key="k").web_search_price_per_1k == 10.0


@pytest.mark.parametrize("value", [-1, "10", True, math.nan, math.inf, 10**7, None])
def test_a_web_search_price_that_is_not_a_price_is_refused(value: Any) -> None:
    with pytest.raises(so.UsageError, match="web_search_price_per_1k"):
        so.models.Anthropic("m", api_key="k", web_search_price_per_1k=value)


def billed(cost: Any, **more: Any) -> dict[str, Any]:
    """An OpenRouter completion whose usage reports what it cost (`usage.cost`)."""
    body = openai_completion("done", usage=(1000, 100))
    body["usage"].update(cost=cost, **more)
    return body


async def test_a_gateways_reported_cost_is_used_in_place_of_the_price() -> None:
    """OpenRouter's `usage.cost` is the call's cost (before, the price was computed from the
    tokens: $0.0045, not the $0.0042 billed), and the response says so; on a call made with the
    user's own provider key (`is_byok`) the provider's bill
    (`cost_details.upstream_inference_cost`) is added, which `cost` leaves out. A cost that is
    no plain amount is not used: the price is computed, and not said to be reported."""
    computed = (1000 * 3.0 + 100 * 15.0) / 1e6
    cases = [
        (billed(0.0042), 0.0042, True),
        (billed(0.0042, cost_details={"upstream_inference_cost": 0.0042}), 0.0042, True),
        (
            billed(0.0001, is_byok=True, cost_details={"upstream_inference_cost": 0.002}),
            0.0021,
            True,
        ),
        (billed(0), 0.0, True),  # a free model
        (billed("0.0042"), computed, False),
        (billed(-1), computed, False),
        (billed(True), computed, False),
        (billed(1e300), computed, False),
        (openai_completion("done", usage=(1000, 100)), computed, False),
    ]
    with FakeLLM("openai") as fake:
        fake.queue(*(body for body, _, _ in cases))
        async with so.models.OpenAIChat(
            "anthropic/claude-sonnet-4",
            base_url=fake.base_url,
            api_key=API_KEY,
            max_retries=0,
            price_per_mtok=(3.0, 15.0),
        ) as m:
            for _, cost, reported in cases:
                r = await m.complete(request())
                assert r.usage.cost_usd == pytest.approx(cost)
                assert r.cost_reported is reported
                assert (r.usage.input_tokens, r.usage.output_tokens) == (1000, 100)


async def test_web_searches_count_against_max_cost_usd(store_url: str) -> None:
    """Five searches ($0.05) spend the session's $0.04 though the tokens cost $0.0002: the next
    model call is not made, and the turn asks to raise the budget. Before, the searches counted
    nothing and the turn went on to its answer."""
    log = ExecutionLog()

    @log.tool
    async def lookup_order(order_id: str) -> str:
        """Look an order up."""
        return "shipped"

    call = {"type": "tool_use", "id": "toolu_1", "name": "lookup_order", "input": {"order_id": "1"}}
    first = anthropic_message(
        "Searching.",
        call,
        usage={
            "input_tokens": 100,
            "output_tokens": 20,
            "server_tool_use": {"web_search_requests": 5},
        },
    )
    with FakeLLM("anthropic") as fake:
        fake.queue(first, anthropic_message("It shipped."))
        model = so.models.Anthropic(
            "m", base_url=fake.base_url, api_key=API_KEY, max_retries=0, price_per_mtok=(1.0, 5.0)
        )
        agent = so.Agent(
            name="support",
            model=model,
            tools=[lookup_order],
            limits=so.Limits(max_cost_usd=0.04),
        )
        async with so.Runtime([agent], store=store_url) as rt:
            r = await rt.generate("support", prompt="where is order 1?", auth=ALICE)
            assert r.status == "waiting"
            [limit] = r.pending
            assert limit.kind == "session-limit"
            spent = (await rt.state(r.session_id)).usage.cost_usd
        await model.aclose()
    assert spent == pytest.approx(0.05 + (100 * 1.0 + 20 * 5.0) / 1e6)
    assert log.count() == 1 and len(fake.received) == 1


async def test_a_reported_cost_counts_and_is_recorded_as_reported(store_url: str) -> None:
    """A gateway that bills $0.03 for a call the list price puts at $0.0045 spends the session's
    $0.02: the turn asks to raise it, and `model.completed` records the cost as reported (a
    computed one is not marked). Before, the session counted $0.0045 and went on."""
    log = ExecutionLog()

    @log.tool
    async def lookup_order(order_id: str) -> str:
        """Look an order up."""
        return "shipped"

    first = openai_completion(
        None, [openai_tool_call("call_1", "lookup_order", {"order_id": "1"})], usage=(1000, 100)
    )
    first["usage"]["cost"] = 0.03
    with FakeLLM("openai") as fake:
        fake.queue(first, openai_completion("It shipped."))
        model = so.models.OpenAIChat(
            "anthropic/claude-sonnet-4",
            base_url=fake.base_url,
            api_key=API_KEY,
            max_retries=0,
            price_per_mtok=(3.0, 15.0),
        )
        agent = so.Agent(
            name="support", model=model, tools=[lookup_order], limits=so.Limits(max_cost_usd=0.02)
        )
        async with so.Runtime([agent], store=store_url) as rt:
            r = await rt.generate("support", prompt="where is order 1?", auth=ALICE)
            assert r.status == "waiting"
            [limit] = r.pending
            assert limit.kind == "session-limit"
            assert (await rt.state(r.session_id)).usage.cost_usd == pytest.approx(0.03)
            events = [e async for e in rt.events(r.session_id, 0, follow=False)]
            [completed] = [e for e in events if e.type == "model.completed"]
            assert completed.data["cost_reported"] is True
            assert completed.data["usage"]["cost_usd"] == pytest.approx(0.03)
            await rt.respond(
                r.session_id,
                [so.InputResponse(request_id=limit.id, option_id="continue")],
                principal=ALICE,
            )
            events = [e async for e in rt.events(r.session_id, 0, follow=False)]
            last = [e for e in events if e.type == "model.completed"][-1]
            assert last.data["text"] == "It shipped." and "cost_reported" not in last.data
        await model.aclose()
