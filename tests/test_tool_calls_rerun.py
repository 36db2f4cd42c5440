"""A call whose body runs again (`_tool_calls`): resumed after its drive was cut short, or once
the question it parked on is answered. The re-run gets the input its first run got (what
validation filled in: a `default_factory`'s id) and tells the model what the first run would
have (an approval policy's `so.Approved` reason)."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections.abc import Iterable
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SecretStr

import signoff as so
from signoff.testing import Capture, call, call_tools, reply, scripted_agent, tool_results

from ._steps import closed_mid_call

_WHY = "small refund, auto-approved"
_NOTE = {"approved": True, "by": "policy", "reason": _WHY}
_COUNTER = itertools.count(1)  # module level: tool hints are resolved in the module


def _ref() -> str:
    return f"ref-{next(_COUNTER)}"


Ref = Annotated[str, Field(default_factory=_ref)]


class Line(BaseModel):
    sku: str
    line_id: Ref


async def _started(rt: so.Runtime, session_id: str) -> list[dict[str, Any]]:
    return [e.data async for e in rt.events(session_id, follow=False) if e.type == "tool.started"]


async def test_an_ungated_call_gets_the_generated_value_of_its_first_run_after_asking(
    store_url: str,
) -> None:
    """An ungated call's input was validated again on every run of its body: a value generated
    for what the model left out (a `default_factory`'s id) was another one once the question
    the body parked on was answered, so the body asked another question than it had (a
    `ReplayError`), and steps after the question would have used another id than those before.
    Its `tool.started` records what was filled in, and the re-run gets it."""
    seen_refs: list[str] = []

    @so.tool
    async def transfer(ctx: so.ToolContext, amount: int, ref: Ref) -> dict[str, Any]:
        """Transfer money."""
        seen_refs.append(ref)
        paid = await ctx.step("pay", lambda: {"paid": amount, "ref": ref})
        answer = await ctx.ask(f"Confirm transfer {ref}?", options=["yes", "no"])
        return {"paid_ref": paid["ref"], "ref": ref, "answer": answer.value}

    seen = Capture(reply("ok"))
    agent = scripted_agent("a", [call_tools(call("transfer", amount=5)), seen], tools=[transfer])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="go")
        [question] = r.pending
        answer = so.InputResponse(request_id=question.id, option_id="yes")
        r = await rt.respond(r.session_id, [answer])
        assert r.status == "completed", r
        [started] = await _started(rt, r.session_id)
    first, again = seen_refs
    assert first == again and question.question == f"Confirm transfer {first}?"
    [result] = tool_results(seen.last)
    assert result.content == {"paid_ref": first, "ref": first, "answer": "yes"}
    assert started["filled"] == {"ref": first}


async def test_an_ungated_call_cut_short_resumes_with_the_generated_value_of_its_first_run(
    store_url: str,
) -> None:
    """The value is journaled before the body runs: a call cut short in its body by
    `Runtime.close` and resumed by another runtime gets the id its first run had."""
    seen_refs: list[str] = []
    started = threading.Event()
    turn: list[asyncio.Task[so.GenerateResult]] = []

    @so.tool
    async def transfer(amount: int, ref: Ref) -> str:
        """Transfer money."""
        seen_refs.append(ref)
        if len(seen_refs) == 1:
            started.set()
            await asyncio.sleep(3600)  # cut short by the close
        return ref

    def agent(seen: Capture) -> so.Agent:
        proposal = call_tools(call("transfer", amount=5))
        return scripted_agent("a", [proposal, seen], tools=[transfer])

    rt = so.Runtime([agent(Capture(reply("ok")))], store=store_url, lease_ttl=600)
    sid = await closed_mid_call(rt, "go", started, turn)
    seen = Capture(reply("ok"))
    async with so.Runtime([agent(seen)], store=store_url, lease_ttl=600) as again:
        r = await again.generate(session_id=sid)
        assert r.status == "completed", r
    first, resumed = seen_refs
    assert resumed == first
    [result] = tool_results(seen.last)
    assert result.content == first


async def test_values_generated_deep_in_the_input_are_kept_and_secrets_are_not(
    store_url: str,
) -> None:
    """Ids generated in the items of a list the model sent are kept by their place; a secret
    the model sent reaches the re-run whole, from its own input, and neither it nor one
    generated for it is recorded (its mask is left out of `filled`, as a reviewer's form's is;
    the question the body asks shows the call's input masked, as a request does)."""
    seen: list[tuple[list[str], str, str]] = []

    @so.tool
    async def order(
        ctx: so.ToolContext,
        lines: list[Line],
        token: SecretStr,
        nonce: Annotated[SecretStr, Field(default_factory=lambda: SecretStr("n-0"))],
    ) -> list[str]:
        """Place an order."""
        ids = [line.line_id for line in lines]
        seen.append((ids, token.get_secret_value(), nonce.get_secret_value()))
        await ctx.ask(f"Place {', '.join(ids)}?", options=["yes", "no"])
        return ids

    proposal = call("order", lines=[{"sku": "a"}, {"sku": "b", "line_id": "mine"}], token="t0k")
    agent = scripted_agent("a", [call_tools(proposal), reply("ok")], tools=[order])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="go")
        [question] = r.pending
        answer = so.InputResponse(request_id=question.id, option_id="yes")
        r = await rt.respond(r.session_id, [answer])
        assert r.status == "completed", r
        [started] = await _started(rt, r.session_id)
        log = json.dumps([e.data async for e in rt.events(r.session_id, follow=False)])
    (ids, token, nonce), again = seen
    assert again == (ids, "t0k", "n-0") and ids[1] == "mine" and ids[0].startswith("ref-")
    assert started["filled"] == {"lines": [{"line_id": ids[0]}, {}]}
    assert "n-0" not in log  # the model.completed holds "t0k" as the model gave it
    assert "**********" not in json.dumps(started)
    assert question.action is not None
    assert question.action.input["token"] == question.action.input["nonce"] == "**********"


async def test_an_ordinary_call_records_nothing_filled_in(store_url: str) -> None:
    """A call whose input validation fills in only plain defaults (or nothing) records no
    `filled`: those are given again each time, and every such call's `tool.started` stays as
    small as it was."""

    @so.tool
    async def search(query: str, limit: int = 10, tags: list[str] | None = None) -> str:
        """Search."""
        return f"{query}:{limit}:{tags}"

    calls = [call("search", query="x"), call("search", query="y", limit=3, tags=["t"])]
    agent = scripted_agent("a", [call_tools(*calls), reply("ok")], tools=[search])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="go")
        assert r.status == "completed", r
        started = await _started(rt, r.session_id)
    assert len(started) == 2 and all("filled" not in data for data in started)


