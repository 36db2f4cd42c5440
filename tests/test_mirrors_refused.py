"""An answer refused through a parent's mirror whose subagent's request closed unseen (answered
on the subagent with `resume=False`): from someone who may not answer it (`NotAllowed`), or whom
the subagent's response policy refuses, it closes no mirror, runs no tool and drives neither
turn, in Python, over HTTP and through a channel. (An answer refused as closed does close the
mirror: tests/test_subagents_mirrors.py.)"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

import signoff as so
from signoff import _child_closes
from signoff.channels import Channel
from signoff.server import TokenAuth, create_app
from signoff.testing import StoreContents, call, call_tools, reply, scripted_agent, store_contents

from ._delegation import refund_desk
from .test_server_common import ALICE, BOB, TOKENS, auth


def _approve(request_id: str) -> list[so.InputResponse]:
    return [so.InputResponse(request_id=request_id, option_id="approve")]


async def _left_open(rt: so.Runtime) -> tuple[str, so.InputRequest]:
    """`support`'s session waiting on its mirror of `billing`'s refund approval, which Alice
    approved on `billing`'s session with `resume=False`: the mirror is left open."""
    r = await rt.generate("support", prompt="refund 9", auth=ALICE)
    (mirror,) = r.pending
    assert mirror.child is not None
    child = mirror.child
    done = await rt.respond(
        child.session_id, _approve(child.request_id), principal=ALICE, resume=False
    )
    assert [o.applied for o in done.outcomes] == [True]
    stored = await rt.store.get_request(mirror.id)
    assert stored is not None and stored.status == "pending"
    return r.session_id, mirror


async def _contents(rt: so.Runtime, parent: str, mirror: so.InputRequest) -> list[StoreContents]:
    assert mirror.child is not None
    return [await store_contents(rt.store, sid) for sid in (parent, mirror.child.session_id)]


async def _goes_on_for_alice(rt: so.Runtime, parent: str, mirror: so.InputRequest) -> None:
    """Alice, who approved the subagent's request, answering the mirror the same way closes it
    and lets both turns go on."""
    done = await rt.respond(parent, _approve(mirror.id), principal=ALICE)
    assert done.status == "completed" and done.pending == []


@pytest.mark.parametrize("surface", ["respond", "approvals"])
async def test_an_answer_not_allowed_through_a_mirror_left_open_changes_nothing(
    store_url: str, surface: str
) -> None:
    """Bob, who may not answer Alice's request, answers the mirror: `NotAllowed`, and both
    sessions are as they were. The refusal used to close the mirror as the subagent's request
    had closed, run the approved refund and drive the parent's turn to its end, in his
    refused call."""
    ran: list[str] = []
    async with so.Runtime(refund_desk(so.always(), ran), store=store_url) as rt:
        parent, mirror = await _left_open(rt)
        before = await _contents(rt, parent, mirror)
        with pytest.raises(so.NotAllowed) as refused:
            if surface == "respond":
                await rt.respond(parent, _approve(mirror.id), principal=BOB)
            else:
                decision = so.Decision(id=mirror.id, approved=True)
                await rt.generate(session_id=parent, approvals=[decision], auth=BOB)
        assert refused.value.request_ids == [mirror.id]
        assert await _contents(rt, parent, mirror) == before
        assert ran == [] and (await rt.state(parent)).status == "waiting"
        await _goes_on_for_alice(rt, parent, mirror)
        assert ran == ["9"]


