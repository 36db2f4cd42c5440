"""Child processes for the scale-out tests: `signoff worker` runs and racing answerers.

`runtime()` is the MODULE:RUNTIME target of `signoff worker tests._worker_procs:runtime`: one
support agent whose gated refund tool writes a `start` record (with its idempotency key and pid)
before its body sleeps and a `done` record after, to the file named by `SIGNOFF_TEST_RECORDS`.
With `SIGNOFF_TEST_HOLD` naming a file, each body also waits after its `start` record until
that file exists, so a test knows which bodies are in flight when it signals a worker.
`python -m tests._worker_procs answer ...` answers a list of requests at once behind a barrier.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import signoff as so

from ._forks import python_env
from ._procs import ROOT, is_type, query, record_execution

__all__ = [
    "AGENT",
    "ALICE",
    "Worker",
    "check_logs",
    "make_agent",
    "read_records",
    "runtime",
    "settled_counts",
    "start_worker",
]

AGENT = "support"
ORDER = {"order_id": "1042", "amount": 180.0}
ALICE = so.Principal(authenticator="test", principal_id="alice")


def make_agent(records: str, delay: float = 0.0, hold: str | None = None) -> so.Agent:
    """The support agent: one refund call that needs approval, then a final text. With `hold`,
    each tool body waits (after its `start` record) until the file `hold` exists."""

    @so.tool(approval=so.always())
    async def issue_refund(ctx: so.ToolContext, order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        key = ctx.idempotency_key()
        record_execution(records, f"start {key}", os.getpid())
        while hold is not None and not os.path.exists(hold):
            await asyncio.sleep(0.05)
        if delay:
            await asyncio.sleep(delay)
        record_execution(records, f"done {key}", os.getpid())
        return {"refunded": amount, "order_id": order_id}

    model = so.models.Scripted(
        [
            so.ModelResponse(
                tool_calls=[so.ToolCall(id="call_refund", name="issue_refund", input=dict(ORDER))]
            ),
            so.ModelResponse(text="Refunded."),
        ]
    )
    return so.Agent(name=AGENT, model=model, tools=[issue_refund])


def runtime() -> so.Runtime:
    """The factory `signoff worker` loads; the store comes from `--store`."""
    records = os.environ["SIGNOFF_TEST_RECORDS"]
    delay = float(os.environ.get("SIGNOFF_TEST_TOOL_DELAY", "0"))
    hold = os.environ.get("SIGNOFF_TEST_HOLD") or None
    loading = os.environ.get("SIGNOFF_TEST_LOADING") or None
    if loading is not None:  # an app slow to load: says so in `loading`, then waits for `.go`
        Path(loading).write_text("loading")
        deadline = time.monotonic() + 30
        while not Path(loading + ".go").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    return so.Runtime([make_agent(records, delay, hold)], store="sqlite:///:memory:")


def read_records(path: str | Path) -> list[tuple[str, str, int]]:
    """(`start` or `done`, idempotency key, pid) for every record the tool wrote, in order."""
    p = Path(path)
    if not p.exists():
        return []
    out: list[tuple[str, str, int]] = []
    for line in p.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            what, _, key = str(rec["key"]).partition(" ")
            out.append((what, key, int(rec["pid"])))
    return out


class Worker:
    """One `signoff worker` subprocess, its stderr in a file; its tool bodies wait for the file
    named by the option `hold` when one is given (the others are its command line's)."""

    def __init__(
        self, url: str, tmp: Path, name: str, records: Path, *, delay: float, **options: Any
    ) -> None:
        hold = options.pop("hold", None)
        loading = options.pop("loading", None)
        self.log_path = tmp / f"worker-{name}.log"
        self._log = self.log_path.open("w")
        argv = [sys.executable, "-m", "signoff", "worker", "tests._worker_procs:runtime"]
        argv += ["--store", url]
        for key, value in options.items():
            argv += [f"--{key.replace('_', '-')}", str(value)]
        env = {
            **python_env(),
            "SIGNOFF_TEST_RECORDS": str(records),
            "SIGNOFF_TEST_TOOL_DELAY": str(delay),
            "SIGNOFF_TEST_HOLD": "" if hold is None else str(hold),
            "SIGNOFF_TEST_LOADING": "" if loading is None else str(loading),
        }
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=self._log
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self._log.close()


def start_worker(url: str, tmp: Path, name: str, records: Path, **options: Any) -> Worker:
    """Start a worker and wait until it has logged its start line (its store is open)."""
    delay = float(options.pop("delay", 0.0))
    w = Worker(url, tmp, name, records, delay=delay, **options)
    deadline = time.monotonic() + 20
    while "worker " not in w.log():
        if w.proc.poll() is not None or time.monotonic() > deadline:
            w.close()
            raise AssertionError(f"worker {name} did not start:\n{w.log()}")
        time.sleep(0.02)
    return w


def check_logs(url: str) -> dict[str, int]:
    """Assert every session's log is seq 1..head with no gap or fork; returns each head."""
    heads = {str(sid): int(head) for sid, head in query(url, "SELECT id, head FROM {t}sessions")}
    seqs: dict[str, list[int]] = {}
    rows = query(
        url, "SELECT s.id, e.seq FROM {t}events e JOIN {t}sessions s ON s.sk = e.sk ORDER BY 1, 2"
    )
    for sid, seq in rows:
        seqs.setdefault(str(sid), []).append(int(seq))
    for sid, head in heads.items():
        assert seqs.get(sid) == list(range(1, head + 1)), f"session {sid}: gap or fork"
    return heads


def settled_counts(url: str) -> tuple[Counter[str], Counter[str]]:
    """Per session: `approval.settled` events, and settled rows of the requests table."""
    events: Counter[str] = Counter()
    for (sid,) in query(
        url,
        "SELECT s.id FROM {t}events e JOIN {t}sessions s ON s.sk = e.sk "
        f"WHERE e.type {is_type('approval.settled')}",
    ):
        events[str(sid)] += 1
    rows: Counter[str] = Counter()
    for (sid,) in query(
        url,
        "SELECT s.id FROM {t}requests r JOIN {t}sessions s ON s.sk = r.sk "
        "WHERE r.status = 'settled'",
    ):
        rows[str(sid)] += 1
    return events, rows


# -- the racing answerer ----------------------------------------------------------------------


async def _answer_all(args: argparse.Namespace) -> None:
    pairs: list[list[str]] = json.loads(Path(args.requests).read_text())
    # Answers are only recorded; each process also works, so the turns race to be claimed too.
    rt = so.Runtime([make_agent(args.records)], store=args.store, inline=False)
    await rt.open()
    stop = asyncio.Event()
    working = asyncio.create_task(rt.work(concurrency=20, stop=stop, idle_wait=0.1))
    me = ALICE  # the sessions' requester: the default policy lets only her settle
    print(json.dumps({"event": "ready"}), flush=True)
    start = Path(args.start_file)
    while not start.exists():
        await asyncio.sleep(0.0005)

    async def one(session_id: str, request_id: str) -> str:
        try:
            r = await rt.respond(
                session_id,
                [so.InputResponse(request_id=request_id, option_id="approve")],
                principal=me,
            )
        except so.SignoffError as exc:
            return type(exc).__name__
        return "applied" if [o.applied for o in r.outcomes] == [True] else "noop"

    results = await asyncio.gather(*(one(s, r) for s, r in pairs))
    for session_id, _ in pairs:  # until every turn is over, wherever it ran
        while (await rt.state(session_id)).status != "idle":
            await asyncio.sleep(0.05)
    stop.set()
    await working
    print(json.dumps({"event": "done", "results": results}), flush=True)
    await rt.close()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tests._worker_procs")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("answer")
    p.add_argument("--store", required=True)
    p.add_argument("--records", required=True)
    p.add_argument("--requests", required=True, help="JSON file of [session_id, request_id]")
    p.add_argument("--start-file", required=True)
    return parser


if __name__ == "__main__":
    asyncio.run(_answer_all(_parser().parse_args()))
