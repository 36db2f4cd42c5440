"""A message to a subagent whose parent (or a session above that) passed its TTL with its turn
unfinished, on both stores: that ended the subagent's conversation, its request withdrawn, yet a
typed "approve" sent to it (`send`, `POST /v1/sessions/{id}/messages`, the dashboard's message
box, which its page still showed) started a new turn of it, its model run again. It is refused
with `SubagentOrphaned` (409 `subagent_orphaned`), nothing recorded, whoever recorded the lapse
(or no one yet); a subagent whose tree lives, or whose parent's TTL passed idle, takes messages
as before, and so does a request of a turn of its own still open there."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Literal

import httpx
import pytest

import signoff as so
from signoff.server import TokenAuth, create_app
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent, store_contents

from ._subagents import ALICE
from .test_server_common import TOKENS, auth

Found = Literal["unrecorded", "by a read of the parent", "by a sweep"]


@so.tool(approval=so.always())
async def issue_refund(order_id: str) -> str:
    """Refund an order."""
    return "refunded"


@so.tool(approval=so.always())
async def close_ticket(ticket: str) -> str:
    """Close a ticket."""
    return "closed"


def support() -> so.Agent:
    """Asks to refund order 1042 (approval), then says "Done."; a later turn says "Again."."""
    return scripted_agent(
        "support",
        [call_tools(call("issue_refund", order_id="1042")), reply("Done."), reply("Again.")],
        tools=[issue_refund],
    )


def desk(delegates_to: str = "support", ttl: float | None = 60) -> so.Agent:
    """Delegates to `delegates_to`, then replies; a TTL of `ttl` seconds."""
    return scripted_agent(
        "desk",
        [call_tools(call(delegates_to, call_id="d1", message="Go on")), reply("Done.")],
        tools=[so.delegate(delegates_to)],
        limits=None if ttl is None else so.Limits(ttl=ttl),
    )


async def parked(rt: so.Runtime) -> tuple[str, str, str]:
    """`desk` started, waiting on its mirror of support's approval: the parent's id, the
    child's and the child's request's."""
    r = await rt.generate("desk", prompt="Handle it", auth=ALICE)
    (mirror,) = r.pending
    assert mirror.child is not None
    return r.session_id, mirror.child.session_id, mirror.child.request_id


async def turns_started(rt: so.Runtime, session_id: str) -> int:
    return [e.type async for e in rt.events(session_id, follow=False)].count("turn.started")


async def record(rt: so.Runtime, parent: str, found: Found) -> None:
    """Record the parent's passed TTL as `found` says (not at all, a read of it, a sweep)."""
    if found == "by a read of the parent":
        await rt.state(parent)  # its page opened, say
    elif found == "by a sweep":
        await rt.expire_due()


@pytest.mark.parametrize("found", ["unrecorded", "by a read of the parent", "by a sweep"])
@pytest.mark.parametrize("text", ["approve", "Is it done?"])
async def test_a_message_to_a_subagent_whose_parents_ttl_passed_is_refused(
    store_url: str, found: Found, text: str
) -> None:
    """Before: `send` answered 'Done.' from a second turn of the subagent (old code: completed,
    2 turns started), once a read had recorded the parent's lapse; unrecorded, a plain message
    steered the subagent's orphaned delegated turn (its model ran)."""
    clock = ManualClock()
    async with so.Runtime([desk(), support()], store=store_url, clock=clock) as rt:
        parent, child, request = await parked(rt)
        clock.advance(61)
        await record(rt, parent, found)
        before = await store_contents(rt.store, child)
        for policy in ("steer", "queue"):
            with pytest.raises(so.SubagentOrphaned) as refused:
                await rt.send(child, text, principal=ALICE, turn_policy=policy)
            assert refused.value.session_id == child and refused.value.parent_id == parent
            assert refused.value.lapsed == parent
            assert "takes no more messages" in str(refused.value)
        if found != "unrecorded" or text != "approve":
            assert await store_contents(rt.store, child) == before  # nothing recorded
        # An "approve" finding the request open took it as an answer, which the lapse refused
        # (the subagent's delegated turn cancelled, as any read records), then the message.
        state = await rt.state(child)
        assert state.turn is not None and state.turn.status == "cancelled"
        assert await turns_started(rt, child) == 1
        stored = await rt.store.get_request(request)
        assert stored is not None and stored.status == "withdrawn"


