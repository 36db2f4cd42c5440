"""`Anthropic` continues a turn the API paused (`stop_reason: "pause_turn"`, a long server-tool
loop), as Anthropic's docs say: the paused content is sent back as the assistant's and the
request made again (naming the code-execution container, if any), at most `MAX_CONTINUATIONS`
times, each capped at what the session's budgets leave of the reply's output (where that is
below the model's own max_tokens), and what every part cost is counted. Against the strict
fake, through the real SDK."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import signoff as so
from signoff.models import PausedPart
from signoff.models._anthropic import MAX_CONTINUATIONS

from ._models import request
from ._models_anthropic import fake, model
from ._tracing import exporter, provider
from .fakes.llm import API_KEY, FakeLLM, Reply, anthropic_message

__all__ = ["exporter", "fake", "model", "provider"]  # the fixtures, used by name

ALICE = so.Principal(authenticator="app", principal_id="alice")
BOB = so.Principal(authenticator="app", principal_id="bob")

SEARCH = {
    "type": "server_tool_use",
    "id": "srvtoolu_01",
    "name": "web_search",
    "input": {"query": "refund policy"},
}
RESULTS = {
    "type": "web_search_tool_result",
    "tool_use_id": "srvtoolu_01",
    "content": [{"type": "web_search_result", "url": "https://example.com", "title": "Policy"}],
}


def paused(*blocks: Any, usage: tuple[int, int] = (100, 20), **extra: Any) -> dict[str, Any]:
    body = anthropic_message(*blocks, usage={"input_tokens": usage[0], "output_tokens": usage[1]})
    body["stop_reason"] = "pause_turn"
    return {**body, **extra}


async def test_a_paused_turn_is_continued_with_its_content_sent_back(fake, model) -> None:
    """Before, the paused part's text ("Searching. ") was returned as the whole answer and the
    API was never asked to finish."""
    container = {"id": "container_01", "expires_at": "2026-12-03T19:00:00Z"}
    fake.queue(
        paused("Searching. ", SEARCH, RESULTS, container=container),
        anthropic_message("Refunds take 5 days.", usage={"input_tokens": 150, "output_tokens": 30}),
    )
    response = await model.complete(request(so.UserMessage(text="What is the refund policy?")))
    assert response.text == "Searching. Refunds take 5 days."
    assert (response.usage.input_tokens, response.usage.output_tokens) == (250, 50)
    assert response.cut_off is None
    assert response.context_tokens == 0  # what the next call reads again is not known
    first, second = fake.bodies
    sent_back = [{"type": "text", "text": "Searching. "}, SEARCH, RESULTS]
    assert second["messages"] == [*first["messages"], {"role": "assistant", "content": sent_back}]
    assert second["container"] == "container_01" and "container" not in first


async def test_each_pause_adds_to_the_one_assistant_message_sent_back(fake, model) -> None:
    fake.queue(paused("One. ", SEARCH), paused("Two. ", RESULTS), anthropic_message("Done."))
    response = await model.complete(request())
    assert response.text == "One. Two. Done."
    assert response.usage.input_tokens == 210
    third = fake.bodies[2]["messages"]
    assert [m["role"] for m in third] == ["user", "assistant"]
    assert [b.get("text") for b in third[1]["content"]] == ["One. ", None, "Two. ", None]


async def test_continuations_are_bounded_and_what_they_cost_counts(fake, model) -> None:
    fake.queue(*[paused(f"part {i}. ", SEARCH) for i in range(MAX_CONTINUATIONS + 2)])
    with pytest.raises(so.ModelError, match=f"paused its turn {MAX_CONTINUATIONS + 1} times") as e:
        await model.complete(request())
    assert len(fake.received) == MAX_CONTINUATIONS + 1
    assert e.value.usage is not None
    assert e.value.usage.output_tokens == 20 * (MAX_CONTINUATIONS + 1)
    assert e.value.start_over  # no retry could go on from the parts: it asks afresh


async def test_a_continuation_that_fails_counts_the_paused_part(fake, model) -> None:
    fake.queue(paused("Searching. ", SEARCH, usage=(100, 20)))  # then the script runs out: 500
    with pytest.raises(so.ModelError, match="HTTP 500") as e:
        await model.complete(request())
    assert e.value.usage is not None
    assert (e.value.usage.input_tokens, e.value.usage.output_tokens) == (100, 20)
    assert not e.value.start_over  # a retry goes on from the part


async def test_a_continuation_is_capped_at_what_the_budgets_leave(fake, model) -> None:
    """The budgets leave 100 output tokens: the paused part spent 60, so the continuation may
    write 40; cut off there, the whole reply is a BudgetSpent counting both parts."""
    cut = anthropic_message("Refunds take", usage={"input_tokens": 150, "output_tokens": 40})
    cut["stop_reason"] = "max_tokens"
    fake.queue(paused("Searching. ", SEARCH, usage=(100, 60)), cut)
    capped = dataclasses.replace(request(), max_output_tokens=100)
    with pytest.raises(so.BudgetSpent) as e:
        await model.complete(capped)
    assert [b["max_tokens"] for b in fake.bodies] == [100, 40]
    assert e.value.usage is not None and e.value.usage.output_tokens == 100


async def test_a_pause_past_the_budgets_output_is_not_continued(fake, model) -> None:
    fake.queue(paused("Searching. ", SEARCH, usage=(100, 100)))
    capped = dataclasses.replace(request(), max_output_tokens=100)
    with pytest.raises(so.BudgetSpent, match="paused its turn after the 100 output tokens") as e:
        await model.complete(capped)
    assert len(fake.received) == 1
    assert e.value.usage is not None and e.value.usage.output_tokens == 100


async def test_continuations_are_capped_below_the_models_own_limit(fake, model) -> None:
    """The model's own max_tokens (1024) is below the 2500 the budgets leave, so the first call
    sends its own; after two parts of 1000 the continuation may write 500, and cut off there the
    reply is a BudgetSpent counting all three. Before, the budget was dropped once the model's
    own limit bound the first call: each continuation asked for 1024 again, and the reply cut
    at 500 passed for the model's own cut-off."""
    cut = anthropic_message("Refunds take", usage={"input_tokens": 150, "output_tokens": 500})
    cut["stop_reason"] = "max_tokens"
    fake.queue(paused("One. ", SEARCH, usage=(100, 1000)), paused("Two. ", usage=(120, 1000)), cut)
    with pytest.raises(so.BudgetSpent, match="cut off at the 2500 output tokens") as e:
        await model.complete(request(max_output_tokens=2500))
    assert [b["max_tokens"] for b in fake.bodies] == [1024, 1024, 500]
    assert e.value.usage is not None and e.value.usage.output_tokens == 2500


