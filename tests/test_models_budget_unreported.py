"""A session under a budget (`Limits.max_tokens`, `max_cost_usd`) whose model's replies report
no usage the budgets can count (none, or counts that are not whole numbers from 0): the turn
fails, retryably, saying so, instead of counting each reply as free and never spending the
budget. Without a budget such a reply still counts nothing and is used. Through the real SDKs
against loopback fakes, on both stores."""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any

import pytest

import signoff as so

from ._models import request
from .fakes.llm import API_KEY, FakeLLM, anthropic_message, openai_completion


def _unreported(flavor: str, usage: Any) -> dict[str, Any]:
    if flavor == "openai":
        body = openai_completion("Here you go.")
    else:
        body = anthropic_message("Here you go.")
    if usage is ...:
        del body["usage"]
    else:
        body["usage"] = usage
    return body


def _model(flavor: str, fake: FakeLLM) -> so.models.OpenAIChat | so.models.Anthropic:
    if flavor == "openai":
        return so.models.OpenAIChat(
            "gpt-4.1-mini", base_url=fake.base_url, api_key=API_KEY, max_retries=0
        )
    return so.models.Anthropic(
        "claude-haiku-4-5", base_url=fake.base_url, api_key=API_KEY, max_retries=0
    )


USAGES: dict[str, list[Any]] = {
    "openai": [..., None, {"prompt_tokens": 10}, {"prompt_tokens": -5, "completion_tokens": 3}],
    "anthropic": [..., None, {"input_tokens": 10}, {"input_tokens": "10", "output_tokens": 3}],
}
CASES = [(flavor, usage) for flavor, usages in USAGES.items() for usage in usages]
IDS = [f"{flavor}-{i}" for flavor, usages in USAGES.items() for i in range(len(usages))]


@pytest.mark.parametrize(("flavor", "usage"), CASES, ids=IDS)
async def test_a_budgeted_session_fails_a_reply_that_reports_no_usage(
    store_url: str, flavor: str, usage: Any
) -> None:
    """Before, the reply completed its turn counted as 0 tokens (ten replies of 4,000
    characters each on a session of max_tokens=1,000 and max_cost_usd=0.01 all completed, the
    session's usage 0): the budget was never spent, however much the model wrote."""
    with FakeLLM(flavor) as fake:
        fake.queue(*[_unreported(flavor, usage)] * 10)
        model = _model(flavor, fake)
        agent = so.Agent(name="a", model=model, limits=so.Limits(max_tokens=1_000))
        async with so.Runtime([agent], store=store_url) as rt:
            r = await rt.generate("a", prompt="hi")
            state = await rt.state(r.session_id)
            types = [e.type async for e in rt.events(r.session_id, follow=False)]
        await model.aclose()
    assert (r.status, r.retryable) == ("failed", True)
    assert r.error is not None and r.error["code"] == "model_error"
    assert "reported no usage the session's budgets can count" in r.error["message"]
    assert "model.completed" not in types
    assert state.usage == so.Usage()
    assert len(fake.received) == 1


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
async def test_without_a_budget_a_reply_that_reports_no_usage_is_used(flavor: str) -> None:
    with FakeLLM(flavor) as fake:
        fake.queue(_unreported(flavor, ...))
        async with _model(flavor, fake) as m:
            r = await m.complete(request())
    assert (r.text, r.usage) == ("Here you go.", so.Usage())


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
async def test_free_output_under_a_cost_budget_fails_a_reply_that_reports_no_usage(
    store_url: str, flavor: str
) -> None:
    """Output free, max_cost_usd the only budget: no output cap is sent, yet the session is
    budgeted. Before, the model took the missing cap for no budget and counted each reply
    as free: five turns completed at $0 on a budget of $0.01."""
    with FakeLLM(flavor) as fake:
        fake.queue(*[_unreported(flavor, ...)] * 5)
        kind = so.models.OpenAIChat if flavor == "openai" else so.models.Anthropic
        model = kind(
            "m", base_url=fake.base_url, api_key=API_KEY, max_retries=0, price_per_mtok=(3, 0)
        )
        agent = so.Agent(name="a", model=model, limits=so.Limits(max_cost_usd=0.01))
        async with model, so.Runtime([agent], store=store_url) as rt:
            r = await rt.generate("a", prompt="hi")
            state = await rt.state(r.session_id)
    assert (r.status, r.retryable) == ("failed", True)
    assert r.error is not None and r.error["code"] == "model_error"
    assert "reported no usage the session's budgets can count" in r.error["message"]
    assert state.usage == so.Usage()
    assert len(fake.received) == 1


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
async def test_a_request_said_budgeted_fails_a_reply_that_reports_no_usage(flavor: str) -> None:
    with FakeLLM(flavor) as fake:
        fake.queue(_unreported(flavor, ...))
        async with _model(flavor, fake) as m:
            with pytest.raises(so.ModelError, match="reported no usage"):
                await m.complete(replace(request(), budgeted=True))


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
async def test_a_budget_at_its_most_is_none_and_a_reply_without_usage_is_used(
    flavor: str, tmp_path: Any
) -> None:
    """`Limits(max_tokens=sys.maxsize)` counts as the most, which the docs say bounds nothing
    as None does; yet the session was budgeted, and a reply reporting no usage failed its turn
    where under None it completed. So with `max_cost_usd` at its most on an unpriced model."""
    with FakeLLM(flavor) as fake:
        fake.queue(*[_unreported(flavor, ...)] * 2)
        model = _model(flavor, fake)
        kind = so.models.OpenAIChat if flavor == "openai" else so.models.Anthropic
        unpriced = kind("my-own-model", base_url=fake.base_url, api_key=API_KEY, max_retries=0)
        agents = [
            so.Agent(name="a", model=model, limits=so.Limits(max_tokens=sys.maxsize)),
            so.Agent(name="b", model=unpriced, limits=so.Limits(max_cost_usd=1e300)),
        ]
        async with model, unpriced, so.Runtime(agents, store=f"sqlite:///{tmp_path}/s.db") as rt:
            first = await rt.generate("a", prompt="hi")
            second = await rt.generate("b", prompt="hi")
    assert (first.status, first.text) == ("completed", "Here you go.")
    assert (second.status, second.text) == ("completed", "Here you go.")
