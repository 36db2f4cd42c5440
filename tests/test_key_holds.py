"""A keyed message's answer to a subagent's request, given through its parent's mirror, holds
its key in the parent before it goes down (`_key_holds`): another message sent to the parent
with the key, at the same moment, is refused there, or (committed first) refuses the answer.
Held only in the subagent's session, the key was invisible to the parent's commits: both acted,
and the answer's retry was refused though it ran."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import signoff as so
from signoff import _mirrors
from signoff._key_holds import hold_key
from signoff._messages import Messages
from signoff._response import ResponsePolicy
from signoff.cli._events import _summary as cli_summary
from signoff.server._trace_summary import summary as page_summary
from signoff.testing import ExecutionLog, call, call_tools, reply, scripted_agent, store_contents

from ._response_policies import ALICE, BOB, events_of, refund_agent
from .test_docs_events import rows

OTHER = "refund ch_2 too"


def _agents(log: ExecutionLog, response: ResponsePolicy) -> list[so.Agent]:
    """A support agent delegating a refund to billing, whose approval `response` judges."""
    child = refund_agent(log, so.ApprovalSpec(request=so.always(), response=response))
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", call_id="d1", message="refund ch_1")), reply("Done.")],
        tools=[so.delegate("billing", description="Billing specialist.")],
        repeat_last=True,
    )
    return [parent, child]


async def _slow(ctx: so.ResponseContext) -> so.Allowed:
    await asyncio.sleep(0.05)  # judging takes a while: the other message lands meanwhile
    return so.Allowed()


async def _messages(rt: so.Runtime, session_id: str) -> list[str]:
    """The prompts and messages the session took, each once."""
    return [
        e.data["message"]
        for e in await events_of(rt, session_id)
        if e.type == "turn.message" or (e.type == "turn.started" and not e.data.get("dequeued"))
    ]


async def _send(rt: so.Runtime, sid: str, text: str) -> Any:
    """Bob's message with key k: its result, or the error it raised."""
    try:
        return await rt.send(sid, text, principal=BOB, idempotency_key="k")
    except so.SignoffError as exc:
        return exc


@pytest.mark.parametrize("approve_first", [True, False], ids=["approve-first", "other-first"])
async def test_an_answer_through_a_mirror_and_another_message_sent_together_act_once(
    store_url: str, approve_first: bool
) -> None:
    """Bob's keyed "approve" to the subagent's request, through the parent's mirror, and his
    other message with the same key start in the same tick (two HTTP requests arriving
    together). Both acted: the other message was queued in the parent (its commit saw no
    holder there) and the refund ran, and then the approval's retry was refused. One of them
    acts, the other is `IdempotencyKeyReused`; the one that acted replays, the other stays
    refused."""
    log = ExecutionLog()
    async with so.Runtime(_agents(log, _slow), store=store_url) as rt:
        r = await rt.generate("support", prompt="refund ch_1", auth=ALICE)
        sid = r.session_id
        texts = ["approve", OTHER] if approve_first else [OTHER, "approve"]
        results = dict(
            zip(texts, await asyncio.gather(*(_send(rt, sid, t) for t in texts)), strict=True)
        )
        refused = [t for t, got in results.items() if isinstance(got, so.IdempotencyKeyReused)]
        shown = {t: type(got).__name__ for t, got in results.items()}
        assert len(refused) == 1, shown
        (acted,) = [t for t in texts if t not in refused]
        assert log.count() == (1 if acted == "approve" else 0)
        assert await _messages(rt, sid) == ["refund ch_1"] + ([OTHER] if acted == OTHER else [])
        again = await rt.send(sid, acted, principal=BOB, idempotency_key="k")
        assert again.replayed
        with pytest.raises(so.IdempotencyKeyReused):
            await rt.send(sid, refused[0], principal=BOB, idempotency_key="k")
        assert log.count() == (1 if acted == "approve" else 0)
        assert await rt.verify_audit() == []