async def test_a_prompt_to_a_subagent_whose_parents_ttl_passed_is_refused(store_url: str) -> None:
    """`generate(session_id=..., prompt=...)` and `schedule` start a turn as a message does."""
    clock = ManualClock()
    async with so.Runtime([desk(), support()], store=store_url, clock=clock) as rt:
        parent, child, _ = await parked(rt)
        clock.advance(61)
        await rt.state(parent)
        before = await store_contents(rt.store, child)
        with pytest.raises(so.SubagentOrphaned):
            await rt.generate(session_id=child, prompt="approve", auth=ALICE)
        with pytest.raises(so.SubagentOrphaned):
            await rt.schedule("support", "approve", session_id=child)
        assert await store_contents(rt.store, child) == before
        assert await turns_started(rt, child) == 1


async def test_a_message_to_a_subagent_whose_grandparents_ttl_passed_is_refused(
    store_url: str,
) -> None:
    """`desk` (TTL 60 s) delegates to `team`, which delegates to `support`: past desk's TTL
    neither `team` nor `support` takes a message, each refusal naming desk as the lapsed one."""
    team = scripted_agent(
        "team",
        [call_tools(call("support", call_id="t1", message="Go on")), reply("Done.")],
        tools=[so.delegate("support")],
    )
    clock = ManualClock()
    async with so.Runtime([desk("team"), team, support()], store=store_url, clock=clock) as rt:
        r = await rt.generate("desk", prompt="Handle it", auth=ALICE)
        (mirror,) = r.pending
        assert mirror.child is not None
        middle = mirror.child.session_id
        (below,) = (await rt._state(middle)).pending_requests()
        assert below.child is not None
        child = below.child.session_id
        clock.advance(61)
        await rt.expire_due()
        for sid, parent in ((child, middle), (middle, r.session_id)):
            with pytest.raises(so.SubagentOrphaned) as refused:
                await rt.send(sid, "approve", principal=ALICE)
            assert (refused.value.parent_id, refused.value.lapsed) == (parent, r.session_id)
        assert await turns_started(rt, child) == 1 and await turns_started(rt, middle) == 1


async def test_a_subagent_whose_tree_lives_or_whose_parent_expired_idle_takes_messages(
    store_url: str,
) -> None:
    """The parent's delegate call ended and its turn completed: a message to the subagent
    starts a turn of its own, also once the parent's TTL passed with nothing unfinished (an
    idle session past its TTL ended nothing below it)."""
    child = scripted_agent("support", [reply("Done."), reply("Again."), reply("Once more.")])
    clock = ManualClock()
    async with so.Runtime([desk(), child], store=store_url, clock=clock) as rt:
        r = await rt.generate("desk", prompt="Handle it", auth=ALICE)
        assert (r.status, r.text) == ("completed", "Done.")
        [kid] = [s.id for s in await rt.sessions(agent="support")]
        own = await rt.send(kid, "And again?", principal=ALICE)
        assert (own.status, own.text) == ("completed", "Again.")
        clock.advance(61)
        await rt.expire_due()
        own = await rt.send(kid, "Once more?", principal=ALICE)
        assert (own.status, own.text) == ("completed", "Once more.")


