"""What `signoff events` prints for each event of the approvals: a deadline's escalation and
approval, a quorum's vote and a response policy's refusal, each in words, not `None by -`."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

import signoff as so
from signoff.cli import app
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from ._deadline_tools import escalated, guarded, lapsed, paired

ALICE = so.Principal(authenticator="token", principal_id="alice")


async def _session(url: str) -> tuple[str, dict[str, str]]:
    """A session whose four calls wait; one vote of two counted, one answer refused, then the
    deadline passes: one escalated, one approved. Returns it and its requests by tool."""
    clock = ManualClock()
    calls = [call(name, x="1") for name in ("escalated", "lapsed", "paired", "guarded")]
    agent = scripted_agent(
        "desk",
        [call_tools(*calls), reply("done")],
        tools=[escalated, lapsed, paired, guarded],
    )
    async with so.Runtime([agent], store=url, clock=clock) as rt:
        parked = await rt.generate("desk", prompt="go", auth=ALICE)
        ids = {str(r.tool_name): r.id for r in parked.pending}
        for tool in ("paired", "guarded"):
            answer = so.InputResponse(request_id=ids[tool], option_id="approve")
            await rt.respond(parked.session_id, [answer], principal=ALICE)
        clock.advance(61)
        await rt.expire_due()
    return parked.session_id, ids


def test_events_says_what_a_deadline_a_quorum_and_a_response_policy_did(
    tmp_path: Path,
) -> None:
    """An escalation printed `approval.candidate req_… None by -: escalated`, naming no group
    (it carries `to`, no decision and no one); a deadline's approval read as approved `by -`, as
    the application's would; a quorum's vote said not how many had voted, and a response
    policy's refusal not why. Each says so now, in the channels' words."""
    url = f"sqlite:///{tmp_path}/s.db"
    session_id, ids = asyncio.run(_session(url))
    shown = CliRunner().invoke(app, ["events", session_id, "--store", url])
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()

    def said(kind: str, tool: str) -> list[str]:
        """What the lines of `kind` naming `tool`'s request say after the request's id."""
        shape = re.compile(rf" {re.escape(kind)} +{ids[tool]} (.*)$")
        return [m.group(1) for m in map(shape.search, lines) if m]

    assert said("approval.candidate", "escalated") == [
        "escalated to finance (no one decided before the deadline)"
    ]
    assert said("approval.settled", "lapsed") == ["approved automatically when the deadline passed"]
    assert said("approval.candidate", "paired") == ["approve by alice: counted (1 of 2)"]
    assert said("approval.candidate", "guarded") == [
        "approve by alice: pending",
        "approve by alice: rejected (only finance approves payouts)",
    ]
    assert "None" not in shown.stdout


def test_a_hand_damaged_event_is_summarised_as_far_as_it_goes() -> None:
    """`signoff events` read a `turn.waiting` whose `request_ids` is no list, a call or request
    of no object, as the log gives them: a bare TypeError or KeyError ended the listing of the
    whole session with a traceback (the fold does not read those fields, so the session loads)."""
    from signoff.cli._events import _summary

    def of(type_: str, data: dict[str, Any]) -> str:
        return _summary(so.Event(session_id="ses_1", seq=3, type=type_, at=0.0, data=data))  # type: ignore[arg-type]

    assert of("turn.waiting", {"on": "input", "request_ids": 7}) == "on input: "
    assert of("turn.waiting", {"on": "input", "request_ids": ["req_1", 2]}) == "on input: req_1, 2"
    calls = {"tool_calls": [7, {"id": "c1", "input": {}}, {"name": "pay", "input": {"a": 1}}]}
    masked = '"**********"'  # inputs masked whole: no agent, so no tools to read secrets by
    assert of("model.completed", calls) == f"None({masked}); pay({masked})"
    assert of("model.completed", {"text": "hi", "tool_calls": "x"}) == '"hi"'
    asked = {"requests": [None, {"kind": "question"}, {"id": "req_2", "action": "x"}]}
    assert of("input.requested", asked) == "None (question), req_2 (None)"
    assert of("input.requested", {"requests": {"id": "req_3"}}) == ""
    # a failure whose error is no object: its text is the value itself (AttributeError before)
    assert of("turn.failed", {"error": "model unavailable"}) == "model unavailable"
    assert of("turn.failed", {"error": ["boom"], "retryable": True}) == "['boom'] (retryable)"
    assert of("turn.failed", {"error": 7}) == "7"
    assert of("turn.failed", {"error": None}) == "unknown error"
    assert of("turn.failed", {"error": {"code": "max_steps"}}) == "max_steps"


def test_events_says_a_step_that_raised_raised(tmp_path: Path) -> None:
    """A journaled step that raised was printed `pay step charge -> null`, the line of a step
    that returned None: it records `error`, not `result`. It says what it raised now."""

    @so.tool
    async def pay(ctx: so.ToolContext) -> dict[str, Any]:
        """Pay."""
        looked = await ctx.step("lookup", lambda: None)

        def charge() -> None:
            raise RuntimeError("card declined")

        try:
            await ctx.step("charge", charge)
        except RuntimeError as exc:
            return {"lookup": looked, "charge_error": str(exc)}
        return {}

    async def session(url: str) -> str:
        agent = scripted_agent(
            "a", [call_tools(call("pay", call_id="c1")), reply("ok")], tools=[pay]
        )
        async with so.Runtime([agent], store=url) as rt:
            return (await rt.generate("a", prompt="go")).session_id

    url = f"sqlite:///{tmp_path}/s.db"
    shown = CliRunner().invoke(app, ["events", asyncio.run(session(url)), "--store", url])
    assert shown.exit_code == 0, shown.output
    steps = [
        line.split("tool.step", 1)[1].strip()
        for line in shown.stdout.splitlines()
        if "tool.step" in line
    ]
    assert steps == [
        "pay step lookup -> null",
        "pay step charge raised RuntimeError: card declined",
    ]


def test_a_failed_steps_line_is_cut_and_reads_a_damaged_error() -> None:
    """A failure's message is cut as a failed call's is, and an `error` of another shape (a
    hand-damaged log) is shown as far as it goes."""
    from signoff.cli._events import _summary

    def of(error: Any) -> str:
        data = {"tool_name": "pay", "name": "charge", "error": error}
        return _summary(so.Event(session_id="ses_1", seq=3, type="tool.step", at=0.0, data=data))

    long = of({"type": "ValueError", "message": "x" * 500})
    assert long == "pay step charge raised ValueError: " + "x" * 97 + "..."
    assert of({"type": "KeyError", "message": ""}) == "pay step charge raised KeyError"
    assert of("boom") == "pay step charge raised boom"
    assert of({"message": "no type"}) == "pay step charge raised no type"
