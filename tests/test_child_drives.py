"""`_child_drives.driven`: what a subagent's drive does once its turn ended and gave its lease
back (closing its parent's mirrors, counting its spend in a parent that owes it) finds the tree
deleted meanwhile, and the drive's result stands: a worker logs no failure. Both stores. And
it goes on with the parent's turn with no cache (`cache_size=0`)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

import signoff as so
from signoff import _child_sessions
from signoff.testing import call, call_tools, scripted_agent

from ._subagents import ALICE
from .test_deletion import OPS
from .test_subagents_calls import _SlowRefund
from .test_subagents_spend import support, tokens, waiting_child


class _Tree:
    """`support` delegating to `orders`, whose refund waits for approval and then runs until
    `release` is set (`started` set as it starts)."""

    def __init__(self) -> None:
        self.started, self.release = asyncio.Event(), asyncio.Event()
        started, release = self.started, self.release

        @so.tool(approval=so.always())
        async def issue_refund(order_id: str) -> str:
            """Refund an order (slowly)."""
            started.set()
            await release.wait()
            return "refunded"

        self.agents = [
            support(),
            scripted_agent(
                "orders",
                [call_tools(call("issue_refund", order_id="3"), usage=tokens(40))],
                tools=[issue_refund],
                repeat_last=True,
            ),
        ]


def _deleted_once_settled(
    monkeypatch: pytest.MonkeyPatch, deleter: so.Runtime, parent: str, child: str
) -> list[list[str]]:
    """Delete the tree (as another process's prune would) right after the child's spend is
    settled for its parent's count, before the count is recorded in the parent: the child's
    drive had ended and given its lease back. Returns the ids deleted, once done."""
    settle = _child_sessions._settle
    deleted: list[list[str]] = []

    async def then_deleted(rt: so.Runtime, kid: str) -> Any:
        settled = await settle(rt, kid)
        if kid == child and settled is not None and not deleted:
            deleted.append(await deleter.delete_session(parent, by=OPS))
        return settled

    monkeypatch.setattr(_child_sessions, "_settle", then_deleted)
    return deleted


async def _approved_and_cancelled(
    rt: so.Runtime, tree: _Tree, parent: str, drive: asyncio.Task[Any]
) -> None:
    """The child's refund runs in `drive`; the parent is cancelled meanwhile (the count of the
    child's spend left to the drive's end), then the refund finishes."""
    await asyncio.wait_for(tree.started.wait(), 10)
    await rt.cancel(parent, principal=ALICE)
    tree.release.set()
    await asyncio.wait_for(asyncio.shield(drive), 10)


async def test_a_worker_whose_subagent_tree_is_deleted_as_its_drive_ends_logs_no_failure(
    store_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker drives a subagent's answered turn; its parent is cancelled meanwhile, so the
    drive counts the child's spend in the parent once it stops. The tree was deleted between
    that count's reads and its write: the drive raised `UnknownSession` naming the parent, and
    the worker logged "the turn failed in the worker" with a traceback and kept the lease
    (found by the retention load test). Nothing of the tree is left to count or go on with."""
    tree = _Tree()
    async with (
        so.Runtime(tree.agents, store=store_url) as rt,
        so.Runtime(tree.agents, store=store_url) as other,
    ):
        parent, child = await waiting_child(rt)
        [req] = await rt.pending(session_id=child)
        answer = so.InputResponse(request_id=req.id, option_id="approve")
        await rt.respond(child, [answer], principal=ALICE, resume=False)
        owner = f"{rt.owner}:worker"
        token = await rt.store.acquire_lease(child, owner, 30, rt.now())
        assert token is not None
        deleted = _deleted_once_settled(monkeypatch, other, parent, child)
        with caplog.at_level(logging.INFO):
            drive = asyncio.create_task(rt._work_on(child, owner, token))
            await _approved_and_cancelled(rt, tree, parent, drive)
        assert deleted == [[parent, child]]
        said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert said == [], said
        assert f"session {child}: cancelled" in caplog.text
        for sid in (parent, child):
            with pytest.raises(so.UnknownSession):
                await rt.state(sid)


async def test_an_answer_whose_subagent_tree_is_deleted_as_its_turn_ends_gets_its_result(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, the child's turn driven by the answer that approved its refund: `respond`
    raised `UnknownSession` naming the parent, a session the caller never asked about, for a
    turn that ran to its end. Its result stands."""
    tree = _Tree()
    async with (
        so.Runtime(tree.agents, store=store_url) as rt,
        so.Runtime(tree.agents, store=store_url) as other,
    ):
        parent, child = await waiting_child(rt)
        [req] = await rt.pending(session_id=child)
        answer = so.InputResponse(request_id=req.id, option_id="approve")
        deleted = _deleted_once_settled(monkeypatch, other, parent, child)
        drive = asyncio.create_task(rt.respond(child, [answer], principal=ALICE))
        await _approved_and_cancelled(rt, tree, parent, drive)
        result = drive.result()
        assert deleted == [[parent, child]]
        assert (result.session_id, result.status) == (child, "cancelled")


async def test_a_child_answered_directly_without_a_cache_goes_on_with_its_parent(
    store_url: str,
) -> None:
    """With `cache_size=0`, the child's own drive (its request answered on the child) ended
    and the parent's turn stayed `running` for ever: the drive looked for the child's parent
    only in the cache. It reads the child from the store and goes on with the parent."""
    tree = _SlowRefund()
    tree.release.set()
    async with so.Runtime([tree.parent, tree.child], store=store_url, cache_size=0) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        [mirror] = r.pending
        assert mirror.child is not None
        answer = so.InputResponse(request_id=mirror.child.request_id, option_id="approve")
        direct = asyncio.create_task(rt.respond(mirror.child.session_id, [answer], principal=ALICE))
        await tree.settled(rt, r.session_id, direct)
