"""signoff against LangGraph on one human-in-the-loop workload, SQLite and PostgreSQL.

Run it with `scripts/bench-compare` (it builds `.venv-bench` with LangGraph beside signoff and
starts a throwaway PostgreSQL). Every side runs in its own subprocess; the parent prints ratios.
"""

import argparse
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from bench.compare_workload import (
    WINDOW,
    answer_text,
    current_rss_kb,
    json_bytes,
    peak_rss_kb,
    refund_input,
    refund_result,
    turn_content_bytes,
    user_text,
)

__all__ = ["main"]

SIDES = ("signoff", "langgraph")


# -- storage measurement -------------------------------------------------------------------------


def sqlite_bytes(path: str) -> dict[str, Any]:
    """File bytes (database plus WAL), live pages, and bytes per table from `dbstat`."""
    files = sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        page = con.execute("PRAGMA page_size").fetchone()[0]
        pages = con.execute("PRAGMA page_count").fetchone()[0]
        free = con.execute("PRAGMA freelist_count").fetchone()[0]
        tables: dict[str, int] = {}
        try:
            for name, size in con.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name"):
                tables[name] = int(size)
        except sqlite3.OperationalError:
            pass
    finally:
        con.close()
    return {"files": files, "live": (pages - free) * page, "tables": tables}


def pg_bytes(url: str, schema: str) -> dict[str, Any]:
    """`pg_total_relation_size` (heap, indexes, TOAST) of every table in `schema`."""
    import psycopg  # type: ignore[import-not-found,unused-ignore]

    with psycopg.connect(url, autocommit=True) as con:
        rows = con.execute(
            "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind = 'r' AND n.nspname = %s",
            (schema,),
        ).fetchall()
    tables = {str(name): int(size) for name, size in rows}
    total = sum(tables.values())
    return {"files": total, "live": total, "tables": tables}


def store_bytes(backend: str, target: str, side: str) -> dict[str, Any]:
    if backend == "sqlite":
        return sqlite_bytes(target)
    return pg_bytes(target, "signoff" if side == "signoff" else "public")


# -- the signoff side ----------------------------------------------------------------------------


class _Marks:
    """Tool body entry times and the turn the scripted models are on (shared by both sides)."""

    turn = 0
    started: list[float] = []
    started_cpu: list[float] = []


def _signoff_runtime(backend: str, target: str) -> Any:
    import signoff as so

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str, amount: float, reason: str) -> dict[str, Any]:
        """Refund an order."""
        _Marks.started.append(time.perf_counter())
        _Marks.started_cpu.append(time.process_time())
        return refund_result(_Marks.turn)

    def step(messages: list[Any]) -> Any:
        turn = _Marks.turn
        if messages and messages[-1].kind == "tool":
            return so.ModelResponse(text=answer_text(turn))
        call = so.ToolCall(name="issue_refund", input=refund_input(turn), id=f"call_{turn}")
        return so.ModelResponse(tool_calls=[call])

    agent = so.Agent(
        name="support", model=so.models.Scripted([step], repeat_last=True), tools=[issue_refund]
    )
    store = f"sqlite:///{target}" if backend == "sqlite" else target
    return so.Runtime([agent], store=store)


async def _signoff_conversation(backend: str, target: str, points: list[int]) -> dict[str, Any]:
    import signoff as so

    rt = _signoff_runtime(backend, target)
    await rt.open()
    empty = store_bytes(backend, target, "signoff")["live"]
    session_id: str | None = None
    turns: list[dict[str, float]] = []
    at: dict[str, Any] = {}
    for turn in range(1, max(points) + 1):
        _Marks.turn = turn
        c0 = time.process_time()
        t0 = time.perf_counter()
        if session_id is None:
            r = await rt.generate("support", prompt=user_text(turn))
            session_id = r.session_id
        else:
            r = await rt.generate(prompt=user_text(turn), session_id=session_id)
        if r.status != "waiting" or len(r.pending) != 1:
            raise RuntimeError(f"signoff turn {turn}: expected one pending approval, got {r!r}")
        c1 = time.process_time()
        t1 = time.perf_counter()
        r = await rt.generate(
            session_id=session_id,
            approvals=[so.Decision(id=r.pending[0].id, approved=True, reason="ok")],
        )
        t2 = time.perf_counter()
        c2 = time.process_time()
        if r.status != "completed" or r.text != answer_text(turn):
            raise RuntimeError(f"signoff turn {turn}: the turn did not complete: {r!r}")
        turns.append(_timings(t0, t1, t2, c0, c1, c2))
        if turn in points:
            at[str(turn)] = _point(turns, turn, backend, target, "signoff", empty)
    if len(_Marks.started) != max(points):
        raise RuntimeError(f"signoff ran the tool {len(_Marks.started)} times")
    await rt.close()
    return at


