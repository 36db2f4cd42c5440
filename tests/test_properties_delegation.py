"""Property tests: a Hypothesis state machine over subagents and quorum approvals, on both stores.

Each session of `desk` delegates refunds to `billing` (a child session each, whose refund needs
two people) and pays with a tool of its own that needs two people too. The machine votes as
Alice or Carol, on the parent's mirror or on the child itself, approves or cancels, repeats and
contradicts settled answers, cancels parents and restarts the runtime; after every step it
checks, through the public API, that each log is gap-free, each request resolves once, the
queue holds exactly the open ones, and each tool ran once if and only if two people approved it.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

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
from signoff._types import Message
from signoff.testing import call, call_tools, reply

from . import _proof
from ._properties import Runs, T

PEOPLE = {
    "alice": so.Principal(authenticator="test", principal_id="alice"),
    "carol": so.Principal(authenticator="test", principal_id="carol"),
}


def make_agents(runs: Runs) -> list[so.Agent]:
    """`desk`, which calls what its prompt's plan lists, and `billing`, its refunding child."""

    @so.tool(approval=so.always(approvers=2))
    async def refund(ctx: so.ToolContext, order: str) -> str:
        """Refund an order."""
        runs.ran(ctx)
        return f"refunded {order}"

    @so.tool(approval=so.always(approvers=2))
    async def pay(ctx: so.ToolContext, order: str) -> str:
        """Pay a supplier."""
        runs.ran(ctx)
        return f"paid {order}"

    def billing(messages: list[Message]) -> so.ModelResponse:
        if isinstance(messages[-1], so.UserMessage):
            return call_tools(call("refund", order=messages[-1].text))
        return reply("billing done")

    def desk(messages: list[Message]) -> so.ModelResponse:
        last = messages[-1]
        if isinstance(last, so.UserMessage):
            turn = sum(isinstance(m, so.UserMessage) for m in messages)
            calls = [
                call("billing", message=f"order {turn}.{i}")
                if name == "delegate"
                else call("pay", order=f"{turn}.{i}")
                for i, name in enumerate(last.text.split())
            ]
            return call_tools(*calls)
        return reply("desk done")

    return [
        so.Agent(
            name="desk",
            model=so.models.Scripted([desk], repeat_last=True),
            tools=[so.delegate("billing"), pay],
        ),
        so.Agent(
            name="billing", model=so.models.Scripted([billing], repeat_last=True), tools=[refund]
        ),
    ]


@dataclass
class Request:
    """One request as the parent's queue shows it (a child's refund by its mirror there)."""

    id: str
    session_id: str
    tool: str
    call_id: str  # the parent's call: `pay`'s, or the delegate call that made the child
    child: so.ChildRef | None
    voters: set[str] = field(default_factory=set)
    outcome: str | None = None  # approved, cancelled, withdrawn; None while open
    answer: str | None = None  # the option that settled it, if a person's answer did


