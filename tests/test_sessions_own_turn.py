"""A runtime that drives its turns itself (`inline`, the default) runs the turn an answer or a
message made runnable in the call that made it, even with workers claiming beside it (`signoff
serve`'s in-process workers, or another server's): the commit that made the turn runnable left
no gap before the call's drive had the session's lease, in which a worker's claim took the turn
and the call waited `lease_wait` to answer `running`, with no text.

Each test holds the call between that commit and its drive until a worker's claim asked for
sessions after it has answered: the claim the old code lost the turn to."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from typing import Any

import pytest

import signoff as so

from ._workers import ORDER, working

CALLER: ContextVar[bool] = ContextVar("caller", default=False)
"""Set in the test's call, so what runs in its drive (not in a worker's) can tell."""


def agent_of(ran: list[str], *, approval: Any = None) -> so.Agent:
    """A refund call (needing approval by default), then "Done." for every later model call; the
    tool and each model call log which drive ran them: `call` (the test's) or `worker`."""

    def where() -> str:
        return "call" if CALLER.get() else "worker"

    @so.tool(approval=approval or so.always())
    async def issue_refund(ctx: so.ToolContext, order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        ran.append(f"tool in {where()}")
        return {"refunded": amount}

    async def model(messages: list[so.Message]) -> so.ModelResponse:
        if isinstance(messages[-1], so.ToolResultMessage):
            ran.append(f"model in {where()}")
            return so.ModelResponse(text="Done.")
        if sum(isinstance(m, so.UserMessage) for m in messages) > 1:  # a later turn's message
            ran.append(f"model in {where()}")
            return so.ModelResponse(text="Done again.")
        call = so.ToolCall(id="call_refund", name="issue_refund", input=dict(ORDER))
        return so.ModelResponse(tool_calls=[call])

    return so.Agent(
        name="support", model=so.models.Scripted([model], repeat_last=True), tools=[issue_refund]
    )


@contextlib.asynccontextmanager
async def claimers(rt: so.Runtime, store_url: str, whose: str) -> AsyncIterator[so.Runtime]:
    """The runtime whose workers claim beside `rt`'s calls: `rt` itself (`own`), or a second
    runtime on the same store (`other`, another server)."""
    if whose == "own":
        yield rt
        return
    async with so.Runtime(list(rt.agents.values()), store=store_url) as other:
        yield other


def gap_at(
    monkeypatch: pytest.MonkeyPatch,
    rt: so.Runtime,
    name: str,
    claimer: so.Runtime,
    *,
    after: bool,
) -> list[list[tuple[str, int]]]:
    """Hold each call of `rt`'s method `name` (the step that commits what made the turn
    runnable, the gap `after` it, or the step past that commit, the gap before it) until a
    claim `claimer`'s worker asked for in the gap has answered; returns what those claims
    took."""
    taken: list[list[tuple[str, int]]] = []
    armed = [False]
    answered = asyncio.Event()
    claim = claimer.store.claim

    async def claiming(*args: Any, **kwargs: Any) -> list[tuple[str, int]]:
        asked_in_gap = armed[0]
        got = await claim(*args, **kwargs)
        if asked_in_gap:
            taken.append(got)
            answered.set()
        return got

    monkeypatch.setattr(claimer.store, "claim", claiming)
    step: Callable[..., Awaitable[Any]] = getattr(rt, name)

    async def gap() -> None:
        answered.clear()
        armed[0] = True
        await asyncio.wait_for(answered.wait(), 10)
        armed[0] = False

    async def held(*args: Any, **kwargs: Any) -> Any:
        if not after:  # the step drives the turn: the gap is before it
            await gap()
            return await step(*args, **kwargs)
        got = await step(*args, **kwargs)
        await gap()
        return got

    monkeypatch.setattr(rt, name, held)
    return taken


async def answer(rt: so.Runtime, how: str, session_id: str, request_id: str) -> so.GenerateResult:
    """Approve `request_id` as `POST .../approvals` (`generate(approvals=)`) or `/responses`
    (`respond`) do, in the test's call (`CALLER`)."""
    CALLER.set(True)
    if how == "approvals":
        decision = so.Decision(id=request_id, approved=True)
        return await rt.generate(session_id=session_id, approvals=[decision])
    response = so.InputResponse(request_id=request_id, option_id="approve")
    return await rt.respond(session_id, [response])


@pytest.mark.parametrize("whose", ["own", "other"])
@pytest.mark.parametrize("how", ["approvals", "respond"])
async def test_an_approval_runs_its_turn_in_the_call_that_gave_it(
    store_url: str, whose: str, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The approval's settlement makes the turn runnable; the worker's claim that follows finds
    it leased to the call's drive, which runs the call once and returns the completed turn."""
    ran: list[str] = []
    async with (
        so.Runtime([agent_of(ran)], store=store_url, lease_wait=0.5) as rt,
        claimers(rt, store_url, whose) as claimer,
    ):
        waiting = await rt.generate("support", "Refund order 1042.")
        assert waiting.status == "waiting"
        async with working(claimer):  # idle: nothing to claim until the approval
            taken = gap_at(monkeypatch, rt, "_go_on", claimer, after=False)
            result = await asyncio.create_task(
                answer(rt, how, waiting.session_id, waiting.pending[0].id)
            )
        assert (result.status, result.text) == ("completed", "Done.")
        assert ran == ["tool in call", "model in call"]
        assert taken and all(got == [] for got in taken), taken  # claims made in the gap


@pytest.mark.parametrize("whose", ["own", "other"])
async def test_a_message_runs_its_turn_in_the_call_that_sent_it(
    store_url: str, whose: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message to a session whose turn is over starts the next turn; the worker's claim that
    follows finds it leased to the call's drive, which runs it and returns it completed."""
    ran: list[str] = []
    async with (
        so.Runtime([agent_of(ran, approval=so.never())], store=store_url, lease_wait=0.5) as rt,
        claimers(rt, store_url, whose) as claimer,
    ):
        first = await rt.generate("support", "Refund order 1042.")
        assert first.status == "completed"
        ran.clear()
        async with working(claimer):

            async def send() -> so.GenerateResult:
                CALLER.set(True)
                return await rt.generate(session_id=first.session_id, prompt="Thanks!")

            taken = gap_at(monkeypatch, rt, "_start_turn", claimer, after=True)
            result = await asyncio.create_task(send())
        assert (result.status, result.text) == ("completed", "Done again.")
        assert ran == ["model in call"]
        assert taken and all(got == [] for got in taken), taken  # claims made in the gap


async def test_a_vote_that_leaves_the_turn_waiting_leaves_no_lease_held(store_url: str) -> None:
    """The first of two approvals a request needs is counted and the turn waits on: the call
    holds no lease on the session once it returns, so the next answer's drive need not wait."""
    CALLER.set(True)
    ran: list[str] = []
    agent = agent_of(ran, approval=so.always(approvers=2))
    async with so.Runtime([agent], store=store_url, lease_wait=0.5) as rt:
        waiting = await rt.generate("support", "Refund order 1042.")
        rid = waiting.pending[0].id
        alice = so.Principal(authenticator="test", principal_id="alice")
        bob = so.Principal(authenticator="test", principal_id="bob")
        first = await rt.respond(
            waiting.session_id,
            [so.InputResponse(request_id=rid, option_id="approve")],
            principal=alice,
        )
        assert first.status == "waiting"
        assert not await rt.store.lease_held(waiting.session_id, rt.now())  # type: ignore[attr-defined]
        assert not rt._holders and not rt._driving
        done = await rt.respond(
            waiting.session_id,
            [so.InputResponse(request_id=rid, option_id="approve")],
            principal=bob,
        )
        assert (done.status, done.text) == ("completed", "Done.")
        assert ran == ["tool in call", "model in call"]
