"""`signoff approve REQUEST_ID` (record only) SIGKILLed right before or right after its commit:
run again, it records the approval or says it was already given, and the turn then runs the
tool once."""

from __future__ import annotations

import signal
import subprocess
from typing import Any

import pytest

import signoff as so
from signoff.stores._base import AUDIT_RECORDED
from signoff.testing import call, call_tools, reply, scripted_agent

from . import _proof
from ._forks import Scripts
from .test_sqlite_upgrade import _child_env

# The command line, with every store it opens SIGKILLing the process around its first commit.
_CLI = f"""
import os, signal, sys
from signoff.cli import main
from signoff.stores.postgres import PostgresStore
from signoff.stores.sqlite import SQLiteStore
kill = sys.argv.pop(1)
def hook(when, label):
    if when == kill and label != {AUDIT_RECORDED!r}:
        os.kill(os.getpid(), signal.SIGKILL)
for kind in (SQLiteStore, PostgresStore):
    def init(self, *args, _init=kind.__init__, **kwargs):
        _init(self, *args, **kwargs)
        self.set_fault_hook(hook)
    kind.__init__ = init
sys.argv[0] = "signoff"
main()
"""


def agent(runs: list[str]) -> so.Agent:
    @so.tool(approval=so.always())
    async def issue_refund(ctx: so.ToolContext, order_id: str) -> str:
        """Refund an order."""
        runs.append(ctx.idempotency_key())
        return f"refunded {order_id}"

    return scripted_agent(
        "support",
        [call_tools(call("issue_refund", order_id="7")), reply("Done.")],
        tools=[issue_refund],
    )


def approve(
    scripts: Scripts, url: str, request_id: str, kill: str
) -> subprocess.CompletedProcess[str]:
    env = {**_child_env(), "COLUMNS": "200", "NO_COLOR": "1"}
    return scripts.run(_CLI, kill, "approve", request_id, "--store", url, env=env)


@pytest.mark.parametrize("when", ["before", "after"])
async def test_an_approval_killed_around_its_commit_is_recorded_once(
    store_url: str, scripts: Scripts, when: str
) -> None:
    runs: list[str] = []
    async with so.Runtime([agent(runs)], store=store_url) as rt:
        parked = await rt.generate("support", prompt="refund order 7")
        (request,) = parked.pending

    killed = approve(scripts, store_url, request.id, when)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    _proof.record("crash-outside:kills")
    again = approve(scripts, store_url, request.id, "never")
    assert again.returncode == 0, again.stdout + again.stderr
    said = " ".join(again.stdout.split())
    if when == "before":
        assert f"approved {request.id}" in said
    else:
        assert f"{request.id} was already approved; nothing changed." in said

    async with so.Runtime([agent(runs)], store=store_url) as rt:
        done = await rt.generate(session_id=parked.session_id)
        assert done.status == "completed" and done.text == "Done."
        events: list[Any] = [e async for e in rt.events(parked.session_id, follow=False)]
        resolved = [e for e in events if e.type == "input.resolved"]
        assert [e.data["request_id"] for e in resolved] == [request.id]
        assert await rt.verify_audit() == []
    assert len(runs) == 1
