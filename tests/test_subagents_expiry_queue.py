"""A session whose TTL passed, nothing recording it yet, over a subagent (or a subagent's
subagent) waiting on a person: its expiry cancels their delegated turns, so their requests take
no answer, and no surface that lists or counts open requests offers them (Python, the HTTP API,
the dashboard), nor does a read of the subagent's session (its page offers no form), on both
stores. A subagent's turn of its own, which its parent's expiry leaves
alone, stays listed."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace

import httpx
import pytest

import signoff as so
from signoff import _subagents
from signoff._unlisted import unlisted
from signoff.server import TokenAuth, create_app
from signoff.stores import PendingFilter
from signoff.stores._pending import DEEPEST
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from ._delegation import refund_desk
from .test_mirrors_ttl_counts import _counted
from .test_server_common import ALICE, TOKENS, auth
from .test_subagents_own_turns import agents as own_turn_desk


def _front_desk(ran: list[str], expiring: str) -> list[so.Agent]:
    """`front` delegates to `support`, which delegates to `billing`'s approval-gated refund;
    the `expiring` agent's sessions have a TTL of 60 s, the others' none."""
    front = scripted_agent(
        "front",
        [call_tools(call("support", message="refund 9")), reply("all done")],
        tools=[so.delegate("support")],
    )
    desk = [front, *refund_desk(so.always(), ran)]
    for agent in desk:
        if agent.name == expiring:
            agent.limits = so.Limits(ttl=60)
    return desk


async def _open(rt: so.Runtime) -> int:
    """How many open requests the store counts as answerable now, as `signoff pending` counts
    them: less the mirrors the queue leaves out (`unlisted`)."""
    now = rt.now()
    live = PendingFilter(live_at=now)
    hidden = await unlisted(rt.store, live, now)
    return await rt.store.count_pending(replace(live, excluded=tuple(hidden)))


async def test_a_child_whose_parent_passed_its_ttl_is_neither_listed_nor_counted(
    store_url: str,
) -> None:
    """`support` (TTL 60 s) waits on its mirror of `billing`'s approval. Once support's TTL
    passed, the mirror was left out at once, but the child's request stayed listed and counted
    everywhere, though answering it was `RequestClosed` (409 over HTTP), and only that answer
    cancelled the child."""
    ran: list[str] = []
    clock = ManualClock()
    support, billing = refund_desk(so.always(), ran)
    support.limits = so.Limits(ttl=60)
    async with so.Runtime([support, billing], store=store_url, clock=clock) as rt:
        r = await rt.generate("support", prompt="refund 9", auth=ALICE)
        (mirror,) = r.pending
        assert mirror.child is not None
        child, request = mirror.child.session_id, mirror.child.request_id
        before = await _counted(rt)
        assert before == {k: 2 for k in before} and await _open(rt) == 2
        clock.advance(60)  # the TTL itself counts as passed, as for the child's own
        after = await _counted(rt)
        assert after == {k: 0 for k in after} and await _open(rt) == 0
        assert await rt.pending() == [] and await rt.pending(session_id=child) == []
        page, _ = await rt.pending_page(PendingFilter(live_at=rt.now(), limit=10))
        assert page == []
        app = create_app(rt, auth=TokenAuth(TOKENS))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            shown = (await c.get(f"/v1/requests/{request}", headers=auth("alice-token"))).json()
            assert shown["status"] == "withdrawn"  # as the parent's expiry will close it
            stored = await rt.store.get_request(request)
            assert stored is not None and stored.status == "withdrawn"  # and recorded so
            answer = {"inputResponses": [{"requestId": request, "optionId": "approve"}]}
            refused = await c.post(
                f"/v1/sessions/{child}/responses", json=answer, headers=auth("alice-token")
            )
        assert refused.status_code == 409
        assert refused.json()["error"]["code"] == "request_closed"
        assert (await rt.state(child)).requests[request].status == "withdrawn"
        assert ran == []


@pytest.mark.parametrize("expiring", ["front", "support"])
async def test_a_grandchild_below_a_session_whose_ttl_passed_is_neither_listed_nor_answered(
    store_url: str, expiring: str
) -> None:
    """`front` > `support` > `billing`, the TTL of `front` (the top) or `support` (between)
    passing: billing's request and the mirrors above it were listed and counted (a mid-level
    TTL left billing's request and nothing else), and with the top's TTL passed an answer given
    to billing was taken: its refund ran, though front's expiry cancels the whole chain."""
    ran: list[str] = []
    clock = ManualClock()
    async with so.Runtime(_front_desk(ran, expiring), store=store_url, clock=clock) as rt:
        r = await rt.generate("front", prompt="refund 9", auth=ALICE)
        (top,) = r.pending
        assert top.child is not None
        mid = top.child.session_id
        [mirror] = (await rt.state(mid)).pending_requests()
        assert mirror.child is not None
        leaf = mirror.child.session_id
        assert len(await rt.pending()) == 3 and await _open(rt) == 3
        clock.advance(60)
        counted = await _counted(rt)
        assert counted == {k: 0 for k in counted} and await _open(rt) == 0
        assert await rt.pending() == []
        answer = so.InputResponse(request_id=mirror.child.request_id, option_id="approve")
        with pytest.raises(so.RequestClosed):
            await rt.respond(leaf, [answer], principal=ALICE)
        assert ran == []
        ended = (await rt.state(leaf)).turn
        assert ended is not None and ended.status == "cancelled"
        ended = (await rt.state(mid)).turn
        assert ended is not None  # its own TTL passed: failed; below front's: cancelled
        assert ended.status == ("failed" if expiring == "support" else "cancelled")


