"""Chaos: three `signoff worker` processes and one `signoff serve` share one store while a killer
SIGKILLs one of them at random every few hundred milliseconds and starts it again.

Sessions whose turn needs one or two approvals and answers to a question are started over HTTP
and from Python at random moments; their requests are answered over HTTP and with `respond`,
some twice, some with a conflicting second answer, and a few sessions are cancelled. Other
sessions delegate the same work to a child agent (`so.delegate`): the child's requests are
answered on the parent's mirror, on the child, or on both; some parents are cancelled while
their child runs or waits; messages steer or queue on parents and children alike. Once the
killing stops every session must finish, and the store must show what issue 8 asks: each
approved tool ran once (again, with the same idempotency key, only in place of a run a kill
interrupted), no request lost, no answer applied twice, `seq` gap-free, the audit chain intact;
and for subagents: parent and child agree on each request's outcome and on the delegate call's
result, and no child runs or waits once its parent's turn ended. The seed
(`SIGNOFF_CHAOS_SEED` replays one), the number of kills and the subagent counts are printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx
import pytest

import signoff as so
from signoff.stores import StoredRequest

from . import _proof
from ._chaos_procs import AGENT, ALICE, CHILD, PARENT, make_agents
from ._chaos_subagents import check_subagents
from ._procs import ROOT
from ._worker_procs import check_logs, read_records
from .test_server_common import auth, free_port

CHAOS_SECONDS = 12.0
"""How long the killer runs; sessions start during its first half."""
SETTLE_SECONDS = 40.0
"""How long every session has to finish once the killing stops."""
SESSIONS = 20
PARENT_SESSIONS = 10
"""Sessions of the parent agent, each delegating to a child session."""
PARENT_CANCELS = 3
KILL_EVERY = (0.2, 0.6)
UP_AT_LEAST = 1.5
"""A process is killed only once it has run this long: one that never got past its imports
would test nothing."""
FINISHED = ("completed", "cancelled")
LIVE = ("running", "waiting")
_OTHER = {"approve": "cancel", "cancel": "approve", "yes": "no", "no": "yes"}


class Slot:
    """One long-running child (`worker` or `serve`) that the killer may SIGKILL and restart."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], tmp: Path) -> None:
        self.name, self.argv, self.env = name, argv, env
        self.log = (tmp / f"{name}.log").open("ab")
        self.proc = self._spawn()
        self.killed: list[int] = []

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.since = time.monotonic()
        argv = [sys.executable, "-m", "signoff", *self.argv]
        return subprocess.Popen(
            argv, cwd=ROOT, env=self.env, stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL
        )

    def kill_and_restart(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.killed.append(self.proc.pid)
        self.proc.wait(timeout=10)
        self.proc = self._spawn()

    def ensure_alive(self) -> None:
        if self.proc.poll() is not None:
            self.proc = self._spawn()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self.log.close()


@dataclass
class Ledger:
    """What the test process asked for and what it was told."""

    decisions: dict[str, str] = field(default_factory=dict)  # request id -> option id sent
    applied: Counter[str] = field(default_factory=Counter)  # acknowledged applied answers
    acknowledged: dict[str, so.InputRequest] = field(default_factory=dict)  # answer acknowledged
    cancelled: dict[str, str | None] = field(default_factory=dict)  # session -> turn cancelled
    messages: dict[str, bool] = field(default_factory=dict)  # text -> acknowledged
    routes: dict[str, str] = field(default_factory=dict)  # child request -> answered on
    swept: dict[str, float] = field(default_factory=dict)  # child of a cancelled parent -> when
    via: Counter[str] = field(default_factory=Counter)  # answers sent on a mirror, on a child
    beaten_by_text: set[str] = field(default_factory=set)  # refused: a message answered
    raced: set[str] = field(default_factory=set)  # answered both ways at once, mirror and child
    acked_options: dict[str, set[str]] = field(default_factory=dict)  # request -> acknowledged
    conflicts: int = 0
    duplicates: int = 0
    lost_transport: int = 0
    unavailable: int = 0
    surprises: list[str] = field(default_factory=list)


class Chaos:
    """The test process's side: starts sessions, answers, cancels, and checks replies."""

    def __init__(
        self, rng: random.Random, front: so.Runtime, http: httpx.AsyncClient, ledger: Ledger
    ) -> None:
        self.rng, self.front, self.http, self.ledger = rng, front, http, ledger
        self.started = 0
        self.cancels = self.parent_cancels = 0
        self._roots: dict[str, str] = {}  # request id -> the request it stands for

    def _http_error(self, where: str, r: httpx.Response, allowed: tuple[str, ...]) -> str | None:
        """The error code of a refused request; a code not in `allowed` is a surprise."""
        code = str(r.json().get("error", {}).get("code")) if r.content else ""
        if r.status_code == 503 and code in ("store_unavailable", "store_error"):
            self.ledger.unavailable += 1
        elif code not in allowed:
            self.ledger.surprises.append(f"{where}: HTTP {r.status_code} {r.text[:300]}")
        return code

    async def start_session(self, agent: str) -> None:
        i = self.started
        self.started += 1
        prompt = f"order {1000 + i}" + (" two" if self.rng.random() < 0.5 else "")
        try:
            if self.rng.random() < 0.5:
                r = await self.http.post("/v1/sessions", json={"agent": agent, "message": prompt})
                if r.status_code != 201:
                    self._http_error("create", r, ())
            else:
                await self.front.generate(agent, prompt=prompt, auth=ALICE)
        except httpx.TransportError:
            self.ledger.lost_transport += 1  # serve died: the session may or may not exist
        except so.StoreError as exc:
            self.ledger.surprises.append(f"create: {type(exc).__name__}: {exc}")

    async def answer(self, req: so.InputRequest, option: str, note: str) -> None:
        """Send one answer over HTTP or with `respond`; a reply must be what the rules say."""
        mine = self.ledger.decisions[_root(req)]
        self._roots[req.id] = _root(req)
        if req.child is not None or req.agent == CHILD:
            self.ledger.via["mirror" if req.child is not None else "child"] += 1
        try:
            if self.rng.random() < 0.5:
                body = {"inputResponses": [{"requestId": req.id, "optionId": option}]}
                r = await self.http.post(f"/v1/sessions/{req.session_id}/responses", json=body)
                if r.status_code == 200:
                    applied = r.json()["outcomes"][0]["applied"]
                    self._acknowledged(req, option, mine, bool(applied), note)
                    return
                code = self._http_error(note, r, ("conflicting_answer", "request_closed"))
                self._refused(req.id, option, mine, code, note)
            else:
                res = await self.front.respond(
                    req.session_id,
                    [so.InputResponse(request_id=req.id, option_id=option)],
                    principal=ALICE,
                )
                self._acknowledged(req, option, mine, res.outcomes[0].applied, note)
        except httpx.TransportError:
            self.ledger.lost_transport += 1
        except (so.ConflictingAnswer, so.RequestClosed) as exc:
            self._refused(req.id, option, mine, exc.code, note)
        except so.StoreError as exc:
            self.ledger.surprises.append(f"{note} {req.id}: {type(exc).__name__}: {exc}")

    def _acknowledged(
        self, req: so.InputRequest, option: str, mine: str, applied: bool, note: str
    ) -> None:
        rid = req.id
        self.ledger.acked_options.setdefault(_root(req), set()).add(option)
        if note == "race" and option != mine:  # it won: later answers repeat it (checked later)
            self.ledger.decisions[_root(req)] = option
        elif option != mine:
            self.ledger.surprises.append(f"{note} {rid}: a conflicting answer was accepted")
        self.ledger.acknowledged[rid] = req
        if applied:  # once for a child's request and its mirror together
            self.ledger.applied[_root(req)] += 1

    def _refused(self, rid: str, option: str, mine: str, code: str | None, note: str) -> None:
        if code == "conflicting_answer":
            if option == mine and self._roots.get(rid, rid) not in self.ledger.raced:
                # only if a message answered the question first: checked later
                self.ledger.beaten_by_text.add(rid)
            self.ledger.conflicts += 1
        # request_closed: the session was cancelled (or its turn moved on) meanwhile

    async def cancel(self, session_id: str) -> None:
        try:
            if self.rng.random() < 0.5:
                r = await self.http.post(f"/v1/sessions/{session_id}/cancel", json={})
                if r.status_code != 200:
                    self._http_error("cancel", r, ())
                    return
                status, turn_id = r.json()["status"], r.json()["turn_id"]
            else:
                res = await self.front.cancel(session_id, "chaos", principal=ALICE)
                status, turn_id = res.status, res.turn_id
        except httpx.TransportError:
            self.ledger.lost_transport += 1
            return
        except so.SignoffError as exc:
            self.ledger.surprises.append(f"cancel {session_id}: {type(exc).__name__}: {exc}")
            return
        if status == "cancelled":
            self.ledger.cancelled[session_id] = turn_id
            returned = time.time()
            with contextlib.suppress(so.StoreError):  # the children its cancelled turn delegated
                async for e in self.front.events(session_id, follow=False):
                    if e.turn_id == turn_id and e.type == "tool.step":
                        if e.data["name"] == "subagent.session":
                            self.ledger.swept[str(e.data["result"])] = returned

    async def message(self, session_id: str) -> None:
        """Send a message that names no option: it steers the turn or waits for its end."""
        text = f"note {len(self.ledger.messages)} for {session_id}"
        self.ledger.messages[text] = False
        policy: Literal["steer", "queue"] = self.rng.choice(["steer", "queue"])
        try:
            if self.rng.random() < 0.5:
                body = {"text": text, "turnPolicy": policy}
                r = await self.http.post(f"/v1/sessions/{session_id}/messages", json=body)
                if r.status_code != 200:
                    self._http_error("message", r, ())
                    return
            else:
                await self.front.send(session_id, text, principal=ALICE, turn_policy=policy)
        except httpx.TransportError:
            self.ledger.lost_transport += 1
            return
        except so.SignoffError as exc:
            self.ledger.surprises.append(f"message {session_id}: {type(exc).__name__}: {exc}")
            return
        self.ledger.messages[text] = True

    async def round(self, may_cancel: bool) -> None:
        """Answer what is pending (some twice, some in conflict); maybe cancel a session."""
        try:
            pending = await self.front.pending(limit=1000)
        except so.StoreError as exc:
            self.ledger.surprises.append(f"pending: {type(exc).__name__}: {exc}")
            return
        sends = []
        sides: dict[str, list[so.InputRequest]] = {}  # child requests and their mirrors
        for req in pending:
            root = _root(req)
            if req.child is not None or req.agent == CHILD:
                sides.setdefault(root, []).append(req)
            if req.session_id in self.ledger.swept and req.child is None:
                self.ledger.surprises.append(f"{req.id}: a child asks after its parent's cancel")
            if root not in self.ledger.decisions:
                if req.kind == "question":
                    option = self.rng.choice(["yes", "no"])
                else:
                    option = "approve" if self.rng.random() < 0.75 else "cancel"
                self.ledger.decisions[root] = option
                if req.child is not None or req.agent == CHILD:
                    self.ledger.routes[root] = self.rng.choice(["mirror", "child", "both"])
            elif self.rng.random() < 0.5:
                continue  # answered already, perhaps not yet applied: later
            route = self.ledger.routes.get(root, "both")
            side = "mirror" if req.child is not None else "child"
            if may_cancel and route not in (side, "both"):
                continue  # answered on the other side (once the killing stops: on either)
            option = self.ledger.decisions[root]
            sends.append(self.answer(req, option, "answer"))
            if self.rng.random() < 0.3:
                self.ledger.duplicates += 1
                sends.append(self.answer(req, option, "duplicate"))
        for root, reqs in sides.items():  # the other answer on one side at once: one wins
            if len(reqs) == 2 and may_cancel and self.rng.random() < 0.4:
                self.ledger.raced.add(root)
                other = _OTHER[self.ledger.decisions[root]]
                sends.append(self.answer(self.rng.choice(reqs), other, "race"))
        if self.ledger.acknowledged and self.rng.random() < 0.3:  # long after, maybe
            req = self.ledger.acknowledged[self.rng.choice(list(self.ledger.acknowledged))]
            option = self.ledger.decisions[_root(req)]
            if self.rng.random() < 0.5:
                self.ledger.duplicates += 1
                sends.append(self.answer(req, option, "late duplicate"))
            else:
                sends.append(self.answer(req, _OTHER[option], "conflict"))
        if may_cancel and self.rng.random() < 0.08:
            sessions = await self.front.sessions(limit=1000)
            if sessions:
                sends.append(self.message(self.rng.choice(sessions).id))
        if may_cancel and self.rng.random() < 0.08:  # a parent or a child, running or waiting
            agent = self.rng.choice([PARENT, CHILD])
            live = [
                s for s in await self.front.sessions(agent=agent, limit=1000) if s.status in LIVE
            ]
            if live:
                sends.append(self.message(self.rng.choice(live).id))
        self.rng.shuffle(sends)
        await asyncio.gather(*sends)
        if may_cancel and pending and self.rng.random() < 0.04 and self.cancels < 3:
            self.cancels += 1
            await self.cancel(self.rng.choice(pending).session_id)
        if may_cancel and self.rng.random() < 0.05 and self.parent_cancels < PARENT_CANCELS:
            live = [
                s for s in await self.front.sessions(agent=PARENT, limit=1000) if s.status in LIVE
            ]
            if live:  # its child runs its turn or waits on a person
                self.parent_cancels += 1
                await self.cancel(self.rng.choice(live).id)


async def _killer(rng: random.Random, slots: list[Slot], stop: asyncio.Event) -> int:
    kills = 0
    while not stop.is_set():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), rng.uniform(*KILL_EVERY))
        if stop.is_set():
            break
        ripe = [s for s in slots if time.monotonic() - s.since >= UP_AT_LEAST]
        if ripe:
            await asyncio.to_thread(rng.choice(ripe).kill_and_restart)
            kills += 1
    return kills


