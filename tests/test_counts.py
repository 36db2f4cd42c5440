"""The runtime's own counts (`_counts`), which `/metrics` reads: a drive is counted when it
records something or fails, an answer once when it takes effect or is refused, however many
sessions (a subagent's mirror) it passes through."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent, sqlite_runtime

from ._subagents import ALICE, Counted, refund_agents


async def test_drives_count_when_they_record_and_fail_when_the_turn_fails(
    tmp_path: Path,
) -> None:
    agent = so.Agent(name="a", model=so.models.Scripted([so.ModelResponse(text="hi")]))
    rt = sqlite_runtime(tmp_path, agent)
    first = await rt.generate("a", prompt="hello")
    assert first.status == "completed"
    assert (rt._counts.drives, rt._counts.failed_drives) == (1, 0)
    resumed = await rt.generate(session_id=first.session_id)  # nothing to do: no drive
    assert resumed.status == "completed"
    assert (rt._counts.drives, rt._counts.failed_drives) == (1, 0)
    failed = await rt.generate(session_id=first.session_id, prompt="again")  # out of script
    assert failed.status == "failed" and failed.retryable
    assert (rt._counts.drives, rt._counts.failed_drives) == (2, 1)
    retried = await rt.generate(session_id=first.session_id)  # a retry that fails again
    assert retried.status == "failed"
    assert (rt._counts.drives, rt._counts.failed_drives) == (3, 2)
    assert rt._counts.accepted == 0 and not rt._counts.refused
    await rt.close()


async def test_a_drive_that_raises_is_a_failed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = so.Agent(name="a", model=so.models.Scripted([so.ModelResponse(text="hi")]))
    rt = sqlite_runtime(tmp_path, agent)
    commit = rt.store.commit
    calls = [0]

    async def failing(c: Any) -> None:
        calls[0] += 1
        if calls[0] == 1:  # the session and its turn's start are one write; the turn's first
            raise so.StoreError("disk full")
        await commit(c)

    await rt.open()
    monkeypatch.setattr(rt.store, "commit", failing)
    with pytest.raises(so.StoreError):
        await rt.generate("a", prompt="hello")
    assert (rt._counts.drives, rt._counts.failed_drives) == (1, 1)
    await rt.close()


class _Waiting(so.models.Scripted):
    """A scripted model that waits, inside its call, until `go` is set."""

    def __init__(self, steps: list[so.ModelResponse]) -> None:
        super().__init__(steps)
        self.inside = asyncio.Event()
        self.go = asyncio.Event()

    async def complete(self, request: so.models.ModelRequest) -> so.ModelResponse:
        self.inside.set()
        await self.go.wait()
        return await super().complete(request)


async def test_a_drive_whose_turn_another_process_cancelled_recorded_nothing_and_is_no_drive(
    tmp_path: Path,
) -> None:
    """A drive was counted when the state it ended with was ahead of the one it began with,
    which counts what other processes appended and it read back: a drive whose turn another
    runtime cancelled during its model call recorded nothing, yet counted as one."""
    model = _Waiting([so.ModelResponse(text="hi")])
    rt = sqlite_runtime(tmp_path, so.Agent(name="a", model=model))
    other = sqlite_runtime(tmp_path, so.Agent(name="a", model=so.models.Scripted([])))
    await rt.open()
    driving = asyncio.create_task(rt.generate("a", prompt="hello"))
    await model.inside.wait()
    (session,) = await other.sessions()
    await other.cancel(session.id, "stop")
    head = await rt.store.head(session.id)
    model.go.set()
    r = await driving
    assert (
        r.status == "cancelled" and await rt.store.head(session.id) == head
    )  # it recorded nothing
    assert (rt._counts.drives, rt._counts.failed_drives) == (0, 0)
    await rt.close()
    await other.close()


async def test_answers_count_once_accepted_and_refusals_by_code(tmp_path: Path) -> None:
    ran: list[dict[str, Any]] = []
    parent, child = refund_agents(ran, Counted("Done."))
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
    (mirror,) = r.pending
    assert mirror.child is not None  # the answer is settled in the child, through the parent
    with pytest.raises(so.UnknownRequest):
        await rt.respond(
            r.session_id, [so.InputResponse(request_id="req_nope", option_id="approve")]
        )
    maybe = [so.InputResponse(request_id=mirror.id, option_id="maybe")]
    with pytest.raises(so.InvalidAnswer):  # refused by the child's settlement, counted once
        await rt.respond(r.session_id, maybe, principal=ALICE)
    assert rt._counts.refused == {"unknown_request": 1, "invalid_answer": 1}
    approve = [so.InputResponse(request_id=mirror.id, option_id="approve")]
    done = await rt.respond(r.session_id, approve, principal=ALICE)
    assert done.status == "completed" and ran
    assert rt._counts.accepted == 1  # once, though the parent's and the child's requests closed
    again = await rt.respond(r.session_id, approve, principal=ALICE)
    assert again.outcomes[0].applied is False
    assert rt._counts.accepted == 1  # a repeat is no new answer
    deny = [so.InputResponse(request_id=mirror.id, option_id="cancel")]
    with pytest.raises(so.ConflictingAnswer):
        await rt.respond(r.session_id, deny, principal=ALICE)
    assert rt._counts.refused == {
        "unknown_request": 1,
        "invalid_answer": 1,
        "conflicting_answer": 1,
    }
    await rt.close()


@so.tool(approval=so.always())
async def refund(order_id: str) -> str:
    """Refund an order."""
    return f"refunded {order_id}"


def refunding(**kwargs: Any) -> so.Agent:
    """An agent whose first turn waits on the approval of a refund."""
    steps = [call_tools(call("refund", order_id="1")), reply("done")]
    return scripted_agent("a", steps, tools=[refund], repeat_last=True, **kwargs)


async def test_an_answer_to_an_expired_session_is_refused_and_counted(tmp_path: Path) -> None:
    """`session_expired` refuses an answer as a request's error does: it was not counted."""
    clock = ManualClock()
    rt = sqlite_runtime(tmp_path, refunding(limits=so.Limits(ttl=60)), clock=clock)
    r = await rt.generate("a", prompt="refund order 1")
    (req,) = r.pending
    clock.advance(61)
    with pytest.raises(so.SessionExpired):
        await rt.respond(r.session_id, [so.InputResponse(request_id=req.id, option_id="approve")])
    with pytest.raises(so.SessionExpired):  # its expiry recorded now: refused all the same
        await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=req.id, approved=True)]
        )
    assert rt._counts.refused == {"session_expired": 2} and rt._counts.accepted == 0
    await rt.close()


