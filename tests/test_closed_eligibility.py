"""An answer to a closed request from someone who could not have answered it open is refused
as it would have been then (`NotAllowed`, or the response policy's verdict), not told whether
or how the request was settled; nothing is recorded either way."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

import signoff as so
from signoff.testing import ExecutionLog, call, call_tools, reply, scripted_agent, store_contents

ALICE = so.Principal(authenticator="sso", principal_id="alice")
BOB = so.Principal(authenticator="sso", principal_id="bob")
CAROL = so.Principal(authenticator="sso", principal_id="carol")


def deploy_agent(log: ExecutionLog, approval: Any) -> so.Agent:
    @log.tool(approval=approval)
    async def deploy(service: str) -> str:
        """Deploy a service to production."""
        return f"{service} live"

    return scripted_agent(
        "ops", [call_tools(call("deploy", service="api")), reply("done")], tools=[deploy]
    )


def vote(request_id: str, decision: str = "approve") -> list[so.InputResponse]:
    return [so.InputResponse(request_id=request_id, option_id=decision)]


def only_bob(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
    who = ctx.response.principal
    if who is not None and who.principal_id == "bob":
        return so.Allowed()
    return so.Rejected("only bob settles deploys")


async def test_a_stranger_is_refused_whether_the_request_is_open_or_settled(
    store_url: str,
) -> None:
    """Carol may not answer alice's approval: refused while it is open; once alice approved
    it, carol's approve came back a no-op (`applied` false, `approved`) and her deny a
    conflict, telling her how it was settled. Both are refused as before, on every path."""
    log = ExecutionLog()
    async with so.Runtime([deploy_agent(log, so.always())], store=store_url) as rt:
        r = await rt.generate("ops", prompt="deploy", auth=ALICE)
        sid, rid = r.session_id, r.pending[0].id
        with pytest.raises(so.NotAllowed) as opened:
            await rt.respond(sid, vote(rid), principal=CAROL)
        done = await rt.respond(sid, vote(rid), principal=ALICE)
        assert done.status == "completed"
        before = await store_contents(rt.store, sid)
        for decision in ("approve", "cancel"):
            with pytest.raises(so.NotAllowed) as closed:
                await rt.respond(sid, vote(rid, decision), principal=CAROL)
            assert str(closed.value) == str(opened.value)
            assert closed.value.request_ids == [rid]
            with pytest.raises(so.NotAllowed):
                await rt.respond(sid, vote(rid, decision), principal=CAROL, resume=False)
        for approved in (True, False):
            with pytest.raises(so.NotAllowed):
                await rt.generate(
                    session_id=sid, approvals=[so.Decision(id=rid, approved=approved)], auth=CAROL
                )
        with pytest.raises(so.NotAllowed):
            await rt.respond(sid, vote(rid), principal=None)
        assert await store_contents(rt.store, sid) == before
        # the one who may answer still hears that it was settled so
        again = await rt.respond(sid, vote(rid), principal=ALICE)
        assert again.outcomes == [so.Outcome(request_id=rid, outcome="approved", applied=False)]
        with pytest.raises(so.ConflictingAnswer):
            await rt.respond(sid, vote(rid, "cancel"), principal=ALICE)
        assert await store_contents(rt.store, sid) == before
        assert log.count() == 1


async def test_a_stranger_is_not_told_that_a_request_was_withdrawn(store_url: str) -> None:
    """Alice steered past her approval (withdrawn): carol's answer to it was `RequestClosed`,
    which the request open refused with `NotAllowed`."""
    log = ExecutionLog()
    async with so.Runtime([deploy_agent(log, so.always())], store=store_url) as rt:
        r = await rt.generate("ops", prompt="deploy", auth=ALICE)
        sid, rid = r.session_id, r.pending[0].id
        await rt.send(sid, "actually, do not", principal=ALICE)
        stored = await rt.store.get_request(rid)
        assert stored is not None and stored.status == "withdrawn"
        before = await store_contents(rt.store, sid)
        with pytest.raises(so.NotAllowed):
            await rt.respond(sid, vote(rid), principal=CAROL)
        with pytest.raises(so.RequestClosed):
            await rt.respond(sid, vote(rid), principal=ALICE)
        assert await store_contents(rt.store, sid) == before


async def test_the_excluded_requester_is_refused_once_another_approved(store_url: str) -> None:
    """Four eyes: bob approved alice's call; alice repeating an answer to it is refused as it
    was while it was open, not told it was approved (or that her deny conflicts)."""
    log = ExecutionLog()
    agent = deploy_agent(log, so.always(exclude_requester=True))
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("ops", prompt="deploy", auth=ALICE)
        sid, rid = r.session_id, r.pending[0].id
        assert (await rt.respond(sid, vote(rid), principal=BOB)).status == "completed"
        before = await store_contents(rt.store, sid)
        for decision in ("approve", "cancel"):
            with pytest.raises(so.NotAllowed, match="the requester may not"):
                await rt.respond(sid, vote(rid, decision), principal=ALICE)
        with pytest.raises(so.NotAllowed, match="identified approver"):
            await rt.respond(sid, vote(rid), principal=None)
        assert await store_contents(rt.store, sid) == before
        assert log.count() == 1


async def test_a_responder_the_policy_rejects_gets_its_verdict_on_a_settled_request(
    store_url: str,
) -> None:
    """Under a response policy that lets only bob settle, carol's approve of a request bob had
    approved came back `approved` (a no-op) and her deny a conflict; she gets the policy's
    verdict, as while it was open, and nothing is recorded for it."""
    log = ExecutionLog()
    agent = deploy_agent(log, so.ApprovalSpec(request=so.always(), response=only_bob))
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("ops", prompt="deploy", auth=ALICE)
        sid, rid = r.session_id, r.pending[0].id
        opened = await rt.respond(sid, vote(rid), principal=CAROL)
        rejected = so.Outcome(
            request_id=rid, outcome="rejected", applied=False, reason="only bob settles deploys"
        )
        assert opened.outcomes == [rejected]
        assert (await rt.respond(sid, vote(rid), principal=BOB)).status == "completed"
        before = await store_contents(rt.store, sid)
        for decision in ("approve", "cancel"):
            closed = await rt.respond(sid, vote(rid, decision), principal=CAROL)
            assert closed.outcomes == [rejected]
        assert await store_contents(rt.store, sid) == before
        again = await rt.respond(sid, vote(rid), principal=BOB)
        assert again.outcomes == [so.Outcome(request_id=rid, outcome="approved", applied=False)]
        assert log.count() == 1


async def test_over_http_and_the_client_a_stranger_is_refused_on_a_settled_request(
    store_url: str,
) -> None:
    """Bob sees alice's session (one tenant) but may not answer her approval: a 403 while it
    is open, and still a 403 (`NotAllowed` through the client) once alice approved it, where
    he got a 200 saying it was approved, or a 409 saying his deny conflicts."""
    from signoff.server import AsyncClient, TokenAuth, create_app

    from .test_server_common import TOKENS, make_agents

    runtime = so.Runtime(make_agents(), store=store_url)
    app = create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None, close_runtime=True)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        AsyncClient("http://t", token="alice-token", transport=transport) as alice,
        AsyncClient("http://t", token="bob-token", transport=transport) as bob,
    ):
        r = await alice.generate("support", "Refund order 1042, it broke")
        sid, rid = r.session_id, r.pending[0].id
        url = f"http://t/v1/sessions/{sid}/responses"
        body = {"inputResponses": [{"requestId": rid, "optionId": "approve"}]}
        headers = {"Authorization": "Bearer bob-token"}
        async with httpx.AsyncClient(transport=transport) as raw:
            opened = await raw.post(url, json=body, headers=headers)
            assert opened.status_code == 403, opened.text
            await alice.respond(sid, [{"request_id": rid, "option_id": "approve"}])
            before = await store_contents(runtime.store, sid)
            for decision in ("approve", "cancel"):
                body["inputResponses"][0]["optionId"] = decision
                closed = await raw.post(url, json=body, headers=headers)
                assert closed.status_code == 403, closed.text
                assert closed.json()["error"]["code"] == "not_allowed"
                assert closed.json()["error"]["message"] == opened.json()["error"]["message"]
            approvals = {"approvals": [{"id": rid, "approved": True}]}
            closed = await raw.post(
                f"http://t/v1/sessions/{sid}/approvals", json=approvals, headers=headers
            )
            assert closed.status_code == 403, closed.text
        with pytest.raises(so.NotAllowed):
            await bob.respond(sid, [{"request_id": rid, "option_id": "approve"}])
        assert await store_contents(runtime.store, sid) == before
