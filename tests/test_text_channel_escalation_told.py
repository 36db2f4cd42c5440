"""The escalation a text channel told outlives the machine whose hub told it: the memo of it is
kept in the store too (`<hub>.<channel>:escalated:<request>`), as the request shown is. Before,
it lived in that hub's state file only, so a hub taking over on another state, going on from the
position the killed one last shared, told the person the same escalation again.

An answer spent because the request's deadline escalated it while the response policy judged
(`stale`) leaves the request shown, its escalation told. Before, the person was told it "was
already settled by the policy" and the channel dropped it: the escalation was never told, and
a reply from the group was told nothing was waiting."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import ChannelHub
from signoff.testing import ManualClock

from ._channels import BOB, Texts, escalating_refund, manual, slowly_escalating_refund, status
from .test_text_channel_machine_loss import _line, _lines
from .test_webhooks_machine_loss import until

# A hub whose process is SIGKILLed as soon as its state file keeps that it told an escalation:
# its claim's shared position is never moved past that entry.
_HUB = """
import asyncio, json, os, signal, sys
import signoff as so
from signoff.channels import ChannelHub, TextChannel

class Printed(TextChannel):
    async def send_text(self, text):
        print(json.dumps({"sent": text}), flush=True)

    def remember(self, key, value):
        super().remember(key, value)
        if key.startswith("escalated:"):
            print(json.dumps({"told": value}), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

async def main():
    async with so.Runtime([], store=sys.argv[1]) as rt:
        sms = Printed()
        hub = ChannelHub(rt, [sms], state=sys.argv[2], poll_interval=0.05, claim_ttl=1.0)
        async with hub:
            print(json.dumps({"active": hub.active}), flush=True)
            while True:
                await asyncio.sleep(0.02)

asyncio.run(main())
"""


async def test_a_hub_on_another_state_does_not_tell_an_escalation_a_killed_one_told(
    store_url: str, tmp_path: Path
) -> None:
    clock = ManualClock(time.time())
    async with so.Runtime([escalating_refund()], store=store_url, clock=clock) as rt:
        args = [sys.executable, "-c", _HUB, store_url, str(tmp_path / "a.db")]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        try:
            assert await _line(proc) == {"active": True}
            (a,) = (await rt.generate("support", prompt="Refund A-1")).pending
            assert (await _line(proc))["sent"] == Texts().render(a)
            clock.advance(61)
            assert await rt.expire_due() == 1
            seen = await _lines(proc, {"told": "finance"})
            told = [line["sent"] for line in seen if "sent" in line]
            assert len(told) == 1 and "escalated to finance" in told[0]
            assert proc.wait(30) == -9  # SIGKILLed
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()
        sms = Texts()
        hub = ChannelHub(
            rt, [sms], state=tmp_path / "b.db", clock=clock, poll_interval=0.05, claim_ttl=1.0
        )
        async with hub:
            await until(lambda: hub.active and bool(sms.waiting))
            await hub.poll()
            await hub.poll()
            assert [r.id for r in sms.waiting] == [a.id]
            assert sms.sent == []  # A is still shown, and its escalation was told
            store: Any = rt.store  # the memos are not part of the `Store` protocol
            memo = f"{hub.name}.{sms.name}:escalated:{a.id}"
            assert await store.channel_memo(memo) == '"finance"'
            # Its close is told, and drops the memo in the store too.
            r = await rt.respond(
                a.session_id,
                [so.InputResponse(request_id=a.id, option_id="approve")],
                principal=BOB,
            )
            assert r.outcomes[0].outcome == "approved"
            await hub.poll()
            assert len(sms.sent) == 1 and "approved" in sms.sent[0]
        assert await store.channel_memo(memo) is None


_TOLD = "issue_refund was escalated to finance (no one decided before the deadline)"


@pytest.mark.parametrize("kept", [True, False])
async def test_an_answer_the_deadline_escalated_meanwhile_leaves_the_request_shown(
    store_url: str, tmp_path: Path, kept: bool
) -> None:
    """Bob's "yes" is spent as the deadline escalates the request while the policy judges it:
    he is told his answer was not accepted and why, the escalation is told at the next poll,
    and the request stays shown for the group (his next "yes" settles it), unless the
    channel's `accepts` no longer takes it, which drops it as any escalation does."""
    clock = ManualClock(time.time())
    accepts = None if kept else (lambda r: r.escalated_to is None)
    async with so.Runtime([slowly_escalating_refund(clock)], store=store_url, clock=clock) as rt:
        (a,) = (await rt.generate("support", prompt="Refund A-1")).pending
        sms = Texts(accepts=accepts)
        async with manual(ChannelHub(rt, [sms], state=tmp_path / "hub.db", clock=clock)) as hub:
            await hub.poll()
            assert sms.sent == [sms.render(a)]
            spent = await sms.reply("yes", BOB)
            assert spent is not None and (spent.outcome, spent.applied) == ("stale", False)
            assert spent.reason is not None and "escalated to 'finance'" in spent.reason
            assert sms.sent[1:] == [f"Your answer was not accepted (stale: {spent.reason})."]
            assert [r.id for r in sms.waiting] == [a.id]
            await hub.poll()
            if not kept:
                assert sms.sent[2:] == [f"{_TOLD}; it is no longer shown here."]
                assert sms.waiting == []
                assert await status(rt, a.id) == ("pending", None)
                return
            assert sms.sent[2:] == [f"{_TOLD}."]
            assert [r.id for r in sms.waiting] == [a.id]
            taken = await sms.reply("yes", BOB)
            assert taken is not None and (taken.outcome, taken.applied) == ("approved", True)
        assert await status(rt, a.id) == ("settled", "approved")
