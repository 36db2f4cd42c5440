"""Benchmark: a workflow tool of N journaled steps, run live and then replayed after a restart
(a script, not a test).

    .venv/bin/python -m bench.steps 2000 20000

The tool takes N steps (an async function returning its argument, ten names in turn, so each
name recurs) and then asks a question; a new `Runtime` on the same SQLite file takes the answer,
and the body runs again, replaying the N steps from the journal. Reported: the live run (N steps
journaled, one commit each) and its cost per step, over all N and over the last `TAIL` steps
alone (what a step costs once the journal is that long), the resume, and the body's replay of
the N steps within it. With two or more N, the per-step costs of each against the first's.
The first `TAIL` steps' cost against the last's, within a run, is what a busy machine blurs
least: the body's clock starts once the turn runs, so the first ones carry no turn start.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

import signoff as so
from signoff.testing import call, call_tools, reply, scripted_agent

TAIL = 1000
"""The last steps of a run whose cost per step is reported on its own."""


async def measure(n: int) -> dict[str, float]:
    marks: dict[str, float] = {}
    cpu: dict[str, float] = {}

    async def same(i: int) -> int:
        return i

    @so.tool
    async def many(ctx: so.ToolContext) -> int:
        """N steps, then a question."""
        marks.setdefault("body", time.perf_counter())
        total = 0
        for i in range(n):
            if i == min(TAIL, n):
                marks.setdefault("head", time.perf_counter())
                cpu.setdefault("head", time.process_time())
            if i == n - min(TAIL, n):
                marks.setdefault("tail", time.perf_counter())
                cpu.setdefault("tail", time.process_time())
            total += await ctx.step(f"s{i % 10}", same, i)
        marks["replayed"] = time.perf_counter()
        cpu["replayed"] = time.process_time()
        await ctx.ask("Go on?", ["yes", "no"])
        return total

    agent = scripted_agent("a", [call_tools(call("many")), reply("done")], tools=[many])
    with tempfile.TemporaryDirectory() as d:
        url = f"sqlite:///{Path(d) / 'state.db'}"
        async with so.Runtime([agent], store=url) as rt:
            started, started_cpu = time.perf_counter(), time.process_time()
            r = await rt.generate("a", prompt="go")
            live = time.perf_counter() - started
            live_cpu = time.process_time() - started_cpu
        tail = marks["replayed"] - marks["tail"]
        tail_cpu = cpu["replayed"] - cpu["tail"]
        head = marks["head"] - marks["body"]
        marks.clear()
        async with so.Runtime([agent], store=url) as rt:
            started, started_cpu = time.perf_counter(), time.process_time()
            resumed = await rt.send(r.session_id, "yes")
            resume = time.perf_counter() - started
            resume_cpu = time.process_time() - started_cpu
        if resumed.status != "completed":
            raise SystemExit(f"the resumed turn is {resumed.status}")
    return {
        "live": live,
        "per_step": live / n,
        "per_step_cpu": live_cpu / n,
        "head_per_step": head / min(TAIL, n),
        "tail_per_step": tail / min(TAIL, n),
        "tail_per_step_cpu": tail_cpu / min(TAIL, n),
        "resume": resume,
        "resume_cpu": resume_cpu,
        "replay": marks["replayed"] - marks["body"],
    }


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [2000, 20000]
    first: dict[str, float] | None = None
    for n in sizes:
        m = asyncio.run(measure(n))
        ms = {k: v * 1e3 for k, v in m.items()}
        line = (
            f"N={n}: live {m['live']:.2f} s; a step {ms['per_step']:.3f} ms "
            f"({ms['per_step_cpu']:.3f} ms CPU), the first {min(TAIL, n)} "
            f"{ms['head_per_step']:.3f} ms, the last {ms['tail_per_step']:.3f} ms "
            f"({ms['tail_per_step_cpu']:.3f} ms CPU); resume "
            f"{m['resume']:.2f} s ({m['resume_cpu']:.2f} s CPU), replaying N steps "
            f"{m['replay']:.2f} s; the last steps against the first "
            f"x{m['tail_per_step'] / m['head_per_step']:.2f}"
        )
        if first is None:
            first = m
        else:
            ratios = [m[k] / first[k] for k in ("per_step", "per_step_cpu", "tail_per_step")]
            ratios.append(m["tail_per_step_cpu"] / first["tail_per_step_cpu"])
            line += (
                f"\n  against N={sizes[0]}: a step x{ratios[0]:.2f} (CPU x{ratios[1]:.2f}), "
                f"the last ones x{ratios[2]:.2f} (CPU x{ratios[3]:.2f})"
            )
        print(line, flush=True)


if __name__ == "__main__":
    main()
