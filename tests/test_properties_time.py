"""Property tests over time: a Hypothesis state machine that moves a `ManualClock`.

The machine drives a runtime on one SQLite file whose tools wait on people with deadlines
(deny, approve or escalate on timeout), a two-person quorum and a response policy, in sessions
with a TTL: it advances the clock (to a deadline or a TTL exactly, too), answers as several
principals, sweeps, lists, cancels and restarts, and checks after every step, from the event
logs and the store, that time is honoured: nothing is settled by a person after its deadline,
an on-timeout action is applied once, a quorum counts distinct eligible people, and a session
past its TTL records nothing more.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import signoff as so
from signoff._deadlines import TIMED_OUT, is_due
from signoff._types import Message
from signoff.stores import PendingFilter
from signoff.testing import ManualClock, call, call_tools, reply

from . import _proof

T = TypeVar("T")

AGENT = "desk"
TTL = 200.0
EXPIRED = "session expired"
TOOLS = ("pay", "ship", "deploy", "wire", "note")
ALICE = so.Principal(authenticator="sso", principal_id="alice")  # starts every session
BOB = so.Principal(authenticator="sso", principal_id="bob")
CAROL = so.Principal(authenticator="sso", principal_id="carol")
ALICE_LOCAL = so.Principal(authenticator="local", principal_id="alice")  # alice, elsewhere
FIONA = so.Principal(authenticator="sso", principal_id="fiona", attributes={"groups": ["finance"]})
PEOPLE: dict[str, so.Principal | None] = {
    "alice": ALICE,
    "alice@local": ALICE_LOCAL,
    "bob": BOB,
    "carol": CAROL,
    "fiona": FIONA,
    "nobody": None,
}
# tool -> (expires_in, on_timeout); `note` asks nobody.
DEADLINES = {"pay": (60.0, "deny"), "ship": (90.0, "approve"), "deploy": (120.0, "deny")}
DEADLINES["wire"] = (60.0, "escalate")
STEPS = [0.5, 1.0, 30.0, 59.0, 60.0, 61.0, 119.0, 120.0, 199.0, 200.0, 201.0, 400.0]


@dataclass
class Runs:
    """How many times each tool body ran, by idempotency key."""

    count: Counter[str] = field(default_factory=Counter)
    where: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> session, call id


@dataclass
class Slow:
    """Seconds the response policy takes (it moves the clock while it decides)."""

    seconds: float = 0.0


def make_agent(runs: Runs, clock: ManualClock, slow: Slow) -> so.Agent:
    def ran(ctx: so.ToolContext) -> dict[str, str]:
        key = ctx.idempotency_key()
        runs.count[key] += 1
        runs.where[key] = (ctx.session.id, ctx.call_id)
        return {"ran": ctx.tool_name}

    @so.tool(approval=so.always(expires_in=60))
    async def pay(ctx: so.ToolContext, order: str) -> dict[str, str]:
        """Pay an invoice."""
        return ran(ctx)

    @so.tool(approval=so.always(expires_in=90, on_timeout="approve"))
    async def ship(ctx: so.ToolContext, order: str) -> dict[str, str]:
        """Ship an order."""
        return ran(ctx)

    @so.tool(approval=so.always(approvers=2, exclude_requester=True, expires_in=120))
    async def deploy(ctx: so.ToolContext, order: str) -> dict[str, str]:
        """Deploy a release."""
        return ran(ctx)

    async def finance(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
        """The requester may answer; once escalated, members of the group may too."""
        clock.advance(slow.seconds)  # a slow policy: the deadline may pass while it decides
        who = ctx.response.principal
        if who is not None and who.same_as(ctx.request.principal):
            return so.Allowed()
        group = ctx.request.escalated_to
        if group is not None and who is not None and group in who.attributes.get("groups", []):
            return so.Allowed()
        return so.Rejected("not the requester nor in the group it was escalated to")

    spec = so.ApprovalSpec(
        request=so.always(),
        response=finance,
        expires_in=60,
        on_timeout="escalate",
        escalate_to="finance",
    )

    @so.tool(approval=spec)
    async def wire(ctx: so.ToolContext, order: str) -> dict[str, str]:
        """Wire money."""
        return ran(ctx)

    @so.tool
    async def note(ctx: so.ToolContext, order: str) -> dict[str, str]:
        """Write a note."""
        return ran(ctx)

    def brain(messages: list[Message]) -> so.ModelResponse:
        last = messages[-1]
        if isinstance(last, so.UserMessage):
            turn = sum(isinstance(m, so.UserMessage) for m in messages)
            if not last.text.startswith("plan:"):
                return reply("noted")
            plan = last.text.split(":", 1)[1].split()
            calls = [call(n, id=f"t{turn}c{i}", order=str(turn)) for i, n in enumerate(plan)]
            return call_tools(*calls) if calls else reply("nothing to do")
        return reply("done")

    return so.Agent(
        name=AGENT,
        model=so.models.Scripted([brain], repeat_last=True),
        tools=[pay, ship, deploy, wire, note],
        limits=so.Limits(ttl=TTL),
    )


def prompt(plan: list[str]) -> str:
    return "plan:" + " ".join(plan)


@dataclass
class Request:
    """What the machine knows of a request: where it is, which tool asked."""

    id: str
    session_id: str
    tool: str


class ClockMachine(RuleBasedStateMachine):
    """Random interleavings of time, answers, sweeps, listings and restarts; the event logs and
    the store are checked after every step."""

    def __init__(self) -> None:
        super().__init__()
        _proof.record("hypothesis:test_clock_machine:examples")
        self.dir = tempfile.mkdtemp(prefix="signoff-time-")
        self.loop = asyncio.new_event_loop()
        self.clock = ManualClock()
        self.slow = Slow()
        self.runs = Runs()
        self.agent = make_agent(self.runs, self.clock, self.slow)
        self.rt = self.open_runtime()
        self.other = self.open_runtime()  # another process on the same file, never restarted
        self.sessions: list[str] = []
        self.requests: dict[str, Request] = {}
        self.logs: dict[str, list[dict[str, Any]]] = {}
        self.expired_seen: set[str] = set()

    # -- plumbing ---------------------------------------------------------------------------

    def open_runtime(self) -> so.Runtime:
        return so.Runtime([self.agent], store=f"sqlite:///{self.dir}/state.db", clock=self.clock)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def step(self) -> None:
        _proof.record("hypothesis:test_clock_machine:steps")

    def teardown(self) -> None:
        try:
            self.loop.run_until_complete(self.rt.close())
            self.loop.run_until_complete(self.other.close())
        finally:
            self.loop.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    async def _events(self, sid: str) -> list[dict[str, Any]]:
        return [e.to_dict() async for e in self.rt.events(sid, follow=False)]

    async def _store_view(self) -> Any:
        """Everything stored, read without applying any deadline or TTL."""
        events = {sid: await self._events(sid) for sid in self.sessions}
        every = await self.rt.store.pending(PendingFilter(status=None, limit=10_000))
        rows = [(r.id, r.status) for r in every]
        summaries = await self.rt.store.sessions(limit=10_000)
        return events, sorted(rows), sorted((s.id, s.status, s.head) for s in summaries)

    def unchanged(self, before: Any, what: str) -> None:
        assert self.run(self._store_view()) == before, f"{what} changed the store"

    def state(self, sid: str) -> so.SessionState:
        # The fold of the log, observed without recording anything: the public `rt.state`
        # records a passed TTL first (tests/test_session_status.py), which would make the
        # model's observations change the store between its steps.
        return self.run(self.rt._state(sid))

    def learn(self, result: so.GenerateResult) -> None:
        for req in result.pending:
            if req.id not in self.requests:
                assert req.tool_name in DEADLINES, req
                self.requests[req.id] = Request(req.id, req.session_id, req.tool_name)
        self.learn_session(result.session_id)

    def learn_session(self, sid: str) -> None:
        for r in self.state(sid).pending_requests():
            if r.id not in self.requests:
                assert r.tool_name is not None
                self.requests[r.id] = Request(r.id, sid, r.tool_name)

    def nothing_due(self, sid: str) -> bool:
        """Whether no deadline or TTL of the session waits to be recorded at this moment, nor
        work an expiry already recorded left to its turn (a denied call's result: `running`)."""
        state = self.state(sid)
        now = self.clock.now
        if state.status == "running":  # nothing runs between the rules: that work waits
            return False
        if state.expired(now):
            return state.lapsed or not state.pending_requests()
        return not any(is_due(r, now) for r in state.pending_requests())

    # -- rules: sessions and messages -------------------------------------------------------

    plans = st.lists(st.sampled_from(TOOLS), max_size=3)

    @initialize(plan=plans)
    def first_session(self, plan: list[str]) -> None:
        self.new_session(plan)

    @rule(plan=plans)
    def new_session(self, plan: list[str]) -> None:
        self.step()
        result = self.run(self.rt.generate(AGENT, prompt=prompt(plan), auth=ALICE))
        self.sessions.append(result.session_id)
        self.learn(result)
        assert result.status in ("waiting", "completed"), result

    @precondition(lambda self: self.sessions)
    @rule(i=st.integers(0, 99), plan=plans, how=st.sampled_from(["generate", "send"]))
    def new_message(self, i: int, plan: list[str], how: str) -> None:
        """A message to a live session starts a turn (or steers the one waiting); one to an
        expired session is refused as `SessionExpired` and changes nothing once recorded."""
        self.step()
        sid = self.sessions[i % len(self.sessions)]
        state = self.state(sid)
        now = self.clock.now
        if state.expired(now):
            if how == "generate":
                call_ = self.rt.generate(session_id=sid, prompt=prompt(plan), auth=ALICE)
            else:
                call_ = self.rt.send(sid, prompt(plan), principal=ALICE)
            settled = self.nothing_due(sid)
            before = self.run(self._store_view())
            with pytest.raises(so.SessionExpired):
                self.run(call_)
            if settled:
                self.unchanged(before, "a message to an expired session")
            return
        if how == "send":
            result = self.run(self.rt.send(sid, prompt(plan), principal=ALICE))
        else:
            try:
                result = self.run(self.rt.generate(session_id=sid, prompt=prompt(plan), auth=ALICE))
            except so.PartialAnswer:
                # Still held on people (after any deadline that passed was applied).
                assert self.state(sid).pending_requests()
                return
        self.learn(result)

    # -- rules: time ------------------------------------------------------------------------

    @rule(seconds=st.sampled_from(STEPS))
    def advance(self, seconds: float) -> None:
        self.step()
        self.clock.advance(seconds)

    @precondition(lambda self: self.sessions)
    @rule(i=st.integers(0, 99), offset=st.sampled_from([0.0, -0.001, 0.001]))
    def advance_to_an_edge(self, i: int, offset: float) -> None:
        """Move the clock to a coming deadline or TTL: exactly, just before or just after."""
        self.step()
        now = self.clock.now
        edges = []
        for sid in self.sessions:
            state = self.state(sid)
            if state.expires_at is not None and state.expires_at > now and not state.lapsed:
                edges.append(state.expires_at)
            edges += [
                r.expires_at
                for r in state.pending_requests()
                if r.expires_at is not None and r.expires_at > now
            ]
        if not edges:
            return
        target = sorted(edges)[i % len(edges)] + offset
        if target > now:
            self.clock.advance(target - now)

    @rule()
    def sweep(self) -> None:
        """`expire_due()` applies every passed deadline and records every lapsed TTL."""
        self.step()
        self.run(self.rt.expire_due())
        now = self.clock.now
        for sid in self.sessions:
            self.learn_session(sid)
            state = self.state(sid)
            due = [r.id for r in state.pending_requests() if is_due(r, now)]
            assert due == [], f"a sweep left passed deadlines: {due}"
            if state.expired(now):
                assert not state.pending_requests(), "a sweep left an expired session's requests"
                assert state.status not in ("running", "waiting"), state.status

    @precondition(lambda self: self.sessions)
    @rule()
    def restart(self) -> None:
        self.step()
        self.run(self.rt.close())
        self.rt = self.open_runtime()

    # -- rules: reading the queue and the sessions --------------------------------------------

    @rule()
    def list_pending(self) -> None:
        """The queue never offers what can no longer be answered, and offers all the rest."""
        self.step()
        shown = self.run(self.rt.pending(limit=10_000))
        now = self.clock.now
        for r in shown:
            assert r.expires_at is None or r.expires_at > now, f"{r.id} is past its deadline"
            assert not self.state(r.session_id).expired(now), f"{r.id}'s session expired"
        should = {
            r.id
            for sid in self.sessions
            if not (state := self.state(sid)).expired(now)
            for r in state.pending_requests()
            if not is_due(r, now)
        }
        assert {r.id for r in shown} == should
        for sid in self.sessions:
            self.learn_session(sid)

    @rule()
    def list_sessions(self) -> None:
        """A session whose TTL passed with its turn unfinished is never listed as running or
        waiting: nobody can take its turn on."""
        self.step()
        now = self.clock.now
        for row in self.run(self.rt.sessions(limit=10_000)):
            state = self.state(row.id)
            if state.expired(now):
                assert row.status not in ("running", "waiting"), (row, state.status)
                assert row.expires_at is not None and row.expires_at <= now, row
            else:
                assert row.status == state.status, (row, state.status)

    # -- rules: answers ---------------------------------------------------------------------

    @precondition(lambda self: self.requests)
    @rule(
        i=st.integers(0, 999),
        who=st.sampled_from(list(PEOPLE)),
        approve=st.booleans(),
        slow=st.sampled_from([0.0, 0.0, 0.0, 30.0, 61.0]),
        elsewhere=st.booleans(),
    )
    def answer(self, i: int, who: str, approve: bool, slow: float, elsewhere: bool) -> None:
        """Answer any request (open or closed) as anyone; what is refused is refused by name,
        and once nothing is left to record for the session's time, it changes nothing."""
        self.step()
        req = list(self.requests.values())[i % len(self.requests)]
        sid = req.session_id
        principal = PEOPLE[who]
        option = "approve" if approve else "cancel"
        response = [so.InputResponse(request_id=req.id, option_id=option)]
        now = self.clock.now
        state = self.state(sid)
        live = state.requests.get(req.id)
        if live is not None:
            status, asked = live.status, live.request  # the cached state moves on in place
        else:  # asked in an earlier turn: only the store keeps it
            stored = self.run(self.rt.store.get_request(req.id))
            assert stored is not None and stored.status != "pending", stored
            status, asked = stored.status, stored.request
        expired = state.expired(now)
        settled = self.nothing_due(sid)
        before = self.run(self._store_view())
        self.slow.seconds = slow
        try:
            rt = self.other if elsewhere else self.rt
            result = self.run(rt.respond(sid, response, principal=principal))
        except so.SessionExpired:
            assert expired, "a live session was refused as expired"
            if settled:
                self.unchanged(before, "an answer to an expired session")
            return
        except so.RequestClosed:
            assert status != "pending" or is_due(asked, now), (status, asked)
            if status != "pending" and settled:
                self.unchanged(before, "an answer to a closed request")
            return
        except so.ConflictingAnswer:
            assert status == "settled", status
            if settled:
                self.unchanged(before, "a conflicting answer")
            return
        except so.NotAllowed:
            assert status == "pending", status
            if settled:
                self.unchanged(before, "an answer from someone not allowed")
            return
        finally:
            self.slow.seconds = 0.0
        self.learn(result)
        assert not expired, "an expired session took an answer"
        (outcome,) = result.outcomes
        if status != "pending":
            assert not outcome.applied, outcome  # a repeat is a no-op
            if settled:
                self.unchanged(before, "a repeated answer")
            return
        assert not is_due(asked, now) or asked.on_timeout == "escalate", asked
        if req.tool in ("pay", "ship"):
            assert principal is ALICE, f"{who} settled {req.tool}, asked by alice"
        if req.tool == "deploy":
            assert principal not in (ALICE, ALICE_LOCAL, None), f"{who} counted toward deploy"

    @precondition(lambda self: self.sessions)
    @rule(i=st.integers(0, 99), who=st.sampled_from(["alice", "bob"]))
    def cancel(self, i: int, who: str) -> None:
        """Cancelling a live session's turn withdraws its requests; an expired session stays
        expired whatever is asked of it."""
        self.step()
        sid = self.sessions[i % len(self.sessions)]
        now = self.clock.now
        expired = self.state(sid).expired(now)
        settled = self.nothing_due(sid)
        before = self.run(self._store_view())
        try:
            result = self.run(self.rt.cancel(sid, reason="stop", principal=PEOPLE[who]))
        except so.SessionExpired:
            assert expired, "a live session was refused as expired"
            if settled:
                self.unchanged(before, "cancelling an expired session")
            return
        if expired and settled:
            self.unchanged(before, "cancelling an expired session")
        assert result.pending == [] or expired

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def logs_are_gap_free_and_append_only(self) -> None:
        for sid in self.sessions:
            log = self.run(self._events(sid))
            assert [e["seq"] for e in log] == list(range(1, len(log) + 1)), sid
            known = self.logs.get(sid, [])
            assert log[: len(known)] == known, "the log was rewritten"
            self.logs[sid] = log
            assert self.state(sid).seq == len(log)

    @invariant()
    def nothing_is_recorded_past_a_ttl_but_the_expiry(self) -> None:
        """A session past its TTL takes no event but the record of its expiry, and stays
        expired: every surface (its state, the store's row) says so from then on."""
        now = self.clock.now
        for sid in self.sessions:
            log = self.run(self._events(sid))
            lapsed_at = None
            for prev, e in zip(log, log[1:], strict=False):
                if lapsed_at is not None:
                    assert e["at"] == lapsed_at and _expiry(e), f"{sid}: {e['type']} after expiry"
                elif e["at"] >= prev["at"] + TTL:
                    assert _expiry(e), f"{sid}: {e['type']} recorded {e['at'] - prev['at']}s on"
                    lapsed_at = e["at"]
                elif _expiry(e):
                    raise AssertionError(f"{sid} recorded as expired before its TTL passed")
            state = self.state(sid)
            if sid in self.expired_seen:
                assert state.expired(now), f"{sid} expired, then came back to life"
            if state.expired(now):
                self.expired_seen.add(sid)
        rows = {s.id: s for s in self.run(self.rt.store.sessions(limit=10_000))}
        for sid in self.sessions:
            state, row = self.state(sid), rows[sid]
            stored_expired = row.expires_at is not None and row.expires_at <= now
            assert stored_expired == state.expired(now), (sid, row, state.expires_at)
            if state.lapsed:
                assert row.status == "failed", row

    @invariant()
    def the_store_queue_is_the_logs_open_requests(self) -> None:
        rows = self.run(self.rt.store.pending(PendingFilter(limit=10_000)))
        logged = {r.id for sid in self.sessions for r in self.state(sid).pending_requests()}
        assert {r.id for r in rows} == logged

    @invariant()
    def time_is_honoured_by_every_request(self) -> None:
        for sid in self.sessions:
            check_requests(self.run(self._events(sid)))

    @invariant()
    def approved_calls_ran_once_and_refused_ones_never(self) -> None:
        assert set(self.runs.count.values()) <= {1}, f"a tool body ran twice: {self.runs.count}"
        ran = {(sid, cid) for sid, cid in self.runs.where.values()}
        for sid in self.sessions:
            log = self.run(self._events(sid))
            approved = set()
            for e in log:
                d = e["data"]
                if e["type"] == "approval.settled" and d["decision"] == "approve":
                    approved.add(d["call_id"])
                if e["type"] == "model.completed":
                    approved |= {c["id"] for c in d.get("tool_calls", []) if c["name"] == "note"}
            for rsid, cid in ran:
                if rsid == sid:
                    assert cid in approved, f"{cid} ran without an approval"

    @invariant()
    def the_audit_verifies(self) -> None:
        assert self.run(self.rt.verify_audit()) == []


def _expiry(e: dict[str, Any]) -> bool:
    """Whether `e` records a session's TTL passing."""
    return e["type"] in ("input.resolved", "turn.failed") and e["data"].get("reason") == EXPIRED


def check_requests(log: list[dict[str, Any]]) -> None:
    """Walk one session's log: every request is decided by a person only before its deadline
    (or after its escalation, by the group), its on-timeout action is applied at most once and
    only once the deadline passed, and a quorum counts distinct eligible people."""
    asked: dict[str, dict[str, Any]] = {}
    escalated: dict[str, float] = {}
    votes: dict[str, list[str]] = {}
    resolved: dict[str, dict[str, Any]] = {}
    auto: set[str] = set()
    for e in log:
        d, at = e["data"], e["at"]
        if e["type"] == "input.requested":  # a request's defaults are left out of its data
            for r in d["requests"]:
                asked[r["id"]] = {"on_timeout": "deny", **r}
                votes[r["id"]] = []
            continue
        rid = d.get("request_id")
        if rid is None or rid not in asked:
            continue
        r = asked[rid]
        deadline = None if rid in escalated else r.get("expires_at")
        tool = (r.get("action") or {}).get("tool_name")
        if e["type"] == "approval.candidate":
            outcome = d["outcome"]
            if outcome in ("pending", "rejected", "stale", "failed", "timed-out"):
                continue
            assert rid not in resolved, f"{rid}: {outcome} after it closed"
            if outcome == "escalated":
                assert rid not in escalated and r["on_timeout"] == "escalate", d
                assert deadline is not None and at >= deadline, (at, deadline)
                escalated[rid] = at
                continue
            assert outcome == "counted", d
            assert deadline is None or at < deadline, f"{rid}: a vote counted after the deadline"
            who = d["by"]["principal_id"]
            assert who not in votes[rid], f"{rid}: {who} counted twice"
            assert who != "alice", f"{rid}: the requester counted"
            votes[rid].append(who)
        elif e["type"] == "approval.settled":
            assert rid not in resolved, f"{rid}: settled after it closed"
            if d.get("auto") == "timeout":
                assert d["by"] is None and r["on_timeout"] == "approve", d
                assert deadline is not None and at >= deadline, (at, deadline)
                assert rid not in auto, f"{rid}: approved twice on timeout"
                auto.add(rid)
                continue
            assert deadline is None or at < deadline, f"{rid}: settled by a person at {at}"
            who = (d.get("by") or {}).get("principal_id")
            if tool in ("pay", "ship"):
                assert who == "alice", d
            elif tool == "deploy":
                assert who not in (None, "alice"), d
                if d["decision"] == "approve":
                    by = d["approved_by"]
                    assert len(by) == 2 and len(set(by)) == 2 and "alice" not in by, d
            elif tool == "wire":
                assert who == "alice" or (who == "fiona" and rid in escalated), d
        elif e["type"] == "input.resolved":
            assert rid not in resolved, f"{rid} resolved twice"
            resolved[rid] = d
            if d["outcome"] != "expired":
                continue
            if d.get("reason") == EXPIRED:
                continue  # the session's TTL: checked with the log's times
            assert d.get("reason") == TIMED_OUT, d
            assert r["on_timeout"] in ("deny", "approve") and rid not in escalated, d
            assert deadline is not None and at >= deadline, (at, deadline)
            assert (rid in auto) == (r["on_timeout"] == "approve"), f"{rid}: on_timeout missed"
    assert auto <= set(resolved), "approved on timeout but never closed"


ClockMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow],
)
TestClockMachine = ClockMachine.TestCase