def _slots(url: str, tmp: Path, records: Path, port: int) -> list[Slot]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        "SIGNOFF_TEST_RECORDS": str(records),
    }
    target = "tests._chaos_procs:runtime"
    sized = f"{url}?pool_max=12" if url.startswith("postgresql") else url
    worker = ["worker", target, "--store", sized, "--concurrency", "8", "--lease-ttl", "2"]
    worker += ["--idle-wait", "0.1", "--sweep-every", "60"]
    serve = ["serve", target, "--port", str(port), "--store", url, "--workers", "2"]
    serve += ["--token", "alice-token=alice"]
    slots = [Slot(f"worker-{i}", worker, env, tmp) for i in range(3)]
    return [*slots, Slot("serve", serve, env, tmp)]


async def _wait_for_http(http: httpx.AsyncClient) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError):
            if (await http.get("/v1/requests")).status_code == 200:
                return
        await asyncio.sleep(0.1)
    raise AssertionError("signoff serve did not come up")


async def _all_finished(front: so.Runtime) -> list[str]:
    """The sessions not yet finished (idle after a completed or cancelled turn)."""
    out = []
    for s in await front.sessions(limit=1000):
        state = await front.state(s.id)
        turn = state.turn
        if turn is None and state.parent is not None and await _ended(front, state.parent):
            continue  # a child created as its parent's turn was cancelled: it never started
        if turn is None or turn.status not in FINISHED or state.status not in ("idle", "cancelled"):
            out.append(f"{s.id}: {state.status}/{turn.status if turn else None}")
    return out


