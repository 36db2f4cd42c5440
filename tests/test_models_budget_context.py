"""The input a session's budgets hold back for its next model call is what its last call read
that the conversation keeps: all its input, unless the response says less
(`ModelResponse.context_tokens`), as `Anthropic` does for a reply in which its server tools ran
or a paused turn was read again (their input is billed, not sent again: how much is not known).
Runtime tests run on both stores."""

from __future__ import annotations

import pydantic
import pytest

import signoff as so
from signoff.testing import ExecutionLog, call, call_tools, reply

from ._models import request
from .fakes.llm import API_KEY, FakeLLM, anthropic_message

ALICE = so.Principal(authenticator="test", principal_id="alice")


def test_context_tokens_is_a_whole_number_or_none() -> None:
    assert so.ModelResponse().context_tokens is None
    with pytest.raises(pydantic.ValidationError):
        so.ModelResponse(context_tokens=-1)


def refund_agent(log: ExecutionLog, model: object, limits: so.Limits) -> so.Agent:
    @log.tool(approval=so.always())
    async def refund(charge_id: str) -> str:
        """Refund a charge."""
        return "refunded"

    return so.Agent(name="a", model=model, tools=[refund], limits=limits)  # type: ignore[arg-type]


async def test_the_next_call_holds_back_what_the_conversation_keeps(store_url: str) -> None:
    """max_tokens=1000; the first reply read 800 tokens, of which the conversation keeps 100:
    the next call is made (held back: 100) where before it was refused (held back: 800, which
    left no output token), also in a new process that folds it from the log."""
    first = call_tools(call("refund", charge_id="a"), usage=so.Usage(input_tokens=800))
    first = first.model_copy(update={"context_tokens": 100})
    steps = [first, reply("done", usage=so.Usage(input_tokens=120, output_tokens=5))]
    limits = so.Limits(max_tokens=1000)
    log = ExecutionLog()
    async with so.Runtime(
        [refund_agent(log, so.models.Scripted(steps), limits)], store=store_url
    ) as rt:
        r = await rt.generate("a", prompt="refund", auth=ALICE)
        [ask] = r.pending
    again = refund_agent(log, so.models.Scripted(steps), limits)
    async with so.Runtime([again], store=store_url) as rt:
        answer = so.InputResponse(request_id=ask.id, option_id="approve")
        r = await rt.respond(r.session_id, [answer], principal=ALICE)
        assert (r.status, r.text) == ("completed", "done")
    assert log.count() == 1


SEARCH = {"type": "server_tool_use", "id": "srvtoolu_01", "name": "web_search", "input": {}}
FOUND = {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_01", "content": []}


async def test_after_anthropics_server_tools_ran_no_input_is_held_back(store_url: str) -> None:
    """The search's results were billed as 900 input tokens of the first reply; the
    conversation does not keep them. Before, the next call was refused ("would read at least 900
    input tokens"), though it read 120."""
    call_block = {
        "type": "tool_use",
        "id": "toolu_1",
        "name": "refund",
        "input": {"charge_id": "a"},
    }
    with FakeLLM("anthropic", strict=True) as fake:
        fake.queue(
            anthropic_message(
                SEARCH, FOUND, call_block, usage={"input_tokens": 900, "output_tokens": 0}
            ),
            anthropic_message("done", usage={"input_tokens": 120, "output_tokens": 5}),
        )
        claude = so.models.Anthropic(
            "claude-haiku-4-5", base_url=fake.base_url, api_key=API_KEY, max_retries=0
        )
        log = ExecutionLog()
        async with so.Runtime(
            [refund_agent(log, claude, so.Limits(max_tokens=1000))], store=store_url
        ) as rt:
            r = await rt.generate("a", prompt="refund", auth=ALICE)
            [ask] = r.pending
            answer = so.InputResponse(request_id=ask.id, option_id="approve")
            r = await rt.respond(r.session_id, [answer], principal=ALICE)
            assert (r.status, r.text) == ("completed", "done")
        await claude.aclose()
    assert len(fake.received) == 2 and log.count() == 1


async def test_a_cut_reply_after_server_tools_holds_nothing_back(store_url: str) -> None:
    """A reply cut at the budget's cap after a web search read 6,000 tokens the conversation
    does not keep: after `continue` the next call was refused at once (held back: 6,000, as
    much as the cut reply read); it is made, as after a completed one (`context_tokens` 0 on
    the `input.requested` that counts the cut reply)."""
    search = {"type": "server_tool_use", "id": "srvtoolu_01", "name": "web_search", "input": {}}
    found = {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_01", "content": []}
    with FakeLLM("anthropic", strict=False) as fake:
        cut = anthropic_message(
            "Searching ",
            search,
            found,
            "partial",
            usage={"input_tokens": 6000, "output_tokens": 10000},
        )
        cut["stop_reason"] = "max_tokens"
        fake.queue(cut, anthropic_message("Done.", usage={"input_tokens": 12, "output_tokens": 5}))
        async with so.models.Anthropic(
            "m", base_url=fake.base_url, api_key=API_KEY, max_retries=0, max_tokens=30000
        ) as model:
            agent = so.Agent(name="a", model=model, limits=so.Limits(max_tokens=10000))
            async with so.Runtime([agent], store=store_url) as rt:
                r = await rt.generate("a", prompt="hi", auth=ALICE)
                [ask] = r.pending
                answer = so.InputResponse(request_id=ask.id, option_id="continue")
                r = await rt.respond(r.session_id, [answer], principal=ALICE)
                assert (r.status, r.text) == ("completed", "Done.")
                log = [e async for e in rt.events(r.session_id, follow=False)]
        # Raised to 40,000 (room for twice the 10,000 it was cut at): 24,000, none held back.
        assert [b["max_tokens"] for b in fake.bodies] == [10000, 24000]
    [requested] = [e for e in log if e.type == "input.requested"]
    assert requested.data["context_tokens"] == 0


async def test_a_reply_refused_after_server_tools_says_its_input_is_not_kept() -> None:
    """A reply of a block of the wrong shape, after a web search, fails the call with its
    usage; its `context_tokens` says 0 as a completed one's would, or the budgets held back
    all the search's input before the next call."""
    search = {"type": "server_tool_use", "id": "srvtoolu_01", "name": "web_search", "input": {}}
    found = {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_01", "content": []}
    broken = {"type": "tool_use", "id": "toolu_1", "name": "", "input": {}}
    with FakeLLM("anthropic", strict=False) as fake:
        fake.queue(
            anthropic_message(
                search, found, broken, usage={"input_tokens": 6000, "output_tokens": 9}
            )
        )
        async with so.models.Anthropic(
            "m", base_url=fake.base_url, api_key=API_KEY, max_retries=0
        ) as model:
            with pytest.raises(so.ModelError) as raised:
                await model.complete(request())
    assert raised.value.usage is not None and raised.value.usage.input_tokens == 6000
    assert raised.value.context_tokens == 0
