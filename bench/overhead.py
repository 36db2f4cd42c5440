"""Micro-benchmark: framework overhead per agent step, and resume latency against history length.

Runs on a file-backed SQLite store with the `Scripted` model and no-op tools, so every
microsecond measured is signoff's own (events, state fold, SQLite commits, validation).

    python -m bench.overhead            # full run (about a minute)
    python -m bench.overhead --quick    # fewer samples
    python -m bench.overhead --profile  # also print cProfile hotspots of a resume and a step

Resume latency is the time from the call that hands over the answer (`generate(approvals=...)`
or `respond(...)`) until the approved tool's body starts (the tool reads `perf_counter()` on
entry). It is measured in the runtime that parked the turn (warm cache), in a brand-new
`Runtime` on the same file (cold cache), and in a brand-new process (cold everything but the
imports).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import json
import os
import platform
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import signoff as so

__all__ = ["main"]

HISTORIES = (10, 1000)
STEPS_PER_TURN = 10
ENTRIES: list[float] = []  # perf_counter() at each entry into the gated tool
CPU_ENTRIES: list[float] = []  # process_time() at the same moments
ON_ENTRY: list[Callable[[], None]] = []  # called on entry into the gated tool (profiling)


@so.tool
async def noop() -> str:
    """Do nothing."""
    return "ok"


@so.tool(approval=so.always())
async def gated() -> str:
    """Do nothing, after a person approves."""
    ENTRIES.append(time.perf_counter())
    CPU_ENTRIES.append(time.process_time())
    for fn in ON_ENTRY:
        fn()
    return "ok"


def _call(name: str) -> so.ModelResponse:
    return so.ModelResponse(tool_calls=[so.ToolCall(name=name, input={})])


def _history_script(turns: int) -> list[so.ModelResponse]:
    """What the model says during `turns` history turns: one no-op call, then a text."""
    return [r for _ in range(turns) for r in (_call("noop"), so.ModelResponse(text="ok"))]


_AGENTS: dict[int, list[so.Agent]] = {}


def _agents(samples: int) -> list[so.Agent]:
    """For each history length: an agent whose script builds the history, then measures.

    `steps-H` turns make STEPS_PER_TURN no-op steps each; `gate-H` turns make one gated call.
    Built once: every `Runtime` of the run shares them, as a real deployment's would.
    """
    if samples in _AGENTS:
        return _AGENTS[samples]
    agents = _AGENTS[samples] = []
    for h in HISTORIES:
        steps = [_call("noop")] * STEPS_PER_TURN + [so.ModelResponse(text="done")]
        agents.append(
            so.Agent(
                name=f"steps-{h}",
                model=so.models.Scripted(_history_script(h) + steps * samples),
                tools=[noop],
            )
        )
        gate = [_call("gated"), so.ModelResponse(text="done")]
        agents.append(
            so.Agent(
                name=f"gate-{h}",
                model=so.models.Scripted(_history_script(h) + gate * (3 * samples + 10)),
                tools=[noop, gated],
            )
        )
    return agents


async def _history(rt: so.Runtime, agent: str, turns: int) -> str:
    """A session of `agent` with `turns` completed turns, built through the public API."""
    session_id = await rt.create_session(agent)
    for i in range(turns):
        r = await rt.generate(session_id=session_id, prompt=f"history turn {i}")
        assert r.status == "completed", r
    return session_id


def _stats(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    p90 = xs[min(len(xs) - 1, int(round(0.9 * (len(xs) - 1))))]
    return {"median": statistics.median(xs), "p90": p90, "n": len(xs)}


# -- (a) overhead per step ---------------------------------------------------------------------

Series = dict[str, dict[int, list[float]]]  # row label -> history length -> samples (seconds)


async def bench_steps(rt: so.Runtime, samples: int) -> Series:
    """Per-step wall and CPU time of turns of STEPS_PER_TURN (model call + no-op tool) steps.

    At 10 turns every sample gets a fresh session, so each sees a history of exactly 10; at
    1,000 one long session is used, which the few measured turns barely lengthen. The two
    lengths alternate sample by sample, so load on the machine hits both alike.
    """
    sessions: dict[int, list[str]] = {}
    for h in HISTORIES:
        if h <= 100:
            sessions[h] = [await _history(rt, f"steps-{h}", h) for _ in range(samples)]
        else:
            sessions[h] = [await _history(rt, f"steps-{h}", h)] * samples
    wall: dict[int, list[float]] = {h: [] for h in HISTORIES}
    cpu: dict[int, list[float]] = {h: [] for h in HISTORIES}
    for i in range(samples):
        for h in HISTORIES:
            gc.collect()
            c0, t0 = time.process_time(), time.perf_counter()
            r = await rt.generate(session_id=sessions[h][i], prompt="measured turn")
            wall[h].append((time.perf_counter() - t0) / STEPS_PER_TURN)
            cpu[h].append((time.process_time() - c0) / STEPS_PER_TURN)
            assert r.status == "completed" and r.text == "done", r
    return {"step: wall time": wall, "step: CPU time": cpu}


# -- (b) resume latency ------------------------------------------------------------------------


Answer = Callable[[so.Runtime, str, str], Awaitable[so.GenerateResult]]


async def _by_generate(rt: so.Runtime, session_id: str, request_id: str) -> so.GenerateResult:
    decision = so.Decision(id=request_id, approved=True, reason="bench")
    return await rt.generate(session_id=session_id, approvals=[decision])


async def _by_respond(rt: so.Runtime, session_id: str, request_id: str) -> so.GenerateResult:
    response = so.InputResponse(request_id=request_id, option_id="approve")
    return await rt.respond(session_id, [response])


ANSWERS: dict[str, Answer] = {"generate(approvals)": _by_generate, "respond": _by_respond}


async def _park(rt: so.Runtime, session_id: str) -> str:
    r = await rt.generate(session_id=session_id, prompt="please run the gated tool")
    assert r.status == "waiting", r
    return r.pending[0].id


async def _resume_once(
    rt: so.Runtime,
    session_id: str,
    request_id: str,
    answer: Answer,
    profiler: cProfile.Profile | None = None,
) -> dict[str, float]:
    """Seconds from the answering call to the tool body (`call -> tool`, and its CPU time), the
    same minus the settlement's commit (`signoff's part`, `signoff's CPU`), and to the turn done.

    The commit left out is not only SQLite's write and fsync: it includes signoff's own CPU work
    in it (packing the events, the audit hash, the statements), which only `call -> tool, CPU`
    counts.
    """
    marks: dict[str, float] = {}
    cpu_marks: dict[str, float] = {}

    def hook(when: str, label: str) -> None:
        if label == "approval.settled":
            marks[when] = time.perf_counter()
            cpu_marks[when] = time.process_time()
            if profiler is not None and when == "before":
                profiler.disable()  # leave the commit out of the profile
            elif profiler is not None:
                profiler.enable()

    rt.store.set_fault_hook(hook)
    ENTRIES.clear()
    CPU_ENTRIES.clear()
    gc.collect()  # start every sample with the same (empty) garbage; the collector stays on
    if profiler is not None:
        profiler.enable()
    try:
        c0, t0 = time.process_time(), time.perf_counter()
        r = await answer(rt, session_id, request_id)
        done = time.perf_counter() - t0
    finally:
        rt.store.set_fault_hook(None)
    assert r.status == "completed" and len(ENTRIES) == 1 and len(marks) == 2, r
    total = ENTRIES[0] - t0
    return {
        "call -> tool": total,
        "signoff's part": total - (marks["after"] - marks["before"]),
        "signoff's CPU": CPU_ENTRIES[0] - c0 - (cpu_marks["after"] - cpu_marks["before"]),
        "call -> tool, CPU": CPU_ENTRIES[0] - c0,
        "call -> turn done": done,
    }


async def bench_resume(url: str, rt: so.Runtime, samples: int, *, answer: str) -> Series:
    """Resume latency at each history length, in the runtime that parked the turn (warm) and
    in a brand-new `Runtime` on the same file (cold cache, new connection)."""
    long = {h: await _history(rt, f"gate-{h}", h) for h in HISTORIES if h > 100}
    out: Series = {}
    for _ in range(samples):
        for h in HISTORIES:
            for cold in (False, True):
                session_id = long.get(h) or await _history(rt, f"gate-{h}", h)
                request_id = await _park(rt, session_id)
                where = "new Runtime" if cold else "same Runtime"
                if cold:
                    fresh = so.Runtime(_agents(samples), store=url)
                    await fresh.open()  # opening the file is per process, not per resume
                    try:
                        got = await _resume_once(fresh, session_id, request_id, ANSWERS[answer])
                    finally:
                        await fresh.close()
                else:
                    got = await _resume_once(rt, session_id, request_id, ANSWERS[answer])
                for name, seconds in got.items():
                    key = f"resume, {answer}, {where}: {name}"
                    out.setdefault(key, {}).setdefault(h, []).append(seconds)
    return out


async def _child_resume(url: str, session_id: str, request_id: str, *, samples: int) -> None:
    """In a brand-new process: open the store, answer, and print the latencies as JSON."""
    rt = so.Runtime(_agents(samples), store=url)
    await rt.open()
    got = await _resume_once(rt, session_id, request_id, _by_generate)
    await rt.close()
    print(json.dumps(got))


async def bench_resume_process(url: str, rt: so.Runtime, samples: int) -> Series:
    """Resume latency when a brand-new process answers (its imports and store open excluded)."""
    long = {h: await _history(rt, f"gate-{h}", h) for h in HISTORIES if h > 100}
    out: Series = {}
    for _ in range(samples):
        for h in HISTORIES:
            session_id = long.get(h) or await _history(rt, f"gate-{h}", h)
            request_id = await _park(rt, session_id)
            argv = [sys.executable, "-m", "bench.overhead", "--child", url, session_id, request_id]
            argv += ["--samples", str(samples)]
            done = subprocess.run(
                argv, capture_output=True, text=True, check=True, cwd=Path(__file__).parent.parent
            )
            got = json.loads(done.stdout.strip().splitlines()[-1])
            for name, seconds in got.items():
                key = f"resume, generate(approvals), new process: {name}"
                out.setdefault(key, {}).setdefault(h, []).append(float(seconds))
    return out


# -- profiling ---------------------------------------------------------------------------------


async def profile(url: str, rt: so.Runtime, samples: int) -> str:
    """cProfile of signoff's part of cold resumes, of the rest of those turns, and of 10-step
    turns, all at 1,000 turns of history."""
    h = HISTORIES[-1]
    session_id = await _history(rt, f"gate-{h}", h)
    steps_session = await _history(rt, f"steps-{h}", h)
    resume, rest = cProfile.Profile(), cProfile.Profile()

    def on_entry() -> None:
        resume.disable()
        rest.enable()

    ON_ENTRY.append(on_entry)
    try:
        for _ in range(samples):
            request_id = await _park(rt, session_id)
            fresh = so.Runtime(_agents(samples), store=url)
            await fresh.open()
            await _resume_once(fresh, session_id, request_id, _by_generate, resume)
            rest.disable()
            await fresh.close()
    finally:
        ON_ENTRY.remove(on_entry)
    steps = cProfile.Profile()
    for _ in range(samples):
        steps.enable()
        await rt.generate(session_id=steps_session, prompt="profiled turn")
        steps.disable()
    out = io.StringIO()
    for title, prof, key in (
        ("signoff's part of a cold resume at 1,000 turns (call -> tool body)", resume, "tottime"),
        ("the rest of that turn (tool body -> turn completed)", rest, "cumulative"),
        ("10-step turns at 1,000 turns", steps, "tottime"),
    ):
        out.write(f"== {title}, {samples} samples ==\n")
        pstats.Stats(prof, stream=out).sort_stats(key).print_stats(20)
    return out.getvalue()


# -- report ------------------------------------------------------------------------------------


def _us(x: float) -> str:
    return f"{x * 1e6:.0f}"


def _fsync_cost() -> float:
    """Median time of one fsync on the benchmark's disk: the floor of a durable settlement."""
    with tempfile.TemporaryDirectory(prefix="signoff-fsync-") as tmp:
        fd = os.open(os.path.join(tmp, "probe"), os.O_WRONLY | os.O_CREAT)
        try:
            times = []
            for _ in range(20):
                os.write(fd, b"x" * 128)
                t0 = time.perf_counter()
                os.fsync(fd)
                times.append(time.perf_counter() - t0)
        finally:
            os.close(fd)
    return statistics.median(times)


