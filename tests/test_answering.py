"""`Answering`: settling answers when the store fails around the settling commit: the answer is
either recorded once or not at all, and answering again finishes the turn with the tool run
once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.stores import Commit
from signoff.stores.sqlite import SQLiteStore
from signoff.testing import (
    Capture,
    ManualClock,
    call,
    call_tools,
    reply,
    scripted_agent,
    store_contents,
    tool_results,
)

ALICE = so.Principal(authenticator="sso", principal_id="alice")
BOB = so.Principal(authenticator="sso", principal_id="bob")


class SettleFails(SQLiteStore):
    """SQLite whose first commit that settles a request fails, before or after writing it."""

    def __init__(self, url: str, *, after_write: bool) -> None:
        super().__init__(url)
        self.after_write = after_write
        self.failed = False

    async def commit(self, commit: Commit) -> None:
        if commit.resolve and not self.failed:
            self.failed = True
            if self.after_write:
                await super().commit(commit)  # written, but the caller hears of a failure
            raise so.StoreError("the connection dropped")
        await super().commit(commit)


def refund_agent(ran: list[str]) -> so.Agent:
    @so.tool(approval=so.always())
    async def issue_refund(order_id: str, amount: float) -> dict[str, float]:
        """Refund an order."""
        ran.append(order_id)
        return {"refunded": amount}

    return scripted_agent(
        "support",
        [call_tools(call("issue_refund", order_id="1042", amount=180)), reply("Refunded.")],
        tools=[issue_refund],
    )


@pytest.mark.parametrize("after_write", [False, True], ids=["lost", "written"])
async def test_a_store_failure_while_settling_is_retryable(
    tmp_path: Path, after_write: bool
) -> None:
    ran: list[str] = []
    store = SettleFails(f"sqlite:///{tmp_path}/s.db", after_write=after_write)
    async with so.Runtime([refund_agent(ran)], store=store) as rt:
        parked = await rt.generate("support", prompt="refund 1042")
        [request] = parked.pending
        before = await store_contents(rt.store, parked.session_id)
        answer = [so.InputResponse(request_id=request.id, option_id="approve")]
        with pytest.raises(so.StoreError):
            await rt.respond(parked.session_id, answer)
        if not after_write:
            assert await store_contents(rt.store, parked.session_id) == before
        assert ran == []
        done = await rt.respond(parked.session_id, answer)  # the same answer again
        assert done.status == "completed" and done.text == "Refunded."
        [outcome] = done.outcomes
        assert (outcome.outcome, outcome.applied) == ("approved", not after_write)
        assert ran == ["1042"]
        types = [e.type async for e in rt.events(parked.session_id, follow=False)]
        assert types.count("approval.settled") == 1


async def test_answers_given_up_on_for_contention_are_named(tmp_path: Path) -> None:
    """A settlement that keeps finding the session changed under it gives up with
    `RequestClosed` naming the requests it answered, as every answer error does, and records
    nothing."""

    class Contended(so.Runtime):
        contended = False

        async def _orphaned(self, state: object) -> bool:
            return self.contended  # the session changed again: read it anew

    rt = Contended([refund_agent([])], store=f"sqlite:///{tmp_path}/s.db")
    async with rt:
        parked = await rt.generate("support", prompt="refund 1042")
        [request] = parked.pending
        before = await store_contents(rt.store, parked.session_id)
        rt.contended = True
        answer = [so.InputResponse(request_id=request.id, option_id="approve")]
        with pytest.raises(so.RequestClosed, match="too much contention") as caught:
            await rt.respond(parked.session_id, answer)
        assert caught.value.request_ids == [request.id]
        assert await store_contents(rt.store, parked.session_id) == before


@pytest.mark.parametrize("options", [["approve", "cancel"], ["yes", "no"]])
async def test_a_decision_never_answers_a_question(store_url: str, options: list[str]) -> None:
    # A question whose option ids were approve / cancel was answered by a decision, though
    # `generate(approvals=...)` settles approvals only; with other options the refusal spoke of
    # an option 'approve' the caller never gave.
    @so.tool
    async def ship(ctx: so.ToolContext, order_id: str) -> str:
        """Ship an order once a person says so."""
        answer = await ctx.ask("Ship it?", options=options)
        return str(answer.option_id)

    script = [call_tools(call("ship", order_id="1")), reply("ok"), reply("again")]
    agent = scripted_agent("a", script, tools=[ship])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="go")
        (question,) = r.pending
        before = await store_contents(rt.store, r.session_id)
        decision = so.Decision(id=question.id, approved=True)
        with pytest.raises(so.InvalidAnswer, match=f"request {question.id} is a question") as info:
            await rt.generate(session_id=r.session_id, approvals=[decision])
        assert info.value.request_ids == [question.id]
        assert await store_contents(rt.store, r.session_id) == before
        # Answered as a question, it settles.
        answer = so.InputResponse(request_id=question.id, option_id=options[0])
        r = await rt.respond(r.session_id, [answer])
        assert (r.status, r.text) == ("completed", "ok")
        # Nor once it is closed and left behind by a later turn (read from the store then).
        r = await rt.generate(session_id=r.session_id, prompt="more")
        assert r.status == "completed"
        with pytest.raises(so.InvalidAnswer, match=f"request {question.id} is a question"):
            await rt.generate(session_id=r.session_id, approvals=[decision])


async def test_a_deadline_that_passes_while_an_edit_is_checked_wins(store_url: str) -> None:
    """An edit is checked by the tool's approval policy, which may be slow: a deadline that
    passes meanwhile closes the request, as it does while a response policy runs, and the
    edited call does not run."""
    clock = ManualClock()
    ran: list[float] = []

    def over_100(input: Any) -> bool:
        if input.amount == 500:  # the edit: a slow check, during which the deadline passes
            clock.advance(120)
        return bool(input.amount > 100)

    @so.tool(approval=so.ApprovalSpec(over_100, expires_in=60))
    async def pay_invoice(invoice: str, amount: float) -> dict[str, str]:
        """Pay an invoice."""
        ran.append(amount)
        return {"paid": invoice}

    seen = Capture(reply("timed out"))
    agent = scripted_agent(
        "pay",
        [call_tools(call("pay_invoice", invoice="INV-7", amount=900)), seen],
        tools=[pay_invoice],
    )
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        parked = await rt.generate("pay", prompt="pay INV-7", auth=ALICE)
        [request] = parked.pending
        edit = {"invoice": "INV-7", "amount": 500}
        answer = so.InputResponse(request_id=request.id, option_id="approve", edited_input=edit)
        with pytest.raises(so.RequestClosed, match="expired") as caught:
            await rt.respond(parked.session_id, [answer], principal=ALICE)
        assert caught.value.request_ids == [request.id]
        assert ran == []
        stored = await rt.store.get_request(request.id)
        assert stored is not None and (stored.status, stored.outcome) == ("expired", "expired")
        events = [e async for e in rt.events(parked.session_id, follow=False)]
        assert "approval.settled" not in [e.type for e in events]
        # The turn went on without it: the model read that the call timed out.
        assert tool_results(seen.last)[0].content["timed_out"] is True
        assert (await rt.state(parked.session_id)).turn.status == "completed"  # type: ignore[union-attr]


@pytest.mark.parametrize("rule", ["asker only", "four eyes"])
async def test_an_edit_from_someone_who_may_not_answer_is_not_judged(
    store_url: str, rule: str
) -> None:
    """An edit is judged by the tool's approval policy (user code, perhaps a decision model)
    only for someone who may answer: anyone else is refused as such, and learns nothing of
    what the policy would say of the input they chose."""
    judged: list[float] = []

    def limit(ctx: so.ApprovalContext) -> Any:
        judged.append(ctx.tool_input.amount)
        return so.Denied("over the 1000 limit") if ctx.tool_input.amount > 1000 else "user-approval"

    four_eyes = rule == "four eyes"
    spec = so.ApprovalSpec(so.policy(limit), exclude_requester=four_eyes or None)

    @so.tool(approval=spec)
    async def pay_invoice(invoice: str, amount: float) -> dict[str, str]:
        """Pay an invoice."""
        return {"paid": invoice}

    agent = scripted_agent(
        "pay",
        [call_tools(call("pay_invoice", invoice="INV-7", amount=900)), reply("paid")],
        tools=[pay_invoice],
    )
    stranger = ALICE if four_eyes else BOB  # the requester, or not the asker
    async with so.Runtime([agent], store=store_url) as rt:
        parked = await rt.generate("pay", prompt="pay INV-7", auth=ALICE)
        [request] = parked.pending
        before = await store_contents(rt.store, parked.session_id)
        judged.clear()
        for amount in (5000, 500):
            edit = {"invoice": "INV-7", "amount": amount}
            answer = so.InputResponse(request_id=request.id, option_id="approve", edited_input=edit)
            with pytest.raises(so.NotAllowed) as caught:
                await rt.respond(parked.session_id, [answer], principal=stranger)
            assert caught.value.request_ids == [request.id]
            assert "1000" not in str(caught.value)
        assert judged == []
        assert await store_contents(rt.store, parked.session_id) == before
        # Someone who may answer has the edit judged, and refused by the policy.
        edit = {"invoice": "INV-7", "amount": 5000}
        answer = so.InputResponse(request_id=request.id, option_id="approve", edited_input=edit)
        with pytest.raises(so.InvalidAnswer, match="over the 1000 limit"):
            await rt.respond(parked.session_id, [answer], principal=BOB if four_eyes else ALICE)
        assert judged == [5000]


@pytest.mark.parametrize(
    "checked_by",
    [
        "approval policy",
        "response policy",
        "response policy on an edit",
        "approval policy beside a response policy",
    ],
)
async def test_a_ttl_that_passes_while_an_answer_is_checked_wins(
    store_url: str, checked_by: str
) -> None:
    """The session's TTL passing while an answer is checked (an edit by the approval policy, or
    any answer by a response policy, both of which may be slow) expires the session, as it
    would have had anyone looked: the answer does not revive it, and the call does not run.
    An edit under a response policy, checked before its answer is recorded, was recorded after
    the TTL passed, which renewed it: the answer settled and the call ran."""
    clock = ManualClock()
    ran: list[float] = []
    slow_edit = checked_by.startswith("approval policy")

    def slow_check(input: Any) -> bool:
        if input.amount == 500 and slow_edit:  # the edit
            clock.advance(120)
        return True

    def slow_policy(ctx: so.ResponseContext) -> so.Allowed:
        if not slow_edit:
            clock.advance(120)
        return so.Allowed()

    by_policy = checked_by != "approval policy"
    spec = so.ApprovalSpec(slow_check, slow_policy) if by_policy else so.ApprovalSpec(slow_check)

    @so.tool(approval=spec)
    async def pay_invoice(invoice: str, amount: float) -> dict[str, str]:
        """Pay an invoice."""
        ran.append(amount)
        return {"paid": invoice}

    agent = scripted_agent(
        "pay",
        [call_tools(call("pay_invoice", invoice="INV-7", amount=900)), reply("paid")],
        tools=[pay_invoice],
        limits=so.Limits(ttl=60),
    )
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        parked = await rt.generate("pay", prompt="pay INV-7", auth=ALICE)
        [request] = parked.pending
        edit = None if checked_by == "response policy" else {"invoice": "INV-7", "amount": 500}
        answer = so.InputResponse(request_id=request.id, option_id="approve", edited_input=edit)
        with pytest.raises(so.SessionExpired):
            await rt.respond(parked.session_id, [answer], principal=ALICE)
        assert ran == []
        stored = await rt.store.get_request(request.id)
        assert stored is not None and stored.status == "expired"
        events = [e async for e in rt.events(parked.session_id, follow=False)]
        assert "approval.settled" not in [e.type for e in events]
        candidates = [e.data for e in events if e.type == "approval.candidate"]
        assert [c["outcome"] for c in candidates] == (["pending", "stale"] if by_policy else [])
        if by_policy:  # the answer as given, spent by the TTL
            assert candidates[0]["edited_input"] == edit
            assert "the session expired" in candidates[1]["reason"]
        failed = [e.data["error"]["code"] for e in events if e.type == "turn.failed"]
        assert failed == ["session_expired"]
        with pytest.raises(so.SessionExpired):
            await rt.generate(session_id=parked.session_id, prompt="again")


async def test_a_refusal_judged_past_the_ttl_does_not_revive_the_session(store_url: str) -> None:
    """Bob's answer, judged by a slow response policy that refuses it, meets the session's TTL
    passed meanwhile: his call is refused with `SessionExpired`, and the expiry is recorded with
    his answer's end. The refusal was recorded alone, which as activity renewed the TTL: Alice's
    approve after it settled the request and the call ran."""
    clock = ManualClock()
    ran: list[float] = []

    def policy(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
        if ctx.response.principal is not None and ctx.response.principal.principal_id == "bob":
            clock.advance(120)  # a slow lookup
            return so.Rejected("bob may not")
        return so.Allowed()

    @so.tool(approval=so.ApprovalSpec(so.always(), policy))
    async def pay_invoice(invoice: str, amount: float) -> dict[str, str]:
        """Pay an invoice."""
        ran.append(amount)
        return {"paid": invoice}

    agent = scripted_agent(
        "pay",
        [call_tools(call("pay_invoice", invoice="INV-7", amount=900)), reply("paid")],
        tools=[pay_invoice],
        limits=so.Limits(ttl=60),
    )
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        parked = await rt.generate("pay", prompt="pay INV-7", auth=ALICE)
        [request] = parked.pending
        answer = so.InputResponse(request_id=request.id, option_id="approve")
        for who in (BOB, ALICE):
            with pytest.raises(so.SessionExpired):
                await rt.respond(parked.session_id, [answer], principal=who)
        assert ran == []
        stored = await rt.store.get_request(request.id)
        assert stored is not None and stored.status == "expired"
        events = [e async for e in rt.events(parked.session_id, follow=False)]
        candidates = [e.data for e in events if e.type == "approval.candidate"]
        assert [(c["outcome"], c["by"]["principal_id"]) for c in candidates] == [
            ("pending", "bob"),
            ("stale", "bob"),
        ]
        failed = [e.data["error"]["code"] for e in events if e.type == "turn.failed"]
        assert failed == ["session_expired"]


async def test_a_request_id_holding_a_lone_surrogate_is_an_unknown_request_on_both_stores(
    store_url: str,
) -> None:
    """No request's id holds a lone surrogate, and neither store can look one up: answering
    one raised a bare UnicodeEncodeError from the driver. It is now an unknown request, named
    with the others of the call, and nothing is recorded."""
    ran: list[str] = []
    async with so.Runtime([refund_agent(ran)], store=store_url) as rt:
        parked = await rt.generate("support", prompt="refund 1042")
        [request] = parked.pending
        before = await store_contents(rt.store, parked.session_id)
        odd = "req_\ud800"
        for answer in (
            lambda: rt.respond(
                parked.session_id, [so.InputResponse(request_id=odd, option_id="approve")]
            ),
            lambda: rt.respond(  # with the real one: all or nothing
                parked.session_id,
                [
                    so.InputResponse(request_id=request.id, option_id="approve"),
                    so.InputResponse(request_id=odd, option_id="approve"),
                ],
            ),
            lambda: rt.generate(
                session_id=parked.session_id, approvals=[so.Decision(id=odd, approved=True)]
            ),
        ):
            with pytest.raises(so.UnknownRequest) as info:
                await answer()
            assert info.value.request_ids == [odd]
        assert await store_contents(rt.store, parked.session_id) == before
        assert ran == []
