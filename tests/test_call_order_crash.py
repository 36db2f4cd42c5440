"""A turn SIGKILLed inside the body of the second of three calls its model asked for at once:
resumed in another process, the calls go on in the response's order, as uninterrupted. The cut
short call runs again before the third one starts, and the model reads the results in the
uninterrupted run's order (the resume used to run the third call first, and the model read its
result before the second's)."""

from __future__ import annotations

import signal
from pathlib import Path

import signoff as so
from signoff.testing import Capture, timeline, tool_results

from ._call_order_crash import PROMPT, make_agent
from ._forks import Scripts
from ._procs import ROOT, lapse_leases, read_executions
from .test_sqlite_upgrade import _child_env

_CHILD = "import sys\nfrom tests._call_order_crash import main\nmain(sys.argv[1:])\n"


async def _what_ran(
    rt: so.Runtime, sid: str, answer: Capture
) -> tuple[list[str], list[tuple[str, object]]]:
    """The session's tool events, and the results (call id and content) the model then read."""
    events = [e async for e in rt.events(sid, follow=False)]
    tools = [line for line in timeline(events) if line.startswith("tool.")]
    return tools, [(m.call_id, m.content) for m in tool_results(answer.last)]


async def test_calls_cut_short_by_a_kill_go_on_in_the_response_order(
    store_url: str, tmp_path: Path, scripts: Scripts
) -> None:
    whole = Capture()
    async with so.Runtime([make_agent(str(tmp_path / "whole"), whole)], store=store_url) as rt:
        r = await rt.generate("shop", prompt=PROMPT)
        assert r.status == "completed", r
        expected = await _what_ran(rt, r.session_id, whole)
    assert [e["key"] for e in read_executions(tmp_path / "whole")] == ["find", "pack", "ship"]

    runs = tmp_path / "runs"
    env = {**_child_env(), "PYTHONPATH": f"{_child_env()['PYTHONPATH']}:{ROOT}"}
    done = scripts.run(_CHILD, store_url, str(runs), env=env)
    assert done.returncode == -signal.SIGKILL, (done.returncode, done.stderr)
    assert [e["key"] for e in read_executions(runs)] == ["find", "pack"]
    lapse_leases(store_url)  # as its TTL passing would

    resumed = Capture()
    async with so.Runtime([make_agent(str(runs), resumed)], store=store_url) as rt:
        [sid] = [s.id for s in await rt.sessions() if s.id != r.session_id]
        again = await rt.generate(session_id=sid)
        assert again.status == "completed", again
        got = await _what_ran(rt, sid, resumed)
    # `pack` ran again (it was cut short) before `ship` ran at all
    assert [e["key"] for e in read_executions(runs)] == ["find", "pack", "pack", "ship"]
    assert got == expected
    assert [call_id for call_id, _ in got[1]] == ["c1", "c2", "c3"]