async def test_a_turn_of_the_subagents_own_still_takes_typed_answers(store_url: str) -> None:
    """The subagent's delegated turn ended, a message started a turn of its own (waiting on an
    approval), then the parent's TTL passed as its turn waited on an approval of its own. That
    turn of the subagent is not its parent's to end: a typed "approve" answers its request and
    it goes on; a message answering nothing is refused."""
    child = scripted_agent(
        "support",
        [reply("Looked."), call_tools(call("issue_refund", order_id="7")), reply("Refunded.")],
        tools=[issue_refund],
    )
    parent = scripted_agent(
        "desk",
        [
            call_tools(call("support", call_id="d1", message="Look")),
            call_tools(call("close_ticket", ticket="T1")),
            reply("Done."),
        ],
        tools=[so.delegate("support"), close_ticket],
        limits=so.Limits(ttl=60),
    )
    clock = ManualClock()
    async with so.Runtime([parent, child], store=store_url, clock=clock) as rt:
        r = await rt.generate("desk", prompt="Handle it", auth=ALICE)
        assert r.status == "waiting"  # on close_ticket's approval
        [kid] = [s.id for s in await rt.sessions(agent="support")]
        own = await rt.send(kid, "Refund order 7.", principal=ALICE)
        assert own.status == "waiting"
        clock.advance(61)
        await rt.expire_due()
        assert (await rt.state(r.session_id)).status == "failed"
        before = await store_contents(rt.store, kid)
        with pytest.raises(so.SubagentOrphaned):
            await rt.send(kid, "What is it for?", principal=ALICE)
        assert await store_contents(rt.store, kid) == before
        done = await rt.send(kid, "approve", principal=ALICE)
        assert (done.status, done.text) == ("completed", "Refunded.")


async def _served(
    store_url: str, body: Callable[[so.Runtime, ManualClock, httpx.AsyncClient], Awaitable[None]]
) -> None:
    """Run `body` with a runtime (`desk` over `support`), its clock and a client of its app
    signed in as Alice."""
    clock = ManualClock()
    rt = so.Runtime([desk(), support()], store=store_url, clock=clock)
    app = create_app(rt, auth=TokenAuth(TOKENS), sweep_every=None, close_runtime=True)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t", headers=auth("alice-token")
        ) as c,
    ):
        await body(rt, clock, c)


async def _started(c: httpx.AsyncClient) -> tuple[str, str]:
    """`desk` started over HTTP, waiting on its mirror: the parent's id and the child's."""
    started = await c.post("/v1/sessions", json={"agent": "desk", "message": "Handle it"})
    assert started.status_code == 201, started.text
    (mirror,) = started.json()["pending"]
    return started.json()["session_id"], mirror["child"]["session_id"]


async def test_over_http_a_subagent_whose_parents_ttl_passed_takes_no_message(
    store_url: str,
) -> None:
    """`POST /v1/sessions/{id}/messages` (and `/generate` with a message) is 409
    `subagent_orphaned`, nothing recorded (old code: 200, 'Done.' from a new turn)."""

    async def body(rt: so.Runtime, clock: ManualClock, c: httpx.AsyncClient) -> None:
        parent, child = await _started(c)
        clock.advance(61)
        await rt.state(parent)  # the parent's page opened, say
        before = await store_contents(rt.store, child)
        sent = await c.post(f"/v1/sessions/{child}/messages", json={"text": "approve"})
        assert sent.status_code == 409, sent.text
        assert sent.json()["error"]["code"] == "subagent_orphaned"
        again = await c.post(f"/v1/sessions/{child}/generate", json={"message": "approve"})
        assert again.status_code == 409 and again.json()["error"]["code"] == "subagent_orphaned"
        assert await store_contents(rt.store, child) == before
        assert await turns_started(rt, child) == 1

    await _served(store_url, body)


async def test_the_page_of_a_subagent_whose_parents_ttl_passed_offers_no_message_box(
    store_url: str,
) -> None:
    """The subagent's dashboard page, and a live page's redrawn message box, offer no message
    box once its parent's TTL passed (old code: they did), saying which session's TTL ended
    the conversation; before that they offer it."""

    async def body(rt: so.Runtime, clock: ManualClock, c: httpx.AsyncClient) -> None:
        parent, child = await _started(c)
        page = (await c.get(f"/_signoff/sessions/{child}")).text
        assert 'id="send"' in page and 'id="send-orphaned"' not in page
        clock.advance(61)
        page = (await c.get(f"/_signoff/sessions/{child}")).text
        send = (await c.get(f"/_signoff/fragments/sessions/{child}")).json()["send"]
        for shown in (page, send):
            assert 'id="send"' not in shown and 'id="send-orphaned"' in shown
            assert f'href="/_signoff/sessions/{parent}">{parent}</a>' in shown
            assert "it takes no more messages" in shown

    await _served(store_url, body)
