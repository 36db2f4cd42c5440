"""A reply priced at the model that made it: a gateway's router or fallback (LiteLLM, a proxy
answering for an overloaded model) names in the reply's `model` another model than the one asked
for, and bills at its price. With no `price_per_mtok=` given, the list price of the model the
reply names counts when it is known; else the one asked for's. Through the real SDKs against
loopback fakes."""

from __future__ import annotations

from pathlib import Path

import pytest

import signoff as so

from ._models import request
from .fakes.llm import API_KEY, FakeLLM, anthropic_message, openai_completion

MILLION = 1_000_000


async def test_an_openai_reply_is_priced_at_the_model_it_names() -> None:
    """Asked for gpt-4o-mini, answered by gpt-4o: a million tokens each way cost $12.50 at
    gpt-4o's list price, its cached input $1.25. Before, $0.75, gpt-4o-mini's (16x less)."""
    cached = openai_completion("b", usage=(MILLION, MILLION), model="gpt-4o")
    cached["usage"]["prompt_tokens_details"] = {"cached_tokens": MILLION // 4}
    with FakeLLM("openai") as fake:
        fake.queue(
            openai_completion("a", usage=(MILLION, MILLION), model="gpt-4o"),
            cached,
            openai_completion("c", usage=(MILLION, MILLION), model="gpt-4o-mini-2024-07-18"),
            openai_completion("d", usage=(MILLION, MILLION), model="some-local-model"),
            openai_completion("e", usage=(MILLION, MILLION), model="gpt-4o"),
        )
        async with so.models.OpenAIChat(
            "gpt-4o-mini", base_url=fake.base_url, api_key=API_KEY, max_retries=0
        ) as m:
            costs = [(await m.complete(request())).usage.cost_usd for _ in range(4)]
        # A price given is the price, whoever answered.
        async with so.models.OpenAIChat(
            "gpt-4o-mini",
            base_url=fake.base_url,
            api_key=API_KEY,
            max_retries=0,
            price_per_mtok=(1.0, 2.0),
        ) as m:
            costs.append((await m.complete(request())).usage.cost_usd)
    assert costs == pytest.approx([12.5, 0.75 * 2.5 + 0.25 * 1.25 + 10.0, 0.75, 0.75, 3.0])


async def test_an_anthropic_reply_is_priced_at_the_model_it_names() -> None:
    """Asked for claude-haiku-4-5, answered by claude-opus-4-1: $90 for a million tokens each
    way, and its cache reads at a tenth of opus's input price. Before, $6 (haiku's)."""
    usage = {"input_tokens": MILLION, "output_tokens": MILLION}
    reads = {**usage, "cache_read_input_tokens": MILLION}
    with FakeLLM("anthropic") as fake:
        fake.queue(
            anthropic_message("a", usage=usage, model="claude-opus-4-1-20250805"),
            anthropic_message("b", usage=reads, model="claude-opus-4-1"),
            anthropic_message("c", usage=usage, model="claude-haiku-4-5-20251001"),
            anthropic_message("d", usage=usage, model="claude-opus-4-1"),
        )
        async with so.models.Anthropic(
            "claude-haiku-4-5", base_url=fake.base_url, api_key=API_KEY, max_retries=0
        ) as m:
            costs = [(await m.complete(request())).usage.cost_usd for _ in range(3)]
        async with so.models.Anthropic(
            "claude-haiku-4-5",
            base_url=fake.base_url,
            api_key=API_KEY,
            max_retries=0,
            price_per_mtok=(1.0, 2.0),
        ) as m:
            costs.append((await m.complete(request())).usage.cost_usd)
    assert costs == pytest.approx([90.0, 90.0 + 1.5, 6.0, 3.0])


async def test_the_budget_counts_what_the_model_that_answered_costs(tmp_path: Path) -> None:
    """A session of max_cost_usd=1 on gpt-4o-mini, answered by gpt-4o for 100,000 tokens each
    way ($1.25): the next message asks to raise the budget. Before, the session counted $0.075
    and the budget would have let about thirteen such replies through."""
    with FakeLLM("openai") as fake:
        fake.queue(openai_completion("a", usage=(100_000, 100_000), model="gpt-4o"))
        model = so.models.OpenAIChat(
            "gpt-4o-mini", base_url=fake.base_url, api_key=API_KEY, max_retries=0
        )
        agent = so.Agent(name="a", model=model, limits=so.Limits(max_cost_usd=1.0))
        async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db") as rt:
            r = await rt.generate("a", prompt="hi")
            assert r.status == "completed"
            state = await rt.state(r.session_id)
            assert state.usage.cost_usd == pytest.approx(1.25)
            r = await rt.generate(session_id=r.session_id, prompt="again")
            assert [p.kind for p in r.pending] == ["session-limit"]
        await model.aclose()
    assert len(fake.received) == 1


async def test_the_model_that_answered_is_recorded_when_another_than_asked(tmp_path: Path) -> None:
    """`model.completed` says which model made a reply when the provider names another than the
    one asked for (a router's pick, a dated version), so the log shows who answered; a reply
    naming the one asked for, or none, adds nothing. A name that is no name (control
    characters, 5,000 characters) is kept printable and cut to 200."""
    odd = "gpt-4o\x00\n" + "x" * 5000
    with FakeLLM("openai") as fake:
        fake.queue(
            openai_completion("a", model="gpt-4o-2024-08-06"),
            openai_completion("b", model="gpt-4o-mini"),
            openai_completion("c", model=odd),
        )
        model = so.models.OpenAIChat(
            "gpt-4o-mini", base_url=fake.base_url, api_key=API_KEY, max_retries=0
        )
        agent = so.Agent(name="a", model=model)
        async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db") as rt:
            r = await rt.generate("a", prompt="hi")
            for prompt in ("again", "and again"):
                await rt.generate(session_id=r.session_id, prompt=prompt)
            served = [
                e.data.get("model")
                async for e in rt.events(r.session_id, follow=False)
                if e.type == "model.completed"
            ]
        await model.aclose()
    assert served == ["gpt-4o-2024-08-06", None, "gpt-4o" + "x" * 194]
    with FakeLLM("anthropic") as fake:
        fake.queue(
            anthropic_message("a", model="claude-haiku-4-5-20251001"),
            anthropic_message("b", model="claude-haiku-4-5"),
        )
        async with so.models.Anthropic(
            "claude-haiku-4-5", base_url=fake.base_url, api_key=API_KEY, max_retries=0
        ) as m:
            replies = [await m.complete(request()) for _ in range(2)]
    assert [r.model for r in replies] == ["claude-haiku-4-5-20251001", None]
