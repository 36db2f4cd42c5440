"""bench.overhead's resume measurement: what each reported figure includes (timings not tested)."""

from __future__ import annotations

from pathlib import Path

from bench import overhead

import signoff as so


async def test_resume_reports_all_cpu_to_the_tool_beside_the_part_without_the_commit(
    tmp_path: Path,
) -> None:
    rt = so.Runtime(overhead._agents(1), store=f"sqlite:///{tmp_path}/s.db")
    await rt.open()
    try:
        session_id = await overhead._history(rt, "gate-10", 10)
        request_id = await overhead._park(rt, session_id)
        got = await overhead._resume_once(rt, session_id, request_id, overhead._by_generate)
    finally:
        await rt.close()
    assert set(got) == {
        "call -> tool",
        "signoff's part",
        "signoff's CPU",
        "call -> tool, CPU",
        "call -> turn done",
    }
    # The commit's CPU (packing, audit hash, statements) is left out of signoff's CPU only.
    assert got["call -> tool, CPU"] > got["signoff's CPU"] > 0
    assert got["call -> tool"] >= got["signoff's part"] > 0
