"""Crash at every persistence point: SIGKILL right before and right after each commit of a turn
with two approvals, a question, a journaled step and a message queued for the turn's end;
restart; the result must not change."""

from __future__ import annotations

import asyncio
import json
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import signoff as so
from signoff.stores import open_store
from signoff.stores._codec import needs_previous

from . import _proof
from ._crash_points import kill_at_each
from ._forks import Forks
from ._procs import lapse_leases, query
from .conftest import STORE_KINDS, PgCluster


@pytest.fixture(scope="module")
def children(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Forks]:
    """One process that imported signoff, forking a child per run of the scenario."""
    forks = Forks("tests._fault_child", tmp_path_factory.mktemp("children"))
    try:
        yield forks
    finally:
        forks.close()


def child(
    children: Forks, url: str, tmp: Path, kill_at: int = 0, when: str = "before"
) -> tuple[int, dict[str, Any] | None]:
    """Run the scenario (or resume it) in a child: its exit code, and its result if it ended."""
    return children.run(url, str(tmp / "runs"), str(tmp / "session"), str(kill_at), when)


def runs(tmp: Path) -> list[dict[str, Any]]:
    path = tmp / "runs"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def read_log(url: str, session_id: str, *, expired: int = 0) -> list[so.Event]:
    """The session's events, read through the store's own API, once the checks every crash
    scenario shares hold: seq gap-free, no request lost, none answered twice, all settled (but
    the `expired` ones a deadline closed)."""

    async def read() -> tuple[list[so.Event], int | None, dict[str, str]]:
        store = open_store(url)
        await store.open()
        try:
            events = await store.read_events(session_id)
            requested = [
                r["id"] for e in events if e.type == "input.requested" for r in e.data["requests"]
            ]
            statuses = {}
            for rid in requested:
                found = await store.get_request(rid)
                assert found is not None, f"request {rid} has no row"
                statuses[rid] = found.status
            return events, await store.head(session_id), statuses
        finally:
            await store.close()

    events, head, statuses = asyncio.run(read())
    assert [e.seq for e in events] == list(range(1, (head or 0) + 1)), "seq has a gap or a fork"
    resolved = Counter(e.data["request_id"] for e in events if e.type == "input.resolved")
    assert sorted(resolved) == sorted(statuses), "a request was lost"
    assert set(resolved.values()) == {1}, "an answer was applied twice"
    assert Counter(statuses.values()) == Counter(settled=len(statuses) - expired, expired=expired)
    return events


def check_log(url: str, session_id: str) -> list[str]:
    """What the store holds after the turn, read through its own API."""
    events = read_log(url, session_id)
    assert Counter(e.type for e in events)["model.completed"] == 3
    # Bob's message was queued once and answered once, in a turn after Alice's
    queued = [e for e in events if e.type == "turn.message" and e.data.get("queued")]
    assert len(queued) == 1, "the queued message was lost or recorded twice"
    started = [e.data["message"] for e in events if e.type == "turn.started"]
    assert started == ["order 7 arrived broken", queued[0].data["message"]]
    return [e.type for e in events]


class Target:
    """Where one run of the scenario stores: a SQLite file of its own, or the store's one
    PostgreSQL database, emptied before each run as a fresh copy of the migrated template is
    (every table of the schema but its version's, identities restarted): a database per run
    cost a copy and a drop, each a checkpoint of the server, 45 times over."""

    def __init__(self, kind: str, request: pytest.FixtureRequest) -> None:
        self.kind = kind
        self.request = request
        self.database: str | None = None

    def url(self, tmp: Path) -> str:
        if self.kind == "sqlite":
            return f"sqlite:///{tmp / 's.db'}"
        cluster: PgCluster = self.request.getfixturevalue("pg_cluster")
        if self.database is None:
            template = cluster.migrated_template() if cluster.ours else None
            name = self.database = cluster.fresh_database(template=template)
            self.request.addfinalizer(lambda: cluster.drop_database(name))
            return cluster.url(name)
        url = cluster.url(self.database)
        empty(url)
        return url


