"""Micro-benchmark: what OpenTelemetry tracing adds to a turn when no tracer provider is set.

    python -m bench.tracing            # 400 turns per mode, the modes taking turns
    python -m bench.tracing --turns 100

A turn here is one model call proposing a no-op tool, the tool, and a final text (two model
spans, one tool span, one drive span), on a file-backed SQLite store, in one session whose
turns take the modes in turn:

- **off**: tracing off, as when `opentelemetry` is not installed (the runtime's `OFF`);
- **no-op**: `opentelemetry-api` installed, no provider set (the API's no-op tracer);
- **sdk**: an SDK `TracerProvider` with no processor (spans made, then dropped);
- **off-2**: off again, a control: its difference from **off** is the noise of the run.

Reported: median CPU time per turn (`time.process_time`), and the tracing calls of one turn
timed on their own (no store), which is the cost the no-op mode adds, free of the turn's noise.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import timeit
from functools import partial
from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider

import signoff as so
from signoff import _tracing
from signoff._state import SessionState

__all__ = ["main"]


@so.tool
async def noop() -> str:
    """Do nothing."""
    return "ok"


def _agent(turns: int) -> so.Agent:
    call = so.ModelResponse(tool_calls=[so.ToolCall(name="noop", input={})])
    script = [r for _ in range(turns) for r in (call, so.ModelResponse(text="ok"))]
    return so.Agent(name="bench", model=so.models.Scripted(script), tools=[noop])


async def _run(turns: int) -> dict[str, list[float]]:
    """CPU per turn in each mode, one runtime and session for all, the mode switched before
    each turn in turn: a busy machine, the file and the session's length weigh on each alike."""
    modes = {
        "off": _tracing.OFF,
        "no-op": _tracing.tracing_for(None, False),
        "sdk": _tracing.tracing_for(TracerProvider(), False),
        "off-2": _tracing.OFF,
    }
    results: dict[str, list[float]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory() as tmp:
        rt = so.Runtime([_agent(len(modes) * turns + 20)], f"sqlite:///{Path(tmp) / 'b.db'}")
        session_id = await rt.create_session("bench")
        for i in range(len(modes) * turns + 20):
            mode = list(modes)[i % len(modes)]
            rt._tracing = modes[mode]
            start = time.process_time()
            r = await rt.generate(session_id=session_id, prompt=f"turn {i}")
            if i >= 20:  # the first ones warm caches, statements and imports up
                results[mode].append(time.process_time() - start)
            assert r.status == "completed", r
        await rt.close()
    return results


RESPONSE = so.ModelResponse(text="ok")


def _spans_of_a_turn(tracing: _tracing.Tracing, state: SessionState, request: object) -> None:
    """The tracing calls one turn of `_agent` makes: a drive, two model calls, one tool."""
    drive = tracing.drive(state.id)
    drive.begin(state, 0.0)
    drive.traceparent()  # kept with the turn if it parks
    for _ in range(2):
        model = tracing.model(state, None, request)
        model.responded(RESPONSE)
        model.end()
    tool = tracing.tool(state, "call_1", "noop", {})
    tool.outcome("ok", "ok")
    tool.end()
    drive.finish(state)
    drive.end()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=400, help="turns per mode")
    args = parser.parse_args()
    results = asyncio.run(_run(args.turns))
    off = statistics.median(results["off"])
    print(f"CPU per turn, median of {len(results['off'])} turns per mode (microseconds):")
    for mode, times in results.items():
        median = statistics.median(times)
        print(f"  {mode:6} {median * 1e6:8.0f}  ({(median - off) / off:+.1%} vs off)")
    state = SessionState(id="ses_bench", agent="bench")
    noop = _tracing.tracing_for(None, False)
    n = 20_000
    for name, tracing in (("off", _tracing.OFF), ("no-op", noop)):
        cost = min(timeit.repeat(partial(_spans_of_a_turn, tracing, state, None), number=n))
        print(f"tracing calls of one turn, {name:6}: {cost / n * 1e6:6.2f} us")


if __name__ == "__main__":
    main()
