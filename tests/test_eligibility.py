"""Who may answer a request, as the runtime tells before answering (typed messages, Slack
replies, the dashboard's buttons): for a mirror, judged on the subagent's request it settles."""

from __future__ import annotations

from typing import Any

import pytest

import signoff as so
from signoff import _eligibility
from signoff._eligibility import refusal
from signoff.testing import call, call_tools, reply, scripted_agent, store_contents

from ._delegation import refund_desk

ALICE = so.Principal(authenticator="okta", principal_id="alice")
BOB = so.Principal(authenticator="okta", principal_id="bob")
CAROL = so.Principal(authenticator="okta", principal_id="carol")


def only_bob(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
    who = ctx.response.principal
    if who is not None and who.principal_id == "bob":
        return so.Allowed()
    return so.Rejected("only bob approves refunds")


async def test_a_typed_reply_the_subagents_policy_allows_answers_the_mirror(
    store_url: str,
) -> None:
    """Bob, whom the subagent's response policy lets approve, typed "approve" to the parent
    session: the who-may-answer check looked for the subagent's tool among the parent's, found
    none, said no one may answer, and the reply was queued as a message instead. It answers."""
    ran: list[str] = []
    agents = refund_desk(so.ApprovalSpec(request=so.always(), response=only_bob), ran)
    async with so.Runtime(list(agents), store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 9", auth=ALICE)
        (mirror,) = r.pending
        assert mirror.child is not None and mirror.response_policy
        assert await refusal(rt.agents, rt.store, mirror, BOB) is None
        done = await rt.send(r.session_id, "approve", principal=BOB)
        assert done.status == "completed" and ran == ["9"]
        assert [(o.request_id, o.outcome) for o in done.outcomes] == [(mirror.id, "approved")]
        types = [e.type async for e in rt.events(r.session_id, follow=False)]
        assert "turn.message" not in types


async def test_a_mirror_is_judged_by_the_subagents_request_and_tool(store_url: str) -> None:
    """A four-eyes quorum asked by a subagent: the requester may not approve it through the
    mirror, another person may; a runtime without the subagent's agent can tell nothing of a
    response policy it does not have, and refuses everyone, as answering there would."""
    ran: list[str] = []
    agents = refund_desk(so.always(approvers=2, exclude_requester=True), ran)
    async with so.Runtime(list(agents), store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 9", auth=ALICE)
        (mirror,) = r.pending
        assert mirror.agent == "support" and mirror.child is not None
        refused = await refusal(rt.agents, rt.store, mirror, ALICE)
        assert refused is not None and "requester may not approve" in str(refused)
        assert await refusal(rt.agents, rt.store, mirror, BOB) is None
        assert not await rt._may_answer(mirror, None)
        with pytest.raises(so.NotAllowed, match="requester may not approve"):
            await rt.send(r.session_id, "approve", principal=ALICE)  # hers: the child refuses
        assert ran == []
    spec = so.ApprovalSpec(request=so.always(), response=only_bob)
    async with so.Runtime(list(refund_desk(spec, ran)), store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 9", auth=ALICE)
        (mirror,) = r.pending
    async with so.Runtime([refund_desk(spec, ran)[0]], store=store_url) as parent_only:
        for who in (ALICE, BOB):
            refused = await refusal(parent_only.agents, parent_only.store, mirror, who)
            assert refused is not None and "response policy of billing.refund" in str(refused)


@pytest.mark.parametrize("guarded", [False, True])
async def test_a_request_recorded_before_the_flag_is_judged_by_its_recorded_policy(
    store_url: str, guarded: bool
) -> None:
    """A request parked before requests carried `response_policy`, seen by a runtime without
    its tool: the check read no trail and let the requester answer, which answering refuses
    (the trail records the tool's policy). Now it says so, as answering does, and changes
    nothing; the runtime with the policy lets the requester (whom it allows) answer. A tool a
    guardrail also names was recorded without its response policy, and the requester settled
    its request there."""
    ran: list[str] = []
    spec = so.ApprovalSpec(request=so.always(), response=only_bob)
    guard = [so.tool_policy(require_approval=["refund"])] if guarded else []
    _, child = refund_desk(spec, ran, guard)
    tool = child.tools["refund"]
    async with so.Runtime([child], store=store_url) as rt:
        policy, tool.response_policy = tool.response_policy, None
        try:
            r = await rt.generate("billing", prompt="refund 9", auth=ALICE)
        finally:
            tool.response_policy = policy
    async with so.Runtime([scripted_agent("billing", [])], store=store_url) as other:
        (old,) = await other.pending(session_id=r.session_id)
        assert not old.response_policy and old.requested_by == ALICE
        before = await store_contents(other.store, r.session_id)
        for who in (ALICE, BOB):
            refused = await refusal(other.agents, other.store, old, who)
            assert refused is not None and "response policy of billing.refund" in str(refused)
            with pytest.raises(so.NotAllowed, match="response policy"):
                approve = [so.InputResponse(request_id=old.id, option_id="approve")]
                await other.respond(r.session_id, approve, principal=who)
        assert await store_contents(other.store, r.session_id) == before
    async with so.Runtime([refund_desk(spec, ran, guard)[1]], store=store_url) as rt:
        assert await refusal(rt.agents, rt.store, old, BOB) is None


async def test_a_request_that_carries_the_flag_reads_no_trail(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trail is read only for a request that lacks the flag and whose tool is unknown here:
    one that carries it (or whose tool is known) costs no read."""
    ran: list[str] = []
    _, child = refund_desk(so.ApprovalSpec(request=so.always(), response=only_bob), ran)
    read: list[str] = []

    async def reading(store: Any, request: so.InputRequest) -> bool:
        read.append(request.id)
        return False

    monkeypatch.setattr(_eligibility, "response_policy_recorded", reading)
    async with so.Runtime([child], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund 9", auth=ALICE)
        (flagged,) = r.pending
        assert await refusal(rt.agents, rt.store, flagged, CAROL) is None  # the policy decides
    async with so.Runtime([scripted_agent("billing", [])], store=store_url) as other:
        assert await refusal(other.agents, other.store, flagged, ALICE) is not None
        unflagged = flagged.model_copy(update={"response_policy": False})
        assert await refusal(other.agents, other.store, unflagged, ALICE) is None
    assert read == [flagged.id]


@pytest.mark.parametrize(
    ("rule", "stranger", "eligible", "why"),
    [
        ("default", CAROL, ALICE, "carol may not settle it"),
        ("quorum", None, BOB, "an anonymous answer does not count"),
        ("four eyes", ALICE, BOB, "the requester may not"),
    ],
)
async def test_who_may_not_answer_is_refused_as_such_whatever_the_answer(
    store_url: str, rule: str, stranger: so.Principal | None, eligible: so.Principal, why: str
) -> None:
    """Someone who may not answer the request is refused as such (`NotAllowed`) whatever their
    answer: an edit of the wrong type, a stale input hash or an option an approval lacks was
    told its faults (`InvalidAnswer`, `StaleAnswer`, naming the tool's schema and the hash the
    request is bound to) instead, the request open or closed. Nothing is recorded; someone who
    may answer is told them."""
    rules = {
        "default": so.always(),
        "quorum": so.always(approvers=2),
        "four eyes": so.always(exclude_requester=True),
    }[rule]

    async def deploy(service: str, count: int = 1) -> str:
        """Deploy a service."""
        return f"{service} x{count}"

    tool = so.tool(approval=rules)(deploy)
    agent = scripted_agent(
        "ops", [call_tools(call("deploy", service="api")), reply("done")], tools=[tool]
    )
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("ops", prompt="deploy", auth=ALICE)
        sid, (req,) = r.session_id, r.pending
        answers: dict[str, dict[str, Any]] = {
            "a valid edit": {"edited_input": {"service": "web"}},
            "an edit of the wrong type": {"edited_input": {"service": 5}},
            "a stale input hash": {"input_hash": "sha256:" + "0" * 64},
            "an option an approval lacks": {"option_id": "maybe"},
            "a denial with a stale input hash": {"option_id": "cancel", "input_hash": "sha256:0"},
        }
        before = await store_contents(rt.store, sid)
        for given in answers.values():
            answer = so.InputResponse(**{"request_id": req.id, "option_id": "approve", **given})
            with pytest.raises(so.NotAllowed, match=why):
                await rt.respond(sid, [answer], principal=stranger)
            assert await store_contents(rt.store, sid) == before
            if given != answers["a valid edit"]:
                with pytest.raises((so.InvalidAnswer, so.StaleAnswer)):
                    await rt.respond(sid, [answer], principal=eligible)
        assert await store_contents(rt.store, sid) == before
        yes = so.InputResponse(request_id=req.id, option_id="approve")
        for who in [eligible, CAROL] if rule == "quorum" else [eligible]:
            await rt.respond(sid, [yes], principal=who)
        assert (await rt.state(sid)).requests[req.id].status == "settled"
        settled = await store_contents(rt.store, sid)
        for given in answers.values():  # nor once it is closed
            answer = so.InputResponse(**{"request_id": req.id, "option_id": "approve", **given})
            with pytest.raises(so.NotAllowed, match=why):
                await rt.respond(sid, [answer], principal=stranger)
        assert await store_contents(rt.store, sid) == settled


def _asked_by(asker: so.Principal) -> so.InputRequest:
    """A tool approval `asker` asked for: `req_1` of `ses_1`."""
    return so.InputRequest(
        kind="tool-approval",
        id="req_1",
        session_id="ses_1",
        turn_id="trn_1",
        agent="a",
        requested_by=asker,
        created_at=0.0,
    )


def test_a_refusal_tells_two_principals_of_one_id_apart() -> None:
    """Only the very principal that asked may answer: one of the same id through another
    authenticator (`local:alice` for `okta:alice`) is named in full, not as "alice; alice"."""
    request = _asked_by(ALICE)
    _eligibility.authorize(request, ALICE)
    with pytest.raises(so.NotAllowed) as other:
        _eligibility.authorize(request, BOB)
    assert str(other.value) == "request req_1 was asked by alice; bob may not settle it"
    local = so.Principal(authenticator="local", principal_id="alice")
    with pytest.raises(so.NotAllowed) as same_id:
        _eligibility.authorize(request, local)
    assert str(same_id.value) == (
        "request req_1 was asked by okta:alice; local:alice may not settle it"
    )
    issued = so.Principal(authenticator="okta", principal_id="alice", issuer="https://b.example")
    with pytest.raises(so.NotAllowed) as other_issuer:
        _eligibility.authorize(request, issued)
    assert "okta:alice; okta:alice (issuer https://b.example) may not" in str(other_issuer.value)
    with pytest.raises(so.NotAllowed, match="an anonymous caller may not settle it") as anon:
        _eligibility.authorize(request, None)
    # from Python, where an answer names no one unless told: it says how to name the asker
    assert str(anon.value).endswith(
        "may not settle it (pass principal=, e.g. "
        "so.Principal(authenticator='okta', principal_id='alice'))"
    )


def test_a_refusal_across_authenticators_names_both_in_full() -> None:
    """`signoff approve` acts as `local:<user>`: refused a request a token's holder asked, it
    says `token:ops` (what `--as` takes), not `ops`, which `--as ops` (`local:ops`) would not be."""
    ops = so.Principal(authenticator="token", principal_id="ops")
    request = _asked_by(ops)
    with pytest.raises(so.NotAllowed) as root:
        _eligibility.authorize(request, so.Principal(authenticator="local", principal_id="root"))
    assert str(root.value) == "request req_1 was asked by token:ops; local:root may not settle it"


@pytest.mark.parametrize(
    "asker",
    [
        so.Principal(authenticator="okta", principal_id="alice", issuer="https://idp.example"),
        so.Principal(authenticator="app", principal_id="nightly", principal_type="service"),
    ],
)
def test_the_principal_an_anonymous_refusal_suggests_is_the_askers_own(
    asker: so.Principal,
) -> None:
    """The `so.Principal(...)` a refusal from Python suggests names the asker's issuer and type
    too: without them it is another principal (`same_as`), refused again when passed."""
    request = _asked_by(asker)
    with pytest.raises(so.NotAllowed) as anon:
        _eligibility.authorize(request, None)
    suggested = str(anon.value).partition("(pass principal=, e.g. ")[2].removesuffix(")")
    assert suggested.startswith("so.Principal("), str(anon.value)
    principal = eval(suggested, {"so": so})  # the line a user would paste
    assert principal.same_as(asker), suggested
    _eligibility.authorize(request, principal)
