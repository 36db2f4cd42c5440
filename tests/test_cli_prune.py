"""`signoff prune` (`_prune`): the old finished sessions deleted a batch at a time with their
audit entries, `--dry-run` deleting none, the limit reached said, and the confirmation asked at
a terminal (or `--yes`), on both stores."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

import signoff as so
from signoff.cli import _deletion, _prune, app
from signoff.testing import ManualClock, reply, scripted_agent

from ._cli import agent, invoke, refused_usage
from .test_deletion_expired_tree import nested_desks
from .test_store_edited_rows import edit


def _old(url: str, n: int = 1, *, waiting: int = 0) -> list[str]:
    """`n` completed sessions (and `waiting` ones parked on an approval), made years ago by a
    manual clock, one a second apart: their ids, oldest first."""
    clock = ManualClock()
    greeter = scripted_agent("greeter", [reply("hello")], repeat_last=True)
    with so.Runtime([greeter, agent], store=url, clock=clock) as rt:
        ids = []
        for _ in range(n):
            ids.append(rt.generate_sync("greeter", "hi").session_id)
            clock.advance(1)
        for _ in range(waiting):
            assert rt.generate_sync("support", "Refund order 1042").status == "waiting"
        return ids


def _left(url: str) -> list[str]:
    with so.Runtime([], store=url) as rt:
        assert rt.verify_audit_sync() == []
        return sorted(s.id for s in rt.sessions_sync())


def _audit(url: str) -> list[tuple[str, str]]:
    with so.Runtime([], store=url) as rt:
        return [(e.stream, e.type) for e in rt.audit_sync()]


def _deletions(url: str) -> list[dict[str, object]]:
    with so.Runtime([], store=url) as rt:
        return [e.data for e in rt.audit_sync(stream="store:deletions")]


def test_prune_deletes_the_old_finished_sessions_and_records_each(store_url: str) -> None:
    ids = _old(store_url, 2, waiting=1)
    waiting = _left(store_url)
    result = invoke(
        "prune", "--older-than", "30d", "--store", store_url, "--yes", "--reason", "retention"
    )
    assert result.exit_code == 0, result.output
    assert "deleted 2 session(s) and their subagents' sessions" in result.stdout
    assert "remain" not in result.stdout
    assert _left(store_url) == sorted(set(waiting) - set(ids))
    entries = _deletions(store_url)
    assert [e["session_id"] for e in entries] == ids
    assert all(e["reason"] == "retention" for e in entries)
    assert all(e["by"] == so.cli.local_principal().model_dump() for e in entries)


def test_prune_dry_run_lists_and_deletes_nothing(store_url: str) -> None:
    ids = _old(store_url, 2)
    result = invoke("prune", "--older-than", "90d", "--store", store_url, "--dry-run")
    assert result.exit_code == 0, result.output
    assert result.stdout.split()[:2] == ids
    assert "2 session(s) would be deleted; nothing deleted." in result.stdout
    assert _left(store_url) == sorted(ids)
    assert _deletions(store_url) == []


def test_prune_says_when_the_limit_left_some_for_the_next_run(store_url: str) -> None:
    ids = _old(store_url, 3)
    first = invoke("prune", "--older-than", "3600", "--store", store_url, "-y", "--limit", "2")
    assert first.exit_code == 0, first.output
    assert "deleted 2 session(s)" in first.stdout
    assert "--limit 2 reached: older sessions remain for the next run." in first.stdout
    assert _left(store_url) == [ids[2]]
    second = invoke("prune", "--older-than", "3600", "--store", store_url, "-y", "--limit", "2")
    assert second.exit_code == 0, second.output
    assert "deleted 1 session(s)" in second.stdout and "remain" not in second.stdout
    third = invoke("prune", "--older-than", "3600", "--store", store_url, "-y")
    assert third.exit_code == 0 and "Nothing to delete" in third.stdout


def test_prune_says_no_more_remain_when_exactly_the_limit_was_old_enough(store_url: str) -> None:
    """It said "older sessions remain" whenever it had listed `--limit` of them: with exactly
    that many, the next run found nothing. It lists one more to know."""
    ids = _old(store_url, 2)
    look = invoke("prune", "--older-than", "1h", "--store", store_url, "--dry-run", "--limit", "2")
    assert look.exit_code == 0, look.output
    assert look.stdout.split()[:2] == ids and "limit" not in look.stdout
    fewer = invoke("prune", "--older-than", "1h", "--store", store_url, "--dry-run", "--limit", "1")
    assert "(--limit 1 reached: more are old enough.)" in fewer.stdout
    done = invoke("prune", "--older-than", "1h", "--store", store_url, "-y", "--limit", "2")
    assert done.exit_code == 0, done.output
    assert "deleted 2 session(s)" in done.stdout and "remain" not in done.stdout
    assert _left(store_url) == []


def _leased(url: str, ids: list[str]) -> None:
    """The sessions held under a lease by another process for an hour: a prune skips them."""

    async def lease() -> None:
        async with so.Runtime([], store=url) as rt:
            for sid in ids:
                assert await rt.store.acquire_lease(sid, "elsewhere", 3600, time.time())

    asyncio.run(lease())


def test_prune_goes_past_the_sessions_it_skips_and_says_when_none_remain(store_url: str) -> None:
    """The two oldest are held by another process. `--limit 2` skipped them at every run,
    deleting nothing and saying older sessions remained; it deletes the next oldest instead."""
    ids = _old(store_url, 5)
    _leased(store_url, ids[:2])
    args = ["prune", "--older-than", "1h", "--store", store_url, "-y", "--limit", "2"]
    first = invoke(*args)
    assert first.exit_code == 0, first.output
    assert "deleted 2 session(s)" in first.stdout and "; 2 skipped (live" in first.stdout
    assert "--limit 2 reached: older sessions remain for the next run." in first.stdout
    second = invoke(*args)
    assert second.exit_code == 0, second.output
    assert "deleted 1 session(s)" in second.stdout and "; 2 skipped (live" in second.stdout
    assert "remain" not in second.stdout
    assert _left(store_url) == sorted(ids[:2])
    assert [e["session_id"] for e in _deletions(store_url)] == ids[2:]


def test_prune_refuses_an_empty_agent_and_deletes_nothing(store_url: str) -> None:
    """`--agent ""` (a variable unset) matched no session, so it said there was nothing to
    delete, as the listings' empty filters once did: refused as theirs are."""
    ids = _old(store_url, 1)
    for extra in (["-y"], ["--dry-run"]):
        args = ["prune", "--older-than", "1h", "--store", store_url, "--agent", "", *extra]
        assert "--agent takes an agent's name, not ''" in refused_usage(invoke(*args))
    assert _left(store_url) == ids


