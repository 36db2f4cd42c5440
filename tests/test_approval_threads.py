"""A sync approval or response policy runs in a thread, as a sync tool does: one that blocks (a
directory lookup) no longer stops the event loop, and with it the lease renewals of every session
of the process. Run on both stores.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

import signoff as so
from signoff.testing import ExecutionLog

from ._response_policies import ALICE, BOB, asked, refund_agent

PATIENCE = 5.0  # how long a policy waits for the loop before it gives up (a failure)


class LoopWatch:
    """A blocking wait, for a sync policy, on something only the event loop does: it returns
    True at once when the policy runs off the loop, and False after `PATIENCE` when it blocks it."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.went_on = threading.Event()
        self.threads: list[str] = []

    def loop_went_on(self) -> bool:
        self.threads.append(threading.current_thread().name)
        self.loop.call_soon_threadsafe(self.went_on.set)  # runs only if the loop is free
        return self.went_on.wait(PATIENCE)

    def ran_off_the_loop(self) -> bool:
        return bool(self.threads) and threading.main_thread().name not in self.threads


async def test_a_blocking_sync_response_policy_leaves_the_loop_free(store_url: str) -> None:
    watch = LoopWatch()

    def directory(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
        return so.Allowed() if watch.loop_went_on() else so.Rejected("the loop stalled")

    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=directory, timeout=PATIENCE * 2)
    async with so.Runtime([refund_agent(log, spec)], store=store_url) as rt:
        sid, req, _ = await asked(rt, ALICE)
        r = await rt.respond(
            sid, [so.InputResponse(request_id=req.id, option_id="approve")], principal=BOB
        )
        assert [(o.outcome, o.reason) for o in r.outcomes] == [("approved", None)]
        assert log.count() == 1
        assert watch.ran_off_the_loop()


def _predicate(watch: LoopWatch) -> Callable[[Any], Any]:
    return lambda input: False if watch.loop_went_on() else so.Denied("the loop stalled")


def _context_policy(watch: LoopWatch) -> Callable[[Any], Any]:
    def check(ctx: so.ApprovalContext) -> Any:
        return "not-applicable" if watch.loop_went_on() else so.Denied("the loop stalled")

    return check


@pytest.mark.parametrize("make", [_predicate, _context_policy], ids=["predicate", "context"])
async def test_a_blocking_sync_approval_policy_leaves_the_loop_free(
    store_url: str, make: Callable[[LoopWatch], Callable[[Any], Any]]
) -> None:
    watch = LoopWatch()
    log = ExecutionLog()
    async with so.Runtime([refund_agent(log, make(watch))], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund ch_1", auth=ALICE)
        assert r.status == "completed"
        assert log.count() == 1
        assert watch.ran_off_the_loop()


async def test_an_async_approval_policy_still_runs_on_the_loop(tmp_path: Any) -> None:
    """Only sync functions go to a thread: a coroutine function is awaited where it is."""
    threads: list[str] = []

    async def check(ctx: so.ApprovalContext) -> bool:
        threads.append(threading.current_thread().name)
        return False

    log = ExecutionLog()
    url = f"sqlite:///{tmp_path / 'state.db'}"
    async with so.Runtime([refund_agent(log, check)], store=url) as rt:
        await rt.generate("billing", prompt="refund ch_1", auth=ALICE)
    assert threads == [threading.current_thread().name]
    assert log.count() == 1


NOTE = " (a plain function runs in a thread, without the event loop: make it async to use it)"


async def test_a_sync_policy_that_uses_the_loop_fails_closed_saying_why(tmp_path: Any) -> None:
    """In its thread no loop runs: a plain policy that schedules on it raises, which asks a
    person, and the error says to make it async."""

    def schedules(ctx: so.ApprovalContext) -> Any:
        return asyncio.get_running_loop().create_future()

    log = ExecutionLog()
    async with so.Runtime([refund_agent(log, schedules)], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("billing", prompt="refund ch_1", auth=ALICE)
        (req,) = r.pending
        assert (
            req.policy_error == "approval policy raised RuntimeError: no running event loop" + NOTE
        )
        assert log.count() == 0


async def test_a_sync_response_policy_that_uses_the_loop_fails_saying_why(tmp_path: Any) -> None:
    def schedules(ctx: so.ResponseContext) -> Any:
        return asyncio.get_running_loop().create_future()

    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=schedules)
    async with so.Runtime([refund_agent(log, spec)], store=f"sqlite:///{tmp_path}/s.db") as rt:
        sid, req, _ = await asked(rt, ALICE)
        r = await rt.respond(
            sid, [so.InputResponse(request_id=req.id, option_id="approve")], principal=ALICE
        )
        assert [(o.outcome, o.reason) for o in r.outcomes] == [
            ("failed", "response policy raised RuntimeError: no running event loop" + NOTE)
        ]
        assert log.count() == 0


def _guarded_agent(log: ExecutionLog, guardrail: so.Guardrail) -> so.Agent:
    agent = refund_agent(log, so.never())
    return so.Agent(
        name=agent.name, model=agent.model, tools=list(agent.tools.values()), guardrails=[guardrail]
    )


async def test_a_plain_guardrail_decides_and_runs_in_a_thread(store_url: str) -> None:
    """The README's guardrail is a subclass whose `decide(ctx)` returns a `Verdict` or None. A
    plain `def decide` was awaited as it returned: every call it saw asked a person ("guardrail
    raised TypeError: object Verdict can't be used in 'await' expression"), a deny included. It
    runs in a thread now, as a plain policy does, and one that blocks leaves the loop free."""
    watch = LoopWatch()

    class NoRefunds(so.Guardrail):
        def decide(self, ctx: so.ApprovalContext) -> so.Verdict | None:  # type: ignore[override]
            if not watch.loop_went_on():
                return so.Verdict("ask")
            return so.Verdict("deny", "no refunds today")

    log = ExecutionLog()
    async with so.Runtime([_guarded_agent(log, NoRefunds())], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund ch_1", auth=ALICE)
        assert (r.status, r.pending) == ("completed", [])
        [result] = [m for m in (await rt.state(r.session_id)).messages or [] if m.kind == "tool"]
        assert result.is_error and "no refunds today" in str(result.content)
        assert log.count() == 0
        assert watch.ran_off_the_loop()


async def test_a_plain_guardrail_that_uses_the_loop_fails_closed_saying_why(tmp_path: Any) -> None:
    class Schedules(so.Guardrail):
        def decide(self, ctx: so.ApprovalContext) -> so.Verdict | None:  # type: ignore[override]
            asyncio.get_running_loop()
            return None

    log = ExecutionLog()
    agent = _guarded_agent(log, Schedules())
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("billing", prompt="refund ch_1", auth=ALICE)
        (req,) = r.pending
        assert req.policy_error == "guardrail raised RuntimeError: no running event loop" + NOTE
        assert log.count() == 0