async def test_a_drive_that_records_its_sessions_expiry_is_a_failed_one(tmp_path: Path) -> None:
    """A drive that finds the session's TTL passed records its expiry (the turn fails,
    `session_expired`) and raises `SessionExpired`: it was not counted at all, as it recorded
    through a driver of its own, not `Driver.drive`. Once recorded, a drive finding it so
    records nothing and is no drive."""
    clock = ManualClock()
    rt = sqlite_runtime(tmp_path, refunding(limits=so.Limits(ttl=60)), clock=clock)
    r = await rt.generate("a", prompt="refund order 1")
    assert r.status == "waiting"
    assert (rt._counts.drives, rt._counts.failed_drives) == (1, 0)
    clock.advance(61)
    for _ in range(2):
        with pytest.raises(so.SessionExpired):
            await rt.generate(session_id=r.session_id)
        assert (rt._counts.drives, rt._counts.failed_drives) == (2, 1)
    state = await rt.state(r.session_id)
    assert state.turn is not None and state.turn.status == "failed"
    assert (state.turn.error or {}).get("code") == "session_expired"
    await rt.close()


@pytest.mark.parametrize("closing", ["cancel", "deny"])
async def test_a_message_whose_request_closed_meanwhile_is_delivered_not_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, closing: str
) -> None:
    """`send` matched its text to an open request, which another process closed (withdrew by
    cancelling the turn, or answered otherwise) before the answer was recorded: the text goes
    to the session as a message, a new turn's prompt. Nothing was refused: it was counted as a
    refused `request_closed` (or `conflicting_answer`)."""
    rt = sqlite_runtime(tmp_path, refunding())
    other = sqlite_runtime(tmp_path, refunding())
    r = await rt.generate("a", prompt="refund order 1")
    (req,) = r.pending
    orphaned = rt._orphaned  # the settlement's first await after it read the session
    closed: list[str] = []

    async def closing_first(state: Any) -> bool:
        if not closed:
            if closing == "cancel":
                closed.append((await other.cancel(r.session_id)).status)
            else:
                deny = [so.InputResponse(request_id=req.id, option_id="cancel", text="no")]
                closed.append((await other.respond(r.session_id, deny)).status)
        return await orphaned(state)

    monkeypatch.setattr(rt, "_orphaned", closing_first)
    sent = await rt.send(r.session_id, "approve")
    assert closed == ["cancelled" if closing == "cancel" else "completed"]
    assert sent.status == "completed" and sent.turn_id != r.turn_id  # a turn of its own
    events = [e async for e in rt.events(r.session_id, follow=False)]
    prompts = [e.data.get("message") for e in events if e.type == "turn.started"]
    assert prompts == ["refund order 1", "approve"]
    assert not rt._counts.refused and rt._counts.accepted == 0
    await rt.close()
    await other.close()


