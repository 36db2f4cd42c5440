"""Keys an older signoff scoped a principal with an issuer of "" by (as one with none) and a vote
through a subagent's mirror: whose such a key is where the parent's record names no one (as the
subagent's session records the vote), and the sessions down a mirror searched for it in that
scope too, for the principal their record names (`_key_forms`). Older records and scopes are made
as `tests/test_idempotency_records.py` makes them: the scope patched in, the parent's commit of a
vote's key skipped or naming no one."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import signoff as so
from signoff import _idempotency, _mirror_keys, _mirrors
from signoff._messages import Messages
from signoff.testing import ExecutionLog, call, call_tools, reply, scripted_agent, store_contents

from ._mirror_vote_crash import agents
from ._response_policies import refund_agent
from ._subagents import Counted
from .test_idempotency_records import _scoped_before

ALICE = so.Principal(authenticator="okta", principal_id="alice")
DANA = so.Principal(authenticator="okta", issuer="", principal_id="dana")
DANA_NONE = so.Principal(authenticator="okta", principal_id="dana")  # another person (`same_as`)


def _delegating(ran: list[str], distinct: bool = True) -> list[so.Agent]:
    """A support agent delegating refund 1042 to billing, whose refund two approve."""
    return agents(ran, Counted("Done."), distinct=distinct)


def _parent_keeps(m: pytest.MonkeyPatch, how: str) -> None:
    """The parent's commits of a vote's key as `how` says: `named` (as they are made now), else
    as an older signoff made them, which held no key before the vote went down (`hold_key`)
    and, once it was counted, recorded it naming no sender (`nameless`) or not at all
    (`skipped`, as a signoff older still, or a process that died first: only the subagent's
    session records the key)."""
    if how == "named":
        return
    keep = _mirror_keys.keep_vote_key

    async def nothing(*args: Any) -> None:
        return None

    async def nameless(rt: Any, parent: str, mirror: Any, mark: Any, principal: Any) -> None:
        await keep(rt, parent, mirror, mark, None)

    m.setattr(_mirrors, "hold_key", nothing)
    m.setattr(_mirrors, "keep_vote_key", nameless if how == "nameless" else nothing)


@pytest.mark.parametrize("recorded", ["named", "nameless", "skipped"])
async def test_another_persons_vote_keyed_in_the_scope_of_old_is_not_a_later_call_of_ones(
    store_url: str, monkeypatch: pytest.MonkeyPatch, recorded: str
) -> None:
    """Dana with no issuer votes through the subagent's mirror with key x (its scope is the
    older scope of Dana with an issuer of "", another person), and the parent records the key
    on a `turn.waiting` (naming her, or, as an older signoff did, no one; or the mirror's close
    keeps it, `kept`). Once Alice's vote made the quorum, the other Dana's message with key x
    was refused as reused: it is her own call, a new turn (the subagent's session names who
    voted), and a repeat of it replays."""
    ran: list[str] = []
    async with so.Runtime(_delegating(ran), store=store_url) as rt:
        first = await rt.generate("support", prompt="refund 1042", auth=ALICE)
        sid = first.session_id
        with monkeypatch.context() as m:
            _parent_keeps(m, recorded)
            voted = await rt.send(sid, "approve", principal=DANA_NONE, idempotency_key="x")
        assert voted.status == "waiting"
        keyed = [e async for e in rt.events(sid, follow=False) if e.data.get("idem")]
        done = await rt.send(sid, "approve", principal=ALICE)
        assert (done.status, ran) == ("completed", ["1042"])
        kept = [e.type async for e in rt.events(sid, follow=False) if e.data.get("kept")]
        hers = await rt.generate(session_id=sid, prompt="hello", auth=DANA, idempotency_key="x")
        assert not hers.replayed and hers.turn_id != first.turn_id
        assert hers.status == "completed"
        before = await store_contents(rt.store, sid)
        again = await rt.send(sid, "hello", principal=DANA, idempotency_key="x")
        assert again.replayed and again.turn_id == hers.turn_id
        theirs = await rt.send(sid, "approve", principal=DANA_NONE, idempotency_key="x")
        assert theirs.replayed and theirs.turn_id == first.turn_id
        assert await store_contents(rt.store, sid) == before and ran == ["1042"]
        named = None if recorded == "nameless" else DANA_NONE.model_dump()
        assert [(e.type, e.data.get("by")) for e in keyed] == (
            [] if recorded == "skipped" else [("turn.waiting", named)]
        )
        assert kept == (["input.resolved"] if recorded == "skipped" else [])


async def test_another_persons_vote_keyed_alike_only_below_leaves_ones_own_vote_counted(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dana with no issuer votes with key x through the mirror and only the subagent's session
    records it: the other Dana's "approve" with key x is her own vote, which makes the quorum
    of two votes (her older scope found below is taken only where that session names her)."""
    ran: list[str] = []
    async with so.Runtime(_delegating(ran, distinct=False), store=store_url) as rt:
        first = await rt.generate("support", prompt="refund 1042", auth=ALICE)
        sid = first.session_id
        with monkeypatch.context() as m:
            _parent_keeps(m, "skipped")
            voted = await rt.send(sid, "approve", principal=DANA_NONE, idempotency_key="x")
        assert voted.status == "waiting" and ran == []
        hers = await rt.send(sid, "approve", principal=DANA, idempotency_key="x")
        assert (hers.replayed, hers.turn_id, hers.status) == (False, first.turn_id, "completed")
        assert ran == ["1042"]


