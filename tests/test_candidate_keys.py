"""The key of a keyed message's answer that a response policy judges is recorded with the end of
its candidate, in the same commit: by the commit that closes its request meanwhile, or by the
answer's own end when it changed nothing. Never after it, where a process killed in between
would lose it (and the message sent again would start a new turn). Until then its candidate
holds the key aside: another message sent with it meanwhile is refused, the same one waits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import signoff as so
from signoff import _key_commits, _mirrors, _refusals
from signoff._candidates import RECOVERY_GRACE
from signoff._messages import Messages
from signoff._response import DEFAULT_RESPONSE_TIMEOUT
from signoff._state import SessionState
from signoff.testing import (
    ExecutionLog,
    ManualClock,
    call,
    call_tools,
    reply,
    scripted_agent,
    store_contents,
)

from ._response_policies import ALICE, BOB, asked, events_of, refund_agent
from ._server_api import in_process

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


async def messages(rt: so.Runtime, session_id: str) -> list[str]:
    """The prompts and messages the session took, in order, each once (a queued one when it
    was queued, not again when a turn takes it from the queue)."""
    return [
        e.data["message"]
        for e in await events_of(rt, session_id)
        if e.type == "turn.message" or (e.type == "turn.started" and not e.data.get("dequeued"))
    ]


OTHERS = [
    pytest.param(BOB, "refund ch_2 too", id="queued"),
    pytest.param(BOB, "deny", id="answer"),
    pytest.param(ALICE, "refund ch_2 too", id="steer"),
]
"""Who sends a keyed "approve" and then another message with its key: Bob's second message
waits for the end of Alice's turn, or answers the request too; Alice's steers her turn."""


@pytest.mark.parametrize(("who", "other"), OTHERS)
async def test_another_message_with_the_key_of_an_answer_being_judged_is_refused(
    store_url: str, who: so.Principal, other: str
) -> None:
    """A keyed "approve" is judged by a slow response policy, which holds its key aside on its
    candidate only: another message sent meanwhile with the same key was queued, steered or
    judged beside it, so both acted, and the approval's settlement then took the key over from
    it (its retry was `IdempotencyKeyReused` though it ran). It is `IdempotencyKeyReused` and
    stores nothing; the approval runs once and its key stays its own."""
    started, release = asyncio.Event(), asyncio.Event()
    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=_first_waits(started, release))
    async with so.Runtime([refund_agent(log, spec)], store=store_url) as rt:
        sid, req, _ = await asked(rt, ALICE)
        first = asyncio.create_task(rt.send(sid, "approve", principal=who, idempotency_key="k"))
        await started.wait()
        before = await store_contents(rt.store, sid)
        with pytest.raises(so.IdempotencyKeyReused) as caught:
            await rt.send(sid, other, principal=who, idempotency_key="k")
        assert caught.value.session_id == sid
        assert await store_contents(rt.store, sid) == before
        release.set()
        r = await first
        assert (r.status, r.replayed, log.count()) == ("completed", False, 1)
        assert [(o.outcome, o.applied) for o in r.outcomes] == [("approved", True)]
        again = await rt.send(sid, "approve", principal=who, idempotency_key="k")
        assert (again.turn_id, again.status, again.replayed) == (r.turn_id, "completed", True)
        with pytest.raises(so.IdempotencyKeyReused):
            await rt.send(sid, other, principal=who, idempotency_key="k")
        assert await messages(rt, sid) == ["refund ch_1"] and log.count() == 1
        assert await rt.verify_audit() == []


@pytest.mark.parametrize("through", ["session", "mirror"])
async def test_the_same_message_with_the_key_of_an_answer_being_judged_waits_for_its_verdict(
    store_url: str, through: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The keyed "approve" sent again while its response policy judges it (in the session, or
    in a subagent's through the parent's mirror) is the same call: it waits for that verdict
    and replays it, judging nothing again and recording nothing. A guard: the answer path
    waited for that verdict before the key was held (its double click, `InFlight`), and this
    passes there too; a runtime that cannot judge it is pinned below."""
    started, release, waiting = asyncio.Event(), asyncio.Event(), asyncio.Event()
    judged: list[str] = []
    log = ExecutionLog()

    async def policy(ctx: so.ResponseContext) -> so.Allowed:
        judged.append(ctx.response.decision)
        started.set()
        await release.wait()
        return so.Allowed()

    looked = _refusals.ended

    async def ended(*args: Any) -> bool:
        waiting.set()  # a call waits for the verdict
        return await looked(*args)

    monkeypatch.setattr(_refusals, "ended", ended)
    agent = refund_agent(log, so.ApprovalSpec(request=so.always(), response=policy))
    agents = [agent] if through == "session" else _delegating(agent)
    async with so.Runtime(agents, store=store_url) as rt:
        r = await rt.generate(agents[0].name, prompt="refund ch_1", auth=ALICE)
        sid = r.session_id
        first = asyncio.create_task(rt.send(sid, "approve", principal=BOB, idempotency_key="k"))
        await started.wait()
        second = asyncio.create_task(rt.send(sid, "approve", principal=BOB, idempotency_key="k"))
        await waiting.wait()
        release.set()
        done, again = await first, await second
        assert (done.status, done.replayed, again.replayed) == ("completed", False, True)
        assert (again.turn_id, again.status) == (done.turn_id, "completed")
        assert judged == ["approve"] and log.count() == 1
        assert await messages(rt, sid) == ["refund ch_1"]
        assert await rt.verify_audit() == []


