"""Tools made or used with arguments of the wrong type: a `UsageError` naming the mistake, when
the tool is made or at the call that misuses it, not a TypeError later (a replay in another
process, or the provider refusing every model call)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import signoff as so


async def lookup(order_id: str) -> str:
    """Look an order up."""
    return order_id


@pytest.mark.parametrize("description", [5, ["Look"], b"Look"], ids=["int", "list", "bytes"])
def test_a_description_that_is_not_text_is_refused(description: Any) -> None:
    """It was kept as it was and sent to the provider as the tool's description."""
    with pytest.raises(so.UsageError, match="^tool 'lookup': description must be text, not "):
        so.tool(description=description)(lookup)
    with pytest.raises(so.UsageError, match=r"^delegate\('b'\): description must be text, not "):
        so.delegate("b", description=description)


def test_an_empty_name_is_refused_not_replaced_by_the_functions() -> None:
    with pytest.raises(so.UsageError, match="^tool name '' must be 1 to 64"):
        so.tool(name="")(lookup)
    with pytest.raises(so.UsageError, match=r"^delegate\('b'\): '' is not a valid tool name"):
        so.delegate("b", name="")
    assert so.tool(lookup).name == "lookup" and so.delegate("b").name == "b"


@pytest.mark.parametrize("name", [5, None, ["b"]], ids=["int", "none", "list"])
def test_a_delegate_name_that_is_not_text_is_refused(name: Any) -> None:
    """A number was a TypeError from the name's pattern (`expected string`)."""
    if name is None:
        assert so.delegate("b", name=name).name == "b"  # None: the agent's name
        return
    with pytest.raises(so.UsageError, match=r"^delegate\('b'\): .* is not a valid tool name"):
        so.delegate("b", name=name)


@pytest.mark.parametrize(
    ("name", "fn", "said"),
    [
        (("quote", 1), lambda: 7, "ctx.step() needs a name (non-empty text), not ('quote', 1)"),
        (5, lambda: 7, "ctx.step() needs a name (non-empty text), not 5"),
        ("", lambda: 7, "ctx.step() needs a name (non-empty text), not ''"),
        ("quote", None, "ctx.step('quote', fn): fn must be a function, not None"),
    ],
    ids=["tuple", "int", "empty", "fn-none"],
)
def test_a_step_misnamed_or_without_a_function_is_a_usage_error_before_it_runs(
    tmp_path: Path, name: Any, fn: Any, said: str
) -> None:
    """A tuple name was journaled as a list: the replay in another process (after the question
    below was answered) failed the call with `unhashable type: 'list'`, the step having run.
    A step with no function journaled the TypeError of calling it as the step's failure."""
    seen: list[str] = []

    @so.tool
    async def work(ctx: so.ToolContext, n: int) -> str:
        """Work in steps."""
        try:
            await ctx.step(name, fn)
        except so.UsageError as exc:
            seen.append(str(exc))
        answer = await ctx.ask("go on?", options=["yes", "no"])
        return answer.value

    call = so.ModelResponse(tool_calls=[so.ToolCall(name="work", input={"n": 1})])
    model = so.models.Scripted([call, so.ModelResponse(text="done")])
    agent = so.Agent(name="a", model=model, tools=[work])
    with so.Runtime([agent], f"sqlite:///{tmp_path}/s.db") as rt:
        r = rt.generate_sync("a", prompt="work")
        assert r.status == "waiting"
        [request] = r.pending
        journaled = [e.type for e in rt.events_sync(r.session_id)]
    assert seen == [said]
    assert "tool.step" not in journaled  # nothing ran, nothing journaled
    # Answered by another process: the call replays to its question, and ends.
    model = so.models.Scripted([call, so.ModelResponse(text="done")])
    agent = so.Agent(name="a", model=model, tools=[work])
    with so.Runtime([agent], f"sqlite:///{tmp_path}/s.db") as rt:
        answer = {"request_id": request.id, "option_id": request.options[0].id}
        done = rt.respond_sync(r.session_id, [answer])
        assert done.status == "completed", done.error
        result = (rt.state_sync(r.session_id).messages or [])[-2]
    assert isinstance(result, so.ToolResultMessage) and not result.is_error, result
    assert seen == [said, said]


async def test_a_step_name_over_the_limit_is_too_large_and_nothing_is_journaled(
    store_url: str,
) -> None:
    """A name of megabytes (a step named after the data it handles) was journaled whole into
    the session's log: it is `TooLarge` at the call, the step does not run, nothing is stored;
    a name of exactly `MAX_STEP_NAME_CHARS` is journaled as any other."""
    from signoff._tool_context import MAX_STEP_NAME_CHARS

    ran: list[str] = []
    said: list[str] = []

    def quote() -> int:
        ran.append("quote")
        return 7

    @so.tool
    async def work(ctx: so.ToolContext, n: int) -> str:
        """Work in steps."""
        try:
            await ctx.step("q" * 10_000_000, quote)
        except so.TooLarge as exc:
            said.append(str(exc))
        return str(await ctx.step("k" * MAX_STEP_NAME_CHARS, quote))

    call = so.ModelResponse(tool_calls=[so.ToolCall(name="work", input={"n": 1})])
    model = so.models.Scripted([call, so.ModelResponse(text="done")])
    agent = so.Agent(name="a", model=model, tools=[work])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="work")
        assert r.status == "completed", r.error
        events = [e async for e in rt.events(r.session_id, follow=False)]
    (message,) = said
    assert message.startswith("ctx.step(): a step name of 10000000 characters, over the limit of ")
    assert len(message) < 300, message
    assert ran == ["quote"]  # the step within the limit only
    steps = [e.data for e in events if e.type == "tool.step"]
    assert [s["name"] for s in steps] == ["k" * MAX_STEP_NAME_CHARS]
    assert max(len(json.dumps(e.data)) for e in events) < 20_000


async def test_a_step_journaled_with_a_longer_name_before_the_limit_still_replays(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call parked across the upgrade that brought the limit, whose journal holds a step named
    with more characters (recorded by a signoff without it, played here by lifting the limit),
    replays that step: it raised `TooLarge` on replay, failing a call whose step had run."""
    from signoff import _tool_context

    ran: list[str] = []
    name = "fetch " + "https://example.com/" * 100  # 2,006 characters

    def fetch() -> str:
        ran.append("fetch")
        return "page"

    @so.tool
    async def work(ctx: so.ToolContext) -> str:
        """Fetch a page, then ask."""
        page = await ctx.step(name, fetch)
        answer = await ctx.ask("Keep it?", options=["yes", "no"])
        return f"{page} {answer.value}"

    call = so.ModelResponse(tool_calls=[so.ToolCall(name="work", input={})])
    model = so.models.Scripted([call, so.ModelResponse(text="done")])
    agent = so.Agent(name="a", model=model, tools=[work])
    monkeypatch.setattr(_tool_context, "MAX_STEP_NAME_CHARS", 10_000)  # the older signoff
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="work")
        assert [p.question for p in r.pending] == ["Keep it?"]
    monkeypatch.undo()
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.send(r.session_id, "yes")
        assert r.status == "completed", r.error
        events = [e async for e in rt.events(r.session_id, follow=False)]
    [result] = [e.data for e in events if e.type == "tool.completed"]
    assert (result["status"], result["result"]) == ("ok", "page yes")
    assert ran == ["fetch"]
