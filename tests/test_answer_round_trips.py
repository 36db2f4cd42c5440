"""What an answer the session's state already judges costs in the store: an id the state shows
is none of the session's requests is refused, and a repeat of an answer already applied is
acknowledged, on the read of the session's head alone (one statement on PostgreSQL), with no
lookup of the request, no lease taken and given back, and nothing written. The refusals and
results are those a lookup and a drive gave."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

import signoff as so
from signoff._recording import new_id
from signoff.stores import SQLiteStore
from signoff.testing import call, call_tools, reply, scripted_agent, store_contents

STORE_CALLS = (
    "load",
    "head",
    "read_events",
    "get_request",
    "commit",
    "acquire_lease",
    "renew_lease",
    "release_lease",
)
"""The store's methods an answer may call: each costs a round trip (or more) on PostgreSQL."""


@dataclasses.dataclass
class Trace:
    """The store methods called, and on PostgreSQL the statements sent (one round trip each)."""

    calls: list[str] = dataclasses.field(default_factory=list)
    statements: list[str] = dataclasses.field(default_factory=list)

    def clear(self) -> None:
        self.calls.clear()
        self.statements.clear()


@contextmanager
def traced(rt: so.Runtime, monkeypatch: pytest.MonkeyPatch) -> Iterator[Trace]:
    """What `rt`'s store is asked inside, from the first call after it is entered."""
    trace = Trace()
    store = rt.store
    with monkeypatch.context() as patch:
        for name in STORE_CALLS:
            real = getattr(store, name)

            async def counted(*args: Any, _name: str = name, _real: Any = real, **kw: Any) -> Any:
                trace.calls.append(_name)
                return await _real(*args, **kw)

            patch.setattr(store, name, counted)
        if not isinstance(store, SQLiteStore):
            execute = psycopg.AsyncConnection.execute

            async def sent(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
                trace.statements.append(str(query))
                return await execute(self, query, params, **kw)

            patch.setattr(psycopg.AsyncConnection, "execute", sent)
        yield trace


def only_read(rt: so.Runtime, trace: Trace, *more: str) -> None:
    """The call read the session's head, and `more` (reads), and nothing else: on PostgreSQL
    one statement each."""
    assert trace.calls == ["head", *more], trace.calls
    if not isinstance(rt.store, SQLiteStore):
        assert len(trace.statements) == 1 + len(more), trace.statements


APPROVAL_ROW = "get_request"
"""A closed approval's edited input is in its row alone (the fold keeps none): a repeat of an
answer to one reads it to judge whether it approves the same call."""


@so.tool(approval=so.always())
async def refund(order_id: str) -> str:
    """Refund an order."""
    return "ok"


def _desk() -> so.Agent:
    """Each turn asks to approve two refunds at once, then says it is done."""
    asks = call_tools(call("refund", order_id="1"), call("refund", order_id="2"))
    return scripted_agent("desk", [asks, reply("done"), asks, reply("done again")], tools=[refund])


def _shop() -> so.Agent:
    """Asks how to ship while it asks to approve a refund, then says it is done."""
    options = [{"label": "Post", "description": "Slow."}, {"label": "Van", "description": "Fast."}]
    ship = call("ask_question", question="How to ship?", options=options)
    steps = [call_tools(call("refund", order_id="1"), ship), reply("done")]
    return scripted_agent("shop", steps, tools=[refund, so.ask_question()])


def _approve(request_id: str) -> list[so.InputResponse]:
    return [so.InputResponse(request_id=request_id, option_id="approve")]


async def test_an_id_that_is_none_of_the_sessions_requests_is_refused_on_the_head_read(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A made-up id, or one of another session's requests, is refused as ever (`UnknownRequest`
    naming it, nothing changed) without a lookup of the request: the session's state holds
    every request it ever had, as no earlier turn's were dropped from it."""
    async with so.Runtime([_desk()], store=store_url) as rt:
        mine = await rt.generate("desk", prompt="refunds")
        other = await rt.generate("desk", prompt="refunds")
        assert mine.status == other.status == "waiting"
        before = await store_contents(rt.store, mine.session_id)
        theirs = await store_contents(rt.store, other.session_id)
        sid = mine.session_id
        for rid in (new_id("req"), other.pending[0].id):
            for answered in ([rid], [mine.pending[0].id, rid]):
                with traced(rt, monkeypatch) as trace:
                    with pytest.raises(so.UnknownRequest) as refused:
                        await rt.respond(
                            sid,
                            [so.InputResponse(request_id=i, option_id="approve") for i in answered],
                        )
                only_read(rt, trace)
                assert str(refused.value) == str(so.UnknownRequest(sid, [rid]))
                assert refused.value.request_ids == [rid]
                with traced(rt, monkeypatch) as trace:
                    with pytest.raises(so.UnknownRequest) as refused:
                        await rt.generate(
                            session_id=sid,
                            approvals=[so.Decision(id=i, approved=True) for i in answered],
                        )
                only_read(rt, trace)
                assert refused.value.request_ids == [rid]
        assert await store_contents(rt.store, sid) == before
        assert await store_contents(rt.store, other.session_id) == theirs


async def test_after_a_turn_that_asked_an_id_not_in_the_state_is_looked_up(
    store_url: str,
) -> None:
    """Once a turn that asked has ended, the state drops its requests: an id it lacks may be
    one of them, so it is looked up. Answered again alike it is a repeat, otherwise refused."""
    async with so.Runtime([_desk()], store=store_url) as rt:
        first = await rt.generate("desk", prompt="refunds")
        sid = first.session_id
        old = first.pending[0].id
        assert not (await rt.state(sid)).earlier_requests
        done = await rt.generate(
            session_id=sid, approvals=[so.Decision(id=r.id, approved=True) for r in first.pending]
        )
        assert done.status == "completed"
        second = await rt.generate(session_id=sid, prompt="more refunds")
        assert second.status == "waiting"
        state = await rt.state(sid)
        assert old not in state.requests and state.earlier_requests
        # A snapshot that does not say (an older signoff's) may have dropped some.
        unsaid = {k: v for k, v in state.to_snapshot().items() if k != "earlier_requests"}
        assert so.SessionState.from_snapshot(unsaid).earlier_requests
        again = await rt.respond(sid, _approve(old))
        assert again.outcomes == [so.Outcome(request_id=old, outcome="approved", applied=False)]
        assert again.status == "waiting" and again.pending == second.pending
        with pytest.raises(so.ConflictingAnswer):
            await rt.respond(sid, [so.InputResponse(request_id=old, option_id="cancel")])
        made_up = new_id("req")
        with pytest.raises(so.UnknownRequest) as refused:
            await rt.respond(sid, _approve(made_up))
        assert str(refused.value) == str(so.UnknownRequest(sid, [made_up]))


async def test_a_repeated_answer_takes_no_lease(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An answer repeating one already applied, while the turn waits on another request, is
    acknowledged (`applied=False`) with the session as it stands, on the reads that judge it:
    the drive that followed took the session's lease and gave it back to find nothing to do,
    and `resume=False` read the session's head again."""
    async with so.Runtime([_desk()], store=store_url) as rt:
        asked = await rt.generate("desk", prompt="refunds")
        sid, (one, two) = asked.session_id, asked.pending
        first = await rt.respond(sid, _approve(one.id))
        assert first.status == "waiting" and first.pending == [two]
        before = await store_contents(rt.store, sid)
        with traced(rt, monkeypatch) as trace:
            again = await rt.respond(sid, _approve(one.id))
        only_read(rt, trace, APPROVAL_ROW)
        assert again == dataclasses.replace(
            first, outcomes=[so.Outcome(request_id=one.id, outcome="approved", applied=False)]
        )
        with traced(rt, monkeypatch) as trace:
            held = await rt.respond(sid, _approve(one.id), resume=False)
        only_read(rt, trace, APPROVAL_ROW)
        assert held == again
        with traced(rt, monkeypatch) as trace:
            decided = await rt.generate(
                session_id=sid, approvals=[so.Decision(id=one.id, approved=True)]
            )
        only_read(rt, trace, APPROVAL_ROW)
        assert decided == again
        with pytest.raises(so.ConflictingAnswer):
            await rt.respond(sid, [so.InputResponse(request_id=one.id, option_id="cancel")])
        assert await store_contents(rt.store, sid) == before
        done = await rt.respond(sid, _approve(two.id))
        assert done.status == "completed" and done.text == "done"
        # The turn is over: a repeat says so as the drive did, with no lease either.
        with traced(rt, monkeypatch) as trace:
            late = await rt.respond(sid, _approve(two.id))
        only_read(rt, trace, APPROVAL_ROW)
        assert late == dataclasses.replace(
            done, outcomes=[so.Outcome(request_id=two.id, outcome="approved", applied=False)]
        )


async def test_a_repeat_still_resumes_a_turn_its_answers_left_to_run(store_url: str) -> None:
    """Answers accepted with `resume=False` leave the turn with work to do: a repeat of one
    with `resume=True` drives it, as before, and is acknowledged as a repeat."""
    async with so.Runtime([_desk()], store=store_url) as rt:
        asked = await rt.generate("desk", prompt="refunds")
        sid = asked.session_id
        ids = [r.id for r in asked.pending]
        held = await rt.respond(
            sid, [so.InputResponse(request_id=i, option_id="approve") for i in ids], resume=False
        )
        assert held.status == "running"
        again = await rt.respond(sid, _approve(ids[0]))
        assert again.status == "completed" and again.text == "done"
        assert again.outcomes == [so.Outcome(request_id=ids[0], outcome="approved", applied=False)]


async def test_a_repeated_answer_to_a_question_is_one_read(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A question's answer is in the state: its repeat is judged on the head read alone."""
    async with so.Runtime([_shop()], store=store_url) as rt:
        asked = await rt.generate("shop", prompt="ship and refund")
        sid = asked.session_id
        (question,) = [r for r in asked.pending if r.kind == "question"]
        van = [so.InputResponse(request_id=question.id, option_id="2")]
        first = await rt.respond(sid, van)
        assert first.status == "waiting" and [r.kind for r in first.pending] == ["tool-approval"]
        before = await store_contents(rt.store, sid)
        with traced(rt, monkeypatch) as trace:
            again = await rt.respond(sid, van)
        only_read(rt, trace)
        assert again == dataclasses.replace(
            first, outcomes=[so.Outcome(request_id=question.id, outcome="answered", applied=False)]
        )
        with pytest.raises(so.ConflictingAnswer):
            await rt.respond(sid, [so.InputResponse(request_id=question.id, option_id="1")])
        assert await store_contents(rt.store, sid) == before