class DelegationMachine(RuleBasedStateMachine):
    """Random votes, answers, cancels and restarts over delegating sessions on one fresh store
    per example (a SQLite file; `PostgresDelegationMachine` runs it on PostgreSQL)."""

    proof = "test_delegation_machine"

    def __init__(self) -> None:
        super().__init__()
        _proof.record(f"hypothesis:{self.proof}:examples")
        self.loop = asyncio.new_event_loop()
        self.url = self.fresh_store()
        self.runs = Runs()
        self.agents = make_agents(self.runs)
        self.rt = so.Runtime(self.agents, store=self.url)
        self.parents: dict[str, str] = {}  # parent session id -> status the model expects
        self.requests: dict[str, Request] = {}
        self.moved = False

    def fresh_store(self) -> str:
        self.dir = tempfile.mkdtemp(prefix="signoff-delegation-")
        return f"sqlite:///{self.dir}/state.db"

    def drop_store(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def step(self) -> None:
        self.moved = True
        _proof.record(f"hypothesis:{self.proof}:steps")

    def teardown(self) -> None:
        try:
            assert self.run(self.rt.verify_audit()) == [], "the audit trail's chain is broken"
        finally:
            try:
                self.run(self.rt.close())
            finally:
                self.loop.close()
                self.drop_store()

    def open_requests(self) -> list[Request]:
        return [r for r in self.requests.values() if r.outcome is None]

    def took(self, sid: str) -> None:
        """Fold the parent's queue into the model: new requests appear, none unseen goes, and
        the status follows them."""
        pending = self.run(self.rt.pending(session_id=sid))
        for req in pending:
            if req.id not in self.requests:
                assert req.tool_name in ("pay", "refund"), req
                assert (req.child is not None) == (req.tool_name == "refund"), req
                call_id = req.call_id if req.child is None else req.child.call_id
                assert call_id is not None, req
                self.requests[req.id] = Request(req.id, sid, req.tool_name, call_id, req.child)
        mine = {r.id for r in self.open_requests() if r.session_id == sid}
        assert {r.id for r in pending} == mine, "the queue lost or kept a request"
        self.parents[sid] = "waiting" if mine else "idle"

    # -- rules ------------------------------------------------------------------------------

    plans = st.lists(st.sampled_from(["delegate", "pay"]), min_size=1, max_size=2)

    @initialize(plan=plans)
    def first_session(self, plan: list[str]) -> None:
        self.new_session(plan)

    @rule(plan=plans)
    def new_session(self, plan: list[str]) -> None:
        self.step()
        r = self.run(self.rt.generate("desk", prompt=" ".join(plan)))
        assert r.status == "waiting" and r.session_id not in self.parents, r
        self.took(r.session_id)
        assert len([q for q in self.open_requests() if q.session_id == r.session_id]) == len(plan)

    @precondition(lambda self: self.open_requests())
    @rule(
        i=st.integers(0, 99),
        who=st.sampled_from(sorted(PEOPLE)),
        yes=st.booleans(),
        on_child=st.booleans(),
    )
    def vote(self, i: int, who: str, yes: bool, on_child: bool) -> None:
        """One person's approval or cancel, on the parent's queue or (a refund) on the child:
        either way the call carries the parent's turn on, with nothing else to call."""
        self.step()
        opened = self.open_requests()
        req = opened[i % len(opened)]
        option = "approve" if yes else "cancel"
        if on_child and req.child is not None:
            sid, rid = req.child.session_id, req.child.request_id
        else:
            sid, rid = req.session_id, req.id
        response = so.InputResponse(request_id=rid, option_id=option)
        r = self.run(self.rt.respond(sid, [response], principal=PEOPLE[who]))
        (outcome,) = r.outcomes
        if not yes:
            assert (outcome.outcome, outcome.applied) == ("cancelled", True), outcome
            req.outcome, req.answer = "cancelled", option
        elif who in req.voters:
            assert (outcome.outcome, outcome.applied) == ("counted", False), outcome
        elif req.voters:
            assert (outcome.outcome, outcome.applied) == ("approved", True), outcome
            req.voters.add(who)
            req.outcome, req.answer = "approved", option
        else:
            assert (outcome.outcome, outcome.applied) == ("counted", True), outcome
            req.voters.add(who)
        self.took(req.session_id)

    @precondition(lambda self: any(r.answer for r in self.requests.values()))
    @rule(i=st.integers(0, 99), same=st.booleans(), who=st.sampled_from(sorted(PEOPLE)))
    def answer_again(self, i: int, same: bool, who: str) -> None:
        """A settled request answered again: the same answer is a no-op, the other a conflict;
        neither changes anything."""
        self.step()
        done = [r for r in self.requests.values() if r.answer]
        req = done[i % len(done)]
        assert req.answer is not None
        option = req.answer if same else ("cancel" if req.answer == "approve" else "approve")
        response = so.InputResponse(request_id=req.id, option_id=option)
        before = self.everything()
        if same:
            r = self.run(self.rt.respond(req.session_id, [response], principal=PEOPLE[who]))
            assert [o.applied for o in r.outcomes] == [False], r.outcomes
        else:
            with pytest.raises(so.ConflictingAnswer):
                self.run(self.rt.respond(req.session_id, [response], principal=PEOPLE[who]))
        assert self.everything() == before, "a repeated or conflicting answer changed data"

    @precondition(lambda self: any(s == "waiting" for s in self.parents.values()))
    @rule(i=st.integers(0, 99))
    def cancel(self, i: int) -> None:
        """Cancelling a waiting parent withdraws its requests, its children's with them."""
        self.step()
        waiting = [sid for sid, status in self.parents.items() if status == "waiting"]
        sid = waiting[i % len(waiting)]
        r = self.run(self.rt.cancel(sid, reason="not needed"))
        assert r.status == "cancelled" and r.pending == [], r
        for req in self.open_requests():
            if req.session_id == sid:
                req.outcome = "withdrawn"
        self.took(sid)
        self.parents[sid] = "cancelled"

    @precondition(lambda self: any(r.outcome == "withdrawn" for r in self.requests.values()))
    @rule(i=st.integers(0, 99), on_child=st.booleans())
    def answer_withdrawn(self, i: int, on_child: bool) -> None:
        """A request its parent's cancel withdrew takes no answer, here or on the child."""
        self.step()
        gone = [r for r in self.requests.values() if r.outcome == "withdrawn"]
        req = gone[i % len(gone)]
        if on_child and req.child is not None:
            sid, rid = req.child.session_id, req.child.request_id
        else:
            sid, rid = req.session_id, req.id
        response = so.InputResponse(request_id=rid, option_id="approve")
        before = self.everything()
        with pytest.raises(so.RequestClosed):
            self.run(self.rt.respond(sid, [response], principal=PEOPLE["alice"]))
        assert self.everything() == before, "an answer to a withdrawn request changed data"

    @precondition(lambda self: self.moved)
    @rule()
    def restart(self) -> None:
        """Close the runtime and open a brand-new one on the same store: it shows the same."""
        self.step()
        _proof.record(f"hypothesis:{self.proof}:restarts")
        self.moved = False
        before = self.everything()
        self.run(self.rt.close())
        self.rt = so.Runtime(self.agents, store=self.url)
        assert self.everything() == before, "a restart changed what the store shows"

    # -- what the API shows -----------------------------------------------------------------

    def everything(self) -> Any:
        """Every session's events and the whole queue, as the public API shows them now."""
        sessions = self.run(self.rt.sessions(limit=1000))
        events = {s.id: self.run(self.events(s.id)) for s in sessions}
        pending = [r.model_dump() for r in self.run(self.rt.pending(limit=1000))]
        return events, pending

    async def events(self, sid: str) -> list[dict[str, Any]]:
        return [e.to_dict() async for e in self.rt.events(sid, follow=False)]

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def logs_are_gap_free_and_requests_resolve_once(self) -> None:
        events, pending = self.everything()
        agents = Counter(s.agent for s in self.run(self.rt.sessions(limit=1000)))
        children = {r.child.session_id for r in self.requests.values() if r.child}
        assert agents == Counter(desk=len(self.parents), billing=len(children)), agents
        for sid, log in events.items():
            assert [e["seq"] for e in log] == list(range(1, len(log) + 1)), sid
            asked = [
                r["id"]
                for e in log
                if e["type"] == "input.requested"
                for r in e["data"]["requests"]
            ]
            resolved = Counter(
                e["data"]["request_id"] for e in log if e["type"] == "input.resolved"
            )
            assert set(resolved.values()) <= {1}, f"an answer was applied twice: {resolved}"
            assert set(resolved) <= set(asked), "an unknown request was resolved"
        queue = {r["id"] for r in pending}
        parents = {r["id"] for r in pending if r["session_id"] in self.parents}
        assert parents == {r.id for r in self.open_requests()}, "the queue is not the open set"
        # A child's own request is open exactly while its mirror is.
        open_children = {r.child.request_id for r in self.open_requests() if r.child}
        assert queue - parents == open_children

    @invariant()
    def each_tool_ran_once_if_and_only_if_two_people_approved(self) -> None:
        assert set(self.runs.count.values()) <= {1}, f"a tool body ran twice: {self.runs.count}"
        # `pay` by its call in the parent; a refund by its child session (one call each).
        ran = {(sid, cid if tool == "pay" else tool) for sid, cid, tool in self.runs.where.values()}
        approved = {
            (r.child.session_id, r.tool) if r.child else (r.session_id, r.call_id)
            for r in self.requests.values()
            if r.outcome == "approved"
        }
        assert ran == approved, (ran, approved)
        for req in self.requests.values():
            assert req.outcome != "approved" or len(req.voters) == 2, req

    @invariant()
    def status_follows_the_open_requests(self) -> None:
        for sid, status in self.parents.items():
            state = self.run(self.rt.state(sid))
            assert state.status == status, (sid, state.status, status)


def machine_settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        stateful_step_count=20,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


SQLITE_EXAMPLES = 30
PG_EXAMPLES = 15
"""Fewer than on SQLite: an example costs about twice as long on PostgreSQL."""


def run_machine(machine: type[DelegationMachine], examples: int) -> None:
    """Run `machine` for `examples` examples, and check the summary's figure counts them: the
    examples it records are the machines Hypothesis made, at least as many as it was told."""
    name = f"hypothesis:{machine.proof}:examples"
    before = _proof.tally[name]
    run_state_machine_as_test(machine, settings=machine_settings(examples))
    assert _proof.tally[name] - before >= examples


def test_delegation_machine() -> None:
    run_machine(DelegationMachine, SQLITE_EXAMPLES)


class PostgresDelegationMachine(DelegationMachine):
    """The same machine on PostgreSQL: each example on a schema of its own in one database."""

    proof = "test_delegation_machine_postgres"
    database = ""
    examples = 0

    def fresh_store(self) -> str:
        assert self.database, "run by test_delegation_machine_on_postgres"
        type(self).examples += 1
        return f"{self.database}?schema=delegation_{self.examples}"

    def drop_store(self) -> None:
        pass  # the database goes with the test, and every schema in it


def test_delegation_machine_on_postgres(pg_store_url: str) -> None:
    PostgresDelegationMachine.database = pg_store_url
    try:
        run_machine(PostgresDelegationMachine, PG_EXAMPLES)
    finally:
        PostgresDelegationMachine.database = ""
