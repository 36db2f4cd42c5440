"""Quorum votes and voters at the edges: a repeat vote through a response policy, a dead
vote the tool no longer takes, and a principal that names no one."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

import signoff as so
import signoff._mirrors as _mirrors
from signoff._candidates import RECOVERY_GRACE
from signoff._live_session import LiveSession
from signoff.channels import Channel, ChannelHub, Resolution
from signoff.server import AsyncClient, DevAuth, TokenAuth, create_app
from signoff.stores import PendingFilter
from signoff.testing import (
    ExecutionLog,
    ManualClock,
    call,
    call_tools,
    reply,
    scripted_agent,
    store_contents,
)
from tests._channels import manual
from tests._delegation import refund_desk
from tests.test_live_session_mirrors import Over
from tests.test_quorum import ALICE, BOB, CAROL, asked, deploy_agent, events_of, vote


async def test_a_repeat_vote_through_a_response_policy_closes_its_candidate(
    store_url: str,
) -> None:
    """Two votes by one person while a response policy judges the first (a double click): the
    second to count finds the first counted. Its pending candidate was once left open, so every
    later drive judged it again (the policy ran once more each time) and its trail never said
    what became of it. Now the second waits for the first's verdict rather than being judged
    beside it (the same answer is recorded once) and records nothing."""
    judged: list[str] = []
    first_in, release = asyncio.Event(), asyncio.Event()

    async def anyone(ctx: so.ResponseContext) -> so.Allowed:
        judged.append(ctx.response.principal.principal_id if ctx.response.principal else "?")
        first_in.set()
        await release.wait()
        return so.Allowed()

    log = ExecutionLog()
    spec: Any = so.ApprovalSpec(
        request=so.always(), response=anyone, approvers=3, exclude_requester=True
    )
    clock = ManualClock()
    async with so.Runtime([deploy_agent(log, spec)], store=store_url, clock=clock) as rt:
        sid, req, head = await asked(rt)
        votes = [
            asyncio.create_task(rt.respond(sid, vote(req.id), principal=BOB)) for _ in range(2)
        ]
        await first_in.wait()
        await asyncio.sleep(0.3)  # the second is in, waiting on the first's verdict
        release.set()
        outcomes = sorted((r.outcomes[0] for r in await asyncio.gather(*votes)), key=str)
        assert [(o.outcome, o.applied, o.reason) for o in outcomes] == [
            ("counted", False, "already counted: 1 of 3"),
            ("counted", True, "1 of 3"),
        ]
        assert (await rt.state(sid)).candidates == {}
        events = await events_of(rt, sid, head)
        ends = [e.data["outcome"] for e in events if e.type == "approval.candidate"]
        assert ends == ["pending", "counted"]
        clock.advance(10 + RECOVERY_GRACE + 1)  # past the policy's timeout: nothing is lost
        r = await rt.respond(sid, vote(req.id), principal=CAROL)
        assert r.outcomes[0].reason == "2 of 3"
        assert judged == ["bob", "carol"]
        assert (await rt.state(sid)).pending_requests()[0].approved_by == ["bob", "carol"]
        assert log.count() == 0
        assert ALICE.principal_id not in judged


async def test_a_repeat_vote_records_nothing_where_a_response_policy_runs(
    store_url: str,
) -> None:
    """A vote already counted, given again, is a no-op that records nothing, as it is without
    a response policy: it recorded a candidate, ran the policy again and closed it."""
    judged: list[str] = []

    def anyone(ctx: so.ResponseContext) -> so.Allowed:
        judged.append(ctx.response.principal.principal_id if ctx.response.principal else "?")
        return so.Allowed()

    log = ExecutionLog()
    spec: Any = so.ApprovalSpec(
        request=so.always(), response=anyone, approvers=2, exclude_requester=True
    )
    async with so.Runtime([deploy_agent(log, spec)], store=store_url) as rt:
        sid, req, _ = await asked(rt)
        await rt.respond(sid, vote(req.id), principal=BOB)
        before = await store_contents(rt.store, sid)
        bob_cli = so.Principal(authenticator="local", principal_id="bob")
        for who in (BOB, bob_cli):
            again = await rt.respond(sid, vote(req.id), principal=who)
            assert again.outcomes == [
                so.Outcome(
                    request_id=req.id,
                    outcome="counted",
                    applied=False,
                    reason="already counted: 1 of 2",
                )
            ]
        assert await store_contents(rt.store, sid) == before
        assert judged == ["bob"]
        r = await rt.respond(sid, vote(req.id, "cancel"), principal=BOB)  # a deny still denies
        assert r.outcomes[0].outcome == "cancelled" and judged == ["bob", "bob"]
        assert log.count() == 0


def _deployer(log: ExecutionLog, *, regions: bool) -> so.Agent:
    """The ops agent whose deploy tool a response policy guards; with `regions`, as a later
    release has it: a `region` it must be told."""
    spec: Any = so.ApprovalSpec(request=so.always(), response=lambda ctx: so.Allowed())
    if regions:

        @log.tool(approval=spec, name="deploy")
        async def deploy_to(service: str, version: str, region: str) -> str:
            """Deploy a service to production in one region."""
            return f"{service}@{version} live in {region}"

        tool: Any = deploy_to
    else:

        @log.tool(approval=spec)
        async def deploy(service: str, version: str) -> str:
            """Deploy a service to production."""
            return f"{service}@{version} live"

        tool = deploy
    return scripted_agent(
        "ops",
        [call_tools(call("deploy", service="api", version="2.0")), reply("done")],
        tools=[tool],
    )


async def test_a_dead_candidate_whose_edit_no_longer_fits_the_tool_is_spent(
    store_url: str,
) -> None:
    """A response recorded pending by a process that died while the policy ran is judged again
    later, maybe by a release whose tool takes other input: its edit no longer fitting raised
    `InvalidAnswer` out of every drive of the session, so no call could move it. It is spent
    (stale, saying why) and the request stays open for an answer that fits."""
    log = ExecutionLog()
    clock = ManualClock()
    async with so.Runtime([_deployer(log, regions=False)], store=store_url, clock=clock) as rt:
        r = await rt.generate("ops", prompt="deploy api 2.0", auth=ALICE)
        (req,) = r.pending
        dead = {
            "request_id": req.id,
            "call_id": req.call_id,
            "candidate_id": "cand_dead",
            "decision": "approve",
            "by": ALICE.model_dump(),
            "outcome": "pending",
            "text": None,
            "value": None,
            "edited_input": {"service": "api", "version": "2.1"},
        }
        driver = rt._driver((await rt.state(r.session_id)).copy(), None)
        await driver.record([("approval.candidate", dead)], durable=True)
    clock.advance(10 + RECOVERY_GRACE + 1)
    async with so.Runtime([_deployer(log, regions=True)], store=store_url, clock=clock) as rt:
        again = await rt.generate(session_id=r.session_id)
        assert again.status == "waiting"
        assert [p.id for p in again.pending] == [req.id]
        state = await rt.state(r.session_id)
        assert state.candidates == {}
        events = await events_of(rt, r.session_id)
        ends = [e for e in events if e.type == "approval.candidate"]
        spent = ends[-1].data
        assert (spent["outcome"], spent["candidate_id"]) == ("stale", "cand_dead")
        assert "region" in spent["reason"]
        edit = {"service": "api", "version": "2.1", "region": "eu"}
        answer = so.InputResponse(request_id=req.id, option_id="approve", edited_input=edit)
        done = await rt.respond(r.session_id, [answer], principal=ALICE)
        assert done.status == "completed"
        assert log.count() == 1


BLANK = [
    so.Principal(authenticator="sso", principal_id=""),
    so.Principal(authenticator="sso", principal_id=" \t"),
    so.Principal(authenticator="", principal_id="bob"),
    so.Principal(authenticator="sso", principal_id="\u200b"),  # shows no one either
    so.Principal(authenticator="\u2060\u00ad", principal_id="bob"),
]


async def test_a_principal_with_a_blank_id_is_refused_as_no_one(store_url: str) -> None:
    """A principal whose id (or authenticator) is blank names no one (an authenticator that
    read a missing header as ""): it counted as a voter, every such caller the same one, and
    each was 'the person whose turn asked' of the others' turns. Refused, nothing recorded."""
    log = ExecutionLog()
    agent = deploy_agent(log, so.always(approvers=2, exclude_requester=True))
    async with so.Runtime([agent], store=store_url) as rt:
        sid, req, _ = await asked(rt)
        before = await store_contents(rt.store, sid)
        for who in BLANK:
            with pytest.raises(so.UsageError, match="principal.*blank"):
                await rt.respond(sid, vote(req.id), principal=who)
            with pytest.raises(so.UsageError, match="principal.*blank"):
                await rt.send(sid, "approve", principal=who)
            with pytest.raises(so.UsageError, match="auth.*blank"):
                await rt.generate(
                    session_id=sid, approvals=[so.Decision(id=req.id, approved=True)], auth=who
                )
            with pytest.raises(so.UsageError, match="auth.*blank"):
                await rt.generate("ops", prompt="deploy api 2.0", auth=who)
        assert await store_contents(rt.store, sid) == before