async def test_a_pause_that_spends_the_budget_is_not_continued_past_the_models_limit(
    fake, model
) -> None:
    """2000 left: the second call asks for the 1000 left after the first part's 1000; its part
    spends them, so no third is made. Before, a third was, at the model's own 1024."""
    fake.queue(*[paused(f"part {i}. ", SEARCH, usage=(100, 1000)) for i in range(3)])
    with pytest.raises(so.BudgetSpent, match="paused its turn after the 2000 output tokens") as e:
        await model.complete(request(max_output_tokens=2000))
    assert [b["max_tokens"] for b in fake.bodies] == [1024, 1000]
    assert e.value.usage is not None and e.value.usage.output_tokens == 2000


async def test_a_continuation_cut_at_the_models_own_limit_is_its_cut_off(fake, model) -> None:
    """With 5000 left after a part of 1000, the model's own 1024 still binds: a reply cut
    there is the model's cut-off, as without a budget, not a spent budget."""
    cut = anthropic_message("Refunds take", usage={"input_tokens": 150, "output_tokens": 1024})
    cut["stop_reason"] = "max_tokens"
    fake.queue(paused("One. ", SEARCH, usage=(100, 1000)), cut)
    response = await model.complete(request(max_output_tokens=5000))
    assert (response.text, response.cut_off) == ("One. Refunds take", "max_tokens")
    assert [b["max_tokens"] for b in fake.bodies] == [1024, 1024]


