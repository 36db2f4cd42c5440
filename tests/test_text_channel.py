"""`TextChannel` at its edges: a message service that fails, quorums, questions, replies that
steer the turn, and what a person is told about each way a request closes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import ChannelHub, TextChannel
from signoff.channels._base import QUEUED_NOTE
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from ._channels import escalating_refund

BOB = so.Principal(authenticator="sms", principal_id="sms:+15550100")
CAROL = so.Principal(authenticator="sms", principal_id="sms:+15550199")


class Texts(TextChannel):
    """A text channel that keeps what it sends; its first `fail` sends fail (the SMS service
    is down)."""

    def __init__(self, fail: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fail = fail
        self.sent: list[str] = []

    async def send_text(self, text: str) -> None:
        if self.fail:
            self.fail -= 1
            raise ConnectionError("SMS service down")
        self.sent.append(text)


@asynccontextmanager
async def manual(hub: ChannelHub) -> AsyncIterator[ChannelHub]:
    """A started hub that reads the trail only when the test calls `poll()`."""
    await hub.start(follow=False)
    try:
        yield hub
    finally:
        await hub.stop()


def refunds(runs: list[str], *orders: str, **rules: Any) -> so.Agent:
    @so.tool(approval=so.always(**rules))
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        runs.append(order_id)
        return "refunded"

    return scripted_agent(
        "support",
        [call_tools(*(call("issue_refund", order_id=o) for o in orders)), reply("Done.")],
        tools=[issue_refund],
    )


def runtime(tmp_path: Path, *agents: so.Agent) -> so.Runtime:
    return so.Runtime(list(agents), store=f"sqlite:///{tmp_path / 'state.db'}")


async def status(rt: so.Runtime, rid: str) -> tuple[str, str | None]:
    stored = await rt.store.get_request(rid)
    assert stored is not None
    return stored.status, stored.outcome


async def test_a_request_whose_message_failed_is_shown_on_retry_not_answered_unseen(
    tmp_path: Path,
) -> None:
    runs: list[str] = []
    async with runtime(tmp_path, refunds(runs, "A-1")) as rt:
        sms = Texts(fail=1)
        async with manual(ChannelHub(rt, [sms], retry_backoff=0)) as hub:
            r = await rt.generate("support", prompt="Refund A")
            (a,) = r.pending
            await hub.poll()  # the SMS service fails: the person sees nothing
            assert sms.sent == []
            # a "yes" meant for something else must not approve a refund nobody was shown
            assert await sms.reply("yes", BOB) is None
            assert await status(rt, a.id) == ("pending", None)
            assert sms.sent == [sms.render(a)]  # it is shown now instead
            await hub.poll()  # the hub's retry does not show it twice
            assert sms.sent == [sms.render(a)]
            assert (await sms.reply("yes", BOB)) is not None
            assert await status(rt, a.id) == ("settled", "approved")
        assert runs == ["A-1"]


async def test_the_hubs_retry_shows_a_request_whose_message_failed(tmp_path: Path) -> None:
    runs: list[str] = []
    async with runtime(tmp_path, refunds(runs, "A-1")) as rt:
        sms = Texts(fail=1)
        async with manual(ChannelHub(rt, [sms], retry_backoff=0)) as hub:
            r = await rt.generate("support", prompt="Refund A")
            (a,) = r.pending
            await hub.poll()
            assert sms.sent == []
            await hub.poll()  # the entry is retried: this time the message goes out
            assert sms.sent == [sms.render(a)]


async def test_a_request_whose_message_failed_as_the_hub_started_is_shown_by_a_later_poll(
    tmp_path: Path,
) -> None:
    """The SMS service is down as the hub starts: no entry of the trail is left for the hub to
    retry, so the polls after it show the request (backing off while the service stays down),
    rather than leaving it unseen until another request comes or the person writes."""
    clock = ManualClock()
    runs: list[str] = []
    async with so.Runtime(
        [refunds(runs, "A-1")], store=f"sqlite:///{tmp_path / 'state.db'}", clock=clock
    ) as rt:
        (a,) = (await rt.generate("support", prompt="Refund A")).pending
        sms = Texts(fail=2)
        async with manual(ChannelHub(rt, [sms], clock=clock)) as hub:
            assert sms.sent == [] and sms.fail == 1  # showing it failed
            await hub.poll()
            clock.advance(1)
            await hub.poll()  # tried a second later: it fails again
            assert sms.sent == [] and sms.fail == 0
            clock.advance(1)
            await hub.poll()  # not tried again before two seconds
            assert sms.sent == []
            clock.advance(1)
            await hub.poll()
            assert sms.sent == [sms.render(a)]
            for _ in range(3):
                clock.advance(60)
                await hub.poll()
            assert sms.sent == [sms.render(a)]  # shown once
            assert (await sms.reply("yes", BOB)) is not None
            assert await status(rt, a.id) == ("settled", "approved")
        assert runs == ["A-1"]


async def test_a_close_the_hub_gave_up_telling_is_told_when_the_service_is_back(
    tmp_path: Path,
) -> None:
    """The request shown closes elsewhere while the SMS service is down for longer than the
    hub's attempts: the hub gives up on the entry, and the closed request stayed on show for
    good: every reply was told it can no longer be answered, and B was never shown."""
    clock = ManualClock()  # the hub's: its ticks
    runs: list[str] = []
    async with runtime(tmp_path, refunds(runs, "A-1", "B-2")) as rt:
        r = await rt.generate("support", prompt="Refund A and B")
        a, b = r.pending
        sms = Texts()
        hub = ChannelHub(rt, [sms], clock=clock, max_attempts=2, retry_backoff=0)
        async with manual(hub):
            assert sms.sent == [sms.render(a)]
            sms.fail = 1000  # the SMS service is down
            await rt.respond(r.session_id, [so.InputResponse(request_id=a.id, option_id="cancel")])
            await hub.poll()
            await hub.poll()  # the hub gives up on telling it
            sms.fail = 0  # back
            for _ in range(2):
                clock.advance(60)
                await hub.poll()
            assert sms.sent[1].startswith("issue_refund was denied by the policy at ")
            assert sms.sent[2:] == [sms.render(b)]
            await sms.reply("yes", BOB)
            assert await status(rt, b.id) == ("settled", "approved")
        assert runs == ["B-2"]


async def test_the_next_request_is_shown_when_the_closing_message_failed(tmp_path: Path) -> None:
    runs: list[str] = []
    async with runtime(tmp_path, refunds(runs, "A-1", "B-2")) as rt:
        sms = Texts()
        async with manual(ChannelHub(rt, [sms], retry_backoff=0)) as hub:
            r = await rt.generate("support", prompt="Refund A and B")
            a, b = r.pending
            await hub.poll()
            assert sms.sent == [sms.render(a)]
            await rt.respond(r.session_id, [so.InputResponse(request_id=a.id, option_id="cancel")])
            sms.fail = 1
            await hub.poll()  # "denied by the policy" fails to send
            await hub.poll()  # retried: the person hears how A closed, then sees B
            assert sms.sent[1].startswith("issue_refund was denied by the policy at ")
            assert sms.sent[2:] == [sms.render(b)]
            await sms.reply("yes", BOB)
            assert await status(rt, b.id) == ("settled", "approved")
        assert runs == ["B-2"]


@pytest.mark.parametrize("state", ["memory", "file"])
async def test_a_restarted_hub_says_how_the_request_shown_closed_while_it_was_stopped(
    tmp_path: Path, state: str
) -> None:
    # The same hub stopped and started again (a server's lifespan run twice): it goes on from
    # where it stopped, with its positions and memos in memory as well as in a file.
    runs: list[str] = []
    async with runtime(tmp_path, refunds(runs, "A-1", "B-2")) as rt:
        r = await rt.generate("support", prompt="Refund A and B")
        a, b = r.pending
        sms = Texts()
        hub = ChannelHub(rt, [sms], state=tmp_path / "channels.db" if state == "file" else None)
        async with manual(hub):
            assert sms.sent == [sms.render(a)]
        await rt.respond(r.session_id, [so.InputResponse(request_id=a.id, option_id="cancel")])
        async with manual(hub):
            assert sms.sent == [sms.render(a)]  # A is still the one shown: not sent again
            await hub.poll()
            assert sms.sent[1].startswith("issue_refund was denied by the policy at ")
            assert sms.sent[2:] == [sms.render(b)]
            await sms.reply("yes", BOB)  # answers B, the one shown, not the closed A
            assert await status(rt, b.id) == ("settled", "approved")
        assert runs == ["B-2"]


async def test_a_quorum_is_counted_reply_by_reply(tmp_path: Path) -> None:
    runs: list[str] = []
    async with runtime(tmp_path, refunds(runs, "A-1", approvers=2, expires_in=3600)) as rt:
        sms = Texts()
        async with manual(ChannelHub(rt, [sms])) as hub:
            r = await rt.generate("support", prompt="Refund A")
            (a,) = r.pending
            await hub.poll()
            (shown,) = sms.sent
            assert "\nNeeds 2 approvals (0 of 2 so far).\nExpires 2" in shown
            assert await sms.reply("yes", BOB) is not None
            assert sms.sent[-1] == "Counted (1 of 2); waiting for more approvals."
            await hub.poll()  # the count reaches the channel's copy; nothing is sent again
            assert sms.current is not None and sms.current.approved_by == [BOB.principal_id]
            assert await sms.reply("ok", BOB) is not None
            assert sms.sent[-1] == "You approved this request before (already counted: 1 of 2)."
            assert await status(rt, a.id) == ("pending", None)
            outcome = await sms.reply("approve", CAROL)
            assert outcome is not None and (outcome.outcome, outcome.applied) == ("approved", True)
            await hub.poll()
            assert sms.current is None and len(sms.sent) == 3
        assert runs == ["A-1"]


async def test_who_may_not_answer_is_told_and_nothing_changes(tmp_path: Path) -> None:
    alice = so.Principal(authenticator="sms", principal_id="sms:+15550111")
    runs: list[str] = []

    def managers_only(ctx: so.ResponseContext) -> so.Rejected:
        return so.Rejected("managers only")

    spec = so.ApprovalSpec(request=so.always(), response=managers_only)

    @so.tool(approval=spec)
    async def wire_money(to: str) -> str:
        """Wire money."""
        runs.append(to)
        return "sent"

    agent = scripted_agent(
        "treasury",
        [call_tools(call("wire_money", to="acme")), reply("Sent.")],
        tools=[wire_money],
    )
    async with runtime(tmp_path, refunds(runs, "A-1"), agent) as rt:
        sms = Texts()
        async with manual(ChannelHub(rt, [sms])) as hub:
            r = await rt.generate("support", prompt="Refund A", auth=alice)
            await hub.poll()
            assert await sms.reply("yes", BOB) is None  # only Alice, who asked, may answer
            assert sms.sent[-1].startswith("You may not answer this request: request ")
            assert await status(rt, r.pending[0].id) == ("pending", None)
            await sms.reply("no", alice)
            w = await rt.generate("treasury", prompt="Wire acme", auth=alice)
            await hub.poll()
            assert sms.sent[-1] == sms.render(w.pending[0])
            outcome = await sms.reply("yes", alice)
            assert outcome is not None and not outcome.applied
            assert sms.sent[-1] == "Your answer was not accepted (rejected: managers only)."
            assert sms.current is not None and sms.current.id == w.pending[0].id
            assert await status(rt, w.pending[0].id) == ("pending", None)
        assert runs == []


async def test_an_unmatched_reply_steers_the_turn_with_send(tmp_path: Path) -> None:
    runs: list[str] = []
    async with runtime(tmp_path, refunds(runs, "A-1")) as rt:
        sms = Texts(unmatched="send")
        async with manual(ChannelHub(rt, [sms])) as hub:
            r = await rt.generate("support", prompt="Refund A")
            (a,) = r.pending
            await hub.poll()
            # a message the runtime refuses (text that cannot be stored) is told, not raised
            assert await sms.reply("check \ud800 first", BOB) is None
            assert sms.sent[-1].startswith("Your message was not delivered: the message is not")
            assert await status(rt, a.id) == ("pending", None)
            assert await sms.reply("check with finance first", BOB) is None
            assert await status(rt, a.id) == ("withdrawn", "ignored")
            await hub.poll()
            assert sms.sent[-1].startswith("issue_refund was withdrawn at ")
            assert sms.current is None
        assert runs == []


async def test_the_excluded_requesters_no_steers_with_send_as_runtime_send_takes_it(
    tmp_path: Path,
) -> None:
    """Four eyes bars Bob from settling his own refund: with `unmatched="send"` his "no" was
    refused as an answer he may not give, while any other reply steered past the approval.
    It is sent on, as `Runtime.send` takes a deny its sender may not give: it steers. His
    "yes" is still refused."""
    runs: list[str] = []
    async with runtime(tmp_path, refunds(runs, "A-1", exclude_requester=True)) as rt:
        sms = Texts(unmatched="send")
        async with manual(ChannelHub(rt, [sms])) as hub:
            r = await rt.generate("support", prompt="Refund A", auth=BOB)
            (a,) = r.pending
            await hub.poll()
            assert await sms.reply("yes", BOB) is None
            assert sms.sent[-1].startswith("You may not answer this request: ")
            assert await status(rt, a.id) == ("pending", None)
            assert await sms.reply("no: wrong order", BOB) is None
            assert await status(rt, a.id) == ("withdrawn", "ignored")
            events = [e async for e in rt.events(r.session_id, follow=False)]
            sent = [e.data["message"] for e in events if e.type == "turn.message"]
            assert sent == ["no: wrong order"]
        assert runs == []


async def test_an_unmatched_reply_from_someone_the_turn_does_not_serve_is_told_it_waits(
    tmp_path: Path,
) -> None:
    """A message from someone other than the person the waiting turn serves neither answers nor
    steers: it is queued for the turn's end, and the sender is told so rather than left to think
    the turn read it; the request stays shown. The turn's own person steers, with no such note."""
    runs: list[str] = []
    async with runtime(tmp_path, refunds(runs, "A-1")) as rt:
        sms = Texts(unmatched="send")
        async with manual(ChannelHub(rt, [sms])) as hub:
            r = await rt.generate("support", prompt="Refund A", auth=CAROL)
            (a,) = r.pending
            await hub.poll()
            shown = len(sms.sent)
            assert await sms.reply("check with finance first", BOB) is None
            assert sms.sent[shown:] == [QUEUED_NOTE]
            assert await status(rt, a.id) == ("pending", None)
            assert sms.current is not None and sms.current.id == a.id
            state = await rt.state(r.session_id)
            assert [m["message"] for m in state.queued] == ["check with finance first"]
            assert await sms.reply("never mind, stop", CAROL) is None
            assert QUEUED_NOTE not in sms.sent[shown + 1 :]
            assert await status(rt, a.id) == ("withdrawn", "ignored")
        assert runs == []