@pytest.mark.parametrize("who", BLANK)
def test_an_api_token_of_a_blank_principal_is_refused(who: so.Principal) -> None:
    with pytest.raises(so.UsageError, match="API token #1.*blank"):
        TokenAuth({"s3cret-token": who})


@pytest.mark.parametrize("who", BLANK)
def test_a_dev_principal_that_is_blank_is_refused(who: so.Principal) -> None:
    with pytest.raises(so.UsageError, match="DevAuth's principal names no one: its .* is blank"):
        DevAuth(who)


@pytest.mark.parametrize(
    "approval",
    [
        so.ApprovalSpec(so.never(), approvers=2, exclude_requester=True),
        so.always(approvers=2, exclude_requester=True),
    ],
    ids=["spec-never", "always"],
)
async def test_a_tool_raised_approval_keeps_the_tools_quorum_and_four_eyes(
    store_url: str, approval: Any
) -> None:
    """The approval a tool asks for itself (`ctx.request_approval`) is gathered by the tool's
    rules too: it carried none of them, so the requester alone approved their own payload
    under `approvers=2, exclude_requester=True` (on both stores)."""

    @so.tool(approval=approval)
    async def wire(ctx: so.ToolContext, to: str, amount: float) -> str:
        """Wire money."""
        ctx.request_approval({"to": to, "amount": amount})
        return "unreachable"

    agent = scripted_agent(
        "bank", [call_tools(call("wire", to="acme", amount=10)), reply("ok")], tools=[wire]
    )
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("bank", prompt="wire 10 to acme", auth=ALICE)
        sid = r.session_id
        if r.pending[0].source == "policy":  # always(): its own quorum first
            for who in (BOB, CAROL):
                r = await rt.respond(sid, vote(r.pending[0].id), principal=who)
        (req,) = r.pending
        assert req.source == "tool"
        assert (req.approvers, req.distinct, req.exclude_requester) == (2, True, True)
        before = await store_contents(rt.store, sid)
        with pytest.raises(so.NotAllowed, match="the requester may not approve"):
            await rt.respond(sid, vote(req.id), principal=ALICE)
        assert await store_contents(rt.store, sid) == before
        counted = await rt.respond(sid, vote(req.id), principal=BOB)
        assert counted.status == "waiting"
        assert counted.outcomes[0].outcome == "counted"
        again = await rt.respond(sid, vote(req.id), principal=BOB)
        assert again.outcomes[0].applied is False
        done = await rt.respond(sid, vote(req.id), principal=CAROL)
        assert done.status == "completed"
        assert done.outcomes == [so.Outcome(request_id=req.id, outcome="approved", applied=True)]
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.resolution is not None
        assert stored.resolution["approved_by"] == ["bob", "carol"]