def _without_the_tool() -> so.Agent:
    """The billing agent as a runtime deployed without its refund tool has it."""

    @so.tool
    async def lookup(charge_id: str) -> str:
        """Look a charge up."""
        return charge_id

    return scripted_agent("billing", [reply("done")], tools=[lookup])


@pytest.mark.parametrize("who", [ALICE, BOB], ids=["alice", "bob"])
async def test_the_same_message_reaching_a_runtime_without_the_tool_waits_for_its_verdict(
    store_url: str, who: so.Principal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The keyed "approve" sent again while judged reaches a runtime whose agent lacks the
    tool: it did not wait (it cannot know the policy's time), and was delivered as a new
    message: Bob's queued (the refund ran, then his "approve" started a turn of its own),
    Alice's refused (`NotAllowed`). It waits the default policy time for the verdict the
    other runtime gives, and replays it."""
    started, release, waiting = asyncio.Event(), asyncio.Event(), asyncio.Event()
    looked = _refusals.ended

    async def ended(*args: Any) -> bool:
        waiting.set()
        return await looked(*args)

    monkeypatch.setattr(_refusals, "ended", ended)
    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=_first_waits(started, release))
    async with (
        so.Runtime([refund_agent(log, spec)], store=store_url) as rt,
        so.Runtime([_without_the_tool()], store=store_url) as elsewhere,
    ):
        sid, _, _ = await asked(rt, ALICE)
        first = asyncio.create_task(rt.send(sid, "approve", principal=who, idempotency_key="k"))
        await started.wait()
        second = asyncio.create_task(
            elsewhere.send(sid, "approve", principal=who, idempotency_key="k")
        )
        await asyncio.wait(
            [second, asyncio.create_task(waiting.wait())], return_when=asyncio.FIRST_COMPLETED
        )
        release.set()
        done = await first
        (again,) = await asyncio.gather(second, return_exceptions=True)
        assert isinstance(again, so.GenerateResult), again
        assert (again.replayed, again.turn_id) == (True, done.turn_id)
        assert (done.status, log.count()) == ("completed", 1)
        assert await messages(rt, sid) == ["refund ch_1"]
        assert await rt.verify_audit() == []


@pytest.mark.parametrize("who", [ALICE, BOB], ids=["alice", "bob"])
async def test_the_same_message_reaching_a_runtime_without_the_tool_past_its_time_is_refused(
    store_url: str, who: so.Principal
) -> None:
    """Sent again past the time its judging may take, to a runtime without the tool, the keyed
    "approve" is refused as an answer from there is (`NotAllowed`, naming the request), storing
    nothing: never delivered as another message beside the answer still being judged."""
    started, release = asyncio.Event(), asyncio.Event()
    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=_first_waits(started, release))
    late = ManualClock(time.time() + DEFAULT_RESPONSE_TIMEOUT + RECOVERY_GRACE + 60)
    async with (
        so.Runtime([refund_agent(log, spec)], store=store_url) as rt,
        so.Runtime([_without_the_tool()], store=store_url, clock=late) as elsewhere,
    ):
        sid, req, _ = await asked(rt, ALICE)
        first = asyncio.create_task(rt.send(sid, "approve", principal=who, idempotency_key="k"))
        await started.wait()
        before = await store_contents(rt.store, sid)
        with pytest.raises(so.NotAllowed) as caught:
            await elsewhere.send(sid, "approve", principal=who, idempotency_key="k")
        assert caught.value.request_ids == [req.id]
        assert "has no tool 'refund_charge'" in str(caught.value)
        assert await store_contents(rt.store, sid) == before
        release.set()
        done = await first
        assert (done.status, done.replayed, log.count()) == ("completed", False, 1)
        assert await messages(rt, sid) == ["refund ch_1"]


@pytest.mark.parametrize("who", [ALICE, BOB], ids=["alice", "bob"])
async def test_the_same_message_a_runtime_without_the_tool_waited_for_is_refused_once_refused(
    store_url: str, who: so.Principal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The keyed "approve" sent again to a runtime without the tool waits for the verdict; once
    that verdict refuses it, it was delivered there as another message (Bob's queued, to start a
    turn of its own). It is refused as an answer from there (`NotAllowed`), storing nothing."""
    started, release, waiting = asyncio.Event(), asyncio.Event(), asyncio.Event()
    looked = _refusals.ended

    async def ended(*args: Any) -> bool:
        waiting.set()
        return await looked(*args)

    async def policy(ctx: so.ResponseContext) -> so.Rejected:
        started.set()
        await release.wait()
        return so.Rejected("not now")

    monkeypatch.setattr(_refusals, "ended", ended)
    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=policy)
    async with (
        so.Runtime([refund_agent(log, spec)], store=store_url) as rt,
        so.Runtime([_without_the_tool()], store=store_url) as elsewhere,
    ):
        sid, req, _ = await asked(rt, ALICE)
        first = asyncio.create_task(rt.send(sid, "approve", principal=who, idempotency_key="k"))
        await started.wait()
        second = asyncio.create_task(
            elsewhere.send(sid, "approve", principal=who, idempotency_key="k")
        )
        await waiting.wait()
        release.set()
        done = await first
        assert [o.outcome for o in done.outcomes] == ["rejected"]
        with pytest.raises(so.NotAllowed) as caught:
            await second
        assert caught.value.request_ids == [req.id]
        assert "has no tool 'refund_charge'" in str(caught.value)
        kinds = [e.type for e in await events_of(rt, sid)]
        assert kinds[kinds.index("approval.candidate") :] == [
            "approval.candidate",
            "approval.candidate",
            "turn.waiting",
        ]
        assert await messages(rt, sid) == ["refund ch_1"]
        assert log.count() == 0


def _delegating(child: so.Agent) -> list[so.Agent]:
    """A support agent that delegates the refund to `child` ("billing")."""
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", call_id="d1", message="refund ch_1")), reply("Done.")],
        tools=[so.delegate("billing", description="Billing specialist.")],
        repeat_last=True,
    )
    return [parent, child]


