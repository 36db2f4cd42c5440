"""Follow-up messages that answer: naming an approval's or a question's option settles it, and
with several requests open at once a message answers them in request order."""

from __future__ import annotations

from pathlib import Path

import pytest

import signoff as so
from signoff._option_names import match_option
from signoff._types import make_options
from signoff.testing import (
    Capture,
    ExecutionLog,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    store_contents,
    timeline,
    tool_results,
)

from ._steer import ALICE, APPROVED_TAIL, DENIED_TAIL, PACKS, events, refund_agent, refund_tool


@pytest.mark.parametrize(
    ("message", "approved"),
    [
        ("approve", True),
        ("Approve", True),
        ("1", True),
        ("cancel", False),
        ("Deny", False),
        ("deny", False),
        ("2", False),
    ],
)
async def test_a_message_naming_an_approval_option_settles_it(
    tmp_path: Path, message: str, approved: bool
) -> None:
    log = ExecutionLog()
    seen = Capture(reply("Done."))
    async with sqlite_runtime(tmp_path, refund_agent(log, seen)) as rt:
        r = await rt.generate("support", prompt="refund 1042", auth=ALICE)
        [req] = r.pending
        assert [(o.id, o.label) for o in req.options] == [
            ("approve", "Approve"),
            ("cancel", "Deny"),
        ]
        r = await rt.send(r.session_id, message, principal=ALICE)
        assert r.status == "completed"
        assert r.outcomes == [
            so.Outcome(
                request_id=req.id, outcome="approved" if approved else "cancelled", applied=True
            )
        ]
        assert log.count("issue_refund") == (1 if approved else 0)
        tl = timeline(await events(rt, r.session_id))
        assert tl[3:] == (APPROVED_TAIL if approved else DENIED_TAIL)
        [result] = tool_results(seen.last)
        if approved:
            assert result.content == {"refunded": 180, "order_id": "1042"}
        else:
            assert result.is_error is True
            assert result.content == {"denied": True, "reason": None, "by": "alice"}
        # an answer is not a message the model reads
        assert [m.kind for m in seen.last] == ["user", "assistant", "tool"]


async def test_a_message_naming_a_question_option_by_id_label_or_index(tmp_path: Path) -> None:
    answers: list[so.Answer] = []

    @so.tool
    async def ship(ctx: so.ToolContext) -> str:
        """Choose the shipping speed."""
        a = await ctx.ask(
            "Shipping?",
            options=[{"id": "std", "label": "Standard"}, {"id": "exp", "label": "Express"}],
            allow_text=False,
        )
        answers.append(a)
        return a.value

    steps = [call_tools(call("ship")), reply("ok")] * 3
    agent = scripted_agent("shop", steps, tools=[ship])
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid = await rt.create_session("shop", auth=ALICE)
        for message in ("exp", "EXPRESS", "2"):
            r = await rt.send(sid, "ship it", principal=ALICE)
            assert r.status == "waiting"
            r = await rt.send(sid, message, principal=ALICE)
            assert r.status == "completed"
        assert [(a.value, a.option_id, a.text) for a in answers] == [("Express", "exp", None)] * 3


async def test_a_message_naming_two_options_is_not_taken_as_either(tmp_path: Path) -> None:
    """ "1" is the label of the third option and the index of the first: picking either would
    guess, and taking it as the person's own words (the question takes free text) would hand the
    model the same guess, so it is refused saying how to name each, nothing is recorded, and the
    question waits for a reply that names one."""
    seen = Capture(reply("ok"))
    counts = [
        {"label": "5", "description": "Five."},
        {"label": "10", "description": "Ten."},
        {"label": "1", "description": "One."},
    ]
    asked = call("ask_question", question="How many?", options=counts)
    agent = scripted_agent("shop", [call_tools(asked), seen], tools=[so.ask_question()])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("shop", prompt="order shirts", auth=ALICE)
        (q,) = r.pending
        before = await store_contents(rt.store, r.session_id)
        with pytest.raises(so.InvalidAnswer, match="to choose 1, reply 3") as caught:
            await rt.send(r.session_id, "1", principal=ALICE)
        assert caught.value.request_ids == [q.id]
        assert await store_contents(rt.store, r.session_id) == before
        r = await rt.send(r.session_id, "3", principal=ALICE)
        assert r.status == "completed"
        (result,) = tool_results(seen.last)
        assert result.content == {"status": "answered", "answer": "1"}


async def test_a_message_of_thousands_of_digits_steers(tmp_path: Path) -> None:
    """A number too long to convert names no option: the message steers like any other."""
    log = ExecutionLog()
    seen = Capture(reply("ok"))
    async with sqlite_runtime(tmp_path, refund_agent(log, seen)) as rt:
        r = await rt.generate("support", prompt="refund 1042", auth=ALICE)
        [req] = r.pending
        r = await rt.send(r.session_id, "9" * 5000, principal=ALICE)
        assert r.status == "completed"
        assert log.count("issue_refund") == 0
        [resolved] = [e for e in await events(rt, r.session_id) if e.type == "input.resolved"]
        assert (resolved.data["request_id"], resolved.data["outcome"]) == (req.id, "ignored")


