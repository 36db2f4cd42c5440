"""Text channels show one request at a time, in request order, and a reply answers the one shown:
questions, `parse_reply`, the terminal's prompts, an answer when the turn cannot resume."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
from rich.console import Console

import signoff as so
from signoff.channels import (
    ChannelHub,
    Resolution,
    TerminalChannel,
    TerminalTextChannel,
    parse_reply,
)
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from ._channels import BOB, Texts, manual, runtime, status, three_refunds


async def test_three_requests_are_shown_one_at_a_time_and_a_reply_answers_the_one_shown(
    store_url: str,
) -> None:
    runs: list[str] = []
    async with so.Runtime([three_refunds(runs)], store=store_url) as rt:
        r = await rt.generate("support", prompt="Refund A, B and C")
        a, b, c = r.pending
        assert [x.input["order_id"] for x in (a, b, c)] == ["A-1", "B-2", "C-3"]
        sms = Texts()
        async with manual(ChannelHub(rt, [sms])) as hub:
            await hub.poll()
            # only the first is shown, though all three are open
            assert sms.sent == [sms.render(a)]
            assert sms.sent[0].startswith('support wants to run issue_refund({"order_id":"A-1"')
            assert [x.id for x in sms.waiting] == [a.id, b.id, c.id]

            # a reply that answers nothing gets a hint and settles nothing
            assert await sms.reply("what is this?", BOB) is None
            assert (
                sms.sent[-1] == "Reply yes to approve or no to deny (a reason may follow: no: why)."
            )
            assert [await status(rt, x.id) for x in (a, b, c)] == [("pending", None)] * 3

            # "yes" answers A (the one shown), and only then is B shown
            outcome = await sms.reply("yes", BOB)
            assert outcome is not None and (outcome.request_id, outcome.outcome) == (
                a.id,
                "approved",
            )
            assert await status(rt, a.id) == ("settled", "approved")
            assert await status(rt, b.id) == ("pending", None)
            assert sms.sent[-1] == sms.render(b)
            await hub.poll()  # the feed's own news of A changes nothing
            assert sms.sent[-1] == sms.render(b)

            # "no: ..." denies B with its reason; C is shown
            outcome = await sms.reply("no: over the limit", BOB)
            assert outcome is not None and (outcome.request_id, outcome.outcome) == (
                b.id,
                "cancelled",
            )
            stored = await rt.store.get_request(b.id)
            assert stored is not None and stored.resolution is not None
            assert stored.resolution["reason"] == "over the limit"
            assert stored.resolution["by"]["principal_id"] == "sms:+15550100"
            assert sms.sent[-1] == sms.render(c)

            # C is answered elsewhere while it is shown: the person is told, nothing more waits
            await rt.respond(r.session_id, [so.InputResponse(request_id=c.id, option_id="approve")])
            await hub.poll()
            assert sms.sent[-1].startswith("issue_refund was approved by the policy at ")
            assert sms.current is None
            assert await sms.reply("yes", BOB) is None
            assert sms.sent[-1] == "Nothing is waiting for an answer."
        assert runs == ["A-1", "C-3"]
        shown = [t for t in sms.sent if t.startswith("support wants")]
        assert shown == [sms.render(a), sms.render(b), sms.render(c)]


async def test_a_reply_is_bound_to_the_request_shown_even_if_it_closed_meanwhile(
    tmp_path: Path,
) -> None:
    runs: list[str] = []
    async with runtime(tmp_path, three_refunds(runs)) as rt:
        r = await rt.generate("support", prompt="Refund A, B and C")
        a, b, c = r.pending
        sms = Texts()
        async with manual(ChannelHub(rt, [sms])) as hub:
            await hub.poll()
            assert sms.current is not None and sms.current.id == a.id
            # A is denied elsewhere, and the hub has not caught up yet: the reply still means A
            await rt.respond(r.session_id, [so.InputResponse(request_id=a.id, option_id="cancel")])
            assert await sms.reply("yes", BOB) is None
            assert sms.sent[-1].startswith("This request can no longer be answered")
            assert await status(rt, a.id) == ("settled", "cancelled")
            assert await status(rt, b.id) == ("pending", None)  # B was not answered by mistake
            await hub.poll()
            assert sms.sent[-2].startswith("issue_refund was denied by the policy")
            assert sms.sent[-1] == sms.render(b)
        assert runs == []


async def test_a_reply_to_a_request_settled_the_same_way_elsewhere_says_so(
    tmp_path: Path,
) -> None:
    runs: list[str] = []
    async with runtime(tmp_path, three_refunds(runs)) as rt:
        r = await rt.generate("support", prompt="Refund A, B and C")
        a, b, _ = r.pending
        sms = Texts()
        async with manual(ChannelHub(rt, [sms])) as hub:
            await hub.poll()
            # A is approved elsewhere and the hub has not caught up: the same answer is a no-op,
            # and the person hears who settled A before B is shown
            await rt.respond(r.session_id, [so.InputResponse(request_id=a.id, option_id="approve")])
            outcome = await sms.reply("yes", BOB)
            assert outcome is not None and not outcome.applied
            assert sms.sent[-2] == "issue_refund was already approved by the policy."
            assert sms.sent[-1] == sms.render(b)
            # a response of the wrong shape is told to the person, not raised at the caller
            wrong = so.InputResponse(request_id=b.id, option_id="maybe")
            assert await sms.answer(b, wrong, BOB) is None
            assert sms.sent[-1].startswith("Your answer was not accepted: request ")
            await hub.poll()
            assert sms.sent[-1].startswith("Your answer was not accepted")  # nothing told twice
        assert await status(rt, b.id) == ("pending", None)
        assert runs == ["A-1"]


async def test_a_restarted_hub_does_not_show_the_current_request_again(tmp_path: Path) -> None:
    runs: list[str] = []
    state = tmp_path / "channels.db"
    async with runtime(tmp_path, three_refunds(runs)) as rt:
        r = await rt.generate("support", prompt="Refund A, B and C")
        a, b, _ = r.pending
        first = Texts()
        async with manual(ChannelHub(rt, [first], state=state)) as hub:
            await hub.poll()
        assert first.sent == [first.render(a)]
        again = Texts()
        async with manual(ChannelHub(rt, [again], state=state)) as hub:
            await hub.poll()
            assert again.sent == []  # A is still the one the person sees
            await again.reply("y", BOB)
            assert await status(rt, a.id) == ("settled", "approved")
            assert again.sent == [again.render(b)]
        assert runs == ["A-1"]


async def test_questions_by_text_numbers_labels_and_free_text(tmp_path: Path) -> None:
    ask = call(
        "ask_question",
        question="Which size?",
        options=[
            {"label": "Small", "description": "250 ml."},
            {"label": "Large", "description": "1 l."},
        ],
    )
    agent = scripted_agent(
        "shop", [call_tools(ask), call_tools(ask), reply("ok")], tools=[so.ask_question()]
    )
    async with runtime(tmp_path, agent) as rt:
        r = await rt.generate("shop", prompt="Reorder")
        (q1,) = r.pending
        sms = Texts()
        async with manual(ChannelHub(rt, [sms])) as hub:
            await hub.poll()
            assert sms.sent == [
                "Which size?\n1. Small - 250 ml.\n2. Large - 1 l.\n"
                "Reply with a number (1-2) or your own answer."
            ]
            outcome = await sms.reply("2", BOB)
            assert outcome is not None and outcome.outcome == "answered"
            stored = await rt.store.get_request(q1.id)
            assert stored is not None and stored.resolution is not None
            assert stored.resolution["answer"]["value"] == "Large"
            await hub.poll()  # the second question opened when the first was answered
            (q2,) = await rt.pending()
            assert sms.current is not None and sms.current.id == q2.id
            await sms.reply("the medium one, please", BOB)
            stored = await rt.store.get_request(q2.id)
            assert stored is not None and stored.resolution is not None
            assert stored.resolution["answer"]["text"] == "the medium one, please"


def test_parse_reply() -> None:
    approval = so.InputRequest(
        kind="tool-approval", id="req_1", session_id="s", turn_id="t", agent="a", created_at=0.0
    )
    assert parse_reply(approval, "Yes") == so.InputResponse(request_id="req_1", option_id="approve")
    assert parse_reply(approval, "deny - too big") == so.InputResponse(
        request_id="req_1", option_id="cancel", text="too big"
    )
    assert parse_reply(approval, "2") == so.InputResponse(request_id="req_1", option_id="cancel")
    assert parse_reply(approval, "maybe") is None
    assert parse_reply(approval, "   ") is None
    question = approval.model_copy(
        update={
            "kind": "question",
            "options": [so.Option(id="red", label="Red"), so.Option(id="blue", label="Blue")],
        }
    )
    assert parse_reply(question, "BLUE") == so.InputResponse(request_id="req_1", option_id="blue")
    assert parse_reply(question, "green") is None  # free text is not allowed here


async def test_the_terminal_prompts_are_a_text_channel(tmp_path: Path) -> None:
    runs: list[str] = []
    lines = iter(["y", "n", "not today", "y"])
    out = io.StringIO()
    terminal = TerminalChannel(
        Console(file=out, width=200, highlight=False), read=lambda prompt: next(lines, None)
    )
    async with runtime(tmp_path, three_refunds(runs)) as rt:
        r = await rt.generate("support", prompt="Refund A, B and C")
        a, b, c = r.pending
        prompts = TerminalTextChannel(terminal, principal=BOB)
        async with manual(ChannelHub(rt, [prompts])) as hub:
            await hub.poll()
            await prompts.idle()
            await hub.poll()
        assert [await status(rt, x.id) for x in (a, b, c)] == [
            ("settled", "approved"),
            ("settled", "cancelled"),
            ("settled", "approved"),
        ]
        stored = await rt.store.get_request(b.id)
        assert stored is not None and stored.resolution is not None
        assert stored.resolution["reason"] == "not today"
        assert runs == ["A-1", "C-3"]
        assert (await rt.state(r.session_id)).turn.status == "completed"  # type: ignore[union-attr]


async def test_an_answer_stands_when_the_turn_cannot_resume(tmp_path: Path) -> None:
    from signoff.testing import Flaky as FlakyStep

    runs: list[str] = []

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        runs.append(order_id)
        return "ok"

    step = FlakyStep(reply("Done."), failures=1)
    agent = scripted_agent(
        "support", [call_tools(call("issue_refund", order_id="A-1")), step], tools=[issue_refund]
    )
    async with runtime(tmp_path, agent) as rt:
        r = await rt.generate("support", prompt="Refund A")
        (a,) = r.pending
        sms = Texts()
        async with manual(ChannelHub(rt, [sms])) as hub:
            await hub.poll()
            outcome = await sms.reply("yes", BOB)  # the model fails right after
            assert outcome is not None and (outcome.outcome, outcome.applied) == ("approved", True)
            assert await status(rt, a.id) == ("settled", "approved")
            assert runs == ["A-1"]
            state = await rt.state(r.session_id)
            assert state.turn is not None and state.turn.status == "failed"
            assert sms.current is None
            result = await rt.generate(session_id=r.session_id)  # a retry finishes the turn
            assert (result.status, result.text) == ("completed", "Done.")


async def test_a_subagents_request_is_shown_once_and_answering_it_resumes_both(
    tmp_path: Path,
) -> None:
    runs: list[str] = []

    @so.tool(approval=so.always(expires_in=3600))
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        runs.append(order_id)
        return "refunded"

    billing = scripted_agent(
        "billing",
        [call_tools(call("issue_refund", order_id="1042")), reply("Refunded 1042.")],
        tools=[issue_refund],
    )
    support = scripted_agent(
        "support",
        [call_tools(call("billing", message="Refund 1042")), reply("All done.")],
        tools=[so.delegate("billing")],
    )
    async with runtime(tmp_path, support, billing) as rt:
        r = await rt.generate("support", prompt="Refund order 1042")
        (mirror,) = r.pending
        assert mirror.child is not None
        sms = Texts()
        async with manual(ChannelHub(rt, [sms])) as hub:
            await hub.poll()
            (shown,) = sms.sent
            assert sms.current is not None and sms.current.id == mirror.child.request_id
            assert sms.current.session_id == mirror.child.session_id
            assert sms.current.expires_at is not None  # the child's deadline
            assert shown == sms.render(sms.current)
            await sms.reply("yes", BOB)
            await hub.poll()
            assert sms.sent == [shown]  # the mirror was never shown, nor its resolution
        assert runs == ["1042"]
        final = await rt.state(r.session_id)
        assert final.turn is not None and final.turn.status == "completed"
        assert await status(rt, mirror.id) == ("settled", "approved")


def test_parse_reply_takes_no_number_or_hyphenated_word_for_yes_or_no() -> None:
    """`1.5` is a number, not `1` (approve) with the reason `5`; `no-brainer` is not `no`."""
    approval = so.InputRequest(
        kind="tool-approval", id="req_1", session_id="s", turn_id="t", agent="a", created_at=0.0
    )
    for text in ("1.5", "1,000", "2.0", "no-brainer", "yes-ish", "2-3"):
        assert parse_reply(approval, text) is None, text
    assert parse_reply(approval, "no - too big") == so.InputResponse(
        request_id="req_1", option_id="cancel", text="too big"
    )
    assert parse_reply(approval, "2. too big") == so.InputResponse(
        request_id="req_1", option_id="cancel", text="too big"
    )
    assert parse_reply(approval, "yes, go ahead") == so.InputResponse(
        request_id="req_1", option_id="approve", text="go ahead"
    )


def test_parse_reply_takes_neither_invisible_nor_ambiguous_text_as_an_answer() -> None:
    """Text with nothing visible (controls, zero-width characters) is as empty as blank text,
    and a reply naming two options is not taken as free text the person did not mean."""
    question = so.InputRequest(
        kind="question",
        id="req_1",
        session_id="s",
        turn_id="t",
        agent="a",
        created_at=0.0,
        options=[so.Option(id="a", label="2"), so.Option(id="b", label="x")],
        allow_text=True,
    )
    for text in ("\u200b", "\x00", "\x1b", "\ufeff", " \u2060 ", "\x07\x7f"):
        assert parse_reply(question, text) is None, repr(text)
    assert parse_reply(question, "2") is None  # option a's label, option b's number
    assert parse_reply(question, "1") == so.InputResponse(request_id="req_1", option_id="a")
    assert parse_reply(question, "X") == so.InputResponse(request_id="req_1", option_id="b")
    assert parse_reply(question, "3") == so.InputResponse(request_id="req_1", text="3")


async def test_the_terminal_text_channel_prints_others_text_without_steering_the_terminal() -> None:
    """How a request closed elsewhere carries another reviewer's reason or answer: printed on
    the terminal, its escape sequences and bidi overrides show as escapes, not act."""
    out = io.StringIO()
    prompts = TerminalTextChannel(TerminalChannel(Console(file=out, width=200, highlight=False)))
    request = so.InputRequest(
        kind="tool-approval",
        id="req_1",
        session_id="s",
        turn_id="t",
        agent="a",
        created_at=0.0,
        action=so.Action(call_id="c", tool_name="issue_refund", input={}, input_hash="h"),
    )
    resolution = Resolution(
        request_id="req_1",
        outcome="cancelled",
        status="settled",
        at=0.0,
        by=BOB,
        reason="no [b]way[/b] \x1b]0;pwned\x07\x1b[2J\u202eevil",
    )
    await prompts.send_text(prompts.render_resolution(request, resolution))
    shown = out.getvalue()
    assert "\x1b" not in shown and "\x07" not in shown and "\u202e" not in shown
    assert "\\x1b]0;pwned\\x07\\x1b[2J\\u202eevil" in shown and "[b]way[/b]" in shown


@pytest.mark.parametrize("skew", [3600.0, -3600.0], ids=["an-hour-ahead", "an-hour-behind"])
async def test_the_terminal_prompts_count_a_deadline_by_the_runtimes_clock(
    store_url: str, skew: float
) -> None:
    """In a hub, the terminal says how long a request has left by the runtime's clock, which
    set its deadline (on PostgreSQL the database's): a runtime on a clock an hour off this
    machine's asks for 10 minutes, not `0s` or an hour and 10 minutes."""

    @so.tool(approval=so.always(expires_in=600))
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return "ok"

    desk = scripted_agent(
        "desk", [call_tools(call("refund", order_id="1")), reply("Done.")], tools=[refund]
    )
    out = io.StringIO()
    terminal = TerminalChannel(Console(file=out, width=200), read=lambda prompt: "y")
    clock = ManualClock(time.time() + skew)
    async with so.Runtime([desk], store=store_url, clock=clock) as rt:
        r = await rt.generate("desk", prompt="Refund 1")
        prompts = TerminalTextChannel(terminal, principal=BOB)
        async with manual(ChannelHub(rt, [prompts])) as hub:
            await hub.poll()
            await prompts.idle()
        assert await status(rt, r.pending[0].id) == ("settled", "approved")
    assert "expires in 10m; then it is denied" in out.getvalue(), out.getvalue()
