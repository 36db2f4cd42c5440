"""signoff against LangGraph on one human-in-the-loop workload, SQLite and PostgreSQL.

Run it with `scripts/bench-compare` (it builds `.venv-bench` with LangGraph beside signoff and
starts a throwaway PostgreSQL). Every side runs in its own subprocess (`compare_sides`); the
parent prints ratios (`compare_tables`).
"""

import argparse
import json
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from bench.compare_sides import SIDES, worker
from bench.compare_tables import table, targets
from bench.compare_workload import WINDOW

__all__ = ["main"]


# -- the parent: targets, subprocesses ----------------------------------------------------


def _pg_database(base: str, name: str) -> str:
    """Create a fresh database `name` on the cluster of `base` and return its URL."""
    import psycopg

    with psycopg.connect(base, autocommit=True) as con:
        con.execute(f'DROP DATABASE IF EXISTS "{name}"')
        con.execute(f'CREATE DATABASE "{name}"')
    parts = urlsplit(base)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def _run_side(
    side: str, scenario: str, backend: str, target: str, points: list[int], parked: int
) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "bench.compare",
        "--worker",
        "--side",
        side,
        "--scenario",
        scenario,
        "--backend",
        backend,
        "--target",
        target,
        "--points",
        ",".join(map(str, points)),
        "--parked",
        str(parked),
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"{side} {scenario} on {backend} failed (exit {proc.returncode})")
    line = next(x for x in reversed(proc.stdout.splitlines()) if x.startswith("RESULT "))
    print(f"  {backend:8} {scenario:12} {side:9} done in {took:6.1f} s", file=sys.stderr)
    result: dict[str, Any] = json.loads(line[len("RESULT ") :])
    return result


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "sqlite": sqlite3.sqlite_version}
    for dist in (
        "signoff",
        "langgraph",
        "langgraph-checkpoint",
        "langgraph-checkpoint-sqlite",
        "langgraph-checkpoint-postgres",
        "langchain-core",
        "psycopg",
    ):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    import signoff

    src = Path(signoff.__file__).resolve().parent
    git = subprocess.run(
        ["git", "-C", str(src), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
        check=False,
    )
    out["signoff source"] = f"{src} ({git.stdout.strip() or 'not a git checkout'})"
    return out


def _pg_version(url: str) -> str:
    import psycopg

    with psycopg.connect(url) as con:
        row = con.execute("SHOW server_version").fetchone()
        return str(row[0]) if row else "unknown"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="turns 10,50,100; 1,000 parked")
    parser.add_argument("--points", default=None, help="turns to report, e.g. 10,100,250,500")
    parser.add_argument("--parked", type=int, default=None, help="sessions parked at once")
    parser.add_argument("--backends", default=None, help="sqlite,postgres (postgres needs the URL)")
    parser.add_argument("--json", default=None, help="also write the raw results to this file")
    parser.add_argument(
        "--scenarios", default="conversation,parked", help="conversation,parked (default both)"
    )
    parser.add_argument(
        "--render", nargs="+", default=None, help="print the table of saved --json files, merged"
    )
    parser.add_argument(
        "--langgraph-durability",
        choices=("sync", "async", "exit"),
        default=None,
        help="LangGraph's durability mode (default: LangGraph's, async)",
    )
    parser.add_argument(
        "--langgraph-commits",
        choices=("signoff", "default"),
        default="signoff",
        help="LangGraph's store commits: as signoff's ordinary ones (SQLite synchronous=NORMAL, "
        "PostgreSQL synchronous_commit=off; the default) or the drivers' (FULL, on)",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--scenario", choices=("conversation", "parked"), help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.points is None:
        args.points = "10,50,100" if args.quick else "10,100,250,500"
    if args.parked is None:
        args.parked = 1000 if args.quick else 10_000
    if args.worker:
        worker(args)
        return
    points = sorted(int(p) for p in args.points.split(","))
    if args.render:
        merged: dict[str, Any] = {}
        for path in args.render:
            saved = json.loads(Path(path).read_text())
            merged.update(saved["results"])
            print(", ".join(f"{k} {v}" for k, v in saved["versions"].items()))
        print("\n".join(["", *table(merged, points), *targets(merged, points)]))
        return
    pg_url = os.environ.get("SIGNOFF_PG_URL")
    backends = (args.backends or ("sqlite,postgres" if pg_url else "sqlite")).split(",")
    if "postgres" in backends and not pg_url:
        raise SystemExit("the PostgreSQL rows need SIGNOFF_PG_URL: run under scripts/pg run --")
    if args.langgraph_durability:
        os.environ["BENCH_LANGGRAPH_DURABILITY"] = args.langgraph_durability  # the workers read it
    versions = _versions()
    os.environ["BENCH_LANGGRAPH_COMMITS"] = args.langgraph_commits
    versions["langgraph durability"] = args.langgraph_durability or "default (async)"
    versions["langgraph commits"] = (
        "as signoff's ordinary commits (SQLite synchronous=NORMAL, PostgreSQL "
        "synchronous_commit=off)"
        if args.langgraph_commits == "signoff"
        else "driver defaults (SQLite synchronous=FULL, PostgreSQL synchronous_commit=on)"
    )
    if pg_url and "postgres" in backends:
        versions["postgresql"] = _pg_version(pg_url)
    load = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    print(
        f"bench.compare {started}: nproc {os.cpu_count()}, load {load[0]:.1f} {load[1]:.1f} "
        f"{load[2]:.1f}; " + ", ".join(f"{k} {v}" for k, v in versions.items()),
        file=sys.stderr,
    )
    results: dict[str, Any] = {}
    tmp = Path(tempfile.mkdtemp(prefix="signoff-compare-"))
    try:
        for backend in backends:
            results[backend] = {}
            for scenario in args.scenarios.split(","):
                results[backend][scenario] = {}
                for side in SIDES:
                    if backend == "sqlite":
                        target = str(tmp / f"{side}-{scenario}.db")
                    else:
                        assert pg_url is not None
                        target = _pg_database(pg_url, f"cmp_{side}_{scenario}")
                    results[backend][scenario][side] = _run_side(
                        side, scenario, backend, target, points, args.parked
                    )
                    if backend == "sqlite":
                        for suffix in ("", "-wal", "-shm"):
                            Path(target + suffix).unlink(missing_ok=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load_end = os.getloadavg()
    lines = [
        f"bench.compare, started {started}; nproc {os.cpu_count()}; load average "
        f"{load[0]:.1f} at start, {load_end[0]:.1f} at end",
        ", ".join(f"{k} {v}" for k, v in versions.items()),
        f"time per turn and resume: medians of the {WINDOW} turns ending at the turn shown",
        "",
        *table(results, points),
        *targets(results, points),
    ]
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(
            json.dumps({"versions": versions, "load": [load, load_end], "results": results})
        )


if __name__ == "__main__":
    main()
