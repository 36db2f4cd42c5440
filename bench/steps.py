"""Benchmark: a workflow tool of N journaled steps, run live and then replayed after a restart
(a script, not a test).

    .venv/bin/python -m bench.steps 1000 5000

The tool takes N steps (an async function returning its argument, ten names in turn, so each
name recurs) and then asks a question; a new `Runtime` on the same SQLite file takes the answer,
and the body runs again, replaying the N steps from the journal. Reported: the live run (N steps
journaled, one commit each), the resume, and the body's replay of the N steps within it.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

import signoff as so
from signoff.testing import call, call_tools, reply, scripted_agent


async def measure(n: int) -> str:
    marks: dict[str, float] = {}

    async def same(i: int) -> int:
        return i

    @so.tool
    async def many(ctx: so.ToolContext) -> int:
        """N steps, then a question."""
        marks.setdefault("body", time.perf_counter())
        total = 0
        for i in range(n):
            total += await ctx.step(f"s{i % 10}", same, i)
        marks["replayed"] = time.perf_counter()
        await ctx.ask("Go on?", ["yes", "no"])
        return total

    agent = scripted_agent("a", [call_tools(call("many")), reply("done")], tools=[many])
    with tempfile.TemporaryDirectory() as d:
        url = f"sqlite:///{Path(d) / 'state.db'}"
        async with so.Runtime([agent], store=url) as rt:
            started = time.perf_counter()
            r = await rt.generate("a", prompt="go")
            live = time.perf_counter() - started
        marks.clear()
        async with so.Runtime([agent], store=url) as rt:
            started = time.perf_counter()
            resumed = await rt.send(r.session_id, "yes")
            resume = time.perf_counter() - started
        if resumed.status != "completed":
            raise SystemExit(f"the resumed turn is {resumed.status}")
    replay = marks["replayed"] - marks["body"]
    return f"N={n}: live {live:.2f} s; resume {resume:.2f} s (replaying N steps {replay:.2f} s)"


def main() -> None:
    for n in [int(a) for a in sys.argv[1:]] or [1000, 5000]:
        print(asyncio.run(measure(n)))


if __name__ == "__main__":
    main()
