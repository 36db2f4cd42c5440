"""Property tests: a Hypothesis state machine over the runtime API.

The machine drives random interleavings of new sessions, messages, answers (by id, label and
index, or from a second runtime), duplicate and forged answers, cancels and restarts on one
store (a SQLite file, or a fresh PostgreSQL schema), keeps a model of what must be true, and
checks the durable invariants after every step through the public API. The reply matcher's
properties are in test_properties_answers.py.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Coroutine, Hashable
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import signoff as so
from signoff._option_names import match_option
from signoff._text import is_blank

from . import _proof
from ._properties import (
    AGENT,
    AUDITED,
    TOOLS,
    Request,
    Runs,
    Session,
    T,
    make_agent,
    prompt,
)


class RuntimeMachine(RuleBasedStateMachine):
    """Random interleavings of the runtime API on one fresh store per example (a SQLite file
    here; `PostgresRuntimeMachine` runs the same on PostgreSQL); a model checks the result."""

    proof = "test_runtime_machine"  # the name its examples and steps are counted under

    def __init__(self) -> None:
        super().__init__()
        _proof.record(f"hypothesis:{self.proof}:examples")
        self.loop = asyncio.new_event_loop()
        self.url = self.fresh_store()
        self.runs = Runs()
        self.agent = make_agent(self.runs)
        self.rt = self.open_runtime()
        self.sessions: dict[str, Session] = {}
        self.requests: dict[str, Request] = {}
        self.moved = False
        self.other: so.Runtime | None = None  # a second process's runtime, once one answered
        self.seen: dict[Hashable, Any] = {}  # reads made since the store last changed

    # -- plumbing ---------------------------------------------------------------------------

    def fresh_store(self) -> str:
        """The URL of an empty store of this example's own."""
        self.dir = tempfile.mkdtemp(prefix="signoff-props-")
        return f"sqlite:///{self.dir}/state.db"

    def drop_store(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def open_runtime(self) -> so.Runtime:
        """A brand-new runtime on this example's store: nothing shared with the last one but
        the agent's code, as in a process started again."""
        return so.Runtime([self.agent], store=self.url)

    def second(self) -> so.Runtime:
        """Another runtime open on the same store at the same time, as in a second process: it
        keeps its own caches between the calls it gets, while the first one writes too."""
        if self.other is None:
            self.other = self.open_runtime()
        return self.other

    def close_second(self) -> None:
        other, self.other = self.other, None
        if other is not None:
            self.run(other.close())

    def step(self) -> None:
        self.moved = True  # something ran since the last restart: another one is worth it
        _proof.record(f"hypothesis:{self.proof}:steps")

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a call that may write (any call but the cached reads below): what was read
        before it is forgotten."""
        self.seen.clear()
        return self.loop.run_until_complete(coro)

    def read(self, key: Hashable, call: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """A read through the API, made once until the next `run` (the store changes only
        through this machine's calls): the invariants of a pass, and a rule's `before` after a
        step that wrote nothing since that pass, share it (a round trip each on PostgreSQL)."""
        if key not in self.seen:
            self.seen[key] = self.loop.run_until_complete(call())
        return cast("T", self.seen[key])

    def teardown(self) -> None:
        try:
            assert self.run(self.rt.verify_audit()) == [], "the audit trail's chain is broken"
        finally:
            self.close()

    def close(self) -> None:
        try:
            self.close_second()
            self.loop.run_until_complete(self.rt.close())
        finally:
            self.loop.close()
            self.drop_store()

    async def _events(self, sid: str) -> list[dict[str, Any]]:
        return [e.to_dict() async for e in self.rt.events(sid, follow=False)]

    def log(self, sid: str) -> list[dict[str, Any]]:
        """A session's events as the store has them now."""
        return self.read(("events", sid), lambda: self._events(sid))

    def observed(self, sid: str) -> tuple[list[dict[str, Any]], so.SessionState]:
        """A session's events and state as the store has them now."""
        return self.log(sid), self.read(("state", sid), lambda: self.rt.state(sid))

    def queue(self) -> list[so.InputRequest]:
        """The whole queue of open requests as the store has it now."""
        return self.read("pending", lambda: self.rt.pending(limit=10_000))

    def trail(self) -> list[so.AuditEntry]:
        """The whole audit trail as the store has it now."""
        return self.read("audit", lambda: self.rt.audit())

    def _everything(self) -> Any:
        """All the public API shows now: events of every session, the queue, sessions, audit
        (through `self.rt` as it is when read: after a restart, the new runtime)."""
        events = {sid: self.log(sid) for sid in self.sessions}
        pending = [r.model_dump() for r in self.queue()]
        sessions = self.read("sessions", lambda: self.rt.sessions(limit=10_000))
        return events, pending, sessions, self.trail()

    def rejected(self, exc: type[so.SignoffError], coro: Coroutine[Any, Any, Any]) -> None:
        """`coro` must raise `exc` and leave everything the API shows unchanged."""
        before = self._everything()
        with pytest.raises(exc):
            self.run(coro)
        assert self._everything() == before, f"a rejected {exc.__name__} changed data"

    def pending_of(self, sid: str) -> list[Request]:
        return [r for r in self.requests.values() if r.session_id == sid and r.outcome is None]

    def open_requests(self) -> list[Request]:
        """Open requests in the order they appeared (ids are random: never order by them)."""
        return [r for r in self.requests.values() if r.outcome is None]

    def settled(self) -> list[Request]:
        return [r for r in self.requests.values() if r.outcome is not None]

    def pick(self, items: list[T], i: int) -> T:
        return items[i % len(items)]

    def took(self, sid: str, result: so.GenerateResult) -> None:
        """Fold a result into the model: new requests appear, the status follows them."""
        assert result.session_id == sid
        turns = self.sessions[sid].turns
        if result.turn_id is not None and result.turn_id not in turns:
            turns.append(result.turn_id)
        for req in result.pending:
            known = self.requests.get(req.id)
            if known is None:
                assert req.session_id == sid
                tool = req.tool_name
                if req.kind == "tool-approval":
                    assert tool == "refund", req
                else:
                    assert req.kind == "question" and req.question == "How should we ship?", req
                    tool = "ship"
                self.requests[req.id] = Request(req.id, sid, req.kind, tool)
            else:
                assert known.outcome is None, f"settled request {req.id} is pending again"
        assert {r.id for r in result.pending} == {r.id for r in self.pending_of(sid)}
        if result.pending:
            assert result.status == "waiting", result
            self.sessions[sid].status = "waiting"
        else:
            assert result.status in ("completed", "cancelled"), result
            if result.status == "completed":
                assert result.text.endswith("results") or result.text in ("nothing to do", "noted")
            self.sessions[sid].status = "idle" if result.status == "completed" else "cancelled"

    def took_sent(self, sid: str, result: so.GenerateResult) -> None:
        """Fold a `send`'s result, which is its message's turn (README), then, when its drive
        went on past that turn to one a queued message started, that turn as it stands."""
        self.took(sid, result)
        now = self.run(self.rt.state(sid)).turn
        if now is not None and now.id != result.turn_id:
            assert result.status in ("completed", "cancelled"), result  # over, before that one
            self.took(sid, self.run(self.rt.generate(session_id=sid)))

    # -- rules ------------------------------------------------------------------------------

    plans = st.lists(st.sampled_from(TOOLS), max_size=3)

    @initialize(plan=plans)
    def first_session(self, plan: list[str]) -> None:
        self.new_session(plan)

    @rule(plan=plans)
    def new_session(self, plan: list[str]) -> None:
        self.step()
        result = self.run(self.rt.generate(AGENT, prompt=prompt(plan)))
        assert result.session_id not in self.sessions
        self.sessions[result.session_id] = Session(result.session_id, plans=[plan])
        self.took(result.session_id, result)

    @precondition(lambda self: self.sessions)
    @rule(i=st.integers(0, 99), plan=plans)
    def new_message(self, i: int, plan: list[str]) -> None:
        self.step()
        sid = self.pick(list(self.sessions), i)
        if self.pending_of(sid):
            # A turn held on people takes answers first: the message is refused as it is.
            self.rejected(so.PartialAnswer, self.rt.generate(session_id=sid, prompt=prompt(plan)))
            return
        result = self.run(self.rt.generate(session_id=sid, prompt=prompt(plan)))
        self.sessions[sid].plans.append(plan)
        self.took(sid, result)

    @precondition(lambda self: self.sessions)
    @rule(i=st.integers(0, 99), text=st.text(max_size=12))
    def arbitrary_message(self, i: int, text: str) -> None:
        """Any text sent to a session: refused by name if it says nothing (empty, or only
        whitespace, controls or invisible characters: `is_blank`) or is not valid Unicode; else it
        answers the first open request if it names one of its options, steers the turn, or
        starts a new one."""
        self.step()
        sid = self.pick(list(self.sessions), i)
        valid = not is_blank(text) and not any(0xD800 <= ord(c) <= 0xDFFF for c in text)
        if not valid:
            self.rejected(so.UsageError, self.rt.send(sid, text))
            return
        pending = self.run(self.rt.pending(session_id=sid))
        result = self.run(self.rt.send(sid, text))
        option = match_option(pending[0].options, text) if pending else None
        if option is not None:
            assert [(o.request_id, o.applied) for o in result.outcomes] == [(pending[0].id, True)]
            req = self.requests[pending[0].id]
            req.answer = {"option_id": option.id}
            outcomes = {"approve": "approved", "cancel": "cancelled"}
            req.outcome = outcomes.get(option.id, "answered")
        else:
            assert result.outcomes == []
            for req in self.pending_of(sid):  # steered: nothing pending survives it
                req.outcome = "ignored" if req.kind == "tool-approval" else "cancelled"
        self.took_sent(sid, result)

    @precondition(lambda self: any(r.outcome is None for r in self.requests.values()))
    @rule(i=st.integers(0, 99), plan=plans)
    def steer(self, i: int, plan: list[str]) -> None:
        """A message that answers nothing steers: open approvals are ignored, questions
        withdrawn, and the model reads the message in the same turn."""
        self.step()
        sid = self.pick(list(dict.fromkeys(r.session_id for r in self.open_requests())), i)
        result = self.run(self.rt.send(sid, prompt(plan)))
        for req in self.pending_of(sid):
            req.outcome = "ignored" if req.kind == "tool-approval" else "cancelled"
        self.sessions[sid].plans.append(plan)
        self.took_sent(sid, result)

    @precondition(lambda self: any(r.outcome is None for r in self.requests.values()))
    @rule(
        i=st.integers(0, 99),
        yes=st.booleans(),
        how=st.sampled_from(["respond", "generate", "elsewhere", "id", "label", "index"]),
    )
    def answer(self, i: int, yes: bool, how: str) -> None:
        """Answer an open request: by id (respond, helix-style approvals, or respond in a
        second process) or by a follow-up message naming an option by id, label or index."""
        self.step()
        if how in ("id", "label", "index"):
            self.answer_by_message(i, yes, how)
        else:
            self.answer_by_id(i, yes, how)

    def answer_by_id(self, i: int, yes: bool, how: str) -> None:
        req = self.pick(self.open_requests(), i)
        sid = req.session_id
        rt = self.second() if how == "elsewhere" else self.rt
        if req.kind == "question":
            option = "exp" if yes else "std"
            answer: dict[str, Any] = {"option_id": option}
            result = self.run(
                rt.respond(sid, [so.InputResponse(request_id=req.id, option_id=option)])
            )
            outcome = "answered"
        elif how == "generate":
            decision = so.Decision(id=req.id, approved=yes, reason="checked")
            others = [r for r in self.pending_of(sid) if r.id != req.id]
            if others:  # helix-style approvals settle the whole batch or nothing
                self.rejected(
                    so.PartialAnswer, self.rt.generate(session_id=sid, approvals=[decision])
                )
                return
            answer = {"option_id": "approve" if yes else "cancel"}
            result = self.run(self.rt.generate(session_id=sid, approvals=[decision]))
            outcome = "approved" if yes else "cancelled"
        else:
            answer = {"option_id": "approve" if yes else "cancel"}
            result = self.run(rt.respond(sid, [so.InputResponse(request_id=req.id, **answer)]))
            outcome = "approved" if yes else "cancelled"
        assert [(o.request_id, o.applied) for o in result.outcomes] == [(req.id, True)]
        req.answer, req.outcome = answer, outcome
        self.took(sid, result)

    def answer_by_message(self, i: int, yes: bool, form: str) -> None:
        """A follow-up message answers the session's first open request by id, label or index."""
        sid = self.pick(list(dict.fromkeys(r.session_id for r in self.open_requests())), i)
        api = self.run(self.rt.pending(session_id=sid))
        first = api[0]
        req = self.requests[first.id]
        options = first.options
        assert options, first
        chosen = options[0] if yes else options[1]
        text = {"id": chosen.id, "label": chosen.label, "index": str(options.index(chosen) + 1)}[
            form
        ]
        text = f"  {text.swapcase()} \n" if form != "index" else f" {text} "
        result = self.run(self.rt.send(sid, text))
        assert [(o.request_id, o.applied) for o in result.outcomes] == [(req.id, True)]
        if req.kind == "question":
            req.answer, req.outcome = {"option_id": chosen.id}, "answered"
        else:
            approve = chosen.id == "approve"
            req.answer = {"option_id": chosen.id}
            req.outcome = "approved" if approve else "cancelled"
        self.took(sid, result)

    @precondition(lambda self: any(r.answer is not None for r in self.requests.values()))
    @rule(i=st.integers(0, 99), same=st.booleans())
    def duplicate_answer(self, i: int, same: bool) -> None:
        """Answering a settled request again: the same answer is a no-op, another one a conflict."""
        self.step()
        req = self.pick([r for r in self.settled() if r.answer is not None], i)
        assert req.answer is not None
        if req.kind == "question":
            other = "std" if req.answer["option_id"] == "exp" else "exp"
        else:
            other = "cancel" if req.answer["option_id"] == "approve" else "approve"
        if not same:
            response = so.InputResponse(request_id=req.id, option_id=other)
            self.rejected(so.ConflictingAnswer, self.rt.respond(req.session_id, [response]))
            return
        before = self._everything()
        response = so.InputResponse(request_id=req.id, **req.answer)
        result = self.run(self.rt.respond(req.session_id, [response]))
        assert [(o.request_id, o.applied) for o in result.outcomes] == [(req.id, False)]
        assert self._everything() == before, "a repeated answer changed data"

    @precondition(
        lambda self: any(r.outcome is not None and r.answer is None for r in self.requests.values())
    )
    @rule(i=st.integers(0, 99), yes=st.booleans())
    def answer_withdrawn(self, i: int, yes: bool) -> None:
        """A request withdrawn by a cancel takes no answer."""
        self.step()
        req = self.pick([r for r in self.settled() if r.answer is None], i)
        option = ("approve" if yes else "cancel") if req.kind == "tool-approval" else "std"
        response = so.InputResponse(request_id=req.id, option_id=option)
        self.rejected(so.RequestClosed, self.rt.respond(req.session_id, [response]))

    @precondition(lambda self: self.requests)
    @rule(i=st.integers(0, 99), j=st.integers(0, 99), forged=st.sampled_from(["unknown", "other"]))
    def forged_answer(self, i: int, j: int, forged: str) -> None:
        """An id never requested in this session (typos, other sessions) is refused as unknown."""
        self.step()
        sid = self.pick(list(self.sessions), i)
        others = [r.id for r in self.requests.values() if r.session_id != sid]
        rid = self.pick(others, j) if forged == "other" and others else f"req_forged{j}"
        response = so.InputResponse(request_id=rid, option_id="approve")
        self.rejected(so.UnknownRequest, self.rt.respond(sid, [response]))

    @precondition(lambda self: any(r.outcome is None for r in self.requests.values()))
    @rule(i=st.integers(0, 99), bad=st.sampled_from(["option", "text", "approval-text"]))
    def malformed_answer(self, i: int, bad: str) -> None:
        """An answer of the wrong shape for its request is refused; nothing is claimed."""
        self.step()
        req = self.pick(self.open_requests(), i)
        if bad == "option":
            response = so.InputResponse(request_id=req.id, option_id="overnight")
        elif req.kind == "question":  # the question takes one of its options only
            response = so.InputResponse(request_id=req.id, text="by pigeon")
        else:
            response = so.InputResponse(request_id=req.id, option_id="maybe")
        self.rejected(so.InvalidAnswer, self.rt.respond(req.session_id, [response]))

    @precondition(lambda self: self.sessions)
    @rule(i=st.integers(0, 99), named=st.booleans())
    def cancel(self, i: int, named: bool) -> None:
        """Named or not, a cancel ends the session's current turn."""
        self.step()
        sid = self.pick(list(self.sessions), i)
        session = self.sessions[sid]
        turn = session.turns[-1] if named and session.turns else None
        result = self.run(self.rt.cancel(sid, reason="changed my mind", turn_id=turn))
        if session.status == "waiting":
            assert result.status == "cancelled", result
            for req in self.pending_of(sid):
                req.outcome = "cancelled"  # withdrawn: answer stays None
            session.status = "cancelled"
        else:  # nothing to cancel: the call changes nothing
            assert result.status in ("completed", "cancelled", "idle"), result
        assert result.pending == []

    @precondition(lambda self: any(len(s.turns) > 1 for s in self.sessions.values()))
    @rule(i=st.integers(0, 99), j=st.integers(0, 99))
    def cancel_an_earlier_turn(self, i: int, j: int) -> None:
        """A cancel naming a turn the session has moved on from (a form sent again, a page
        shown before) changes nothing, and reports the session's current turn."""
        self.step()
        sid = self.pick([s.id for s in self.sessions.values() if len(s.turns) > 1], i)
        session = self.sessions[sid]
        earlier = self.pick(session.turns[:-1], j)
        before = self._everything()
        result = self.run(self.rt.cancel(sid, reason="too late", turn_id=earlier))
        assert result.turn_id == session.turns[-1], (result, session.turns)
        shown = {"waiting": "waiting", "idle": "completed", "cancelled": "cancelled"}
        assert result.status == shown[session.status], (result, session.status)
        assert self._everything() == before, "a cancel of an earlier turn changed data"

    @precondition(lambda self: self.moved)
    @rule()
    def restart(self) -> None:
        """Close the runtime and open a brand-new one on the same store: it shows the same."""
        self.step()
        _proof.record(f"hypothesis:{self.proof}:restarts")
        self.moved = False
        self.close_second()
        before = self._everything()
        old = self.rt
        self.run(old.close())
        self.rt = self.open_runtime()
        assert self.rt is not old and self.rt.store is not old.store
        assert not self.seen  # read again, all of it, through the new runtime
        assert self._everything() == before, "a restart changed what the store shows"

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def the_log_is_gap_free_and_append_only(self) -> None:
        for sid, session in self.sessions.items():
            events, state = self.observed(sid)
            assert [e["seq"] for e in events] == list(range(1, len(events) + 1)), sid
            assert events[: len(session.events)] == session.events, "the log was rewritten"
            assert state.seq == len(events)
            session.events = events

    @invariant()
    def every_request_is_pending_or_resolved_once(self) -> None:
        queue = {r.id for r in self.queue()}
        assert queue == {r.id for r in self.requests.values() if r.outcome is None}
        for sid in self.sessions:
            log, state = self.observed(sid)
            requested = Counter(
                r["id"]
                for e in log
                if e["type"] == "input.requested"
                for r in e["data"]["requests"]
            )
            resolved = [e["data"] for e in log if e["type"] == "input.resolved"]
            assert set(requested.values()) <= {1}, "a request was asked twice"
            once = Counter(d["request_id"] for d in resolved)
            assert set(once.values()) <= {1}, f"an answer was applied twice: {once}"
            mine = {r.id: r for r in self.requests.values() if r.session_id == sid}
            assert set(requested) == set(mine), "a request was lost or appeared unseen"
            assert {d["request_id"]: d["outcome"] for d in resolved} == {
                r.id: r.outcome for r in mine.values() if r.outcome is not None
            }
            assert {r.id for r in state.pending_requests()} == set(requested) - set(once)

    @invariant()
    def each_decision_is_recorded_once_as_given(self) -> None:
        """Every answered approval has one decision in the log, the one given; a request
        withdrawn, ignored or still open has none."""
        for sid in self.sessions:
            log = self.observed(sid)[0]
            settled = Counter(
                e["data"]["request_id"] for e in log if e["type"] == "approval.settled"
            )
            assert set(settled.values()) <= {1}, f"a decision was applied twice: {settled}"
            decided = {
                e["data"]["request_id"]: e["data"]["decision"]
                for e in log
                if e["type"] == "approval.settled"
            }
            assert decided == {
                r.id: r.answer["option_id"]
                for r in self.requests.values()
                if r.session_id == sid and r.kind == "tool-approval" and r.answer is not None
            }

    @invariant()
    def the_audit_trail_mirrors_the_log(self) -> None:
        """Each session's audit stream holds its requests, decisions and executions, each once,
        in the order and with the data the log has."""
        trail: dict[str, list[tuple[str, int | None, dict[str, Any]]]] = {}
        for entry in self.trail():
            trail.setdefault(entry.stream, []).append((entry.type, entry.seq, entry.data))
        for sid in self.sessions:
            log = self.observed(sid)[0]
            expected = [(e["type"], e["seq"], e["data"]) for e in log if e["type"] in AUDITED]
            assert trail.get(sid, []) == expected, sid

    @invariant()
    def status_follows_the_pending_requests(self) -> None:
        for sid, session in self.sessions.items():
            state = self.observed(sid)[1]
            assert state.status == session.status, (sid, state.status, session.status)
            assert (state.status == "waiting") == bool(self.pending_of(sid))

    @invariant()
    def approved_calls_ran_exactly_once_and_denied_never(self) -> None:
        assert set(self.runs.count.values()) <= {1}, f"a tool body ran twice: {self.runs.count}"
        ran = {(sid, cid): key for key, (sid, cid, _) in self.runs.where.items()}
        for sid in self.sessions:
            log = self.observed(sid)[0]
            started = {
                e["data"]["call_id"]: e["data"].get("idempotency_key")
                for e in log
                if e["type"] == "tool.started"
            }
            completed = {
                e["data"]["call_id"]: e["data"]["status"]
                for e in log
                if e["type"] == "tool.completed"
            }
            for cid, status in completed.items():
                if status == "ok":  # its body finished: exactly once, under the key recorded
                    assert ran.get((sid, cid)) == started[cid], (sid, cid)
            for rsid, cid in ran:
                if rsid == sid:
                    assert completed.get(cid) == "ok", f"{cid} ran but has no result"
            refused = {
                e["data"]["call_id"]
                for e in log
                if e["type"] == "approval.settled" and e["data"]["decision"] != "approve"
            }
            for req in self.requests.values():  # withdrawn before a decision: never ran either
                if req.session_id == sid and req.kind == "tool-approval":
                    if req.outcome is not None and req.outcome != "approved":
                        refused |= {
                            e["data"]["requests"][0]["action"]["call_id"]
                            for e in log
                            if e["type"] == "input.requested"
                            and e["data"]["requests"][0]["id"] == req.id
                        }
            for cid in refused:
                assert (sid, cid) not in ran, f"denied call {cid} ran"


def machine_settings(examples: int) -> settings:
    """Both stores' runs: `examples` random programs of up to 30 steps each."""
    return settings(
        max_examples=examples,
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


RuntimeMachine.TestCase.settings = machine_settings(100)
TestRuntimeMachine = RuntimeMachine.TestCase


class PostgresRuntimeMachine(RuntimeMachine):
    """The same machine on PostgreSQL: each example on a schema of its own in one database
    (`?schema=`), which the example's first runtime creates as a new deployment's would."""

    proof = "test_runtime_machine_postgres"
    database = ""  # the URL of the database the test was given
    examples = 0

    def fresh_store(self) -> str:
        assert self.database, "run by test_runtime_machine_on_postgres"
        type(self).examples += 1
        return f"{self.database}?schema=machine_{self.examples}"

    def drop_store(self) -> None:
        pass  # the database goes with the test, and every schema in it


PG_EXAMPLES = 60
"""Fewer than on SQLite: an example takes about twice as long there (0.5 s on two idle cores, as
client and server share them), so about 30 s in all."""


def test_runtime_machine_on_postgres(pg_store_url: str) -> None:
    """Both stores must behave the same: the machine's rules and invariants, on PostgreSQL."""
    PostgresRuntimeMachine.database = pg_store_url
    try:
        run_state_machine_as_test(PostgresRuntimeMachine, settings=machine_settings(PG_EXAMPLES))
    finally:
        PostgresRuntimeMachine.database = ""