async def _ended(front: so.Runtime, session_id: str) -> bool:
    """Whether the session's turn completed or was cancelled."""
    turn = (await front.state(session_id)).turn
    return turn is not None and turn.status in FINISHED


async def _run(url: str, tmp: Path, kind: str) -> None:
    seed = int(os.environ.get("SIGNOFF_CHAOS_SEED") or random.randrange(2**32))
    print(f"\nchaos seed {seed} ({kind}); replay with SIGNOFF_CHAOS_SEED={seed}")
    rng = random.Random(seed)
    records = tmp / "runs.jsonl"
    port = free_port()
    slots = _slots(url, tmp, records, port)
    ledger = Ledger()
    kills = 0
    try:
        front = so.Runtime(make_agents(str(records)), store=url, inline=False)
        base = f"http://127.0.0.1:{port}"
        async with (
            front,
            httpx.AsyncClient(base_url=base, headers=auth("alice-token"), timeout=20) as http,
        ):
            await _wait_for_http(http)
            chaos = Chaos(rng, front, http, ledger)
            stop = asyncio.Event()
            killing = asyncio.create_task(_killer(rng, slots, stop))
            began = time.monotonic()
            agents = [AGENT] * SESSIONS + [PARENT] * PARENT_SESSIONS
            starts = sorted((rng.uniform(0, CHAOS_SECONDS / 2), a) for a in agents)
            while time.monotonic() - began < CHAOS_SECONDS:
                while starts and time.monotonic() - began >= starts[0][0]:
                    await chaos.start_session(starts.pop(0)[1])
                await chaos.round(may_cancel=True)
                await asyncio.sleep(rng.uniform(0.0, 0.1))
            stop.set()
            kills = await killing
            for slot in slots:
                slot.ensure_alive()
            deadline = time.monotonic() + SETTLE_SECONDS
            while unfinished := await _all_finished(front):
                assert time.monotonic() < deadline, (seed, unfinished, _tails(slots))
                await chaos.round(may_cancel=False)
                await asyncio.sleep(0.1)
            killed = {pid for slot in slots for pid in slot.killed}
            print(
                f"chaos {kind}: {kills} kills, {chaos.started} sessions started, "
                f"{len(ledger.decisions)} requests, {ledger.duplicates} duplicates, "
                f"{ledger.conflicts} conflicts refused, {len(ledger.cancelled)} cancels, "
                f"{sum(ledger.messages.values())} messages, "
                f"{ledger.lost_transport} replies lost with serve, {ledger.unavailable} 503s"
            )
            sides: dict[str, set[bool]] = {}
            for req in ledger.acknowledged.values():
                sides.setdefault(_root(req), set()).add(req.child is None)
            print(
                f"chaos {kind} subagents: {PARENT_SESSIONS} parents, "
                f"{len(await front.sessions(agent=CHILD, limit=1000))} children, "
                f"{len(ledger.routes)} child requests, {ledger.via['mirror']} answers on a "
                f"mirror, {ledger.via['child']} on a child, "
                f"{sum(len(v) == 2 for v in sides.values())} acknowledged on both, "
                f"{len(ledger.raced)} raced both ways, "
                f"{chaos.parent_cancels} parents cancelled ({len(ledger.swept)} children swept)"
            )
            _proof.record("chaos:kills", kills)
            _proof.record(f"chaos:{kind}:kills", kills)
            assert ledger.surprises == [], (seed, ledger.surprises)
            reruns = await _check(front, url, records, killed, ledger, seed)
            print(f"chaos {kind}: {reruns} tool bodies ran again after a kill (same key)")
    finally:
        for slot in slots:
            slot.close()


