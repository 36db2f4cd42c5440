"""A reply typed in a request's thread answers the session's first open request when it names
one of its options: a person who may answer the thread's request but not that first one is
refused, and nothing reaches the session."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import signoff as so
from signoff.channels import ChannelHub
from signoff.testing import call, call_tools, reply, scripted_agent

from ._slack import ALICE, APPROVERS, FakeSlack, channel, manual, refund_runtime
from ._slack_replies import ALLOWED, FIRST_TS, deliver, event, events_of, fake

__all__ = ["fake"]  # the fixture, used by name

SECOND_TS = "1700000000.000002"  # the fake's second post: the refund's message


def _runtime(tmp_path: Path) -> so.Runtime:
    """One step asks two approvals: a branch's deletion only alice (whose turn it is) may
    settle, then a refund the allow-listed Slack users may."""

    @so.tool(approval=so.ApprovalSpec(request=so.always()))
    async def delete_branch(name: str) -> str:
        """Delete a branch."""
        return name

    async def allow_listed(ctx: so.ResponseContext) -> Literal["allowed", "rejected"]:
        who = ctx.response.principal
        return "allowed" if who is not None and who.principal_id in APPROVERS else "rejected"

    @so.tool(approval=so.ApprovalSpec(request=so.always(), response=allow_listed))
    async def issue_refund(order_id: str) -> dict[str, Any]:
        """Refund an order."""
        return {"refunded": order_id}

    both = call_tools(call("delete_branch", name="main"), call("issue_refund", order_id="1042"))
    agent = scripted_agent("ops", [both, reply("Done.")], tools=[delete_branch, issue_refund])
    return so.Runtime([agent], store=f"sqlite:///{tmp_path / 'state.db'}")


async def test_a_reply_that_would_answer_a_request_not_theirs_is_refused(
    tmp_path: Path, fake: FakeSlack
) -> None:
    async with _runtime(tmp_path) as rt:
        r = await rt.generate("ops", prompt="Clean up and refund 1042", auth=ALICE)
        branch, refund = r.pending
        assert (branch.tool_name, refund.tool_name) == ("delete_branch", "issue_refund")
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            assert slack.recall(f"msg:{refund.id}")["ts"] == SECOND_TS
            before = await events_of(rt, r.session_id)
            # In the refund's thread, by someone who may approve the refund: "approve" would
            # answer the branch's deletion, the session's first open request.
            await deliver(slack, event("approve", thread=SECOND_TS, user=ALLOWED))
            await hub.poll()
        assert await events_of(rt, r.session_id) == before
        for request in (branch, refund):
            stored = await rt.store.get_request(request.id)
            assert stored is not None and stored.status == "pending"
        (note,) = fake.of("chat.postEphemeral")
        assert note["text"] == f"You may not answer request {branch.id}: nothing was sent."
        assert (note["user"], note["thread_ts"]) == (ALLOWED, SECOND_TS)


async def test_a_reply_in_the_thread_of_a_request_whose_session_was_deleted_is_told(
    tmp_path: Path, fake: FakeSlack
) -> None:
    """The thread of a closed request takes replies for seven days; once its session is
    deleted, a reply there reached no one and said nothing (only the server's log did)."""
    log: list[Any] = []
    async with refund_runtime(tmp_path, log) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        (req,) = r.pending
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack], state=tmp_path / "hub.db")) as hub:
            await hub.poll()
            bob = so.Principal(authenticator="slack", principal_id=APPROVERS[0])
            yes = so.InputResponse(request_id=req.id, option_id="approve")
            await rt.respond(req.session_id, [yes], principal=bob)
            await hub.poll()
            await rt.delete_session(req.session_id)
            await hub.poll()
            await deliver(slack, event("is this done?", event_id="Ev77", user=APPROVERS[0]))
    (note,) = fake.of("chat.postEphemeral")
    assert note["text"] == f"Your reply was not sent: request {req.id} is gone."
    assert (note["user"], note["thread_ts"]) == (APPROVERS[0], FIRST_TS)
