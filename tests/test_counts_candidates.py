"""The answer counts (`_counts`, `signoff_answers_*_total`) of answers a response policy judged
outside the plain path: one a deadline overtook (it escalated the request while the policy
decided), and one whose process died while its policy ran, judged again by another process. Each
is counted once, accepted or refused, however many processes judge it again."""

from __future__ import annotations

import signoff as so
from signoff.testing import ExecutionLog, ManualClock

from ._response_policies import ALICE, asked, refund_agent


def _total(*runtimes: so.Runtime) -> tuple[int, dict[str, int]]:
    """Accepted and refused answers across these runtimes, as `sum()` over their scrapes."""
    refused: dict[str, int] = {}
    for rt in runtimes:
        for code, n in rt._counts.refused.items():
            refused[code] = refused.get(code, 0) + n
    return sum(rt._counts.accepted for rt in runtimes), refused


async def test_an_answer_a_deadline_overtook_and_escalated_is_counted_refused(
    store_url: str,
) -> None:
    """The request's deadline passes while the policy decides and escalates the request: the
    answer settles nothing (outcome `stale`), as a deadline that closes the request refuses it
    (`request_closed`). It was counted neither accepted nor refused."""
    clock = ManualClock()

    async def slow(ctx: so.ResponseContext) -> so.Allowed:
        clock.advance(61)
        return so.Allowed()

    rules = so.always(expires_in=60, on_timeout="escalate", escalate_to="finance")
    agent = refund_agent(ExecutionLog(), so.ApprovalSpec(request=rules, response=slow))
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        sid, req, _ = await asked(rt, ALICE)
        r = await rt.respond(sid, [so.InputResponse(request_id=req.id, option_id="approve")])
        assert [(o.outcome, o.applied) for o in r.outcomes] == [("stale", False)]
        assert _total(rt) == (0, {"response_stale": 1})
