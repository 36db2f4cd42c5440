"""A keyed message that answers a request settled by more than the default rule (four eyes, a
quorum, a response policy) or mirrored from a subagent answers once: repeated with its key, it
is not delivered again as a new message (on both stores)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import signoff as so
from signoff import _mirrors
from signoff.cli._events import _summary as cli_summary
from signoff.server._trace_summary import summary as page_summary
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent, store_contents
from tests._server_api import in_process
from tests._subagents import Counted, refund_agents
from tests.test_docs_events import rows

ALICE = so.Principal(authenticator="okta", principal_id="alice")
BOB = so.Principal(authenticator="okta", principal_id="bob")
CAROL = so.Principal(authenticator="okta", principal_id="carol")


def refunding(approval: Any, ran: list[str]) -> so.Agent:
    @so.tool(approval=approval)
    async def refund(order_id: str) -> str:
        """Refund an order."""
        ran.append(order_id)
        return "refunded"

    return scripted_agent(
        "billing",
        [call_tools(call("refund", call_id="c1", order_id="1042")), reply("done")],
        tools=[refund],
        repeat_last=True,
    )


async def messages(rt: so.Runtime, session_id: str) -> list[str]:
    return [
        e.data["message"]
        async for e in rt.events(session_id, follow=False)
        if e.type in ("turn.started", "turn.message")
    ]


async def event_count(rt: so.Runtime, session_id: str) -> int:
    return len([e async for e in rt.events(session_id, follow=False)])


def bobs_only(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
    if ctx.response.principal is not None and ctx.response.principal.principal_id == "bob":
        return so.Allowed()
    return so.Rejected("only bob settles refunds")


async def test_a_keyed_message_settling_a_four_eyes_approval_is_sent_once(store_url: str) -> None:
    ran: list[str] = []
    agent = refunding(so.always(exclude_requester=True), ran)
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund 1042", auth=ALICE)
        first = await rt.send(r.session_id, "approve", principal=BOB, idempotency_key="k")
        assert (first.status, first.turn_id, ran) == ("completed", r.turn_id, ["1042"])
        before = await event_count(rt, r.session_id)
        again = await rt.send(r.session_id, "approve", principal=BOB, idempotency_key="k")
        assert again.replayed and (again.turn_id, again.status) == (r.turn_id, "completed")
        assert await event_count(rt, r.session_id) == before  # no turn started with "approve"
        assert await messages(rt, r.session_id) == ["refund 1042"]
        assert await rt.verify_audit() == []


async def test_a_keyed_message_settling_through_a_response_policy_is_sent_once(
    store_url: str,
) -> None:
    ran: list[str] = []
    agent = refunding(so.ApprovalSpec(request=so.always(), response=bobs_only), ran)
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund 1042", auth=ALICE)
        first = await rt.send(r.session_id, "approve", principal=BOB, idempotency_key="k")
        assert (first.status, ran) == ("completed", ["1042"])
        before = await event_count(rt, r.session_id)
        again = await rt.send(r.session_id, "approve", principal=BOB, idempotency_key="k")
        assert again.replayed and again.turn_id == r.turn_id
        assert await event_count(rt, r.session_id) == before
        assert await messages(rt, r.session_id) == ["refund 1042"]
        assert await rt.verify_audit() == []


async def test_a_keyed_vote_repeated_is_not_counted_twice(store_url: str) -> None:
    """A quorum that lets one person vote twice (`distinct=False`) counts a message once,
    however often it is retried with its key."""
    ran: list[str] = []
    agent = refunding(so.always(approvers=2, distinct=False), ran)
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund 1042", auth=ALICE)
        first = await rt.send(r.session_id, "approve", principal=BOB, idempotency_key="k")
        assert first.status == "waiting" and first.pending[0].approved_by == ["bob"]
        before = await event_count(rt, r.session_id)
        again = await rt.send(r.session_id, "approve", principal=BOB, idempotency_key="k")
        assert again.replayed and again.status == "waiting" and ran == []
        assert again.pending[0].approved_by == ["bob"]
        assert await event_count(rt, r.session_id) == before
        done = await rt.send(r.session_id, "approve", principal=CAROL)
        assert (done.status, ran) == ("completed", ["1042"])
        assert await rt.verify_audit() == []


async def test_a_keyed_message_answering_a_subagents_request_is_sent_once(
    store_url: str,
) -> None:
    ran: list[dict[str, Any]] = []
    parent, child = refund_agents(ran, Counted("Done."))
    async with so.Runtime([parent, child], store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 1042", auth=ALICE)
        assert r.status == "waiting"
        first = await rt.send(r.session_id, "approve", principal=ALICE, idempotency_key="k")
        assert (first.status, first.turn_id, len(ran)) == ("completed", r.turn_id, 1)
        before = await event_count(rt, r.session_id)
        again = await rt.send(r.session_id, "approve", principal=ALICE, idempotency_key="k")
        assert again.replayed and (again.turn_id, again.status) == (r.turn_id, "completed")
        assert await event_count(rt, r.session_id) == before
        assert await messages(rt, r.session_id) == ["refund 1042"]
        assert await rt.verify_audit() == []


async def test_a_keyed_vote_sent_twice_at_once_is_counted_once(store_url: str) -> None:
    ran: list[str] = []
    agent = refunding(so.always(approvers=2, distinct=False), ran)
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund 1042", auth=ALICE)
        results = await asyncio.gather(
            *(rt.send(r.session_id, "approve", principal=BOB, idempotency_key="k") for _ in "ab")
        )
        assert [x.status for x in results] == ["waiting", "waiting"] and ran == []
        assert (await rt.state(r.session_id)).pending_requests()[0].approved_by == ["bob"]
        assert await rt.verify_audit() == []


async def test_keyed_votes_through_a_response_policy_each_count(store_url: str) -> None:
    ran: list[str] = []
    spec = so.ApprovalSpec(request=so.always(approvers=2), response=lambda ctx: so.Allowed())
    agent = refunding(spec, ran)
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund 1042", auth=ALICE)
        first = await rt.send(r.session_id, "approve", principal=BOB, idempotency_key="b")
        assert first.status == "waiting" and first.pending[0].approved_by == ["bob"]
        again = await rt.send(r.session_id, "approve", principal=BOB, idempotency_key="b")
        assert again.replayed and again.pending[0].approved_by == ["bob"]
        done = await rt.send(r.session_id, "approve", principal=CAROL, idempotency_key="c")
        assert (done.status, ran) == ("completed", ["1042"])
        assert await rt.verify_audit() == []


async def test_a_keyed_vote_for_a_subagents_quorum_repeated_counts_once(store_url: str) -> None:
    ran: list[str] = []
    child = refunding(so.always(approvers=2, distinct=False), ran)
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", call_id="d1", message="Refund 1042")), reply("Done.")],
        tools=[so.delegate("billing", description="Billing specialist.")],
    )
    async with so.Runtime([parent, child], store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 1042", auth=ALICE)
        first = await rt.send(r.session_id, "approve", principal=BOB, idempotency_key="k")
        assert first.status == "waiting" and first.pending[0].approved_by == ["bob"]
        again = await rt.send(r.session_id, "approve", principal=BOB, idempotency_key="k")
        assert again.replayed and again.status == "waiting" and ran == []
        assert again.pending[0].approved_by == ["bob"]
        done = await rt.send(r.session_id, "approve", principal=CAROL)
        assert (done.status, ran) == ("completed", ["1042"])
        assert await rt.verify_audit() == []


async def test_a_keyed_vote_judged_by_a_subagents_policy_repeated_counts_once(
    store_url: str,
) -> None:
    ran: list[str] = []
    spec = so.ApprovalSpec(
        request=so.always(approvers=2, distinct=False), response=lambda ctx: so.Allowed()
    )
    child = refunding(spec, ran)
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", call_id="d1", message="Refund 1042")), reply("Done.")],
        tools=[so.delegate("billing", description="Billing specialist.")],
    )
    async with so.Runtime([parent, child], store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 1042", auth=ALICE)
        first = await rt.send(r.session_id, "approve", principal=BOB, idempotency_key="k")
        assert first.status == "waiting" and first.pending[0].approved_by == ["bob"]
        again = await rt.send(r.session_id, "approve", principal=BOB, idempotency_key="k")
        assert again.replayed and again.status == "waiting" and ran == []
        assert again.pending[0].approved_by == ["bob"]
        done = await rt.send(r.session_id, "approve", principal=CAROL)
        assert (done.status, ran) == ("completed", ["1042"])
        assert await rt.verify_audit() == []


async def test_a_keyed_message_whose_subagents_request_closed_meanwhile_is_delivered(
    store_url: str,
) -> None:
    """The child's request expires while its response policy judges the message's answer: the
    message answered nothing, so it is delivered as a message (not taken as a repeat)."""
    clock = ManualClock()

    async def slow(ctx: so.ResponseContext) -> so.Allowed:
        clock.advance(61)
        return so.Allowed()

    ran: list[str] = []
    child = refunding(so.ApprovalSpec(request=so.always(expires_in=60), response=slow), ran)
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", call_id="d1", message="Refund 1042")), reply("Done.")],
        tools=[so.delegate("billing", description="Billing specialist.")],
        repeat_last=True,
    )
    async with so.Runtime([parent, child], store=store_url, clock=clock) as rt:
        r = await rt.generate("support", prompt="refund 1042", auth=ALICE)
        await rt.send(r.session_id, "approve", principal=ALICE, idempotency_key="k")
        assert ran == []
        assert "approve" in await messages(rt, r.session_id)


async def test_a_keyed_message_whose_request_closed_while_judged_is_delivered(
    store_url: str,
) -> None:
    """The request expires while its response policy judges a keyed message's answer: the
    message answered nothing, so it is delivered as a message, as one without a key is."""
    clock = ManualClock()

    async def slow(ctx: so.ResponseContext) -> so.Allowed:
        clock.advance(61)
        return so.Allowed()

    ran: list[str] = []
    spec = so.ApprovalSpec(request=so.always(expires_in=60), response=slow)
    async with so.Runtime([refunding(spec, ran)], store=store_url, clock=clock) as rt:
        r = await rt.generate("billing", prompt="refund 1042", auth=ALICE)
        await rt.send(r.session_id, "approve", principal=BOB, idempotency_key="k")
        assert ran == []
        assert "approve" in await messages(rt, r.session_id)


async def test_a_keyed_answer_sent_at_once_from_two_runtimes_says_the_repeats_replayed(
    store_url: str,
) -> None:
    """Two processes sending one keyed answer at once: one applies it, and every other call,
    which found the request already settled with that answer, reports itself a repeat
    (`replayed`), as a repeat arriving later does (it said `replayed: false` on PostgreSQL)."""
    ran: list[str] = []
    agent = refunding(so.always(), ran)
    async with (
        so.Runtime([agent], store=store_url) as one,
        so.Runtime([refunding(so.always(), ran)], store=store_url) as two,
    ):
        r = await one.generate("billing", prompt="refund 1042", auth=ALICE)
        results = await asyncio.gather(
            *(
                rt.send(r.session_id, "approve", principal=ALICE, idempotency_key="k")
                for rt in (one, two, one, two)
            )
        )
        assert [x.status for x in results] == ["completed"] * 4 and ran == ["1042"]
        assert sorted(x.replayed for x in results) == [False, True, True, True], results
        assert sum(o.applied for x in results for o in x.outcomes) == 1
        assert await messages(one, r.session_id) == ["refund 1042"]
        assert await one.verify_audit() == []


def _delegating(child: so.Agent) -> list[so.Agent]:
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", call_id="d1", message="Refund 1042")), reply("Done.")],
        tools=[so.delegate("billing", description="Billing specialist.")],
    )
    return [parent, child]


async def test_a_keyed_vote_for_a_subagents_quorum_repeated_over_http_says_replayed(
    store_url: str,
) -> None:
    """A keyed message's vote on a subagent's quorum, sent again with its key, counted nothing
    again but said `replayed: false`: the key is recorded in the child, which counted the vote,
    and the parent records no vote. It says `replayed: true`, as every other repeat does, and
    nothing is stored, on both stores."""
    ran: list[str] = []
    agents = _delegating(refunding(so.always(approvers=2, distinct=False), ran))
    async with so.Runtime(agents, store=store_url) as rt, in_process(rt) as alice:
        r = await alice.post("/v1/sessions", json={"agent": "support", "message": "refund 1042"})
        sid = r.json()["session_id"]
        url, key = f"/v1/sessions/{sid}/messages", {"Idempotency-Key": "vote-1"}
        first = (await alice.post(url, json={"text": "approve"}, headers=key)).json()
        assert (first["status"], first["replayed"]) == ("waiting", False)
        assert first["pending"][0]["approved_by"] == ["alice"]
        child = first["pending"][0]["child"]["session_id"]
        before = [await store_contents(rt.store, s) for s in (sid, child)]
        again = await alice.post(url, json={"text": "approve"}, headers=key)
        assert again.status_code == 200 and again.json()["replayed"] is True, again.json()
        assert again.json()["pending"] == first["pending"] and ran == []
        assert [await store_contents(rt.store, s) for s in (sid, child)] == before
        assert await rt.verify_audit() == []


def _counted_parent(child: so.Agent, after: Counted) -> list[so.Agent]:
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", call_id="d1", message="Refund 1042")), after],
        tools=[so.delegate("billing", description="Billing specialist.")],
        repeat_last=True,
    )
    return [parent, child]


async def _both(rt: so.Runtime, parent: str, child: str) -> list[Any]:
    return [await store_contents(rt.store, s) for s in (parent, child)]


async def test_a_keyed_vote_through_a_subagents_mirror_is_one_call_in_both_sessions(
    store_url: str,
) -> None:
    """A keyed message's vote on a subagent's quorum, counted through the parent's mirror, was
    recorded in the child only: the same key with another message ("deny") was taken as a new
    call and denied the request. It is `IdempotencyKeyReused` naming the parent, where it was
    sent, and nothing is stored; the same key sent to the child is the same call there."""
    ran: list[str] = []
    agents = _counted_parent(refunding(so.always(approvers=2), ran), Counted("Done."))
    async with so.Runtime(agents, store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 1042", auth=ALICE)
        first = await rt.send(r.session_id, "approve", principal=BOB, idempotency_key="k")
        assert first.status == "waiting" and first.pending[0].approved_by == ["bob"]
        child = first.pending[0].child
        assert child is not None
        before = await _both(rt, r.session_id, child.session_id)
        with pytest.raises(so.IdempotencyKeyReused) as caught:
            await rt.send(r.session_id, "deny", principal=BOB, idempotency_key="k")
        assert caught.value.session_id == r.session_id
        again = await rt.send(child.session_id, "approve", principal=BOB, idempotency_key="k")
        assert again.replayed and again.status == "waiting"
        with pytest.raises(so.IdempotencyKeyReused) as caught:
            await rt.send(child.session_id, "deny", principal=BOB, idempotency_key="k")
        assert caught.value.session_id == child.session_id
        assert await _both(rt, r.session_id, child.session_id) == before and ran == []
        done = await rt.send(r.session_id, "approve", principal=CAROL)
        assert (done.status, ran) == ("completed", ["1042"])
        assert await rt.verify_audit() == []


@pytest.mark.parametrize("end", ["quorum", "cancel"])
async def test_a_keyed_vote_through_a_subagents_mirror_retried_after_its_turn_is_replayed(
    store_url: str, end: str
) -> None:
    """A keyed vote through a subagent's mirror, sent again with its key after the quorum was
    made (or the parent cancelled): the parent had no record of it, so the retry started a new
    turn with "approve" as its prompt and ran the model again. It is `replayed`, answers with
    the turn the vote went to, and stores nothing."""
    ran: list[str] = []
    after = Counted("Done.")
    agents = _counted_parent(refunding(so.always(approvers=2), ran), after)
    async with so.Runtime(agents, store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 1042", auth=ALICE)
        first = await rt.send(r.session_id, "approve", principal=ALICE, idempotency_key="k")
        assert first.outcomes[0].outcome == "counted" and first.outcomes[0].applied
        if end == "quorum":
            done = await rt.send(r.session_id, "approve", principal=BOB)
            assert (done.status, ran, after.calls) == ("completed", ["1042"], 1)
        else:
            await rt.cancel(r.session_id, principal=ALICE)
        child = first.pending[0].child
        assert child is not None
        before = await _both(rt, r.session_id, child.session_id)
        calls = after.calls
        again = await rt.send(r.session_id, "approve", principal=ALICE, idempotency_key="k")
        status = "completed" if end == "quorum" else "cancelled"
        assert again.replayed and (again.turn_id, again.status) == (r.turn_id, status)
        assert await _both(rt, r.session_id, child.session_id) == before
        assert after.calls == calls and await messages(rt, r.session_id) == ["refund 1042"]
        assert await rt.verify_audit() == []


async def test_a_keyed_vote_through_a_mirror_whose_parent_record_was_lost_stays_one_call(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process killed between the child's commit of a keyed vote and the parent's record of
    its key: the parent holds no key. Sent again with another message, the message is refused
    (the child holds the key); with the same message it is a repeat, and the parent records the
    key then, so a retry after the quorum is made is still one."""
    ran: list[str] = []
    after = Counted("Done.")
    agents = _counted_parent(refunding(so.always(approvers=2), ran), after)
    async with so.Runtime(agents, store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 1042", auth=ALICE)
        with monkeypatch.context() as m:

            async def killed(*args: Any) -> None:
                return None  # the process died before the parent's commit

            m.setattr(_mirrors, "keep_vote_key", killed, raising=False)
            first = await rt.send(r.session_id, "approve", principal=BOB, idempotency_key="k")
        assert first.status == "waiting" and first.pending[0].approved_by == ["bob"]
        child = first.pending[0].child
        assert child is not None
        before = await _both(rt, r.session_id, child.session_id)
        with pytest.raises(so.IdempotencyKeyReused) as caught:
            await rt.send(r.session_id, "deny", principal=BOB, idempotency_key="k")
        assert caught.value.session_id == r.session_id
        assert await _both(rt, r.session_id, child.session_id) == before
        again = await rt.send(r.session_id, "approve", principal=BOB, idempotency_key="k")
        assert again.replayed and again.status == "waiting" and ran == []
        assert again.pending[0].approved_by == ["bob"]
        done = await rt.send(r.session_id, "approve", principal=CAROL)
        assert (done.status, ran) == ("completed", ["1042"])
        calls = after.calls
        last = await rt.send(r.session_id, "approve", principal=BOB, idempotency_key="k")
        assert last.replayed and (last.turn_id, last.status) == (r.turn_id, "completed")
        assert after.calls == calls and await messages(rt, r.session_id) == ["refund 1042"]
        assert await rt.verify_audit() == []


async def test_a_keyed_vote_through_a_subagents_mirror_over_http_is_one_call(
    store_url: str,
) -> None:
    """Over HTTP: the same `Idempotency-Key` with another text after a vote through a mirror is
    409 `idempotency_key_reused` (it was 200 and denied the request), and the vote sent again
    after the quorum was made is `replayed` (it started a new turn), each storing nothing."""
    ran: list[str] = []
    after = Counted("Done.")
    agents = _counted_parent(refunding(so.always(approvers=2), ran), after)
    async with so.Runtime(agents, store=store_url) as rt, in_process(rt) as alice:
        r = await alice.post("/v1/sessions", json={"agent": "support", "message": "refund 1042"})
        sid = r.json()["session_id"]
        url, key = f"/v1/sessions/{sid}/messages", {"Idempotency-Key": "vote-1"}
        first = (await alice.post(url, json={"text": "approve"}, headers=key)).json()
        assert (first["status"], first["pending"][0]["approved_by"]) == ("waiting", ["alice"])
        child = first["pending"][0]["child"]["session_id"]
        before = await _both(rt, sid, child)
        other = await alice.post(url, json={"text": "deny"}, headers=key)
        assert other.status_code == 409, other.text
        assert other.json()["error"]["code"] == "idempotency_key_reused"
        assert await _both(rt, sid, child) == before and ran == []
        bob = {"Authorization": "Bearer bob-token"}
        done = (await alice.post(url, json={"text": "approve"}, headers=bob)).json()
        assert (done["status"], ran) == ("completed", ["1042"])
        before, calls = await _both(rt, sid, child), after.calls
        again = await alice.post(url, json={"text": "approve"}, headers=key)
        assert again.status_code == 200 and again.json()["replayed"] is True, again.json()
        assert (again.json()["turn_id"], again.json()["status"]) == (first["turn_id"], "completed")
        assert await _both(rt, sid, child) == before and after.calls == calls
        assert await rt.verify_audit() == []


async def test_a_keyed_vote_counted_before_keeps_its_key_once_the_quorum_is_made(
    store_url: str,
) -> None:
    """Bob voted without a key, then sent "approve" with one: counted already, it changed
    nothing and recorded no key, so once Carol made the quorum the call sent again with its key
    started a new turn taking "approve" as its prompt. The key is kept (`input.repeated`) with
    the turn it answered into: sent again it is a repeat, before the quorum and after, and the
    same key with another message is `IdempotencyKeyReused`."""
    ran: list[str] = []
    async with so.Runtime([refunding(so.always(approvers=2), ran)], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund 1042", auth=ALICE)
        (request,) = r.pending
        yes = so.InputResponse(request_id=request.id, option_id="approve")
        assert (await rt.respond(r.session_id, [yes], principal=BOB)).status == "waiting"
        first = await rt.send(r.session_id, "approve", principal=BOB, idempotency_key="k")
        assert [(o.outcome, o.applied) for o in first.outcomes] == [("counted", False)]
        assert (first.status, first.replayed) == ("waiting", False)
        before = await event_count(rt, r.session_id)
        again = await rt.send(r.session_id, "approve", principal=BOB, idempotency_key="k")
        assert again.replayed and (again.turn_id, again.status) == (r.turn_id, "waiting")
        assert await event_count(rt, r.session_id) == before
        done = await rt.send(r.session_id, "approve", principal=CAROL)
        assert (done.status, ran) == ("completed", ["1042"])
        before = await event_count(rt, r.session_id)
        last = await rt.send(r.session_id, "approve", principal=BOB, idempotency_key="k")
        assert last.replayed and (last.turn_id, last.status) == (r.turn_id, "completed")
        with pytest.raises(so.IdempotencyKeyReused):
            await rt.send(r.session_id, "deny", principal=BOB, idempotency_key="k")
        assert await event_count(rt, r.session_id) == before
        assert await messages(rt, r.session_id) == ["refund 1042"]
        assert ran == ["1042"] and await rt.verify_audit() == []
        events = [e async for e in rt.events(r.session_id, follow=False)]
        (kept,) = [e for e in events if e.type == "input.repeated"]
        assert kept.turn_id == r.turn_id
        assert sorted(kept.data) == ["by", "idem", "request_id"]
        documented = rows()["input.repeated"]
        assert all(f"`{field}`" in documented for field in kept.data)
        said = f"{request.id} answered again by bob (nothing changed)"
        assert cli_summary(kept) == said  # `signoff events`
        assert "".join(part for part, _ in page_summary(kept, {})) == said  # the dashboard
        assert (kept.data["request_id"], kept.data["by"]) == (request.id, BOB.model_dump())


@pytest.mark.parametrize("kind", ["approval", "question"])
async def test_a_keyed_answer_someone_gave_first_keeps_its_key(
    store_url: str, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """A keyed message taken as an answer its request had been settled with meanwhile (Alice
    gave the same answer first) changed nothing and recorded no key: the call sent again, the
    request closed, started a new turn with the message as its prompt. It is a repeat, and
    answers with the turn the message answered into."""
    ran: list[str] = []
    if kind == "approval":
        agent = refunding(so.always(), ran)
        word, option, answer, runs = "approve", "approve", "approved", ["1042"]
    else:

        @so.tool
        async def pick(ctx: so.ToolContext) -> str:
            """Pick a plan."""
            got = await ctx.ask("Which plan?", options=["basic", "pro"], allow_text=False)
            ran.append(str(got.option_id))
            return str(got.option_id)

        agent = scripted_agent(
            "billing",
            [call_tools(call("pick", call_id="c1")), reply("done")],
            tools=[pick],
            repeat_last=True,
        )
        word, option, answer, runs = "pro", "pro", "answered", ["pro"]
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund 1042", auth=ALICE)
        (request,) = r.pending
        original = type(rt)._answering
        answered: list[bool] = []

        async def alice_first(self: Any, state: Any, message: str, who: Any) -> Any:
            first = await original(self, state, message, who)
            if not answered:  # Alice's answer lands between the read and the settlement
                answered.append(True)
                alice = so.InputResponse(request_id=request.id, option_id=option)
                await rt.respond(r.session_id, [alice], principal=ALICE, resume=False)
            return first

        monkeypatch.setattr(type(rt), "_answering", alice_first)
        first = await rt.send(r.session_id, word, principal=ALICE, idempotency_key="k")
        monkeypatch.undo()
        assert [(o.outcome, o.applied) for o in first.outcomes] == [(answer, False)]
        assert (first.status, first.turn_id, ran) == ("completed", r.turn_id, runs)
        before = await event_count(rt, r.session_id)
        again = await rt.send(r.session_id, word, principal=ALICE, idempotency_key="k")
        assert again.replayed and (again.turn_id, again.status) == (r.turn_id, "completed")
        assert await event_count(rt, r.session_id) == before
        assert await messages(rt, r.session_id) == ["refund 1042"] and ran == runs
        assert await rt.verify_audit() == []


async def test_a_keyed_answer_a_response_policy_refused_takes_no_key(store_url: str) -> None:
    """A keyed message whose answer the response policy refused is not taken: sent again with
    its key it is judged again (refused again, recording nothing), and the key stays free."""
    ran: list[str] = []
    spec = so.ApprovalSpec(request=so.always(), response=bobs_only)
    async with so.Runtime([refunding(spec, ran)], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund 1042", auth=ALICE)
        first = await rt.send(r.session_id, "approve", principal=CAROL, idempotency_key="k")
        assert [(o.outcome, o.applied) for o in first.outcomes] == [("rejected", False)]
        before = await event_count(rt, r.session_id)
        again = await rt.send(r.session_id, "approve", principal=CAROL, idempotency_key="k")
        assert not again.replayed and again.outcomes[0].outcome == "rejected"
        assert await event_count(rt, r.session_id) == before
        assert not (await rt.state(r.session_id)).keys


async def test_a_keyed_vote_counted_before_through_a_mirror_keeps_its_key(store_url: str) -> None:
    """As above through a subagent's mirror: Bob's vote counted there before, his keyed
    "approve" sent to the parent changed nothing; sent again once the quorum is made it is a
    repeat answered with the parent's turn, not a new turn there."""
    ran: list[str] = []
    after = Counted("Done.")
    agents = _counted_parent(refunding(so.always(approvers=2), ran), after)
    async with so.Runtime(agents, store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 1042", auth=ALICE)
        yes = so.InputResponse(request_id=r.pending[0].id, option_id="approve")
        assert (await rt.respond(r.session_id, [yes], principal=BOB)).status == "waiting"
        first = await rt.send(r.session_id, "approve", principal=BOB, idempotency_key="k")
        assert [(o.outcome, o.applied) for o in first.outcomes] == [("counted", False)]
        done = await rt.send(r.session_id, "approve", principal=CAROL)
        assert (done.status, ran) == ("completed", ["1042"])
        calls = after.calls
        again = await rt.send(r.session_id, "approve", principal=BOB, idempotency_key="k")
        assert again.replayed and (again.turn_id, again.status) == (r.turn_id, "completed")
        assert after.calls == calls and await messages(rt, r.session_id) == ["refund 1042"]
        assert await rt.verify_audit() == []
