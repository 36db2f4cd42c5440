"""Property tests: the runtime state machine with messages that wait for a turn's end.

`QueueMachine` is test_properties.py's machine, every rule and invariant kept, plus messages
sent with `turn_policy="queue"` (held behind a turn waiting on a question, steering one held on
an approval), sent from a second process too, cancels of a waiting turn with messages queued
behind it, and resumes that must change nothing; it checks that every queued message starts one
turn, once, in the order sent, and that nothing ever sits in the queue behind a settled turn.
"""

from __future__ import annotations

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule, run_state_machine_as_test

from ._properties import prompt
from .test_properties import PostgresRuntimeMachine, RuntimeMachine, machine_settings


class QueueMachine(RuntimeMachine):
    """The runtime machine with queued messages, cancels behind them and resumes."""

    proof = "test_queue_machine"

    def __init__(self) -> None:
        super().__init__()
        self.seen_keys: list[str] = []  # the idempotency keys given, one per message

    @precondition(lambda self: self.sessions)
    @rule(
        i=st.integers(0, 99),
        plan=RuntimeMachine.plans,
        elsewhere=st.booleans(),
        again=st.booleans(),
    )
    def queue_message(self, i: int, plan: list[str], elsewhere: bool, again: bool = False) -> None:
        """A message sent to wait for the turn's end: it starts a turn on a session with none
        live, waits behind a turn held on a question, and steers one held on an approval. Sent
        `again` with its idempotency key (from the other runtime), it is not delivered twice."""
        self.step()
        sid = self.pick(list(self.sessions), i)
        rt = self.second() if elsewhere else self.rt
        pending = self.pending_of(sid)
        key = f"queue-{len(self.seen_keys)}"
        self.seen_keys.append(key)
        result = self.run(rt.send(sid, prompt(plan), turn_policy="queue", idempotency_key=key))
        assert result.outcomes == [] and not result.replayed
        if again:
            before = self._everything()
            other = self.rt if elsewhere else self.second()
            repeat = self.run(
                other.send(sid, prompt(plan), turn_policy="queue", idempotency_key=key)
            )
            assert self._everything() == before, "a repeated message changed data"
            assert repeat.replayed and repeat.queued == result.queued, (repeat, result)
            # Both told the turn the message went to (or waits behind), never a later one.
            assert (repeat.turn_id, repeat.status) == (result.turn_id, result.status), repeat
            assert [r.id for r in repeat.pending] == [r.id for r in result.pending], repeat
        if pending and all(r.kind == "question" for r in pending):
            event("queued behind a question")
            assert result.queued, result  # behind the turn: nothing of it changes
            assert result.status == "waiting", result
            assert {r.id for r in result.pending} == {r.id for r in pending}
            return
        assert not result.queued, result
        for req in pending:  # held on an approval: the message steers instead
            req.outcome = "ignored" if req.kind == "tool-approval" else "cancelled"
        self.sessions[sid].plans.append(plan)
        self.took_sent(sid, result)

    @precondition(lambda self: self.sessions)
    @rule(i=st.integers(0, 99), named=st.booleans())
    def cancel(self, i: int, named: bool) -> None:
        """Cancel a session's turn, messages waiting behind it or not: the turn is cancelled
        and its requests withdrawn (the base machine's rule), and the first message waiting
        starts the next turn, which a resume then reports as it stands."""
        sid = self.pick(list(self.sessions), i)
        behind = len(self.observed(sid)[1].queued)  # read already if nothing was written since
        RuntimeMachine.cancel(self, i, named)
        if behind:
            left = len(self.run(self.rt.state(sid)).queued)
            event("cancel with a message queued: " + ("started" if left < behind else "left"))
        self.took(sid, self.run(self.rt.generate(session_id=sid)))

    @precondition(lambda self: any(self.held_on_questions()))
    @rule(
        i=st.integers(0, 99),
        plans=st.lists(RuntimeMachine.plans, min_size=1, max_size=2),
        elsewhere=st.booleans(),
        named=st.booleans(),
    )
    def cancel_behind_a_queue(
        self, i: int, plans: list[list[str]], elsewhere: bool, named: bool
    ) -> None:
        """Messages queued behind a turn held on a question, then a cancel of that turn: the
        first message starts the next turn, the rest wait behind it."""
        sid = self.pick(self.held_on_questions(), i)
        for plan in plans:
            self.queue_message(list(self.sessions).index(sid), plan, elsewhere)
        self.cancel(list(self.sessions).index(sid), named)

    def held_on_questions(self) -> list[str]:
        """The sessions whose turn waits on questions only: a message queues behind it."""
        return [
            sid
            for sid in self.sessions
            if self.pending_of(sid) and all(r.kind == "question" for r in self.pending_of(sid))
        ]

    @precondition(lambda self: self.sessions)
    @rule(i=st.integers(0, 99), elsewhere=st.booleans())
    def resume(self, i: int, elsewhere: bool) -> None:
        """Resuming a session whose turn is settled or waits on people changes nothing."""
        self.step()
        sid = self.pick(list(self.sessions), i)
        rt = self.second() if elsewhere else self.rt
        before = self._everything()
        result = self.run(rt.generate(session_id=sid))
        assert self._everything() == before, "a resume changed data"
        assert {r.id for r in result.pending} == {r.id for r in self.pending_of(sid)}
        status = {"waiting": "waiting", "completed": "idle", "cancelled": "cancelled"}
        assert status.get(result.status) == self.sessions[sid].status, result

    @invariant()
    def queued_messages_start_once_in_order(self) -> None:
        """Each message queued starts exactly one turn, in the order queued, and none waits
        behind a turn that is not waiting: nothing would ever start it."""
        for sid in self.sessions:
            log, state = self.observed(sid)
            queued = [
                e["data"]["message"]
                for e in log
                if e["type"] == "turn.message" and e["data"].get("queued")
            ]
            started = [
                e["data"]["message"]
                for e in log
                if e["type"] == "turn.started" and e["data"].get("dequeued")
            ]
            still = [q["message"] for q in state.queued]
            assert started + still == queued, (sid, started, still, queued)
            if still:
                assert state.status == "waiting", (sid, state.status, still)


QueueMachine.TestCase.settings = machine_settings(40)
TestQueueMachine = QueueMachine.TestCase


class PostgresQueueMachine(QueueMachine, PostgresRuntimeMachine):
    """The queue machine on PostgreSQL, each example on a schema of its own."""

    proof = "test_queue_machine_postgres"


def test_queue_machine_on_postgres(pg_store_url: str) -> None:
    """The queue machine's rules and invariants on PostgreSQL too."""
    PostgresRuntimeMachine.database = pg_store_url
    try:
        run_state_machine_as_test(PostgresQueueMachine, settings=machine_settings(25))
    finally:
        PostgresRuntimeMachine.database = ""
