"""`Scripted(cut_at_cap=True)` cuts a reply longer than `ModelRequest.max_output_tokens` (what the
session's budgets leave) as the shipped models do: `BudgetSpent`, counting the tokens up to the
cap, so the turn asks to continue or stop. Without it the cap is ignored, as before. Runtime
tests run on both stores."""

from __future__ import annotations

from typing import Any

import pytest

import signoff as so
from signoff.testing import ExecutionLog, call, call_tools, reply, scripted_agent

from ._models import request

ALICE = so.Principal(authenticator="test", principal_id="alice")
LONG = so.Usage(input_tokens=100, output_tokens=500, cost_usd=0.006)


@pytest.mark.parametrize(
    "step", [reply("a long answer", usage=LONG), lambda c: reply("x", usage=LONG)]
)
async def test_a_reply_longer_than_the_cap_is_cut_there(step: Any) -> None:
    """Before, the 500-token reply came back whole under a cap of 200."""
    model = so.models.Scripted([step], cut_at_cap=True)
    with pytest.raises(so.BudgetSpent, match="500 output tokens was cut off at the 200") as e:
        await model.complete(request(max_output_tokens=200))
    assert e.value.usage == so.Usage(input_tokens=100, output_tokens=200, cost_usd=0.003)
    # At or under the cap, or with none, the reply is played as scripted.
    for cap in (500, None):
        assert (await model.complete(request(max_output_tokens=cap))).usage == LONG
    # Without cut_at_cap, the cap is ignored.
    assert (await so.models.Scripted([step]).complete(request(max_output_tokens=200))).usage == LONG


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_cut_at_cap_must_be_a_bool(value: Any) -> None:
    with pytest.raises(so.UsageError, match="cut_at_cap must be True or False"):
        so.models.Scripted([reply("ok")], cut_at_cap=value)


async def test_a_turn_cut_at_the_cap_asks_to_continue_or_stop(store_url: str) -> None:
    """max_tokens=300: the reply proposing a refund says it wrote 500 tokens. Cut at the 300
    left, none of it is used (the refund does not run) and its 100 + 300 tokens count; the turn
    asks to raise the budget, and after `continue` the script goes on."""
    log = ExecutionLog()

    @log.tool()
    async def refund(charge_id: str) -> str:
        """Refund a charge."""
        return "refunded"

    steps = [call_tools(call("refund", charge_id="a"), usage=LONG), reply("done")]
    agent = scripted_agent(
        "a", steps, tools=[refund], limits=so.Limits(max_tokens=300), cut_at_cap=True
    )
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="refund", auth=ALICE)
        assert r.status == "waiting"
        [ask] = r.pending
        assert ask.kind == "session-limit"
        assert "cut off at the 300 output tokens" in (ask.question or "")
        assert (await rt.state(r.session_id)).usage.total_tokens == 400
        assert log.count() == 0
        answer = so.InputResponse(request_id=ask.id, option_id="continue")
        r = await rt.respond(r.session_id, [answer], principal=ALICE)
        # The budget is 1200 now, 400 spent and 100 held back for the input: 700 left, room
        # for twice the 300 it was cut at (before, 600, it was cut again at 100, and so on).
        assert (r.status, r.text) == ("completed", "done")
        assert log.count() == 1
        assert (await rt.state(r.session_id)).raised == {"max_tokens": 1200}
