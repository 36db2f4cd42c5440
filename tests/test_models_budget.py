"""A model call's output is capped at what the session's budgets leave (`max_tokens`, and
`max_cost_usd` at the model's output price; a subagent's share of its parent's): a reply cut
off there is counted but not used, and the turn asks to raise the budget (or fails, where
nobody can raise it), so the last call of a session cannot spend past its budget on output."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

import signoff as so
from signoff.models import ModelRequest
from signoff.testing import call, call_tools, reply

from ._models import Capped, lookup_order, request
from .fakes.llm import API_KEY, FakeLLM, anthropic_message, openai_completion, openai_tool_call

ALICE = so.Principal(authenticator="test", principal_id="alice")


def cut_off(body: dict[str, Any], flavor: str) -> dict[str, Any]:
    """`body` as a reply stopped at the token limit it was given."""
    if flavor == "openai":
        body["choices"][0]["finish_reason"] = "length"
    else:
        body["stop_reason"] = "max_tokens"
    return body


def limit_of(body: dict[str, Any]) -> Any:
    """The output limit a request asked for, under whichever name it went."""
    return body.get("max_tokens", body.get("max_completion_tokens"))


async def events(rt: so.Runtime, session_id: str) -> list[so.Event]:
    return [e async for e in rt.events(session_id, follow=False)]


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
async def test_a_reply_cut_off_at_the_budget_asks_to_raise_it_and_is_never_used(
    store_url: str, flavor: str
) -> None:
    """max_tokens=200: the first call (60 tokens, 50 of them input, which the second reads
    again) leaves 140, so the second asks for at most 90 output tokens; cut off there, its half
    answer is counted (205) but neither recorded as the turn's answer nor shown to the model
    again; the person is asked, and `continue` (budget 600, 395 left, 340 after the 55 input
    tokens the cut call read, which the next reads again: twice the 90 it was cut at, at
    least) lets the next call finish the turn.
    Before, the second call was sent without a limit and its half answer ended the turn."""
    with FakeLLM(flavor, strict=True) as fake:
        if flavor == "openai":
            lookup = openai_tool_call("call_1", "lookup_order", {"order_id": "7"})
            first = openai_completion(None, [lookup], usage=(50, 10))
            half = cut_off(openai_completion("Order 7 was deliv", usage=(55, 90)), flavor)
            done = openai_completion("Order 7 was delivered.", usage=(60, 5))
            model: Any = so.models.OpenAIChat(
                "m", base_url=fake.base_url, api_key=API_KEY, max_retries=0, max_tokens=4096
            )
        else:
            tool = {"type": "tool_use", "id": "toolu_1", "name": "lookup_order"}
            first = anthropic_message(
                {**tool, "input": {"order_id": "7"}},
                usage={"input_tokens": 50, "output_tokens": 10},
            )
            half = cut_off(
                anthropic_message(
                    "Order 7 was deliv", usage={"input_tokens": 55, "output_tokens": 90}
                ),
                flavor,
            )
            done = anthropic_message(
                "Order 7 was delivered.", usage={"input_tokens": 60, "output_tokens": 5}
            )
            model = so.models.Anthropic(
                "m", base_url=fake.base_url, api_key=API_KEY, max_retries=0, max_tokens=4096
            )
        fake.queue(first, half, done)
        agent = so.Agent(
            name="a", model=model, tools=[lookup_order], limits=so.Limits(max_tokens=200)
        )
        async with so.Runtime([agent], store=store_url) as rt:
            r = await rt.generate("a", prompt="where is order 7?", auth=ALICE)
            assert r.status == "waiting"
            [ask] = r.pending
            assert ask.kind == "session-limit"
            assert ask.question == (
                "the model's reply was cut off at the 90 output tokens left in the session's "
                "budget: the session used 205 of max_tokens=200. Continue with max_tokens "
                "raised to 600, or stop?"
            )
            assert "deliv" not in r.text
        async with so.Runtime([agent], store=store_url) as rt:  # a new process answers
            state = await rt.state(r.session_id)
            assert state.usage.total_tokens == 205
            r = await rt.respond(
                r.session_id,
                [so.InputResponse(request_id=ask.id, option_id="continue")],
                principal=ALICE,
            )
            assert (r.status, r.text) == ("completed", "Order 7 was delivered.")
            assert (await rt.state(r.session_id)).usage.total_tokens == 270
            log = await events(rt, r.session_id)
        await model.aclose()
        sent = fake.bodies
    assert [limit_of(b) for b in sent] == [200, 90, 340]
    assert "deliv" not in str(sent[2]["messages"])  # the cut reply never reaches the model
    completed = [e.data["text"] for e in log if e.type == "model.completed"]
    assert completed == ["", "Order 7 was delivered."]
    [requested] = [e for e in log if e.type == "input.requested"]
    assert requested.data["usage"]["output_tokens"] == 90


async def test_the_models_own_lower_limit_is_left_alone_and_its_cut_text_returned() -> None:
    """A budget larger than the model's max_tokens changes nothing: the limit sent is the
    model's, and text it cut off is the answer, as without a budget; without a budget no
    limit is sent at all. The cut text is marked so (`cut_off`)."""
    with FakeLLM("openai", strict=True) as fake:
        fake.queue(cut_off(openai_completion("Short ans"), "openai"), openai_completion("Hi"))
        model = so.models.OpenAIChat(
            "m", base_url=fake.base_url, api_key=API_KEY, max_retries=0, max_tokens=16
        )
        bounded = so.Agent(name="a", model=model, limits=so.Limits(max_tokens=1000))
        free = so.Agent(name="b", model=model)
        async with so.Runtime([bounded, free], store="sqlite:///:memory:") as rt:
            r = await rt.generate("a", prompt="hi")
            assert (r.status, r.text, r.cut_off) == ("completed", "Short ans", "max_tokens")
        model.max_tokens = None
        async with so.Runtime([bounded, free], store="sqlite:///:memory:") as rt:
            r = await rt.generate("b", prompt="hi")
            assert r.status == "completed"
        await model.aclose()
    first, second = fake.bodies
    assert first["max_tokens"] == 16
    assert "max_tokens" not in second and "max_completion_tokens" not in second


def answer(seen: list[dict[str, Any]]) -> Any:
    """A transport answering every chat completion with 'hi', remembering each body."""
    import httpx

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json=openai_completion("hi"))

    return httpx.AsyncClient(transport=httpx.MockTransport(handle))


@pytest.mark.parametrize(
    ("name", "cap", "sent"),
    [("o3", 5000, 5000), ("o3", 200_000, None), ("gpt-4o-2024-05-13", 5000, None)],
)
async def test_a_model_with_no_limit_of_its_own_is_capped_only_below_its_known_one(
    name: str, cap: int, sent: int | None
) -> None:
    """With no max_tokens of its own, a model is sent a cap only when it is below the output
    limit OpenAI lists for it (a server refuses one past it): o3 takes 100,000, and a snapshot
    signoff does not know (this one takes 4,096) gets none, as a compatible server's model."""
    import openai

    seen: list[dict[str, Any]] = []
    client = openai.AsyncOpenAI(api_key="k", max_retries=0, http_client=answer(seen))
    model = so.models.OpenAIChat(name, client=client)
    request = ModelRequest(
        session_id="s",
        agent="a",
        instructions="",
        messages=[so.UserMessage(text="hi")],
        tools=[],
        response_index=0,
        max_output_tokens=cap,
    )
    assert (await model.complete(request)).text == "hi"
    await client.close()
    [body] = seen
    assert body.get("max_completion_tokens") == sent
    assert "max_tokens" not in body


