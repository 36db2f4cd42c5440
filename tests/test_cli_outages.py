"""`signoff events --follow` and `signoff worker` as processes while their PostgreSQL server
stops (`pg_ctl stop -m fast`, as an operator's restart or an outage) and comes back: each says
so in one line, waits for it, and goes on with no event lost or repeated and no tool run twice.
"""

from __future__ import annotations

import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import signoff as so

from ._cli import ROOT, agent, park
from ._forks import python_env
from ._procs import query
from ._worker_procs import AGENT, check_logs, make_agent, read_records, start_worker
from .conftest import PgCluster

GRACE = 2.0
"""The store's outage grace in these tests (`?outage_grace=`; 10 s by default): how long a call
waits for the server before it fails with `StoreUnavailable`."""

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING) signoff\.")


@pytest.fixture
def cluster() -> Iterator[PgCluster]:
    """A PostgreSQL server of this test's own, to stop and start again under the commands."""
    started = PgCluster.start()
    try:
        yield started
    finally:
        started.stop()


def _until(check: Callable[[], object], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class _Lines:
    """The stdout lines of a child process, read as they come on a thread of their own."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._queue: queue.Queue[str] = queue.Queue()
        assert proc.stdout is not None
        stdout = proc.stdout

        def pump() -> None:
            for line in stdout:
                self._queue.put(line)

        self._stdout = stdout
        self._pump = threading.Thread(target=pump, daemon=True)
        self._pump.start()

    def close(self) -> None:
        """Once the process ended: the last lines read, its pipe closed."""
        self._pump.join(timeout=10)
        self._stdout.close()

    def read(self) -> list[str]:
        while not self._queue.empty():
            self.lines.append(self._queue.get())
        return self.lines

    def seqs(self) -> list[int]:
        return [int(line.split()[0]) for line in self.read()]


def _head(url: str, session_id: str) -> int:
    ((head,),) = query(url, "SELECT head FROM {t}sessions WHERE id = {p}", session_id)
    return int(head)


def test_events_follow_rides_out_a_postgres_outage(cluster: PgCluster, tmp_path: Path) -> None:
    """`events --follow` ended with status 1 (`StoreUnavailable`) once the server had been
    down for the outage grace, after psycopg's pool had printed each failed reconnection
    (several lines a second) on stderr. It says in one line that the store failed and that it
    retries, waits for the server, says when it works again, and prints the events written
    since from the seq it had reached: each once, none missed. Ctrl-C still ends it with 0."""
    url = cluster.admin_url
    session_id, request_id = park(url)
    errors = tmp_path / "stderr"
    follower = _follow(url, session_id, errors)
    out = _Lines(follower)
    try:
        _until(lambda: out.seqs() == [1, 2, 3, 4, 5], "the events so far")
        cluster.halt()
        _until(lambda: "retrying" in errors.read_text(), "the follower to say it retries")
        time.sleep(GRACE + 1)  # it keeps waiting, through a few more tries
        assert follower.poll() is None, errors.read_text()
        cluster.resume()
        rt = so.Runtime([agent], store=url)
        try:
            approve = so.InputResponse(request_id=request_id, option_id="approve")
            result = rt.respond_sync(session_id, [approve])
        finally:
            rt.close_sync()
        assert result.status == "completed"
        head = _head(url, session_id)
        _until(lambda: out.seqs()[-1:] == [head], "the events written after the outage")
        follower.send_signal(signal.SIGINT)
        assert follower.wait(timeout=20) == 0
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
        out.close()
    assert out.seqs() == list(range(1, head + 1))  # none lost, none repeated
    said = errors.read_text().splitlines()
    assert len(said) == 3 and said[2] == "interrupted", said  # Ctrl-C's line
    assert said[0].startswith("the store failed, retrying (said again once it works): "), said
    assert "PostgreSQL unavailable" in said[0], said
    assert re.fullmatch(r"the store works again \(it failed for \d+\.\ds\)", said[1]), said


def _follow(url: str, session_id: str, stderr_path: Path) -> subprocess.Popen[str]:
    with stderr_path.open("w") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "signoff", "events", session_id, "--follow"]
            + ["--store", f"{url}?outage_grace={GRACE}"],
            cwd=ROOT,
            env=python_env(),
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )


def test_events_follow_started_while_postgres_is_down_waits_for_it(
    cluster: PgCluster, tmp_path: Path
) -> None:
    """Started while the server is down, the follower waits for it as `worker` and `serve` do
    (it ended with status 1), then prints the log from its start."""
    url = cluster.admin_url
    session_id, _ = park(url)
    cluster.halt()
    errors = tmp_path / "stderr"
    follower = _follow(url, session_id, errors)
    out = _Lines(follower)
    try:
        _until(lambda: "retrying" in errors.read_text(), "the follower to say it retries")
        time.sleep(GRACE + 1)
        assert follower.poll() is None and out.read() == [], errors.read_text()
        cluster.resume()
        _until(lambda: out.seqs() == [1, 2, 3, 4, 5], "the events")
        follower.send_signal(signal.SIGINT)
        assert follower.wait(timeout=20) == 0
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
        out.close()
    said = errors.read_text().splitlines()
    assert said[0].startswith("the store failed, retrying (said again once it works): "), said
    assert said[1].startswith("the store works again") and said[2:] == ["interrupted"], said


@pytest.mark.parametrize(
    "lease_ttl", [30.0, 2.0], ids=["within-the-lease", "longer-than-the-lease"]
)
def test_a_worker_rides_out_a_postgres_outage_with_a_turn_in_flight(
    cluster: PgCluster, tmp_path: Path, lease_ttl: float
) -> None:
    """The server stops while a worker runs an approved tool: the tool's result cannot be
    written, nor the lease renewed, nor sessions claimed. The worker logs each failure once,
    as one line, and keeps trying; once the server is back it records the result it kept
    (the tool is not run again, also when the outage outlasted the lease and the worker claims
    the session anew) and the turn completes, its log gapless. SIGTERM ends it, 0."""
    url = cluster.admin_url
    records, hold = tmp_path / "runs.jsonl", tmp_path / "hold"
    worker = start_worker(
        f"{url}?outage_grace={GRACE}",
        tmp_path,
        "w",
        records,
        hold=hold,
        sweep_every=0.5,
        lease_ttl=lease_ttl,
    )
    try:
        front = so.Runtime([make_agent(str(records))], store=url, inline=False)
        try:
            session_id = front.generate_sync(AGENT, "refund order 1042").session_id
            _until(lambda: front.state_sync(session_id).status == "waiting", "the approval")
            (request,) = front.state_sync(session_id).pending_requests()
            approve = so.InputResponse(request_id=request.id, option_id="approve")
            front.respond_sync(session_id, [approve])
        finally:
            front.close_sync()
        _until(lambda: read_records(records), "the tool to start")
        cluster.halt()
        hold.touch()  # the tool ends while the server is down
        _until(lambda: [r[0] for r in read_records(records)] == ["start", "done"], "the tool")
        _until(lambda: "WARNING" in worker.log(), "the worker to log the outage")
        time.sleep(GRACE + 1 + (lease_ttl if lease_ttl < GRACE * 5 else 0))  # lapsed, or not
        assert worker.proc.poll() is None, worker.log()
        cluster.resume()
        _until(
            lambda: (
                query(url, "SELECT status FROM {t}sessions WHERE id = {p}", session_id)
                == [("idle",)]
            ),
            "the turn to complete",
        )
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.proc.wait(timeout=30) == 0, worker.log()
    finally:
        worker.close()
    assert [r[0] for r in read_records(records)] == ["start", "done"]  # run once
    check_logs(url)
    rt = so.Runtime([], store=url)
    try:
        types = [e.type for e in rt.events_sync(session_id)]
    finally:
        rt.close_sync()
    assert types.count("tool.started") == types.count("tool.completed") == 1, types
    assert types.count("turn.completed") == 1, types
    log = worker.log().splitlines()
    assert all(LOG_LINE.match(line) for line in log), log  # one line each, no traceback


def test_a_worker_stopped_during_a_postgres_outage_records_the_outcome_it_kept(
    cluster: PgCluster, tmp_path: Path
) -> None:
    """SIGTERM mid tool body, then the server stops and the body ends: its result could not be
    written, and the draining worker exited 0 with it only in memory, for the next worker to
    run the refund again. It keeps trying, with backoff, records the result once the server is
    back (the tool not run again), finishes the turn and only then exits, 0."""
    url = cluster.admin_url
    records, hold = tmp_path / "runs.jsonl", tmp_path / "hold"
    worker = start_worker(f"{url}?outage_grace={GRACE}", tmp_path, "w", records, hold=hold)
    try:
        front = so.Runtime([make_agent(str(records))], store=url, inline=False)
        try:
            session_id = front.generate_sync(AGENT, "refund order 1042").session_id
            _until(lambda: front.state_sync(session_id).status == "waiting", "the approval")
            (request,) = front.state_sync(session_id).pending_requests()
            approve = so.InputResponse(request_id=request.id, option_id="approve")
            front.respond_sync(session_id, [approve])
        finally:
            front.close_sync()
        _until(lambda: read_records(records), "the tool to start")
        worker.proc.send_signal(signal.SIGTERM)
        _until(lambda: "SIGTERM: stopping after the running turns" in worker.log(), "the stop")
        cluster.halt()
        hold.touch()  # the tool ends while the server is down
        _until(lambda: [r[0] for r in read_records(records)] == ["start", "done"], "the tool")
        _until(
            lambda: (
                "recording it before the worker stops" in worker.log()
                or worker.proc.poll() is not None
            ),
            "the worker to retry the record, or to exit",
        )
        time.sleep(GRACE + 1)  # it keeps trying through the outage
        assert worker.proc.poll() is None, worker.log()
        cluster.resume()
        assert worker.proc.wait(timeout=60) == 0, worker.log()
    finally:
        worker.close()
    assert [r[0] for r in read_records(records)] == ["start", "done"]  # run once
    check_logs(url)
    rt = so.Runtime([], store=url)
    try:
        types = [e.type for e in rt.events_sync(session_id)]
    finally:
        rt.close_sync()
    assert types.count("tool.started") == types.count("tool.completed") == 1, types
    assert types.count("turn.completed") == 1, types
    log = worker.log()
    said = f"session {session_id}: the outcome of issue_refund call call_refund recorded"
    assert said in log and "worker stopped" in log, log
    assert all(LOG_LINE.match(line) for line in log.splitlines()), log  # no error, no traceback


def test_events_follow_ends_when_its_sqlite_file_is_replaced(tmp_path: Path) -> None:
    """What only a restart mends is not retried: a follower whose SQLite file another was moved
    over (a backup restored under it) ends with one error line and status 1, as documented."""
    db = tmp_path / "state.db"
    session_id, _ = park(f"sqlite:///{db}")
    errors = tmp_path / "stderr"
    with errors.open("w") as stderr:
        follower = subprocess.Popen(
            [sys.executable, "-m", "signoff", "events", session_id, "--follow"]
            + ["--store", f"sqlite:///{db}"],
            cwd=ROOT,
            env=python_env(),
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    out = _Lines(follower)
    try:
        _until(lambda: out.seqs() == [1, 2, 3, 4, 5], "the events so far")
        other = tmp_path / "other.db"
        park(f"sqlite:///{other}")
        for suffix in ("-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        other.replace(db)
        assert follower.wait(timeout=30) == 1
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
        out.close()
    said = errors.read_text().splitlines()
    assert len(said) == 1 and said[0].startswith(f"error: StoreGone: {db} was deleted"), said


def test_events_without_follow_run_while_postgres_is_down_says_so_in_one_line(
    cluster: PgCluster,
) -> None:
    """`events` without `--follow`, run while the server is down, waits out the outage grace
    and ends with one error line and status 1, as every command that does not follow: it
    retries nothing, and nothing of psycopg's pool reaches stderr."""
    url = cluster.admin_url
    session_id, _ = park(url)
    cluster.halt()
    result = subprocess.run(
        [sys.executable, "-m", "signoff", "events", session_id]
        + ["--store", f"{url}?outage_grace={GRACE}"],
        cwd=ROOT,
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    said = result.stderr.splitlines()
    assert len(said) == 1 and said[0].startswith("error: StoreUnavailable: "), said
