"""Request deadlines with an injectable clock (no sleeping): deny, approve or escalate on timeout.

An expired request resolves with outcome `expired` and the model is told the call timed out,
never that a person denied it; `approve` is an explicit opt-in; `escalate` hands the request to a
named group, which a response policy can admit, and lifts the deadline.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Literal

import pytest

import signoff as so
from signoff.testing import (
    Capture,
    ExecutionLog,
    ManualClock,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    store_contents,
    timeline,
    tool_results,
)

from ._ttl import ttl_agent

ALICE = so.Principal(authenticator="sso", principal_id="alice")
BOB = so.Principal(authenticator="sso", principal_id="bob")
FIONA = so.Principal(authenticator="sso", principal_id="fiona", attributes={"groups": ["finance"]})
TIMED_OUT = "no one decided before the deadline"


def lines(events: list[so.Event]) -> list[str]:
    out = []
    for e, line in zip(events, timeline(events), strict=True):
        if e.type == "approval.candidate":
            line = f"approval.candidate {e.data['outcome']}"
        out.append(line)
    return out


async def events_of(rt: so.Runtime, session_id: str, after: int = 0) -> list[so.Event]:
    return [e async for e in rt.events(session_id, after, follow=False)]


def payout_agent(
    log: ExecutionLog, approval: Any, seen: Capture | None = None, name: str = "pay", **kw: Any
) -> so.Agent:
    @log.tool(approval=approval, **kw)
    async def pay_invoice(invoice: str, amount: float) -> dict[str, Any]:
        """Pay an invoice."""
        return {"paid": invoice}

    return scripted_agent(
        name,
        [call_tools(call("pay_invoice", invoice="INV-7", amount=900)), seen or reply("done")],
        tools=[pay_invoice],
    )


async def asked(
    rt: so.Runtime, agent: str = "pay", auth: so.Principal | None = ALICE
) -> tuple[str, so.InputRequest, int]:
    r = await rt.generate(agent, prompt="pay INV-7", auth=auth)
    assert r.status == "waiting"
    (req,) = r.pending
    head = await rt.store.head(r.session_id)
    assert head is not None
    return r.session_id, req, head


async def test_a_sweep_counts_a_session_once_when_its_ttl_and_a_deadline_both_passed(
    store_url: str,
) -> None:
    """The sweep recorded the session's expiry, then met the request's passed deadline of the
    same session (expired now: nothing to apply) and counted it again: 2 for one session."""
    clock = ManualClock()
    log = ExecutionLog()

    @log.tool(approval=so.always(expires_in=60))
    async def pay_invoice(invoice: str) -> str:
        """Pay an invoice."""
        return "paid"

    agent = scripted_agent(
        "pay",
        [call_tools(call("pay_invoice", invoice="INV-7")), reply("done")],
        tools=[pay_invoice],
        limits=so.Limits(ttl=30),
    )
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        r = await rt.generate("pay", prompt="pay INV-7", auth=ALICE)
        assert r.status == "waiting"
        clock.advance(120)
        assert await rt.expire_due() == 1
        assert await rt.expire_due() == 0
        state = await rt.state(r.session_id)
        assert state.turn is not None and state.turn.error is not None
        assert (state.turn.status, state.turn.error["code"]) == ("failed", "session_expired")
        assert state.pending_requests() == []
    assert log.executions == []


# -- deny (the default) --------------------------------------------------------------------------


async def test_expired_request_is_denied_and_the_model_is_told_it_timed_out(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    log = ExecutionLog()
    seen = Capture(reply("Nobody approved the payment in time."))
    agent = payout_agent(log, so.always(expires_in=60), seen)
    async with sqlite_runtime(tmp_path, agent, clock=clock) as rt:
        t0 = clock.now
        sid, req, head = await asked(rt)
        assert req.expires_at == t0 + 60
        assert req.on_timeout == "deny"
        clock.advance(59.9)
        assert await rt.expire_due() == 0
        assert [p.id for p in await rt.pending()] == [req.id]
        assert await events_of(rt, sid, head) == []
        clock.advance(0.1)  # the deadline itself has passed
        assert await rt.expire_due() == 1
        events = await events_of(rt, sid, head)
        assert lines(events) == [
            "input.resolved expired",
            "tool.completed pay_invoice expired",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        resolved = events[0].data
        assert resolved == {
            "request_id": req.id,
            "outcome": "expired",
            "status": "expired",
            "reason": TIMED_OUT,
            "on_timeout": "deny",
        }
        assert "approval.settled" not in [e.type for e in events]
        # the model reads a timeout: the call did not run, and no person denied it
        (result,) = tool_results(seen.last)
        assert result.content["timed_out"] is True
        assert result.content["ran"] is False
        assert "denied" not in result.content
        assert "denied" not in str(result.content["reason"])
        assert log.count() == 0
        stored = await rt.store.get_request(req.id)
        assert stored is not None
        assert (stored.status, stored.outcome) == ("expired", "expired")
        assert await rt.pending() == []
        state = await rt.state(sid)
        assert state.turn is not None and state.turn.status == "completed"
        # a late answer is refused by name, and changes nothing
        before = await store_contents(rt.store, sid)
        with pytest.raises(so.RequestClosed, match="expired"):
            await rt.respond(
                sid, [so.InputResponse(request_id=req.id, option_id="approve")], principal=ALICE
            )
        assert await store_contents(rt.store, sid) == before
        assert await rt.expire_due() == 0


async def test_a_decision_in_time_beats_the_deadline(tmp_path: Path) -> None:
    clock = ManualClock()
    log = ExecutionLog()
    async with sqlite_runtime(
        tmp_path, payout_agent(log, so.always(expires_in=60)), clock=clock
    ) as rt:
        sid, req, _ = await asked(rt)
        clock.advance(30)
        r = await rt.respond(
            sid, [so.InputResponse(request_id=req.id, option_id="approve")], principal=ALICE
        )
        assert r.status == "completed"
        clock.advance(3600)
        assert await rt.expire_due() == 0
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.outcome == "approved"
        assert log.count() == 1


@pytest.mark.parametrize("path", ["respond", "generate"])
async def test_an_answer_after_the_deadline_finds_it_expired_and_the_turn_moves_on(
    tmp_path: Path, path: str
) -> None:
    """No one ran expire_due: the deadline is applied when the session is next touched."""
    clock = ManualClock()
    log = ExecutionLog()
    seen = Capture(reply("timed out"))
    async with sqlite_runtime(
        tmp_path, payout_agent(log, so.always(expires_in=60), seen), clock=clock
    ) as rt:
        sid, req, head = await asked(rt)
        clock.advance(61)
        with pytest.raises(so.RequestClosed, match="expired"):
            if path == "respond":
                await rt.respond(
                    sid,
                    [so.InputResponse(request_id=req.id, option_id="approve")],
                    principal=ALICE,
                )
            else:
                await rt.generate(
                    session_id=sid, approvals=[so.Decision(id=req.id, approved=True)], auth=ALICE
                )
        # the turn is not left hanging for whoever comes next: the model was told it timed out
        assert lines(await events_of(rt, sid, head)) == [
            "input.resolved expired",
            "tool.completed pay_invoice expired",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        assert tool_results(seen.last)[0].content["timed_out"] is True
        assert log.count() == 0


async def test_deadlines_in_a_new_runtime(tmp_path: Path) -> None:
    clock = ManualClock()
    log = ExecutionLog()
    agent = payout_agent(log, so.ApprovalSpec(request=so.always(), expires_in=120))
    async with sqlite_runtime(tmp_path, agent, clock=clock) as rt:
        sid, req, _ = await asked(rt)
    clock.advance(121)
    async with sqlite_runtime(tmp_path, agent, clock=clock) as rt2:
        assert await rt2.expire_due() == 1
        state = await rt2.state(sid)
        assert state.turn is not None and state.turn.status == "completed"
        assert state.requests[req.id].outcome == "expired"
        assert log.count() == 0


async def test_expire_due_touches_only_sessions_past_their_deadline(tmp_path: Path) -> None:
    clock = ManualClock()
    log = ExecutionLog()
    short = payout_agent(log, so.always(expires_in=10), name="short")
    long = payout_agent(log, so.always(expires_in=100), name="long")
    never = payout_agent(log, so.always(), name="never")
    async with sqlite_runtime(tmp_path, short, long, never, clock=clock) as rt:
        s1, r1, _ = await asked(rt, "short")
        s2, r2, _ = await asked(rt, "long")
        s3, r3, _ = await asked(rt, "never")
        assert r3.expires_at is None
        clock.advance(50)
        assert await rt.expire_due() == 1
        assert sorted(p.id for p in await rt.pending()) == sorted([r2.id, r3.id])
        clock.advance(50)
        assert await rt.expire_due() == 1
        clock.advance(10**6)
        assert await rt.expire_due() == 0
        assert [p.id for p in await rt.pending()] == [r3.id]


async def test_a_partial_quorum_still_expires(tmp_path: Path) -> None:
    clock = ManualClock()
    log = ExecutionLog()
    policy = so.always(approvers=2, exclude_requester=True, expires_in=60)
    async with sqlite_runtime(tmp_path, payout_agent(log, policy), clock=clock) as rt:
        sid, req, head = await asked(rt)
        r = await rt.respond(
            sid, [so.InputResponse(request_id=req.id, option_id="approve")], principal=BOB
        )
        assert r.outcomes[0].reason == "1 of 2"
        clock.advance(60)
        assert await rt.expire_due() == 1
        assert lines(await events_of(rt, sid, head)) == [
            "approval.candidate counted",
            "turn.waiting",
            "input.resolved expired",
            "tool.completed pay_invoice expired",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        assert log.count() == 0


# -- approve (explicit opt-in) -------------------------------------------------------------------


@pytest.mark.parametrize("run_as", ["requester", "approver"])
async def test_on_timeout_approve_runs_the_call_as_the_requester(
    tmp_path: Path, run_as: str
) -> None:
    clock = ManualClock()
    log = ExecutionLog()
    seen = Capture(reply("paid"))
    policy = so.always(expires_in=60, on_timeout="approve")
    async with sqlite_runtime(
        tmp_path, payout_agent(log, policy, seen, run_as=run_as), clock=clock
    ) as rt:
        sid, req, head = await asked(rt)
        assert req.on_timeout == "approve"
        clock.advance(60)
        assert log.count() == 0
        assert await rt.expire_due() == 1
        events = await events_of(rt, sid, head)
        assert lines(events) == [
            "approval.settled approve",
            "input.resolved expired",
            "tool.started pay_invoice",
            "tool.completed pay_invoice ok",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        settled = events[0].data
        assert settled["by"] is None and settled["auto"] == "timeout"
        assert "on_timeout='approve'" in settled["reason"]
        assert events[1].data["on_timeout"] == "approve"
        # nobody approved: the call runs with the requester's identity, even for run_as approver
        assert [e.principal_id for e in log.executions] == ["alice"]
        (result,) = tool_results(seen.last)
        assert not result.is_error
        # the model reads how it was approved: by nobody, when the deadline passed
        assert result.content == {
            "result": {"paid": "INV-7"},
            "approval": {
                "approved": True,
                "by": None,
                "reason": "approved automatically when the deadline passed (on_timeout='approve')",
            },
        }


# -- escalate ------------------------------------------------------------------------------------


def finance_when_escalated(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
    """The requester may answer; once escalated to a group, its members may too."""
    who = ctx.response.principal
    if who is not None and who.same_as(ctx.request.principal):
        return so.Allowed()
    group = ctx.request.escalated_to
    if group is not None and who is not None and group in who.attributes.get("groups", []):
        return so.Allowed()
    return so.Rejected("not the requester, and not in the group this was escalated to")


async def test_escalation_hands_the_request_to_a_group_and_lifts_the_deadline(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    log = ExecutionLog()
    seen_groups: list[str | None] = []

    def policy(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
        seen_groups.append(ctx.request.escalated_to)
        return finance_when_escalated(ctx)

    spec = so.ApprovalSpec(
        request=so.always(),
        response=policy,
        expires_in=3600,
        on_timeout="escalate",
        escalate_to="finance",
    )
    async with sqlite_runtime(tmp_path, payout_agent(log, spec), clock=clock) as rt:
        sid, req, head = await asked(rt)
        assert (req.on_timeout, req.escalate_to, req.escalated_to) == (
            "escalate",
            "finance",
            None,
        )
        # before the deadline, finance is not yet in the loop
        r = await rt.respond(
            sid, [so.InputResponse(request_id=req.id, option_id="approve")], principal=FIONA
        )
        assert r.outcomes[0].outcome == "rejected"
        mark = await rt.store.head(sid)
        assert mark is not None
        clock.advance(3600)
        assert await rt.expire_due() == 1
        escalation = await events_of(rt, sid, mark)
        assert lines(escalation) == ["approval.candidate escalated"]
        assert escalation[0].data == {
            "request_id": req.id,
            "call_id": req.call_id,
            "outcome": "escalated",
            "to": "finance",
            "reason": TIMED_OUT,
        }
        (queued,) = await rt.pending()
        assert queued.id == req.id
        assert (queued.escalated_to, queued.expires_at) == ("finance", None)
        # the deadline is lifted: nothing more happens however long it waits
        clock.advance(10**6)
        assert await rt.expire_due() == 0
        assert await events_of(rt, sid, mark + 1) == []
        # someone outside the group is still refused; a finance member settles it
        r = await rt.respond(
            sid, [so.InputResponse(request_id=req.id, option_id="approve")], principal=BOB
        )
        assert r.outcomes[0].outcome == "rejected"
        r = await rt.respond(
            sid, [so.InputResponse(request_id=req.id, option_id="approve")], principal=FIONA
        )
        assert r.status == "completed"
        assert seen_groups == [None, "finance", "finance"]
        assert [e.principal_id for e in log.executions] == ["alice"]
        assert lines(await events_of(rt, sid, head)) == [
            "approval.candidate pending",
            "approval.candidate rejected",
            "turn.waiting",
            "approval.candidate escalated",
            "approval.candidate pending",
            "approval.candidate rejected",
            "turn.waiting",
            "approval.candidate pending",
            "approval.settled approve",
            "input.resolved approved",
            "tool.started pay_invoice",
            "tool.completed pay_invoice ok",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]


async def test_escalation_is_applied_when_the_session_is_touched(tmp_path: Path) -> None:
    clock = ManualClock()
    log = ExecutionLog()
    spec = so.ApprovalSpec(
        request=so.always(),
        response=finance_when_escalated,
        expires_in=60,
        on_timeout="escalate",
        escalate_to="finance",
    )
    async with sqlite_runtime(tmp_path, payout_agent(log, spec), clock=clock) as rt:
        sid, req, head = await asked(rt)
        clock.advance(61)
        # no expire_due: the answer itself finds the request escalated, and finance may settle
        r = await rt.respond(
            sid, [so.InputResponse(request_id=req.id, option_id="approve")], principal=FIONA
        )
        assert r.status == "completed"
        assert lines(await events_of(rt, sid, head))[:3] == [
            "approval.candidate escalated",
            "approval.candidate pending",
            "approval.settled approve",
        ]
        assert log.count() == 1


# -- usage ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"expires_in": 0}, "expires_in must be positive"),
        ({"expires_in": -5}, "expires_in must be positive"),
        ({"expires_in": 5, "on_timeout": "ignore"}, "on_timeout must be"),
        ({"expires_in": 5, "on_timeout": "escalate"}, "needs escalate_to"),
        # NaN never passes (and is not JSON), infinity is no deadline, a string compared badly
        ({"expires_in": float("nan")}, "expires_in must be positive"),
        ({"expires_in": float("inf")}, "expires_in must be positive"),
        ({"expires_in": "5"}, "expires_in must be positive"),
        ({"expires_in": True}, "expires_in must be positive"),
        # No float holds it: the first request's deadline raised OverflowError mid-turn
        ({"expires_in": 10**400}, "expires_in must be positive"),
        # ... nor an int Python does not write out (its error raised a bare ValueError)
        ({"expires_in": 10**5000}, "expires_in must be positive"),
    ],
)
def test_deadline_usage_errors(kwargs: dict[str, Any], problem: str) -> None:
    with pytest.raises(so.UsageError, match=problem):
        so.always(**kwargs)
    with pytest.raises(so.UsageError, match=problem):
        so.ApprovalSpec(request=so.always(), **kwargs)


# -- the queue never offers a request past its deadline -----------------------------------------


def escalating_spec() -> so.ApprovalSpec:
    return so.ApprovalSpec(
        request=so.always(),
        response=finance_when_escalated,
        expires_in=60,
        on_timeout="escalate",
        escalate_to="finance",
    )


@pytest.mark.parametrize("on_timeout", ["deny", "approve"])
async def test_pending_applies_a_passed_deadline_without_a_sweep(
    store_url: str, on_timeout: Literal["deny", "approve"]
) -> None:
    """No sweep ran: the listing applies the deadline itself, and the turn moves on."""
    clock = ManualClock()
    log = ExecutionLog()
    agent = payout_agent(log, so.always(expires_in=60, on_timeout=on_timeout))
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        sid, req, _ = await asked(rt)
        clock.advance(60)  # exactly the deadline: it has passed
        assert await rt.pending() == []
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "expired"
        state = await rt.state(sid)
        assert state.turn is not None and state.turn.status == "completed"
        assert log.count() == (1 if on_timeout == "approve" else 0)
        assert await rt.expire_due() == 0


async def test_pending_offers_an_escalated_request_to_its_group_without_a_sweep(
    store_url: str,
) -> None:
    clock = ManualClock()
    log = ExecutionLog()
    async with so.Runtime(
        [payout_agent(log, escalating_spec())], store=store_url, clock=clock
    ) as rt:
        sid, req, head = await asked(rt)
        clock.advance(61)
        (queued,) = await rt.pending()
        assert (queued.id, queued.escalated_to, queued.expires_at) == (req.id, "finance", None)
        assert lines(await events_of(rt, sid, head)) == ["approval.candidate escalated"]
        assert await rt.expire_due() == 0


async def test_listings_at_once_apply_one_deadline_once(store_url: str) -> None:
    clock = ManualClock()
    log = ExecutionLog()
    agents = [
        payout_agent(log, escalating_spec()),
        payout_agent(log, so.always(expires_in=60), name="deny"),
    ]
    async with (
        so.Runtime(agents, store=store_url, clock=clock) as a,
        so.Runtime(agents, store=store_url, clock=clock) as b,
    ):
        s1, r1, h1 = await asked(a)
        s2, _, h2 = await asked(a, "deny")
        clock.advance(61)
        listings = await asyncio.gather(*(rt.pending() for rt in (a, b, a, b)))
        assert [[r.id for r in listing] for listing in listings] == [[r1.id]] * 4
        assert lines(await events_of(a, s1, h1)) == ["approval.candidate escalated"]
        assert lines(await events_of(a, s2, h2))[:1] == ["input.resolved expired"]
        assert [e.type for e in await events_of(a, s2, h2)].count("input.resolved") == 1


async def test_a_runtime_without_the_agent_lists_the_queue_as_the_deadline_left_it(
    store_url: str,
) -> None:
    """The CLI's runtime has no agents: it cannot continue the turns, so it records nothing and
    lists what the deadlines made of the requests; a runtime with the agent applies them."""
    clock = ManualClock()
    log = ExecutionLog()
    agents = [
        payout_agent(log, escalating_spec()),
        payout_agent(log, so.always(expires_in=60), name="deny"),
    ]
    async with so.Runtime(agents, store=store_url, clock=clock) as rt:
        s1, r1, _ = await asked(rt)
        s2, r2, _ = await asked(rt, "deny")
        clock.advance(61)
        before = [await store_contents(rt.store, s) for s in (s1, s2)]
        async with so.Runtime([], store=store_url, clock=clock) as bare:
            (queued,) = await bare.pending()
            assert (queued.id, queued.escalated_to, queued.expires_at) == (r1.id, "finance", None)
            assert await bare.pending(agent="deny") == []
        assert [await store_contents(rt.store, s) for s in (s1, s2)] == before
        assert [r.id for r in await rt.pending()] == [r1.id]
        stored = await rt.store.get_request(r2.id)
        assert stored is not None and stored.status == "expired"


async def test_a_sweep_leaves_other_agents_sessions_and_applies_its_own(tmp_path: Path) -> None:
    """A worker serving some agents sweeps past sessions of agents it does not have."""
    clock = ManualClock()
    log = ExecutionLog()
    mine, theirs = (
        payout_agent(log, so.always(expires_in=60), name="mine"),
        payout_agent(log, so.always(expires_in=30), name="theirs"),
    )
    async with sqlite_runtime(tmp_path, mine, theirs, clock=clock) as rt:
        s1, r1, _ = await asked(rt, "theirs")  # older, and due first
        s2, r2, _ = await asked(rt, "mine")
    clock.advance(61)
    async with sqlite_runtime(tmp_path, mine, clock=clock) as worker:
        assert await worker.expire_due() == 1
        stored = await worker.store.get_request(r2.id)
        assert stored is not None and stored.status == "expired"
        stored = await worker.store.get_request(r1.id)
        assert stored is not None and stored.status == "pending"


async def test_a_session_of_an_agent_this_runtime_lacks_lists_as_failed_once_its_ttl_passed(
    tmp_path: Path,
) -> None:
    """A runtime without the session's agent cannot record its passed TTL, so its listing shows
    the session as that record would leave it (failed), not still waiting."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    now = [1_000_000.0]
    async with so.Runtime([ttl_agent()], store=url, clock=lambda: now[0]) as rt:
        r = await rt.generate("desk", prompt="reset")
        assert r.status == "waiting"
    other = scripted_agent("other", [reply("ok")])
    async with so.Runtime([other], store=url, clock=lambda: now[0]) as rt:
        (row,) = await rt.sessions()
        assert row.status == "waiting"
        now[0] += 120
        (row,) = await rt.sessions()
        assert row.id == r.session_id and row.status == "failed"
        assert (await rt.store.sessions())[0].status == "waiting"  # shown so, not recorded