async def _signoff_parked(backend: str, target: str, n: int) -> dict[str, Any]:
    rt = _signoff_runtime(backend, target)
    await rt.open()
    empty = store_bytes(backend, target, "signoff")
    rss_before = current_rss_kb()
    t0 = time.perf_counter()
    for i in range(n):
        _Marks.turn = i + 1
        r = await rt.generate("support", prompt=user_text(i + 1))
        if r.status != "waiting":
            raise RuntimeError(f"signoff session {i}: not waiting: {r!r}")
    park = time.perf_counter() - t0
    rss_after = current_rss_kb()
    stored = store_bytes(backend, target, "signoff")
    t0 = time.perf_counter()
    pending = await rt.pending(limit=n + 1)
    listing = time.perf_counter() - t0
    if len(pending) != n:
        raise RuntimeError(f"signoff lists {len(pending)} pending requests, not {n}")
    await rt.close()
    return _parked_result(n, empty, stored, rss_before, rss_after, park, listing)


# -- the LangGraph side --------------------------------------------------------------------------


def _langgraph_graph(checkpointer: Any) -> Any:
    from typing import Annotated, TypedDict

    from langchain_core.messages import (  # type: ignore[import-not-found,unused-ignore]
        AIMessage,
        AnyMessage,
        ToolMessage,
    )
    from langchain_core.tools import tool  # type: ignore[import-not-found,unused-ignore]
    from langgraph.graph import END, START, StateGraph  # type: ignore[import-not-found,unused-ignore]
    from langgraph.graph.message import add_messages  # type: ignore[import-not-found,unused-ignore]
    from langgraph.prebuilt import ToolNode  # type: ignore[import-not-found,unused-ignore]
    from langgraph.types import Command, interrupt  # type: ignore[import-not-found,unused-ignore]

    # No `from __future__ import annotations` in this module: LangGraph reads these hints.
    State = TypedDict("State", {"messages": Annotated[list[AnyMessage], add_messages]})  # noqa: UP013

    @tool  # type: ignore[untyped-decorator,unused-ignore]
    def issue_refund(order_id: str, amount: float, reason: str) -> dict[str, Any]:
        """Refund an order."""
        _Marks.started.append(time.perf_counter())
        _Marks.started_cpu.append(time.process_time())
        return refund_result(_Marks.turn)

    def agent(state: State) -> dict[str, Any]:
        # A scripted chat model: a tool call after the user's message, an answer after the tool's.
        turn = _Marks.turn
        if isinstance(state["messages"][-1], ToolMessage):
            return {"messages": [AIMessage(content=answer_text(turn))]}
        call = {"name": "issue_refund", "args": refund_input(turn), "id": f"call_{turn}"}
        return {"messages": [AIMessage(content="", tool_calls=[call])]}

    def route(state: State) -> str:
        last = state["messages"][-1]
        return "review" if getattr(last, "tool_calls", None) else END

    def review(state: State) -> Any:
        # The human-in-the-loop pattern of LangGraph's documentation: interrupt, resume by Command.
        call = state["messages"][-1].tool_calls[0]
        decision = interrupt({"action": call["name"], "args": call["args"], "id": call["id"]})
        if decision.get("approved"):
            return Command(goto="tools")
        denied = ToolMessage(content="denied", tool_call_id=call["id"], name=call["name"])
        return Command(goto="agent", update={"messages": [denied]})

    builder = StateGraph(State)
    builder.add_node("agent", agent)
    builder.add_node("review", review, destinations=("tools", "agent"))
    builder.add_node("tools", ToolNode([issue_refund]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["review", END])
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=checkpointer)


