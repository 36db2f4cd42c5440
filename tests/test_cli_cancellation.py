"""`signoff cancel` (`cli/_cancellation`): a session's turn cancelled from the command line with
who and why recorded, its open requests withdrawn; `--turn` cancels that turn only; a session
with nothing to cancel is left as it is. Without MODULE:RUNTIME the cancel is only recorded:
nothing in the command drives a turn (a subagent's parent goes on in a process with its
agent)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

import signoff as so
from signoff.testing import ManualClock

from ._cli import invoke, park, refused_usage, runtime_module, url
from ._delegation import refund_desk
from ._workers import refund_agent
from .test_subagents_spend import orders, support, tokens

__all__ = ["url"]  # the fixture, used by name


def _asking() -> so.Agent:
    """Proposes a refund that needs approval at every turn: each turn waits on a person."""

    @so.tool(approval=True)
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    proposal = so.ModelResponse(
        tool_calls=[so.ToolCall(name="issue_refund", input={"order_id": "1"})]
    )
    model = so.models.Scripted([proposal], repeat_last=True)
    return so.Agent(name="support", model=model, tools=[issue_refund])


def test_cancel_withdraws_the_turns_requests_and_records_who_and_why(url: str) -> None:
    session_id, request_id = park(url)
    result = invoke("cancel", session_id, "--store", url, "--reason", "customer left")
    assert result.exit_code == 0, result.output
    with so.Runtime([], store=url) as rt:
        state = rt.state_sync(session_id)
        assert state.turn is not None and state.turn.status == "cancelled"
        said = f"cancelled turn {state.turn.id} of {session_id}; 1 open request(s) withdrawn"
        assert said in result.stdout
        assert [r.status for r in state.requests.values()] == ["withdrawn"]
        [event] = [e for e in rt.events_sync(session_id) if e.type == "turn.cancelled"]
        assert event.data["reason"] == "customer left"
        assert event.data["by"] == so.cli.local_principal().model_dump()
        seq = state.seq
    again = invoke("cancel", session_id, "--store", url, "--as", "oidc:ops@example.com")
    assert again.exit_code == 0, again.output
    assert f"Nothing to cancel: {session_id} is cancelled; nothing changed." in again.stdout
    with so.Runtime([], store=url) as rt:
        assert rt.state_sync(session_id).seq == seq
    assert request_id


def test_cancel_with_turn_leaves_a_later_turn_alone(url: str) -> None:
    with so.Runtime([_asking()], store=url) as rt:
        first = rt.generate_sync("support", "refund 1")
        sid = first.session_id
        rt.cancel_sync(sid)
        second = rt.send_sync(sid, "refund 1 after all")
        assert second.status == "waiting" and first.turn_id and second.turn_id
        seq = rt.state_sync(sid).seq
    result = invoke("cancel", sid, "--store", url, "--turn", first.turn_id)
    assert result.exit_code == 0, result.output
    said = (
        f"Turn {first.turn_id} is not the current turn of {sid}: its turn is "
        f"{second.turn_id} (waiting); nothing cancelled."
    )
    assert said in " ".join(result.stdout.split())
    with so.Runtime([], store=url) as rt:
        state = rt.state_sync(sid)
        assert state.seq == seq and state.status == "waiting"
    done = invoke("cancel", sid, "--store", url, "--turn", second.turn_id)
    assert done.exit_code == 0 and f"cancelled turn {second.turn_id}" in done.stdout


def test_a_subagents_turn_cancelled_without_its_runtime_leaves_the_parent_to_its_own(
    url: str,
) -> None:
    """The child's cancel closes the parent's mirror of its request, and the parent's delegate
    call may go on: a process running the parent's agent does it. This command has no model
    for either agent (its runtime stands one in for each): the parent is left runnable, not
    failed for want of one."""
    agents = [support(), orders(tokens(40))]
    with so.Runtime(agents, store=url) as rt:
        r = rt.generate_sync("support", "refund 3")
        child = r.pending[0].child
        assert child is not None
    result = invoke("cancel", child.session_id, "--store", url)
    assert result.exit_code == 0, result.output
    with so.Runtime([], store=url) as rt:
        assert rt.state_sync(child.session_id).status == "cancelled"
        events = [e.type for e in rt.events_sync(r.session_id)]
        assert "turn.failed" not in events and "model.failed" not in events, events
        assert rt.state_sync(r.session_id).status == "running"  # for a process with its agent


def test_cancelling_a_parent_cancels_its_subagents_turn_too(url: str) -> None:
    with so.Runtime([support(), orders(tokens(40))], store=url) as rt:
        r = rt.generate_sync("support", "refund 3")
        child = r.pending[0].child
        assert child is not None
    result = invoke("cancel", r.session_id, "--store", url)
    assert result.exit_code == 0, result.output
    with so.Runtime([], store=url) as rt:
        assert rt.state_sync(r.session_id).status == "cancelled"
        assert rt.state_sync(child.session_id).status == "cancelled"


def test_cancel_with_the_runtime_and_its_misuses(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session_id, _ = park(url)
    target = runtime_module(tmp_path, monkeypatch, "cancelling", repr(url))
    assert refused_usage(invoke("cancel", "", "--store", url)).count("SESSION_ID is empty")
    assert "--turn is empty" in refused_usage(invoke("cancel", session_id, url, "--turn", ""))
    unknown = invoke("cancel", "ses_nope", "--store", url)
    assert unknown.exit_code == 1 and "UnknownSession" in unknown.stderr
    done = invoke("cancel", session_id, target, "--reason", "from the runtime")
    assert done.exit_code == 0 and f"of {session_id}; 1 open request(s) withdrawn" in done.stdout


def test_cancel_without_a_runtime_records_a_passed_ttl_as_every_call_does(url: str) -> None:
    """The stand-in agents carry no limits of their own: a session whose TTL passed waiting is
    expired through them (its turn failed, its request closed) and the command says so, as
    `Runtime.cancel` raises `SessionExpired`."""
    clock = ManualClock(time.time() - 3600)
    with so.Runtime([refund_agent([], ttl=60)], store=url, clock=clock) as rt:
        r = rt.generate_sync("support", "Refund order 1042")
        assert r.status == "waiting"
    result = invoke("cancel", r.session_id, "--store", url)
    assert result.exit_code == 1 and "SessionExpired" in result.stderr, result.output
    with so.Runtime([], store=url) as rt:
        state = rt.state_sync(r.session_id)
        assert state.turn is not None and (state.turn.error or {}).get("code") == "session_expired"
        assert rt.pending_sync(session_id=r.session_id) == []


def test_only_the_cancel_that_recorded_it_says_it_cancelled() -> None:
    """Two `signoff cancel`s of one turn at once: each read the turn waiting before, and both
    said they cancelled it (their open requests withdrawn), though one was recorded, with one
    reason. The one whose call did not record it (`cancelled` False) says nothing changed."""
    from signoff.cli._cancellation import _told

    ended = so.GenerateResult(status="cancelled", session_id="ses_1", turn_id="trn_1", text="")
    mine = dataclasses.replace(ended, cancelled=True)
    before = ("trn_1", "waiting")
    assert _told("ses_1", None, before, 1, mine).startswith("[green]cancelled[/] turn trn_1")
    assert _told("ses_1", None, before, 1, ended) == (
        "Nothing to cancel: ses_1 is cancelled; nothing changed."
    )
    # A turn that started between the read and the cancel, which this call cancelled.
    assert _told("ses_1", None, None, 0, mine) == "[green]cancelled[/] turn trn_1 of ses_1"
    later = dataclasses.replace(mine, turn_id="trn_2")  # its own requests withdrawn: counted
    assert _told("ses_1", None, before, 0, later) == "[green]cancelled[/] turn trn_2 of ses_1"


def test_cancel_without_a_runtime_records_a_passed_deadline_first(url: str) -> None:
    """Its stand-in agents let it record the deadline that approved the call, then cancel the
    turn it resumed: the request reads expired, and the call never runs."""
    ran: list[str] = []
    clock = ManualClock(time.time() - 3600)
    spec = so.always(expires_in=60, on_timeout="approve")
    with so.Runtime([refund_agent(ran, approval=spec)], store=url, clock=clock) as rt:
        r = rt.generate_sync("support", "Refund order 1042")
        assert r.status == "waiting"
    result = invoke("cancel", r.session_id, "--store", url)
    assert result.exit_code == 0 and "cancelled turn" in result.stdout, result.output
    # It withdrew none: the deadline closed the request first. It said "1 open request(s)
    # withdrawn", counting those open before the cancel.
    assert "withdrawn" not in result.stdout, result.output
    with so.Runtime([], store=url) as rt:
        state = rt.state_sync(r.session_id)
        assert state.turn is not None and state.turn.status == "cancelled"
        assert [q.status for q in state.requests.values()] == ["expired"]
        types = [e.type for e in rt.events_sync(r.session_id)]
        assert types.index("approval.settled") < types.index("turn.cancelled")
        assert "tool.started" not in types and ran == []


def test_cancel_after_a_subagents_deadline_says_it_withdrew_none(url: str) -> None:
    """The mirror counted open before the cancel, which `state()` shows as it is until the
    subagent's deadline is recorded: the cancel records that deadline first (the mirror reads
    `expired`), so it withdrew none; it said "1 open request(s) withdrawn"."""
    ran: list[str] = []
    clock = ManualClock(time.time() - 3600)
    spec = so.always(expires_in=60, on_timeout="deny")
    with so.Runtime(refund_desk(spec, ran), store=url, clock=clock) as rt:
        r = rt.generate_sync("support", "refund 9")
        (mirror,) = r.pending
    result = invoke("cancel", r.session_id, "--store", url)
    assert result.exit_code == 0 and "cancelled turn" in result.stdout, result.output
    assert "withdrawn" not in result.stdout, result.output
    with so.Runtime([], store=url) as rt:
        assert rt.state_sync(r.session_id).requests[mirror.id].status == "expired"
    assert ran == []