async def test_a_reply_naming_two_options_is_told_so_and_answers_nothing(tmp_path: Path) -> None:
    """`2` is option one's label and option two's number: it is neither taken as free text nor
    sent on with unmatched="send" (the runtime would refuse it); the person is told how to
    name each alone."""
    options = [{"label": "2", "description": "Two."}, {"label": "x", "description": "Ten."}]
    ask = call("ask_question", question="How many?", options=options)
    agent = scripted_agent("shop", [call_tools(ask), reply("ok")], tools=[so.ask_question()])
    async with runtime(tmp_path, agent) as rt:
        r = await rt.generate("shop", prompt="Reorder")
        (q,) = r.pending
        sms = Texts(unmatched="send")
        async with manual(ChannelHub(rt, [sms])) as hub:
            await hub.poll()
            assert await sms.reply(" 2 ", BOB) is None
            assert sms.sent[-1] == (
                "That could mean more than one option: to choose 2, reply 1; to choose x, reply x."
            )
            assert await status(rt, q.id) == ("pending", None)
            assert await sms.reply("\u200b", BOB) is None  # shows nothing: not sent on either
            assert await status(rt, q.id) == ("pending", None)
            outcome = await sms.reply("1", BOB)
            assert outcome is not None and outcome.outcome == "answered"
            stored = await rt.store.get_request(q.id)
            assert stored is not None and stored.resolution is not None
            assert stored.resolution["answer"]["value"] == "2"