class _Saver:
    """LangGraph's checkpointer for the backend: `SqliteSaver` or `PostgresSaver`, committing
    as signoff's ordinary commits do unless BENCH_LANGGRAPH_COMMITS is "default"."""

    def __init__(self, backend: str, target: str) -> None:
        self.backend = backend
        as_signoff = os.environ.get("BENCH_LANGGRAPH_COMMITS", "signoff") == "signoff"
        if backend == "sqlite":
            from langgraph.checkpoint.sqlite import (  # type: ignore[import-not-found,unused-ignore]
                SqliteSaver,
            )

            self.conn: Any = sqlite3.connect(target, check_same_thread=False)
            if as_signoff:  # sqlite3's default is FULL: an fsync at every checkpoint write
                self.conn.execute("PRAGMA synchronous=NORMAL")
            self.saver: Any = SqliteSaver(self.conn)
        else:
            from langgraph.checkpoint.postgres import (  # type: ignore[import-not-found,unused-ignore]
                PostgresSaver,
            )

            self._cm = PostgresSaver.from_conn_string(target)
            self.saver = self._cm.__enter__()
            if as_signoff:  # autocommit connection: the setting holds for the session
                self.saver.conn.execute("SET synchronous_commit = off")
        self.saver.setup()

    def close(self) -> None:
        if self.backend == "sqlite":
            self.conn.close()
        else:
            self._cm.__exit__(None, None, None)


def _langgraph_conversation(backend: str, target: str, points: list[int]) -> dict[str, Any]:
    from langchain_core.messages import HumanMessage  # type: ignore[import-not-found,unused-ignore]
    from langgraph.types import Command  # type: ignore[import-not-found,unused-ignore]

    saver = _Saver(backend, target)
    graph = _langgraph_graph(saver.saver)
    empty = store_bytes(backend, target, "langgraph")["live"]
    config = {"configurable": {"thread_id": "conversation"}}
    durability = os.environ.get("BENCH_LANGGRAPH_DURABILITY") or None
    turns: list[dict[str, float]] = []
    at: dict[str, Any] = {}
    for turn in range(1, max(points) + 1):
        _Marks.turn = turn
        c0 = time.process_time()
        t0 = time.perf_counter()
        out = graph.invoke(
            {"messages": [HumanMessage(content=user_text(turn))]}, config, durability=durability
        )
        if len(out.get("__interrupt__", ())) != 1:
            raise RuntimeError(f"langgraph turn {turn}: expected one interrupt, got {out!r}")
        c1 = time.process_time()
        t1 = time.perf_counter()
        out = graph.invoke(
            Command(resume={"approved": True, "reason": "ok"}), config, durability=durability
        )
        t2 = time.perf_counter()
        c2 = time.process_time()
        if out.get("__interrupt__") or out["messages"][-1].content != answer_text(turn):
            raise RuntimeError(f"langgraph turn {turn}: the turn did not complete")
        turns.append(_timings(t0, t1, t2, c0, c1, c2))
        if turn in points:
            at[str(turn)] = _point(turns, turn, backend, target, "langgraph", empty)
    if len(_Marks.started) != max(points):
        raise RuntimeError(f"langgraph ran the tool {len(_Marks.started)} times")
    saver.close()
    return at


def _langgraph_pending(saver: Any) -> list[tuple[str, Any]]:
    """Threads whose latest checkpoint carries an interrupt, read through the checkpointer."""
    seen: set[str] = set()
    out: list[tuple[str, Any]] = []
    for item in saver.list(None):
        thread = item.config["configurable"]["thread_id"]
        if thread in seen:
            continue
        seen.add(thread)  # list() is newest first: the first checkpoint seen is the latest
        for _task, channel, value in item.pending_writes or ():
            if channel == "__interrupt__":
                out.append((thread, value))
                break
    return out


