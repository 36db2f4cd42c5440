"""Answers given through the parent for a child's mirrored request: a bad one or a batch with
a bad one changes no session, one that loses a race leaves the parent to go on, and one given
with the parent's own answer settles both together.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.testing import (
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    store_contents,
    tool_results,
)

from ._subagents import (
    ALICE,
    Counted,
    events,
    refund_agents,
)


async def test_a_bad_answer_through_the_parent_changes_nothing(tmp_path: Path) -> None:
    ran: list[dict[str, Any]] = []
    after = Counted("unused")
    parent, child = refund_agents(ran, after)
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
    [mirror] = r.pending
    assert mirror.child is not None
    child_id = mirror.child.session_id
    before = (
        await store_contents(rt.store, r.session_id),
        await store_contents(rt.store, child_id),
    )
    with pytest.raises(so.InvalidAnswer) as bad:
        await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=mirror.id, option_id="maybe")],
            principal=ALICE,
        )
    assert bad.value.request_ids == [mirror.id]
    assert mirror.id in str(bad.value) and "'maybe'" in str(bad.value)
    mallory = so.Principal(authenticator="okta", principal_id="mallory")
    with pytest.raises(so.NotAllowed):
        await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=mirror.id, option_id="approve")],
            principal=mallory,
        )
    after_both = (
        await store_contents(rt.store, r.session_id),
        await store_contents(rt.store, child_id),
    )
    assert after_both == before
    assert ran == [] and after.calls == 0
    await rt.close()


@pytest.mark.parametrize(
    "bad",
    [
        so.InputResponse(request_id="req_bogus", option_id="approve"),
        so.InputResponse(request_id="MIRROR", option_id="approve"),  # twice: see below
    ],
    ids=["unknown-id", "same-id-twice"],
)
async def test_a_batch_with_a_mirrored_answer_and_a_bad_one_changes_no_session(
    tmp_path: Path, bad: so.InputResponse
) -> None:
    # The mirrored answer is settled in the child first: a bad answer beside it must be found
    # before that, or the child's call is approved by a batch that was refused.
    ran: list[dict[str, Any]] = []
    after = Counted("unused")
    parent, child = refund_agents(ran, after)
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
    [mirror] = r.pending
    assert mirror.child is not None
    child_id = mirror.child.session_id
    if bad.request_id == "MIRROR":
        bad = so.InputResponse(request_id=mirror.id, option_id="cancel")
    before = (
        await store_contents(rt.store, r.session_id),
        await store_contents(rt.store, child_id),
    )
    good = so.InputResponse(request_id=mirror.id, option_id="approve")
    with pytest.raises(so.AnswerError if bad.request_id == "req_bogus" else so.InvalidAnswer):
        await rt.respond(r.session_id, [good, bad], principal=ALICE)
    with pytest.raises(so.SignoffError):
        await rt.generate(
            session_id=r.session_id,
            approvals=[
                so.Decision(id=mirror.id, approved=True),
                so.Decision(id=bad.request_id, approved=True),
            ],
            auth=ALICE,
        )
    after_all = (
        await store_contents(rt.store, r.session_id),
        await store_contents(rt.store, child_id),
    )
    assert after_all == before
    assert ran == [] and after.calls == 0
    await rt.close()


@pytest.mark.parametrize("store_kind", ["yielding", "postgres"])
async def test_a_losing_answer_through_the_parent_leaves_the_parent_to_go_on(
    store_kind: str, race_store: str
) -> None:
    """The parent's mirror is answered (approve) while the child's request is answered
    directly (deny) at once, from two runtimes: the child's answer wins, the parent's gets
    `ConflictingAnswer`, and the parent's turn goes on to the end with the child's result. The
    losing answer used to close the mirror after the child's drive had looked for it, so nobody
    drove the parent: its turn stayed running with the delegate call open."""
    from .test_concurrency import YieldingStore

    url = race_store
    ran: list[dict[str, Any]] = []
    after = Counted("The refund was refused.")

    def runtime() -> so.Runtime:
        store = YieldingStore(url, []) if store_kind == "yielding" else url
        return so.Runtime(list(refund_agents(ran, after)), store=store)

    async with runtime() as a, runtime() as b:
        for _ in range(3):  # a few rounds: PostgreSQL's interleaving is not scripted
            r = await a.generate("support", prompt="Refund order 1042", auth=ALICE)
            [mirror] = r.pending
            assert mirror.child is not None
            results = await asyncio.gather(
                a.respond(
                    r.session_id,
                    [so.InputResponse(request_id=mirror.id, option_id="approve")],
                    principal=ALICE,
                ),
                b.respond(
                    mirror.child.session_id,
                    [so.InputResponse(request_id=mirror.child.request_id, option_id="cancel")],
                    principal=ALICE,
                ),
                return_exceptions=True,
            )
            refused = [x for x in results if isinstance(x, BaseException)]
            assert len(refused) == 1 and isinstance(refused[0], so.ConflictingAnswer), results
            parent = await a.state(r.session_id)
            child = await a.state(mirror.child.session_id)
            assert parent.turn is not None and child.turn is not None
            assert (child.turn.status, parent.turn.status) == ("completed", "completed")
            assert await a.pending() == []
            for sid in (r.session_id, mirror.child.session_id):
                seqs = [e.seq for e in await events(a, sid)]
                assert seqs == list(range(1, len(seqs) + 1))
    # Whichever answer won ran the refund at most once, and the parent's model read it once.
    assert len(ran) <= 3 and after.calls == 3


@pytest.fixture
def race_store(request: pytest.FixtureRequest, tmp_path: Path, store_kind: str) -> str:
    """A SQLite file (behind awaits that yield, in the test) or a fresh PostgreSQL database."""
    if store_kind == "postgres":
        return str(request.getfixturevalue("pg_store_url"))
    return f"sqlite:///{tmp_path / 'state.db'}"


def mixed_agents(ran: list[str]) -> tuple[so.Agent, so.Agent]:
    """A parent whose one response delegates a gated refund and asks its own question."""

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        ran.append(f"refund {order_id}")
        return "refunded"

    @so.tool
    async def confirm(ctx: so.ToolContext, text: str) -> str:
        """Ask the customer."""
        answer = await ctx.ask(text, options=["yes", "no"])
        ran.append(f"confirm {answer.option_id}")
        return str(answer.option_id)

    child = scripted_agent(
        "billing",
        [call_tools(call("issue_refund", order_id="1042")), reply("Refund done.")],
        tools=[issue_refund],
    )
    parent = scripted_agent(
        "support",
        [
            call_tools(
                call("billing", call_id="d1", message="Refund order 1042"),
                call("confirm", call_id="c1", text="Email you?"),
            ),
            lambda conv: reply(" / ".join(str(r.content) for r in tool_results(conv))),
        ],
        tools=[so.delegate("billing"), confirm],
    )
    return parent, child


async def test_answers_for_a_mirror_and_the_parents_own_request_settle_together(
    tmp_path: Path,
) -> None:
    """`generate(approvals=...)` must answer every pending request, the mirrors of the child's
    among them: one that leaves the parent's own request out changes no session; one call that
    answers both settles each where it belongs and the turn completes."""
    ran: list[str] = []
    async with sqlite_runtime(tmp_path, *mixed_agents(ran)) as rt:
        r = await rt.generate("support", prompt="Refund and tell them", auth=ALICE)
        assert r.status == "waiting"
        [mirror] = [p for p in r.pending if p.child is not None]
        [own] = [p for p in r.pending if p.child is None]
        assert mirror.child is not None
        child_id = mirror.child.session_id
        before = (
            await store_contents(rt.store, r.session_id),
            await store_contents(rt.store, child_id),
        )
        with pytest.raises(so.PartialAnswer) as partial:
            await rt.generate(
                session_id=r.session_id,
                approvals=[so.Decision(id=mirror.id, approved=True)],
                auth=ALICE,
            )
        assert partial.value.request_ids == [own.id]
        after_partial = (
            await store_contents(rt.store, r.session_id),
            await store_contents(rt.store, child_id),
        )
        assert after_partial == before and ran == []
        done = await rt.respond(
            r.session_id,
            [
                so.InputResponse(request_id=mirror.id, option_id="approve"),
                so.InputResponse(request_id=own.id, option_id="yes"),
            ],
            principal=ALICE,
        )
        assert done.status == "completed"
        assert sorted(ran) == ["confirm yes", "refund 1042"]
        assert done.text == "Refund done. / yes"
        assert {o.request_id: o.outcome for o in done.outcomes} == {
            mirror.id: "approved",
            own.id: "answered",
        }
        assert await rt.pending() == []


async def test_a_childs_cancel_whose_mirror_a_losing_answer_closed_first_resumes_the_parent(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child is cancelled while an answer given through the parent, in another process,
    loses to that cancel: the losing answer closes the mirror (and raises) just after the
    cancel is recorded, before the cancel looks for the parent's mirrors. The cancel still lets
    the parent's turn go on: it used to find no open mirror and leave the parent's turn, its
    delegate call answered, for nobody to drive."""
    from signoff import _child_sessions, _mirrors

    ran: list[dict[str, Any]] = []
    after = Counted("Billing was stopped.")
    looks = _child_sessions.after_close

    async with so.Runtime(list(refund_agents(ran, after)), store=store_url) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        [mirror] = r.pending
        assert mirror.child is not None

        async def lost_first(runtime: so.Runtime, state: Any) -> None:
            await _mirrors.close_mirror(runtime, r.session_id, mirror)  # the losing answer's
            await looks(runtime, state)

        monkeypatch.setattr(_child_sessions, "after_close", lost_first)
        await rt.cancel(mirror.child.session_id)
        state = await rt.state(r.session_id)
        assert state.requests[mirror.id].status == "withdrawn"
        assert state.turn is not None and state.turn.status == "completed"
        assert await rt.pending() == [] and ran == [] and after.calls == 1