async def test_a_policys_approved_reason_reaches_the_model_when_a_cut_short_call_resumes(
    store_url: str,
) -> None:
    """The note of an `so.Approved(reason)` was rebuilt on a re-run only from a person's
    decision: a call a policy let run, cut short in its body by `Runtime.close` and resumed by
    another runtime, gave the model its bare result, not the reason beside it as the turn run
    through did."""
    runs: list[int] = []
    started = threading.Event()
    turn: list[asyncio.Task[so.GenerateResult]] = []

    @so.tool(approval=lambda input: so.Approved(_WHY))
    async def refund(amount: int) -> dict[str, int]:
        """Refund an amount."""
        runs.append(amount)
        if len(runs) == 1:
            started.set()
            await asyncio.sleep(3600)  # cut short by the close
        return {"refunded": amount}

    def agent(seen: Capture) -> so.Agent:
        return scripted_agent("a", [call_tools(call("refund", amount=5)), seen], tools=[refund])

    rt = so.Runtime([agent(Capture(reply("ok")))], store=store_url, lease_ttl=600)
    sid = await closed_mid_call(rt, "go", started, turn)
    seen = Capture(reply("ok"))
    async with so.Runtime([agent(seen)], store=store_url, lease_ttl=600) as again:
        r = await again.generate(session_id=sid)
        assert r.status == "completed", r
        events = [e async for e in again.events(sid, follow=False)]
    [result] = tool_results(seen.last)
    assert result.content == {"result": {"refunded": 5}, "approval": _NOTE}
    assert runs == [5, 5]
    [started_event] = [e for e in events if e.type == "tool.started"]
    assert started_event.data["policy_reason"] == _WHY  # recorded once, read back


async def test_a_policys_approved_reason_reaches_the_model_after_the_call_asked(
    store_url: str,
) -> None:
    """A workflow call a policy let run parks on `ctx.ask` and runs again once answered: its
    result carries the policy's reason as it would have without the question."""

    @so.tool(approval=lambda input: so.Approved(_WHY))
    async def refund(ctx: so.ToolContext, amount: int) -> dict[str, Any]:
        """Refund an amount, once the customer confirms."""
        answer = await ctx.ask(f"Refund {amount}?", options=["yes", "no"])
        return {"refunded": amount, "answer": answer.value}

    seen = Capture(reply("ok"))
    agent = scripted_agent("a", [call_tools(call("refund", amount=5)), seen], tools=[refund])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="go")
        [question] = r.pending
        answer = so.InputResponse(request_id=question.id, option_id="yes")
        r = await rt.respond(r.session_id, [answer])
        assert r.status == "completed", r
    [result] = tool_results(seen.last)
    assert result.content == {"result": {"refunded": 5, "answer": "yes"}, "approval": _NOTE}