def test_prune_and_delete_without_the_runtime_take_a_session_whose_ttl_passed_waiting(
    store_url: str,
) -> None:
    """A session whose TTL passed while it waited on a request is finished, but only a runtime
    with its agent recorded that: on --store alone `prune` skipped it for ever (and, the oldest,
    it took a place in every batch) and `delete` said to cancel it first, which
    `SessionExpired` refused. Both record the expiry, then delete it."""
    clock = ManualClock(1_600_000_000)  # older than `_old`'s: the first a batch lists
    short = so.Agent(
        name="support",
        model=agent.model,
        tools=list(agent.tools.values()),
        limits=so.Limits(ttl=60),
    )
    with so.Runtime([short], store=store_url, clock=clock) as rt:
        expired = [rt.generate_sync("support", "Refund order 1042").session_id for _ in range(2)]
        assert all(rt.state_sync(s).status == "waiting" for s in expired)
    ids = _old(store_url, 1)
    result = invoke("prune", "--older-than", "1h", "--store", store_url, "-y", "--limit", "1")
    assert result.exit_code == 0, result.output
    assert "deleted 1 session(s)" in result.stdout and "skipped" not in result.stdout
    assert sorted(_left(store_url)) == sorted([expired[1], *ids])
    gone = invoke("delete", expired[1], "--store", store_url, "-y")
    assert gone.exit_code == 0, gone.output
    assert _left(store_url) == ids
    entries = _deletions(store_url)
    assert [e["session_id"] for e in entries] == expired


