"""The two sides of `bench.compare`, signoff and LangGraph, on the same workload: one
conversation approved turn by turn, and many sessions parked on an approval, with the store's
bytes and the process's memory measured. `worker` runs one side in its own subprocess.
"""

import argparse
import json
import os
import sqlite3
import statistics
import time
from typing import Any

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

__all__ = ["SIDES", "worker"]

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
    """`pg_total_relation_size` (heap, indexes, TOAST) of every table in `schema`, and apart
    (`relations`) each table's own (`pg_table_size`: heap, TOAST, free space and visibility
    maps) and each index's."""
    import psycopg  # type: ignore[import-not-found,unused-ignore]

    with psycopg.connect(url, autocommit=True) as con:
        rows = con.execute(
            "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind = 'r' AND n.nspname = %s",
            (schema,),
        ).fetchall()
        parts = con.execute(
            "SELECT c.relname, CASE WHEN c.relkind = 'r' THEN pg_table_size(c.oid) "
            "ELSE pg_relation_size(c.oid) END FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind IN ('r', 'i') AND n.nspname = %s",
            (schema,),
        ).fetchall()
    tables = {str(name): int(size) for name, size in rows}
    total = sum(tables.values())
    relations = {str(name): int(size) for name, size in parts}
    return {"files": total, "live": total, "tables": tables, "relations": relations}


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
        "relations": stored.get("relations", {}),
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
        "relations": stored.get("relations", {}),
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


def worker(args: argparse.Namespace) -> None:
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