async def test_continuations_lower_thinking_within_what_the_budgets_leave(fake) -> None:
    """Thinking's budget_tokens (2048) must stay below max_tokens: the first call and the one
    after 2000 output tokens (3000 left) keep the model's own; after 1500 more, 1500 are left:
    max_tokens 1500 and thinking 1499."""
    claude = so.models.Anthropic(
        "claude-haiku-4-5",
        base_url=fake.base_url,
        api_key=API_KEY,
        max_retries=0,
        max_tokens=4096,
        params={"thinking": {"type": "enabled", "budget_tokens": 2048}},
    )
    fake.queue(
        paused("One. ", SEARCH, usage=(100, 2000)),
        paused("Two. ", usage=(100, 1500)),
        anthropic_message("Done.", usage={"input_tokens": 150, "output_tokens": 30}),
    )
    try:
        response = await claude.complete(request(max_output_tokens=5000))
    finally:
        await claude.aclose()
    assert response.text == "One. Two. Done."
    sent = [(b["max_tokens"], b["thinking"]["budget_tokens"]) for b in fake.bodies]
    assert sent == [(4096, 2048), (3000, 2048), (1500, 1499)]


@pytest.mark.parametrize(
    ("limits", "third"),
    [(so.Limits(max_tokens=3000), 970), (so.Limits(max_cost_usd=0.015), 995)],
    ids=["tokens", "cost"],
)
async def test_a_paused_turn_stops_at_the_sessions_budget(
    store_url: str, limits: so.Limits, third: int
) -> None:
    """A session's budget leaves 3000 output tokens (max_cost_usd at claude-haiku-4-5's $5 per
    million output tokens alike) and each paused part reads 10 input tokens and writes 1000:
    the third call asks for the 1000 left less the 10 input tokens it reads at least (970; 995
    for the cost budget, holding them back at the cache-read price), and once they are spent no
    fourth is made; the person is asked to raise the budget. Before, all nine parts were asked
    for at the model's own 1024 each, and the turn completed having written 9000 output
    tokens."""
    with FakeLLM("anthropic", strict=True) as server:
        server.queue(
            paused("part 0. ", SEARCH, usage=(10, 1000)),
            paused("part 1. ", SEARCH, usage=(10, 1000)),
            *[paused(f"part {i}. ", SEARCH, usage=(10, third)) for i in range(2, 8)],
            anthropic_message("Done.", usage={"input_tokens": 10, "output_tokens": 1000}),
        )
        claude = so.models.Anthropic(
            "claude-haiku-4-5", base_url=server.base_url, api_key=API_KEY, max_retries=0
        )
        agent = so.Agent(name="support", model=claude, tools=[], limits=limits)
        async with so.Runtime([agent], store=store_url) as rt:
            r = await rt.generate("support", prompt="policy?")
            assert r.status == "waiting"
            [ask] = r.pending
            assert ask.kind == "session-limit"
            assert ask.question is not None
            assert ask.question.startswith(
                "the provider paused the model's reply, and not one output token was left"
            )
            usage = (await rt.state(r.session_id)).usage
        await claude.aclose()
    assert [b["max_tokens"] for b in server.bodies] == [1024, 1024, third]
    assert (usage.input_tokens, usage.output_tokens) == (30, 2000 + third)