@pytest.mark.parametrize(
    "other", [pytest.param("refund ch_2 too", id="queued"), pytest.param("deny", id="answer")]
)
async def test_another_message_with_the_key_of_an_answer_judged_through_a_mirror_is_refused(
    store_url: str, other: str
) -> None:
    """Bob's keyed "approve" to a subagent's request, sent through its parent's mirror, is
    judged by the subagent's slow response policy: its key is held aside in the subagent's
    session only. Another message to the parent with the same key was queued there (or judged
    beside it), and the mirror's close then took the key over. It is `IdempotencyKeyReused`
    naming the parent, and neither session changes."""
    started, release = asyncio.Event(), asyncio.Event()
    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=_first_waits(started, release))
    async with so.Runtime(_delegating(refund_agent(log, spec)), store=store_url) as rt:
        r = await rt.generate("support", prompt="refund ch_1", auth=ALICE)
        (mirror,) = r.pending
        assert mirror.child is not None
        sid, child = r.session_id, mirror.child.session_id
        first = asyncio.create_task(rt.send(sid, "approve", principal=BOB, idempotency_key="k"))
        await started.wait()
        before = [await store_contents(rt.store, s) for s in (sid, child)]
        with pytest.raises(so.IdempotencyKeyReused) as caught:
            await rt.send(sid, other, principal=BOB, idempotency_key="k")
        assert caught.value.session_id == sid
        assert [await store_contents(rt.store, s) for s in (sid, child)] == before
        release.set()
        done = await first
        assert (done.status, done.replayed, log.count()) == ("completed", False, 1)
        again = await rt.send(sid, "approve", principal=BOB, idempotency_key="k")
        assert (again.turn_id, again.status, again.replayed) == (done.turn_id, "completed", True)
        with pytest.raises(so.IdempotencyKeyReused):
            await rt.send(sid, other, principal=BOB, idempotency_key="k")
        assert await messages(rt, sid) == ["refund ch_1"] and log.count() == 1
        assert await rt.verify_audit() == []