def test_prune_names_a_session_it_cannot_read_and_deletes_the_others(store_url: str) -> None:
    """The oldest session whose TTL passed while it waited has a damaged event: its expiry
    cannot be recorded. Every prune failed on it, deleting nothing; it is named, left for
    `delete --force`, the others deleted, and the command exits 1 for a person to see."""
    clock = ManualClock(1_600_000_000)  # older than `_old`'s: the first a batch lists
    short = so.Agent(
        name="support",
        model=agent.model,
        tools=list(agent.tools.values()),
        limits=so.Limits(ttl=60),
    )
    with so.Runtime([short], store=store_url, clock=clock) as rt:
        damaged = rt.generate_sync("support", "Refund order 1042").session_id
    edit(
        store_url,
        "UPDATE {t}events SET data = {p} WHERE seq = 2 AND sk = "
        "(SELECT sk FROM {t}sessions WHERE id = {p})",
        b"\x01not deflate",
        damaged,
    )
    ids = _old(store_url, 1)
    result = invoke("prune", "--older-than", "1h", "--store", store_url, "-y")
    assert result.exit_code == 1, result.output
    assert "deleted 1 session(s)" in result.stdout and "skipped" not in result.stdout
    assert f"not deleted: 1 session(s) that could not be read (damaged): {damaged};" in (
        result.stderr
    )
    assert "signoff delete --force SESSION_ID" in result.stderr
    assert [e["session_id"] for e in _deletions(store_url)] == ids
    gone = invoke("delete", damaged, "--store", store_url, "-y", "--force")
    assert gone.exit_code == 0, gone.output
    assert _left(store_url) == []


def test_prune_names_a_session_whose_row_it_cannot_read_and_delete_force_takes_it(
    tmp_path: object,
) -> None:
    """The oldest finished session's chain head hand-edited (SQLite keeps text in a number's
    column): every prune failed on it (exit 1, nothing deleted), and so did `delete --force`.
    It is named, the other deleted; `delete --force` deletes it."""
    url = f"sqlite:///{tmp_path}/s.db"
    ids = _old(url, 2)
    edit(url, "UPDATE sessions SET audit_n = 'x' WHERE id = ?", ids[0])
    result = invoke("prune", "--older-than", "1h", "--store", url, "-y")
    assert result.exit_code == 1, result.output
    assert "deleted 1 session(s)" in result.stdout
    assert f"not deleted: 1 session(s) that could not be read (damaged): {ids[0]};" in (
        result.stderr
    )
    gone = invoke("delete", ids[0], "--store", url, "-y", "--force")
    assert gone.exit_code == 0, gone.output
    assert _left(url) == []
    assert [e["session_id"] for e in _deletions(url)] == [ids[1], ids[0]]


@pytest.mark.parametrize("command", ["delete", "prune"])
def test_on_the_store_alone_an_expired_tree_whose_subagent_waits_is_deleted(
    store_url: str, command: str
) -> None:
    """A parent whose TTL passed while its subagent's subagent waited on a person: on --store
    alone `delete` recorded the parent's expiry and no more, then refused (exit 1, the
    subagent's request still open), and every prune skipped the tree. Its delegated turns are
    cancelled as its agent cancels them, and the tree deleted."""
    with so.Runtime(nested_desks("front"), store=store_url, clock=ManualClock()) as rt:
        r = rt.generate_sync("front", "go")
        assert r.status == "waiting"  # its TTL long passed by the real clock
    if command == "delete":
        result = invoke("delete", r.session_id, "--store", store_url, "-y")
        assert result.exit_code == 0, result.output
        assert "and 2 subagent session(s)" in result.stdout
    else:
        result = invoke("prune", "--older-than", "1h", "--store", store_url, "-y")
        assert result.exit_code == 0, result.output
        assert "deleted 1 session(s)" in result.stdout and "skipped" not in result.stdout
    assert _left(store_url) == []
    assert [e["session_id"] for e in _deletions(store_url)] == [r.session_id]


def test_prune_keeps_sessions_more_recent_than_the_duration(store_url: str) -> None:
    ids = _old(store_url, 1)
    result = invoke("prune", "--older-than", "36500d", "--store", store_url, "--yes")
    assert result.exit_code == 0, result.output
    assert "Nothing to delete" in result.stdout
    assert _left(store_url) == ids


def test_prune_without_a_terminal_needs_yes(store_url: str) -> None:
    ids = _old(store_url, 1)
    message = refused_usage(invoke("prune", "--older-than", "1d", "--store", store_url))
    assert "no terminal to ask for confirmation at: pass --yes" in message
    assert _left(store_url) == ids


