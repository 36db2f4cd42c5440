"""Channels and the hub: text channels show one request at a time, in request order; the hub
follows the audit trail, remembers where each channel stopped, and retries a failing channel."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

import signoff as so
from signoff.channels import (
    Channel,
    ChannelHub,
    ChannelState,
    Escalation,
    RateLimited,
    Resolution,
    TerminalChannel,
    TerminalTextChannel,
    TextChannel,
    parse_reply,
)
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent


@asynccontextmanager
async def manual(hub: ChannelHub) -> AsyncIterator[ChannelHub]:
    """A started hub that reads the trail only when the test calls `poll()`."""
    await hub.start(follow=False)
    try:
        yield hub
    finally:
        await hub.stop()


BOB = so.Principal(authenticator="sms", principal_id="sms:+15550100")


class Texts(TextChannel):
    """A text channel that keeps what it sends (an SMS thread, say)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sent: list[str] = []

    async def send_text(self, text: str) -> None:
        self.sent.append(text)


def three_refunds(runs: list[str]) -> so.Agent:
    @so.tool(approval=so.always())
    async def issue_refund(order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        runs.append(order_id)
        return {"refunded": amount}

    return scripted_agent(
        "support",
        [
            call_tools(
                call("issue_refund", order_id="A-1", amount=10),
                call("issue_refund", order_id="B-2", amount=20),
                call("issue_refund", order_id="C-3", amount=30),
            ),
            reply("Done."),
        ],
        tools=[issue_refund],
    )


def runtime(tmp_path: Path, *agents: so.Agent) -> so.Runtime:
    return so.Runtime(list(agents), store=f"sqlite:///{tmp_path / 'state.db'}")


async def status(rt: so.Runtime, rid: str) -> tuple[str, str | None]:
    stored = await rt.store.get_request(rid)
    assert stored is not None
    return stored.status, stored.outcome


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


class Flaky(Channel):
    """Fails on its first `fail` deliveries, then records what it is told."""

    def __init__(self, fail: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fail = fail
        self.attempts = 0
        self.seen: list[tuple[str, str]] = []

    async def on_requested(self, request: so.InputRequest) -> None:
        self.attempts += 1
        if self.fail:
            self.fail -= 1
            raise ConnectionError("service down")
        self.seen.append(("requested", request.id))

    async def on_resolved(self, request: so.InputRequest, resolution: Resolution) -> None:
        self.seen.append((resolution.outcome, request.id))


async def test_a_failing_channel_retries_from_its_position_while_others_go_on(
    store_url: str,
) -> None:
    runs: list[str] = []
    async with so.Runtime([three_refunds(runs)], store=store_url) as rt:
        flaky, steady = Flaky(2, name="flaky"), Flaky(0, name="steady")
        async with manual(ChannelHub(rt, [flaky, steady], retry_backoff=0)) as hub:
            r = await rt.generate("support", prompt="Refund A, B and C")
            a, b, c = r.pending
            await hub.poll()
            assert flaky.seen == []
            assert steady.seen == [("requested", a.id), ("requested", b.id), ("requested", c.id)]
            assert hub.position(flaky) < hub.position(steady)
            await hub.poll()
            await hub.poll()
            assert flaky.seen == steady.seen
            await rt.respond(r.session_id, [so.InputResponse(request_id=a.id, option_id="approve")])
            await hub.poll()
            assert flaky.seen[-1] == steady.seen[-1] == ("approved", a.id)
            assert hub.position(flaky) == hub.position(steady)


class Watcher(Channel):
    """Notes what the hub tells it; `on_escalated` is the base class's unless `escalations`."""

    def __init__(self, *, escalations: bool = False, live_only: bool = True, **kw: Any) -> None:
        super().__init__(**kw)
        self.live_only = live_only
        self.escalations = escalations
        self.seen: list[tuple[Any, ...]] = []

    async def on_updated(self, request: so.InputRequest) -> None:
        self.seen.append(("updated", request.id, request.escalated_to, request.expires_at))

    async def on_escalated(self, request: so.InputRequest, escalation: Escalation) -> None:
        if not self.escalations:
            return await super().on_escalated(request, escalation)
        self.seen.append(("escalated", request.id, request.status, escalation))

    async def on_resolved(self, request: so.InputRequest, resolution: Resolution) -> None:
        self.seen.append((resolution.outcome, request.id))


def escalating_refund(name: str = "support") -> so.Agent:
    def finance(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
        who = ctx.response.principal
        allowed = ctx.request.escalated_to == "finance" and who is not None and who == BOB
        return so.Allowed() if allowed else so.Rejected("not finance")

    spec = so.ApprovalSpec(
        request=so.always(),
        response=finance,
        expires_in=60,
        on_timeout="escalate",
        escalate_to="finance",
    )

    @so.tool(approval=spec)
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    return scripted_agent(
        name,
        [call_tools(call("issue_refund", order_id="A-1")), reply("Done.")],
        tools=[issue_refund],
        repeat_last=True,
    )


async def test_an_escalation_reaches_each_channel_once_as_the_request_now_stands(
    store_url: str,
) -> None:
    """By default a channel shows the escalated request anew (`on_updated`: no deadline, the
    group named); one that overrides `on_escalated` is told the group, when and why. A request
    answered before the hub read its escalation is not shown again by a `live_only` channel."""
    clock = ManualClock()
    async with so.Runtime([escalating_refund()], store=store_url, clock=clock) as rt:
        shows = Watcher(name="shows")
        hears = Watcher(name="hears", escalations=True, live_only=False)
        async with manual(ChannelHub(rt, [shows, hears], clock=clock)) as hub:
            first = await rt.generate("support", prompt="Refund A-1")
            second = await rt.generate("support", prompt="Refund A-1 again")
            (a,), (b,) = first.pending, second.pending
            await hub.poll()
            clock.advance(61)
            assert await rt.expire_due() == 2
            answer = so.InputResponse(request_id=b.id, option_id="approve")
            await rt.respond(second.session_id, [answer], principal=BOB)
            await hub.poll()
            await hub.poll()
        at = {
            e.data["request_id"]: e.at
            for e in await rt.audit()
            if e.type == "approval.candidate" and e.data["outcome"] == "escalated"
        }
        assert shows.seen == [("updated", a.id, "finance", None), ("approved", b.id)]

        def told(request: so.InputRequest, session: str) -> Escalation:
            return Escalation(
                request_id=request.id,
                session_id=session,
                to="finance",
                at=at[request.id],
                reason="no one decided before the deadline",
            )

        *escalations, last = hears.seen  # the sweep escalates the two in either order
        assert sorted(escalations, key=lambda e: e[1] != a.id) == [
            ("escalated", a.id, "pending", told(a, first.session_id)),
            ("escalated", b.id, "settled", told(b, second.session_id)),
        ]
        assert last == ("approved", b.id)


class Opener(Watcher):
    """A `Watcher` that notes the requests it is told opened, too."""

    async def on_requested(self, request: so.InputRequest) -> None:
        self.seen.append(("requested", request.id, request.escalated_to))


async def test_an_escalation_moves_a_request_between_channels_routed_by_group(
    store_url: str,
) -> None:
    """A channel that takes only escalated requests for its group is handed the request as it
    opens for it there; the first-line channel that showed it is told of the escalation and of
    its close, though it no longer takes the request as it stands."""
    clock = ManualClock()
    async with so.Runtime([escalating_refund()], store=store_url, clock=clock) as rt:
        first = Opener(name="first", escalations=True, accepts=lambda r: r.escalated_to is None)
        finance = Opener(name="finance", accepts=lambda r: r.escalated_to == "finance")
        hooks = Opener(
            name="hooks",
            escalations=True,
            live_only=False,
            accepts=lambda r: r.escalated_to == "finance",
        )
        async with manual(ChannelHub(rt, [first, finance, hooks], clock=clock)) as hub:
            result = await rt.generate("support", prompt="Refund A-1")
            (a,) = result.pending
            await hub.poll()
            clock.advance(61)
            assert await rt.expire_due() == 1
            await hub.poll()
            answer = so.InputResponse(request_id=a.id, option_id="approve")
            await rt.respond(result.session_id, [answer], principal=BOB)
            await hub.poll()
        (escalation,) = [
            Escalation.from_event(e.data, a.model_copy(update={"escalated_to": "finance"}), e.at)
            for e in await rt.audit()
            if e.type == "approval.candidate" and e.data["outcome"] == "escalated"
        ]
        assert first.seen == [
            ("requested", a.id, None),
            ("escalated", a.id, "pending", escalation),
            ("approved", a.id),
        ]
        assert finance.seen == [("requested", a.id, "finance"), ("approved", a.id)]
        # not live_only: told of the escalation itself, as a receiver routing by group needs
        assert hooks.seen == [("escalated", a.id, "pending", escalation), ("approved", a.id)]


async def test_a_text_channel_says_where_the_request_it_shows_was_escalated(
    store_url: str,
) -> None:
    """The person reading texts learns the request they see went to the group; a channel that
    still takes it keeps it (a member of the group answers it there), one routed away from the
    group drops it and shows the next."""
    clock = ManualClock()
    runs: list[str] = []
    agents = [escalating_refund("billing"), three_refunds(runs)]
    async with so.Runtime(agents, store=store_url, clock=clock) as rt:
        everyone = Texts(name="everyone")
        first_line = Texts(name="first", accepts=lambda r: r.escalated_to is None)
        async with manual(ChannelHub(rt, [everyone, first_line], clock=clock)) as hub:
            result = await rt.generate("billing", prompt="Refund A-1")
            (a,) = result.pending
            await hub.poll()
            clock.advance(1)
            others = await rt.generate("support", prompt="Refund A, B and C")
            await hub.poll()
            assert everyone.sent == first_line.sent == [everyone.render(a)]
            clock.advance(60)
            assert await rt.expire_due() == 1
            await hub.poll()
            said = "issue_refund was escalated to finance (no one decided before the deadline)"
            assert everyone.sent[-1] == f"{said}."
            assert everyone.current is not None and everyone.current.id == a.id
            assert everyone.current.escalated_to == "finance"
            assert first_line.sent[-2:] == [
                f"{said}; it is no longer shown here.",
                first_line.render(others.pending[0]),
            ]
            assert "Escalated to finance" in everyone.render(everyone.current)
            outcome = await everyone.reply("yes", BOB)  # Bob answers for finance
            assert outcome is not None and outcome.outcome == "approved"
            assert everyone.sent[-1] == everyone.render(others.pending[0])
            await hub.poll()
            assert first_line.sent[-1] == first_line.render(others.pending[0])


async def test_a_new_hub_starts_at_the_end_and_hands_over_the_open_requests(
    tmp_path: Path,
) -> None:
    runs: list[str] = []
    async with runtime(tmp_path, three_refunds(runs)) as rt:
        r = await rt.generate("support", prompt="Refund A, B and C")
        a, b, c = r.pending
        await rt.respond(r.session_id, [so.InputResponse(request_id=a.id, option_id="approve")])

        class Opened(Flaky):
            async def start(self, open_requests: Any) -> None:
                self.seen += [("open", x.id) for x in open_requests]

        watcher = Opened(0)
        async with manual(ChannelHub(rt, [watcher])) as hub:
            assert await hub.poll() == 0  # nothing of the past is replayed
            assert watcher.seen == [("open", b.id), ("open", c.id)]


async def test_misuse_is_named(tmp_path: Path) -> None:
    async with runtime(tmp_path, three_refunds([])) as rt:
        with pytest.raises(so.UsageError, match="distinct"):
            ChannelHub(rt, [Texts(), Texts()])
        with pytest.raises(so.UsageError, match="Channel objects"):
            ChannelHub(rt, ["slack"])  # type: ignore[list-item]
        for name in ("", None):  # its name scopes what its channels keep
            with pytest.raises(so.UsageError, match="hub name"):
                ChannelHub(rt, [Texts()], name=name)  # type: ignore[arg-type]
        hub = ChannelHub(rt, [Texts()])
        with pytest.raises(so.UsageError, match="start the ChannelHub"):
            await hub.poll()
        with pytest.raises(so.UsageError, match="unmatched"):
            Texts(unmatched="shout")
        state = ChannelState()
        state.remember("c", "k", {"ts": "1.2"})
        assert state.recall("c", "k") == {"ts": "1.2"}
        state.forget("c", "k")
        assert state.recall("c", "k") is None
        state.close()
        # a state file that cannot be opened is a named error, not an OSError or sqlite3 error
        (tmp_path / "dir").write_text("a file where a directory should be")
        with pytest.raises(so.StoreError, match="channel state"):
            ChannelHub(rt, [Texts()], state=tmp_path / "dir" / "hub.db")
        (tmp_path / "junk-hub.db").write_bytes(b"not a database" * 100)
        junk = ChannelHub(rt, [Texts()], state=tmp_path / "junk-hub.db")  # opened at its start
        with pytest.raises(so.StoreError, match="channel state"):
            await junk.start()
        (tmp_path / "junk.db").write_bytes(b"not a database" * 100)
        with pytest.raises(so.StoreError, match="channel state"):
            ChannelState(tmp_path / "junk.db")


async def test_an_id_committed_late_is_not_skipped_and_a_lasting_hole_is_passed(
    store_url: str,
) -> None:
    """Audit ids are assigned before commit: on PostgreSQL a lower id can show up after a higher
    one. The hub holds its saved position at the hole until the entry appears (or times out),
    on both stores alike."""
    runs: list[str] = []
    async with so.Runtime([three_refunds(runs)], store=store_url) as rt:
        watcher = Flaky(0)
        state = ChannelState()
        async with manual(ChannelHub(rt, [watcher], state=state, gap_timeout=60)) as hub:
            r = await rt.generate("support", prompt="Refund A, B and C")
            a, b, c = r.pending
            entries = await rt.store.audit()
            (opened,) = [e.id for e in entries if e.type == "input.requested"]
            real = rt.store.audit
            hidden = {opened}

            async def late(**kwargs: Any) -> list[Any]:
                return [e for e in await real(**kwargs) if e.id not in hidden]

            rt.store.audit = late  # type: ignore[method-assign]
            await hub.poll()
            assert watcher.seen == []
            assert hub.position(watcher) == opened - 1  # held at the hole
            assert state.position("hub:channel") == opened - 1
            hidden.clear()  # the slow transaction commits
            await hub.poll()
            assert watcher.seen == [("requested", a.id), ("requested", b.id), ("requested", c.id)]
            assert hub.position(watcher) == entries[-1].id
            # a hole that never fills (a rolled-back transaction) is passed after gap_timeout
            await rt.respond(r.session_id, [so.InputResponse(request_id=a.id, option_id="approve")])
            newer = await real(after_id=entries[-1].id)
            hidden.add(newer[0].id)
            assert len(newer) > 1  # entries above the hole are visible
            await hub.poll()
            assert hub.position(watcher) == newer[0].id - 1  # held while within gap_timeout
            hub.gap_timeout = 0
            await hub.poll()
            assert hub.position(watcher) == newer[-1].id


async def test_a_hole_below_entries_already_visible_holds_the_position(store_url: str) -> None:
    """The hole that matters on PostgreSQL: a lower id not visible yet while higher ones are.
    The entries above it are delivered, the saved position stays below it, and the late entry
    is delivered once it shows up, not skipped for good; the hub reads both stores alike."""
    runs: list[str] = []
    async with so.Runtime([three_refunds(runs)], store=store_url) as rt:
        watcher = Flaky(0)
        state = ChannelState()
        async with manual(ChannelHub(rt, [watcher], state=state, gap_timeout=60)) as hub:
            r = await rt.generate("support", prompt="Refund A, B and C")
            a, b, c = r.pending
            await rt.respond(r.session_id, [so.InputResponse(request_id=a.id, option_id="approve")])
            entries = await rt.store.audit()
            (opened,) = [e.id for e in entries if e.type == "input.requested"]
            assert entries[-1].id > opened  # entries above the hole are visible
            real = rt.store.audit
            hidden = {opened}

            async def late(**kwargs: Any) -> list[Any]:
                return [e for e in await real(**kwargs) if e.id not in hidden]

            rt.store.audit = late  # type: ignore[method-assign]
            await hub.poll()
            assert watcher.seen == [("approved", a.id)]  # delivered: above the hole
            assert hub.position(watcher) == opened - 1
            assert state.position("hub:channel") == opened - 1
            hidden.clear()
            await hub.poll()
            # the late entry, as it reads now (a is closed: only b and c are open), and nothing
            # delivered twice
            assert watcher.seen == [("approved", a.id), ("requested", b.id), ("requested", c.id)]
            assert hub.position(watcher) == entries[-1].id


async def until(check: Any, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_a_running_hub_follows_the_trail_by_itself(store_url: str) -> None:
    runs: list[str] = []
    async with so.Runtime([three_refunds(runs)], store=store_url) as rt:
        sms = Texts()
        async with ChannelHub(rt, [sms], poll_interval=0.05):
            r = await rt.generate("support", prompt="Refund A, B and C")
            a, b, _ = r.pending
            await until(lambda: sms.sent == [sms.render(a)])
            await rt.respond(r.session_id, [so.InputResponse(request_id=a.id, option_id="approve")])
            await until(lambda: sms.sent[-1] == sms.render(b))
            assert sms.sent[-2].startswith("issue_refund was approved by the policy")


async def test_a_channel_that_cannot_start_does_not_stop_the_others(tmp_path: Path) -> None:
    class Down(Flaky):
        async def start(self, open_requests: Any) -> None:
            raise ConnectionError("service down")

    runs: list[str] = []
    async with runtime(tmp_path, three_refunds(runs)) as rt:
        r = await rt.generate("support", prompt="Refund A, B and C")
        down, sms = Down(0, name="down"), Texts()
        async with manual(ChannelHub(rt, [down, sms])) as hub:
            assert sms.sent == [sms.render(r.pending[0])]
            await rt.respond(
                r.session_id, [so.InputResponse(request_id=r.pending[0].id, option_id="approve")]
            )
            await hub.poll()
            assert down.seen == [("approved", r.pending[0].id)]


async def test_a_failing_channel_backs_off_and_gives_up_after_max_attempts(
    tmp_path: Path,
) -> None:
    runs: list[str] = []
    async with runtime(tmp_path, three_refunds(runs)) as rt:
        broken = Flaky(100)
        async with manual(ChannelHub(rt, [broken], retry_backoff=3600)) as hub:
            await rt.generate("support", prompt="Refund A, B and C")
            await hub.poll()
            await hub.poll()  # within its backoff: not tried again
            assert broken.attempts == 1
        broken = Flaky(100)
        async with manual(ChannelHub(rt, [broken], retry_backoff=0, max_attempts=3)) as hub:
            start = hub.position(broken)
            r = await rt.generate("support", prompt="Refund A, B and C again")
            for _ in range(5):
                await hub.poll()
            assert broken.attempts == 3  # then the entry is skipped for this channel
            assert hub.position(broken) > start
            await rt.respond(
                r.session_id, [so.InputResponse(request_id=r.pending[0].id, option_id="approve")]
            )
            await hub.poll()
            assert broken.seen == [("approved", r.pending[0].id)]


class Throttled(Flaky):
    """A `Flaky` whose service, for its next `limit` resolutions, asks to be called later."""

    def __init__(self, limit: int, **kwargs: Any) -> None:
        super().__init__(0, **kwargs)
        self.limit = limit

    async def on_resolved(self, request: so.InputRequest, resolution: Resolution) -> None:
        if self.limit:
            self.limit -= 1
            raise RateLimited("slow down", 0.0)
        await super().on_resolved(request, resolution)


async def test_an_entry_given_up_on_and_rate_limited_when_redelivered_is_sent_in_that_run(
    tmp_path: Path, store_url: str
) -> None:
    """The entries a hub gave up on are delivered again at its next start; a rate limit then
    (many at once can hit one) waits for the service's Retry-After, as on the feed, rather
    than leaving them for the start after, and the entries after them wait behind them."""
    runs: list[str] = []
    state = tmp_path / "hub.db"
    async with so.Runtime([three_refunds(runs)], store=store_url) as rt:
        r = await rt.generate("support", prompt="Refund A, B and C")
        a, b, _ = r.pending
        broken = Flaky(0)
        async with manual(ChannelHub(rt, [broken], state=state, max_attempts=1)) as hub:
            await hub.poll()

            async def fail(request: so.InputRequest, resolution: Resolution) -> None:
                raise ConnectionError("service down")

            broken.on_resolved = fail  # type: ignore[method-assign]
            await rt.respond(r.session_id, [so.InputResponse(request_id=a.id, option_id="approve")])
            await hub.poll()  # given up on: kept for the next start
        await rt.respond(r.session_id, [so.InputResponse(request_id=b.id, option_id="approve")])
        throttled = Throttled(1)
        async with manual(ChannelHub(rt, [throttled], state=state)) as hub:
            assert throttled.seen == []  # rate limited at start
            await hub.poll()
            assert throttled.seen == [("approved", a.id), ("approved", b.id)]
        again = Flaky(0)
        async with manual(ChannelHub(rt, [again], state=state)) as hub:
            await hub.poll()
        assert again.seen == []  # nothing twice


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


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"poll_interval": float("nan")}, "poll_interval must be positive"),
        ({"retry_backoff": float("nan")}, "retry_backoff and gap_timeout"),
        ({"gap_timeout": float("nan")}, "retry_backoff and gap_timeout"),
        ({"gap_timeout": float("inf")}, "retry_backoff and gap_timeout"),
        ({"retry_backoff": -1}, "retry_backoff and gap_timeout"),
    ],
)
def test_a_hub_refuses_seconds_that_are_not_finite(
    tmp_path: Path, setting: dict[str, Any], message: str
) -> None:
    """NaN passed the hub's `<= 0` / `< 0` checks, and its loops then slept or waited NaN."""
    rt = so.Runtime([], store=f"sqlite:///{tmp_path}/s.db")
    with pytest.raises(so.UsageError, match=message):
        ChannelHub(rt, [], **setting)


