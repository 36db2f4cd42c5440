"""A lease granted so slowly that it is renewed before its drive uses it, the renewal failing
(the store unreachable for a moment): the call fails, and the lease is given back, as a
worker's claim gives back one it could not confirm, so the session can be driven again at
once rather than once the lease's TTL has passed. So too a lease granted to a call stopped
before the grant's answer came back. On both stores, for a lease the drive asks for (a turn
resumed) and one the commit of a message's turn grants it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import signoff as so
from signoff.stores import Commit
from signoff.testing import ManualClock

from ._leasing import counting_renewals

TTL = 30.0


def _agent(runs: list[str]) -> so.Agent:
    @so.tool(approval=so.never())
    async def issue_refund(ctx: so.ToolContext, order_id: str) -> dict[str, Any]:
        """Refund an order."""
        runs.append(ctx.idempotency_key())
        return {"refunded": order_id}

    call = so.ModelResponse(
        tool_calls=[so.ToolCall(id="call_refund", name="issue_refund", input={"order_id": "1"})]
    )
    model = so.models.Scripted([call, so.ModelResponse(text="Done.")])
    return so.Agent(name="support", model=model, tools=[issue_refund])


def _slow_grants(rt: so.Runtime, clock: ManualClock) -> None:
    """Every grant of a lease takes half its TTL to come back (a connection waited for)."""
    store = rt.store
    acquire, create, commit = store.acquire_lease, store.create_session, store.commit

    async def slow_commit(c: Commit) -> None:
        await commit(c)
        if c.granted is not None:
            clock.advance(TTL / 2)

    async def slow_acquire(*args: Any) -> int | None:
        token = await acquire(*args)
        clock.advance(TTL / 2)
        return token

    async def slow_create(*args: Any, **kwargs: Any) -> int | None:
        token = await create(*args, **kwargs)
        clock.advance(TTL / 2)
        return token

    store.acquire_lease = slow_acquire  # type: ignore[method-assign,assignment]
    store.create_session = slow_create  # type: ignore[method-assign]
    store.commit = slow_commit  # type: ignore[method-assign,assignment]


async def _turn_to_go_on(store_url: str, clock: ManualClock, how: str) -> tuple[str, str | None]:
    """A session, and the prompt a call sends it (`message`: its commit grants the lease), or
    None for a call that resumes the turn a runtime of `inline=False` started there
    (`resume`: its drive asks for the lease)."""
    async with so.Runtime([_agent([])], store=store_url, clock=clock, inline=False) as starter:
        sid = await starter.create_session("support")
        if how == "message":
            return sid, "Refund"
        started = await starter.generate("support", "Refund", session_id=sid)
        assert started.status == "running"
        return sid, None


async def _driven_at_once(store_url: str, clock: ManualClock, runs: list[str], sid: str) -> None:
    """Another process drives the session's turn without waiting for a lease to lapse."""
    async with so.Runtime([_agent(runs)], store=store_url, clock=clock, lease_wait=0) as other:
        result = await other.generate(session_id=sid)
        assert result.status == "completed", result
    assert runs == [f"{sid}:1:call_refund"]


@pytest.mark.parametrize("how", ["message", "resume"])
async def test_an_acquired_lease_that_cannot_be_confirmed_is_given_back(
    store_url: str, how: str
) -> None:
    runs: list[str] = []
    clock = ManualClock()
    sid, prompt = await _turn_to_go_on(store_url, clock, how)
    async with so.Runtime([_agent(runs)], store=store_url, clock=clock, lease_ttl=TTL) as rt:
        _slow_grants(rt, clock)
        counting_renewals(rt.store, failing=lambda: True)
        try:
            await rt.generate("support", prompt, session_id=sid)
        except so.StoreError:
            pass
        else:
            raise AssertionError("the renewal's failure was not reported")
        assert runs == []
    await _driven_at_once(store_url, clock, runs, sid)


async def test_a_new_sessions_lease_that_cannot_be_confirmed_is_given_back(
    store_url: str,
) -> None:
    runs: list[str] = []
    clock = ManualClock()
    async with so.Runtime([_agent(runs)], store=store_url, clock=clock, lease_ttl=TTL) as rt:
        _slow_grants(rt, clock)
        counting_renewals(rt.store, failing=lambda: True)
        try:
            await rt.generate("support", "Refund")
        except so.StoreError:
            pass
        else:
            raise AssertionError("the renewal's failure was not reported")
        assert runs == []
        (summary,) = await rt.sessions()
    await _driven_at_once(store_url, clock, runs, summary.id)


@pytest.mark.parametrize("how", ["message", "resume"])
async def test_a_lease_granted_to_a_call_stopped_before_the_answer_came_is_given_back(
    store_url: str, how: str
) -> None:
    """The store grants the lease, but the call is stopped (a caller's timeout, `close`) while
    the answer is on its way (a slow network): the lease, which no drive will use, is given
    back, not left to lapse after its TTL with the turn unrunnable meanwhile."""
    runs: list[str] = []
    clock = ManualClock()
    sid, prompt = await _turn_to_go_on(store_url, clock, how)
    async with so.Runtime([_agent(runs)], store=store_url, clock=clock, lease_ttl=TTL) as rt:
        acquire, commit = rt.store.acquire_lease, rt.store.commit
        granted = asyncio.Event()

        async def slow_answer(*args: Any) -> int | None:
            token = await acquire(*args)  # granted in the store
            if token is not None and not granted.is_set():
                granted.set()
                await asyncio.sleep(60)  # its answer not read yet when the call stops
            return token

        async def slow_commit(c: Commit) -> None:
            await commit(c)  # the lease granted in the store with it
            if c.granted is not None and not granted.is_set():
                granted.set()
                await asyncio.sleep(60)

        rt.store.acquire_lease = slow_answer  # type: ignore[method-assign,assignment]
        rt.store.commit = slow_commit  # type: ignore[method-assign,assignment]
        call = asyncio.create_task(rt.generate("support", prompt, session_id=sid))
        await asyncio.wait_for(granted.wait(), 10)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert runs == []
    await _driven_at_once(store_url, clock, runs, sid)


async def test_a_lease_granted_by_a_commit_told_as_failed_is_given_back(store_url: str) -> None:
    """The commit of a message's turn went through, granting the call's drive the lease, but
    was told as failed (a PostgreSQL COMMIT whose connection was lost: the outcome unknown):
    the call fails, and the lease it may have been granted is given back. Only a failure known
    to have written nothing (`StoreBusy`, a lock waited for in vain) gives none back."""
    runs: list[str] = []
    clock = ManualClock()
    sid, prompt = await _turn_to_go_on(store_url, clock, "message")
    async with so.Runtime([_agent(runs)], store=store_url, clock=clock, lease_ttl=TTL) as rt:
        commit = rt.store.commit

        async def told_failed(c: Commit) -> None:
            await commit(c)
            if c.grant is not None:
                raise so.StoreError("connection lost during COMMIT; the outcome is unknown")

        rt.store.commit = told_failed  # type: ignore[method-assign,assignment]
        with pytest.raises(so.StoreError, match="outcome is unknown"):
            await rt.generate("support", prompt, session_id=sid)
        assert runs == []
    await _driven_at_once(store_url, clock, runs, sid)