# -- regressions the machine found ----------------------------------------------------------------


def slow_policy_agent(
    clock: ManualClock, runs: Runs, on_timeout: Any, approvers: int = 1
) -> so.Agent:
    """Agent `slow`: `wire` has a 60 s deadline and a response policy that takes 61 s."""

    async def finance(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
        clock.advance(61)
        who = ctx.response.principal
        if ctx.request.escalated_to is not None and who is not None and who.same_as(FIONA):
            return so.Allowed()
        return so.Allowed() if who is not None and who.same_as(ALICE) else so.Rejected("no")

    spec = so.ApprovalSpec(
        request=so.always(approvers=approvers),
        response=finance,
        expires_in=60,
        on_timeout=on_timeout,
        escalate_to="finance" if on_timeout == "escalate" else None,
    )

    @so.tool(approval=spec)
    async def wire(ctx: so.ToolContext, order: str) -> dict[str, str]:
        """Wire money."""
        runs.count[ctx.idempotency_key()] += 1
        return {"wired": order}

    return so.Agent(
        name="slow",
        model=so.models.Scripted([call_tools(call("wire", order="1")), reply("over")]),
        tools=[wire],
    )


def kinds(events: list[so.Event]) -> list[str]:
    return [
        f"{e.type} {e.data.get('outcome') or e.data.get('decision') or e.data.get('status')}"
        if e.type in ("approval.candidate", "approval.settled", "input.resolved", "tool.completed")
        else e.type
        for e in events
    ]


@pytest.mark.parametrize("approvers", [1, 2])
async def test_a_response_decided_past_the_deadline_does_not_settle(
    store_url: str, approvers: int
) -> None:
    """Regression: a response policy slower than the time left recorded the approval (or a
    quorum vote) after the deadline; the deadline wins, and the answer is refused as closed."""
    clock, runs = ManualClock(), Runs()
    agent = slow_policy_agent(clock, runs, "deny", approvers)
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        r = await rt.generate("slow", prompt="wire it", auth=ALICE)
        (req,) = r.pending
        mark = (await rt.store.head(r.session_id)) or 0
        answer = [so.InputResponse(request_id=req.id, option_id="approve")]
        with pytest.raises(so.RequestClosed, match="deadline"):
            await rt.respond(r.session_id, answer, principal=ALICE)
        events = [e async for e in rt.events(r.session_id, mark, follow=False)]
        assert kinds(events) == [
            "approval.candidate pending",
            "approval.candidate stale",
            "input.resolved expired",
            "tool.completed expired",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        assert req.expires_at is not None and all(e.at >= req.expires_at for e in events[1:])
        assert runs.count == Counter()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "expired"
        check_requests([e.to_dict() async for e in rt.events(r.session_id, follow=False)])


async def test_a_response_decided_past_an_escalation_deadline_is_stale(store_url: str) -> None:
    """Regression: the same with `on_timeout="escalate"`: the request is escalated, the slow
    answer counts for nothing, and the group can then settle it."""
    clock, runs = ManualClock(), Runs()
    agent = slow_policy_agent(clock, runs, "escalate")
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        r = await rt.generate("slow", prompt="wire it", auth=ALICE)
        (req,) = r.pending
        mark = (await rt.store.head(r.session_id)) or 0
        answer = [so.InputResponse(request_id=req.id, option_id="approve")]
        r = await rt.respond(r.session_id, answer, principal=ALICE)
        (outcome,) = r.outcomes
        assert (outcome.outcome, outcome.applied) == ("stale", False)
        assert r.status == "waiting" and r.pending[0].escalated_to == "finance"
        events = [e async for e in rt.events(r.session_id, mark, follow=False)]
        assert kinds(events)[:3] == [
            "approval.candidate pending",
            "approval.candidate stale",
            "approval.candidate escalated",
        ]
        assert runs.count == Counter()
        r = await rt.respond(r.session_id, answer, principal=FIONA)
        assert r.status == "completed" and sum(runs.count.values()) == 1
        check_requests([e.to_dict() async for e in rt.events(r.session_id, follow=False)])


@pytest.mark.parametrize("waiting", [True, False])
async def test_cancelling_an_expired_session_does_not_bring_it_back(
    store_url: str, waiting: bool
) -> None:
    """Regression: `cancel()` on a session past its TTL recorded a cancellation, and with it a
    new TTL: the expired session took messages again. It is refused as expired, as any call."""
    clock = ManualClock()
    agent = make_agent(Runs(), clock, Slow())
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        plan = prompt(["pay"] if waiting else [])
        r = await rt.generate(AGENT, prompt=plan, auth=ALICE)
        assert r.status == ("waiting" if waiting else "completed")
        clock.advance(TTL)
        with pytest.raises(so.SessionExpired):
            await rt.cancel(r.session_id, reason="stop", principal=ALICE)
        state = await rt.state(r.session_id)
        assert state.expired(clock.now) and state.pending_requests() == []
        assert state.status == ("failed" if waiting else "idle")
        with pytest.raises(so.SessionExpired):
            await rt.generate(session_id=r.session_id, prompt="hello", auth=ALICE)
        log = [e.to_dict() async for e in rt.events(r.session_id, follow=False)]
        assert [e["type"] for e in log if e["at"] == clock.now] == (
            ["input.resolved", "turn.failed"] if waiting else []
        )
