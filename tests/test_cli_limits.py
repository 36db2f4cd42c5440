"""`signoff pending` and `sessions` cut by `--limit`: the JSON on stdout keeps its shape, and a
line on stderr says how many were shown of how many, on either store."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import signoff as so

from . import _cli as cli
from ._cli import invoke, park, refused_usage

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


def _park_as(url: str, name: str) -> tuple[str, str]:
    """`park` as an agent of another name: a turn to `waiting`, its (session id, request id)."""
    other = so.Agent(name=name, model=cli.agent.model, tools=[cli.issue_refund])
    rt = so.Runtime([other], store=url)
    try:
        r = rt.generate_sync(name, "Refund order 1042")
        assert r.status == "waiting"
        return r.session_id, r.pending[0].id
    finally:
        rt.close_sync()


def _pages(command: str, url: str, *args: str, limit: int = 2) -> tuple[list[str], list[str]]:
    """The ids `command --json` lists page after page by `--offset`, until one past the end,
    and the stderr line of each page."""
    ids: list[str] = []
    said: list[str] = []
    for offset in range(0, 100, limit):
        page = invoke(
            command, "--store", url, *args, "--limit", str(limit), "--offset", str(offset), "--json"
        )
        assert page.exit_code == 0, page.output
        rows = [r["id"] for r in json.loads(page.stdout)]
        ids += rows
        said.append(page.stderr)
        if not rows:
            return ids, said
    raise AssertionError("no page past the end")


def test_pending_offset_pages_through_every_request_once_oldest_first(store_url: str) -> None:
    """`--offset` shows the next page of the queue, in its order (oldest first): paging by
    `--limit` reaches every request exactly once, with a filter too, and stderr says which
    were shown of how many, and then that the offset is past the end (exit 0, as the API's
    page past the end is an empty page with the total)."""
    parked = [park(store_url) if i % 2 == 0 else _park_as(store_url, "billing") for i in range(5)]
    ids = [request_id for _, request_id in parked]
    listed, said = _pages("pending", store_url)
    assert listed == ids
    assert said == [
        NOTE.format(2, 5),
        "showing 3-4 of 5: pass --offset 4 to see more\n",
        "showing 5-5 of 5\n",
        "showing none of 5: --offset 6 is past the end\n",
    ]
    support, said = _pages("pending", store_url, "--agent", "support")
    assert support == ids[0::2]
    assert said[1:] == ["showing 3-3 of 3\n", "showing none of 3: --offset 4 is past the end\n"]
    assert _pages("pending", store_url, "--agent", "billing", limit=1)[0] == ids[1::2]
    table = invoke("pending", "--store", store_url, "--limit", "2", "--offset", "2")
    assert table.exit_code == 0, table.output
    assert "Pending requests (3-4 of 5)" in table.stdout
    assert ids[2] in table.stdout and ids[3] in table.stdout
    assert ids[1] not in table.stdout and ids[4] not in table.stdout
    assert table.stderr == "showing 3-4 of 5: pass --offset 4 to see more\n"
    for offset in ("5", "9223372036854775807"):  # the end, and the largest offset taken
        past = invoke("pending", "--store", store_url, "--offset", offset)
        assert past.exit_code == 0, past.output
        assert past.stdout == "No pending requests past the first 5.\n"
        assert past.stderr == f"showing none of 5: --offset {offset} is past the end\n"
    whole = invoke("pending", "--store", store_url, "--offset", "0", "--json")
    assert len(json.loads(whole.stdout)) == 5 and whole.stderr == ""


def test_sessions_offset_pages_through_every_session_once_most_recent_first(
    store_url: str,
) -> None:
    """`--offset` shows the next page of the sessions, in their order (most recently active
    first): paging by `--limit` reaches every one exactly once, with a filter too."""
    parked = [park(store_url) if i % 2 == 0 else _park_as(store_url, "billing") for i in range(5)]
    ordered = [
        r["id"] for r in json.loads(invoke("sessions", "--store", store_url, "--json").stdout)
    ]
    assert sorted(ordered) == sorted(s for s, _ in parked)
    listed, said = _pages("sessions", store_url)
    assert listed == ordered
    assert said == [
        NOTE.format(2, 5),
        "showing 3-4 of 5: pass --offset 4 to see more\n",
        "showing 5-5 of 5\n",
        "showing none of 5: --offset 6 is past the end\n",
    ]
    billing = {s for i, (s, _) in enumerate(parked) if i % 2}
    mine, said = _pages("sessions", store_url, "--agent", "billing", limit=1)
    assert mine == [s for s in ordered if s in billing] and len(mine) == 2
    assert said == [
        NOTE.format(1, 2),
        "showing 2-2 of 2\n",
        "showing none of 2: --offset 2 is past the end\n",
    ]
    waiting, _ = _pages("sessions", store_url, "--status", "waiting", limit=3)
    assert waiting == ordered
    table = invoke("sessions", "--store", store_url, "--limit", "2", "--offset", "3")
    assert table.exit_code == 0, table.output
    assert "Sessions (4-5 of 5)" in table.stdout
    assert table.stderr == "showing 4-5 of 5\n"
    for offset in ("5", "9223372036854775807"):
        past = invoke("sessions", "--store", store_url, "--offset", offset)
        assert past.exit_code == 0, past.output
        assert past.stdout == "No sessions past the first 5.\n"
        assert past.stderr == f"showing none of 5: --offset {offset} is past the end\n"


@pytest.mark.parametrize("command", ["pending", "sessions"])
def test_an_offset_past_the_end_of_nothing_says_so(command: str, store_url: str) -> None:
    park(store_url)  # the store exists, and holds one
    past = invoke(command, "--store", store_url, "--agent", "billing", "--offset", "3", "--json")
    assert past.exit_code == 0, past.output
    assert json.loads(past.stdout) == []
    assert past.stderr == "showing none of 0: --offset 3 is past the end\n"


@pytest.mark.parametrize("command", ["pending", "sessions"])
@pytest.mark.parametrize("value", ["-1", "abc", "1.5", "", "9223372036854775808", "9" * 30])
def test_a_bad_offset_is_refused_as_a_bad_limit_is(
    command: str, value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A negative, non-whole or huge `--offset` (past what a store takes) is a usage error
    naming the option and its range, before any store is opened or made."""
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "missing.db"
    for where in (["--store", f"sqlite:///{missing}"], []):
        refused = invoke(command, *where, "--offset", value)
        message = " ".join(refused_usage(refused).split())
        assert message == (
            f"Invalid value for '--offset': {value!r} is not a whole number from 0 to "
            "9223372036854775807"
        )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["pending", "sessions"])
