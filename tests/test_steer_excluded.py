"""The requester four eyes excludes from settling their own call may still steer past it, as the
person the turn serves: "cancel" is one more message of theirs, not a refused answer."""

from __future__ import annotations

from typing import Any

import pytest

import signoff as so
from signoff.testing import (
    Capture,
    ExecutionLog,
    call,
    call_tools,
    reply,
    scripted_agent,
    store_contents,
)

ALICE = so.Principal(authenticator="sso", principal_id="alice")
BOB = so.Principal(authenticator="sso", principal_id="bob")

FOUR_EYES = {
    "one-approver": so.always(exclude_requester=True),
    "quorum": so.always(approvers=2, exclude_requester=True),
}


def deploy_agent(log: ExecutionLog, approval: Any, seen: Capture) -> so.Agent:
    @log.tool(approval=approval)
    async def deploy(service: str) -> str:
        """Deploy a service to production."""
        return f"{service} live"

    return scripted_agent("ops", [call_tools(call("deploy", service="api")), seen], tools=[deploy])


async def withdrawn(rt: so.Runtime, session_id: str, rid: str) -> tuple[Any, ...]:
    """How the request closed and what the model read last, as a steer leaves them."""
    stored = await rt.store.get_request(rid)
    assert stored is not None and stored.resolution is not None
    events = [e async for e in rt.events(session_id, follow=False)]
    resolved = next(e.data for e in events if e.type == "input.resolved")
    message = next(e.data for e in events if e.type == "turn.message")
    return (
        stored.status,
        stored.outcome,
        resolved["by"]["principal_id"],
        message["principal"]["principal_id"],
    )


@pytest.mark.parametrize("approval", list(FOUR_EYES.values()), ids=list(FOUR_EYES))
async def test_the_excluded_requesters_cancel_steers_as_any_other_message(
    store_url: str, approval: Any
) -> None:
    """Alice, who may not settle her own four-eyes call, typed "cancel": it was refused with
    `NotAllowed` ("may not approve their own call", though she denied), while "never mind"
    withdrew the approval all the same. Both steer now: the approval is withdrawn (`ignored`),
    the call does not run, and the model reads her message."""
    log = ExecutionLog()
    seen = Capture(reply("Not deploying."))
    async with so.Runtime([deploy_agent(log, approval, seen)], store=store_url) as rt:
        shapes = []
        for text in ("never mind", "cancel", "Cancel"):
            r = await rt.generate("ops", prompt="deploy api", auth=ALICE)
            (req,) = r.pending
            done = await rt.send(r.session_id, text, principal=ALICE)
            assert done.status == "completed" and done.pending == []
            last = seen.last[-1] if seen.last else None
            assert isinstance(last, so.UserMessage) and last.text == text
            shapes.append(await withdrawn(rt, r.session_id, req.id))
        assert shapes == [("withdrawn", "ignored", "alice", "alice")] * 3
        assert log.count() == 0
        # "approve" stays refused: a steer would withdraw the call she asked to run
        r = await rt.generate("ops", prompt="deploy api", auth=ALICE)
        before = await store_contents(rt.store, r.session_id)
        with pytest.raises(so.NotAllowed, match="the requester may not"):
            await rt.send(r.session_id, "approve", principal=ALICE)
        assert await store_contents(rt.store, r.session_id) == before
        # someone eligible who types "cancel" denies it, as before
        denied = await rt.send(r.session_id, "cancel", principal=BOB)
        assert [(o.outcome, o.applied) for o in denied.outcomes] == [("cancelled", True)]
        assert log.count() == 0


@pytest.mark.parametrize("approval", list(FOUR_EYES.values()), ids=list(FOUR_EYES))
async def test_the_excluded_requesters_deny_by_request_id_is_refused_as_a_deny(
    store_url: str, approval: Any
) -> None:
    """Alice's deny by request id was refused as if she had approved ("may not approve their own
    call"). It is refused as the deny it is, pointing her to a message, and changes nothing."""
    log = ExecutionLog()
    async with so.Runtime(
        [deploy_agent(log, approval, Capture(reply("ok")))], store=store_url
    ) as rt:
        r = await rt.generate("ops", prompt="deploy api", auth=ALICE)
        (req,) = r.pending
        before = await store_contents(rt.store, r.session_id)
        deny = so.InputResponse(request_id=req.id, option_id="cancel", text="wrong")
        attempts = [
            lambda: rt.respond(r.session_id, [deny], principal=ALICE),
            lambda: rt.generate(
                session_id=r.session_id,
                approvals=[so.Decision(id=req.id, approved=False)],
                auth=ALICE,
            ),
        ]
        for attempt in attempts:
            with pytest.raises(so.NotAllowed) as refused:
                await attempt()
            assert str(refused.value) == (
                f"request {req.id}: the requester may not deny their own call by request id; "
                "a message from them withdraws it"
            )
        with pytest.raises(so.NotAllowed, match="may not approve their own call$"):
            await rt.respond(
                r.session_id,
                [so.InputResponse(request_id=req.id, option_id="approve")],
                principal=ALICE,
            )
        assert await store_contents(rt.store, r.session_id) == before
        assert log.count() == 0