def _tails(slots: list[Slot]) -> str:
    out = []
    for slot in slots:
        slot.log.flush()
        text = Path(slot.log.name).read_text(errors="replace")
        out.append(f"--- {slot.name}\n{text[-3000:]}")
    return "\n".join(out)


async def _check(
    front: so.Runtime, url: str, records: Path, killed: set[int], ledger: Ledger, seed: int
) -> int:
    """The invariants of issue 8, read from the store and the tools' records; returns how many
    bodies ran again after a kill interrupted them."""
    heads = check_logs(url)  # every session's seq is 1..head: no gap, no fork
    sessions = await front.sessions(limit=1000)
    assert sorted(s.id for s in sessions) == sorted(heads)
    runs: dict[str, list[tuple[str, int]]] = {}
    for what, key, pid in read_records(records):
        runs.setdefault(key, []).append((what, pid))
    must_run: set[str] = set()  # keys of calls whose result says their body ran
    acked_roots = {_root(req) for req in ledger.acknowledged.values()}
    for s in sessions:
        events = [e async for e in front.events(s.id, follow=False)]
        requested = [r for e in events if e.type == "input.requested" for r in e.data["requests"]]
        resolved = Counter(e.data["request_id"] for e in events if e.type == "input.resolved")
        settled = Counter(e.data["request_id"] for e in events if e.type == "approval.settled")
        keys = {
            (e.turn_id, e.data["call_id"]): e.data["idempotency_key"]
            for e in events
            if e.type == "tool.started"
        }
        for r in requested:
            rid = r["id"]
            root = r["child"]["request_id"] if r.get("child") else rid
            assert resolved[rid] == 1, (seed, s.id, rid, "lost or resolved twice")
            assert settled[rid] <= 1, (seed, s.id, rid, "applied twice")
            assert ledger.applied[root] <= 1, (seed, rid, "two answers were told applied")
            row, chosen = await _closed(front, rid, seed)
            # An acknowledged answer is the one that counts: on the child's request, and on a
            # mirror unless a steer or cancel of the parent withdrew that first.
            if root in acked_roots and (rid == root or row.status != "withdrawn"):
                assert row.status == "settled" and chosen == ledger.decisions[root], (
                    seed,
                    rid,
                    row.status,
                    row.resolution,
                )
            if rid != root:  # a mirror: settled as the child's request was
                child_row, child_chosen = await _closed(front, root, seed)
                if row.status == "settled":
                    assert (row.outcome, chosen) == (child_row.outcome, child_chosen), (
                        seed,
                        rid,
                        row,
                        child_row,
                    )
                    assert child_row.status == "settled", (seed, rid, row, child_row)
                # Withdrawn by a steer or cancel of the parent, the child's request with it
                # (or answered on the child just before: the call's result says, see below).
                continue
            if r["kind"] == "tool-approval" and chosen != "approve":
                key = f"{s.id}:{_turn_number(events, r['turn_id'])}:{r['action']['call_id']}"
                assert key not in runs, (seed, key, "a call not approved ran", runs[key])
        completed = [e for e in events if e.type == "tool.completed"]
        per_call = Counter((e.turn_id, e.data["call_id"]) for e in completed)
        assert set(per_call.values()) <= {1}, (seed, s.id, per_call)
        for e in completed:
            if e.data["status"] == "ok" and e.data["tool_name"] in ("refund", "ship"):
                must_run.add(keys[(e.turn_id, e.data["call_id"])])
        for e in events:
            if e.type == "tool.step" and e.data["name"] == "quote":
                key = keys[(e.turn_id, e.data["call_id"])]
                must_run.add(f"{key}:{e.data['name']}")
        delivered = Counter(
            str(e.data.get("message"))
            for e in events
            if (e.type == "turn.message" and not e.data.get("queued")) or e.type == "turn.started"
        )
        # A message sent while `plan` asks its question is the answer (the question takes free
        # text): it is delivered as that answer.
        delivered.update(
            str(e.data["answer"].get("text"))
            for e in events
            if e.type == "input.resolved" and isinstance(e.data.get("answer"), dict)
        )
        for text, acked in ledger.messages.items():
            if text.endswith(f" for {s.id}"):
                # An acknowledged message exactly once; one whose reply was lost at most once.
                want = 1 if acked else delivered[text]
                assert delivered[text] == want <= 1, (seed, text, acked, delivered[text])
        state = await front.state(s.id)
        assert state.queued == [], (seed, s.id, state.queued)
        if s.id in ledger.cancelled:  # later messages may have started turns since
            ended = [e.turn_id for e in events if e.type == "turn.cancelled"]
            assert ledger.cancelled[s.id] in ended, (seed, s.id, ended)
    assert await front.verify_audit() == [], seed
    assert await front.pending(limit=1000) == []
    await check_subagents(front, sessions, ledger.swept, seed)
    for root, options in ledger.acked_options.items():  # mirror and child told the same
        assert len(options) == 1, (seed, root, options)
    for rid in ledger.beaten_by_text:  # a message sent while the question was open answered it
        row, chosen = await _closed(front, rid, seed)
        said = ((row.resolution or {}).get("answer") or {}).get("text")
        assert chosen is None and said in ledger.messages, (seed, rid, "the same answer refused")
    for key in must_run:
        assert any(what == "done" for what, _ in runs.get(key, [])), (seed, key, "never ran")
    # Each body ran once; more only in place of runs a SIGKILL interrupted (same key).
    reruns = 0
    for key, entries in runs.items():
        starts = [pid for what, pid in entries if what == "start"]
        done = [pid for what, pid in entries if what == "done"]
        assert all(pid in killed for pid in starts[:-1]), (seed, key, entries, killed)
        assert len([p for p in done if p not in killed]) <= 1, (seed, key, entries)
        reruns += len(starts) - 1
    return reruns