class Flaky(Texts):
    """A `Texts` whose sends fail as `failing` says, one entry per attempt (then none fail)."""

    def __init__(self, *failing: bool) -> None:
        super().__init__()
        self.failing = list(failing)

    async def send_text(self, text: str) -> None:
        if self.failing and self.failing.pop(0):
            raise ConnectionError("SMS service down")
        self.sent.append(text)


@pytest.mark.parametrize("then", ["retry", "restart"])
async def test_an_escalation_is_told_once_though_showing_the_request_after_it_failed(
    tmp_path: Path, then: str
) -> None:
    """The request shown was never seen (the service was down as the hub started). Its
    escalation is told, then showing the request fails: the hub's retry, or a hub started
    again on the same state, shows the request but does not tell the escalation twice."""
    clock = ManualClock()
    state = tmp_path / "channels.db"
    async with so.Runtime(
        [escalating_refund()], store=f"sqlite:///{tmp_path / 's.db'}", clock=clock
    ) as rt:
        (a,) = (await rt.generate("support", prompt="Refund A-1")).pending
        sms = Flaky(True, False, True)  # showing it fails, the escalation goes, showing fails
        async with manual(ChannelHub(rt, [sms], retry_backoff=0, clock=clock, state=state)) as hub:
            assert sms.sent == []
            clock.advance(61)
            assert await rt.expire_due() == 1
            await hub.poll()
            (told,) = sms.sent
            assert (
                told
                == "issue_refund was escalated to finance (no one decided before the deadline)."
            )
            if then == "retry":
                await hub.poll()
        if then == "restart":
            sms = Flaky()
            async with manual(ChannelHub(rt, [sms], clock=clock, state=state)) as hub:
                await hub.poll()
            sms.sent.insert(0, told)
        stored = await rt.store.get_request(a.id)
        assert stored is not None
        assert sms.sent == [told, sms.render(stored.request)]