async def test_a_childs_own_turn_stays_listed_once_its_parents_ttl_passed(
    store_url: str,
) -> None:
    """A message sent to the child after its delegated turn started a turn of its own, which
    its parent's expiry does not cancel: its request is listed, counted and answered."""
    desk = own_turn_desk()
    desk[0].limits = so.Limits(ttl=60)  # support's
    clock = ManualClock()
    async with so.Runtime(desk, store=store_url, clock=clock) as rt:
        r = await rt.generate("support", prompt="Order 1042?", auth=ALICE)
        assert r.status == "completed"
        [kid] = [s.id for s in await rt.sessions(agent="billing")]
        own = await rt.send(kid, "Now refund it.", principal=ALICE)
        (request,) = own.pending
        clock.advance(60)
        for _ in range(2):  # the parent's expiry unrecorded, then recorded
            assert [p.id for p in await rt.pending()] == [request.id] and await _open(rt) == 1
            counted = await _counted(rt)
            assert counted == {k: 1 for k in counted}
            with pytest.raises(so.SessionExpired):
                await rt.send(r.session_id, "One more thing.")
        answer = so.InputResponse(request_id=request.id, option_id="approve")
        done = await rt.respond(kid, [answer], principal=ALICE)
        assert (done.status, done.text) == ("completed", "ok")


def test_the_ancestors_looked_at_reach_as_deep_as_subagents_nest() -> None:
    assert DEEPEST == _subagents.MAX_DEPTH


def _reads(c: httpx.AsyncClient, child: str) -> dict[str, Callable[[], Awaitable[str]]]:
    """The reads of the child's session a person looks at: its dashboard page, the open
    requests of the fragment a live page reads, and `GET /v1/sessions/{id}`."""
    headers = auth("alice-token")

    async def page() -> str:
        return (await c.get(f"/_signoff/sessions/{child}", headers=headers)).text

    async def fragment() -> str:
        got = await c.get(f"/_signoff/fragments/sessions/{child}", headers=headers)
        return str(got.json()["pending"])

    async def api() -> str:
        return (await c.get(f"/v1/sessions/{child}", headers=headers)).text

    return {"page": page, "fragment": fragment, "api": api}


@pytest.mark.parametrize("read", ["page", "fragment", "api"])
@pytest.mark.parametrize("expiring", ["support", "front"])
async def test_a_childs_page_offers_no_form_once_a_ttl_above_it_passed(
    store_url: str, read: str, expiring: str
) -> None:
    """`billing`'s session page, its live fragment and its HTTP read, once the TTL of a session
    above it passed (its parent's, or its grandparent's) with nobody reading those since: they
    showed its request open, with Deny and the reason box, though that TTL ended the delegated
    turn that asked it; the reason typed was then refused (409 `request_closed`, withdrawn) and
    lost. The read records that first, as an answer would: the request is withdrawn, its turn
    cancelled, and no form is offered."""
    ran: list[str] = []
    clock = ManualClock()
    desk = _front_desk(ran, expiring)
    if expiring == "support":
        desk = desk[1:]  # `support` at the top, `front` not in it
    async with so.Runtime(desk, store=store_url, clock=clock) as rt:
        r = await rt.generate(desk[0].name, prompt="refund 9", auth=ALICE)
        (mirror,) = r.pending
        ref = mirror.child
        if expiring == "front":  # the mirror in `support` of billing's request
            assert ref is not None
            (mirror,) = (await rt.state(ref.session_id)).pending_requests()
            ref = mirror.child
        assert ref is not None
        leaf, request = ref.session_id, ref.request_id
        transport = httpx.ASGITransport(app=create_app(rt, auth=TokenAuth(TOKENS)))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            look = _reads(c, leaf)[read]
            before = await look()
            assert request in before and (read == "api" or 'value="cancel"' in before)
            clock.advance(60)
            shown = await look()
        if read == "api":
            assert json.loads(shown)["pending"] == []
        else:
            assert f'data-request-id="{request}"' not in shown and 'value="cancel"' not in shown
            assert 'placeholder="Reason' not in shown
        stored = await rt.store.get_request(request)
        assert stored is not None and stored.status == "withdrawn"
        ended = (await rt.state(leaf)).turn
        assert ended is not None and ended.status == "cancelled"
        above = await rt.store.get_request(r.pending[0].id)
        assert above is not None and above.status != "pending"
        assert ran == []


