"""`signoff pending` and `sessions` cut by `--limit`: the JSON on stdout keeps its shape, and a
line on stderr says how many were shown of how many, on either store."""

from __future__ import annotations

import json
import time

import pytest

import signoff as so

from . import _cli as cli
from ._cli import invoke, park

NOTE = "showing {} of {}: pass a higher --limit to see more\n"


def test_pending_says_on_stderr_that_the_limit_cut_the_list(store_url: str) -> None:
    ids = [park(store_url)[1] for _ in range(3)]
    cut = invoke("pending", "--store", store_url, "--limit", "2", "--json")
    assert cut.exit_code == 0, cut.output
    assert [r["id"] for r in json.loads(cut.stdout)] == ids[:2]
    assert cut.stderr == NOTE.format(2, 3)
    table = invoke("pending", "--store", store_url, "--limit", "2")
    assert "Pending requests (2 of 3)" in table.stdout
    assert table.stderr == NOTE.format(2, 3)
    whole = invoke("pending", "--store", store_url, "--limit", "3", "--json")
    assert len(json.loads(whole.stdout)) == 3 and whole.stderr == ""


def test_sessions_says_that_the_limit_cut_the_list(store_url: str) -> None:
    sessions = [park(store_url)[0] for _ in range(3)]
    cut = invoke("sessions", "--store", store_url, "--limit", "2", "--json")
    assert cut.exit_code == 0, cut.output
    rows = json.loads(cut.stdout)
    assert len(rows) == 2 and {r["id"] for r in rows} < set(sessions)
    assert cut.stderr == NOTE.format(2, 3)
    table = invoke("sessions", "--store", store_url, "--limit", "2")
    assert table.exit_code == 0, table.output
    assert "Sessions (2 of 3)" in table.stdout
    assert table.stderr == NOTE.format(2, 3)
    for args in (["--limit", "3", "--json"], ["--limit", "3"], ["--status", "waiting"]):
        whole = invoke("sessions", "--store", store_url, *args)
        assert whole.exit_code == 0 and whole.stderr == "", whole.output
    assert "Sessions (3)" in invoke("sessions", "--store", store_url).stdout
    waiting = invoke("sessions", "--store", store_url, "--status", "waiting", "--limit", "1")
    assert waiting.stderr == NOTE.format(1, 3)
    assert "Sessions (1 of 3)" in waiting.stdout


def _park_lapsed(url: str, agent: str) -> str:
    """A session waiting on an approval whose TTL passed an hour ago, nothing recorded since."""
    support = so.Agent(
        name=agent,
        model=cli.agent.model,
        tools=[cli.issue_refund],
        limits=so.Limits(ttl=60),
    )
    rt = so.Runtime([support], store=url, clock=lambda: time.time() - 3600)
    try:
        r = rt.generate_sync(agent, "Refund order 1042")
        assert r.status == "waiting"
        return r.session_id
    finally:
        rt.close_sync()


@pytest.mark.parametrize("status", ["waiting", "failed"])
def test_sessions_by_a_status_a_passed_ttl_changes_says_its_exact_total(
    store_url: str, status: str
) -> None:
    """`--status waiting` (or running, failed) cut by `--limit` said "1 of more": a session
    whose TTL passed unrecorded is still waiting in the store but listed `failed`, so the
    store's count was no total. It is counted as listed now: the store's count, corrected by
    the sessions whose TTL passed (read from the store's range of them)."""
    for _ in range(2):
        park(store_url)
    lapsed = {_park_lapsed(store_url, "support") for _ in range(2)}
    lapsed.add(_park_lapsed(store_url, "other"))
    whole = invoke("sessions", "--store", store_url, "--status", status, "--json")
    listed = {r["id"] for r in json.loads(whole.stdout)}
    assert len(listed) == (3 if status == "failed" else 2) and (listed == lapsed) == (
        status == "failed"
    )
    cut = invoke("sessions", "--store", store_url, "--status", status, "--limit", "1")
    assert cut.exit_code == 0, cut.output
    assert cut.stderr == NOTE.format(1, len(listed))
    assert f"Sessions (1 of {len(listed)})" in cut.stdout
    mine = invoke(
        "sessions", "--store", store_url, "--status", status, "--agent", "support", "--limit", "1"
    )
    assert mine.stderr == NOTE.format(1, 2), mine.output
