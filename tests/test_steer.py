"""Follow-up messages: answering approvals and questions by text, steering, queueing, messages
from someone else, several requests at once, notes on a denial, and cancelling a turn."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff._types import make_options, match_option
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

ALICE = so.Principal(authenticator="okta", principal_id="alice")
BOB = so.Principal(authenticator="okta", principal_id="bob", principal_type="user")

PACKS = [
    {"label": "Three-pack", "description": "Three shirts."},
    {"label": "Six-pack", "description": "Six shirts."},
]


async def events(rt: so.Runtime, session_id: str) -> list[so.Event]:
    return [e async for e in rt.events(session_id, follow=False)]


def texts(conversation: list[so.Message]) -> list[tuple[str, Any]]:
    """(kind, text or tool result) for each message the model saw."""
    out: list[tuple[str, Any]] = []
    for m in conversation:
        if isinstance(m, so.ToolResultMessage):
            out.append(("tool", m.content))
        else:
            out.append((m.kind, m.text))
    return out


def refund_tool(log: ExecutionLog) -> so.Tool:
    @log.tool(approval=so.always())
    async def issue_refund(order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        return {"refunded": amount, "order_id": order_id}

    return issue_refund


def refund_agent(log: ExecutionLog, *steps: Any) -> so.Agent:
    first = call_tools(call("issue_refund", id="r1", order_id="1042", amount=180))
    return scripted_agent("support", [first, *steps], tools=[refund_tool(log)])


APPROVED_TAIL = [
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
DENIED_TAIL = [
    "input.requested tool-approval:issue_refund",
    "turn.waiting",
    "approval.settled cancel",
    "input.resolved cancelled",
    "tool.completed issue_refund denied",
    "model.completed",
    "turn.completed",
    "session.waiting",
]


# -- follow-up messages that answer ---------------------------------------------------------


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
    guess, so the message is the person's own words (the question takes free text)."""
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
        r = await rt.send(r.session_id, "1", principal=ALICE)
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