async def test_openais_eu_host_gets_max_completion_tokens_and_the_budgets_cap() -> None:
    """OpenAI's EU data-residency host was taken for a compatible server: sent `max_tokens`,
    which o3 refuses, and no budget cap at all (no output limit known there)."""
    import openai

    seen: list[dict[str, Any]] = []
    http = answer(seen)
    base = "https://eu.api.openai.com/v1"
    client = openai.AsyncOpenAI(api_key="k", base_url=base, max_retries=0, http_client=http)
    own = so.models.OpenAIChat("o3", client=client, max_tokens=4000)
    assert (await own.complete(request())).text == "hi"
    capped = so.models.OpenAIChat("o3", client=client)
    assert (await capped.complete(request(max_output_tokens=500))).text == "hi"
    await client.close()
    assert [{k: v for k, v in body.items() if "tokens" in k} for body in seen] == [
        {"max_completion_tokens": 4000},
        {"max_completion_tokens": 500},
    ]


async def test_a_limit_given_in_params_or_extra_body_is_lowered_and_the_params_kept() -> None:
    params = {"max_completion_tokens": 5000, "extra_body": {"max_tokens": 4000}}
    given = copy.deepcopy(params)
    with FakeLLM("openai") as fake:
        fake.queue(openai_completion("ok"))
        async with so.models.OpenAIChat(
            "m", base_url=fake.base_url, api_key=API_KEY, max_retries=0, params=params
        ) as model:
            request = ModelRequest(
                session_id="s",
                agent="a",
                instructions="",
                messages=[so.UserMessage(text="hi")],
                tools=[],
                response_index=0,
                max_output_tokens=300,
            )
            assert (await model.complete(request)).text == "ok"
    [body] = fake.bodies
    assert (body["max_completion_tokens"], body["max_tokens"]) == (300, 300)
    assert params == given


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
async def test_a_reply_that_stopped_short_of_the_cap_was_not_cut_by_it(flavor: str) -> None:
    """A server whose context filled up stops with `length` too: 30 output tokens of a cap of
    40 is not the budget's doing (the reply is taken as before); 40 of 40 is."""
    with FakeLLM(flavor) as fake:
        for out in (30, 40):
            if flavor == "openai":
                fake.queue(cut_off(openai_completion("Half", usage=(10, out)), flavor))
            else:
                usage = {"input_tokens": 10, "output_tokens": out}
                fake.queue(cut_off(anthropic_message("Half", usage=usage), flavor))
        kind = so.models.OpenAIChat if flavor == "openai" else so.models.Anthropic
        async with kind(
            "m", base_url=fake.base_url, api_key=API_KEY, max_retries=0, max_tokens=4096
        ) as model:
            assert (await model.complete(request(max_output_tokens=40))).text == "Half"
            with pytest.raises(so.BudgetSpent, match="cut off at the 40 output tokens") as info:
                await model.complete(request(max_output_tokens=40))
            assert info.value.usage == so.Usage(input_tokens=10, output_tokens=40)


