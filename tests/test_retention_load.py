"""Retention under load, on each store: two `signoff worker` processes run many sessions whose turns
park on approvals and questions, while the test answers requests, sends messages into finished
sessions (bringing them back to life), cancels live turns (a subagent's too), leaves some
requests of sessions with a short TTL (`brief`) to expire with them, starts sessions with
idempotency keys and repeats keys, and a third process (`tests._retention_procs`) loops `prune`
(of sessions finished `PRUNE_AGE` seconds ago) and `delete_session` of random sessions.

Once everything stopped: the store verifies; no row (event, snapshot, request, lease, audit entry,
subagent's session) outlives its session; each deleted id has one `store:deletions` entry, no
session row and its deleted mark, and is never created again (a repeated key is refused, never given
a session); an answer told its session is unknown (only the test answers and cancels; only `brief`
sessions expire) was applied and its turn ran to its end before the deletion; one told its request
closed met a cancelled turn; every turn the test saw start ran to its end (its `close` record), was
cancelled by the test, is a `brief` session's, or parks at the end in a session still there: a
deletion of a session with a turn running or with work to do loses that turn; the pruner met only
the expected refusals and the workers logged no error.

It found, and checks again: a parent waiting on a subagent's result deleted under it; a key repeated
as its session was erased (a `StoreError`, and on PostgreSQL the erased id made again); a message
taking a subagent's first turn before its delegate call started it; a subagent's drive failing once
its tree was deleted as its turn ended.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.stores._deletions import DELETIONS_STREAM

from ._forks import python_env
from ._procs import ROOT, query
from ._retention_procs import AGENT, ALICE, BRIEF, PARENT, make_agents
from ._worker_procs import read_records

LOAD_SECONDS = 12.0
"""How long the test drives the sessions and the pruner deletes."""
SETTLE_SECONDS = 20.0
"""How long the workers have, once the load stops, to take up every turn with work to do."""
_TABLES = ("events", "snapshots", "requests", "leases", "audit")


class Driver:
    """The test's side: starts, answers and messages sessions, and remembers what it saw."""

    def __init__(self, rt: so.Runtime, rng: random.Random) -> None:
        self.rt, self.rng = rt, rng
        self.keys: dict[str, tuple[str, str, str]] = {}  # key -> agent, prompt, session
        self.turns: set[tuple[str, str]] = set()  # (session, turn) seen started
        self.answered: set[str] = set()
        self.refused_keys: set[str] = set()  # sessions a repeated key was refused as deleted
        self.gone_on_send = self.busy_on_send = 0
        # (session, turn) of answers told UnknownSession: applied, their turn run to its end and
        # the session pruned before `respond` read it back; checked at the end
        self.gone_on_answer: set[tuple[str, str]] = set()
        self.repeats = self.messages = self.answers = self.closed_on_answer = 0
        self.cancelled: set[tuple[str, str]] = set()  # (session, turn) the test cancelled
        self.brief: set[str] = set()  # sessions of `brief`, whose TTL may pass at any call
        self.expired = 0  # calls told a brief session expired
        self.surprises: list[str] = []
        self.ops: list[str] = []  # what it did, when: written beside the logs to read a failure

    def _turn(self, res: so.GenerateResult) -> None:
        self.ops.append(f"{time.time():.3f} {res.session_id} {res.turn_id} {res.status}")
        if res.turn_id is not None:
            self.turns.add((res.session_id, res.turn_id))

    async def start(self) -> None:
        if self.keys and self.rng.random() < 0.3:  # a client retrying a call it sent before
            key = self.rng.choice(list(self.keys))
            agent, prompt, sid = self.keys[key]
            self.repeats += 1
            try:
                res = await self.rt.generate(agent, prompt=prompt, auth=ALICE, idempotency_key=key)
            except so.SessionExpired as exc:
                self._expired(sid, exc)
                return
            except so.UnknownSession as exc:  # deleted (SessionDeleted), or as it replayed
                if exc.session_id != sid:
                    self.surprises.append(f"key {key}: refused as {exc.session_id}, not {sid}")
                self.refused_keys.add(sid)
                return
            if res.session_id != sid:
                self.surprises.append(f"key {key}: session {res.session_id}, not {sid}")
            return
        i = len(self.keys)
        what = self.rng.choice(["approve", "ask", "approve ask", "plain"])
        agent = self.rng.choices([AGENT, PARENT, BRIEF], [6, 2, 2])[0]
        prompt, key = f"order {1000 + i} {what}", f"key-{i}"
        res = await self.rt.generate(agent, prompt=prompt, auth=ALICE, idempotency_key=key)
        self.keys[key] = (agent, prompt, res.session_id)
        if agent == BRIEF:
            self.brief.add(res.session_id)
        self._turn(res)

    async def answer(self) -> None:
        """Answer what is open (on the subagent's session, not its parent's mirror): only the
        test answers or cancels, and nothing expires, so each is open until answered here or
        its turn cancelled (its own, or its parent's)."""
        for req in await self.rt.pending(limit=1000):
            if req.session_id in self.brief and req.id not in self.answered:
                if self.rng.random() < 0.5:  # left to expire with its session, for good
                    self.answered.add(req.id)
                    continue
            if req.child is not None or req.id in self.answered or self.rng.random() < 0.3:
                continue  # a mirror, answered already, or left for later
            option = (
                self.rng.choice(["yes", "no"])
                if req.kind == "question"
                else ("approve" if self.rng.random() < 0.8 else "cancel")
            )
            try:
                res = await self.rt.respond(
                    req.session_id,
                    [so.InputResponse(request_id=req.id, option_id=option)],
                    principal=ALICE,
                )
            except so.SessionExpired as exc:
                self._expired(req.session_id, exc)
                continue
            except so.UnknownSession:
                self.gone_on_answer.add((req.session_id, req.turn_id))
                continue
            except so.RequestClosed as exc:
                if req.session_id in self.brief:  # expired
                    self.expired += 1
                    continue
                if not await self._cancelled(req.session_id, req.turn_id):
                    self.surprises.append(f"answer {req.id} of {req.session_id}: {exc!r}")
                self.closed_on_answer += 1
                continue
            except so.SignoffError as exc:
                self.surprises.append(f"answer {req.id} of {req.session_id}: {exc!r}")
                continue
            self.answered.add(req.id)
            self.answers += 1
            if not res.outcomes[0].applied:
                self.surprises.append(f"answer {req.id}: not applied")

    async def message(self) -> None:
        """A message into a finished session: a new turn (parking on a question, or not)."""
        idle = await self.rt.sessions(status="idle", limit=1000)
        if not idle:
            return
        sid = self.rng.choice(idle).id
        self.ops.append(f"{time.time():.3f} send to {sid}")
        text = "park please" if self.rng.random() < 0.5 else "thanks"
        try:
            res = await self.rt.send(sid, text, principal=ALICE)
        except so.SessionExpired as exc:
            self._expired(sid, exc)
            return
        except so.UnknownSession:
            self.gone_on_send += 1  # pruned since it was listed: fine
            return
        except so.SessionBusy:
            self.busy_on_send += 1  # a subagent's its delegate call is yet to start: fine
            return
        self.messages += 1
        self._turn(res)

    def _expired(self, sid: str, exc: so.SessionExpired) -> None:
        """A call told the session expired: only a `brief` one may be."""
        if sid not in self.brief:
            self.surprises.append(f"{sid}: {exc!r}")
        self.expired += 1

    async def _cancelled(self, sid: str, turn: str) -> bool:
        """Whether the turn was cancelled since the pending list read it open (withdrawn with
        its turn, or its parent's), or its session is gone since."""
        try:
            state = await self.rt.state(sid)
        except so.UnknownSession:
            return True
        return state.turn is not None and state.turn.id == turn and state.status == "cancelled"

    async def cancel(self) -> None:
        """Cancel a live session's turn (a subagent's too), as a person changing their mind."""
        live = [
            s
            for status in ("waiting", "running")
            for s in await self.rt.sessions(status=status, limit=1000)
        ]
        live = [s for s in live if s.id not in self.brief]  # left to expire
        if not live:
            return
        sid = self.rng.choice(live).id
        self.ops.append(f"{time.time():.3f} cancel {sid}")
        try:
            res = await self.rt.cancel(sid, "changed my mind", principal=ALICE)
        except so.SessionExpired as exc:
            self._expired(sid, exc)
            return
        except so.UnknownSession:
            return  # pruned since it was listed, its turn over
        self.ops.append(f"{time.time():.3f} cancelled {sid} {res.turn_id} {res.status}")
        if res.status == "cancelled" and res.turn_id is not None:
            self.cancelled.add((sid, res.turn_id))

    async def round(self) -> None:
        try:
            if self.rng.random() < 0.6:
                await self.start()
            await self.answer()
            if self.rng.random() < 0.4:
                await self.message()
            if self.rng.random() < 0.2:
                await self.cancel()
        except so.SignoffError as exc:
            self.surprises.append(f"round: {exc!r} {traceback.format_exc()}")