class Closes(Channel):
    """Records each request as a channel is told it closed."""

    def __init__(self) -> None:
        super().__init__(name="closes")
        self.closed: list[so.InputRequest] = []

    async def on_resolved(self, request: so.InputRequest, resolution: Resolution) -> None:
        self.closed.append(request)


def leads(ctx: so.ResponseContext) -> so.Allowed:
    return so.Allowed()


def _two_votes(judged: bool) -> Any:
    """An approval two people other than the requester give: by the quorum alone, or `judged`
    by a response policy too (`leads`)."""
    if judged:
        return so.ApprovalSpec(
            request=so.always(), response=leads, approvers=2, exclude_requester=True
        )
    return so.always(approvers=2, exclude_requester=True)


@pytest.mark.parametrize("judged", [False, True], ids=["quorum", "response-policy"])
async def test_a_settled_quorum_reads_every_vote_that_approved_it(
    store_url: str, judged: bool
) -> None:
    """Bob and then Carol approved a call that needs two: its approval records both, yet the
    request as stored (and so as `get_request`, the listings, the HTTP API and the channels read
    it) kept Bob's alone, `1 of 2`, its last vote only in its resolution."""
    log = ExecutionLog()
    spec = _two_votes(judged)
    both = ["bob", "carol"]
    async with so.Runtime([deploy_agent(log, spec)], store=store_url) as rt:
        closes = Closes()
        async with manual(ChannelHub(rt, [closes])) as hub:
            sid, req, _ = await asked(rt)
            await rt.respond(sid, vote(req.id), principal=BOB)
            r = await rt.respond(sid, vote(req.id), principal=CAROL)
            assert r.status == "completed" and log.count() == 1
            await hub.poll()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.resolution is not None
        assert (stored.status, stored.resolution["approved_by"]) == ("settled", both)
        assert (stored.request.approved_by, stored.request.progress) == (both, "2 of 2")
        flt = PendingFilter(session_id=sid, status="settled", limit=10)
        assert [q.approved_by for q in (await rt.pending_page(flt))[0]] == [both]
        assert [q.approved_by for q in closes.closed] == [both]
        app = create_app(rt, auth=TokenAuth({"alice-token": ALICE}), sweep_every=None)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app),
                base_url="http://t",
                headers={"Authorization": "Bearer alice-token"},
            ) as c,
        ):
            one = (await c.get(f"/v1/requests/{req.id}")).json()
            page = (await c.get("/v1/requests", params={"status": "settled"})).json()
        assert one["request"]["approved_by"] == both
        assert [q["approved_by"] for q in page["items"]] == [both]
        assert await rt.verify_audit() == []  # the row's last vote is the trail's