async def test_an_answer_to_an_unknown_session_is_refused_and_counted(tmp_path: Path) -> None:
    """`unknown_session` refuses an answer as `session_expired` does: it raised past the
    count (only a request's errors and the session's expiry were caught), so it was not."""
    rt = sqlite_runtime(tmp_path, refunding())
    await rt.generate("a", prompt="refund order 1")
    approve = [so.InputResponse(request_id="req_x", option_id="approve")]
    with pytest.raises(so.UnknownSession):
        await rt.respond("ses_nope", approve)
    with pytest.raises(so.UnknownSession):
        await rt.generate(session_id="ses_nope", approvals=[so.Decision(id="req_x", approved=True)])
    assert rt._counts.refused == {"unknown_session": 2} and rt._counts.accepted == 0
    await rt.close()


@pytest.mark.parametrize(
    "exc",
    [
        so.SessionBusy("busy", "ses_1"),
        so.SessionLimitReached("spent", "ses_1"),
        so.StoreError("disk full"),
        so.UsageError("not an answer's"),
    ],
)
def test_refusals_are_counted_by_a_fixed_code_and_failures_are_not(exc: so.SignoffError) -> None:
    """Every session error refuses an answer (`session_busy` was not counted, as
    `unknown_session` was not), by its class's code; a store's failure or a misuse is none."""
    from signoff._counts import Counts

    counts = Counts()
    with pytest.raises(type(exc)), counts.refusing():
        raise exc
    refusal = isinstance(exc, so.SessionError)
    assert counts.refused == ({type(exc).code: 1} if refusal else {})


def _rejects(ctx: so.ResponseContext) -> so.Rejected:
    return so.Rejected("Only the requester's manager may answer.")


def _raises(ctx: so.ResponseContext) -> so.Allowed:
    raise LookupError("directory service is down")


async def _hangs(ctx: so.ResponseContext) -> so.Allowed:
    await asyncio.sleep(10)
    return so.Allowed()


# The policies that answer at once get a timeout they cannot reach: a sync one runs in a
# thread, and on a loaded machine its start alone took more than 0.05 s (timed out, 1 in 3).
@pytest.mark.parametrize(
    ("policy", "timeout", "code"),
    [
        (_rejects, 60.0, "response_rejected"),
        (_raises, 60.0, "response_policy_failed"),
        (_hangs, 0.05, "response_policy_timed_out"),
    ],
    ids=["rejects", "raises", "hangs"],
)
async def test_an_answer_a_response_policy_refuses_is_counted_by_its_verdict(
    tmp_path: Path, policy: Any, timeout: float, code: str
) -> None:
    """A response policy's refusal is returned as an outcome (`applied` false), not raised: it
    was counted neither accepted nor refused, so `signoff_answers_refused_total` missed every
    answer a who-may-answer policy turned away. Its code says which verdict refused it."""
    spec = so.ApprovalSpec(request=so.always(), response=policy, timeout=timeout)

    @so.tool(approval=spec)
    async def guarded_refund(order_id: str) -> str:
        """Refund an order, if the response policy lets the answer stand."""
        return f"refunded {order_id}"

    steps = [call_tools(call("guarded_refund", order_id="1")), reply("done")]
    rt = sqlite_runtime(tmp_path, scripted_agent("a", steps, tools=[guarded_refund]))
    r = await rt.generate("a", prompt="refund order 1")
    (req,) = r.pending
    approve = [so.InputResponse(request_id=req.id, option_id="approve")]
    refused = await rt.respond(r.session_id, approve)
    assert [o.applied for o in refused.outcomes] == [False] and refused.status == "waiting"
    assert rt._counts.refused == {code: 1} and rt._counts.accepted == 0
    await rt.close()
