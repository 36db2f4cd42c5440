"""A refusal arriving twice at once: two runtimes on one store (two processes), or one runtime
answering two calls at once (two HTTP requests), record the same person's refused answer once,
though neither holds a lock while the response policy decides."""

from __future__ import annotations

import asyncio

import signoff as so
from signoff.testing import ExecutionLog

from ._response_policies import ALICE, BOB, MALLORY, REFUSED, asked, events_of, lines, refund_agent


class Slow:
    """A response policy that refuses after a while, counting its calls and the most at once."""

    def __init__(self, delay: float = 0.2) -> None:
        self.delay = delay
        self.calls = 0
        self.running = 0
        self.most = 0

    async def __call__(self, ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
        self.calls += 1
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.running -= 1
        who = ctx.response.principal
        if who is not None and who.principal_id == "bob":
            return so.Allowed()
        return so.Rejected("not yours to approve")


def approve(req: so.InputRequest) -> list[so.InputResponse]:
    return [so.InputResponse(request_id=req.id, option_id="approve")]


async def test_two_runtimes_refusing_the_same_answer_at_once_record_it_once(
    store_url: str,
) -> None:
    log = ExecutionLog()
    policy = Slow()
    spec = so.ApprovalSpec(request=so.always(), response=policy)
    agent = refund_agent(log, spec)
    async with (
        so.Runtime([agent], store=store_url) as one,
        so.Runtime([agent], store=store_url) as two,
    ):
        sid, req, head = await asked(one, ALICE)
        got = await asyncio.gather(
            one.respond(sid, approve(req), principal=MALLORY),
            two.respond(sid, approve(req), principal=MALLORY),
        )
        for r in got:
            assert r.status == "waiting"
            o = r.outcomes[0]
            assert (o.outcome, o.applied, o.reason) == ("rejected", False, "not yours to approve")
        assert lines(await events_of(one, sid, head)) == REFUSED
        assert await one.verify_audit() == []
        # The request is still open to someone the policy allows.
        r = await two.respond(sid, approve(req), principal=BOB)
        assert r.status == "completed" and len(log.executions) == 1


async def test_one_runtime_answering_the_same_refusal_twice_at_once_records_it_once(
    store_url: str,
) -> None:
    log = ExecutionLog()
    policy = Slow()
    spec = so.ApprovalSpec(request=so.always(), response=policy)
    async with so.Runtime([refund_agent(log, spec)], store=store_url) as rt:
        sid, req, head = await asked(rt, ALICE)
        got = await asyncio.gather(
            *(rt.respond(sid, approve(req), principal=MALLORY) for _ in range(3))
        )
        assert [r.outcomes[0].outcome for r in got] == ["rejected"] * 3
        assert lines(await events_of(rt, sid, head)) == REFUSED


async def test_two_people_refused_at_once_are_each_recorded(store_url: str) -> None:
    log = ExecutionLog()
    policy = Slow()
    spec = so.ApprovalSpec(request=so.always(), response=policy)
    agent = refund_agent(log, spec)
    async with (
        so.Runtime([agent], store=store_url) as one,
        so.Runtime([agent], store=store_url) as two,
    ):
        sid, req, head = await asked(one, ALICE)
        await asyncio.gather(
            one.respond(sid, approve(req), principal=MALLORY),
            two.respond(sid, approve(req), principal=None),
        )
        assert policy.most == 2  # judged side by side: no one waits on another's policy
        assert sorted(lines(await events_of(one, sid, head))) == sorted(REFUSED * 2)