async def _chain(store_url: str, clock: ManualClock, desk: list[so.Agent]) -> tuple[str, str, str]:
    """`front` > `support` > `billing` waiting on billing's approval, made by a process with
    every agent: the top session, billing's session and its request."""
    async with so.Runtime(desk, store=store_url, clock=clock) as rt:
        r = await rt.generate("front", prompt="refund 9", auth=ALICE)
        (top,) = r.pending
        assert top.child is not None
        [mirror] = (await rt.state(top.child.session_id)).pending_requests()
        assert mirror.child is not None
        return r.session_id, mirror.child.session_id, mirror.child.request_id


@pytest.mark.parametrize(
    ("ended", "how"), [("ttl", "answer"), ("ttl", "read"), ("cancel", "answer")]
)
async def test_a_grandchild_answered_where_the_middle_agent_is_missing_takes_no_answer(
    store_url: str, caplog: pytest.LogCaptureFixture, ended: str, how: str
) -> None:
    """`front` > `support` > `billing`, `front`'s TTL passed (or `front` cancelled by a process
    without support's agent), then billing's request answered (or its session read) in a
    process that has billing's agent only (a worker for it alone): cancelling `support` there
    fails (its agent is elsewhere) and the cascade stopped, so billing's turn stayed open and
    the answer was taken, the refund running for a tree that had ended. Now billing's
    delegated turn is cancelled there (its request withdrawn, the answer `RequestClosed`) and
    `support` is left to a process with its agent, which cancels it. A read finds it so once
    the TTL passed (the queue leaves the request out); after a cancel the request stays listed
    there (with the uncancelled `support`'s mirror of it) until the answer finds it withdrawn."""
    ran: list[str] = []
    clock = ManualClock()
    desk = _front_desk(ran, "front")
    top, leaf, request = await _chain(store_url, clock, desk)
    if ended == "ttl":
        clock.advance(60)
    else:
        async with so.Runtime([desk[0], desk[2]], store=store_url, clock=clock) as rt:
            with caplog.at_level(logging.WARNING, logger="signoff.runtime"):
                assert (await rt.cancel(top, "stop", principal=ALICE)).cancelled
            assert any("left to a process" in m for m in caplog.messages)
    async with so.Runtime([desk[2]], store=store_url, clock=clock) as rt:
        assert len(await rt.pending()) == (0 if ended == "ttl" else 2)  # with support's mirror
        answer = so.InputResponse(request_id=request, option_id="approve")
        if how == "read":  # records the end first: no request offered
            assert (await rt.state(leaf)).pending_requests() == []
        with pytest.raises(so.RequestClosed):
            await rt.respond(leaf, [answer], principal=ALICE)
        assert ran == []
        turn = (await rt.state(leaf)).turn
        assert turn is not None and turn.status == "cancelled"
        stored = await rt.store.get_request(request)
        assert stored is not None and stored.status == "withdrawn"
        assert await rt.pending() == []
        [end] = await rt.store.read_events(leaf, turn.first_seq, types=["turn.cancelled"])
        assert end.data.get("expiry") is (True if ended == "ttl" else None)  # time, no activity
    async with so.Runtime(desk, store=store_url, clock=clock) as rt:
        await rt.expire_due()  # records front's expiry, or finishes front's cancel
        mid = (await rt.state(leaf)).parent
        assert mid is not None
        for session, status in [
            (top, "failed" if ended == "ttl" else "cancelled"),
            (mid, "cancelled"),
        ]:
            turn = (await rt.state(session)).turn
            assert turn is not None and turn.status == status, session
        assert await rt.pending() == [] and ran == []
