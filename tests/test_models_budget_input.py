"""A model call's input counts against the session's budgets before the call is made: the next
call reads at least what the last one read (the conversation sent only grows), so a call whose
input alone would spend what is left is not made (the person is asked, as at a spent budget),
and the output cap is what is left after that input. Run on both stores."""

from __future__ import annotations

import pytest

import signoff as so
from signoff.testing import call, call_tools, reply

from ._models import Capped, lookup_order
from .fakes.llm import API_KEY, FakeLLM, anthropic_message, openai_completion

ALICE = so.Principal(authenticator="test", principal_id="alice")


def lookup(n: str, tokens_in: int, tokens_out: int = 5, cost: float = 0.0) -> so.ModelResponse:
    usage = so.Usage(input_tokens=tokens_in, output_tokens=tokens_out, cost_usd=cost)
    return call_tools(call("lookup_order", order_id=n), usage=usage)


async def test_a_call_whose_input_alone_would_spend_the_budget_is_not_made(
    store_url: str,
) -> None:
    """max_tokens=100: the first call read 80 tokens and wrote 5, leaving 15; the next reads at
    least those 80, so it is not made and the person is asked. Before, it was made with a cap
    of 15 and spent 80 more input tokens: 170 of a budget of 100. `continue` (budget 200)
    makes it, capped at 200 - 85 - 80 = 35."""
    model = Capped(lookup("1", 80), reply("Done.", usage=so.Usage(input_tokens=90)))
    agent = so.Agent(name="a", model=model, tools=[lookup_order], limits=so.Limits(max_tokens=100))
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="look 1 up", auth=ALICE)
        assert r.status == "waiting"
        [ask] = r.pending
        assert ask.question == (
            "the model's next call would read at least 80 input tokens (as many as its last "
            "call read), leaving not one output token in the session's budget: the session "
            "used 85 of max_tokens=100. Continue with max_tokens raised to 200, or stop?"
        )
        assert (await rt.state(r.session_id)).usage.total_tokens == 85  # nothing counted twice
    async with so.Runtime([agent], store=store_url) as rt:  # another process answers
        r = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=ask.id, option_id="continue")],
            principal=ALICE,
        )
        assert (r.status, r.text) == ("completed", "Done.")
        assert (await rt.state(r.session_id)).usage.total_tokens == 175
    assert model.caps == [100, 35]


async def test_nobody_to_ask_fails_the_turn_before_the_call(store_url: str) -> None:
    model = Capped(lookup("1", 95, 1))
    agent = so.Agent(name="a", model=model, tools=[lookup_order], limits=so.Limits(max_tokens=100))
    async with so.Runtime([agent], store=store_url) as rt:
        with pytest.raises(so.SessionLimitReached, match="would read at least 95 input tokens"):
            await rt.schedule("a", "nightly run")
    assert model.caps == [100]


async def test_the_cost_of_the_input_is_held_back_at_its_least_price(store_url: str) -> None:
    """Anthropic at $1 / $5 per million, a cache read at $0.10: after a call that read 10,000
    tokens (9,000 from the cache) and wrote 20, costing $0.002, max_cost_usd=0.004 leaves
    $0.002; the next call's 10,000 input tokens cost at least $0.001 (all cache reads), so its
    output may take $0.001: 200 tokens. Before, it was sent 400 (the whole rest at the output
    price)."""
    with FakeLLM("anthropic", strict=True) as fake:
        use = {"type": "tool_use", "id": "toolu_1", "name": "lookup_order"}
        fake.queue(
            anthropic_message(
                {**use, "input": {"order_id": "1"}},
                usage={"input_tokens": 1000, "cache_read_input_tokens": 9000, "output_tokens": 20},
            ),
            anthropic_message("Done.", usage={"input_tokens": 10, "output_tokens": 10}),
        )
        async with so.models.Anthropic(
            "m",
            base_url=fake.base_url,
            api_key=API_KEY,
            max_retries=0,
            max_tokens=4096,
            price_per_mtok=(1.0, 5.0),
        ) as model:
            agent = so.Agent(
                name="a", model=model, tools=[lookup_order], limits=so.Limits(max_cost_usd=0.004)
            )
            async with so.Runtime([agent], store=store_url) as rt:
                r = await rt.generate("a", prompt="look 1 up", auth=ALICE)
                assert r.status == "completed"
    first, second = fake.bodies
    assert (first["max_tokens"], second["max_tokens"]) == (800, 200)