async def test_a_denied_quorum_keeps_the_votes_it_counted(store_url: str) -> None:
    """A deny is no vote: the request denied after Bob's approval holds Bob's alone."""
    log = ExecutionLog()
    spec = so.always(approvers=2, exclude_requester=True)
    async with so.Runtime([deploy_agent(log, spec)], store=store_url) as rt:
        sid, req, _ = await asked(rt)
        await rt.respond(sid, vote(req.id), principal=BOB)
        await rt.respond(sid, vote(req.id, "cancel"), principal=CAROL)
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.outcome == "cancelled"
        assert (stored.request.approved_by, stored.request.progress) == (["bob"], "1 of 2")
        assert await rt.verify_audit() == []


def _shown(live: LiveSession, request_id: str) -> tuple[str, list[str], str]:
    view = live.requests[request_id]
    return view.status, view.request.approved_by, view.request.progress


@pytest.mark.parametrize("judged", [False, True], ids=["quorum", "response-policy"])
async def test_state_reads_every_vote_of_a_settled_quorum_as_its_row_does(
    store_url: str, judged: bool
) -> None:
    """Bob and then Carol approved a call that needs two: its row holds both, yet `state()`,
    folded from the events, kept the votes `approval.candidate` counted, Bob's alone ("1 of 2"),
    and so did a `LiveSession`, which folds the stream alike (in process and over HTTP)."""
    log = ExecutionLog()
    spec = _two_votes(judged)
    both = ["bob", "carol"]
    async with so.Runtime([deploy_agent(log, spec)], store=store_url) as rt:
        sid, req, _ = await asked(rt)
        await rt.respond(sid, vote(req.id), principal=BOB)
        await rt.respond(sid, vote(req.id), principal=CAROL)
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.request.approved_by == both
        folded = (await rt.state(sid)).requests[req.id]
        assert (folded.status, folded.outcome) == ("settled", "approved")
        assert (folded.request.approved_by, folded.request.progress) == (both, "2 of 2")
        row = {"status"}  # the row's own; the fold keeps it beside (`folded.status`)
        assert folded.request.model_dump(exclude=row) == stored.request.model_dump(exclude=row)
        live = LiveSession(Over(rt, ALICE), sid)
        await live.sync()
        assert _shown(live, req.id) == ("settled", both, "2 of 2")
        app = create_app(rt, auth=TokenAuth({"alice-token": ALICE}), sweep_every=None)
        transport = httpx.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            AsyncClient("http://t", token="alice-token", transport=transport) as c,
        ):
            remote = await c.session(sid)
            assert _shown(remote, req.id) == ("settled", both, "2 of 2")
    async with so.Runtime([deploy_agent(log, spec)], store=store_url) as rt:  # loaded afresh
        assert (await rt.state(sid)).requests[req.id].request.approved_by == both
        assert await rt.verify_audit() == []