def thinking_model(fake: FakeLLM, budget: int) -> so.models.Anthropic:
    return so.models.Anthropic(
        "m",
        base_url=fake.base_url,
        api_key=API_KEY,
        max_retries=0,
        max_tokens=8000,
        params={"thinking": {"type": "enabled", "budget_tokens": budget}},
    )


async def test_thinking_is_given_less_room_or_the_call_is_not_made(store_url: str) -> None:
    """The API wants thinking's budget_tokens (at least 1,024) below max_tokens: with 1,500
    tokens left (after the 100 input tokens the call reads again) it is lowered to 1,499; with
    600 left no call could be made (it would be refused), so none is, and the person is asked
    at once."""
    with FakeLLM("anthropic", strict=True) as fake:
        fake.queue(
            anthropic_message("Fine.", usage={"input_tokens": 100, "output_tokens": 1300}),
            anthropic_message("Fine.", usage={"input_tokens": 400, "output_tokens": 200}),
        )
        model = thinking_model(fake, 2048)
        agent = so.Agent(name="a", model=model, limits=so.Limits(max_tokens=3000))
        async with so.Runtime([agent], store=store_url) as rt:
            r = await rt.generate("a", prompt="one", auth=ALICE)
            r = await rt.generate(session_id=r.session_id, prompt="two", auth=ALICE)
            assert r.status == "completed"
            r = await rt.generate(session_id=r.session_id, prompt="three", auth=ALICE)
            assert r.status == "waiting"
            [ask] = r.pending
            assert ask.question is not None and ask.question.startswith(
                "the 600 output tokens left were too few for the model's reply in the "
                "session's budget: the session used 2000 of max_tokens=3000."
            )
            assert (await rt.state(r.session_id)).usage.total_tokens == 2000
        await model.aclose()
    first, second = fake.bodies
    assert (first["max_tokens"], first["thinking"]["budget_tokens"]) == (3000, 2048)
    assert (second["max_tokens"], second["thinking"]["budget_tokens"]) == (1500, 1499)
    assert model.params["thinking"]["budget_tokens"] == 2048


