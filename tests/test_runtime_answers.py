"""Answering a waiting session through the public API: retries, conflicts, rejected answers,
cancellation and who may answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import pytest

import signoff as so
from signoff.testing import (
    ExecutionLog,
    Flaky,
    ManualClock,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    store_contents,
)

from .test_runtime import ALICE, BOB, refund_agent, tools, types_of, waiting_session

# -- guarantees ---------------------------------------------------------------------------------


async def test_resolve_once_same_answer_is_a_noop(tmp_path: Path) -> None:
    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log)) as rt:
        r = await waiting_session(rt)
        rid = r.pending[0].id
        first = await rt.respond(
            r.session_id, [so.InputResponse(request_id=rid, option_id="approve")]
        )
        assert first.outcomes == [so.Outcome(request_id=rid, outcome="approved", applied=True)]
        assert first.status == "completed"
        before = await store_contents(rt.store, r.session_id)
        again = await rt.respond(
            r.session_id, [so.InputResponse(request_id=rid, option_id="approve")]
        )
        assert again.outcomes == [so.Outcome(request_id=rid, outcome="approved", applied=False)]
        same = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=rid, approved=True)]
        )
        assert same.outcomes == [so.Outcome(request_id=rid, outcome="approved", applied=False)]
        assert same.status == "completed"
        assert await store_contents(rt.store, r.session_id) == before
        assert log.count() == 1


async def test_a_retried_approval_is_a_no_op_after_the_model_asked_again(tmp_path: Path) -> None:
    """helix: the same id sent twice (a retry, a double click) is a no-op the second time, even
    when the resumed turn has since asked for another approval; it is not a partial answer."""
    log = ExecutionLog()
    again = call_tools(call("issue_refund", order_id="2", amount=6))
    async with sqlite_runtime(tmp_path, refund_agent(log, again, reply("done"))) as rt:
        r = await waiting_session(rt)
        rid = r.pending[0].id
        first = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=rid, approved=True)]
        )
        assert first.status == "waiting"
        [second] = first.pending
        before = await store_contents(rt.store, r.session_id)
        retry = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=rid, approved=True)]
        )
        assert retry.outcomes == [so.Outcome(request_id=rid, outcome="approved", applied=False)]
        assert retry.status == "waiting"
        assert [p.id for p in retry.pending] == [second.id]
        assert await store_contents(rt.store, r.session_id) == before
        assert log.count() == 1
        done = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=second.id, approved=True)]
        )
        assert done.status == "completed"
        assert log.count() == 2


async def test_resolve_once_different_answer_conflicts(tmp_path: Path) -> None:
    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log)) as rt:
        r = await waiting_session(rt)
        rid = r.pending[0].id
        await rt.generate(session_id=r.session_id, approvals=[so.Decision(id=rid, approved=False)])
        before = await store_contents(rt.store, r.session_id)
        with pytest.raises(so.ConflictingAnswer) as info:
            await rt.generate(
                session_id=r.session_id, approvals=[so.Decision(id=rid, approved=True)]
            )
        assert info.value.request_ids == [rid]
        assert rid in str(info.value)
        with pytest.raises(so.ConflictingAnswer):
            await rt.respond(r.session_id, [so.InputResponse(request_id=rid, option_id="approve")])
        assert await store_contents(rt.store, r.session_id) == before
        assert log.count() == 0


async def test_unknown_and_foreign_ids_are_rejected_by_name(tmp_path: Path) -> None:
    log = ExecutionLog()
    agent = scripted_agent(
        "a",
        [call_tools(call("issue_refund", order_id="1", amount=5)), reply("done")],
        tools=tools(log),
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        mine = await waiting_session(rt)
        other = await waiting_session(rt)
        mine_before = await store_contents(rt.store, mine.session_id)
        other_before = await store_contents(rt.store, other.session_id)
        queue_before = await rt.pending()
        foreign = other.pending[0].id
        cases: list[list[str]] = [
            ["req_typo"],
            [foreign],
            [mine.pending[0].id, "req_typo"],
            [mine.pending[0].id, foreign],
        ]
        for ids in cases:
            bad = [i for i in ids if i != mine.pending[0].id]
            with pytest.raises(so.UnknownRequest) as info:
                await rt.generate(
                    session_id=mine.session_id,
                    approvals=[so.Decision(id=i, approved=True) for i in ids],
                )
            assert info.value.request_ids == bad
            for i in bad:
                assert i in str(info.value)
            with pytest.raises(so.UnknownRequest) as info:
                await rt.respond(
                    mine.session_id,
                    [so.InputResponse(request_id=i, option_id="approve") for i in ids],
                )
            assert info.value.request_ids == bad
        assert await store_contents(rt.store, mine.session_id) == mine_before
        assert await store_contents(rt.store, other.session_id) == other_before
        assert await rt.pending() == queue_before
        assert log.count() == 0


async def test_partial_answer_is_rejected_naming_the_unanswered(tmp_path: Path) -> None:
    log = ExecutionLog()
    agent = scripted_agent(
        "a",
        [
            call_tools(
                call("issue_refund", order_id="1", amount=5),
                call("issue_refund", order_id="2", amount=6),
                call("issue_refund", order_id="3", amount=7),
            ),
            reply("done"),
        ],
        tools=tools(log),
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await waiting_session(rt)
        a, b, c = (p.id for p in r.pending)
        before = await store_contents(rt.store, r.session_id)
        with pytest.raises(so.PartialAnswer) as info:
            await rt.generate(session_id=r.session_id, approvals=[so.Decision(id=b, approved=True)])
        assert info.value.request_ids == [a, c]
        assert a in str(info.value) and c in str(info.value)
        assert await store_contents(rt.store, r.session_id) == before
        # a prompt while requests are pending is refused too
        with pytest.raises(so.PartialAnswer):
            await rt.generate(session_id=r.session_id, prompt="hello?")
        assert await store_contents(rt.store, r.session_id) == before
        assert log.count() == 0


async def test_approvals_with_a_prompt_are_rejected(tmp_path: Path) -> None:
    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log)) as rt:
        r = await waiting_session(rt)
        before = await store_contents(rt.store, r.session_id)
        with pytest.raises(so.InvalidAnswer, match="prompt"):
            await rt.generate(
                session_id=r.session_id,
                prompt="also, hi",
                approvals=[so.Decision(id=r.pending[0].id, approved=True)],
            )
        with pytest.raises(so.InvalidAnswer):
            await rt.generate(session_id=r.session_id, approvals=[])
        assert await store_contents(rt.store, r.session_id) == before


@pytest.mark.parametrize(
    "prompt",
    [123, b"refund", "\ud800", "", " \n\t"],
    ids=["int", "bytes", "surrogate", "empty", "whitespace"],
)
@pytest.mark.parametrize("entry", ["generate", "schedule"])
async def test_a_bad_prompt_is_refused_before_a_session_is_created(
    tmp_path: Path, entry: str, prompt: Any
) -> None:
    async with sqlite_runtime(tmp_path, refund_agent(ExecutionLog())) as rt:
        with pytest.raises(so.UsageError, match="prompt"):
            if entry == "generate":
                await rt.generate("a", prompt=prompt)
            else:
                await rt.schedule("a", prompt)
        assert await rt.sessions() == []


@pytest.mark.parametrize("retry_with", ["session_id", "same_approvals"])
async def test_failed_resume_is_retryable_without_losing_answers(
    tmp_path: Path, retry_with: str
) -> None:
    log = ExecutionLog()
    flaky = Flaky(reply("Refunded."), error=ConnectionError("model down"))
    async with sqlite_runtime(tmp_path, refund_agent(log, flaky)) as rt:
        r = await waiting_session(rt)
        rid = r.pending[0].id
        failed = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=rid, approved=True, reason="ok")]
        )
        assert failed.status == "failed"
        assert failed.retryable
        assert failed.error is not None and "model down" in failed.error["message"]
        assert failed.outcomes == [so.Outcome(request_id=rid, outcome="approved", applied=True)]
        assert log.count() == 1  # the approved tool ran before the model failed
        # the answer was kept: nothing is pending again
        assert await rt.pending() == []
        assert failed.pending == []
        if retry_with == "session_id":
            retried = await rt.generate(session_id=r.session_id)
        else:
            retried = await rt.generate(
                session_id=r.session_id, approvals=[so.Decision(id=rid, approved=True)]
            )
            assert retried.outcomes == [
                so.Outcome(request_id=rid, outcome="approved", applied=False)
            ]
        assert retried.status == "completed"
        assert retried.text == "Refunded."
        assert log.count() == 1  # the recorded tool result was not produced again
        assert flaky.calls == 2
        types = await types_of(rt, r.session_id)
        assert types.count("tool.started") == 1
        assert types.count("turn.failed") == 1


async def test_failed_resume_survives_a_new_runtime(tmp_path: Path) -> None:
    log = ExecutionLog()
    script: list[Any] = [
        call_tools(call("issue_refund", order_id="1", amount=5)),
        RuntimeError("provider 500"),
    ]
    async with sqlite_runtime(tmp_path, scripted_agent("a", script, tools=tools(log))) as rt:
        r = await waiting_session(rt)
        failed = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=r.pending[0].id, approved=True)]
        )
        assert failed.status == "failed" and failed.retryable
    fixed = scripted_agent("a", [script[0], reply("recovered")], tools=tools(log))
    async with sqlite_runtime(tmp_path, fixed) as rt2:
        retried = await rt2.generate(session_id=r.session_id)
        assert retried.status == "completed"
        assert retried.text == "recovered"
        assert log.count() == 1


@pytest.mark.parametrize(
    "bad",
    [
        {"id": "REQ", "approved": "maybe"},
        {"id": 5, "approved": True},
        {"id": "REQ"},
        {"approved": True},
        {"id": "REQ", "approved": True, "reason": 7},
        {"id": "REQ", "approved": True, "unexpected": 1},
        "REQ",
    ],
    ids=["approved-maybe", "int-id", "no-approved", "no-id", "int-reason", "extra", "string"],
)
async def test_wrong_typed_decisions_are_invalid_answers(tmp_path: Path, bad: Any) -> None:
    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log)) as rt:
        r = await waiting_session(rt)
        rid = r.pending[0].id
        if isinstance(bad, dict) and bad.get("id") == "REQ":
            bad = {**bad, "id": rid}
        before = await store_contents(rt.store, r.session_id)
        with pytest.raises(so.InvalidAnswer):
            await rt.generate(session_id=r.session_id, approvals=[bad])
        assert await store_contents(rt.store, r.session_id) == before


async def test_malformed_approvals_container_and_responses(tmp_path: Path) -> None:
    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log)) as rt:
        r = await waiting_session(rt)
        rid = r.pending[0].id
        before = await store_contents(rt.store, r.session_id)
        with pytest.raises(so.InvalidAnswer):
            await rt.generate(session_id=r.session_id, approvals={"id": rid, "approved": True})  # type: ignore[arg-type]
        with pytest.raises(so.InvalidAnswer):
            await rt.generate(
                session_id=r.session_id,
                approvals=[so.Decision(id=rid, approved=True), so.Decision(id=rid, approved=True)],
            )
        with pytest.raises(so.InvalidAnswer):
            await rt.respond(r.session_id, [{"request_id": rid, "option_id": "maybe"}])
        with pytest.raises(so.InvalidAnswer):
            await rt.respond(r.session_id, [{"request_id": 5, "option_id": "approve"}])
        with pytest.raises(so.InvalidAnswer):
            await rt.respond(r.session_id, [])
        # Not a list at all: a named error too, never a TypeError.
        single = so.InputResponse(request_id=rid, option_id="approve")
        for not_a_list in (None, 5, single, {"request_id": rid, "option_id": "approve"}):
            with pytest.raises(so.InvalidAnswer, match="list"):
                await rt.respond(r.session_id, not_a_list)  # type: ignore[arg-type]
        for not_decisions in (5, so.Decision(id=rid, approved=True)):
            with pytest.raises(so.InvalidAnswer, match="list"):
                await rt.generate(session_id=r.session_id, approvals=not_decisions)  # type: ignore[arg-type]
        with pytest.raises(pydantic.ValidationError):
            so.Decision(id=rid, approved="yes")
        assert await store_contents(rt.store, r.session_id) == before


async def test_answers_and_principals_that_skipped_validation_are_checked_again(
    store_url: str,
) -> None:
    """pydantic's `model_copy(update=)` and `model_construct` build a model without validating
    it: a decision copied with `approved="false"` (text from a form) approved the call and ran
    it, a reason of 5 was recorded as the deny's reason, a request id of 5 or a principal id of 5
    raised a bare TypeError or AttributeError. Each is checked again where it enters, as a dict
    is: `InvalidAnswer` (`UsageError` for a principal), nothing recorded, nothing run."""
    log = ExecutionLog()
    q = scripted_agent(
        "q",
        [call_tools(call("ask_question", question="Size?")), reply("ok")],
        tools=[so.ask_question()],
    )
    async with so.Runtime([refund_agent(log), q], store=store_url) as rt:
        r = await waiting_session(rt, auth=ALICE)
        asked = await rt.generate("q", prompt="ask", auth=ALICE)
        rid, qid = r.pending[0].id, asked.pending[0].id
        before = [await store_contents(rt.store, s) for s in (r.session_id, asked.session_id)]
        no = so.Decision(id=rid, approved=False)
        deny = so.InputResponse(request_id=rid, option_id="cancel")
        bad_decisions = [
            no.model_copy(update={"approved": "false"}),
            no.model_copy(update={"reason": 5}),
            no.model_copy(update={"id": 5}),
            so.Decision.model_construct(id=rid),  # type: ignore[call-arg]  # no `approved`
        ]
        for bad in bad_decisions:
            with pytest.raises(so.InvalidAnswer, match="approval #1 is malformed"):
                await rt.generate(session_id=r.session_id, approvals=[bad], auth=ALICE)
        bad_responses = [
            (r.session_id, deny.model_copy(update={"text": 5})),
            (r.session_id, deny.model_copy(update={"request_id": 5})),
            (r.session_id, deny.model_copy(update={"request_id": [rid]})),
            (
                asked.session_id,
                so.InputResponse(request_id=qid, text="S").model_copy(update={"text": 5}),
            ),
        ]
        for sid, response in bad_responses:
            with pytest.raises(so.InvalidAnswer, match="response #1 is malformed"):
                await rt.respond(sid, [response], principal=ALICE)
        nobody = ALICE.model_copy(update={"principal_id": 5})
        with pytest.raises(so.UsageError, match="principal is not a valid so.Principal"):
            await rt.respond(r.session_id, [deny], principal=nobody)
        with pytest.raises(so.UsageError, match="auth is not a valid so.Principal"):
            await rt.generate("a", prompt="refund order 2", auth=nobody)
        after = [await store_contents(rt.store, s) for s in (r.session_id, asked.session_id)]
        assert after == before
        assert log.count() == 0

        class Staff(so.Principal):  # an app's own principal type, checked again as itself
            team: str = "support"

        denied = await rt.respond(r.session_id, [deny], principal=Staff(**dict(ALICE)))
        assert denied.outcomes[0].outcome == "cancelled" and log.count() == 0


async def test_unknown_session_ids(tmp_path: Path) -> None:
    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log)) as rt:
        await waiting_session(rt)
        sid = "ses_does_not_exist"
        with pytest.raises(so.UnknownSession) as info:
            await rt.generate(session_id=sid, prompt="hi")
        assert info.value.session_id == sid
        assert sid in str(info.value)
        with pytest.raises(so.UnknownSession):
            await rt.generate(session_id=sid)
        with pytest.raises(so.UnknownSession):
            await rt.generate(session_id=sid, approvals=[so.Decision(id="req_x", approved=True)])
        with pytest.raises(so.UnknownSession):
            await rt.respond(sid, [so.InputResponse(request_id="req_x", option_id="approve")])
        with pytest.raises(so.UnknownSession):
            await rt.cancel(sid)
        with pytest.raises(so.UnknownSession):
            await rt.state(sid)
        with pytest.raises(so.UnknownSession):
            async for _ in rt.events(sid, follow=False):
                pass


async def test_answers_to_closed_requests_after_cancel(tmp_path: Path) -> None:
    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log)) as rt:
        r = await waiting_session(rt)
        rid = r.pending[0].id
        cancelled = await rt.cancel(r.session_id, reason="customer left")
        assert cancelled.status == "cancelled"
        assert cancelled.pending == []
        assert await rt.pending() == []
        before = await store_contents(rt.store, r.session_id)
        assert before.requests == [(rid, "withdrawn")]
        for approve in (True, False):
            with pytest.raises(so.RequestClosed) as info:
                await rt.generate(
                    session_id=r.session_id, approvals=[so.Decision(id=rid, approved=approve)]
                )
            assert info.value.request_ids == [rid]
        with pytest.raises(so.RequestClosed):
            await rt.respond(r.session_id, [so.InputResponse(request_id=rid, option_id="approve")])
        assert await store_contents(rt.store, r.session_id) == before
        assert log.count() == 0
        # cancelling again is a no-op, and the session takes a new prompt
        again = await rt.cancel(r.session_id)
        assert again.status == "cancelled"
        fresh = await rt.generate(session_id=r.session_id, prompt="start over")
        assert fresh.status == "completed"
        assert fresh.turn_id != r.turn_id
        assert log.count() == 0


async def test_who_cancelled_is_recorded_with_the_cancellation(tmp_path: Path) -> None:
    async with sqlite_runtime(tmp_path, refund_agent(ExecutionLog())) as rt:
        r = await waiting_session(rt, auth=ALICE)
        rid = r.pending[0].id
        for bad in ({"reason": 5}, {"principal": "alice"}):
            with pytest.raises(so.UsageError):
                await rt.cancel(r.session_id, **bad)
        assert (await rt.state(r.session_id)).turn.status == "waiting"  # type: ignore[union-attr]
        await rt.cancel(r.session_id, "customer left", principal=ALICE)
        events = [e async for e in rt.events(r.session_id, follow=False)]
        (cancelled,) = [e for e in events if e.type == "turn.cancelled"]
        assert cancelled.data == {"reason": "customer left", "by": ALICE.model_dump()}
        (withdrawn,) = [e for e in events if e.type == "input.resolved"]
        assert withdrawn.data["by"] == ALICE.model_dump()
        stored = await rt.store.get_request(rid)
        assert stored is not None and stored.resolution is not None
        assert stored.resolution["by"] == ALICE.model_dump()
        audited = [e for e in await rt.audit(r.session_id) if e.type == "turn.cancelled"]
        assert audited[0].data["by"] == ALICE.model_dump()


async def test_only_the_principal_whose_turn_asked_may_answer(tmp_path: Path) -> None:
    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log)) as rt:
        r = await waiting_session(rt, auth=ALICE)
        rid = r.pending[0].id
        before = await store_contents(rt.store, r.session_id)
        impostor = so.Principal(authenticator="other-idp", principal_id="alice")
        for who in (BOB, None, impostor):
            with pytest.raises(so.NotAllowed) as info:
                await rt.respond(
                    r.session_id,
                    [so.InputResponse(request_id=rid, option_id="approve")],
                    principal=who,
                )
            assert info.value.request_ids == [rid]
            with pytest.raises(so.NotAllowed):
                await rt.generate(
                    session_id=r.session_id,
                    approvals=[so.Decision(id=rid, approved=False)],
                    auth=who,
                )
        # the request stays pending for the right person
        assert await store_contents(rt.store, r.session_id) == before
        done = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=rid, option_id="approve")],
            principal=ALICE.model_copy(update={"attributes": {"team": "support"}}),
        )
        assert done.status == "completed"
        assert log.count() == 1


async def test_respond_one_request_at_a_time(tmp_path: Path) -> None:
    log = ExecutionLog()
    agent = scripted_agent(
        "a",
        [
            call_tools(
                call("issue_refund", order_id="1", amount=5),
                call("issue_refund", order_id="2", amount=6),
            ),
            reply("done"),
        ],
        tools=tools(log),
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await waiting_session(rt)
        a, b = (p.id for p in r.pending)
        r1 = await rt.respond(
            r.session_id, [so.InputResponse(request_id=b, option_id="approve")], resume=False
        )
        assert r1.status == "running"  # the approved call has work to do now
        assert [p.id for p in r1.pending] == [a]
        assert log.count() == 0  # resume=False: only the answer was recorded
        assert [p.id for p in await rt.pending(session_id=r.session_id)] == [a]
        r2 = await rt.respond(r.session_id, [so.InputResponse(request_id=a, option_id="approve")])
        assert r2.status == "completed"
        assert sorted(e.input["order_id"] for e in log.executions) == ["1", "2"]


async def test_pending_queue_across_sessions(tmp_path: Path) -> None:
    log = ExecutionLog()
    clock = ManualClock()
    agents = [refund_agent(log, name="a"), refund_agent(log, name="b")]
    async with sqlite_runtime(tmp_path, *agents, clock=clock) as rt:
        ra = await waiting_session(rt, "a")
        clock.advance(100)
        rb = await waiting_session(rt, "b")
        queue = await rt.pending()
        assert [p.session_id for p in queue] == [ra.session_id, rb.session_id]
        assert [p.id for p in await rt.pending(agent="b")] == [rb.pending[0].id]
        assert [p.id for p in await rt.pending(session_id=ra.session_id)] == [ra.pending[0].id]
        assert await rt.pending(tool_name="lookup_order") == []
        assert len(await rt.pending(tool_name="issue_refund", kind="tool-approval")) == 2
        assert [p.id for p in await rt.pending(older_than=50)] == [ra.pending[0].id]
        assert [p.id for p in await rt.pending(limit=1, offset=1)] == [rb.pending[0].id]
        # An age older than any time a store holds is no request, not a refused filter.
        assert await rt.pending(older_than=1.29e308) == []