def _shout(value: str) -> str:
    return value + "!"


Shouted = Annotated[str, AfterValidator(_shout), Field(default_factory=_ref, validate_default=True)]


async def test_a_generated_value_a_validator_changes_is_not_changed_twice(store_url: str) -> None:
    """A generated value that a validator changes (`validate_default`) is kept as the body got
    it; given back as input, it is not that value: the re-run validates the model's input as
    before the values were kept, rather than run with the value changed twice."""
    seen_refs: list[str] = []

    @so.tool
    async def transfer(ctx: so.ToolContext, ref: Shouted) -> str:
        """Transfer money."""
        seen_refs.append(ref)
        await ctx.ask("Go on?", options=["yes", "no"])
        return ref

    agent = scripted_agent("a", [call_tools(call("transfer")), reply("ok")], tools=[transfer])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="go")
        [question] = r.pending
        answer = so.InputResponse(request_id=question.id, option_id="yes")
        r = await rt.respond(r.session_id, [answer])
        assert r.status == "completed", r
    assert len(seen_refs) == 2 and all(ref.count("!") == 1 for ref in seen_refs)


_FALLING = itertools.count()


def _falling_id() -> str:
    """An id that sorts before the one made before it: a set's form, sorted by its items' JSON
    text (the id first), lists them in the reverse of the model's order."""
    return f"id-{999 - next(_FALLING):03d}"


class Stock(BaseModel):
    model_config = ConfigDict(frozen=True)
    sku: str
    line_id: str = Field(default_factory=_falling_id)


def _by_sku(items: list[Stock]) -> list[Stock]:
    return sorted(items, key=lambda item: item.sku)


async def _reserve_twice(store_url: str, order: so.Tool, skus: str) -> tuple[Any, Any, Any]:
    """Run `order` (a workflow tool that reserves each item by its id, then asks) on items of
    `skus` and answer its question: its `tool.started`'s `filled` and the result."""
    seen = Capture(reply("ok"))
    proposal = call("order", items=[{"sku": sku} for sku in skus])
    agent = scripted_agent("a", [call_tools(proposal), seen], tools=[order])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="go")
        [question] = r.pending
        answer = so.InputResponse(request_id=question.id, option_id="yes")
        r = await rt.respond(r.session_id, [answer])
        assert r.status == "completed", r
        [started] = await _started(rt, r.session_id)
    [result] = tool_results(seen.last)
    return started.get("filled"), result.content, question.question


async def _reserved(ctx: so.ToolContext, items: Iterable[Stock], runs: list[Any]) -> Any:
    pairs = sorted((item.sku, item.line_id) for item in items)
    runs.append(pairs)
    done = {sku: await ctx.step(f"reserve {i}", lambda s=sku: f"held-{s}") for sku, i in pairs}
    await ctx.ask(f"Confirm {pairs}?", options=["yes", "no"])
    return done


async def test_a_sets_generated_ids_stay_on_their_items_when_the_body_runs_again(
    store_url: str,
) -> None:
    """The ids validation generated in a set's items were recorded by their place in its form,
    which sorts the items by their JSON text (the id too), and put back by the same places in
    the model's items: the re-run gave each item another's id, silently replaying one item's
    step result for another. Such an input's whole form is recorded, and the re-run gets the
    items as the first run had them."""
    runs: list[Any] = []

    @so.tool
    async def order(ctx: so.ToolContext, items: frozenset[Stock]) -> Any:
        """Reserve each item, then confirm."""
        return await _reserved(ctx, items, runs)

    filled, result, _ = await _reserve_twice(store_url, order, "abcd")
    first, again = runs
    assert again == first
    assert result == {sku: f"held-{sku}" for sku in "abcd"}
    assert isinstance(filled, list) and len(filled) == 1
    assert sorted((i["sku"], i["line_id"]) for i in filled[0]["items"]) == first


async def test_a_lists_generated_ids_stay_on_their_items_where_a_validator_sorts_it(
    store_url: str,
) -> None:
    """A list a validator sorts: its form's places are not the model's, so the ids put back by
    place validated to other ones, and the re-run generated new ids and raised a `ReplayError`
    after a person had answered. The re-run gets the first run's items."""
    runs: list[Any] = []

    @so.tool
    async def order(
        ctx: so.ToolContext, items: Annotated[list[Stock], AfterValidator(_by_sku)]
    ) -> Any:
        """Reserve each item, then confirm."""
        return await _reserved(ctx, items, runs)

    filled, result, question = await _reserve_twice(store_url, order, "dcba")
    first, again = runs
    assert again == first and question == f"Confirm {first}?"
    assert result == {sku: f"held-{sku}" for sku in "abcd"}
    assert isinstance(filled, list) and len(filled) == 1
