"""Text that shows nothing is no name and no reason: an agent named `" "` is refused, and a deny
reason of only whitespace (a person's, or a policy's `Denied`) is no reason, so the model is
not handed `" "` as one."""

from __future__ import annotations

from typing import Any

import pytest

import signoff as so
from signoff.testing import Capture, call, call_tools, reply, scripted_agent, tool_results

from ._seeds import ALICE


@pytest.mark.parametrize("name", [" ", "\t\n", "\u200b", " \u00a0 "], ids=repr)
def test_an_agent_named_with_nothing_to_see_is_refused(name: str) -> None:
    """`Agent(name=" ")` was taken: its sessions listed under a name no one can read or type."""
    with pytest.raises(so.UsageError, match="an agent needs a name"):
        scripted_agent(name, [reply("ok")])


def _refunding(approval: Any, seen: Capture) -> so.Agent:
    @so.tool(approval=approval)
    async def refund(amount: int) -> str:
        """Refund."""
        return "refunded"

    return scripted_agent("a", [call_tools(call("refund", amount=1)), seen], tools=[refund])


@pytest.mark.parametrize("reason", [" ", "\n\t", "\u200b"], ids=repr)
async def test_a_blank_deny_reason_is_no_reason(store_url: str, reason: str) -> None:
    """A person's deny with a reason of only whitespace reached the model as `"reason": " "`
    with a note quoting it ('... who denied this call: " "'); it is recorded and read as none."""
    seen = Capture(reply("ok"))
    async with so.Runtime([_refunding(so.always(), seen)], store=store_url) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        no = [so.Decision(id=r.pending[0].id, approved=False, reason=reason)]
        done = await rt.generate(session_id=r.session_id, approvals=no, auth=ALICE)
        assert done.status == "completed"
        events = [e async for e in rt.events(r.session_id, follow=False)]
    (result,) = tool_results(seen.last)
    assert result.content["reason"] is None and "note" not in result.content, result.content
    settled = [e.data for e in events if e.type in ("approval.settled", "input.resolved")]
    assert [d.get("reason") for d in settled] == [None, None]


async def test_a_policys_blank_deny_reason_is_no_reason(store_url: str) -> None:
    """`so.Denied(reason=" ")` reached the model as `"reason": " "`."""
    seen = Capture(reply("ok"))
    agent = _refunding(lambda ctx: so.Denied(reason="  "), seen)
    async with so.Runtime([agent], store=store_url) as rt:
        done = await rt.generate("a", prompt="go", auth=ALICE)
        assert done.status == "completed"
    (result,) = tool_results(seen.last)
    assert result.content["reason"] is None, result.content