async def run(samples: int, with_profile: bool, with_process: bool) -> None:
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="signoff-bench-") as tmp:
        url = f"sqlite:///{tmp}/state.db"
        rt = so.Runtime(_agents(samples), store=url)
        await rt.open()
        rows: Series = {}
        rows.update(await bench_steps(rt, samples))
        for answer in ANSWERS:
            rows.update(await bench_resume(url, rt, samples, answer=answer))
        if with_process:
            rows.update(await bench_resume_process(url, rt, max(5, samples // 3)))
        size = rt.store.file_bytes() if isinstance(rt.store, so.stores.SQLiteStore) else 0
        profile_text = await profile(url, rt, max(5, samples // 2)) if with_profile else ""
        await rt.close()
    fsync = _fsync_cost()

    print(
        f"Python {platform.python_version()} | {platform.machine()} | nproc {os.cpu_count()} | "
        f"load average {load:.1f} | SQLite file store (WAL) | {samples} samples per cell | "
        f"store at the end {size / 1e6:.1f} MB | one fsync on this disk: {fsync * 1e6:.0f} us"
    )
    print("microseconds; h = completed turns already in the session; ratio = median h1000/h10")
    width = max(len(label) for label in rows) + 2
    head = f"{'':{width}}" + "".join(
        f"{'h=' + str(h) + ' median':>15}{'p90':>8}" for h in HISTORIES
    )
    print(head + f"{'ratio':>8}")
    for label, cells in rows.items():
        stats = {h: _stats(cells[h]) for h in HISTORIES}
        line = f"{label:{width}}" + "".join(
            f"{_us(stats[h]['median']):>15}{_us(stats[h]['p90']):>8}" for h in HISTORIES
        )
        ratio = stats[HISTORIES[-1]]["median"] / stats[HISTORIES[0]]["median"]
        print(line + f"{ratio:8.2f}")
    print(
        "call -> tool: from the answering call until the approved tool's body starts;\n"
        "signoff's part: the same minus the settlement's commit (SQLite write + full fsync,\n"
        "  and signoff's own work inside that commit: packing events, audit hash, statements);\n"
        "signoff's CPU: CPU time of signoff's part (immune to being descheduled);\n"
        "call -> tool, CPU: all CPU time from the call to the tool body, the commit's included;\n"
        "call -> turn done: until the answering call returns with the turn completed."
    )
    if profile_text:
        print()
        print(profile_text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__)
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="10 samples per cell")
    parser.add_argument("--profile", action="store_true", help="print cProfile hotspots")
    parser.add_argument("--no-process", action="store_true", help="skip the new-process resume")
    parser.add_argument("--child", nargs=3, metavar=("URL", "SESSION", "REQUEST"))
    args = parser.parse_args(argv)
    if args.child:
        asyncio.run(_child_resume(*args.child, samples=args.samples))
        return
    samples = 10 if args.quick else args.samples
    asyncio.run(run(samples, args.profile, not args.no_process))


if __name__ == "__main__":
    main()
