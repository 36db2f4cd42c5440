"""The store failing a write (a full disk): the caller gets a `StoreError`, nothing is half
written, and once the store takes writes again the turn finishes as it would have, each
approved tool having run once."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import psycopg
import pytest

import signoff as so

from ._procs import ROOT, read_executions


def _events(url: str, session_id: str) -> list[so.Event]:
    rt = so.Runtime([], store=url)
    try:
        return rt.events_sync(session_id)
    finally:
        rt.close_sync()


def test_a_disk_full_when_a_tool_ends_keeps_its_result_and_does_not_run_it_again(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    records = tmp_path / "runs.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "tests._full_child", url, str(records)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    failed, result = (json.loads(line) for line in done.stdout.splitlines())
    # The commit of the tool's result failed as on a full disk: a named store error.
    assert failed["type"] == "StoreError", failed
    assert "full" in failed["message"] or "I/O" in failed["message"], failed
    # Space again: the turn ends as an uninterrupted one would, the tool having run once.
    assert result["status"] == "completed" and result["text"] == "Report sent.", result
    runs = read_executions(records)
    assert [r["key"] for r in runs] == [f"{result['session_id']}:1:call_1"], runs
    events = _events(url, result["session_id"])
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    types = Counter(e.type for e in events)
    assert types["tool.completed"] == 1 and types["turn.completed"] == 1, types


FAIL_INSERTS = """
CREATE FUNCTION signoff.disk_full() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'could not extend file: No space left on device' USING ERRCODE = '53100';
END $$;
CREATE TRIGGER disk_full BEFORE INSERT ON signoff.events
FOR EACH ROW EXECUTE FUNCTION signoff.disk_full();
"""


async def test_a_failed_postgres_commit_of_a_tool_result_does_not_run_the_tool_again(
    pg_store_url: str,
) -> None:
    admin = pg_store_url.split("?")[0]
    runs: list[str] = []

    @so.tool(approval=so.always())
    async def ship(ctx: so.ToolContext, order_id: str) -> str:
        """Ship an order: a side effect."""
        runs.append(ctx.idempotency_key())
        if len(runs) == 1:  # the database refuses every insert from now on
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(FAIL_INSERTS)
        return f"shipped {order_id}"

    model = so.models.Scripted(
        [
            so.ModelResponse(tool_calls=[so.ToolCall(name="ship", input={"order_id": "7"})]),
            so.ModelResponse(text="Shipped."),
        ]
    )
    agent = so.Agent(name="support", model=model, tools=[ship])
    async with so.Runtime([agent], store=pg_store_url) as rt:
        r = await rt.generate("support", prompt="ship order 7")
        answer = [so.InputResponse(request_id=r.pending[0].id, option_id="approve")]
        with pytest.raises(so.StoreError, match="No space left"):
            await rt.respond(r.session_id, answer)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("DROP TRIGGER disk_full ON signoff.events")
        done = await rt.respond(r.session_id, answer)
        assert (done.status, done.text) == ("completed", "Shipped.")
        assert len(runs) == 1
        events = [e async for e in rt.events(r.session_id, follow=False)]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert Counter(e.type for e in events)["tool.completed"] == 1