def _langgraph_parked(backend: str, target: str, n: int) -> dict[str, Any]:
    from langchain_core.messages import HumanMessage  # type: ignore[import-not-found,unused-ignore]

    saver = _Saver(backend, target)
    graph = _langgraph_graph(saver.saver)
    empty = store_bytes(backend, target, "langgraph")
    durability = os.environ.get("BENCH_LANGGRAPH_DURABILITY") or None
    rss_before = current_rss_kb()
    t0 = time.perf_counter()
    for i in range(n):
        _Marks.turn = i + 1
        config = {"configurable": {"thread_id": f"thread-{i}"}}
        out = graph.invoke(
            {"messages": [HumanMessage(content=user_text(i + 1))]}, config, durability=durability
        )
        if len(out.get("__interrupt__", ())) != 1:
            raise RuntimeError(f"langgraph thread {i}: not interrupted")
    park = time.perf_counter() - t0
    rss_after = current_rss_kb()
    stored = store_bytes(backend, target, "langgraph")
    t0 = time.perf_counter()
    pending = _langgraph_pending(saver.saver)
    listing = time.perf_counter() - t0
    if len(pending) != n:
        raise RuntimeError(f"langgraph lists {len(pending)} interrupted threads, not {n}")
    saver.close()
    return _parked_result(n, empty, stored, rss_before, rss_after, park, listing)


# -- shared measurement helpers ------------------------------------------------------------------


def _timings(t0: float, t1: float, t2: float, c0: float, c1: float, c2: float) -> dict[str, float]:
    """Wall and process CPU time of a turn, and from the resume call to the tool body."""
    return {
        "turn": t2 - t0,
        "resume": _Marks.started[-1] - t1,
        "turn_cpu": c2 - c0,
        "resume_cpu": _Marks.started_cpu[-1] - c1,
    }


def _point(
    turns: list[dict[str, float]], turn: int, backend: str, target: str, side: str, empty: int
) -> dict[str, Any]:
    window = turns[-WINDOW:]
    stored = store_bytes(backend, target, side)
    return {
        "turn_ms": statistics.median(t["turn"] for t in window) * 1e3,
        "resume_ms": statistics.median(t["resume"] for t in window) * 1e3,
        "turn_cpu_ms": statistics.median(t["turn_cpu"] for t in window) * 1e3,
        "resume_cpu_ms": statistics.median(t["resume_cpu"] for t in window) * 1e3,
        "bytes": stored["files"],
        "live_bytes": stored["live"],
        "empty_bytes": empty,
        "tables": stored["tables"],
        "content_bytes": sum(turn_content_bytes(t) for t in range(1, turn + 1)),
        "peak_rss_kb": peak_rss_kb(),
    }


def _parked_result(
    n: int,
    empty: dict[str, Any],
    stored: dict[str, Any],
    rss_before: int,
    rss_after: int,
    park: float,
    listing: float,
) -> dict[str, Any]:
    return {
        "sessions": n,
        "bytes": stored["files"],
        "bytes_per_session": (stored["files"] - empty["files"]) / n,
        "live_bytes_per_session": (stored["live"] - empty["live"]) / n,
        "tables": stored["tables"],
        "content_bytes_per_session": (
            sum(len(user_text(i + 1).encode()) for i in range(n))
            + sum(json_bytes(refund_input(i + 1)) for i in range(n))
        )
        / n,
        "rss_before_kb": rss_before,
        "rss_after_kb": rss_after,
        "peak_rss_kb": peak_rss_kb(),
        "park_s": park,
        "list_ms": listing * 1e3,
    }


def _worker(args: argparse.Namespace) -> None:
    import asyncio

    points = [int(p) for p in args.points.split(",")]
    result: dict[str, Any]
    if args.side == "signoff":
        if args.scenario == "conversation":
            result = asyncio.run(_signoff_conversation(args.backend, args.target, points))
        else:
            result = asyncio.run(_signoff_parked(args.backend, args.target, args.parked))
    elif args.scenario == "conversation":
        result = _langgraph_conversation(args.backend, args.target, points)
    else:
        result = _langgraph_parked(args.backend, args.target, args.parked)
    print("RESULT " + json.dumps(result), flush=True)


