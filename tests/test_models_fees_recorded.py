"""A gateway's reported cost (OpenRouter's `usage.cost`) is recorded as reported wherever usage
with a cost is recorded, not on `model.completed` alone: an `auto()` review's usage (on the
request it asks, or the `tool.started` of the call it clears) and a refused reply's on
`turn.failed`; a computed price never is. Through the real `openai` client against the loopback
fake, on both stores."""

from __future__ import annotations

from typing import Any

import pytest

import signoff as so
from signoff._recording import EventSpec, with_usage
from signoff._types import ReportedUsage, billable, reported_usage, usage_fields
from signoff.testing import ExecutionLog, call, call_tools, reply, scripted_agent

from .fakes.llm import API_KEY, FakeLLM, Received, Reply, openai_completion, openai_tool_call

ALICE = so.Principal(authenticator="test", principal_id="alice")


def _gateway(text: str | None, cost: float | None, **choice: Any) -> dict[str, Any]:
    """A completion whose usage reports `cost` (none: the price is computed from tokens)."""
    body = openai_completion(text, usage=(1000, 100))
    if cost is not None:
        body["usage"]["cost"] = cost
    body["choices"][0].update(choice)
    return body


def _model(fake: FakeLLM, **more: Any) -> so.models.OpenAIChat:
    return so.models.OpenAIChat(
        "anthropic/claude-sonnet-4",
        base_url=fake.base_url,
        api_key=API_KEY,
        max_retries=0,
        price_per_mtok=(3.0, 15.0),
        **more,
    )


async def _events(rt: so.Runtime, session_id: str) -> list[so.Event]:
    return [e async for e in rt.events(session_id, 0, follow=False)]


@pytest.mark.parametrize("reported", [True, False])
@pytest.mark.parametrize(
    ("verdict", "kind"), [("caution", "input.requested"), ("clear", "tool.started")]
)
async def test_an_auto_reviews_reported_cost_is_recorded_as_reported(
    store_url: str, reported: bool, verdict: str, kind: str
) -> None:
    log = ExecutionLog()
    with FakeLLM("openai") as fake:
        review = f'{{"verdict": "{verdict}", "reason": "looks {verdict}"}}'
        fake.queue(_gateway(review, 0.03 if reported else None))
        reviewer = _model(fake)

        @log.tool(approval=so.auto(reviewer))
        async def refund_charge(charge_id: str) -> str:
            """Refund a charge."""
            return "refunded"

        agent = scripted_agent(
            "billing",
            [call_tools(call("refund_charge", charge_id="a")), reply("done")],
            tools=[refund_charge],
        )
        async with so.Runtime([agent], store=store_url) as rt:
            r = await rt.generate("billing", prompt="refund", auth=ALICE)
            [recorded] = [e for e in await _events(rt, r.session_id) if e.type == kind]
            state = await rt.state(r.session_id)
        await reviewer.aclose()
    cost = 0.03 if reported else (1000 * 3.0 + 100 * 15.0) / 1e6
    assert recorded.data["usage"]["cost_usd"] == pytest.approx(cost)
    assert recorded.data.get("cost_reported") is (True if reported else None), recorded.data
    assert state.usage.cost_usd == pytest.approx(cost)
    assert log.count() == (1 if verdict == "clear" else 0)


@pytest.mark.parametrize("reported", [True, False])
async def test_a_refused_replys_reported_cost_is_recorded_as_reported_on_turn_failed(
    store_url: str, reported: bool
) -> None:
    """A reply the gateway billed but that cannot be used (its generation failed midway:
    `finish_reason` error) fails the turn, which counts what it cost: as reported, when the
    gateway said so."""
    with FakeLLM("openai") as fake:
        fake.queue(_gateway("half an ans", 0.02 if reported else None, finish_reason="error"))
        model = _model(fake)
        agent = so.Agent(name="support", model=model)
        async with so.Runtime([agent], store=store_url) as rt:
            r = await rt.generate("support", prompt="hello", auth=ALICE)
            assert r.status == "failed" and r.retryable
            [failed] = [e for e in await _events(rt, r.session_id) if e.type == "turn.failed"]
        await model.aclose()
    cost = 0.02 if reported else (1000 * 3.0 + 100 * 15.0) / 1e6
    assert failed.data["usage"]["cost_usd"] == pytest.approx(cost)
    assert failed.data.get("cost_reported") is (True if reported else None), failed.data


async def test_a_reply_filtered_in_a_tool_call_records_its_reported_cost(store_url: str) -> None:
    """A reply cut off by the content filter with a tool call in it is refused (none of its
    calls runs): the failed turn records its reported cost as reported."""
    body = openai_completion(
        None, [openai_tool_call("call_1", "lookup", {"q": "x"})], usage=(1000, 100)
    )
    body["usage"]["cost"] = 0.05
    body["choices"][0]["finish_reason"] = "content_filter"
    body["choices"][0]["message"]["content"] = "Looking"

    @so.tool
    async def lookup(q: str) -> str:
        """Look something up."""
        return "found"

    with FakeLLM("openai") as fake:
        fake.queue(body)
        model = _model(fake)
        agent = so.Agent(name="support", model=model, tools=[lookup])
        async with so.Runtime([agent], store=store_url) as rt:
            r = await rt.generate("support", prompt="hello", auth=ALICE)
            [failed] = [e for e in await _events(rt, r.session_id) if e.type == "turn.failed"]
        await model.aclose()
    assert failed.data["usage"]["cost_usd"] == pytest.approx(0.05)
    assert failed.data["cost_reported"] is True, failed.data


