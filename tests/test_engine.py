"""`Driver.record`: a drive that lost its lease, or gave it back, records nothing more."""

from __future__ import annotations

import time

import pytest

import signoff as so
from signoff._leasing import Held
from signoff._recording import EventSpec, TurnStopped
from signoff.testing import ExecutionLog, call, call_tools, reply, scripted_agent, store_contents

AL = so.Principal(authenticator="sso", principal_id="al")


def deploy_agent() -> so.Agent:
    log = ExecutionLog()

    @log.tool(approval=so.always())
    async def deploy(service: str) -> str:
        """Deploy a service."""
        return f"{service} live"

    script = [call_tools(call("deploy", service="api")), reply("ok")]
    return scripted_agent("ops", script, tools=[deploy])


async def test_a_drive_that_lost_or_gave_back_its_lease_records_nothing(store_url: str) -> None:
    """Its lease given up (renewals not getting through, so the store may still take its
    token) or given back with its last commit, a drive must not append: another process may run
    the turn now. The same append from a drive holding its lease goes through."""
    async with so.Runtime([deploy_agent()], store=store_url) as rt:
        r = await rt.generate("ops", prompt="deploy api", auth=AL)
        assert r.status == "waiting"
        sid = r.session_id
        waiting: EventSpec = ("turn.waiting", {"on": "input", "request_ids": [r.pending[0].id]})
        before = await store_contents(rt.store, sid)

        lost = rt._driver((await rt.state(sid)).copy(), None)
        lost.held = Held(at=time.monotonic(), expires=time.time() + 60)
        lost.held.lose()
        with pytest.raises(so.LeaseLost):
            await lost.record([waiting])
        released = rt._driver((await rt.state(sid)).copy(), None)
        released.released = True
        with pytest.raises(TurnStopped):
            await released.record([waiting])
        assert await store_contents(rt.store, sid) == before

        live = rt._driver((await rt.state(sid)).copy(), None)
        live.held = Held(at=time.monotonic(), expires=time.time() + 60)
        (event,) = await live.record([waiting])
        assert before.head is not None and event.seq == before.head + 1