# -- steering and queueing ------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["steer", "queue"])
async def test_a_message_that_answers_no_approval_steers_even_when_queued(
    tmp_path: Path, policy: Any
) -> None:
    """A turn held on an approval can't end until someone acts, so even `queue` steers: the
    approval resolves `ignored`, the call never runs and the model reads the message next."""
    log = ExecutionLog()
    seen = Capture(reply("Only the three-pack then."))
    async with sqlite_runtime(tmp_path, refund_agent(log, seen)) as rt:
        r = await rt.generate("support", prompt="refund 1042", auth=ALICE)
        [req] = r.pending
        r = await rt.send(
            r.session_id, "wait, only refund the three-pack", principal=ALICE, turn_policy=policy
        )
        assert r.status == "completed"
        assert r.text == "Only the three-pack then."
        assert log.count() == 0
        log_events = await events(rt, r.session_id)
        assert timeline(log_events)[3:] == [
            "input.requested tool-approval:issue_refund",
            "turn.waiting",
            "input.resolved ignored",
            "turn.message wait, only refund the three-pack",
            "tool.completed issue_refund denied",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        resolved = next(e.data for e in log_events if e.type == "input.resolved")
        assert (resolved["request_id"], resolved["status"]) == (req.id, "withdrawn")
        message = next(e.data for e in log_events if e.type == "turn.message")
        assert message["policy"] == "steer" and not message.get("queued")
        assert texts(seen.last)[0] == ("user", "refund 1042")
        assert texts(seen.last)[-1] == ("user", "wait, only refund the three-pack")
        [result] = tool_results(seen.last)
        assert result.is_error is True
        assert result.content == {
            "denied": True,
            "reason": resolved["reason"],
            "by": None,
            "outcome": "ignored",
        }
        assert await rt.pending(session_id=r.session_id) == []


async def test_steering_runs_the_calls_already_approved_in_the_batch(tmp_path: Path) -> None:
    log = ExecutionLog()
    seen = Capture(reply("Refunded the first only."))
    two = call_tools(
        call("issue_refund", id="r1", order_id="1", amount=10),
        call("issue_refund", id="r2", order_id="2", amount=20),
    )
    agent = scripted_agent("support", [two, seen], tools=[refund_tool(log)])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support", prompt="refund both", auth=ALICE)
        first, second = r.pending
        assert (first.call_id, second.call_id) == ("r1", "r2")
        r = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=first.id, option_id="approve")],
            principal=ALICE,
        )
        assert r.status == "waiting"
        assert log.count() == 1  # an approved call runs while its sibling waits
        r = await rt.send(r.session_id, "skip the second one", principal=ALICE)
        assert r.status == "completed"
        assert [e.input["order_id"] for e in log.executions] == ["1"]
        assert timeline(await events(rt, r.session_id))[3:] == [
            "input.requested tool-approval:issue_refund, tool-approval:issue_refund",
            "turn.waiting",
            "approval.settled approve",
            "input.resolved approved",
            "tool.started issue_refund",
            "tool.completed issue_refund ok",
            "turn.waiting",  # still on the second
            "input.resolved ignored",
            "turn.message skip the second one",
            "tool.completed issue_refund denied",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        r1, r2 = tool_results(seen.last)
        assert (r1.call_id, r1.content) == ("r1", {"refunded": 10, "order_id": "1"})
        assert (r2.call_id, r2.is_error) == ("r2", True)
        assert texts(seen.last)[-1] == ("user", "skip the second one")


def plan_agent(seen: Capture, *more: Any) -> so.Agent:
    @so.tool
    async def pick_plan(ctx: so.ToolContext) -> str:
        """Choose a plan (options only)."""
        a = await ctx.ask("Which plan?", options=["basic", "pro"], allow_text=False)
        return a.value

    return scripted_agent(
        "sales", [call_tools(call("pick_plan", id="p1")), seen, *more], tools=[pick_plan]
    )


async def test_queue_keeps_the_message_for_after_the_turn(tmp_path: Path) -> None:
    first = Capture(reply("You're on pro."))
    later = Capture(reply("Sure, here's the invoice."))
    async with sqlite_runtime(tmp_path, plan_agent(first, later)) as rt:
        r = await rt.generate("sales", prompt="upgrade me", auth=ALICE)
        [req] = r.pending
        turn_id = r.turn_id
        q = await rt.send(
            r.session_id, "also send me the invoice", principal=ALICE, turn_policy="queue"
        )
        assert q.status == "waiting"  # the question is still open: nothing was withdrawn
        assert [p.id for p in q.pending] == [req.id]
        r = await rt.send(r.session_id, "pro", principal=ALICE)
        assert r.status == "completed"
        assert r.turn_id != turn_id  # the queued message started the next turn
        assert r.text == "Sure, here's the invoice."
        log = await events(rt, r.session_id)
        assert timeline(log)[3:] == [
            "tool.started pick_plan",
            "input.requested question:Which plan?",
            "turn.waiting",
            "turn.message queued:also send me the invoice",
            "input.resolved answered",
            "tool.completed pick_plan ok",
            "model.completed",
            "turn.completed",
            "session.waiting",
            "turn.started",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        started = [e for e in log if e.type == "turn.started"]
        assert started[1].data["message"] == "also send me the invoice"
        assert started[1].data["principal"]["principal_id"] == "alice"
        # the first turn's model never saw the queued message; the next turn's did, last
        assert ("user", "also send me the invoice") not in texts(first.last)
        assert texts(first.last)[-1] == ("tool", "pro")
        assert texts(later.last)[-1] == ("user", "also send me the invoice")
        assert len([m for m in later.last if m.kind == "user"]) == 2


async def test_steer_withdraws_the_question_and_the_model_reads_the_message(
    tmp_path: Path,
) -> None:
    seen = Capture(reply("What would you like instead?"))
    async with sqlite_runtime(tmp_path, plan_agent(seen)) as rt:
        r = await rt.generate("sales", prompt="upgrade me", auth=ALICE)
        [req] = r.pending
        r = await rt.send(r.session_id, "hmm, what does pro include?", principal=ALICE)
        assert r.status == "completed"
        log = await events(rt, r.session_id)
        resolved = next(e.data for e in log if e.type == "input.resolved")
        assert (resolved["request_id"], resolved["outcome"], resolved["status"]) == (
            req.id,
            "cancelled",
            "withdrawn",
        )
        assert texts(seen.last)[-1] == ("user", "hmm, what does pro include?")
        assert tool_results(seen.last)[0].content["cancelled"] is True


async def test_a_queued_message_during_a_running_tool_waits_and_aborts_nothing(
    tmp_path: Path,
) -> None:
    entered = asyncio.Event()
    release = asyncio.Event()
    aborted: list[bool] = []

    @so.tool
    async def crawl(ctx: so.ToolContext) -> str:
        """A long task."""
        entered.set()
        await asyncio.wait_for(release.wait(), timeout=10)
        aborted.append(ctx.abort_signal.is_set())
        return "crawled"

    first = Capture(reply("Crawl done."))
    later = Capture(reply("Here is the summary."))
    agent = scripted_agent("bot", [call_tools(call("crawl")), first, later], tools=[crawl])
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid = await rt.create_session("bot", auth=ALICE)
        running = asyncio.create_task(rt.generate(session_id=sid, prompt="crawl", auth=ALICE))
        await asyncio.wait_for(entered.wait(), timeout=10)
        await rt.send(sid, "then summarise it", principal=ALICE, turn_policy="queue")
        release.set()
        r = await running
        assert aborted == [False]
        assert r.status == "completed"
        assert r.text == "Here is the summary."
        assert texts(first.last)[-1] == ("tool", "crawled")
        assert texts(later.last)[-1] == ("user", "then summarise it")
        assert timeline(await events(rt, sid))[1:] == [
            "turn.started",
            "model.completed",
            "tool.started crawl",
            "turn.message queued:then summarise it",
            "tool.completed crawl ok",
            "model.completed",
            "turn.completed",
            "session.waiting",
            "turn.started",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]


@pytest.mark.parametrize("held_on", ["approval", "question"])
async def test_a_message_from_someone_else_waits_for_the_turn_to_end(
    tmp_path: Path, held_on: str
) -> None:
    log = ExecutionLog()
    first = Capture(reply("Done for Alice."))
    later = Capture(reply("Hello Bob."))
    if held_on == "approval":
        agent = refund_agent(log, first, later)
        answer = "approve"
    else:
        agent = plan_agent(first, later)
        answer = "pro"
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate(agent.name, prompt="please", auth=ALICE)
        [req] = r.pending
        # Bob's message names a valid option, but he is not who the turn serves: it waits,
        # answering nothing and steering nothing (not even an approval-held turn).
        b = await rt.send(r.session_id, answer, principal=BOB, turn_policy="steer")
        assert b.status == "waiting"
        assert [p.id for p in b.pending] == [req.id]
        assert log.count() == 0
        r = await rt.send(r.session_id, answer, principal=ALICE)
        assert r.status == "completed"
        assert r.text == "Hello Bob."
        log_events = await events(rt, r.session_id)
        tl = timeline(log_events)
        queued = tl.index(f"turn.message queued:{answer}")
        assert tl[queued - 1] == "turn.waiting"  # it arrived while the turn waited
        assert tl[queued + 1 : queued + 3] == [
            "approval.settled approve" if held_on == "approval" else "input.resolved answered",
            "input.resolved approved" if held_on == "approval" else "tool.completed pick_plan ok",
        ]
        assert tl.count("turn.started") == 2
        assert tl.index("turn.completed") < tl.index("turn.started", queued)
        started = [e.data for e in log_events if e.type == "turn.started"]
        assert started[1]["principal"]["principal_id"] == "bob"
        assert texts(later.last)[-1] == ("user", answer)
        resolved = next(e.data for e in log_events if e.type == "input.resolved")
        assert resolved["by"]["principal_id"] == "alice"


# -- several requests at once -------------------------------------------------------------


async def test_two_questions_in_one_response_are_answered_in_request_order(
    tmp_path: Path,
) -> None:
    seen = Capture(reply("Got both."))
    agent = scripted_agent(
        "shop",
        [
            call_tools(
                call("ask_question", id="a1", question="Colour?"),
                call(
                    "ask_question",
                    id="a2",
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
        call("issue_refund", id="r1", order_id="1", amount=10),
        call("issue_refund", id="r2", order_id="2", amount=20),
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
                call("ask_question", id="q1", question="Which pack?", options=PACKS),
                call("issue_refund", id="r1", order_id="1042", amount=30),
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


# -- denials with a note, and cancelling the turn -------------------------------------------


@pytest.mark.parametrize("asker", [ALICE, None], ids=["user-denies", "someone-else-denies"])
async def test_cancel_with_a_note_reaches_the_model_attributed_to_the_denier(
    tmp_path: Path, asker: so.Principal | None
) -> None:
    log = ExecutionLog()
    seen = Capture(reply("I'll refund only the three-pack."))
    denier = ALICE if asker is not None else BOB
    async with sqlite_runtime(tmp_path, refund_agent(log, seen)) as rt:
        r = await rt.generate("support", prompt="refund 1042", auth=asker)
        [req] = r.pending
        r = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=req.id, option_id="cancel", text="Only the three-pack.")],
            principal=denier,
        )
        assert r.status == "completed"
        assert log.count() == 0
        log_events = await events(rt, r.session_id)
        assert timeline(log_events)[3:] == DENIED_TAIL
        settled = next(e.data for e in log_events if e.type == "approval.settled")
        assert settled["reason"] == "Only the three-pack."
        assert settled["by"]["principal_id"] == denier.principal_id
        resolved = next(e.data for e in log_events if e.type == "input.resolved")
        assert resolved["reason"] == "Only the three-pack."  # readable in the stream
        assert resolved["by"]["principal_id"] == denier.principal_id
        [result] = tool_results(seen.last)
        assert result.is_error is True
        who = denier.principal_id
        assert result.content == {
            "denied": True,
            "reason": "Only the three-pack.",
            "by": who,
            "note": f'Written by {who}, who denied this call: "Only the three-pack."',
        }


@pytest.mark.parametrize("held_on", ["approval", "question"])
async def test_cancelling_the_turn_withdraws_its_requests_for_good(
    tmp_path: Path, held_on: str
) -> None:
    log = ExecutionLog()
    model = Capture(reply("never"))
    if held_on == "approval":
        agent = refund_agent(log, model)
        late = so.InputResponse(request_id="", option_id="approve")
    else:
        agent = plan_agent(model)
        late = so.InputResponse(request_id="", option_id="pro")
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate(agent.name, prompt="please", auth=ALICE)
        [req] = r.pending
        c = await rt.cancel(r.session_id, reason="changed my mind")
        assert c.status == "cancelled"
        assert c.pending == []
        assert await rt.pending(session_id=r.session_id) == []
        log_events = await events(rt, r.session_id)
        assert timeline(log_events)[-3:] == [
            "input.resolved cancelled",
            "turn.cancelled",
            "session.waiting",
        ]
        resolved = next(e.data for e in log_events if e.type == "input.resolved")
        assert (resolved["request_id"], resolved["status"]) == (req.id, "withdrawn")

        before = await store_contents(rt.store, r.session_id)
        assert (req.id, "withdrawn") in before.requests
        with pytest.raises(so.RequestClosed) as closed:
            await rt.respond(
                r.session_id, [late.model_copy(update={"request_id": req.id})], principal=ALICE
            )
        assert req.id in str(closed.value)
        if held_on == "approval":
            with pytest.raises(so.AnswerError):
                await rt.generate(
                    session_id=r.session_id,
                    approvals=[so.Decision(id=req.id, approved=True)],
                    auth=ALICE,
                )
        assert await store_contents(rt.store, r.session_id) == before
        assert log.count() == 0
        assert model.conversations == []  # the model was never called again


async def test_a_question_asked_after_a_steering_message_is_withdrawn_at_once(
    tmp_path: Path,
) -> None:
    """The message arrives while the workflow call is still busy (in a step); the question it
    asks afterwards must not park the turn on a stale question: it is withdrawn, the call
    settles and the model reads the message."""
    entered = asyncio.Event()
    release = asyncio.Event()
    outcomes: list[str] = []

    async def slow_quote() -> float:
        entered.set()
        await asyncio.wait_for(release.wait(), timeout=10)
        return 2.5

    @so.tool
    async def transfer(ctx: so.ToolContext) -> str:
        """Quote, then confirm."""
        fee = await ctx.step("quote", slow_quote)
        try:
            a = await ctx.ask(f"Fee {fee}. Proceed?", options=["yes", "no"], allow_text=False)
        except so.QuestionWithdrawn as exc:
            outcomes.append(exc.outcome)
            raise
        return a.value

    seen = Capture(reply("Okay, not transferring."))
    agent = scripted_agent("bank", [call_tools(call("transfer")), seen], tools=[transfer])
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid = await rt.create_session("bank", auth=ALICE)
        running = asyncio.create_task(rt.generate(session_id=sid, prompt="transfer", auth=ALICE))
        await asyncio.wait_for(entered.wait(), timeout=10)
        steering = asyncio.create_task(rt.send(sid, "stop, wrong account", principal=ALICE))
        for _ in range(200):  # until the message is recorded
            if "turn.message stop, wrong account" in timeline(await events(rt, sid)):
                break
            await asyncio.sleep(0.01)
        release.set()
        r = await asyncio.wait_for(running, timeout=10)
        await asyncio.wait_for(steering, timeout=10)
        assert r.status == "completed"
        assert r.pending == []
        assert outcomes == ["cancelled"]
        assert timeline(await events(rt, sid))[1:] == [
            "turn.started",
            "model.completed",
            "tool.started transfer",
            "turn.message stop, wrong account",
            "tool.step transfer:quote",
            "tool.completed transfer cancelled",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        assert texts(seen.last)[-1] == ("user", "stop, wrong account")
        assert await rt.pending(session_id=sid) == []


async def test_steering_a_workflow_call_also_ignores_the_approval_waiting_behind_it(
    tmp_path: Path,
) -> None:
    """The approval beside a workflow call was not asked yet when the message came; it is not
    asked afterwards either: the call never runs and the model reads the message next."""
    log = ExecutionLog()

    @so.tool
    async def pick_pack(ctx: so.ToolContext) -> str:
        """Choose a pack (options only)."""
        a = await ctx.ask("Which pack?", options=["three", "six"], allow_text=False)
        return a.value

    seen = Capture(reply("Okay, nothing refunded."))
    agent = scripted_agent(
        "support",
        [
            call_tools(
                call("pick_pack", id="p1"),
                call("issue_refund", id="r1", order_id="1042", amount=30),
            ),
            seen,
        ],
        tools=[pick_pack, refund_tool(log)],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support", prompt="refund a pack", auth=ALICE)
        assert [p.kind for p in r.pending] == ["question"]
        r = await rt.send(r.session_id, "forget the refund", principal=ALICE)
        assert r.status == "completed"
        assert r.pending == []
        assert log.count() == 0
        assert timeline(await events(rt, r.session_id))[3:] == [
            "tool.started pick_pack",
            "input.requested question:Which pack?",
            "turn.waiting",
            "input.resolved cancelled",
            "turn.message forget the refund",
            "tool.completed pick_pack cancelled",
            "tool.completed issue_refund denied",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        p1, r1 = tool_results(seen.last)
        assert p1.content["cancelled"] is True
        assert r1.content["denied"] is True and r1.content["outcome"] == "ignored"
        assert texts(seen.last)[-1] == ("user", "forget the refund")
        assert await rt.pending(session_id=r.session_id) == []


async def test_a_message_waiting_on_a_cancelled_turn_goes_before_later_ones(
    tmp_path: Path,
) -> None:
    """Bob's message waited for Alice's turn to end; Alice cancels it and writes again: Bob's
    message is handled first, then hers, each in a turn of its own."""
    bob_turn = Capture(reply("Hi Bob."))
    alice_turn = Capture(reply("Hi again, Alice."))
    async with sqlite_runtime(tmp_path, plan_agent(bob_turn, alice_turn)) as rt:
        r = await rt.generate("sales", prompt="upgrade me", auth=ALICE)
        sid = r.session_id
        b = await rt.send(sid, "bob here", principal=BOB)
        assert b.status == "waiting"
        c = await rt.cancel(sid)
        assert c.status == "cancelled"
        r = await rt.send(sid, "hello again", principal=ALICE)
        assert r.status == "completed"
        assert r.text == "Hi again, Alice."
        log = await events(rt, sid)
        assert timeline(log)[6:] == [
            "turn.message queued:bob here",
            "input.resolved cancelled",
            "turn.cancelled",
            "session.waiting",
            "turn.message queued:hello again",
            "turn.started",
            "model.completed",
            "turn.completed",
            "session.waiting",
            "turn.started",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        started = [e.data for e in log if e.type == "turn.started"]
        assert [(d["message"], d["principal"]["principal_id"]) for d in started] == [
            ("upgrade me", "alice"),
            ("bob here", "bob"),
            ("hello again", "alice"),
        ]
        assert texts(bob_turn.last)[-1] == ("user", "bob here")
        assert ("user", "hello again") not in texts(bob_turn.last)
        assert texts(alice_turn.last)[-1] == ("user", "hello again")
        assert (await rt.state(sid)).queued == []


async def test_resuming_a_cancelled_turn_starts_the_message_that_waited(tmp_path: Path) -> None:
    bob_turn = Capture(reply("Hi Bob."))
    async with sqlite_runtime(tmp_path, plan_agent(bob_turn)) as rt:
        r = await rt.generate("sales", prompt="upgrade me", auth=ALICE)
        await rt.send(r.session_id, "bob here", principal=BOB)
        await rt.cancel(r.session_id)
        r = await rt.generate(session_id=r.session_id)
        assert r.status == "completed"
        assert r.text == "Hi Bob."
        assert texts(bob_turn.last)[-1] == ("user", "bob here")


async def test_a_worker_starts_the_message_that_waited_on_a_cancelled_turn(
    tmp_path: Path,
) -> None:
    bob_turn = Capture(reply("Hi Bob."))
    url = f"sqlite:///{tmp_path / 'state.db'}"
    agent = plan_agent(bob_turn)
    async with so.Runtime([agent], store=url) as rt:
        r = await rt.generate("sales", prompt="upgrade me", auth=ALICE)
        sid = r.session_id
        await rt.send(sid, "bob here", principal=BOB)
        await rt.cancel(sid)
    async with so.Runtime([agent], store=url, inline=False) as worker:
        stop = asyncio.Event()
        working = asyncio.create_task(worker.work(stop=stop, idle_wait=0.05))
        try:
            for _ in range(200):
                if bob_turn.conversations:
                    break
                await asyncio.sleep(0.02)
        finally:
            stop.set()
            await asyncio.wait_for(working, timeout=10)
        assert texts(bob_turn.last)[-1] == ("user", "bob here")
        state = await worker.state(sid)
        assert state.turn is not None and state.turn.status == "completed"
        assert state.queued == []


async def test_a_message_sent_while_the_model_thinks_comes_after_the_reply_it_missed(
    tmp_path: Path,
) -> None:
    # The reply that did not read the message came before it in the conversation sent next, so
    # the request ended with the assistant's own reply: Anthropic takes that as a prefill to go
    # on with, not as a message to answer.
    seen: list[list[tuple[str, Any]]] = []
    sent: list[asyncio.Task[so.GenerateResult]] = []

    async def first(conversation: list[so.Message]) -> so.ModelResponse:
        sent.append(asyncio.create_task(rt.send(sid, "also, in euros")))
        while not (await events(rt, sid))[-1].type == "turn.message":
            await asyncio.sleep(0.01)
        return so.ModelResponse(text="It costs 180 dollars.")

    def second(conversation: list[so.Message]) -> so.ModelResponse:
        seen.append(texts(conversation))
        return so.ModelResponse(text="160 euros.")

    agent = so.Agent(name="a", model=so.models.Scripted([first, second]))
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db") as rt:
        sid = await rt.create_session("a")
        r = await rt.generate(session_id=sid, prompt="price?")
        await sent[0]
        assert (r.status, r.text.endswith("160 euros.")) == ("completed", True)
    assert seen == [
        [("user", "price?"), ("assistant", "It costs 180 dollars."), ("user", "also, in euros")]
    ]