def test_option_matching_refuses_a_text_that_names_two_options() -> None:
    options = make_options(
        [{"id": "a", "label": "B"}, {"id": "b", "label": "Other"}, {"id": "c", "label": "2"}]
    )
    assert match_option(options, "b") is None  # a's label, b's id
    assert match_option(options, "2") is None  # c's label, b's index
    assert match_option(options, "other").id == "b"  # type: ignore[union-attr]
    assert match_option(options, " 3 ").id == "c"  # type: ignore[union-attr]
    same = make_options(["yes", "no"])  # id and label of one option: no ambiguity
    assert match_option(same, "YES").id == "yes"  # type: ignore[union-attr]


async def test_two_questions_in_one_response_are_answered_in_request_order(
    tmp_path: Path,
) -> None:
    seen = Capture(reply("Got both."))
    agent = scripted_agent(
        "shop",
        [
            call_tools(
                call("ask_question", call_id="a1", question="Colour?"),
                call(
                    "ask_question",
                    call_id="a2",
                    question="Size?",
                    options=[
                        {"label": "Medium", "description": "M."},
                        {"label": "Large", "description": "L."},
                    ],
                ),
            ),
            seen,
        ],
        tools=[so.ask_question()],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("shop", prompt="buy a shirt", auth=ALICE)
        assert [p.question for p in r.pending] == ["Colour?", "Size?"]
        colour, size = r.pending
        # "Large" names an option of the second question but answers the first (free text)
        r = await rt.send(r.session_id, "Large", principal=ALICE)
        assert [p.id for p in r.pending] == [size.id]
        r = await rt.send(r.session_id, "1", principal=ALICE)
        assert r.status == "completed"
        a1, a2 = tool_results(seen.last)
        assert (a1.call_id, a1.content) == ("a1", {"status": "answered", "answer": "Large"})
        assert (a2.call_id, a2.content) == ("a2", {"status": "answered", "answer": "Medium"})
        log = await events(rt, r.session_id)
        assert timeline(log)[3:] == [
            "tool.started ask_question",
            "input.requested question:Colour?",
            "tool.started ask_question",
            "input.requested question:Size?",
            "turn.waiting",
            "input.resolved answered",
            "tool.completed ask_question ok",
            "turn.waiting",
            "input.resolved answered",
            "tool.completed ask_question ok",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        resolved = [e.data["request_id"] for e in log if e.type == "input.resolved"]
        assert resolved == [colour.id, size.id]


async def test_several_approvals_a_message_answers_only_the_first(tmp_path: Path) -> None:
    log = ExecutionLog()
    seen = Capture(reply("One refunded."))
    two = call_tools(
        call("issue_refund", call_id="r1", order_id="1", amount=10),
        call("issue_refund", call_id="r2", order_id="2", amount=20),
    )
    agent = scripted_agent("support", [two, seen], tools=[refund_tool(log)])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support", prompt="refund both", auth=ALICE)
        first, second = r.pending
        r = await rt.send(r.session_id, "cancel", principal=ALICE)
        assert r.status == "waiting"
        assert [p.id for p in r.pending] == [second.id]
        assert r.outcomes == [so.Outcome(request_id=first.id, outcome="cancelled", applied=True)]
        r = await rt.send(r.session_id, "approve", principal=ALICE)
        assert r.status == "completed"
        assert [e.input["order_id"] for e in log.executions] == ["2"]
        r1, r2 = tool_results(seen.last)
        assert r1.call_id == "r1" and r1.is_error
        assert r2.call_id == "r2" and r2.content == {"refunded": 20, "order_id": "2"}


async def test_an_approval_beside_a_workflow_call_is_requested_after_it(tmp_path: Path) -> None:
    log = ExecutionLog()
    seen = Capture(reply("Refunded the three-pack."))
    agent = scripted_agent(
        "support",
        [
            call_tools(
                call("ask_question", call_id="q1", question="Which pack?", options=PACKS),
                call("issue_refund", call_id="r1", order_id="1042", amount=30),
            ),
            seen,
        ],
        tools=[so.ask_question(), refund_tool(log)],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support", prompt="refund a pack", auth=ALICE)
        assert [(p.kind, p.call_id) for p in r.pending] == [("question", "q1")]
        assert [p.kind for p in await rt.pending(session_id=r.session_id)] == ["question"]
        r = await rt.send(r.session_id, "Three-pack", principal=ALICE)
        assert r.status == "waiting"
        assert [(p.kind, p.call_id) for p in r.pending] == [("tool-approval", "r1")]
        assert log.count() == 0
        r = await rt.send(r.session_id, "approve", principal=ALICE)
        assert r.status == "completed"
        assert log.count() == 1
        assert timeline(await events(rt, r.session_id))[3:] == [
            "tool.started ask_question",
            "input.requested question:Which pack?",
            "turn.waiting",
            "input.resolved answered",
            "tool.completed ask_question ok",
            "input.requested tool-approval:issue_refund",
            "turn.waiting",
            "approval.settled approve",
            "input.resolved approved",
            "tool.started issue_refund",
            "tool.completed issue_refund ok",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        q1, r1 = tool_results(seen.last)
        assert q1.content == {"status": "answered", "answer": "Three-pack"}
        assert r1.content == {"refunded": 30, "order_id": "1042"}