def refund_then_notify(ran: list[str]) -> list[so.Agent]:
    """A parent whose child's refund needs approval (a mirror), then whose own notice does."""

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        ran.append("refund")
        return "refunded"

    @so.tool(approval=so.always())
    async def notify(text: str) -> str:
        """Tell the customer."""
        ran.append("notify")
        return "sent"

    child = scripted_agent(
        "billing",
        [call_tools(call("issue_refund", order_id="1042")), reply("Refunded.")],
        tools=[issue_refund],
    )
    parent = scripted_agent(
        "support",
        [
            call_tools(call("billing", call_id="d1", message="Refund order 1042")),
            call_tools(call("notify", call_id="n1", text="refunded")),
            reply("Done."),
        ],
        tools=[so.delegate("billing", description="Billing specialist."), notify],
    )
    return [parent, child]


async def test_decisions_repeated_for_a_settled_mirror_are_a_no_op(store_url: str) -> None:
    """`generate(approvals=...)` sent again (a retry after a timeout) repeats its decisions: a
    no-op returning the turn, as for the session's own requests, though the turn now waits on
    another request. For a mirror it raised `PartialAnswer` naming that request."""
    ran: list[str] = []
    async with so.Runtime(refund_then_notify(ran), store=store_url) as rt:
        r = await rt.generate("support", prompt="Refund and tell them", auth=ALICE)
        decided = [so.Decision(id=r.pending[0].id, approved=True)]
        first = await rt.generate(session_id=r.session_id, approvals=decided, auth=ALICE)
        [notice] = first.pending
        assert notice.tool_name == "notify" and ran == ["refund"]
        again = await rt.generate(session_id=r.session_id, approvals=decided, auth=ALICE)
        assert again.status == "waiting" and [p.id for p in again.pending] == [notice.id]
        assert [(o.outcome, o.applied) for o in again.outcomes] == [("approved", False)]
        decided = [so.Decision(id=notice.id, approved=True)]
        done = await rt.generate(session_id=r.session_id, approvals=decided, auth=ALICE)
        assert done.status == "completed" and ran == ["refund", "notify"]


