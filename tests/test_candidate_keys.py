"""The key of a keyed message's answer that a response policy judges is recorded with the end of
its candidate, in the same commit: by the commit that closes its request meanwhile, or by the
answer's own end when it changed nothing. Never after it, where a process killed in between
would lose it (and the message sent again would start a new turn)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

import signoff as so
from signoff.testing import ExecutionLog

from ._response_policies import ALICE, BOB, asked, events_of, refund_agent

BOBS = BOB.model_dump()
CAROL = so.Principal(
    authenticator="slack", issuer="T01", principal_id="carol", attributes={"tenant_id": "t1"}
)


def _first_waits(
    started: asyncio.Event, release: asyncio.Event
) -> Callable[[so.ResponseContext], Awaitable[so.Allowed]]:
    """A response policy allowing every answer, the first of which waits for `release`."""
    judged: list[int] = []

    async def policy(ctx: so.ResponseContext) -> so.Allowed:
        judged.append(1)
        if len(judged) == 1:
            started.set()
            await release.wait()
        return so.Allowed()

    return policy


@pytest.mark.parametrize("settled", ["approve", "cancel"])
async def test_a_keyed_answer_whose_request_another_settles_while_judged_ends_in_that_commit(
    store_url: str, settled: str
) -> None:
    """Bob's "approve" sent with idempotency key k-1 is judged by a slow response policy while
    Carol settles the request. Her commit ends his answer too: taken if she approved (its key
    kept there, so Bob's call says the request was approved already, and the message sent again
    is a repeat), refused if she denied (no key: Bob's call delivers the message anew)."""
    started, release = asyncio.Event(), asyncio.Event()
    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=_first_waits(started, release))
    async with so.Runtime([refund_agent(log, spec)], store=store_url) as rt:
        sid, req, head = await asked(rt, ALICE)
        first = asyncio.create_task(rt.send(sid, "approve", principal=BOB, idempotency_key="k-1"))
        await started.wait()
        carol = so.InputResponse(request_id=req.id, option_id=settled)
        assert (await rt.respond(sid, [carol], principal=CAROL)).status == "completed"
        release.set()
        r = await first
        events = await events_of(rt, sid, head)
        seqs = {e.seq: e for e in events}
        (resolved,) = [e for e in events if e.type == "input.resolved"]
        bob = [
            e for e in events if e.type == "approval.candidate" and e.data["by"] == BOB.model_dump()
        ]
        assert [e.data["outcome"] for e in bob] == ["pending", "stale"]
        assert bob[1].seq == resolved.seq + 1 and seqs[resolved.seq - 1].type == "approval.settled"
        assert not any(e.type == "input.repeated" for e in events)
        if settled == "approve":
            assert bob[1].data["idem"] == bob[0].data["message_idem"]
            assert [(o.outcome, o.applied) for o in r.outcomes] == [("approved", False)]
            assert (r.status, r.replayed) == ("completed", False)
            again = await rt.send(sid, "approve", principal=BOB, idempotency_key="k-1")
            assert (again.turn_id, again.status, again.replayed) == (r.turn_id, "completed", True)
            assert log.count() == 1
        else:
            assert "idem" not in bob[1].data
            assert not r.replayed and r.turn_id != req.turn_id  # delivered anew
            assert log.count() == 0


async def test_a_keyed_vote_counted_before_while_judged_keeps_its_key_with_its_end(
    store_url: str,
) -> None:
    """Under a quorum of two, Bob's "approve" sent with idempotency key k-1 is judged by a slow
    response policy while Bob votes from another client, which is counted. His message changed
    nothing: its candidate's end records its key, in the same commit, rather than an
    `input.repeated` after it; the call says the vote was counted already, and the message
    sent again is a repeat."""
    started, release = asyncio.Event(), asyncio.Event()
    log = ExecutionLog()
    policy = _first_waits(started, release)
    spec = so.ApprovalSpec(request=so.always(approvers=2), response=policy)
    web = BOB.model_copy(update={"attributes": {"tenant_id": "t1", "client": "web"}})
    async with so.Runtime([refund_agent(log, spec)], store=store_url) as rt:
        sid, req, head = await asked(rt, ALICE)
        first = asyncio.create_task(rt.send(sid, "approve", principal=BOB, idempotency_key="k-1"))
        await started.wait()
        yes = so.InputResponse(request_id=req.id, option_id="approve")
        voted = await rt.respond(sid, [yes], principal=web)
        assert [(o.outcome, o.applied) for o in voted.outcomes] == [("counted", True)]
        release.set()
        r = await first
        assert [(o.outcome, o.applied) for o in r.outcomes] == [("counted", False)]
        assert (r.status, r.replayed) == ("waiting", False)
        events = await events_of(rt, sid, head)
        keyed = [e.data for e in events if e.type == "approval.candidate" and "idem" in e.data]
        assert [(d["outcome"], d["by"]) for d in keyed] == [("stale", BOBS)]
        assert not any(e.type == "input.repeated" for e in events)
        again = await rt.send(sid, "approve", principal=BOB, idempotency_key="k-1")
        assert (again.turn_id, again.status, again.replayed) == (r.turn_id, "waiting", True)
        assert (await rt.state(sid)).requests[req.id].request.approved_by == ["bob"]
        assert log.count() == 0