def test_an_offset_on_a_missing_store_makes_none(command: str, tmp_path: Path) -> None:
    missing = tmp_path / "missing.db"
    result = invoke(command, "--store", f"sqlite:///{missing}", "--offset", "5")
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith(f"error: UsageError: no store at {missing}"), result.stderr
    assert not missing.exists()


@pytest.mark.parametrize("status", ["waiting", "failed"])
def test_sessions_offset_pages_by_a_status_a_passed_ttl_changes(
    store_url: str, status: str
) -> None:
    """Paged by `--offset`, `--status waiting` (or failed) lists each session once as the
    whole list shows it: one whose TTL passed unrecorded is on the `failed` pages, though its
    store still holds it waiting."""
    for _ in range(2):
        park(store_url)
    for agent in ("support", "support", "other"):
        _park_lapsed(store_url, agent)
    whole = invoke("sessions", "--store", store_url, "--status", status, "--json")
    listed = [r["id"] for r in json.loads(whole.stdout)]
    assert len(listed) == (3 if status == "failed" else 2)
    paged, said = _pages("sessions", store_url, "--status", status, limit=1)
    assert paged == listed
    assert said[-1] == f"showing none of {len(listed)}: --offset {len(listed)} is past the end\n"
    assert said[1] == f"showing 2-2 of {len(listed)}" + (
        ": pass --offset 2 to see more\n" if status == "failed" else "\n"
    )