async def test_same_named_text_channels_of_two_hubs_on_one_state_file_each_show_the_request(
    tmp_path: Path,
) -> None:
    """Two hubs (different names) on one state file, each texting its own person through a
    channel named `text`: the one that showed the request first left a `shown` memo the other
    took for its own, so its person never saw the request and could not answer it."""
    runs: list[str] = []
    state = tmp_path / "channels.db"
    async with runtime(tmp_path, refunds(runs, "A-1")) as rt:
        bob, carol = Texts(), Texts()
        async with (
            manual(ChannelHub(rt, [bob], state=state, name="day")) as day,
            manual(ChannelHub(rt, [carol], state=state, name="night")) as night,
        ):
            (a,) = (await rt.generate("support", prompt="Refund A")).pending
            await day.poll()
            await night.poll()
            assert bob.sent == carol.sent == [bob.render(a)]
            assert (await carol.reply("yes", CAROL)) is not None  # she answers what she sees
            await day.poll()
            await night.poll()
            assert bob.recall("shown") is None and carol.recall("shown") is None
        assert await status(rt, a.id) == ("settled", "approved") and runs == ["A-1"]


async def test_a_deadline_past_the_year_9999_is_shown_not_raised(tmp_path: Path) -> None:
    """`expires_in=1e12` is a valid deadline past what a datetime holds: formatting it raised
    "year out of range" and the request was never shown; it reads as after 9999-12-31."""
    runs: list[str] = []
    async with runtime(tmp_path, refunds(runs, "A-1", expires_in=1e12)) as rt:
        sms = Texts()
        async with manual(ChannelHub(rt, [sms])) as hub:
            r = await rt.generate("support", prompt="Refund A")
            (a,) = r.pending
            await hub.poll()
            (shown,) = sms.sent
            assert "\nExpires after 9999-12-31.\nReply yes to approve" in shown
            outcome = await sms.reply("yes", BOB)
            assert outcome is not None and outcome.outcome == "approved"
        assert runs == ["A-1"]


