"""Tool-call ids on the wire: a session's history must be sendable to either provider, whichever
model produced its ids, so each adapter maps them to ids its API accepts."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import signoff as so

from .fakes.llm import API_KEY, FakeLLM, anthropic_message, openai_completion, openai_tool_call


@pytest.fixture
def openai_fake() -> Iterator[FakeLLM]:
    with FakeLLM("openai", strict=True) as server:
        yield server


@pytest.fixture
def anthropic_fake() -> Iterator[FakeLLM]:
    with FakeLLM("anthropic", strict=True) as server:
        yield server


@so.tool
async def lookup_order(order_id: str) -> dict[str, object]:
    """Look an order up."""
    return {"order_id": order_id, "total": 180.0}


def agent(model: so.models.Model) -> so.Agent:
    return so.Agent(name="support", model=model, tools=[lookup_order])


def openai_model(fake: FakeLLM) -> so.models.OpenAIChat:
    return so.models.OpenAIChat("gpt-4.1-mini", base_url=fake.base_url, api_key=API_KEY)


def anthropic_model(fake: FakeLLM) -> so.models.Anthropic:
    return so.models.Anthropic("claude-haiku-4-5", base_url=fake.base_url, api_key=API_KEY)


async def test_ids_an_openai_compatible_server_reused_reach_anthropic_valid_and_unique(
    openai_fake: FakeLLM, anthropic_fake: FakeLLM, tmp_path: Path
) -> None:
    # Some compatible servers number calls per response ("functions.lookup_order:0" each time):
    # Anthropic refuses both the ':' and '.' and a repeated id with a 400, every later request.
    reused = "functions.lookup_order:0"
    openai_fake.queue(
        openai_completion(None, [openai_tool_call(reused, "lookup_order", {"order_id": "1"})]),
        openai_completion(None, [openai_tool_call(reused, "lookup_order", {"order_id": "2"})]),
        openai_completion("Both cost 180."),
    )
    store = f"sqlite:///{tmp_path}/s.db"
    async with openai_model(openai_fake) as m, so.Runtime([agent(m)], store=store) as rt:
        r = await rt.generate("support", prompt="What did orders 1 and 2 cost?")
        assert (r.status, r.error) == ("completed", None)
    anthropic_fake.queue(anthropic_message("Yes."), anthropic_message("Still yes."))
    async with anthropic_model(anthropic_fake) as a, so.Runtime([agent(a)], store=store) as rt:
        r = await rt.generate(session_id=r.session_id, prompt="Are you sure?")
        assert (r.status, r.error, r.text) == ("completed", None, "Yes.")
        r = await rt.generate(session_id=r.session_id, prompt="Really?")
        assert (r.status, r.error) == ("completed", None)
    first, second = anthropic_fake.bodies
    uses = [b["id"] for m in first["messages"] for b in m["content"] if b["type"] == "tool_use"]
    results = [
        b["tool_use_id"]
        for m in first["messages"]
        for b in m["content"]
        if b["type"] == "tool_result"
    ]
    assert len(set(uses)) == 2 and results == uses
    # the same stored history always gives the same request (and so the same prompt cache)
    assert second["messages"][: len(first["messages"])] == first["messages"]


async def test_ids_longer_than_openai_takes_are_shortened(openai_fake: FakeLLM, tmp_path) -> None:
    # A gateway's ids (a Responses-API "fc_..." id is 53 characters) made every later request
    # to OpenAI itself fail: it refuses a tool call id of more than 40 characters.
    long_id = "fc_" + "0f0e50a1476a6c35006912c58dc9f8819192c25864eb16f07f"
    openai_fake.queue(
        openai_completion(None, [openai_tool_call(long_id, "lookup_order", {"order_id": "1"})]),
        openai_completion("It costs 180."),
    )
    store = f"sqlite:///{tmp_path}/s.db"
    async with openai_model(openai_fake) as m, so.Runtime([agent(m)], store=store) as rt:
        r = await rt.generate("support", prompt="What did order 1 cost?")
        assert (r.status, r.error, r.text) == ("completed", None, "It costs 180.")
    assistant, result = openai_fake.bodies[1]["messages"][-2:]
    [call] = assistant["tool_calls"]
    assert len(call["id"]) <= 40 and result["tool_call_id"] == call["id"]


def test_the_mapping_keeps_fitting_ids_and_separates_the_rest() -> None:
    from signoff.models._ids import anthropic_id_fits, openai_id_fits, wire_ids

    def turn(*ids: str | None) -> list[so.Message]:
        calls = [so.ToolCall(name="t", input={}, id=i) for i in ids]
        results = [so.ToolResultMessage(call_id=i or "", tool_name="t", content=1) for i in ids]
        return [so.AssistantMessage(tool_calls=calls), *results]

    history = [*turn("toolu_a", "a.b", "a:b"), *turn("toolu_a", "a_b"), *turn(None)]
    for fits in (anthropic_id_fits, openai_id_fits):
        sent = wire_ids(history, fits)
        assert sent == wire_ids(history, fits)  # deterministic
        calls = [c.id for m in sent if isinstance(m, so.AssistantMessage) for c in m.tool_calls]
        results = [m.call_id for m in sent if isinstance(m, so.ToolResultMessage)]
        assert results == calls and len(set(calls)) == 6
        assert all(isinstance(i, str) and fits(i) for i in calls)
        assert calls[0] == "toolu_a"
    assert wire_ids(history, openai_id_fits)[2].call_id == "a.b"  # OpenAI takes it as it is


async def test_a_tool_name_openai_refuses_does_not_poison_the_session(
    openai_fake: FakeLLM, tmp_path: Path
) -> None:
    # Models call tools that do not exist, with names like "multi_tool_use.parallel": the call
    # gets an error result, but OpenAI refuses such a name in the history with a 400, forever.
    openai_fake.queue(
        openai_completion(None, [openai_tool_call("call_p", "multi_tool_use.parallel", {})]),
        openai_completion("Let me look it up properly."),
    )
    store = f"sqlite:///{tmp_path}/s.db"
    async with openai_model(openai_fake) as m, so.Runtime([agent(m)], store=store) as rt:
        r = await rt.generate("support", prompt="What did order 1 cost?")
        assert (r.status, r.error) == ("completed", None)
    assistant, result = openai_fake.bodies[1]["messages"][-2:]
    [call] = assistant["tool_calls"]
    assert (call["id"], call["function"]["name"]) == ("call_p", "multi_tool_use_parallel")
    assert "unknown tool 'multi_tool_use.parallel'" in result["content"]


async def test_a_huge_made_up_tool_name_is_not_sent_back_on_every_later_call(
    openai_fake: FakeLLM, tmp_path: Path
) -> None:
    """A name of 300,000 characters (a model looping) was repeated whole twice in its call's
    error result (its prefix and the unknown-tool error), 600 KB on every later call of the
    session; the call and its result now show the name as the wire does, or cut."""
    name = "lookup" * 50_000
    openai_fake.queue(
        openai_completion(None, [openai_tool_call("call_p", name, {})]),
        openai_completion("Let me look it up properly."),
    )
    store = f"sqlite:///{tmp_path}/s.db"
    async with openai_model(openai_fake) as m, so.Runtime([agent(m)], store=store) as rt:
        r = await rt.generate("support", prompt="What did order 1 cost?")
        assert (r.status, r.error) == ("completed", None)
    assert len(json.dumps(openai_fake.bodies[1])) < 5_000
    result = openai_fake.bodies[1]["messages"][-1]["content"]
    assert result.startswith(f"ERROR: the call to {name[:64]} failed.")
    assert f"unknown tool '{name[:100]} [cut]'" in result


@so.tool(approval=so.always())
async def issue_refund(order_id: str, amount: float) -> dict[str, object]:
    """Refund an order."""
    return {"refunded": amount, "order_id": order_id}


def tool_use(call_id: str, name: str, input: object) -> dict[str, object]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": input}


async def test_a_parked_turn_moves_between_providers_with_parallel_calls_and_a_question(
    openai_fake: FakeLLM, anthropic_fake: FakeLLM, tmp_path: Path
) -> None:
    cards = [{"label": c, "description": f"The {c} card."} for c in ("Visa", "Amex")]
    ask = {"question": "Which card?", "options": cards}
    openai_fake.queue(
        openai_completion(
            None,
            [
                openai_tool_call("functions.lookup_order:0", "lookup_order", {"order_id": "1"}),
                openai_tool_call(
                    "functions.issue_refund:1", "issue_refund", {"order_id": "1", "amount": 5}
                ),
                openai_tool_call("functions.ask_question:2", "ask_question", ask),
            ],
        ),
        openai_completion("All refunded."),
    )
    anthropic_fake.queue(
        anthropic_message(
            "One more.", tool_use("toolu_2", "issue_refund", {"order_id": "2", "amount": 7})
        )
    )
    tools = [lookup_order, issue_refund, so.ask_question()]
    store = f"sqlite:///{tmp_path}/s.db"

    def approve(request: so.InputRequest) -> so.Decision:
        return so.Decision(id=request.id, approved=True)

    def runtime(model: so.models.Model) -> so.Runtime:
        return so.Runtime([so.Agent(name="support", model=model, tools=tools)], store=store)

    async with openai_model(openai_fake) as m, runtime(m) as rt:
        r = await rt.generate("support", prompt="Refund order 1")
        assert [p.kind for p in r.pending] == ["question"]  # the approval is asked after it
        sid = r.session_id
    async with anthropic_model(anthropic_fake) as a, runtime(a) as rt:
        r = await rt.send(sid, "Amex")
        [approval] = r.pending
        r = await rt.generate(session_id=sid, approvals=[approve(approval)])
        assert (r.status, r.error) == ("waiting", None)
        [approval] = r.pending
        assert approval.call_id == "toolu_2"
    async with openai_model(openai_fake) as m, runtime(m) as rt:
        r = await rt.generate(session_id=sid, approvals=[approve(approval)])
        assert (r.status, r.error, r.text.endswith("All refunded.")) == ("completed", None, True)
    [sent] = anthropic_fake.bodies
    results = [b for b in sent["messages"][-1]["content"] if b["type"] == "tool_result"]
    assert len(results) == 3 and not any(b.get("is_error") for b in results)
    assert any("Amex" in b["content"] for b in results)
    history = openai_fake.bodies[-1]["messages"]
    assert [m["role"] for m in history] == [
        "user",
        "assistant",
        "tool",
        "tool",
        "tool",
        "assistant",
        "tool",
    ]
    assert history[5]["tool_calls"][0]["id"] == history[6]["tool_call_id"] == "toolu_2"


async def test_ids_that_differ_only_in_lone_surrogates_stay_apart_on_openai(
    openai_fake: FakeLLM, tmp_path: Path
) -> None:
    # A request cannot carry a lone surrogate, so each became U+FFFD on the way out: two calls
    # "\ud800" and "\udc00" were sent with one id, refused with a 400 on every later request.
    openai_fake.queue(
        openai_completion(
            None,
            [
                openai_tool_call("\ud800", "lookup_order", {"order_id": "1"}),
                openai_tool_call("\udc00", "lookup_order", {"order_id": "2"}),
            ],
        ),
        openai_completion("Both cost 180."),
    )
    store = f"sqlite:///{tmp_path}/s.db"
    async with openai_model(openai_fake) as m, so.Runtime([agent(m)], store=store) as rt:
        r = await rt.generate("support", prompt="What did orders 1 and 2 cost?")
        assert (r.status, r.error, r.text) == ("completed", None, "Both cost 180.")
    assistant, *results = openai_fake.bodies[1]["messages"][-3:]
    ids = [c["id"] for c in assistant["tool_calls"]]
    assert len(set(ids)) == 2 and [m["tool_call_id"] for m in results] == ids
    assert "\ufffd" not in "".join(ids)


def _old_unique(call_id: str | None, fits: Callable[[str], bool], used: set[str]) -> str:
    """The search for a free wire id as it was before it resumed (kept to compare with)."""
    from signoff.models._ids import _derived

    base = call_id if call_id and fits(call_id) else _derived(call_id)
    wire, n = base, 1
    while wire in used:
        n += 1
        wire = f"{base}_{n}"
        if not fits(wire):
            base = _derived(call_id)
            wire = f"{base}_{n}"
    used.add(wire)
    return wire


def _sent_call_ids(history: list[so.Message], fits: Callable[[str], bool]) -> list[str | None]:
    from signoff.models._ids import wire_ids

    sent = wire_ids(history, fits)
    return [c.id for m in sent if isinstance(m, so.AssistantMessage) for c in m.tool_calls]


def test_wire_ids_are_those_the_search_from_the_start_gave() -> None:
    """Ids are sent again with every later request, so resuming the search for a free id must
    give exactly the ids that searching from the start did: including when a later call's own
    id is one made for an earlier (`x_2`), a suffix makes an id too long (`y` * 39 + `_10`), or
    an id fits with some suffixes and not others."""
    from signoff.models._ids import _derived, anthropic_id_fits, openai_id_fits

    pool: list[str | None] = [
        *("x", "x_2", "x_3", "x_2_2", "x_10", "x_2_3"),
        *("a.b", "a:b", _derived("a.b"), _derived("a.b") + "_2", _derived("a:b") + "_3"),
        *("y" * 38, "y" * 38 + "_2", "y" * 39, "y" * 39 + "_2", "y" * 40),
        *(None, "", "call_" + "0" * 5, "\ud800", "functions.lookup:0"),
    ]
    fitting: list[Callable[[str], bool]] = [
        anthropic_id_fits,
        openai_id_fits,
        lambda i: len(i) <= 6,
        lambda i: not i.endswith(("_3", "_5")),
    ]
    rng = random.Random(58)
    for trial in range(300):
        ids = [rng.choice(pool) for _ in range(rng.randint(1, 60))]
        history: list[so.Message] = [so.UserMessage(text="hi")]
        i = 0
        while i < len(ids):
            batch = ids[i : i + rng.randint(1, 4)]
            i += len(batch)
            history.append(
                so.AssistantMessage(
                    tool_calls=[so.ToolCall(id=c, name="t", input={}) for c in batch]
                )
            )
            history += [
                so.ToolResultMessage(call_id=c or "", tool_name="t", content=1) for c in batch
            ]
        for fits in fitting:
            used: set[str] = set()
            assert _sent_call_ids(history, fits) == [_old_unique(c, fits, used) for c in ids], trial


def test_wire_ids_for_calls_sharing_one_id_take_linear_work() -> None:
    """A server that numbers its calls per reply (Kimi's `functions.lookup:0`) gives every call
    one id: the search for a free one started from `_2` each time, so converting a conversation
    of 4,000 such calls took seconds on the event loop, before every model call."""
    from signoff.models._ids import anthropic_id_fits, openai_id_fits

    calls = 2000
    for reused, fits in (
        ("functions.lookup:0", anthropic_id_fits),
        ("functions.lookup:0", openai_id_fits),
        ("call_0", openai_id_fits),
        ("y" * 38, openai_id_fits),  # `_10` on makes it too long: derived ids from there
    ):
        history: list[so.Message] = [so.UserMessage(text="hi")]
        for n in range(calls):
            call = so.ToolCall(id=reused, name="lookup", input={"q": n})
            history.append(so.AssistantMessage(tool_calls=[call]))
            history.append(so.ToolResultMessage(call_id=reused, tool_name="lookup", content=1))
        asked = 0

        def counted(call_id: str, fits: Callable[[str], bool] = fits) -> bool:
            nonlocal asked
            asked += 1
            return fits(call_id)

        ids = _sent_call_ids(history, counted)
        assert len(set(ids)) == calls
        assert asked <= 3 * calls, (reused, asked)  # searching from the start: ~2,000,000