# -- the parent: targets, subprocesses, table ----------------------------------------------------


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


def _ratio(a: float, b: float) -> str:
    return f"{b / a:8.1f}x" if a > 0 else "       -"


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def _cells(a: float, b: float, fmt: str) -> str:
    return f"{_human(a):>12}{_human(b):>12}" if fmt == "h" else fmt.format(a) + fmt.format(b)


def _conversation_table(backend: str, conv: dict[str, Any], points: list[int]) -> list[str]:
    lines = [f"== {backend}: one conversation, approve every turn ==", _HEAD]
    for p in points:
        s, g = conv["signoff"][str(p)], conv["langgraph"][str(p)]
        lines.append(f"turn {p}: raw message content {_human(s['content_bytes'])}")
        rows = [
            ("  time per turn (ms)", "turn_ms", 1.0, "{:12.2f}"),
            ("  resume -> tool body starts (ms)", "resume_ms", 1.0, "{:12.2f}"),
            ("  time per turn, CPU (ms)", "turn_cpu_ms", 1.0, "{:12.2f}"),
            ("  resume -> tool body, CPU (ms)", "resume_cpu_ms", 1.0, "{:12.2f}"),
            ("  bytes stored (files incl. WAL / relations)", "bytes", 1.0, "h"),
            ("  bytes in live pages (SQLite: without WAL)", "live_bytes", 1.0, "h"),
            ("  peak RSS (MB)", "peak_rss_kb", 1 / 1024, "{:12.1f}"),
        ]
        for label, key, scale, fmt in rows:
            if key in s and key in g:
                a, b = s[key] * scale, g[key] * scale
                lines.append(f"{label:44}{_cells(a, b, fmt)}{_ratio(a, b)}")
        a, b = s["bytes"] / s["content_bytes"], g["bytes"] / g["content_bytes"]
        lines.append(f"{'  bytes stored / raw content':44}{_cells(a, b, '{:12.2f}')}{_ratio(a, b)}")
        if "empty_bytes" in s and "empty_bytes" in g:
            a, b = _growth(s), _growth(g)
            label = "  live bytes over the empty store / raw"
            lines.append(f"{label:44}{_cells(a, b, '{:12.2f}')}{_ratio(a, b)}")
    lines.append("")
    return lines


def _growth(point: dict[str, Any]) -> float:
    """Live bytes the conversation added to the store (its empty tables and indexes left out),
    per raw byte."""
    return float(point["live_bytes"] - point["empty_bytes"]) / float(point["content_bytes"])


def _parked_table(backend: str, park: dict[str, Any]) -> list[str]:
    s, g = park["signoff"], park["langgraph"]
    lines = [f"== {backend}: {s['sessions']:,} sessions parked on an approval ==", _HEAD]
    lines.append(f"raw content per session {_human(s['content_bytes_per_session'])}")
    rows = [
        ("  bytes per parked session", s["bytes_per_session"], g["bytes_per_session"], "h"),
        ("  process RSS before (MB)", s["rss_before_kb"] / 1024, g["rss_before_kb"] / 1024,
         "{:12.1f}"),
        ("  process RSS after (MB)", s["rss_after_kb"] / 1024, g["rss_after_kb"] / 1024,
         "{:12.1f}"),
        ("  time to park one session (ms)", s["park_s"] * 1e3 / s["sessions"],
         g["park_s"] * 1e3 / g["sessions"], "{:12.2f}"),
        ("  time to list the pending queue (ms)", s["list_ms"], g["list_ms"], "{:12.1f}"),
    ]  # fmt: skip
    if "live_bytes_per_session" in s and "live_bytes_per_session" in g:
        # Without the WAL: signoff truncates its WAL when a turn parks, LangGraph's SQLite keeps
        # a WAL file of up to about 4 MB, which the row above counts.
        live = ("  live bytes per parked session", s["live_bytes_per_session"],
                g["live_bytes_per_session"], "h")  # fmt: skip
        rows.insert(1, live)
    for label, a, b, fmt in rows:
        lines.append(f"{label:44}{_cells(a, b, fmt)}{_ratio(a, b)}")
    lines.append("")
    return lines