def _limit_behind_two_approvals() -> list[so.Agent]:
    """A parent whose three subagents ask, in this order, two approvals and (over its token
    budget) a session-limit prompt."""

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    @so.tool
    async def lookup(order_id: str) -> str:
        """Look an order up."""
        return "shipped"

    billing = scripted_agent(
        "billing",
        [call_tools(call("issue_refund", order_id="1")), reply("Refunded.")],
        tools=[issue_refund],
    )
    spent = so.Usage(input_tokens=0, output_tokens=50)
    orders = scripted_agent(
        "orders",
        [call_tools(call("lookup", order_id="3"), usage=spent), reply("Order 3 shipped.")],
        tools=[lookup],
        limits=so.Limits(max_tokens=40),
    )
    parent = scripted_agent(
        "support",
        [
            call_tools(
                call("billing", call_id="d1", message="refund 1"),
                call("billing", call_id="d2", message="refund 2"),
                call("orders", call_id="d3", message="where is 3?"),
            ),
            reply("All done."),
        ],
        tools=[so.delegate("billing"), so.delegate("orders")],
        limits=so.Limits(max_tokens=1000),
    )
    return [parent, billing, orders]


@pytest.mark.parametrize("started", ["before", "after"])
async def test_a_session_limit_prompt_is_shown_next_before_requests_asked_earlier(
    tmp_path: Path, started: str
) -> None:
    """The eve seed: text channels show one request at a time, posting the next once the
    current one is answered, "in this order": a runtime-limit continuation prompt if one is
    open, and otherwise the request asked first. The request on show stays until answered;
    the prompt, asked last, comes next (or first, for a channel that starts with all three)."""
    async with runtime(tmp_path, *_limit_behind_two_approvals()) as rt:
        sms = Texts()
        hub = ChannelHub(rt, [sms])
        if started == "before":
            await hub.start(follow=False)
        r = await rt.generate("support", prompt="refund 1 and 2, and where is 3?", auth=BOB)
        assert [p.kind for p in r.pending] == ["tool-approval", "tool-approval", "session-limit"]
        if started == "after":
            await hub.start(follow=False)
        try:
            await hub.poll()
            kinds = [w.kind for w in sms.waiting]
            if started == "before":  # the first approval was on show when the prompt came
                assert kinds == ["tool-approval", "session-limit", "tool-approval"]
                outcome = await sms.reply("yes", BOB)
                assert outcome is not None and outcome.outcome == "approved"
                await hub.poll()
            assert [w.kind for w in sms.waiting][:2] == ["session-limit", "tool-approval"]
            assert "Continue with max_tokens raised to 80, or stop?" in sms.sent[-1]
            outcome = await sms.reply("continue", BOB)
            assert outcome is not None and outcome.outcome == "answered"
            while sms.current is not None:
                await hub.poll()
                assert "issue_refund" in sms.sent[-1]
                outcome = await sms.reply("yes", BOB)
                assert outcome is not None and outcome.outcome == "approved"
                await hub.poll()
        finally:
            await hub.stop()
        assert (await rt.state(r.session_id)).turn_status == "completed"