def _spawn(argv: list[str], log: Path, records: Path) -> subprocess.Popen[bytes]:
    env = {
        **python_env(),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        "SIGNOFF_TEST_RECORDS": str(records),
    }
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=env, stdout=out, stderr=out)


def _wait_for(path: Path, text: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while not (path.exists() and text in path.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, path.read_text()
        time.sleep(0.05)


def _orphans(url: str) -> dict[str, int]:
    """Rows whose session row is gone, by table; subagents' sessions whose parent is gone."""
    out = {}
    for table in _TABLES:
        [(n,)] = query(
            url,
            f"SELECT COUNT(*) FROM {{t}}{table} WHERE sk IS NOT NULL "
            "AND sk NOT IN (SELECT sk FROM {t}sessions)",
        )
        out[table] = int(n)
    [(n,)] = query(
        url,
        "SELECT COUNT(*) FROM {t}sessions WHERE parent IS NOT NULL "
        "AND parent NOT IN (SELECT sk FROM {t}sessions)",
    )
    out["children"] = int(n)
    return out


def _marked(url: str) -> set[str]:
    """The ids the store keeps as deleted (a repeated key is refused for them)."""
    if url.startswith("sqlite"):
        rows = query(url, "SELECT key FROM meta WHERE key LIKE 'deleted:%'")
        return {str(k).removeprefix("deleted:") for (k,) in rows}
    return {str(k) for (k,) in query(url, "SELECT id FROM {t}deleted_sessions")}


async def _settle(rt: so.Runtime) -> list[str]:
    """Wait until no session runs (the workers took up every turn with work to do)."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        running = [s.id for s in await rt.sessions(status="running", limit=1000)]
        if not running or time.monotonic() > deadline:
            return running
        await asyncio.sleep(0.1)


def _log_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def _run(url: str, tmp: Path, kind: str) -> None:
    seed = int(os.environ.get("SIGNOFF_RETENTION_SEED") or random.randrange(2**32))
    print(
        f"\nretention seed {seed} ({kind}); replay with SIGNOFF_RETENTION_SEED={seed}; "
        f"logs in {tmp}"
    )
    rng = random.Random(seed)
    records, plog = tmp / "records.jsonl", tmp / "pruner.jsonl"
    sized = f"{url}?pool_max=10" if url.startswith("postgresql") else url
    worker = ["-m", "signoff", "worker", "tests._retention_procs:runtime", "--store", sized]
    worker += ["--concurrency", "8", "--lease-ttl", "5", "--idle-wait", "0.05"]
    logs = [tmp / f"worker-{i}.log" for i in range(2)]
    procs = [_spawn(worker, log, records) for log in logs]
    began = time.monotonic()
    try:
        for proc, log in zip(procs, logs, strict=True):
            _wait_for(log, "worker ", proc)
        pruner = _spawn(
            ["-m", "tests._retention_procs", url, str(LOAD_SECONDS), str(plog)],
            tmp / "pruner.out",
            records,
        )
        procs.append(pruner)
        _wait_for(plog, "ready", pruner)
        async with so.Runtime(make_agents(str(records)), store=url, inline=False) as rt:
            driver = Driver(rt, rng)
            end = time.monotonic() + LOAD_SECONDS
            while time.monotonic() < end:
                await driver.round()
                await asyncio.sleep(rng.uniform(0.0, 0.05))
            assert await asyncio.to_thread(pruner.wait, 30) == 0, (tmp / "pruner.out").read_text()
            running = await _settle(rt)
            for proc in procs[:2]:
                proc.send_signal(signal.SIGTERM)
            for proc in procs[:2]:
                await asyncio.to_thread(proc.wait, 30)
            took = time.monotonic() - began
            (tmp / "driver.log").write_text("\n".join(driver.ops) + "\n")

            # -- the checks, everything stopped
            assert driver.surprises == [], (seed, driver.surprises)
            assert running == [], (seed, "still running", running)
            done = _log_lines(plog)
            errors = [e for e in done if e["op"] == "error"]
            assert errors == [], (seed, errors)
            for log in logs:  # claims, parks, ends: no warning, no error, no traceback
                lines = log.read_text().splitlines()
                said = [x for x in lines if " INFO signoff." not in x]
                # All of what was said (a traceback spans lines): the logs go with the test's
                # temporary directory, which a full run removes.
                assert said == [], (seed, log.name, "\n".join(said[:80]))
            assert await rt.verify_audit() == [], seed
            assert _orphans(url) == dict.fromkeys([*_TABLES, "children"], 0), seed

            entries = await rt.audit(stream=DELETIONS_STREAM)
            erased = [d["id"] for e in entries for d in e.data["sessions"]]
            deleted = set(erased)
            assert len(erased) == len(deleted), (seed, "an id deleted twice")
            tops = {e.data["session_id"] for e in entries}
            logged = {i for e in done if e["op"] in ("prune", "delete") for i in e["ids"]}
            assert tops <= logged <= deleted, seed  # each deletion the pruner made, recorded
            [(rows,)] = query(url, "SELECT COUNT(*) FROM {t}sessions")
            alive = {str(i) for (i,) in query(url, "SELECT id FROM {t}sessions")}
            assert int(rows) == len(alive)
            assert not alive & deleted, (seed, "recreated", alive & deleted)
            assert _marked(url) >= deleted, seed
            assert driver.refused_keys <= deleted, seed

            closed = {tuple(k.split()) for w, k, _ in read_records(records) if w == "closed"}
            lost = []
            for sid, turn in sorted(driver.turns):
                if (sid, turn) in closed or (sid, turn) in driver.cancelled:
                    continue
                if sid in driver.brief:  # its TTL may have passed with the turn unfinished
                    continue
                if sid in alive:
                    state = await rt.state(sid)
                    if state.turn is not None and state.turn.id == turn:
                        if state.status == "waiting":
                            continue  # parks on a request at the end
                lost.append((sid, turn, "deleted" if sid in deleted else "there"))
            assert lost == [], (seed, "turns that never ended", lost)
            for sid, turn in driver.gone_on_answer:  # gone only once the answer's turn ended
                assert sid in deleted and (sid, turn) in closed, (seed, sid, turn)
            refusals = sum(e["op"] == "refused" for e in done)
            lapsed = sum(  # brief sessions deleted unfinished, their TTL passed
                1 for e in entries for d in e.data["sessions"] if d["id"] in driver.brief
            )
            print(
                f"retention {kind}: {len(driver.keys)} sessions started, {driver.repeats} keys "
                f"repeated ({len(driver.refused_keys)} refused as deleted), {driver.answers} "
                f"answers, {driver.messages} messages ({driver.gone_on_send} to sessions gone, "
                f"{driver.busy_on_send} refused as busy), {len(driver.cancelled)} turns "
                f"cancelled ({driver.closed_on_answer} answers found them so), "
                f"{len(driver.brief)} brief sessions ({driver.expired} calls found one expired, "
                f"{lapsed} deleted), "
                f"{len(driver.turns)} turns, {len(entries)} deletions ({len(deleted)} sessions), "
                f"{refusals} refusals, {len(alive)} sessions left; {took:.1f}s"
            )
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(params=["postgres", "sqlite"])
def load_store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """(kind, URL): a fresh PostgreSQL database, or a SQLite file every process opens."""
    if request.param == "sqlite":
        return "sqlite", f"sqlite:///{tmp_path / 'state.db'}"
    return "postgres", str(request.getfixturevalue("pg_store_url"))


async def test_prune_and_delete_under_load_lose_nothing_and_leave_nothing(
    load_store: tuple[str, str], tmp_path: Path
) -> None:
    kind, url = load_store
    await _run(url, tmp_path, kind)