_HEAD = f"{'':44}{'signoff':>12}{'LangGraph':>12}{'LG/signoff':>11}"


def _table(results: dict[str, Any], points: list[int]) -> list[str]:
    lines: list[str] = []
    for backend, res in results.items():
        if "conversation" in res:
            lines += _conversation_table(backend, res["conversation"], points)
        if "parked" in res:
            lines += _parked_table(backend, res["parked"])
    return lines


def _targets(results: dict[str, Any], points: list[int]) -> list[str]:
    lines = ["== signoff against the targets of issue 8 =="]
    first, last = str(points[0]), str(points[-1])
    for backend, res in results.items():
        behind = []
        if "conversation" in res:
            s, g = res["conversation"]["signoff"], res["conversation"]["langgraph"]
            for key, name in (
                ("turn_ms", "time per turn"),
                ("resume_ms", "resume latency"),
                ("turn_cpu_ms", "time per turn, CPU"),
                ("resume_cpu_ms", "resume latency, CPU"),
            ):
                if key not in s[first]:
                    continue
                r = s[last][key] / s[first][key]
                ok = "met" if r <= 1.5 else "MISSED"
                lines.append(
                    f"{backend}: {name} flat (turn {last} within 1.5x of turn {first}): "
                    f"{r:.2f}x  {ok}"
                )
            ratios = {p: s[p]["bytes"] / s[p]["content_bytes"] for p in map(str, points)}
            worst = max(ratios.values())
            ok = "met" if worst <= 2 else "MISSED"
            within = [p for p, r in ratios.items() if r <= 2]
            lines.append(
                f"{backend}: storage within 2x of raw content at every point: "
                f"worst {worst:.2f}x  {ok}"
                + (f" (met at turn {', '.join(within)})" if within and worst > 2 else "")
            )
            if all("empty_bytes" in s[p] for p in map(str, points)):
                lines.append(
                    f"{backend}:   (live bytes over the empty store's: "
                    + ", ".join(f"{_growth(s[p]):.2f}x" for p in map(str, points))
                    + ")"
                )
            live = [s[p]["live_bytes"] / s[p]["content_bytes"] for p in map(str, points)]
            lines.append(
                f"{backend}:   (live pages only, without WAL and free pages: "
                + ", ".join(f"{x:.2f}x" for x in live)
                + ")"
            )
            for p in map(str, points):
                for key in ("turn_ms", "resume_ms", "turn_cpu_ms", "resume_cpu_ms", "bytes"):
                    if key in s[p] and key in g[p] and s[p][key] >= g[p][key]:
                        behind.append(f"turn {p} {key}")
                if s[p]["peak_rss_kb"] >= g[p]["peak_rss_kb"]:
                    behind.append(f"turn {p} peak_rss_kb")
        if "parked" in res:
            ps, pg_ = res["parked"]["signoff"], res["parked"]["langgraph"]
            for key in ("bytes_per_session", "rss_after_kb", "list_ms", "park_s"):
                if ps[key] >= pg_[key]:
                    behind.append(f"parked {key}")
        lines.append(
            f"{backend}: ahead of LangGraph on every row: "
            + ("met" if not behind else "MISSED on " + ", ".join(behind))
        )
    return lines


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
        _worker(args)
        return
    points = sorted(int(p) for p in args.points.split(","))
    if args.render:
        merged: dict[str, Any] = {}
        for path in args.render:
            saved = json.loads(Path(path).read_text())
            merged.update(saved["results"])
            print(", ".join(f"{k} {v}" for k, v in saved["versions"].items()))
        print("\n".join(["", *_table(merged, points), *_targets(merged, points)]))
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
        *_table(results, points),
        *_targets(results, points),
    ]
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(
            json.dumps({"versions": versions, "load": [load, load_end], "results": results})
        )


if __name__ == "__main__":
    main()