@pytest.mark.parametrize("budget", ["max_tokens", "max_cost_usd"])
async def test_one_continue_leaves_a_thinking_call_the_room_it_needs(
    store_url: str, budget: str
) -> None:
    """Thinking needs 1,025 output tokens: a budget of 600 (or $0.01, 666 output tokens at
    $15 a million) leaves too few, and its `continue` raises it to 1200 ($0.02); the reply (100
    in, 995 out; 1211 out) leaves 5 (100) after the 100 input tokens the next call reads
    again. That call is not made, and the one `continue` asked raises the budget far enough for
    the 1,025 (to 2400, or $0.04), so the model runs. Before, it left twice the 5 (100) at
    least: to 1800 ($0.03), too few again, and the person was asked a second time at once, with
    no call made."""
    out = 995 if budget == "max_tokens" else 1211
    with FakeLLM("anthropic", strict=True) as fake:
        fake.queue(
            anthropic_message("One.", usage={"input_tokens": 100, "output_tokens": out}),
            anthropic_message("Two.", usage={"input_tokens": 120, "output_tokens": 50}),
        )
        model = thinking_model(fake, 2048)
        model.price_per_mtok = (3.0, 15.0)
        size = so.Limits(max_tokens=600) if budget == "max_tokens" else so.Limits(max_cost_usd=0.01)
        agent = so.Agent(name="a", model=model, limits=size)
        asked: list[str] = []
        async with so.Runtime([agent], store=store_url) as rt:
            r = await rt.generate("a", prompt="one", auth=ALICE)
            for prompt in ("one", "two"):
                if prompt == "two":
                    r = await rt.generate(session_id=r.session_id, prompt=prompt, auth=ALICE)
                while r.status == "waiting" and len(asked) < 4:
                    [ask] = r.pending
                    asked.append(ask.question or "")
                    answer = so.InputResponse(request_id=ask.id, option_id="continue")
                    r = await rt.respond(r.session_id, [answer], principal=ALICE)
                assert (r.status, r.text) == ("completed", f"{prompt.title()}.")
        await model.aclose()
    assert len(asked) == 2, asked
    if budget == "max_tokens":
        assert asked[0].endswith("Continue with max_tokens raised to 1200, or stop?")
        assert asked[1] == (
            "the 5 output tokens left were too few for the model's reply in the session's "
            "budget: the session used 1095 of max_tokens=1200. Continue with max_tokens raised "
            "to 2400, or stop?"
        )
        assert [b["max_tokens"] for b in fake.bodies] == [1200, 1205]
    else:
        assert asked[1].startswith("the 100 output tokens left were too few")
        assert asked[1].endswith("Continue with max_cost_usd raised to 0.04, or stop?")
    assert all(b["thinking"]["budget_tokens"] == b["max_tokens"] - 1 for b in fake.bodies)


@pytest.mark.parametrize(("needed", "raised"), [(500, 500), (None, 200), (True, 200), (-3, 200)])
async def test_a_model_saying_what_its_call_needs_is_left_that_by_continue(
    store_url: str, needed: Any, raised: int
) -> None:
    """A model of one's own that could make no call within the 100 output tokens left says it
    needs 500 (`BudgetSpent.needed`): the `continue` leaves it that, not only twice the 100; a
    `needed` that is no count is not read."""
    model = Capped(so.BudgetSpent("too few", needed=needed), reply("Done."))
    agent = so.Agent(name="a", model=model, limits=so.Limits(max_tokens=100))
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        [ask] = r.pending
        assert (ask.question or "").endswith(f"max_tokens raised to {raised}, or stop?")
        answer = so.InputResponse(request_id=ask.id, option_id="continue")
        r = await rt.respond(r.session_id, [answer], principal=ALICE)
        assert r.text == "Done."
    assert model.caps == [100, raised]


def priced(tokens_in: int, tokens_out: int, price: tuple[float, float]) -> so.Usage:
    cost = (tokens_in * price[0] + tokens_out * price[1]) / 1_000_000
    return so.Usage(input_tokens=tokens_in, output_tokens=tokens_out, cost_usd=cost)


async def test_a_cost_budget_caps_output_at_the_models_output_price(store_url: str) -> None:
    """$1 in, $10 out per million tokens, max_cost_usd=0.001: after 100 in and 10 out
    ($0.0002) the next reply may take $0.0008 less the $0.0001 its input costs at least (the
    100 tokens the last call read): 70 tokens of output; once less than one output token's
    price is left ($0.000005 after $0.000795 more), no call is made and the person is
    asked."""
    price = (1.0, 10.0)
    model = Capped(
        call_tools(call("lookup_order", order_id="1"), usage=priced(100, 10, price)),
        call_tools(call("lookup_order", order_id="2"), usage=priced(5, 79, price)),
        price=price,
    )
    agent = so.Agent(
        name="a", model=model, tools=[lookup_order], limits=so.Limits(max_cost_usd=0.001)
    )
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        assert r.status == "waiting"
        [ask] = r.pending
        assert ask.question == (
            "not one output token was left in the session's budget: the session cost 0.0010 "
            "of max_cost_usd=0.001. Continue with max_cost_usd raised to 0.002, or stop?"
        )
    assert model.caps == [100, 70]


