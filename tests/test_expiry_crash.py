"""A sweep (`expire_due`) SIGKILLed right before or right after it commits a session's passed
TTL (its open request expired, its waiting turn failed): the next sweep records it once, or
finds it recorded, and the session then holds the expiry once, nothing pending, reopening it
raises `SessionExpired`, and the audit trail verifies."""

from __future__ import annotations

import signal

import pytest

import signoff as so
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from . import _proof
from ._forks import Scripts
from ._procs import ROOT
from .test_sqlite_upgrade import _child_env

# The sweep as of NOW, its store SIGKILLing it right WHEN (before or after) its first commit.
_SWEEP = """
import asyncio, os, signal, sys
import signoff as so
from signoff.stores._base import AUDIT_RECORDED, LEASE_RENEWED
from signoff.testing import ManualClock
from tests.test_expiry_crash import agent
url, now, when = sys.argv[1], float(sys.argv[2]), sys.argv[3]

def hook(at, label):
    if at == when and label not in (AUDIT_RECORDED, LEASE_RENEWED):
        print(label, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

async def main():
    async with so.Runtime([agent()], store=url, clock=ManualClock(now)) as rt:
        rt.store.set_fault_hook(hook)
        await rt.expire_due()

asyncio.run(main())
"""


def agent() -> so.Agent:
    """A refund that waits on approval, in a session whose TTL is 60 s."""

    @so.tool(approval=so.always())
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    return scripted_agent(
        "support",
        [call_tools(call("refund", order_id="1")), reply("done")],
        tools=[refund],
        limits=so.Limits(ttl=60),
    )


@pytest.mark.parametrize("when", ["before", "after"])
async def test_an_expiry_killed_around_its_commit_is_recorded_once(
    store_url: str, scripts: Scripts, when: str
) -> None:
    clock = ManualClock()
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt:
        r = await rt.generate("support", prompt="refund order 1")
        assert r.status == "waiting"
    clock.advance(61)
    env = {**_child_env(), "PYTHONPATH": f"{_child_env()['PYTHONPATH']}:{ROOT}"}
    done = scripts.run(_SWEEP, store_url, str(clock()), when, env=env)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert done.stdout.split() == ["input.resolved"], done.stdout
    _proof.record("crash-outside:kills")
    clock.advance(1)
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt:
        await rt.expire_due()
        events = [e async for e in rt.events(r.session_id, follow=False)]
        resolved = [e.data["outcome"] for e in events if e.type == "input.resolved"]
        assert resolved == ["expired"]
        assert [e.type for e in events].count("turn.failed") == 1
        assert await rt.pending() == []
        with pytest.raises(so.SessionExpired):
            await rt.generate(session_id=r.session_id, prompt="again")
        assert await rt.expire_due() == 0
        assert await rt.verify_audit() == []
