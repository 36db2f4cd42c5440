"""The request a text channel shows outlives the machine whose hub showed it: it is kept in the
store too (memo `shown`, beside the hub's claim). Before, it lived in that hub's state file
only, so a hub taking over on another state showed the oldest open request instead (one
escalated in behind the one shown), and the person's "yes", typed for what they were shown,
approved a refund they never read; and a standby on another state answered nothing."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import signoff as so
from signoff.channels import ChannelHub
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from ._channels import Texts, escalating_refund, manual, three_refunds
from .test_webhooks_machine_loss import until

BOB = so.Principal(authenticator="sms", principal_id="+15550100")

_HUB = """
import asyncio, json, sys
import signoff as so
from signoff.channels import ChannelHub, TextChannel

class Printed(TextChannel):
    async def send_text(self, text):
        print(json.dumps({"sent": text}), flush=True)

def billing_or_finance(request):
    return request.agent == "billing" or request.escalated_to == "finance"

async def main():
    async with so.Runtime([], store=sys.argv[1]) as rt:
        sms = Printed(accepts=billing_or_finance)
        hub = ChannelHub(rt, [sms], state=sys.argv[2], poll_interval=0.05, claim_ttl=1.0)
        async with hub:
            print(json.dumps({"active": hub.active}), flush=True)
            waiting = []
            while True:
                now = [r.id for r in sms.waiting]
                if now != waiting:
                    waiting = now
                    print(json.dumps({"waiting": now}), flush=True)
                await asyncio.sleep(0.02)

asyncio.run(main())
"""


def _billing(runs: list[str]) -> so.Agent:
    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        runs.append(order_id)
        return "refunded"

    return scripted_agent(
        "billing",
        [call_tools(call("issue_refund", order_id="B-2")), reply("Done.")],
        tools=[issue_refund],
    )


def _billing_or_finance(request: so.InputRequest) -> bool:
    return request.agent == "billing" or request.escalated_to == "finance"


async def _line(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
    return dict(json.loads(line))


async def _lines(proc: subprocess.Popen[str], last: dict[str, Any]) -> list[dict[str, Any]]:
    """The lines the child prints up to `last`."""
    seen = [await _line(proc)]
    while seen[-1] != last:
        seen.append(await _line(proc))
    return seen


def _render(request: so.InputRequest) -> str:
    return Texts().render(request)


async def test_a_hub_on_another_state_goes_on_showing_what_a_killed_one_showed(
    store_url: str, tmp_path: Path
) -> None:
    """A `serve` process (state a.db) shows B (billing's); A, asked earlier by support, joins
    its queue behind B when escalated to finance; the process is SIGKILLed. The hub taking over
    on b.db sends nothing new (B is still the one shown), and the person's "yes" approves B.
    Before, it showed A and the "yes" meant for B approved A, a refund never read."""
    clock = ManualClock(time.time())
    runs: list[str] = []
    agents = [escalating_refund(), _billing(runs)]
    async with so.Runtime(agents, store=store_url, clock=clock) as rt:
        args = [sys.executable, "-c", _HUB, store_url, str(tmp_path / "a.db")]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        try:
            assert await _line(proc) == {"active": True}
            (a,) = (await rt.generate("support", prompt="Refund A-1")).pending
            clock.advance(1)
            (b,) = (await rt.generate("billing", prompt="Refund B-2")).pending
            seen = await _lines(proc, {"waiting": [b.id]})
            if not any("sent" in line for line in seen):  # printed after the queue, or before
                seen.append(await _line(proc))
            assert [line["sent"] for line in seen if "sent" in line] == [_render(b)]
            clock.advance(61)
            assert await rt.expire_due() == 1
            await _lines(proc, {"waiting": [b.id, a.id]})  # A behind the one shown
        finally:
            proc.kill()
            proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()
        sms = Texts(accepts=_billing_or_finance)
        hub = ChannelHub(
            rt, [sms], state=tmp_path / "b.db", clock=clock, poll_interval=0.05, claim_ttl=1.0
        )
        async with hub:
            await until(lambda: hub.active and bool(sms.waiting))
            await hub.poll()
            assert [r.id for r in sms.waiting] == [b.id, a.id]
            assert sms.sent == []  # B is still the one shown: nothing new to read
            outcome = await sms.reply("yes", BOB)
            assert outcome is not None and outcome.request_id == b.id
        assert runs == ["B-2"]
        stored = await rt.store.get_request(a.id)
        assert stored is not None and stored.status == "pending"


async def test_a_standby_on_another_state_answers_what_the_delivering_hub_shows(
    store_url: str, tmp_path: Path
) -> None:
    """Two hubs on different state files (two machines): the standby's channel answers the
    request the delivering hub shows, read from the store. Before, its own state knew of none:
    "Nothing is waiting for an answer.\""""
    runs: list[str] = []
    async with so.Runtime([three_refunds(runs)], store=store_url) as rt:
        shown, standing = Texts(), Texts()
        async with (
            manual(ChannelHub(rt, [shown], state=tmp_path / "a.db")) as one,
            manual(ChannelHub(rt, [standing], state=tmp_path / "b.db")) as two,
        ):
            assert one.active and not two.active
            a, b, _ = (await rt.generate("support", prompt="Refund A, B and C")).pending
            await one.poll()
            await two.poll()
            assert shown.sent == [shown.render(a)] and standing.sent == []
            outcome = await standing.reply("yes", BOB)  # the SMS reached the standby's process
            assert outcome is not None and outcome.request_id == a.id
            assert standing.sent == []
            await one.poll()
            assert shown.sent[-1] == shown.render(b)
            outcome = await standing.reply("yes", BOB)
            assert outcome is not None and outcome.request_id == b.id
