"""Restart proofs: a process parked on an approval, or inside an approved tool, is SIGKILLed and a
brand-new process finishes the turn from the store alone. Each runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import signoff as so

from ._procs import Child, make_agent, query, read_executions, spawn


def _events(tmp: Path, url: str, session_id: str) -> list[so.Event]:
    rt = so.Runtime([make_agent(str(tmp / "runs.jsonl"))], store=url)
    try:
        return rt.events_sync(session_id)
    finally:
        rt.close_sync()


def _assert_log_is_whole(events: list[so.Event]) -> Counter[str]:
    """Seqs run 1..n with no gap or duplicate; returns the count of each event type."""
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    return Counter(e.type for e in events)


def _lease(url: str) -> tuple[str, float]:
    """The one session's lease row, read from the store's table directly."""
    [(owner, expires_at)] = query(url, "SELECT owner, expires_at FROM {t}leases")
    return str(owner), float(expires_at)


def _start_and_kill(tmp: Path, url: str, children: list[Child]) -> tuple[str, str]:
    """Run a turn to `waiting` in a child, SIGKILL it, and return (session id, request id)."""
    starter = spawn(tmp, "start", store=url)
    children.append(starter)
    parked = starter.expect("result")
    assert parked["status"] == "waiting"
    session_id, request_id = parked["session_id"], parked["request_id"]
    assert parked["pending"] == [request_id]
    starter.sigkill()
    assert starter.proc.returncode == -signal.SIGKILL  # killed for real, no cleanup ran
    assert read_executions(tmp / "runs.jsonl") == []  # gated: nothing ran before the answer
    return session_id, request_id


def test_answer_from_a_new_process_after_sigkill_runs_the_tool_once(
    tmp_path: Path, store_url: str
) -> None:
    children: list[Child] = []
    run = partial(spawn, tmp_path, store=store_url)
    try:
        session_id, request_id = _start_and_kill(tmp_path, store_url, children)

        answerer = run("answer", "--session", session_id, "--request", request_id, "--reason", "ok")
        children.append(answerer)
        done = answerer.expect("result")
        answerer.wait()
        assert done["status"] == "completed"
        assert done["text"] == "Refunded 180.00."
        assert done["outcomes"] == [
            {"request_id": request_id, "outcome": "approved", "applied": True, "reason": None}
        ]

        runs = read_executions(tmp_path / "runs.jsonl")
        assert [r["key"] for r in runs] == [f"{session_id}:1:call_refund"]
        assert runs[0]["pid"] == answerer.pid  # the new process ran it, not the dead one

        # The same answer again from a third process is a no-op: nothing runs twice.
        again = run("answer", "--session", session_id, "--request", request_id)
        children.append(again)
        repeat = again.expect("result")
        again.wait()
        assert repeat["status"] == "completed"
        assert repeat["outcomes"] == [
            {"request_id": request_id, "outcome": "approved", "applied": False, "reason": None}
        ]
        assert len(read_executions(tmp_path / "runs.jsonl")) == 1
        requests = query(store_url, "SELECT id, status, outcome FROM {t}requests")
        assert requests == [(request_id, "settled", "approved")]

        types = _assert_log_is_whole(_events(tmp_path, store_url, session_id))
        assert types["model.completed"] == 2
        assert types["approval.settled"] == 1
        assert types["tool.started"] == 1
        assert types["tool.completed"] == 1
        assert types["turn.completed"] == 1
    finally:
        for child in children:
            child.close()


def test_crash_inside_the_approved_tool_reruns_it_with_the_same_key(
    tmp_path: Path, store_url: str
) -> None:
    children: list[Child] = []
    run = partial(spawn, tmp_path, store=store_url)
    try:
        session_id, request_id = _start_and_kill(tmp_path, store_url, children)

        # A second process approves; the tool body records its run, then hangs until killed.
        worker = run(
            "answer",
            "--session",
            session_id,
            "--request",
            request_id,
            "--via",
            "generate",
            "--block-in-tool",
        )
        children.append(worker)
        entered = worker.expect("tool-entered")
        key = f"{session_id}:1:call_refund"
        assert entered["key"] == key
        owner, _ = _lease(store_url)
        assert f":{worker.pid}:" in owner  # it holds the session's lease while in the tool
        worker.sigkill()
        killed_at = time.time()
        assert worker.proc.returncode == -signal.SIGKILL

        # A third process resumes: it must wait for the dead holder's lease to expire, then
        # run the interrupted call again (at-least-once) with the same idempotency key.
        resumer = run("resume", "--session", session_id)
        children.append(resumer)
        done = resumer.expect("result")
        resumer.wait()
        assert done["status"] == "completed"
        assert done["text"] == "Refunded 180.00."
        owner, expires_at = _lease(store_url)
        assert owner == ""  # released by the resumer
        assert expires_at == 0

        runs = read_executions(tmp_path / "runs.jsonl")
        assert [r["key"] for r in runs] == [key, key]
        assert [r["pid"] for r in runs] == [worker.pid, resumer.pid]
        assert runs[1]["at"] >= killed_at

        events = _events(tmp_path, store_url, session_id)
        types = _assert_log_is_whole(events)
        assert types["model.completed"] == 2  # no model response recorded twice
        assert types["approval.settled"] == 1
        assert types["tool.started"] == 1  # the resumed call continues the recorded start
        assert types["tool.completed"] == 1
        assert types["turn.completed"] == 1
        started = next(e for e in events if e.type == "tool.started")
        assert started.data["idempotency_key"] == key
        completed: dict[str, Any] = next(e for e in events if e.type == "tool.completed").data
        assert completed["status"] == "ok"
        assert completed["result"] == {"refunded": 180.0, "order_id": "1042"}
    finally:
        for child in children:
            child.close()


def test_resume_while_the_holder_is_alive_does_not_run_the_tool(
    tmp_path: Path, store_url: str
) -> None:
    """Control for the test above: a live lease holder is not overtaken by a resumer."""
    children: list[Child] = []
    run = partial(spawn, tmp_path, store=store_url)
    try:
        session_id, request_id = _start_and_kill(tmp_path, store_url, children)
        worker = run(
            "answer",
            "--session",
            session_id,
            "--request",
            request_id,
            "--block-in-tool",
            "--lease-ttl",
            "1.5",  # not 0.5 s: a holder descheduled ~0.35 s would lose it to `rt` here
        )
        children.append(worker)
        worker.expect("tool-entered")
        rt = so.Runtime(
            [make_agent(str(tmp_path / "runs.jsonl"))],
            store=store_url,
            lease_ttl=0.5,
            lease_wait=4.5,  # three of the holder's lease lifetimes: it keeps renewing
        )
        try:
            busy = rt.generate_sync(session_id=session_id)
        finally:
            rt.close_sync()
        assert busy.status == "running"
        assert len(read_executions(tmp_path / "runs.jsonl")) == 1
        types = _assert_log_is_whole(_events(tmp_path, store_url, session_id))
        assert types["tool.completed"] == 0
    finally:
        for child in children:
            child.close()