@pytest.mark.parametrize("recorded", ["skipped", "nameless", "kept"])
async def test_a_vote_through_a_mirror_keyed_before_the_scope_changed_is_not_counted_again(
    store_url: str, monkeypatch: pytest.MonkeyPatch, recorded: str
) -> None:
    """Dana (an issuer of "") approves through the subagent's mirror with key v on an older
    signoff, which scoped her key as one with no issuer: the parent records it naming no one,
    or only the subagent's session records it (`skipped`; `kept` by the close of the mirror
    once Alice's vote made the quorum). Her call repeated after the upgrade found no key: it
    was a second vote (two approvers, not distinct: the refund ran), or refused as reused. It
    is a repeat."""
    ran: list[str] = []
    async with so.Runtime(_delegating(ran, distinct=False), store=store_url) as rt:
        first = await rt.generate("support", prompt="refund 1042", auth=ALICE)
        sid = first.session_id
        with monkeypatch.context() as m:
            m.setattr(_idempotency, "caller_parts", _scoped_before)
            _parent_keeps(m, "skipped" if recorded == "kept" else recorded)
            voted = await rt.send(sid, "approve", principal=DANA, idempotency_key="v")
        assert voted.status == "waiting" and ran == []
        if recorded == "kept":
            done = await rt.send(sid, "approve", principal=ALICE)
            assert (done.status, ran) == ("completed", ["1042"])
            kept = [e async for e in rt.events(sid, follow=False) if e.data.get("kept")]
            assert [e.type for e in kept] == ["input.resolved"]
        head = (await rt.state(sid)).seq
        again = await rt.send(sid, "approve", principal=DANA, idempotency_key="v")
        assert again.replayed and again.turn_id == first.turn_id
        assert ran == (["1042"] if recorded == "kept" else [])
        # Found in the subagent's session alone, the key is recorded here now, naming her.
        kept_here = [e async for e in rt.events(sid, after=head, follow=False)]
        assert [(e.type, e.data["by"]) for e in kept_here] == (
            [("turn.waiting", DANA.model_dump())] if recorded == "skipped" else []
        )
        if recorded != "kept":
            assert again.status == "waiting"
            before = await store_contents(rt.store, sid)
            assert (await rt.send(sid, "approve", principal=DANA, idempotency_key="v")).replayed
            assert await store_contents(rt.store, sid) == before and ran == []


async def test_an_answer_keyed_before_the_scope_changed_judged_through_a_mirror_is_waited_for(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dana's (an issuer of "") keyed "approve" through the parent's mirror, sent on an older
    signoff that scoped her key as one with no issuer (and held none in the parent), is judged
    by the subagent's slow response policy: only the subagent's session holds the key, aside.
    Her call repeated on this signoff meanwhile was another answer, judged beside it: it waits
    for the verdict and replays. Another message with that key is refused as reused."""
    started, release = asyncio.Event(), asyncio.Event()
    judged: list[str] = []

    async def slow_first(ctx: so.ResponseContext) -> so.Allowed:
        judged.append(ctx.response.decision)
        if len(judged) == 1:
            started.set()
            await release.wait()
        return so.Allowed()

    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=slow_first)
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", call_id="d1", message="refund ch_1")), reply("Done.")],
        tools=[so.delegate("billing", description="Billing specialist.")],
        repeat_last=True,
    )
    async with so.Runtime([parent, refund_agent(log, spec)], store=store_url) as rt:
        r = await rt.generate("support", prompt="refund ch_1", auth=ALICE)
        sid = r.session_id
        with monkeypatch.context() as m:
            m.setattr(_idempotency, "caller_parts", _scoped_before)
            _parent_keeps(m, "skipped")
            first = asyncio.create_task(
                rt.send(sid, "approve", principal=DANA, idempotency_key="k")
            )
            await started.wait()
        try:
            await _repeated_while_judged(rt, sid, first, release, monkeypatch)
        finally:
            release.set()
            await asyncio.wait({first})
        assert judged == ["approve"] and log.count() == 1


async def _repeated_while_judged(
    rt: so.Runtime,
    sid: str,
    first: asyncio.Task[so.GenerateResult],
    release: asyncio.Event,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While `first`, Dana's keyed answer, is judged: her other message with its key is refused;
    her answer repeated waits for the verdict (`_verdict`) and replays `first`'s turn."""
    with pytest.raises(so.IdempotencyKeyReused):
        await rt.send(sid, "refund ch_2 too", principal=DANA, idempotency_key="k")
    waits = asyncio.Event()
    verdict = Messages._verdict

    async def waited(self: Messages, judged: Any) -> None:
        waits.set()
        await verdict(self, judged)

    monkeypatch.setattr(Messages, "_verdict", waited)
    again = asyncio.create_task(rt.send(sid, "approve", principal=DANA, idempotency_key="k"))
    waiting = asyncio.create_task(waits.wait())
    await asyncio.wait({again, waiting}, return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    release.set()
    done, repeated = await first, await again
    assert (done.status, done.replayed) == ("completed", False)
    assert (repeated.turn_id, repeated.status, repeated.replayed) == (
        done.turn_id,
        "completed",
        True,
    )