async def test_a_window_that_drops_messages_holds_nothing_back(store_url: str) -> None:
    """With max_messages cutting the conversation the next call may read less than the last:
    nothing is known of its input, and its cap is the whole rest, as before. Within the first
    turn (which the window never cuts) the last call's 40 input tokens are held back."""
    model = Capped(
        lookup("1", 40),
        reply("ok", usage=so.Usage(input_tokens=50)),
        reply("Done.", usage=so.Usage(input_tokens=10)),
    )
    agent = so.Agent(
        name="a",
        model=model,
        tools=[lookup_order],
        limits=so.Limits(max_tokens=1000, max_messages=2),
    )
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="look 1 up", auth=ALICE)
        assert r.status == "completed"
        r = await rt.generate(session_id=r.session_id, prompt="thanks", auth=ALICE)
        assert r.status == "completed"
    assert model.caps == [1000, 1000 - 45 - 40, 1000 - 95]


async def test_a_billed_reply_the_turn_did_not_use_is_read_again_by_the_next_call(
    store_url: str,
) -> None:
    """max_tokens=1000: a reply cut at the cap read 400 tokens and wrote 1000; `continue`
    (budget 4000, room for twice the 1000 it was cut at) leaves 2600, of which the next call
    reads those 400 again: its cap is 2200, not 2600 (which could end the session at 4400 of
    4000). A billed reply that failed the turn (a call cut off) is read again by the retry
    alike."""
    usage = so.Usage(input_tokens=400, output_tokens=1000)
    model = Capped(
        so.BudgetSpent("cut off", usage=usage),
        reply("Done.", usage=so.Usage(input_tokens=400, output_tokens=200)),
    )
    agent = so.Agent(name="a", model=model, limits=so.Limits(max_tokens=1000))
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="hi", auth=ALICE)
        [ask] = r.pending
        r = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=ask.id, option_id="continue")],
            principal=ALICE,
        )
        assert (r.status, r.text) == ("completed", "Done.")
        assert (await rt.state(r.session_id)).usage.total_tokens == 2000
    assert model.caps == [1000, 2200]

    failing = Capped(
        so.ModelError("cut off", usage=so.Usage(input_tokens=400, output_tokens=50)),
        reply("Done.", usage=so.Usage(input_tokens=400, output_tokens=150)),
    )
    agent = so.Agent(name="b", model=failing, limits=so.Limits(max_tokens=1000))
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("b", prompt="hi", auth=ALICE)
        assert (r.status, r.retryable) == ("failed", True)
        r = await rt.generate(session_id=r.session_id)
        assert (r.status, r.text) == ("completed", "Done.")
    assert failing.caps == [1000, 150]


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
async def test_free_output_still_holds_the_input_back(store_url: str, flavor: str) -> None:
    """Input at $3 per million, output free, max_cost_usd=0.032: the first call read 10,000
    tokens ($0.03), and the next reads them again at no less than $0.003 (Anthropic's cache
    read) or $0.03: more than is left, so it is not made and the person is asked. Before, free
    output left the call uncapped and the input unchecked: it was made, spending $0.06."""
    with FakeLLM(flavor) as fake:
        if flavor == "openai":
            body = openai_completion("ok")
            body["usage"] = {
                "prompt_tokens": 10_000,
                "completion_tokens": 2,
                "total_tokens": 10_002,
            }
            model: so.models.OpenAIChat | so.models.Anthropic = so.models.OpenAIChat(
                "m", base_url=fake.base_url, api_key=API_KEY, max_retries=0, price_per_mtok=(3, 0)
            )
        else:
            body = anthropic_message("ok", usage={"input_tokens": 10_000, "output_tokens": 2})
            model = so.models.Anthropic(
                "m", base_url=fake.base_url, api_key=API_KEY, max_retries=0, price_per_mtok=(3, 0)
            )
        fake.queue(body, body)
        agent = so.Agent(name="a", model=model, limits=so.Limits(max_cost_usd=0.032))
        async with model, so.Runtime([agent], store=store_url) as rt:
            r = await rt.generate("a", prompt="hi", auth=ALICE)
            assert r.status == "completed"
            r = await rt.generate(session_id=r.session_id, prompt="again", auth=ALICE)
            assert r.status == "waiting"
            [ask] = r.pending
            assert ask.kind == "session-limit"
            assert ask.question is not None
            assert "would read at least 10000 input tokens" in ask.question
            assert (await rt.state(r.session_id)).usage.cost_usd == pytest.approx(0.03)
    assert len(fake.received) == 1