def _not_bob(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
    bob = ctx.response.principal is not None and ctx.response.principal.principal_id == "bob"
    return so.Rejected("not bob") if bob else so.Allowed()


@pytest.mark.parametrize("surface", ["respond", "send", "approvals", "channel"])
async def test_an_answer_a_response_policy_refuses_through_a_mirror_left_open_changes_nothing(
    store_url: str, surface: str
) -> None:
    """The subagent's response policy refuses Bob's answer to the mirror: the outcome is
    `rejected`, and both sessions are as they were. It used to close the mirror as settled in
    the refused call (or the drive after it did, closing the mirrors the subagents' requests
    left open), running the refund and the parent's turn to its end."""
    ran: list[str] = []
    approval = so.ApprovalSpec(request=so.always(), response=_not_bob)
    async with so.Runtime(refund_desk(approval, ran), store=store_url) as rt:
        parent, mirror = await _left_open(rt)
        before = await _contents(rt, parent, mirror)
        outcomes: list[so.Outcome]
        if surface == "respond":
            result = await rt.respond(parent, _approve(mirror.id), principal=BOB)
            assert result.status == "waiting"
            outcomes = result.outcomes
        elif surface == "send":
            result = await rt.send(parent, "approve", principal=BOB)
            assert result.status == "waiting"
            outcomes = result.outcomes
        elif surface == "approvals":
            decision = so.Decision(id=mirror.id, approved=True)
            result = await rt.generate(session_id=parent, approvals=[decision], auth=BOB)
            assert result.status == "waiting"
            outcomes = result.outcomes
        else:
            channel: Any = Channel()
            channel._runtime = rt  # as a hub attaches it
            outcomes = [await channel.submit(mirror, _approve(mirror.id)[0], BOB)]
        assert [(o.request_id, o.outcome, o.applied) for o in outcomes] == [
            (mirror.id, "rejected", False)
        ]
        assert await _contents(rt, parent, mirror) == before
        assert ran == [] and (await rt.state(parent)).status == "waiting"
        await _goes_on_for_alice(rt, parent, mirror)
        assert ran == ["9"]


async def test_an_answer_not_allowed_through_a_mirror_left_open_changes_nothing_over_http(
    store_url: str,
) -> None:
    """Bob may see Alice's session (one tenant) but not answer her request: his answer to
    the mirror is 403 `not_allowed`, and both sessions are as they were (it used to run the
    refund and both turns to their end)."""
    ran: list[str] = []
    async with so.Runtime(refund_desk(so.always(), ran), store=store_url) as rt:
        parent, mirror = await _left_open(rt)
        before = await _contents(rt, parent, mirror)
        transport = httpx.ASGITransport(app=create_app(rt, auth=TokenAuth(TOKENS)))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            body = {"inputResponses": [{"requestId": mirror.id, "optionId": "approve"}]}
            sent = await http.post(
                f"/v1/sessions/{parent}/responses", json=body, headers=auth("bob-token")
            )
        assert sent.status_code == 403 and sent.json()["error"]["code"] == "not_allowed"
        assert await _contents(rt, parent, mirror) == before
        assert ran == [] and (await rt.state(parent)).status == "waiting"


@pytest.mark.parametrize("surface", ["respond", "channel"])
async def test_an_answer_refused_on_the_subagents_own_request_closes_no_mirror_of_its_parent(
    store_url: str, surface: str
) -> None:
    """Bob's approval given on the subagent's second request itself (as a channel shows it),
    which its response policy refuses, while the parent's mirror of the first is left open
    (Alice approved it there, and her process died before the mirror closed): the refused call
    drove the subagent, whose drive closed that mirror and went on in the parent."""
    ran: list[str] = []

    @so.tool(approval=so.ApprovalSpec(request=so.always(), response=_not_bob))
    async def refund(order_id: str) -> str:
        """Refund an order."""
        ran.append(order_id)
        return "ok"

    two = call_tools(call("refund", order_id="9"), call("refund", order_id="10"))
    child = scripted_agent("billing", [two, reply("refunded")], tools=[refund])
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", message="refund 9 and 10")), reply("done")],
        tools=[so.delegate("billing")],
    )
    async with so.Runtime([parent, child], store=store_url) as rt:
        r = await rt.generate("support", prompt="refund", auth=ALICE)
        first, second = r.pending
        assert first.child is not None and second.child is not None
        kid = first.child.session_id
        dying = _child_closes.delegating.set(frozenset({kid}))  # no mirror closes meanwhile
        try:
            await rt.respond(kid, _approve(first.child.request_id), principal=ALICE)
        finally:
            _child_closes.delegating.reset(dying)
        assert ran == ["9"]
        before = await _contents(rt, r.session_id, first)
        asked = await rt.store.get_request(second.child.request_id)
        assert asked is not None
        if surface == "respond":
            got = await rt.respond(kid, _approve(asked.request.id), principal=BOB)
            outcomes = got.outcomes
        else:
            channel: Any = Channel()
            channel._runtime = rt  # as a hub attaches it
            outcomes = [await channel.submit(asked.request, _approve(asked.request.id)[0], BOB)]
        assert [(o.outcome, o.applied) for o in outcomes] == [("rejected", False)]
        after = await _contents(rt, r.session_id, first)
        assert after[0] == before[0]  # the parent's mirror still open, its turn as it was
        stored = await rt.store.get_request(first.id)
        assert stored is not None and stored.status == "pending"
        assert ran == ["9"]


@pytest.mark.parametrize("surface", ["respond", "send", "channel"])
async def test_an_answer_refused_through_a_middle_sessions_mirror_changes_nothing(
    store_url: str, surface: str
) -> None:
    """`top` delegates to `mid`, which delegates to `billing`; Alice approved `billing`'s request
    on its own session (`resume=False`), leaving `mid`'s mirror open. Bob's answer to that
    mirror, refused by `billing`'s response policy, drove `mid` (a subagent: its drive tells its
    parent), closing the mirror, running the refund and all three turns to their end."""
    ran: list[str] = []

    @so.tool(approval=so.ApprovalSpec(request=so.always(), response=_not_bob))
    async def refund(order_id: str) -> str:
        """Refund an order."""
        ran.append(order_id)
        return "ok"

    billing = scripted_agent(
        "billing", [call_tools(call("refund", order_id="9")), reply("refunded")], tools=[refund]
    )
    mid = scripted_agent(
        "mid",
        [call_tools(call("billing", message="refund 9")), reply("mid done")],
        tools=[so.delegate("billing")],
    )
    top = scripted_agent(
        "top",
        [call_tools(call("mid", message="refund 9")), reply("top done")],
        tools=[so.delegate("mid")],
    )
    async with so.Runtime([top, mid, billing], store=store_url) as rt:
        r = await rt.generate("top", prompt="refund 9", auth=ALICE)
        (above,) = r.pending
        assert above.child is not None
        middle = above.child.session_id
        (mirror,) = (await rt.state(middle)).pending_requests()
        assert mirror.child is not None
        deepest = mirror.child
        await rt.respond(
            deepest.session_id, _approve(deepest.request_id), principal=ALICE, resume=False
        )
        sessions = (r.session_id, middle, deepest.session_id)
        before = [await store_contents(rt.store, sid) for sid in sessions]
        if surface == "respond":
            outcomes = (await rt.respond(middle, _approve(mirror.id), principal=BOB)).outcomes
        elif surface == "send":
            outcomes = (await rt.send(middle, "approve", principal=BOB)).outcomes
        else:
            channel: Any = Channel()
            channel._runtime = rt  # as a hub attaches it
            outcomes = [await channel.submit(mirror, _approve(mirror.id)[0], BOB)]
        assert [(o.outcome, o.applied) for o in outcomes] == [("rejected", False)]
        assert [await store_contents(rt.store, sid) for sid in sessions] == before
        assert ran == [] and (await rt.state(r.session_id)).status == "waiting"