async def _closed(front: so.Runtime, rid: str, seed: int) -> tuple[StoredRequest, str | None]:
    """The request's stored row, which must be closed, and the option it was closed with."""
    row = await front.store.get_request(rid)
    assert row is not None and row.status != "pending", (seed, rid, row)
    resolution = row.resolution or {}
    chosen = resolution.get("decision") or (resolution.get("answer") or {}).get("option_id")
    return row, chosen


def _root(req: so.InputRequest) -> str:
    """The request a mirror stands for (the child's); a request that is no mirror itself."""
    return req.id if req.child is None else req.child.request_id


def _turn_number(events: list[so.Event], turn_id: str) -> int:
    """The 1-based number of the turn `turn_id` in the session (as in idempotency keys)."""
    turns = [e.turn_id for e in events if e.type == "turn.started"]
    return turns.index(turn_id) + 1


@pytest.fixture(params=["postgres", "sqlite"])
def chaos_store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """(kind, URL): a fresh PostgreSQL database, or a SQLite file every process opens."""
    if request.param == "sqlite":
        return "sqlite", f"sqlite:///{tmp_path / 'state.db'}"
    return "postgres", str(request.getfixturevalue("pg_store_url"))


async def test_workers_and_serve_killed_at_random_lose_and_repeat_nothing(
    chaos_store: tuple[str, str], tmp_path: Path
) -> None:
    kind, url = chaos_store
    await _run(url, tmp_path, kind)
