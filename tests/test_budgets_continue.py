"""What a session-limit request's `continue` grants, end to end: each budget raised by its own
sizes, as the question says, and after a reply cut at the budget's cap, room enough that
answering `continue` lets the model finish."""

from __future__ import annotations

import signoff as so
from signoff.models import Scripted
from signoff.testing import call, call_tools, reply, scripted_agent

ALICE = so.Principal(authenticator="test", principal_id="alice")


@so.tool
async def lookup(n: int) -> int:
    """Look something up."""
    return n


def _looks_up(usage: so.Usage) -> so.ModelResponse:
    step = call_tools(call("lookup", n=1))
    return so.ModelResponse(tool_calls=step.tool_calls, usage=usage)


async def _continue(rt: so.Runtime, r: so.GenerateResult) -> so.GenerateResult:
    [req] = r.pending
    answer = so.InputResponse(request_id=req.id, option_id="continue")
    return await rt.respond(r.session_id, [answer], principal=ALICE)


async def test_a_continue_about_the_cost_raises_the_tokens_one_size(store_url: str) -> None:
    """One call spent max_cost_usd=0.01 ($0.5); its 5,010 tokens are far from max_tokens=100,000:
    the continue raises the tokens to 200,000 (a size more), not 51 sizes, as the question says."""
    steps = [
        _looks_up(so.Usage(input_tokens=5000, output_tokens=10, cost_usd=0.5)),
        reply("done", usage=so.Usage(input_tokens=5100, output_tokens=5, cost_usd=0.01)),
    ]
    limits = so.Limits(max_tokens=100_000, max_cost_usd=0.01)
    agent = scripted_agent("a", steps, tools=[lookup], limits=limits)
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="doc", auth=ALICE)
        [req] = r.pending
        assert req.question == (
            "the session cost 0.5000 of max_cost_usd=0.01. Continue with max_tokens raised to "
            "200000 and max_cost_usd raised to 0.51, or stop?"
        )
        r = await _continue(rt, r)
        assert r.status == "completed"
        raised = (await rt.state(r.session_id)).raised
        assert raised == {"max_tokens": 200_000, "max_cost_usd": 0.51}


async def test_a_continue_after_a_reply_cut_at_the_cap_lets_the_next_finish(
    store_url: str,
) -> None:
    """max_tokens=1000, each call reading 960 tokens, the answer 200 long: the first continue
    leaves the reply 70 output tokens, and it is cut there. Another continue used to leave 40,
    every time (the reply cut, billed and thrown away, for ever); it leaves twice the 70 at
    least now, and the answer comes."""
    first = _looks_up(so.Usage(input_tokens=960, output_tokens=10))
    answer = reply("a 200-token answer", usage=so.Usage(input_tokens=960, output_tokens=200))
    model = Scripted([first, answer], repeat_last=True, cut_at_cap=True)
    agent = so.Agent(name="a", model=model, tools=[lookup], limits=so.Limits(max_tokens=1000))
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="doc", auth=ALICE)
        assert "raised to 2000," in (r.pending[0].question or "")
        r = await _continue(rt, r)
        [cut] = r.pending
        assert (cut.question or "").startswith("the model's reply was cut off at the 70 output")
        assert "Continue with max_tokens raised to 4000, or stop?" in (cut.question or "")
        r = await _continue(rt, r)
        assert r.status == "completed" and r.text == "a 200-token answer"
        state = await rt.state(r.session_id)
        assert state.raised == {"max_tokens": 4000}
        assert state.usage.total_tokens == 970 + 1030 + 1160