async def test_a_closed_mirror_reads_its_subagents_votes_in_state(store_url: str) -> None:
    """Bob and Carol approved the subagent's request through the parent's mirror: the mirror's
    row holds their votes once closed, yet the parent's `state()` kept its own copy's `[]`
    ("0 of 2"), and the subagent's `state()` Bob's vote alone; a `LiveSession` on the parent
    (which folds the mirror's close) showed the same."""
    ran: list[str] = []
    carol = so.Principal(authenticator="test", principal_id="carol")
    async with so.Runtime(refund_desk(so.always(approvers=2), ran), store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 9", auth=ALICE)
        (mirror,) = r.pending
        child = mirror.child
        assert child is not None
        live = LiveSession(Over(rt, ALICE), r.session_id)
        await live.sync()
        for who in (BOB, carol):
            answer = so.InputResponse(request_id=mirror.id, option_id="approve")
            await rt.respond(r.session_id, [answer], principal=who)
        assert ran == ["9"]
        await live.sync()
        both = ["bob", "carol"]
        assert _shown(live, mirror.id) == ("settled", both, "2 of 2")
        for sid, rid in ((r.session_id, mirror.id), (child.session_id, child.request_id)):
            folded = (await rt.state(sid)).requests[rid]
            stored = await rt.store.get_request(rid)
            assert stored is not None and folded.status == "settled"
            assert folded.request.approved_by == stored.request.approved_by == both
        assert await rt.verify_audit() == []


@pytest.mark.parametrize("closed_by", ["deny-through-mirror", "deny-on-subagent", "deadline"])
async def test_a_mirror_closed_unapproved_keeps_its_subagents_votes(
    store_url: str, closed_by: str
) -> None:
    """Bob approved through the parent's mirror of a call that needs two, then Carol denied it
    (through the mirror or on the subagent's request) or its deadline passed: the subagent's
    request kept Bob's vote ("1 of 2"), yet the mirror's close recorded none (only an
    approval's did), so its row, `state()` and a `LiveSession` read "0 of 2" once closed."""
    ran: list[str] = []
    clock = ManualClock()
    spec = so.always(approvers=2, exclude_requester=True, expires_in=60)
    async with so.Runtime(refund_desk(spec, ran), store=store_url, clock=clock) as rt:
        r = await rt.generate("support", prompt="refund 9", auth=ALICE)
        (mirror,) = r.pending
        child = mirror.child
        assert child is not None
        live = LiveSession(Over(rt, ALICE), r.session_id)
        await live.sync()
        await rt.respond(r.session_id, vote(mirror.id), principal=BOB)
        if closed_by == "deny-through-mirror":
            await rt.respond(r.session_id, vote(mirror.id, "cancel"), principal=CAROL)
        elif closed_by == "deny-on-subagent":
            await rt.respond(child.session_id, vote(child.request_id, "cancel"), principal=CAROL)
        else:
            clock.advance(61)
            assert await rt.expire_due() >= 1
        status = "expired" if closed_by == "deadline" else "settled"
        await live.sync()
        assert _shown(live, mirror.id) == (status, ["bob"], "1 of 2")
        for sid, rid in ((r.session_id, mirror.id), (child.session_id, child.request_id)):
            folded = (await rt.state(sid)).requests[rid]
            stored = await rt.store.get_request(rid)
            assert stored is not None and (folded.status, stored.status) == (status, status)
            assert folded.request.approved_by == stored.request.approved_by == ["bob"]
            assert stored.request.progress == "1 of 2"
        assert ran == [] and await rt.verify_audit() == []
    async with so.Runtime(refund_desk(spec, ran), store=store_url, clock=clock) as rt:
        assert (await rt.state(r.session_id)).requests[mirror.id].request.approved_by == ["bob"]


async def test_a_denied_mirror_an_older_signoff_closed_reads_as_it_did(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older signoff closed a denied mirror recording no votes, its row keeping the `[]` it
    was asked with: its session reads that as before (no vote on the mirror, Bob's on the
    subagent's request) and verification names nothing."""
    ran: list[str] = []
    spec = so.always(approvers=2, exclude_requester=True)
    with monkeypatch.context() as older:
        older.setattr(_mirrors, "_votes_of", lambda asked, resolution: {})
        async with so.Runtime(refund_desk(spec, ran), store=store_url) as rt:
            r = await rt.generate("support", prompt="refund 9", auth=ALICE)
            (mirror,) = r.pending
            await rt.respond(r.session_id, vote(mirror.id), principal=BOB)
            await rt.respond(r.session_id, vote(mirror.id, "cancel"), principal=CAROL)
            events = await rt.store.read_events(r.session_id)
    closes = [e.data for e in events if e.type == "input.resolved"]
    assert [d["outcome"] for d in closes] == ["cancelled"] and "approved_by" not in closes[0]
    async with so.Runtime(refund_desk(spec, ran), store=store_url) as rt:
        folded = (await rt.state(r.session_id)).requests[mirror.id]
        stored = await rt.store.get_request(mirror.id)
        assert stored is not None and folded.outcome == stored.outcome == "cancelled"
        assert folded.request.approved_by == stored.request.approved_by == []
        assert await rt.verify_audit() == []
