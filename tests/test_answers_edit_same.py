"""An edit that is the call as proposed is no edit (`_answer_edits.edited_input`): an API client
posting its form back unchanged was recorded as an edit, so the model was told a reviewer had
edited the arguments, the same approval without the edit was `ConflictingAnswer`, a quorum's
voter was refused and `auto(review_edits=True)` billed a review; the dashboard, comparing the
form with the proposal itself, took the same post as no edit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

import signoff as so
from signoff.models import ModelRequest
from signoff.testing import (
    Capture,
    ExecutionLog,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    tool_results,
)

from ._edits import ALICE, BOB, CAROL, asked, events_of, refund_agent

PROPOSED = {"order_id": "1042", "amount": 180.0, "note": ""}


@pytest.mark.parametrize(
    "edit",
    [PROPOSED, {"order_id": "1042", "amount": 180}],
    ids=["as-shown", "default-left-out"],
)
async def test_an_edit_that_is_the_proposal_is_no_edit(
    tmp_path: Path, edit: dict[str, Any]
) -> None:
    """The same approval without the edit is a no-op, and with it again too."""
    log = ExecutionLog()
    seen = Capture(reply("done"))
    async with sqlite_runtime(tmp_path, refund_agent(log, seen=seen)) as rt:
        sid, req, head = await asked(rt)
        assert req.input == PROPOSED
        answer = so.InputResponse(request_id=req.id, option_id="approve", edited_input=edit)
        r = await rt.respond(sid, [answer], principal=ALICE)
        assert r.status == "completed"
        [result] = tool_results(seen.conversations[0])
        assert result.content == {"refunded": 180.0, "order": "1042"}  # no note of an edit
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.resolution is not None
        assert "edited_input" not in stored.resolution
        [settled] = [e for e in await events_of(rt, sid, head) if e.type == "approval.settled"]
        assert settled.data["edited_input"] is None
        plain = so.InputResponse(request_id=req.id, option_id="approve")
        for again in (plain, answer):
            r = await rt.respond(sid, [again], principal=ALICE)
            assert [(o.outcome, o.applied) for o in r.outcomes] == [("approved", False)]
    assert [e.input for e in log.executions] == [PROPOSED]


async def test_a_plain_approval_is_repeated_by_one_with_the_form_unchanged(
    tmp_path: Path,
) -> None:
    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log)) as rt:
        sid, req, _ = await asked(rt)
        plain = so.InputResponse(request_id=req.id, option_id="approve")
        assert (await rt.respond(sid, [plain], principal=ALICE)).status == "completed"
        same = so.InputResponse(request_id=req.id, option_id="approve", edited_input=PROPOSED)
        r = await rt.respond(sid, [same], principal=ALICE)
        assert [(o.outcome, o.applied) for o in r.outcomes] == [("approved", False)]
        edited = {**PROPOSED, "amount": 100}
        other = so.InputResponse(request_id=req.id, option_id="approve", edited_input=edited)
        with pytest.raises(so.ConflictingAnswer, match="has other edited input"):
            await rt.respond(sid, [other], principal=ALICE)


async def test_a_quorum_voter_may_send_the_form_unchanged(tmp_path: Path) -> None:
    """It is a vote for the call as proposed; an edit that changes it is still refused."""
    log = ExecutionLog()
    agent = refund_agent(log, so.always(approvers=2, exclude_requester=True))
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid, req, _ = await asked(rt)
        changed = {**PROPOSED, "amount": 9999}
        vote = so.InputResponse(request_id=req.id, option_id="approve", edited_input=changed)
        with pytest.raises(so.InvalidAnswer, match="needs 2 approvers"):
            await rt.respond(sid, [vote], principal=BOB)
        for who, edit in ((BOB, PROPOSED), (CAROL, {"order_id": "1042", "amount": 180})):
            vote = so.InputResponse(request_id=req.id, option_id="approve", edited_input=edit)
            r = await rt.respond(sid, [vote], principal=who)
        assert r.status == "completed"
    assert [e.input for e in log.executions] == [PROPOSED]


async def test_the_form_of_a_tools_own_approval_posted_back_unchanged_approves_it(
    tmp_path: Path,
) -> None:
    """A tool's own approval (`ctx.request_approval`) takes no edit, but its form as shown is
    none: refused before, though the dashboard sent the same post as a plain approval."""

    @so.tool
    async def wire(ctx: so.ToolContext, to: str, amount: float) -> str:
        """Wire money."""
        ctx.request_approval({"to": to, "amount": amount})

    agent = scripted_agent(
        "a", [call_tools(call("wire", to="acme", amount=10)), reply("ok")], tools=[wire]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="wire", auth=ALICE)
        [req] = r.pending
        assert req.source == "tool"
        answer = so.InputResponse(request_id=req.id, option_id="approve", edited_input=req.input)
        assert (await rt.respond(r.session_id, [answer], principal=ALICE)).status == "completed"
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.resolution is not None
        assert stored.resolution["outcome"] == "approved"
        assert "edited_input" not in stored.resolution


async def test_a_form_holding_a_secrets_mask_posted_back_runs_with_the_secret(
    tmp_path: Path,
) -> None:
    """The form shows a secret masked: posted back unchanged it is the call as proposed, which
    runs with the secret; refused before, as an edit that would run with the mask."""
    ran: list[str] = []

    @so.tool(approval=so.always())
    async def login(user: str, token: SecretStr) -> str:
        """Log in."""
        ran.append(token.get_secret_value())
        return "in"

    proposal = call_tools(so.ToolCall(id="c1", name="login", input={"user": "u", "token": "s3"}))
    agent = scripted_agent("a", [proposal, reply("ok")], tools=[login])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        [req] = r.pending
        assert req.input == {"user": "u", "token": "**********"}
        answer = so.InputResponse(request_id=req.id, option_id="approve", edited_input=req.input)
        assert (await rt.respond(r.session_id, [answer], principal=ALICE)).status == "completed"
    assert ran == ["s3"]


async def test_auto_does_not_review_an_edit_that_is_the_proposal(tmp_path: Path) -> None:
    """`auto(review_edits=True)` reviews an edit: not the form posted back unchanged, which
    would bill a review of the very call it reviewed."""
    reviews: list[str] = []

    class Reviewer:
        async def complete(self, request: ModelRequest) -> so.ModelResponse:
            reviews.append("review")
            return so.ModelResponse(text=json.dumps({"verdict": "caution", "reason": "a refund"}))

    log = ExecutionLog()
    agent = refund_agent(log, so.auto(Reviewer(), review_edits=True))
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid, req, _ = await asked(rt)
        assert reviews == ["review"]
        answer = so.InputResponse(request_id=req.id, option_id="approve", edited_input=req.input)
        assert (await rt.respond(sid, [answer], principal=ALICE)).status == "completed"
        [settled] = [e for e in await rt.audit(sid) if e.type == "approval.settled"]
        assert "auto_verdict" not in settled.data
    assert reviews == ["review"]


async def test_an_approval_recorded_with_the_proposal_as_its_edit_is_repeated_either_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request settled before this rule, its resolution holding the proposal as its edit: the
    same answer again (a client's retry after the upgrade), and the plain approval, are no-ops,
    not `ConflictingAnswer` (the recorded edit is the call as proposed, no edit)."""
    import signoff._answers as answers

    def as_before(request: so.InputRequest, given: dict[str, Any], tool: Any) -> Any:
        return given  # what the code before recorded for a form posted back unchanged

    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log)) as rt:
        sid, req, _ = await asked(rt)
        answer = so.InputResponse(request_id=req.id, option_id="approve", edited_input=PROPOSED)
        with monkeypatch.context() as patched:
            patched.setattr(answers, "edited_input", as_before)
            assert (await rt.respond(sid, [answer], principal=ALICE)).status == "completed"
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.resolution is not None
        assert stored.resolution["edited_input"] == PROPOSED
        plain = so.InputResponse(request_id=req.id, option_id="approve")
        for again in (answer, plain):
            r = await rt.respond(sid, [again], principal=ALICE)
            assert [(o.outcome, o.applied) for o in r.outcomes] == [("approved", False)]
