"""A text channel of a standby hub (on the state file of the hub that delivers) still answers:
a reply reaching its process answers the request the person was shown, not "nothing waits"."""

from __future__ import annotations

from pathlib import Path

import signoff as so
from signoff.channels import ChannelHub
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from ._channels import Texts, escalating_refund, manual, runtime, three_refunds

BOB = so.Principal(authenticator="sms", principal_id="+15550100")


async def test_a_standby_text_channel_answers_the_request_shown(tmp_path: Path) -> None:
    runs: list[str] = []
    async with runtime(tmp_path, three_refunds(runs)) as rt:
        state = tmp_path / "channels.db"
        shown, standing = Texts(), Texts()
        async with (
            manual(ChannelHub(rt, [shown], state=state)) as one,
            manual(ChannelHub(rt, [standing], state=state)) as two,
        ):
            r = await rt.generate("support", prompt="Refund A, B and C")
            a, b, _ = r.pending
            await one.poll()
            await two.poll()
            assert shown.sent == [shown.render(a)] and standing.sent == []
            outcome = await standing.reply("yes", BOB)  # the SMS reached the standby's process
            assert outcome is not None and outcome.outcome == "approved"
            assert standing.sent == []
            stored = await rt.store.get_request(a.id)
            assert stored is not None and stored.outcome == "approved"
            await one.poll()
            assert shown.sent[-1] == shown.render(b)  # the delivering hub shows the next
            assert await standing.reply("maybe", BOB) is None  # b, shown now: a hint
            assert standing.sent == [standing._hint(b)]


async def test_a_restarted_hub_keeps_showing_the_request_shown_though_an_older_one_joined(
    store_url: str, tmp_path: Path
) -> None:
    """The channel shows B (billing's); A, asked earlier by support, joins its queue behind B
    when it is escalated to finance. A hub started again must go on showing B, not switch to
    the older A: the person's "yes" typed for B would approve A, a refund they never read."""
    clock = ManualClock()
    runs: list[str] = []

    def billing_or_finance(request: so.InputRequest) -> bool:
        return request.agent == "billing" or request.escalated_to == "finance"

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        runs.append(order_id)
        return "refunded"

    billing = scripted_agent(
        "billing",
        [call_tools(call("issue_refund", order_id="B-2")), reply("Done.")],
        tools=[issue_refund],
    )
    agents = [escalating_refund(), billing]
    async with so.Runtime(agents, store=store_url, clock=clock) as rt:
        (a,) = (await rt.generate("support", prompt="Refund A-1")).pending
        clock.advance(1)
        (b,) = (await rt.generate("billing", prompt="Refund B-2")).pending
        state = tmp_path / "channels.db"
        sms = Texts(accepts=billing_or_finance)
        async with manual(ChannelHub(rt, [sms], clock=clock, state=state)) as hub:
            assert sms.sent == [sms.render(b)]
            clock.advance(60)
            assert await rt.expire_due() == 1
            await hub.poll()
            assert [r.id for r in sms.waiting] == [b.id, a.id]
        sms = Texts(accepts=billing_or_finance)
        async with manual(ChannelHub(rt, [sms], clock=clock, state=state)) as hub:
            await hub.poll()
            assert sms.sent == []  # B is still the one shown: nothing new to read
            assert [r.id for r in sms.waiting] == [b.id, a.id]
            outcome = await sms.reply("yes", BOB)
            assert outcome is not None and outcome.request_id == b.id
        assert runs == ["B-2"]
        stored = await rt.store.get_request(a.id)
        assert stored is not None and stored.status == "pending"