async def test_a_models_reply_cut_off_with_calls_records_its_reported_cost(
    store_url: str,
) -> None:
    """The engine's own refusal of a reply cut off with tool calls (a model of one's own that
    says `cost_reported`) records the cost as reported too, and a computed one as before."""

    @so.tool
    async def lookup(q: str) -> str:
        """Look something up."""
        return "found"

    spent = so.Usage(input_tokens=10, output_tokens=5, cost_usd=0.07)
    for reported in (True, False):
        cut = so.ModelResponse(
            tool_calls=[so.ToolCall(name="lookup", input={"q": "x"}, id="c1")],
            usage=spent,
            cut_off="max_tokens",
            cost_reported=reported,
        )
        agent = scripted_agent("support", [cut], tools=[lookup])
        async with so.Runtime([agent], store=store_url) as rt:
            r = await rt.generate("support", prompt="hello", auth=ALICE)
            [failed] = [e for e in await _events(rt, r.session_id) if e.type == "turn.failed"]
        assert failed.data["usage"] == spent.model_dump()
        assert failed.data.get("cost_reported") is (True if reported else None), failed.data


@pytest.mark.parametrize("over", ["max_calls_per_response", "max_response_bytes"])
async def test_a_reply_refused_over_a_limit_records_its_reported_cost(
    store_url: str, over: str
) -> None:
    """A reply refused for its size (more calls than `max_calls_per_response`, more bytes than
    `max_response_bytes`) recorded its usage on `turn.failed` without `cost_reported`, which
    the cut-off refusal kept: the provider's figure read as a computed price."""

    @so.tool
    async def lookup(q: str) -> str:
        """Look something up."""
        return "found"

    spent = so.Usage(input_tokens=10, output_tokens=5, cost_usd=0.07)
    calls = [so.ToolCall(name="lookup", input={"q": str(i)}, id=f"c{i}") for i in range(3)]
    if over == "max_calls_per_response":
        big = so.ModelResponse(tool_calls=calls, usage=spent, cost_reported=True)
        limits = so.Limits(max_calls_per_response=2)
    else:
        big = so.ModelResponse(text="x" * 5000, usage=spent, cost_reported=True)
        limits = so.Limits(max_response_bytes=4096)
    agent = scripted_agent("support", [big], tools=[lookup], limits=limits)
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("support", prompt="hello", auth=ALICE)
        assert (r.status, r.retryable) == ("failed", True)
        assert r.error is not None and over in r.error["message"]
        [failed] = [e for e in await _events(rt, r.session_id) if e.type == "turn.failed"]
    assert failed.data["usage"] == spent.model_dump()
    assert failed.data.get("cost_reported") is True, failed.data


async def test_a_reply_cut_at_the_budgets_cap_records_its_reported_cost(store_url: str) -> None:
    """A reply the gateway cut at the output tokens the budgets left (`BudgetSpent`) asks to
    raise the budget, counting what it cost: the request's event records it as reported."""
    with FakeLLM("openai") as fake:

        def cut(got: Received) -> Reply:
            body = _gateway("half an ans", 0.01, finish_reason="length")
            body["usage"]["completion_tokens"] = got.body["max_tokens"]
            return Reply(body)

        fake.queue(cut)
        model = _model(fake, max_tokens=4096)  # over what the budget leaves: capped there
        agent = so.Agent(name="support", model=model, limits=so.Limits(max_tokens=3000))
        async with so.Runtime([agent], store=store_url) as rt:
            r = await rt.generate("support", prompt="hello", auth=ALICE)
            assert r.status == "waiting" and r.pending[0].kind == "session-limit"
            events = await _events(rt, r.session_id)
        await model.aclose()
    [asked] = [e for e in events if e.type == "input.requested"]
    assert asked.data["usage"]["cost_usd"] == pytest.approx(0.01)
    assert asked.data["cost_reported"] is True, asked.data


def test_a_sum_or_merge_is_reported_only_when_every_part_is() -> None:
    """A review's usage added to what an event records already (`with_usage`) keeps
    `cost_reported` only when both costs are the provider's: a computed part makes the sum
    computed, and a stale mark is dropped."""
    part = so.Usage(input_tokens=1, output_tokens=2, cost_usd=0.5)
    billed = reported_usage(part)
    assert isinstance(billed + billed, ReportedUsage)
    assert not isinstance(billed + part, ReportedUsage)
    assert not isinstance(part + billed, ReportedUsage)
    assert billable(reported_usage(so.Usage())) is None  # nothing, whoever reported it
    marked: EventSpec = ("tool.completed", {"call_id": "c", **usage_fields(billed)})
    plain: EventSpec = ("tool.completed", {"call_id": "c", **usage_fields(part)})
    [(_, both)] = with_usage([marked], billed)
    assert both["cost_reported"] is True and both["usage"]["cost_usd"] == 1.0
    for spec, added in ((marked, part), (plain, billed)):
        [(_, mixed)] = with_usage([spec], added)
        assert "cost_reported" not in mixed and mixed["usage"]["cost_usd"] == 1.0
