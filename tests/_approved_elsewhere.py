"""An approval asked in one process and answered in another (a worker, a server restarted
since), each a fresh interpreter: what the approved call's `tool.completed` said."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from ._cli import ROOT

__all__ = ["approved_elsewhere"]

_ASK_OR_APPROVE = """
import asyncio, importlib, json, sys
import signoff as so
from signoff.testing import call_tools, reply, scripted_agent

async def main(url, module, tool, given, session_id="", request_id=""):
    of = importlib.import_module(module)
    made = getattr(of, tool)
    proposal = call_tools(so.ToolCall(id="c1", name=made.name, input=json.loads(given)))
    agent = scripted_agent("a", [proposal, reply("ok")], tools=[made])
    async with so.Runtime([agent], store=url) as rt:
        if not request_id:
            r = await rt.generate("a", prompt="go", auth=of.ALICE)
            print(r.session_id, r.pending[0].id)
            return
        approve = so.Decision(id=request_id, approved=True)
        await rt.generate(session_id=session_id, approvals=[approve], auth=of.ALICE)
        events = [e async for e in rt.events(session_id, follow=False)]
        [done] = [e.data for e in events if e.type == "tool.completed"]
        print(done["status"], done["result"])

asyncio.run(main(*sys.argv[1:]))
"""


def approved_elsewhere(
    url: str, module: str, tool: str, given: dict[str, Any], seeds: tuple[str, str] | None = None
) -> str:
    """Ask about a call of `tool` (of test `module`, which names `ALICE`) with `given` in one
    process, approve it in another (under hash `seeds` each, if given): `status result`."""

    def run(seed: str | None, *args: str) -> str:
        env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}
        if seed is not None:
            env["PYTHONHASHSEED"] = seed
        code = [sys.executable, "-c", _ASK_OR_APPROVE, url, module, tool, json.dumps(given)]
        done = subprocess.run([*code, *args], env=env, cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    asking, approving = seeds or (None, None)
    session_id, request_id = run(asking).split()
    return run(approving, session_id, request_id)