async def test_another_message_with_the_key_of_an_answer_being_judged_is_409_over_http(
    store_url: str,
) -> None:
    """Over HTTP: while Alice's keyed "approve" is judged, her other text with the same
    `Idempotency-Key` is 409 `idempotency_key_reused` (it was 200 and steered her turn,
    withdrawing the approval being judged) and stores nothing."""
    started, release = asyncio.Event(), asyncio.Event()
    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=_first_waits(started, release))
    async with so.Runtime([refund_agent(log, spec)], store=store_url) as rt, in_process(rt) as c:
        r = await c.post("/v1/sessions", json={"agent": "billing", "message": "refund ch_1"})
        sid = r.json()["session_id"]
        url, key = f"/v1/sessions/{sid}/messages", {"Idempotency-Key": "k"}
        first = asyncio.create_task(c.post(url, json={"text": "approve"}, headers=key))
        await started.wait()
        before = await store_contents(rt.store, sid)
        other = await c.post(url, json={"text": "refund ch_2 too"}, headers=key)
        assert other.status_code == 409, other.text
        assert other.json()["error"]["code"] == "idempotency_key_reused"
        assert await store_contents(rt.store, sid) == before
        release.set()
        done = (await first).json()
        assert (done["status"], done["replayed"], log.count()) == ("completed", False, 1)
        again = (await c.post(url, json={"text": "approve"}, headers=key)).json()
        assert (again["turn_id"], again["replayed"]) == (done["turn_id"], True)
        assert await messages(rt, sid) == ["refund ch_1"] and log.count() == 1


def _let_through(monkeypatch: pytest.MonkeyPatch) -> None:
    """Send as a process of an older signoff did: blind to the keys held aside by answers being
    judged, when it reads and when it commits, so another message with such a key is delivered."""

    async def blind(self: Messages, state: SessionState, idem: object) -> None:
        return None

    monkeypatch.setattr(Messages, "_judging", blind, raising=False)
    monkeypatch.setattr(_key_commits, "_judged", lambda state, key: False)


def _refunds(log: ExecutionLog, spec: so.ApprovalSpec) -> so.Agent:
    """`refund_agent`, replying "done" to every later message."""

    @log.tool(approval=spec)
    async def refund_charge(tenant_id: str, charge_id: str, amount: float) -> dict[str, float]:
        """Refund a charge."""
        return {"refunded": amount}

    return scripted_agent(
        "billing",
        [
            call_tools(call("refund_charge", tenant_id="t1", charge_id="ch_1", amount=50)),
            reply("done"),
        ],
        tools=[refund_charge],
        repeat_last=True,
    )


async def test_a_key_another_message_took_while_an_answer_was_judged_stays_with_it(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process of an older signoff queued Bob's other message with the key of his "approve"
    being judged; the approval's settlement then took the key over from it, so its retry was
    refused though it ran, and both acted. The answer is spent instead (`stale`) and its call
    refused: the key stays the message's, which ran and replays; the refund did not run."""
    started, release = asyncio.Event(), asyncio.Event()
    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=_first_waits(started, release))
    async with so.Runtime([_refunds(log, spec)], store=store_url) as rt:
        sid, req, head = await asked(rt, ALICE)
        first = asyncio.create_task(rt.send(sid, "approve", principal=BOB, idempotency_key="k"))
        await started.wait()
        with monkeypatch.context() as m:
            _let_through(m)
            other = await rt.send(sid, "refund ch_2 too", principal=BOB, idempotency_key="k")
        assert other.queued and not other.replayed
        release.set()
        with pytest.raises(so.IdempotencyKeyReused) as caught:
            await first
        assert caught.value.session_id == sid and log.count() == 0
        bob = [e.data for e in await events_of(rt, sid, head) if e.data.get("by") == BOBS]
        assert [d["outcome"] for d in bob] == ["pending", "stale"]
        assert "idempotency key was taken by another message" in bob[1]["reason"]
        before = await store_contents(rt.store, sid)
        again = await rt.send(sid, "refund ch_2 too", principal=BOB, idempotency_key="k")
        assert again.replayed and again.queued and again.turn_id == req.turn_id
        with pytest.raises(so.IdempotencyKeyReused):
            await rt.send(sid, "approve", principal=BOB, idempotency_key="k")
        assert await store_contents(rt.store, sid) == before
        yes = so.InputResponse(request_id=req.id, option_id="approve")
        await rt.respond(sid, [yes], principal=CAROL)
        assert log.count() == 1
        assert await messages(rt, sid) == ["refund ch_1", "refund ch_2 too"]
        keyed = [e.type for e in await events_of(rt, sid) if e.data.get("idem")]
        assert keyed == ["turn.message"]
        assert await rt.verify_audit() == []