def empty(url: str) -> None:
    """Empty signoff's tables (all but `schema_version`) in the PostgreSQL database at `url`."""
    with psycopg.connect(url, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT tablename FROM pg_tables"
            " WHERE schemaname = 'signoff' AND tablename <> 'schema_version'"
        ).fetchall()
        if tables:
            names = ", ".join(f'signoff."{name}"' for (name,) in tables)
            conn.execute(f"TRUNCATE {names} RESTART IDENTITY".encode())
        counts = [conn.execute(f'SELECT COUNT(*) FROM signoff."{n}"'.encode()) for (n,) in tables]
        assert all(c.fetchone() == (0,) for c in counts), "a table was not emptied"


@pytest.fixture(scope="module", params=STORE_KINDS)
def target(request: pytest.FixtureRequest) -> Target:
    return Target(request.param, request)


@pytest.fixture(scope="module")
def baseline(
    tmp_path_factory: pytest.TempPathFactory, target: Target, children: Forks
) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("baseline")
    url = target.url(tmp)
    rc, result = child(children, url, tmp)
    assert rc == 0 and result is not None, children.stderr()
    assert result["status"] == "completed"
    result["types"] = check_log(url, result["session"])
    result["runs"] = Counter(r["kind"] for r in runs(tmp))
    assert result["runs"] == {"refund": 1, "ship": 1, "quote": 1}
    # the long tool input is stored once: its request is kept on the model's response
    stored = query(url, "SELECT data FROM {t}events")
    assert any(needs_previous(data) for (data,) in stored)
    _proof.record("crash:commit points", result["points"])
    _proof.record(f"crash:{target.kind}:commit points", result["points"])
    return result


def test_the_scenario_has_many_commit_points(baseline: dict[str, Any]) -> None:
    # session, turn, model, the step, the question, its answer, two approvals, four results...
    assert baseline["points"] >= 14
    assert baseline["text"] == "to bob: bob here: where is my parcel?"
    assert [who for _, who in baseline["turns"]] == ["alice", "bob"]
    assert baseline["texts"][1].startswith("done: ")  # Alice's turn saw every tool result


@pytest.mark.parametrize("when", ["before", "after"])
def test_sigkill_at_every_commit_point(
    tmp_path: Path, target: Target, baseline: dict[str, Any], children: Forks, when: str
) -> None:
    def kill(point: int) -> str:
        tmp = tmp_path / f"{when}-{point}"
        tmp.mkdir()
        url = target.url(tmp)
        killed, result = child(children, url, tmp, kill_at=point, when=when)
        assert killed == -signal.SIGKILL, (point, result, children.stderr())
        if (tmp / "session").exists():  # else killed before it existed: nothing acknowledged
            finish(tmp, url, point)
        return (tmp / "killed").read_text()

    def finish(tmp: Path, url: str, point: int) -> None:
        lapse_leases(url)  # as its TTL passing would
        finished, result = child(children, url, tmp)
        assert finished == 0 and result is not None, (point, children.stderr())
        assert result["status"] == "completed", (point, result)
        assert result["text"] == baseline["text"], point
        assert result["turns"] == baseline["turns"], point
        assert result["texts"] == baseline["texts"], point
        check_log(url, result["session"])
        by_kind: dict[str, Counter[str]] = {}
        for r in runs(tmp):
            by_kind.setdefault(r["kind"], Counter())[r["key"]] += 1
        for kind in ("refund", "ship", "quote"):
            keys = by_kind.get(kind, Counter())
            # Exactly once; twice (same key) only if the kill landed inside the body, after it
            # ran and before its result was committed.
            assert len(keys) == 1, (point, kind, keys)
            assert list(keys.values())[0] in (1, 2), (point, kind, keys)
        reruns = sum(1 for k in by_kind.values() for n in k.values() if n == 2)
        assert reruns <= 1, (point, by_kind)  # one kill can interrupt one body at most

    kill_at_each(target.kind, baseline["labels"], kill)
