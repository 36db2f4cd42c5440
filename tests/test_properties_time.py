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
from collections.abc import Coroutine
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import signoff as so
from signoff._deadlines import is_due, state_after_deadlines
from signoff._events import is_activity
from signoff.stores import PendingFilter
from signoff.testing import ManualClock

from . import _proof
from ._properties_time import (
    AGENT,
    ALICE,
    ALICE_LOCAL,
    DEADLINES,
    PEOPLE,
    STEPS,
    TOOLS,
    TTL,
    Request,
    Runs,
    Slow,
    T,
    _expiry,
    check_requests,
    make_agent,
    prompt,
)


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
        self.read: dict[str, list[dict[str, Any]]] | None = None  # this pass's logs

    # -- plumbing ---------------------------------------------------------------------------

    def open_runtime(self) -> so.Runtime:
        return so.Runtime([self.agent], store=f"sqlite:///{self.dir}/state.db", clock=self.clock)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def step(self) -> None:
        """Every rule starts here: counted, and the logs the last invariants read are dropped."""
        _proof.record("hypothesis:test_clock_machine:steps")
        self.read = None

    def read_logs(self) -> dict[str, list[dict[str, Any]]]:
        """Every session's log, read once per pass of the invariants (which write nothing) and
        shared by them: a rule's `step()` makes the next pass read them anew."""
        if self.read is None:
            self.read = {sid: self.run(self._events(sid)) for sid in self.sessions}
        return self.read

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
        waiting: nobody can take its turn on. The rest are listed as their state shows them,
        passed deadlines as recording leaves them (unrecorded: a listing drives no turn)."""
        self.step()
        now = self.clock.now
        for row in self.run(self.rt.sessions(limit=10_000)):
            state = self.state(row.id)
            if state.expired(now):
                assert row.status not in ("running", "waiting"), (row, state.status)
                assert row.expires_at is not None and row.expires_at <= now, row
            else:
                shown = state_after_deadlines(state, now)
                assert row.status == shown.status, (row, state.status, shown.status)

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
            try:
                result = self.run(rt.respond(sid, response, principal=principal))
            finally:
                # A response policy runs for a closed request too (who may answer is checked
                # first), and the slow one moves the clock: what fell due meanwhile is recorded.
                settled = settled and self.clock.now == now
        except so.SessionExpired:
            # or its TTL lapsed while the slow policy decided (the clock moved)
            lapsed = self.clock.now != now and state.expired(self.clock.now)
            assert expired or lapsed, "a live session was refused as expired"
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
            # Who may answer is checked first, open or closed: one who may not is refused alike
            # (never told how a closed request ended), and one who may is never refused.
            if req.tool in ("pay", "ship"):
                assert principal is not ALICE, (who, req.tool, status)
            elif req.tool == "deploy":
                assert principal in (ALICE, ALICE_LOCAL, None), (who, req.tool, status)
            else:
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
        for sid, log in self.read_logs().items():
            assert [e["seq"] for e in log] == list(range(1, len(log) + 1)), sid
            known = self.logs.get(sid, [])
            assert log[: len(known)] == known, "the log was rewritten"
            self.logs[sid] = log
            assert self.state(sid).seq == len(log)

    @invariant()
    def nothing_is_recorded_past_a_ttl_but_the_expiry(self) -> None:
        """A session past its TTL (counted from its last activity: a deadline's escalation is
        none) takes no event but the record of its expiry, and stays expired: every surface
        (its state, the store's row) says so from then on."""
        now = self.clock.now
        for sid, log in self.read_logs().items():
            lapsed_at, active = None, log[0]["at"]
            for e in log[1:]:
                if lapsed_at is not None:
                    assert e["at"] == lapsed_at and _expiry(e), f"{sid}: {e['type']} after expiry"
                elif e["at"] >= active + TTL:
                    assert _expiry(e), f"{sid}: {e['type']} recorded {e['at'] - active}s on"
                    lapsed_at = e["at"]
                elif _expiry(e):
                    raise AssertionError(f"{sid} recorded as expired before its TTL passed")
                if is_activity(e["type"], e["data"]):
                    active = e["at"]
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
        for log in self.read_logs().values():
            check_requests(log)

    @invariant()
    def approved_calls_ran_once_and_refused_ones_never(self) -> None:
        assert set(self.runs.count.values()) <= {1}, f"a tool body ran twice: {self.runs.count}"
        ran = {(sid, cid) for sid, cid in self.runs.where.values()}
        for sid, log in self.read_logs().items():
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


ClockMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow],
)
TestClockMachine = ClockMachine.TestCase
