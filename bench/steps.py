"""Benchmark: a workflow tool of N journaled steps, run live and then replayed after a restart,
and after a crash mid-run (a script, not a test).

    .venv/bin/python -m bench.steps 2000 20000 [--store postgresql://...]

The tool takes N steps (an async function returning its argument, ten names in turn, so each
name recurs) and then asks a question; a new `Runtime` on the same store takes the answer,
and the body runs again, replaying the N steps from the journal. Reported: the live run (N steps
journaled, one commit each) and its cost per step, over all N and over the last `TAIL` steps
alone (what a step costs once the journal is that long), the resume, and the body's replay of
the N steps within it. With two or more N, the per-step costs of each against the first's.
The first `TAIL` steps' cost against the last's, within a run, is what a busy machine blurs
least: the body's clock starts once the turn runs, so the first ones carry no turn start.

After a crash: the same tool, whose runtime is closed once its N steps are journaled, while the
body waits (as a crash leaves the store: the turn running, its latest snapshot taken as the
steps ran, which leaves their journal out). A new `Runtime` resumes the turn, reads the journal
back from the events, and the body replays the N steps and asks. Reported beside the resume
after the park, whose snapshot holds the journal: the time until the body starts (the state
loaded and, after the crash, the journal read back), and the resume as a whole.

Each runs on a new SQLite file, or with `--store` on a PostgreSQL database (new sessions).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import signoff as so
from signoff.testing import call, call_tools, reply, scripted_agent

TAIL = 1000
"""The last steps of a run whose cost per step is reported on its own."""


@contextlib.asynccontextmanager
async def store_url(given: str | None) -> AsyncIterator[str]:
    """`given`, or a new SQLite file's URL (removed afterwards)."""
    if given is not None:
        yield given
        return
    with tempfile.TemporaryDirectory() as d:
        yield f"sqlite:///{Path(d) / 'state.db'}"


def stepper(n: int, marks: dict[str, float], cpu: dict[str, float], hold: Any = None) -> so.Agent:
    """The agent whose tool takes `n` steps, noting when its body starts and ends replaying in
    `marks` (wall) and `cpu`, then asks; with `hold` (a dict), it first waits there for ever,
    its session's id in `hold["session"]` and `hold["stepped"]` set."""

    async def same(i: int) -> int:
        return i

    @so.tool
    async def many(ctx: so.ToolContext) -> int:
        """N steps, then a question."""
        marks.setdefault("body", time.perf_counter())
        cpu.setdefault("body", time.process_time())
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
        if hold is not None:
            hold["session"] = ctx.session.id
            hold["stepped"].set()
            await asyncio.Event().wait()  # the runtime closes meanwhile: a crash mid-run
        await ctx.ask("Go on?", ["yes", "no"])
        return total

    return scripted_agent("a", [call_tools(call("many")), reply("done")], tools=[many])


async def measure(n: int, given: str | None = None) -> dict[str, float]:
    marks: dict[str, float] = {}
    cpu: dict[str, float] = {}
    agent = stepper(n, marks, cpu)
    async with store_url(given) as url:
        async with so.Runtime([agent], store=url) as rt:
            started, started_cpu = time.perf_counter(), time.process_time()
            r = await rt.generate("a", prompt="go")
            live = time.perf_counter() - started
            live_cpu = time.process_time() - started_cpu
        tail = marks["replayed"] - marks["tail"]
        tail_cpu = cpu["replayed"] - cpu["tail"]
        head = marks["head"] - marks["body"]
        marks.clear()
        cpu.clear()
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
        "to_body": marks["body"] - started,
        "to_body_cpu": cpu["body"] - started_cpu,
        "replay": marks["replayed"] - marks["body"],
    }


async def crash(n: int, given: str | None = None) -> dict[str, float]:
    """N steps, the runtime closed mid-run, and the resume in a new runtime (module docstring)."""
    marks: dict[str, float] = {}
    cpu: dict[str, float] = {}
    hold: dict[str, Any] = {"stepped": asyncio.Event()}
    async with store_url(given) as url:
        rt = so.Runtime([stepper(n, marks, cpu, hold)], store=url)
        await rt.open()
        live = asyncio.create_task(rt.generate("a", prompt="go"))
        await hold["stepped"].wait()
        await rt.close()  # the body is stopped where it waits, nothing more recorded
        live.cancel()
        await asyncio.gather(live, return_exceptions=True)
        marks.clear()
        cpu.clear()
        async with so.Runtime([stepper(n, marks, cpu)], store=url) as rt:
            state = await rt.state(hold["session"])
            assert state.turn is not None
            if any(c.journal is not None for c in state.turn.calls.values()):
                raise SystemExit("the snapshot after the crash holds the journal")
        async with so.Runtime([stepper(n, marks, cpu)], store=url) as rt:
            started, started_cpu = time.perf_counter(), time.process_time()
            resumed = await rt.generate(session_id=hold["session"])
            resume = time.perf_counter() - started
            resume_cpu = time.process_time() - started_cpu
        if resumed.status != "waiting":
            raise SystemExit(f"the turn resumed after the crash is {resumed.status}")
    return {
        "resume": resume,
        "resume_cpu": resume_cpu,
        "to_body": marks["body"] - started,
        "to_body_cpu": cpu["body"] - started_cpu,
        "replay": marks["replayed"] - marks["body"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.steps", description=__doc__)
    parser.add_argument("sizes", nargs="*", type=int, help="steps per run (2000 20000)")
    parser.add_argument("--store", help="a PostgreSQL database URL (else a new SQLite file)")
    args = parser.parse_args()
    sizes = args.sizes or [2000, 20000]
    first: dict[str, float] | None = None
    for n in sizes:
        m = asyncio.run(measure(n, args.store))
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
        c = asyncio.run(crash(n, args.store))
        line += (
            f"\n  after a crash: resume {c['resume']:.2f} s ({c['resume_cpu']:.2f} s CPU), "
            f"to the body {c['to_body']:.3f} s ({c['to_body_cpu']:.3f} s CPU; after the "
            f"park {m['to_body']:.3f} s, {m['to_body_cpu']:.3f} s CPU), replaying N steps "
            f"{c['replay']:.2f} s"
        )
        print(line, flush=True)


if __name__ == "__main__":
    main()
