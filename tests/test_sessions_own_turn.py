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
from signoff.testing import ManualClock

from ._workers import ORDER, is_, until, working

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


def _allowed(ctx: so.ResponseContext) -> so.Allowed:
    """A response policy that lets every answer settle, judged on the answer's own task."""
    return so.Allowed()


@pytest.mark.parametrize("whose", ["own", "other"])
@pytest.mark.parametrize("settled_by", ["quorum", "response_policy"])
async def test_a_settlement_on_a_task_of_its_own_runs_its_turn_in_the_call(
    store_url: str, whose: str, settled_by: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last vote of a quorum, and an answer a response policy judges, are settled on a task
    of their own (`past_cancel`, so a caller's cancel does not stop them half way): that
    task's commit makes the turn runnable, and leases it to the call's drive all the same."""
    ran: list[str] = []
    spec: Any = (
        so.always(approvers=2)
        if settled_by == "quorum"
        else so.ApprovalSpec(request=so.always(), response=_allowed)
    )
    async with (
        so.Runtime([agent_of(ran, approval=spec)], store=store_url, lease_wait=0.5) as rt,
        claimers(rt, store_url, whose) as claimer,
    ):
        waiting = await rt.generate("support", "Refund order 1042.")
        rid = waiting.pending[0].id
        if settled_by == "quorum":
            alice = so.Principal(authenticator="test", principal_id="alice")
            approve = so.InputResponse(request_id=rid, option_id="approve")
            first = await rt.respond(waiting.session_id, [approve], principal=alice)
            assert first.status == "waiting"
        async with working(claimer):

            async def last() -> so.GenerateResult:
                CALLER.set(True)
                bob = so.Principal(authenticator="test", principal_id="bob")
                approve = so.InputResponse(request_id=rid, option_id="approve")
                return await rt.respond(waiting.session_id, [approve], principal=bob)

            taken = gap_at(monkeypatch, rt, "_go_on", claimer, after=False)
            result = await asyncio.create_task(last())
        assert (result.status, result.text) == ("completed", "Done.")
        assert ran == ["tool in call", "model in call"]
        assert taken and all(got == [] for got in taken), taken  # claims made in the gap
        assert dict(rt._driving) == {} and dict(rt._holders) == {}


async def test_a_settlement_going_on_past_its_calls_cancel_leases_nothing_to_the_call(
    store_url: str,
) -> None:
    """The call is cancelled while its answer's response policy judges it: the settlement goes
    on, on its task, and makes the turn runnable once the call is over. That commit asks no
    lease for the call's drive, which never comes: the turn is the workers' at once, not held
    for the lease's TTL by no one."""
    judging, go = asyncio.Event(), asyncio.Event()

    async def slow(ctx: so.ResponseContext) -> so.Allowed:
        judging.set()
        await go.wait()
        return so.Allowed()

    ran: list[str] = []
    spec = so.ApprovalSpec(request=so.always(), response=slow, timeout=30.0)
    async with so.Runtime([agent_of(ran, approval=spec)], store=store_url, lease_ttl=30.0) as rt:
        waiting = await rt.generate("support", "Refund order 1042.")
        approve = so.InputResponse(request_id=waiting.pending[0].id, option_id="approve")
        call = asyncio.create_task(rt.respond(waiting.session_id, [approve]))
        await asyncio.wait_for(judging.wait(), 10)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        go.set()
        async with working(rt):
            await until(lambda: is_(rt, waiting.session_id, "completed"))
        assert ran == ["tool in worker", "model in worker"]
        assert dict(rt._driving) == {} and dict(rt._holders) == {}


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


async def test_a_grant_whose_acknowledgement_was_lost_is_taken_again_by_its_call(
    pg_store_url: str,
) -> None:
    """PostgreSQL lost the acknowledgement of the commit that granted the lease (found committed
    on a fresh connection), and its re-reading failed too: the granted lease was left held by
    no drive for its TTL, the call answered `running` after `lease_wait`, and so did the next.
    The call takes its own lease again and runs the turn."""
    agent = so.Agent(
        name="support", model=so.models.Scripted([so.ModelResponse(text="Done.")], repeat_last=True)
    )
    async with so.Runtime([agent], store=pg_store_url, lease_wait=1.0, lease_ttl=30.0) as rt:
        first = await rt.generate("support", "hello")
        store: Any = rt.store
        write, acquire = store._write, store.acquire_lease
        lost, failed = [False], [False]

        async def lost_ack(body: Any, what: str, **kw: Any) -> Any:
            cur = await write(body, what, **kw)
            if not lost[0] and what.startswith("commit to session"):
                lost[0] = True
                return None  # as when `committed` found it on a fresh connection
            return cur

        async def acquire_once_failing(*args: Any) -> int | None:
            if not failed[0]:
                failed[0] = True
                raise so.StoreError("connection lost (the blip not over)")
            token: int | None = await acquire(*args)
            return token

        store._write, store.acquire_lease = lost_ack, acquire_once_failing
        try:
            again = await rt.generate("support", "again", session_id=first.session_id)
        finally:
            store._write, store.acquire_lease = write, acquire
        assert lost[0] and failed[0]
        assert (again.status, again.text) == ("completed", "Done.")
        assert dict(rt._driving) == {} and dict(rt._holders) == {}
        later = await rt.generate("support", "more", session_id=first.session_id)
        assert (later.status, later.text) == ("completed", "Done.")


@pytest.mark.parametrize("whose", ["own", "other"])
async def test_a_message_whose_send_recorded_a_deadline_runs_that_turn_in_the_call(
    store_url: str, whose: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The send records the approval's passed deadline, which makes the turn runnable, and
    queues its message behind it: that commit leased the turn to the call's drive, so the
    worker's claim that follows takes nothing, and the call runs the turn, then the message's.
    The workers keep a clock of their own, before the deadline: their sweeps record nothing."""
    ran: list[str] = []
    clock = ManualClock()
    agent = agent_of(ran, approval=so.ApprovalSpec(so.always(), expires_in=60))
    async with (
        so.Runtime([agent], store=store_url, clock=clock, lease_wait=0.5) as rt,
        contextlib.AsyncExitStack() as stack,
    ):
        claimer = rt
        if whose == "other":
            other = so.Runtime([agent], store=store_url, clock=ManualClock(clock.now))
            claimer = await stack.enter_async_context(other)
        waiting = await rt.generate("support", "Refund order 1042.")
        assert waiting.status == "waiting"
        swept = asyncio.Event()
        expire_due = claimer.expire_due

        async def sweep(*args: Any, **kwargs: Any) -> int:
            swept.set()
            return await expire_due(*args, **kwargs)

        monkeypatch.setattr(claimer, "expire_due", sweep)
        async with working(claimer, sweep_every=3600):
            await asyncio.wait_for(swept.wait(), 10)  # the next sweep is an hour away
            clock.advance(61)

            async def send() -> so.GenerateResult:
                CALLER.set(True)
                return await rt.send(waiting.session_id, "And my parcel?", turn_policy="queue")

            taken = gap_at(monkeypatch, rt, "_drive_after", claimer, after=False)
            result = await asyncio.create_task(send())
        assert (result.status, result.text, result.queued) == ("completed", "Done again.", False)
        assert ran == ["model in call", "model in call"]  # the call denied on timeout, not run
        assert taken and all(got == [] for got in taken), taken  # claims made in the gap
        assert dict(rt._driving) == {} and dict(rt._holders) == {}