async def test_a_key_another_message_took_in_the_parent_while_judged_in_its_child_stays_with_it(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through a mirror, a process of an older signoff queued Bob's other message in the parent
    with the key of his "approve" that the subagent judges. The subagent settles it (the key
    is its own there), and the mirror's close in the parent then took the key over from the
    queued message, so that message's retry was refused though it ran. The close leaves the
    key to it: that message replays, and the "approve" sent again to the parent is refused.
    (The "approve" came through an older signoff too, which held no key in the parent.)"""
    started, release = asyncio.Event(), asyncio.Event()

    async def no_hold(*args: object) -> None:
        return None

    monkeypatch.setattr(_mirrors, "hold_key", no_hold)
    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=_first_waits(started, release))
    async with so.Runtime(_delegating(refund_agent(log, spec)), store=store_url) as rt:
        r = await rt.generate("support", prompt="refund ch_1", auth=ALICE)
        sid = r.session_id
        first = asyncio.create_task(rt.send(sid, "approve", principal=BOB, idempotency_key="k"))
        await started.wait()
        with monkeypatch.context() as m:
            _let_through(m)
            other = await rt.send(sid, "refund ch_2 too", principal=BOB, idempotency_key="k")
        assert other.queued and not other.replayed
        release.set()
        done = await first
        assert (done.status, log.count()) == ("completed", 1)
        assert await messages(rt, sid) == ["refund ch_1", "refund ch_2 too"]
        keyed = [e.type for e in await events_of(rt, sid) if e.data.get("idem")]
        assert keyed == ["turn.message"]
        before = await store_contents(rt.store, sid)
        again = await rt.send(sid, "refund ch_2 too", principal=BOB, idempotency_key="k")
        assert again.replayed and again.turn_id != r.turn_id
        with pytest.raises(so.IdempotencyKeyReused):
            await rt.send(sid, "approve", principal=BOB, idempotency_key="k")
        assert await store_contents(rt.store, sid) == before
        assert await rt.verify_audit() == []


async def test_the_same_message_a_runtime_without_the_tool_waited_for_goes_on_once_closed(
    store_url: str,
) -> None:
    """Bob's keyed "approve" is judged (slowly); his second click, on a runtime without the
    tool, waits for the verdict; meanwhile Alice's "deny" closes the request, which spends his
    answer (`stale`). The second click was refused (`NotAllowed`, naming the closed request)
    while the first delivered the message anew under the key: it goes on as any message does,
    once, and the other click replays it."""
    started, release = asyncio.Event(), asyncio.Event()

    async def policy(ctx: so.ResponseContext) -> so.Allowed:
        who = ctx.response.principal
        if who is not None and who.principal_id == "bob":
            started.set()
            await release.wait()
        return so.Allowed()

    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=policy)
    async with (
        so.Runtime([refund_agent(log, spec)], store=store_url) as rt,
        so.Runtime([_without_the_tool()], store=store_url) as elsewhere,
    ):
        sid, _, _ = await asked(rt, ALICE)
        first = asyncio.create_task(rt.send(sid, "approve", principal=BOB, idempotency_key="k"))
        await asyncio.wait_for(started.wait(), 10)
        second = asyncio.create_task(
            elsewhere.send(sid, "approve", principal=BOB, idempotency_key="k")
        )
        await asyncio.sleep(0.3)  # the second click waits for the verdict
        denied = await rt.send(sid, "deny", principal=ALICE)
        assert denied.status == "completed"
        release.set()
        results = await asyncio.wait_for(asyncio.gather(first, second), 20)
        assert sorted(r.replayed for r in results) == [False, True]
        assert (await messages(rt, sid)).count("approve") == 1
        assert log.count() == 0
