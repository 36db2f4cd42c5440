"""`signoff pending` and `sessions` cut by `--limit`: the JSON on stdout keeps its shape, and a
line on stderr says how many were shown of how many, on either store."""

from __future__ import annotations

import json

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
    # a status a passed TTL may read otherwise than the store holds it: no total to trust
    waiting = invoke("sessions", "--store", store_url, "--status", "waiting", "--limit", "1")
    assert waiting.stderr == "showing 1, and more match: pass a higher --limit to see more\n"
    assert "Sessions (1 of more)" in waiting.stdout