async def test_another_message_checked_before_the_answer_went_down_is_refused_at_its_commit(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bob's other message with the key read the parent before his keyed "approve" went down
    the mirror, and commits once the subagent's response policy judges the approval: its
    commit in the parent finds the key held there, so it reads again and is refused, storing
    nothing; the approval runs once and replays."""
    started, release, judging = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def policy(ctx: so.ResponseContext) -> so.Allowed:
        judging.set()
        await release.wait()
        return so.Allowed()

    answering = Messages._answering

    async def late(self: Messages, *args: Any) -> Any:
        if asyncio.current_task() is other_task:
            started.set()
            await judging.wait()  # the approval went down and is judged meanwhile
        return await answering(self, *args)

    monkeypatch.setattr(Messages, "_answering", late)
    log = ExecutionLog()
    async with so.Runtime(_agents(log, policy), store=store_url) as rt:
        r = await rt.generate("support", prompt="refund ch_1", auth=ALICE)
        (mirror,) = r.pending
        assert mirror.child is not None
        sid, child = r.session_id, mirror.child.session_id
        head = await rt.store.head(sid)
        assert head is not None
        other_task = asyncio.create_task(_send(rt, sid, OTHER))
        await started.wait()
        first = asyncio.create_task(rt.send(sid, "approve", principal=BOB, idempotency_key="k"))
        assert isinstance(await other_task, so.IdempotencyKeyReused)
        (held,) = [e for e in await events_of(rt, sid) if e.seq > head]
        assert (held.type, held.data["request_id"]) == ("input.repeated", mirror.id)
        assert held.data["held_idem"] is not None and held.data["by"] == BOB.model_dump()
        assert all(f"`{field}`" in rows()["input.repeated"] for field in held.data)
        said = f"{mirror.id} key held for bob's message, sent on to the subagent"
        assert cli_summary(held) == said  # `signoff events`
        assert "".join(part for part, _ in page_summary(held, {})) == said  # the dashboard
        release.set()
        done = await first
        assert (done.status, done.replayed, log.count()) == ("completed", False, 1)
        again = await rt.send(sid, "approve", principal=BOB, idempotency_key="k")
        assert (again.replayed, again.turn_id) == (True, done.turn_id)
        assert await _messages(rt, sid) == ["refund ch_1"] and log.count() == 1
        assert child != sid and await rt.verify_audit() == []


async def test_the_key_of_a_refused_answer_through_a_mirror_stays_held_for_its_message(
    store_url: str,
) -> None:
    """The parent holds the key of Bob's answer through the mirror from the moment it goes
    down: the subagent's response policy refusing it, the same message sent again is judged
    again (a refused answer went nowhere), and another message with the key stays refused."""
    judged: list[str] = []

    async def policy(ctx: so.ResponseContext) -> so.Rejected:
        judged.append(ctx.response.decision)
        return so.Rejected("not now")

    log = ExecutionLog()
    async with so.Runtime(_agents(log, policy), store=store_url) as rt:
        r = await rt.generate("support", prompt="refund ch_1", auth=ALICE)
        sid = r.session_id
        for _ in range(2):
            got = await rt.send(sid, "approve", principal=BOB, idempotency_key="k")
            assert [(o.outcome, o.applied) for o in got.outcomes] == [("rejected", False)]
        assert judged == ["approve", "approve"]
        before = await store_contents(rt.store, sid)
        with pytest.raises(so.IdempotencyKeyReused):
            await rt.send(sid, OTHER, principal=BOB, idempotency_key="k")
        assert await store_contents(rt.store, sid) == before
        held = [e for e in await events_of(rt, sid) if e.data.get("held_idem")]
        assert [e.type for e in held] == ["input.repeated"]  # held once, by the first
        # Its trace never words the hold as an answer, which was refused.
        lines = [cli_summary(held[0]), "".join(p for p, _ in page_summary(held[0], {}))]
        assert not any("answered" in line for line in lines), lines
        assert log.count() == 0 and await rt.verify_audit() == []


async def test_a_key_held_by_an_answer_whose_process_died_before_it_went_down_is_its_messages(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process holding the key of Bob's answer in the parent dies before the answer
    reaches the subagent's session: the key stays held for that message, which sent again
    goes down and is settled (the refund runs once, then replays), while another message with
    the key is refused."""

    async def dies(*args: Any) -> None:
        await hold_key(*args)
        raise _Died

    monkeypatch.setattr(_mirrors, "hold_key", dies)
    log = ExecutionLog()
    async with so.Runtime(_agents(log, _slow), store=store_url) as rt:
        r = await rt.generate("support", prompt="refund ch_1", auth=ALICE)
        sid = r.session_id
        with pytest.raises(_Died):
            await rt.send(sid, "approve", principal=BOB, idempotency_key="k")
        monkeypatch.setattr(_mirrors, "hold_key", hold_key)
        with pytest.raises(so.IdempotencyKeyReused):
            await rt.send(sid, OTHER, principal=BOB, idempotency_key="k")
        done = await rt.send(sid, "approve", principal=BOB, idempotency_key="k")
        assert (done.status, done.replayed, log.count()) == ("completed", False, 1)
        again = await rt.send(sid, "approve", principal=BOB, idempotency_key="k")
        assert (again.replayed, again.turn_id, log.count()) == (True, done.turn_id, 1)
        assert await _messages(rt, sid) == ["refund ch_1"]
        assert await rt.verify_audit() == []


class _Died(Exception):
    """The process answering stopped here."""