@pytest.mark.parametrize("attempts", [0, 2.5, float("nan"), True, "3"])
def test_a_hub_refuses_max_attempts_that_is_not_a_whole_number_from_1(
    tmp_path: Path, attempts: Any
) -> None:
    """NaN passed the hub's `< 1` check (no delivery was ever given up on), 2.5 and True were
    taken as counts, and "3" raised a bare TypeError."""
    rt = so.Runtime([], store=f"sqlite:///{tmp_path}/s.db")
    with pytest.raises(so.UsageError, match=r"^max_attempts must be a whole number from 1, not "):
        ChannelHub(rt, [], max_attempts=attempts)


@pytest.mark.parametrize("busy_timeout", [float("nan"), float("inf"), -1, "5", True])
def test_channel_state_refuses_a_busy_timeout_that_is_not_seconds(busy_timeout: Any) -> None:
    with pytest.raises(so.UsageError, match="busy_timeout must be seconds from 0"):
        ChannelState(":memory:", busy_timeout=busy_timeout)


def test_channel_options_of_the_wrong_kind_are_refused_when_made() -> None:
    """Each was taken, and failed (or answered as nobody) only when the first request came."""
    with pytest.raises(so.UsageError, match="accepts must be a function of the request"):
        Texts(accepts="support")
    with pytest.raises(so.UsageError, match="principal must be a so.Principal or None"):
        TerminalTextChannel(principal="bob")  # type: ignore[arg-type]
    with pytest.raises(so.UsageError, match="terminal must be a TerminalChannel or None"):
        TerminalTextChannel(terminal=Console())  # type: ignore[arg-type]
    with pytest.raises(so.UsageError, match="read must be a function"):
        TerminalChannel(read="y")  # type: ignore[arg-type]
    with pytest.raises(so.UsageError, match="clock must be a function"):
        TerminalChannel(clock=5.0)  # type: ignore[arg-type]
    with pytest.raises(so.UsageError, match="console must be a rich Console or None"):
        TerminalChannel(console=io.StringIO())  # type: ignore[arg-type]


async def test_a_hub_ticks_its_channels_by_its_runtimes_time(store_url: str) -> None:
    """A hub given no clock tells its channels the runtime's time (`Runtime.now`, the
    database's on PostgreSQL), which the request deadlines it warns of were set by."""
    seen: list[float] = []

    class Ticking(Channel):
        async def tick(self, now: float) -> None:
            seen.append(now)

    clock = ManualClock()
    async with so.Runtime([], store=store_url, clock=clock) as rt:
        async with manual(ChannelHub(rt, [Ticking(name="ticking")])) as hub:
            await hub.poll()
            clock.advance(30)
            await hub.poll()
    assert seen == [clock.now - 30, clock.now]