def test_prune_asks_at_a_terminal_and_no_keeps_the_sessions(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_deletion, "_can_ask", lambda: True)
    ids = _old(store_url, 2)
    args = ["prune", "--older-than", "1d", "--store", store_url]
    kept = CliRunner().invoke(app, args, input="n\n")
    assert kept.exit_code == 1, kept.output
    assert "Delete 2 finished session(s) last active more than 1 day ago, and" in kept.stdout
    assert "Nothing deleted." in kept.stdout
    assert _left(store_url) == sorted(ids)
    gone = CliRunner().invoke(app, args, input="y\n")
    assert gone.exit_code == 0, gone.output
    assert len(_deletions(store_url)) == 2 and _left(store_url) == []


def test_prune_with_the_runtime_answered_no_records_no_tool_settings(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`prune --older-than 1d MODULE:RUNTIME` counted the sessions for its question through the
    loaded runtime, whose opening recorded its tool settings (`tool.approval_changed`): an
    answer of no printed "Nothing deleted." with two audit entries more. Only a yes writes."""
    monkeypatch.setattr(_deletion, "_can_ask", lambda: True)
    module = f"tooled_{uuid.uuid4().hex}"
    (tmp_path / f"{module}.py").write_text(
        "import signoff as so\nfrom tests._cli import agent\n"
        f"runtime = so.Runtime([agent], store={store_url!r})\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("SIGNOFF_STORE", raising=False)
    greeter = scripted_agent("greeter", [reply("hello")])
    with so.Runtime([greeter], store=store_url, clock=ManualClock()) as rt:
        ids = [rt.generate_sync("greeter", "hi").session_id]  # no tool's settings recorded
    before = _audit(store_url)
    args = ["prune", "--older-than", "1d", f"{module}:runtime"]
    kept = CliRunner().invoke(app, args, input="n\n")
    assert kept.exit_code == 1, kept.output
    assert "Delete 1 finished session(s) last active more than 1 day ago" in kept.stdout
    assert "Nothing deleted." in kept.stdout
    assert _audit(store_url) == before
    assert _left(store_url) == ids
    gone = CliRunner().invoke(app, args, input="y\n")
    assert gone.exit_code == 0, gone.output
    assert [e["session_id"] for e in _deletions(store_url)] == ids


def test_prune_deletes_no_more_than_it_asked_about(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asked about the one session old enough; the person took 150 s to answer, by when the
    second was old enough too, and both went: the deletion counted its cutoff back from a new
    now. It deletes at the moment of the question."""
    monkeypatch.setattr(_deletion, "_can_ask", lambda: True)
    clock = ManualClock(time.time() - 1050)
    greeter = scripted_agent("greeter", [reply("hello")], repeat_last=True)
    with so.Runtime([greeter], store=store_url, clock=clock) as rt:
        older = rt.generate_sync("greeter", "hi").session_id
        clock.advance(100)
        newer = rt.generate_sync("greeter", "hi").session_id
    now, asked = so.Runtime.now, []

    def answered(channel: object, question: str) -> bool:
        asked.append(question)
        monkeypatch.setattr(so.Runtime, "now", lambda self: now(self) + 150)
        return True

    monkeypatch.setattr(_deletion, "_confirmed", answered)
    result = invoke("prune", "--older-than", "1000s", "--store", store_url)
    assert result.exit_code == 0, result.output
    assert [q.split(" last active")[0] for q in asked] == ["Delete 1 finished session(s)"]
    assert "deleted 1 session(s)" in result.stdout
    assert _left(store_url) == [newer]
    assert [e["session_id"] for e in _deletions(store_url)] == [older]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90d", 7_776_000), ("12h", 43_200), ("30m", 1_800), ("3600s", 3_600), ("3600", 3_600)],
)
def test_durations_read_as_seconds(text: str, seconds: float) -> None:
    assert _prune.duration(text) == seconds


@pytest.mark.parametrize("text", ["", "90x", "-5d", "nan", "inf", "1e400", "d", "5 days"])
def test_a_bad_duration_or_limit_is_refused(text: str, tmp_path: object) -> None:
    store = f"sqlite:///{tmp_path}/s.db"
    message = refused_usage(invoke("prune", "--older-than", text, "--store", store, "-y"))
    assert "is not a duration such as 90d" in message
    zero = refused_usage(invoke("prune", "--older-than", "1d", "--store", store, "--limit", "0"))
    assert "--limit" in zero
