"""A worker SIGKILLed right after its claim of a session was committed, before it drove it:
the lease lapses and another worker runs the turn to its end, the approved tool once."""

from __future__ import annotations

import signal
from pathlib import Path

import signoff as so

from . import _proof
from ._forks import Scripts
from ._procs import ROOT, make_agent, read_executions
from .test_sqlite_upgrade import _child_env

# A worker for the session `sys.argv[3]`; with "claim", it dies once a claim took sessions,
# else it stops once the session's turn has completed. Its 2 s TTL is waited out once, for the
# killed worker's lease to lapse; at 0.5 s a loaded machine stalling the other worker past its
# lease had it give the lease up mid-drive (its renewal gets 50 ms, waking past the expiry).
_WORKER = """
import asyncio, os, signal, sys
import signoff as so
from tests._procs import make_agent
url, records, sid, kill = sys.argv[1:5]
async def main():
    async with so.Runtime([make_agent(records)], store=url, lease_ttl=2.0) as rt:
        claim = rt.store.claim
        async def claimed(*args, **kwargs):
            got = await claim(*args, **kwargs)
            if got and kill == "claim":
                os.kill(os.getpid(), signal.SIGKILL)  # the leases are committed, nothing driven
            return got
        rt.store.claim = claimed
        stop = asyncio.Event()
        worker = asyncio.create_task(rt.work(stop=stop, idle_wait=0.05))
        for _ in range(300):
            state = await rt.state(sid)
            if state.turn is not None and state.turn.status == "completed":
                break
            await asyncio.sleep(0.05)
        stop.set()
        await worker
asyncio.run(main())
"""


def worker(scripts: Scripts, url: str, records: Path, sid: str, kill: str) -> int:
    env = {**_child_env(), "PYTHONPATH": f"{_child_env()['PYTHONPATH']}:{ROOT}"}
    done = scripts.run(_WORKER, url, str(records), sid, kill, env=env)
    assert done.returncode in (0, -signal.SIGKILL), done.stderr
    return done.returncode


async def test_a_worker_killed_after_its_claim_leaves_the_turn_to_another(
    store_url: str, tmp_path: Path, scripts: Scripts
) -> None:
    records = tmp_path / "runs.jsonl"
    async with so.Runtime([make_agent(str(records))], store=store_url) as rt:
        parked = await rt.generate("support", prompt="Refund order 1042")
        approve = so.InputResponse(request_id=parked.pending[0].id, option_id="approve")
        recorded = await rt.respond(parked.session_id, [approve], resume=False)
        assert recorded.status == "running"  # recorded only: a worker runs it

    assert worker(scripts, store_url, records, parked.session_id, "claim") == -signal.SIGKILL
    _proof.record("crash-outside:kills")
    assert read_executions(records) == []  # killed before it drove anything
    assert worker(scripts, store_url, records, parked.session_id, "never") == 0

    async with so.Runtime([make_agent(str(records))], store=store_url) as rt:
        state = await rt.state(parked.session_id)
        assert state.turn is not None and state.turn.status == "completed"
        events = [e.type async for e in rt.events(parked.session_id, follow=False)]
        assert events.count("turn.completed") == 1 and events.count("tool.completed") == 1
        assert await rt.verify_audit() == []
    assert len(read_executions(records)) == 1