async def test_more_mirrored_requests_than_one_call_answers_are_settled_in_batches(
    tmp_path: Path,
) -> None:
    """Eight delegate calls whose children each propose 126 gated calls (under the default
    `max_calls_per_response`) leave 1,008 mirrored requests in the parent: over the 1,000 one
    call answers, so `generate(approvals=)` can settle them neither at once nor in batches. Its
    refusals said "send them in batches" and "must be answered in one call"; they name the way
    that works, `respond()` in batches, and change nothing."""

    @so.tool(approval=so.always())
    async def act(n: int) -> int:
        """Act."""
        return n

    child = scripted_agent(
        "billing", [call_tools(*[call("act", n=i) for i in range(126)]), reply("ok")], tools=[act]
    )
    asks = [call("billing", call_id=f"d{i}", message="go") for i in range(8)]
    parent = scripted_agent(
        "support", [call_tools(*asks), reply("done")], tools=[so.delegate("billing")]
    )
    async with sqlite_runtime(tmp_path, parent, child) as rt:
        r = await rt.generate("support", prompt="go", auth=ALICE)
        assert r.status == "waiting" and len(r.pending) == 1008
        before = await store_contents(rt.store, r.session_id)
        decisions = [so.Decision(id=p.id, approved=True) for p in r.pending]
        with pytest.raises(so.InvalidAnswer, match="at most 1000 answers") as too_many:
            await rt.generate(session_id=r.session_id, approvals=decisions, auth=ALICE)
        assert "answer them with respond() in batches" in str(too_many.value)
        with pytest.raises(so.PartialAnswer) as partial:
            await rt.generate(session_id=r.session_id, approvals=decisions[:1000], auth=ALICE)
        assert (
            "1008 requests are pending, and one call answers at most 1000: answer them with "
            "respond() in batches" in str(partial.value)
        )
        assert await store_contents(rt.store, r.session_id) == before
        answers = [so.InputResponse(request_id=p.id, option_id="approve") for p in r.pending]
        first = await rt.respond(r.session_id, answers[:1000], principal=ALICE)
        assert first.status == "waiting" and len(first.pending) == 8
        done = await rt.respond(r.session_id, answers[1000:], principal=ALICE)
        assert (done.status, done.text) == ("completed", "done")
