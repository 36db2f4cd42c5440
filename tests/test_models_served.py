"""A reply priced at the model that made it: a gateway's router or fallback (LiteLLM, a proxy
answering for an overloaded model) names in the reply's `model` another model than the one asked
for, and bills at its price. With no `price_per_mtok=` given, the list price of the model the
reply names counts when it is known; else the one asked for's. Through the real SDKs against
loopback fakes."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from pydantic import ValidationError

import signoff as so
from signoff.stores._codec import pack, unpack_event

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


ODD = "gpt-x\x1b[2J\n\u202eevil"
"""A model name that would clear a terminal and reverse the text after it where it is shown."""


@pytest.mark.parametrize("name", [ODD, "gpt\u200b-4o", "gpt-4o\t"])
def test_a_model_name_that_is_not_printable_is_refused(name: str) -> None:
    """docs/events.md says `model` is printable: a custom model's reply naming `ODD` was recorded
    as given. It is refused as a name too long is, naming the field."""
    with pytest.raises(ValidationError, match="model's name must be printable"):
        so.ModelResponse(text="hi", model=name)
    assert so.ModelResponse(text="hi", model="gpt-4o 2024 (EU)").model == "gpt-4o 2024 (EU)"


async def test_a_reply_naming_an_unprintable_model_fails_the_turn_unrecorded(
    tmp_path: Path,
) -> None:
    """A custom model's reply naming `ODD` fails the step as a model error (retryable), whether
    it raised building the reply or built it past validation, and no `model.completed` holds
    the name."""

    def built(conversation: list[so.Message]) -> so.ModelResponse:
        return so.ModelResponse(text="hi", model=ODD)

    unchecked = so.ModelResponse.model_construct(
        text="hi", tool_calls=[], usage=so.Usage(), reasoning=[], model=ODD
    )
    agents = [
        so.Agent(name="built", model=so.models.Scripted([built])),
        so.Agent(name="unchecked", model=so.models.Scripted([unchecked])),
    ]
    async with so.Runtime(agents, store=f"sqlite:///{tmp_path}/s.db") as rt:
        for name, said in [("built", "model's name must be printable"), ("unchecked", "model is ")]:
            r = await rt.generate(name, prompt="hi")
            assert (r.status, r.retryable) == ("failed", True)
            assert r.error is not None and r.error["code"] == "model_error"
            assert said in r.error["message"] and ODD not in r.error["message"]
            log = [e async for e in rt.events(r.session_id, follow=False)]
            assert not [e for e in log if e.type == "model.completed"]


async def test_a_stored_reply_naming_an_unprintable_model_still_loads(tmp_path: Path) -> None:
    """The check is on replies made from now on: a `model.completed` recorded before it with
    such a name is read back as stored (events are not read through `ModelResponse`), and its
    session goes on."""
    db = tmp_path / "s.db"
    steps = [so.ModelResponse(text="hi", model="gpt-x"), so.ModelResponse(text="again")]
    agent = so.Agent(name="a", model=so.models.Scripted(steps))
    async with so.Runtime([agent], store=f"sqlite:///{db}") as rt:
        sid = (await rt.generate("a", prompt="hi")).session_id
    with sqlite3.connect(db) as conn:  # as an older signoff recorded it
        (sk,) = conn.execute("SELECT sk FROM sessions WHERE id=?", (sid,)).fetchone()
        rows = conn.execute(
            "SELECT seq, data FROM events WHERE sk=? ORDER BY seq", (sk,)
        ).fetchall()
        stored = [data for _, data in rows]
        values = [unpack_event(d, *reversed(stored[:i])) for i, d in enumerate(stored)]
        for (seq, _), value in zip(rows, values, strict=True):
            if value.get("model") == "gpt-x":
                value["model"] = ODD
            conn.execute("UPDATE events SET data=? WHERE sk=? AND seq=?", (pack(value), sk, seq))
    async with so.Runtime([agent], store=f"sqlite:///{db}") as rt:
        log = [e async for e in rt.events(sid, follow=False)]
        assert [e.data.get("model") for e in log if e.type == "model.completed"] == [ODD]
        assert (await rt.state(sid)).status == "idle"
        assert (await rt.generate(session_id=sid, prompt="more")).text == "again"