async def test_nobody_to_ask_fails_the_turn_counting_the_cut_reply(store_url: str) -> None:
    cut = so.BudgetSpent("cut off", usage=so.Usage(input_tokens=30, output_tokens=70))
    model = Capped(cut)
    agent = so.Agent(name="a", model=model, limits=so.Limits(max_tokens=100))
    async with so.Runtime([agent], store=store_url) as rt:
        with pytest.raises(so.SessionLimitReached, match="nobody can raise the budget"):
            await rt.schedule("a", "nightly run")
        [session] = await rt.sessions(agent="a")
        state = await rt.state(session.id)
        assert state.usage.total_tokens == 100
        assert state.turn is not None and state.turn.error is not None
        assert state.turn.error["message"].startswith(
            "the model's reply was cut off at the 100 output tokens left in the session's "
            "budget: the session used 100 of max_tokens=100"
        )
        assert not state.turn.retryable
    assert model.caps == [100]


async def test_budget_spent_without_a_budget_is_an_ordinary_model_failure(
    store_url: str,
) -> None:
    """A model of one's own raising `BudgetSpent` when no cap was asked of it: no budget to
    raise, so the turn fails retryably, as for any `ModelError`, counting what it cost."""
    model = Capped(so.BudgetSpent("out of tokens", usage=so.Usage(output_tokens=9)))
    agent = so.Agent(name="a", model=model)
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        assert (r.status, r.retryable) == ("failed", True)
        assert r.error is not None and r.error["code"] == "model_error"
        assert (await rt.state(r.session_id)).usage.output_tokens == 9
    assert model.caps == [None]


async def test_a_subagent_is_capped_at_its_share_and_fails_when_cut(store_url: str) -> None:
    """The parent (max_tokens=100) spent 40 and delegates: its child, with a budget of its own
    of 1000, may take only the 60 left on output; cut there, the child's turn fails (the
    budget is its parent's) counting the cut reply, and the parent, at 40 + 90, asks."""
    parent = Capped(
        call_tools(
            call("orders", call_id="d1", message="look 3 up"), usage=so.Usage(input_tokens=40)
        ),
        reply("unused"),
    )
    child = Capped(so.BudgetSpent("cut", usage=so.Usage(input_tokens=30, output_tokens=60)))
    agents = [
        so.Agent(
            name="support",
            model=parent,
            tools=[so.delegate("orders")],
            limits=so.Limits(max_tokens=100),
        ),
        so.Agent(name="orders", model=child, limits=so.Limits(max_tokens=1000)),
    ]
    async with so.Runtime(agents, store=store_url) as rt:
        r = await rt.generate("support", prompt="where is 3?", auth=ALICE)
        [kid] = await rt.sessions(agent="orders")
        state = await rt.state(kid.id)
        assert state.usage.total_tokens == 90
        assert state.turn is not None and state.turn.error is not None
        assert state.turn.error["code"] == "session_limit_reached"
        assert state.turn.error["message"] == (
            "the model's reply was cut off at the 60 output tokens left of what its parent "
            f"session had left when it delegated (session {r.session_id})"
        )
        assert r.status == "waiting"
        [ask] = r.pending
        assert "130 of max_tokens=100 (90 of them by its subagents)" in (ask.question or "")
    assert child.caps == [60]
    assert parent.caps == [100]


def _request(**fields: Any) -> ModelRequest:
    """A request of no conversation, with `fields` given."""
    return ModelRequest(
        session_id="s",
        agent="a",
        instructions="",
        messages=[],
        tools=[],
        response_index=0,
        **fields,
    )


@pytest.mark.parametrize("cap", [0, -3, True, 1.5, "40"])
def test_a_request_cap_that_is_not_a_positive_count_is_refused(cap: Any) -> None:
    with pytest.raises(so.UsageError, match="max_output_tokens"):
        _request(max_output_tokens=cap)


@pytest.mark.parametrize("budgeted", [None, 1, "no"])
def test_a_request_budgeted_that_is_not_a_bool_is_refused(budgeted: Any) -> None:
    with pytest.raises(so.UsageError, match="budgeted must be a bool"):
        _request(budgeted=budgeted)