async def test_a_paused_turn_costs_its_parts_in_the_session(store_url: str) -> None:
    with FakeLLM("anthropic", strict=True) as server:
        server.queue(
            paused("Searching. ", SEARCH, usage=(100, 20)),
            anthropic_message("Done.", usage={"input_tokens": 150, "output_tokens": 30}),
        )
        claude = so.models.Anthropic(
            "claude-haiku-4-5", base_url=server.base_url, api_key=API_KEY, max_retries=0
        )
        agent = so.Agent(name="support", model=claude, tools=[])
        async with so.Runtime([agent], store=store_url) as rt:
            r = await rt.generate("support", prompt="policy?")
            assert (r.status, r.text) == ("completed", "Searching. Done.")
            usage = (await rt.state(r.session_id)).usage
            assert (usage.input_tokens, usage.output_tokens) == (250, 50)
        await claude.aclose()


async def test_a_paused_turn_is_journaled_part_by_part_and_traced_whole(
    store_url: str, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    """Each paused part is a `model.paused` event counting what it cost, the reply's
    `model.completed` counts the rest, and the model call's span says what it billed in all."""
    with FakeLLM("anthropic", strict=True) as server:
        server.queue(
            paused("Searching. ", SEARCH, usage=(100, 20)),
            anthropic_message("Done.", usage={"input_tokens": 150, "output_tokens": 30}),
        )
        claude = so.models.Anthropic(
            "claude-haiku-4-5", base_url=server.base_url, api_key=API_KEY, max_retries=0
        )
        agent = so.Agent(name="support", model=claude, tools=[])
        async with so.Runtime([agent], store=store_url, tracer_provider=provider) as rt:
            r = await rt.generate("support", prompt="policy?")
            events = [e async for e in rt.events(r.session_id, follow=False)]
        await claude.aclose()
    (part,) = [e.data for e in events if e.type == "model.paused"]
    (reply,) = [e.data for e in events if e.type == "model.completed"]
    assert part["model"] == "anthropic:claude-haiku-4-5"
    assert part["data"]["content"][0] == {"type": "text", "text": "Searching. "}
    assert (part["usage"]["input_tokens"], part["usage"]["output_tokens"]) == (100, 20)
    assert (reply["usage"]["input_tokens"], reply["usage"]["output_tokens"]) == (150, 30)
    assert reply["text"] == "Searching. Done."
    (span,) = [s for s in exporter.get_finished_spans() if s.name.startswith("chat ")]
    attrs = span.attributes or {}
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (250, 50)


async def test_a_continuation_that_fails_leaves_the_parts_billed_on_the_failed_span(
    store_url: str, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    """Two parts journaled, then the continuation fails (HTTP 500): the session counts what the
    parts cost, and the failed model call's span says so too; it said nothing of usage."""
    with FakeLLM("anthropic", strict=True) as server:
        server.queue(
            paused("Searching. ", SEARCH, usage=(100, 20)),
            paused("Reading. ", RESULTS, usage=(101, 21)),
        )  # then the script runs out: HTTP 500
        claude = so.models.Anthropic(
            "claude-haiku-4-5", base_url=server.base_url, api_key=API_KEY, max_retries=0
        )
        agent = so.Agent(name="support", model=claude, tools=[])
        async with so.Runtime([agent], store=store_url, tracer_provider=provider) as rt:
            r = await rt.generate("support", prompt="policy?")
            usage = (await rt.state(r.session_id)).usage
        await claude.aclose()
    assert r.status == "failed"
    assert (usage.input_tokens, usage.output_tokens) == (201, 41)
    (span,) = [s for s in exporter.get_finished_spans() if s.name.startswith("chat ")]
    attrs = span.attributes or {}
    assert span.status.status_code == StatusCode.ERROR
    assert (attrs.get("gen_ai.usage.input_tokens"), attrs.get("gen_ai.usage.output_tokens")) == (
        201,
        41,
    )


async def test_a_retry_after_a_failed_continuation_goes_on_from_the_last_part(
    store_url: str,
) -> None:
    """The third request fails (HTTP 500): the turn fails, retryably, and its retry asks only
    for what is left, sending back both parts journaled. Before, it asked from the first part
    again, sending none back (here the script's answer then passed for the whole reply)."""
    with FakeLLM("anthropic", strict=True) as server:
        server.queue(
            paused("Searching. ", SEARCH, usage=(100, 20)),
            paused("Reading. ", RESULTS, usage=(101, 21)),
        )  # then the script runs out: HTTP 500
        claude = so.models.Anthropic(
            "claude-haiku-4-5", base_url=server.base_url, api_key=API_KEY, max_retries=0
        )
        agent = so.Agent(name="support", model=claude, tools=[])
        async with so.Runtime([agent], store=store_url) as rt:
            r = await rt.generate("support", prompt="policy?")
            assert r.status == "failed"
            usage = (await rt.state(r.session_id)).usage
            assert (usage.input_tokens, usage.output_tokens) == (201, 41)  # counted at once
            done = anthropic_message("Done.", usage={"input_tokens": 150, "output_tokens": 30})
            server.queue(done)
            r = await rt.generate(session_id=r.session_id)
            usage = (await rt.state(r.session_id)).usage
        await claude.aclose()
    assert (r.status, r.text) == ("completed", "Searching. Reading. Done.")
    assert len(server.received) == 4
    last = server.bodies[-1]["messages"]
    assert [b.get("text") for b in last[-1]["content"]] == ["Searching. ", None, "Reading. ", None]
    assert (usage.input_tokens, usage.output_tokens) == (351, 71)


async def test_a_retry_after_the_ninth_pause_asks_the_model_afresh(store_url: str) -> None:
    """The ninth pause fails the turn retryably, saying `start_over`: its retry asks the model
    afresh, sending back none of the nine parts (counted once, when journaled), and the message
    queued behind the turn runs after it. Before, every retry went on from the nine parts and
    failed on them without a request, and the queued message never started."""
    nine = MAX_CONTINUATIONS + 1
    with FakeLLM("anthropic", strict=True) as server:
        server.queue(*[paused(f"part {i}. ", SEARCH, usage=(100, 20)) for i in range(nine)])
        claude = so.models.Anthropic(
            "claude-haiku-4-5", base_url=server.base_url, api_key=API_KEY, max_retries=0
        )
        agent = so.Agent(name="support", model=claude, tools=[])
        async with so.Runtime([agent], store=store_url) as rt:
            r = await rt.generate("support", prompt="policy?", auth=ALICE)
            assert (r.status, r.retryable, len(server.received)) == ("failed", True, nine)
            sid, turn = r.session_id, r.turn_id
            assert (await rt.send(sid, "and shipping?", principal=BOB)).queued
            server.queue(
                anthropic_message("Fresh.", usage={"input_tokens": 150, "output_tokens": 30}),
                anthropic_message("Free.", usage={"input_tokens": 160, "output_tokens": 5}),
            )
            r = await rt.generate(session_id=sid, auth=ALICE)
            events = [e async for e in rt.events(sid, follow=False)]
            usage = (await rt.state(sid)).usage
        await claude.aclose()
    assert r.status == "completed" and len(server.received) == nine + 2
    assert server.bodies[nine]["messages"] == server.bodies[0]["messages"]  # none sent back
    (failed,) = [e.data for e in events if e.type == "turn.failed"]
    assert failed["retryable"] is True and failed["start_over"] is True
    replies = [(e.turn_id == turn, e.data["text"]) for e in events if e.type == "model.completed"]
    assert replies == [(True, "Fresh."), (False, "Free.")]  # the retry's, then the queued turn's
    assert (usage.input_tokens, usage.output_tokens) == (100 * nine + 310, 20 * nine + 35)


async def test_the_ninth_pause_says_start_over_after_a_message_from_another_process(
    store_url: str,
) -> None:
    """A message queued from another process while the first part was asked for makes the
    journaling of that part conflict and reload the turn: the ninth pause's failure read the
    turn as it was before (no parts) and said nothing of `start_over`, so the first retry went
    on from the nine parts again and failed without a request."""
    nine = MAX_CONTINUATIONS + 1
    asked, go_on = threading.Event(), threading.Event()

    def first(got: Any) -> Reply:
        asked.set()
        go_on.wait(10)
        return Reply(paused("part 0. ", SEARCH))

    with FakeLLM("anthropic", strict=True) as server:
        server.queue(first, *[paused(f"part {i}. ", SEARCH) for i in range(1, nine)])
        claude = so.models.Anthropic(
            "claude-haiku-4-5", base_url=server.base_url, api_key=API_KEY, max_retries=0
        )
        agent = so.Agent(name="support", model=claude, tools=[])
        async with so.Runtime([agent], store=store_url) as rt:
            sid = await rt.create_session("support", auth=ALICE)
            running = asyncio.create_task(rt.generate(session_id=sid, prompt="policy?", auth=ALICE))
            assert await asyncio.to_thread(asked.wait, 10)
            async with so.Runtime([agent], store=store_url) as other:
                sent = await other.send(sid, "and shipping?", principal=BOB, turn_policy="queue")
            go_on.set()
            r = await running
            assert (sent.queued, r.status, r.retryable) == (True, "failed", True)
            server.queue(anthropic_message("Fresh."), anthropic_message("Free."))
            r = await rt.generate(session_id=sid, auth=ALICE)
            events = [e async for e in rt.events(sid, follow=False)]
        await claude.aclose()
    said = [e.data.get("start_over") for e in events if e.type == "turn.failed"]
    assert said == [True]  # one failure, and its retry asked afresh
    assert r.status == "completed" and len(server.received) == nine + 2


def _part(text: str, output: int = 20, model: str = "anthropic:claude-haiku-4-5") -> PausedPart:
    content = [{"type": "text", "text": text}, SEARCH]
    usage = so.Usage(input_tokens=100, output_tokens=output, cost_usd=0.5)
    return PausedPart(model=model, data={"content": content}, usage=usage)


async def test_each_part_goes_to_on_pause_and_its_cost_is_left_out_of_the_reply(
    fake, model
) -> None:
    journaled: list[PausedPart] = []

    async def on_pause(part: PausedPart) -> None:
        journaled.append(part)

    container = {"id": "container_01", "expires_at": "2026-12-03T19:00:00Z"}
    fake.queue(
        paused("Searching. ", SEARCH, container=container),
        anthropic_message("Done.", usage={"input_tokens": 150, "output_tokens": 30}),
    )
    asked = dataclasses.replace(request(), on_pause=on_pause)
    response = await model.complete(asked)
    assert response.text == "Searching. Done."
    assert (response.usage.input_tokens, response.usage.output_tokens) == (150, 30)
    (part,) = journaled
    assert part.model == "anthropic:claude-haiku-4-5" and part.usage.output_tokens == 20
    assert part.data == {
        "content": [{"type": "text", "text": "Searching. "}, SEARCH],
        "container": "container_01",
    }


async def test_a_continuation_is_capped_at_what_on_pause_says(fake, model) -> None:
    """The engine's cap for the next part (what the budgets leave once the part is counted and
    the next part's input is held back: 300) is below the 940 the reply's cap leaves: the
    continuation asks for 300, and cut off there the reply is a BudgetSpent, not the model's
    own cut-off. Before, `on_pause` said nothing back and the continuation asked for 940."""
    cut = anthropic_message("Refunds take", usage={"input_tokens": 150, "output_tokens": 300})
    cut["stop_reason"] = "max_tokens"
    fake.queue(paused("Searching. ", SEARCH, usage=(100, 60)), cut)

    async def on_pause(part: PausedPart) -> int:
        return 300

    asked = dataclasses.replace(request(), max_output_tokens=1000, on_pause=on_pause)
    with pytest.raises(so.BudgetSpent, match="cut off at the 360 output tokens") as e:
        await model.complete(asked)
    assert [b["max_tokens"] for b in fake.bodies] == [1000, 300]
    assert e.value.usage is not None and e.value.usage.output_tokens == 300  # the part's counted


async def test_a_reply_goes_on_from_the_parts_journaled_before(fake, model) -> None:
    """Given two parts (a process stopped after them), one request asks for the rest, sending
    both back under the container named, its output capped at the budgets' cap as it is now
    (what the parts cost is counted in the budgets already), and the reply's usage is its own."""
    fake.queue(anthropic_message("Done.", usage={"input_tokens": 150, "output_tokens": 30}))
    one, two = _part("One. "), _part("Two. ")
    two = dataclasses.replace(two, data={**two.data, "container": "container_01"})
    resumed = dataclasses.replace(request(), paused=[one, two], max_output_tokens=100)
    response = await model.complete(resumed)
    assert response.text == "One. Two. Done."
    assert (response.usage.input_tokens, response.usage.output_tokens) == (150, 30)
    (body,) = fake.bodies
    assert [b.get("text") for b in body["messages"][-1]["content"]] == [
        "One. ",
        None,
        "Two. ",
        None,
    ]
    assert body["container"] == "container_01" and body["max_tokens"] == 100


async def test_parts_of_another_model_are_not_gone_on_from(fake, model) -> None:
    fake.queue(anthropic_message("Done."))
    other = dataclasses.replace(request(), paused=[_part("One. ", model="anthropic:other")])
    assert (await model.complete(other)).text == "Done."
    assert [m["role"] for m in fake.bodies[0]["messages"]] == ["user"]


async def test_parts_journaled_past_the_bound_fail_without_a_request(fake, model) -> None:
    parts = [_part(f"part {i}. ") for i in range(MAX_CONTINUATIONS + 1)]
    with pytest.raises(so.ModelError, match=f"paused its turn {MAX_CONTINUATIONS + 1} times") as e:
        await model.complete(dataclasses.replace(request(), paused=parts))
    assert fake.received == [] and e.value.usage is None  # each part was counted when journaled
    assert e.value.start_over


async def test_a_paused_part_of_the_wrong_shape_is_not_sent_back(fake, model) -> None:
    body = paused("Searching. ")
    body["content"].append(5)
    fake.queue(body)
    with pytest.raises(so.ModelError, match="content block that is not an object: int") as e:
        await model.complete(request())
    assert len(fake.received) == 1
    assert e.value.usage is not None and e.value.usage.output_tokens == 20


@pytest.mark.parametrize(
    ("limits", "sent", "left"),
    [
        (
            so.Limits(max_tokens=20000),
            [1024, 1024, 1024],
            "its next part would read at least 5000 input tokens (as many as its last part "
            "read), leaving not one output token",
        ),
        (so.Limits(max_cost_usd=0.02), [1024, 1024, 900], "not one output token was left"),
    ],
    ids=["tokens", "cost"],
)
async def test_each_continuation_holds_back_the_input_it_reads(
    store_url: str, limits: so.Limits, sent: list[int], left: str
) -> None:
    """Each part reads 5000 input tokens and writes 500 ($0.0075 on claude-haiku-4-5), and each
    continuation reads at least what the part before it read: held back first (in tokens, and
    at the cache-read price), its output is capped at what is left after it, and none is asked
    for once that leaves no output token. The person is asked before the budget is passed by
    more than one part's spend. Before, only each part's output was taken from the reply's cap:
    under max_tokens=20000 all nine parts were asked for at 1024 and the turn completed at
    49,500 tokens; under max_cost_usd=0.02 the person was asked only at $0.06."""
    with FakeLLM("anthropic", strict=True) as server:
        server.queue(
            *[paused(f"part {i}. ", SEARCH, usage=(5000, 500)) for i in range(MAX_CONTINUATIONS)],
            anthropic_message("Done.", usage={"input_tokens": 5000, "output_tokens": 500}),
        )
        claude = so.models.Anthropic(
            "claude-haiku-4-5", base_url=server.base_url, api_key=API_KEY, max_retries=0
        )
        agent = so.Agent(name="support", model=claude, tools=[], limits=limits)
        async with so.Runtime([agent], store=store_url) as rt:
            r = await rt.generate("support", prompt="policy?")
            [ask] = r.pending
            usage = (await rt.state(r.session_id)).usage
        await claude.aclose()
    assert (r.status, ask.kind) == ("waiting", "session-limit")
    assert ask.question is not None
    assert ask.question.startswith(f"the provider paused the model's reply, and {left}")
    assert [b["max_tokens"] for b in server.bodies] == sent
    assert (usage.input_tokens, usage.output_tokens) == (15000, 1500)
    assert usage.total_tokens < 20000 + 5500 and usage.cost_usd < 0.02 + 0.0075


async def test_a_continuation_after_a_continue_holds_back_the_last_parts_input(
    store_url: str,
) -> None:
    """The part (5000 in, 500 out) leaves 500 of max_tokens=6000, too few for the 5000 input
    tokens its continuation reads: the person is asked. `continue` raises the budget to 12000,
    and the continuation, sending the journaled part back, may write the 1500 left after its
    input. Before, no one was asked, and the continuation asked for the model's own 4096."""
    with FakeLLM("anthropic", strict=True) as server:
        server.queue(
            paused("Searching. ", SEARCH, usage=(5000, 500)),
            anthropic_message("Done.", usage={"input_tokens": 5100, "output_tokens": 200}),
        )
        claude = so.models.Anthropic(
            "claude-haiku-4-5",
            base_url=server.base_url,
            api_key=API_KEY,
            max_retries=0,
            max_tokens=4096,
        )
        limits = so.Limits(max_tokens=6000)
        agent = so.Agent(name="support", model=claude, tools=[], limits=limits)
        async with so.Runtime([agent], store=store_url) as rt:
            r = await rt.generate("support", prompt="policy?")
            [ask] = r.pending
            assert ask.question is not None
            assert "its next part would read at least 5000 input tokens" in ask.question
            answer = so.InputResponse(request_id=ask.id, option_id="continue")
            r = await rt.respond(r.session_id, [answer])
        await claude.aclose()
    assert (r.status, r.text) == ("completed", "Searching. Done.")
    first, second = server.bodies
    assert (first["max_tokens"], second["max_tokens"]) == (4096, 1500)
    assert [b.get("text") for b in second["messages"][-1]["content"]] == ["Searching. ", None]


async def test_a_resumed_paused_reply_the_budget_leaves_no_part_for_is_asked_about_as_live(
    store_url: str,
) -> None:
    """The part (5000 in) is journaled and the continuation fails (a 500); resumed under
    max_tokens=5400, the next part's 5000 input tokens leave no output token: the question
    says so of the paused reply, as the drive that journaled the part says it. Resumed, it
    spoke of "the model's next call", the wording of a new call."""
    with FakeLLM("anthropic", strict=True) as server:
        server.queue(
            paused("Searching. ", SEARCH, usage=(5000, 100)),
            Reply({"type": "error", "error": {"type": "api_error", "message": "down"}}, 500),
        )
        claude = so.models.Anthropic(
            "claude-haiku-4-5", base_url=server.base_url, api_key=API_KEY, max_retries=0
        )
        agent = so.Agent(name="support", model=claude, tools=[])
        async with so.Runtime([agent], store=store_url) as rt:
            r = await rt.generate("support", prompt="policy?")
            assert (r.status, r.retryable) == ("failed", True)
        limited = so.Agent(name="support", model=claude, limits=so.Limits(max_tokens=5400))
        async with so.Runtime([limited], store=store_url) as rt:
            again = await rt.generate(session_id=r.session_id)
        await claude.aclose()
    [ask] = again.pending
    assert ask.question is not None
    assert ask.question.startswith(
        "the provider paused the model's reply, and its next part would read at least 5000 "
        "input tokens"
    ), ask.question
    assert len(server.bodies) == 2  # the resumed drive asked the model for nothing