async def test_a_reply_to_the_request_being_recorded_as_shown_is_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next request reached the phone, and the person's answer arrived while the channel
    still recorded it as shown (a store write behind another writer): the reply read the memo
    before the write, waited for it, found the request shown then, and dropped the answer with
    nothing said. It is answered."""
    import asyncio

    from signoff.channels._shared import Shared

    keep = Shared.keep

    async def slow_keep(self: Any, memos: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0.05)
        return await keep(self, memos, **kwargs)

    monkeypatch.setattr(Shared, "keep", slow_keep)
    runs: list[str] = []
    answered: list[asyncio.Task[Any]] = []
    sms = Texts()
    send_text = sms.send_text

    async def sending(text: str) -> None:
        await send_text(text)
        if "B-2" in text and not answered:  # it reached the person, who answers at once
            answered.append(asyncio.create_task(sms.reply("no: too big", BOB)))

    monkeypatch.setattr(sms, "send_text", sending)
    async with so.Runtime([refunds(runs, "A-1", "B-2")], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="refund", auth=BOB)
        _, b = r.pending
        async with manual(ChannelHub(rt, [sms])) as hub:
            await hub.poll()
            await sms.reply("yes", BOB)
            outcome = await answered[0]
            assert outcome is not None and (outcome.request_id, outcome.outcome) == (
                b.id,
                "cancelled",
            )
        stored = await rt.store.get_request(b.id)
        assert stored is not None and stored.outcome == "cancelled"
    assert runs == ["A-1"]


async def test_a_reply_sent_before_the_next_request_reached_the_person_does_not_answer_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The person's second "yes" (meant for A) arrives while B's message is still being sent:
    it waited for the send, found B shown, and approved B, which the person had not seen. A
    reply answers a request only if its message had reached the person when the reply came."""
    import asyncio

    runs: list[str] = []
    early: list[asyncio.Task[Any]] = []
    sms = Texts()
    send_text = sms.send_text

    async def sending(text: str) -> None:
        if "B-2" in text and not early:
            early.append(asyncio.create_task(sms.reply("yes", BOB)))
            await asyncio.sleep(0.05)  # the SMS provider's call, B not yet sent
        await send_text(text)

    monkeypatch.setattr(sms, "send_text", sending)
    async with so.Runtime([refunds(runs, "A-1", "B-2")], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="refund", auth=BOB)
        _, b = r.pending
        async with manual(ChannelHub(rt, [sms])) as hub:
            await hub.poll()
            await sms.reply("yes", BOB)  # A; B is shown next
            assert await early[0] is None
        stored = await rt.store.get_request(b.id)
        assert stored is not None and stored.status == "pending"
    assert runs == ["A-1"]
