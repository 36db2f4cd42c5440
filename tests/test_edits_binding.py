"""Approvals bound to the exact call by its input hash: every approval request carries a hash of
the tool name, call id and canonical input; an answer given for another hash is stale and
changes nothing, and an edit is bound to the call it edits.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.testing import (
    Capture,
    ExecutionLog,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    store_contents,
    tool_results,
)

from ._edits import (
    ALICE,
    BOB,
    asked,
    events_of,
    refund_agent,
)

# -- binding: the input hash ----------------------------------------------------------------------


def expected_hash(tool_name: str, call_id: str, tool_input: Any) -> str:
    canonical = json.dumps(
        {"tool": tool_name, "call_id": call_id, "input": tool_input},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


async def test_each_request_carries_the_hash_of_its_exact_call(tmp_path: Path) -> None:
    log = ExecutionLog()
    agent = refund_agent(
        log,
        None,
        call("issue_refund", call_id="call_a", order_id="1042", amount=180),
        call("issue_refund", call_id="call_b", order_id="1042", amount=180),
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support", prompt="refund twice", auth=ALICE)
        a, b = r.pending
        for req in (a, b):
            assert req.action is not None
            assert req.action.input_hash == expected_hash(
                "issue_refund", req.action.call_id, req.action.input
            )
        # identical input, different calls: different hashes
        assert a.action is not None and b.action is not None
        assert a.action.input_hash != b.action.input_hash
        # the stored request and the event carry the same hash
        events = await events_of(rt, r.session_id)
        requested = next(e for e in events if e.type == "input.requested")
        hashes = [q["action"]["input_hash"] for q in requested.data["requests"]]
        assert hashes == [a.action.input_hash, b.action.input_hash]


@pytest.mark.parametrize("path", ["respond", "generate"])
async def test_an_answer_for_the_right_hash_settles(tmp_path: Path, path: str) -> None:
    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log)) as rt:
        sid, req, _ = await asked(rt)
        assert req.action is not None
        h = req.action.input_hash
        if path == "respond":
            r = await rt.respond(
                sid,
                [so.InputResponse(request_id=req.id, option_id="approve", input_hash=h)],
                principal=ALICE,
            )
        else:
            r = await rt.generate(
                session_id=sid,
                approvals=[so.Decision(id=req.id, approved=True, input_hash=h)],
                auth=ALICE,
            )
        assert r.status == "completed"
        assert log.count() == 1


@pytest.mark.parametrize("path", ["respond", "generate"])
async def test_an_answer_for_another_call_is_stale_and_changes_nothing(
    tmp_path: Path, path: str
) -> None:
    log = ExecutionLog()
    agent = refund_agent(
        log,
        None,
        call("issue_refund", call_id="call_a", order_id="1042", amount=180),
        call("issue_refund", call_id="call_b", order_id="1042", amount=180),
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support", prompt="refund twice", auth=ALICE)
        sid = r.session_id
        a, b = r.pending
        assert a.action is not None and b.action is not None
        before = await store_contents(rt.store, sid)
        wrong = [
            b.action.input_hash,  # the reviewer looked at the other call
            expected_hash("issue_refund", a.action.call_id, {**a.action.input, "amount": 18.0}),
            expected_hash("other_tool", a.action.call_id, a.action.input),
            "sha256:" + "0" * 64,
        ]
        for h in wrong:
            with pytest.raises(so.StaleAnswer) as info:
                if path == "respond":
                    await rt.respond(
                        sid,
                        [so.InputResponse(request_id=a.id, option_id="approve", input_hash=h)],
                        principal=ALICE,
                    )
                else:
                    await rt.generate(
                        session_id=sid,
                        approvals=[
                            so.Decision(id=a.id, approved=True, input_hash=h),
                            so.Decision(id=b.id, approved=True),
                        ],
                        auth=ALICE,
                    )
            assert info.value.request_ids == [a.id]
            assert a.action.input_hash in str(info.value)
            assert isinstance(info.value, so.AnswerError)
        assert await store_contents(rt.store, sid) == before
        assert log.count() == 0


async def test_a_stale_cancel_is_refused_too(tmp_path: Path) -> None:
    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log)) as rt:
        sid, req, _ = await asked(rt)
        before = await store_contents(rt.store, sid)
        with pytest.raises(so.StaleAnswer):
            await rt.respond(
                sid,
                [so.InputResponse(request_id=req.id, option_id="cancel", input_hash="sha256:x")],
                principal=ALICE,
            )
        assert await store_contents(rt.store, sid) == before


async def test_an_edit_is_bound_to_the_call_it_edits(tmp_path: Path) -> None:
    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log)) as rt:
        sid, req, _ = await asked(rt)
        assert req.action is not None
        edit = {"order_id": "1042", "amount": 10}
        with pytest.raises(so.StaleAnswer):
            await rt.respond(
                sid,
                [
                    so.InputResponse(
                        request_id=req.id,
                        option_id="approve",
                        edited_input=edit,
                        input_hash=expected_hash("issue_refund", req.action.call_id, edit),
                    )
                ],
                principal=ALICE,
            )
        # the hash names the call as proposed; the edit goes beside it
        r = await rt.respond(
            sid,
            [
                so.InputResponse(
                    request_id=req.id,
                    option_id="approve",
                    edited_input=edit,
                    input_hash=req.action.input_hash,
                )
            ],
            principal=ALICE,
        )
        assert r.status == "completed"
        assert [e.input["amount"] for e in log.executions] == [10.0]


async def test_a_stale_answer_to_a_response_policy_tool_records_nothing(tmp_path: Path) -> None:
    calls: list[so.ResponseContext] = []

    def anyone(ctx: so.ResponseContext) -> so.Allowed:
        calls.append(ctx)
        return so.Allowed()

    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=anyone)
    async with sqlite_runtime(tmp_path, refund_agent(log, spec)) as rt:
        sid, req, _ = await asked(rt)
        before = await store_contents(rt.store, sid)
        with pytest.raises(so.StaleAnswer):
            await rt.respond(
                sid,
                [so.InputResponse(request_id=req.id, option_id="approve", input_hash="sha256:0")],
                principal=BOB,
            )
        assert await store_contents(rt.store, sid) == before
        # No candidate: the policy only judged the decision (to refuse, it would have said so
        # rather than the hash, test_response_policies), then the fault was told.
        assert [(c.response.decision, c.response.edited_input) for c in calls] == [
            ("approve", None)
        ]


# -- size: an edit is bounded like the call's result -----------------------------------------------


async def test_an_edit_over_the_tools_max_result_bytes_is_refused(store_url: str) -> None:
    """The call's result repeats an edit to the model beside the tool's own result, read again
    by every later model call of the session: an edit over the tool's `max_result_bytes` went
    into that result whole, past the bound. It is refused (`InvalidAnswer`), nothing stored,
    and the request stays open for an edit that fits."""
    ran: list[str] = []

    @so.tool(approval=so.always(), max_result_bytes=4000)
    async def note(text: str) -> str:
        """Write a note."""
        ran.append(text)
        return "noted"

    seen = Capture(reply("ok"))
    agent = scripted_agent("a", [call_tools(call("note", text="hi")), seen], tools=[note])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        (req,) = r.pending
        head = await rt.store.head(r.session_id)
        big = so.InputResponse(
            request_id=req.id, option_id="approve", edited_input={"text": "y" * 100_000}
        )
        with pytest.raises(so.InvalidAnswer, match="over the limit of 4000 bytes"):
            await rt.respond(r.session_id, [big], principal=ALICE)
        assert await rt.store.head(r.session_id) == head
        fits = so.InputResponse(request_id=req.id, option_id="approve", edited_input={"text": "yo"})
        done = await rt.respond(r.session_id, [fits], principal=ALICE)
        assert done.status == "completed"
    (result,) = tool_results(seen.last)
    assert len(json.dumps(result.content)) < 4000
    assert ran == ["yo"]


async def test_an_answers_value_over_the_tools_max_result_bytes_is_refused(store_url: str) -> None:
    """The decision on an approval a tool asked for itself (`ctx.request_approval`) is the call's
    result, `value` and all, which every later model call reads: a value of 3,000,000 bytes went
    into that result whole under `max_result_bytes=4000` (a `tool.completed` of 3,000,266 bytes).
    Refused as an edit that large is (`InvalidAnswer`), nothing stored, the request left open."""

    @so.tool(max_result_bytes=4000)
    async def refund(ctx: so.ToolContext, amount: float) -> str:
        """Refund an order."""
        ctx.request_approval({"amount": amount})

    seen = Capture(reply("ok"))
    agent = scripted_agent("a", [call_tools(call("refund", amount=5)), seen], tools=[refund])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        (req,) = r.pending
        head = await rt.store.head(r.session_id)
        big = so.InputResponse(request_id=req.id, option_id="approve", value="v" * 100_000)
        with pytest.raises(so.InvalidAnswer, match="value is .* over the limit of 4000 bytes"):
            await rt.respond(r.session_id, [big], principal=ALICE)
        with pytest.raises(so.InvalidAnswer, match="over the limit of 4000 bytes"):
            await rt.generate(
                session_id=r.session_id,
                approvals=[so.Decision(id=req.id, approved=False, value=["v" * 100_000])],
                auth=ALICE,
            )
        assert await rt.store.head(r.session_id) == head
        assert [q.id for q in await rt.pending(session_id=r.session_id)] == [req.id]
        fits = so.InputResponse(request_id=req.id, option_id="approve", value={"ref": "R-1"})
        done = await rt.respond(r.session_id, [fits], principal=ALICE)
        assert done.status == "completed"
    (result,) = tool_results(seen.last)
    assert len(json.dumps(result.content)) < 4000
    assert "R-1" in json.dumps(result.content)
