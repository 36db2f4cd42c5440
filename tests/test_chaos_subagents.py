"""The chaos test's check of delegate results: a delegate call's result is its child's delegated
turn's text, which joins what each of the turn's replies said, and nothing else passes for it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.models import ModelRequest

from ._chaos_procs import ALICE, CHILD, PARENT, make_agents
from ._chaos_subagents import check_subagents


async def _log(rt: so.Runtime, session_id: str) -> list[so.Event]:
    return [e async for e in rt.events(session_id, follow=False)]


async def _answered_twice(
    rt: so.Runtime, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, str, so.GenerateResult]:
    """A parent delegating `order 1004`; its child's question answered `no`, then a message to
    the child steering past its refund's approval, and a second one sent while the child's
    model writes the reply to the first (its call held until the second is in the log). The
    parent's and the child's ids and the first message's send."""
    model = rt.agents[CHILD].model
    writing, go = asyncio.Event(), asyncio.Event()
    complete = model.complete

    async def held(request: ModelRequest) -> Any:
        if request.response_index == 1:  # the child's reply after its calls (`finish`)
            writing.set()
            await go.wait()
        return await complete(request)

    monkeypatch.setattr(model, "complete", held)
    r = await rt.generate(PARENT, prompt="order 1004", auth=ALICE)
    [child] = [s.id for s in await rt.sessions(agent=CHILD)]
    [question] = [q for q in await rt.pending(session_id=child) if q.kind == "question"]
    no = so.InputResponse(request_id=question.id, option_id="no")
    answered = await rt.respond(child, [no], principal=ALICE)
    assert [q.kind for q in answered.pending] == ["tool-approval"], answered
    first = asyncio.create_task(rt.send(child, "note 11", principal=ALICE))
    await asyncio.wait_for(writing.wait(), 10)
    second = asyncio.create_task(rt.send(child, "note 12", principal=ALICE))
    while len([e for e in await _log(rt, child) if e.type == "turn.message"]) < 2:
        await asyncio.sleep(0.01)  # in the log; `send` waits for the drive holding the turn
    go.set()
    steered = await asyncio.wait_for(first, 10)
    await asyncio.wait_for(second, 10)
    parent = await rt.generate(session_id=r.session_id, auth=ALICE)
    assert parent.status == "completed", parent
    return r.session_id, child, steered


async def test_a_child_that_replied_to_a_message_sent_while_its_model_answered_passes(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message to the child that came while its model wrote its last reply (read only up to
    before it) gets a reply of its own in the delegated turn, and the delegate call's result is
    the turn's text, both replies joined. The check compared the result with the last reply
    alone and failed such a run (seed 2555075324 on PostgreSQL)."""
    async with so.Runtime(make_agents(str(tmp_path / "runs.jsonl")), store=store_url) as rt:
        parent, child, steered = await _answered_twice(rt, monkeypatch)
        log = await _log(rt, child)
        replies = [e for e in log if e.type == "model.completed"]
        [late] = [e.seq for e in log if e.type == "turn.message" and e.data["message"] == "note 12"]
        assert replies[1].data["read_through"] < late  # the reply to `note 11` read before it
        calls, done, noted = [e.data["text"] for e in replies]
        assert (calls, noted) == ("", "noted: note 12") and '"outcome": "ignored"' in done
        [result] = [e.data["result"] for e in await _log(rt, parent) if e.type == "tool.completed"]
        assert result == steered.text == f"{done}\n\n{noted}"
        await check_subagents(rt, await rt.sessions(limit=100), {}, 0)


class _LastReplyOnly:
    """The runtime, but the parent's log shows the delegate call's result as the child's last
    reply alone."""

    def __init__(self, rt: so.Runtime, parent: str, last: str) -> None:
        self.rt, self.parent, self.last = rt, parent, last

    async def state(self, session_id: str) -> so.SessionState:
        return await self.rt.state(session_id)

    async def events(self, session_id: str, *, follow: bool) -> AsyncIterator[so.Event]:
        async for e in self.rt.events(session_id, follow=follow):
            if session_id == self.parent and e.type == "tool.completed":
                e = dataclasses.replace(e, data={**e.data, "result": self.last})
            yield e


async def test_a_delegate_result_that_is_the_childs_last_reply_alone_is_caught(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check still fails a result that is not the child's turn's text: the last of its two
    replies alone is not it."""
    async with so.Runtime(make_agents(str(tmp_path / "runs.jsonl")), store=store_url) as rt:
        parent, child, _ = await _answered_twice(rt, monkeypatch)
        front: Any = _LastReplyOnly(rt, parent, "noted: note 12")
        with pytest.raises(AssertionError) as caught:
            await check_subagents(front, await rt.sessions(limit=100), {}, 0)
        assert caught.value.args[0][:3] == (0, child, "noted: note 12"), caught.value
