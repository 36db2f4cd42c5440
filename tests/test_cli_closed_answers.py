"""An answer of the wrong kind (`answer --text` of an approval, `approve` of a question) to a
request that can no longer be answered (`cli._unanswerable`): refused as the right kind is, its
session's TTL passed, its deadline passed, or answered already, not told to run a command that
would be refused in turn; nothing recorded."""

from __future__ import annotations

from typing import Any

import pytest

import signoff as so
from signoff.testing import ManualClock, call, call_tools, scripted_agent

from ._cli import agent, invoke, log, sizer, url
from ._subagents import Counted, refund_agents

__all__ = ["url"]  # the fixture, used by name

PAST = 1_600_000_000.0  # when the sessions below were asked: their TTLs and deadlines passed


def _asked_long_ago(url: str, asker: so.Agent) -> so.InputRequest:
    """The request `asker` asked at `PAST`, nothing recorded of what passed since."""
    with so.Runtime([asker], store=url, clock=ManualClock(PAST)) as rt:
        result = rt.generate_sync(asker.name, "Refund order 1042")
    assert result.status == "waiting", result.error
    return result.pending[0]


def _refused(url: str, request: so.InputRequest, *args: str) -> str:
    """The one line a command answering `request` is refused with, its session's log (and a
    subagent's) left as it was."""
    sessions = [request.session_id, *([request.child.session_id] if request.child else [])]
    before = [log(url, s) for s in sessions]
    result = invoke(*args, request.id, "--store", url)
    assert result.exit_code == 1, result.output
    assert [log(url, s) for s in sessions] == before
    return str(result.stderr)


@pytest.mark.parametrize("given", [["--text", "hi"], ["--option", "1"]])
def test_answering_an_approval_past_its_sessions_ttl_says_it_expired(
    url: str, given: list[str]
) -> None:
    """It said to run `signoff approve ... --store ...`, which was refused `SessionExpired`."""
    short = so.Agent(
        name="support",
        model=agent.model,
        tools=list(agent.tools.values()),
        limits=so.Limits(ttl=60),
    )
    request = _asked_long_ago(url, short)
    told = _refused(url, request, "answer", *given)
    assert told == (
        f"error: SessionExpired: session {request.session_id!r} expired with pending "
        f"requests {request.id}\n"
    )
    assert invoke("approve", request.id, "--store", url).stderr == told  # as approve is


def test_approving_a_question_past_its_sessions_ttl_says_it_expired(url: str) -> None:
    short = so.Agent(
        name="sizer", model=sizer.model, tools=list(sizer.tools.values()), limits=so.Limits(ttl=60)
    )
    question = _asked_long_ago(url, short)
    told = _refused(url, question, "approve")
    assert told.startswith(f"error: SessionExpired: session {question.session_id!r} expired")


@pytest.mark.parametrize("on_timeout", ["deny", "approve"])
def test_answering_an_approval_past_its_deadline_says_it_closed(url: str, on_timeout: Any) -> None:
    """It said to run `signoff approve`, refused `RequestClosed` once it recorded the deadline."""

    @so.tool(approval=so.always(expires_in=60, on_timeout=on_timeout))
    async def wire(to: str) -> str:
        """Wire money."""
        return "sent"

    desk = scripted_agent("desk", [call_tools(call("wire", to="bob"))], tools=[wire])
    request = _asked_long_ago(url, desk)
    told = _refused(url, request, "answer", "--text", "hi")
    closed = "is expired" if on_timeout == "deny" else "was approved automatically"
    assert told.startswith(f"error: RequestClosed: request {request.id} {closed}"), told
    assert told.endswith("; it takes no answers\n"), told
    assert invoke("approve", request.id, "--store", url).stderr == told  # as approve is


def test_an_approval_whose_deadline_escalates_it_still_names_the_commands(url: str) -> None:
    """Escalated, not closed, by its deadline: it takes an approval still, as the hint says."""

    @so.tool(approval=so.always(expires_in=60, on_timeout="escalate", escalate_to="ops"))
    async def wire(to: str) -> str:
        """Wire money."""
        return "sent"

    desk = scripted_agent("desk", [call_tools(call("wire", to="bob"))], tools=[wire])
    request = _asked_long_ago(url, desk)
    told = invoke("answer", request.id, "--text", "hi", "--store", url)
    assert told.exit_code == 1, told.output
    assert f"is an approval (wire), not a question: signoff approve {request.id}" in told.stderr


@pytest.mark.parametrize(("decide", "said"), [("approve", "approved"), ("deny", "denied")])
def test_answering_an_approval_decided_before_says_how(url: str, decide: str, said: str) -> None:
    """It said to run `signoff approve`, which said it was already approved (nothing changed),
    or was refused `ConflictingAnswer`."""
    with so.Runtime([agent], store=url) as rt:
        [request] = rt.generate_sync("support", "Refund order 1042").pending
    assert invoke(decide, request.id, "--store", url).exit_code == 0
    told = _refused(url, request, "answer", "--text", "hi")
    assert told == (
        f"error: RequestClosed: request {request.id} was already {said}; it takes no answers\n"
    )


def test_approving_a_question_answered_before_says_it_was(url: str) -> None:
    with so.Runtime([sizer], store=url) as rt:
        question = rt.generate_sync("sizer", "I want coffee").pending[0]
    assert invoke("answer", question.id, "--option", "1", "--store", url).exit_code == 0
    told = _refused(url, question, "deny")
    assert told == (
        f"error: RequestClosed: request {question.id} was already answered; it takes no answers\n"
    )


def test_answering_a_mirror_whose_subagents_request_closed_says_so(url: str) -> None:
    """A parent's mirror, still open, of a subagent's approval that was decided in the
    subagent's own session: refused naming both, as an approval through the mirror is told."""
    parent, child = refund_agents([], Counted("done"))
    with so.Runtime([parent, child], store=url) as rt:
        [mirror] = rt.generate_sync("support", "Refund order 1042").pending
        assert mirror.child is not None
        below = so.InputResponse(request_id=mirror.child.request_id, option_id="approve")
        rt.respond_sync(mirror.child.session_id, [below], resume=False)
    told = _refused(url, mirror, "answer", "--text", "hi")
    assert told == (
        f"error: RequestClosed: request {mirror.id} (asked for billing's "
        f"{mirror.child.request_id}) was already approved; it takes no answers\n"
    )


def test_answering_a_mirror_past_its_subagents_ttl_says_it_expired(url: str) -> None:
    parent, child = refund_agents([], Counted("done"))
    child = so.Agent(
        name=child.name,
        model=child.model,
        tools=list(child.tools.values()),
        limits=so.Limits(ttl=60),
    )
    with so.Runtime([parent, child], store=url, clock=ManualClock(PAST)) as rt:
        [mirror] = rt.generate_sync("support", "Refund order 1042").pending
    told = _refused(url, mirror, "answer", "--text", "hi")
    assert told == f"error: RequestClosed: request {mirror.id} is expired; it takes no answers\n"
