"""Mirrored requests as they are read: a mirror shows its subagent's request as it stands (the
votes counted there, its escalation and deadline), in Python, the API, the CLI and the dashboard."""

from __future__ import annotations

import re

import httpx
import pytest

import signoff as so
from signoff.server import TokenAuth, create_app
from signoff.stores import PendingFilter
from signoff.testing import ManualClock

from ._delegation import refund_desk
from .test_server_common import ALICE, BOB, TOKENS, auth

CAROL = so.Principal(authenticator="token", principal_id="carol", attributes={"tenant": "acme"})


async def test_a_quorums_mirror_shows_the_votes_its_subagents_request_counted(
    store_url: str,
) -> None:
    """Bob approved through the parent's mirror, Carol on the subagent's request itself: the
    mirror's own copy kept "0 of 3" in `pending`, `GET /v1/requests`, `GET /v1/requests/{id}`,
    `GET /v1/sessions/{id}` and `signoff pending --json`, though two of three had approved."""
    ran: list[str] = []
    approve = "approve"
    async with so.Runtime(refund_desk(so.always(approvers=3), ran), store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 9", auth=ALICE)
        (mirror,) = r.pending
        assert mirror.child is not None and mirror.approvers == 3
        child = mirror.child
        voted = await rt.respond(
            r.session_id, [so.InputResponse(request_id=mirror.id, option_id=approve)], principal=BOB
        )
        assert [(o.outcome, o.reason) for o in voted.outcomes] == [("counted", "1 of 3")]
        await rt.respond(
            child.session_id,
            [so.InputResponse(request_id=child.request_id, option_id=approve)],
            principal=CAROL,
        )
        (listed,) = await rt.pending(session_id=r.session_id)
        assert listed.id == mirror.id and listed.approved_by == ["bob", "carol"]
        assert listed.progress == "2 of 3"
        stored = await rt.store.get_request(mirror.id)
        assert stored is not None and stored.request.approved_by == []  # the mirror's own copy
        app = create_app(rt, auth=TokenAuth(TOKENS))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            h = auth("alice-token")
            page = (await http.get("/v1/requests", params={"agent": "support"}, headers=h)).json()
            assert [i["approved_by"] for i in page["items"]] == [["bob", "carol"]]
            one = (await http.get(f"/v1/requests/{mirror.id}", headers=h)).json()
            assert one["request"]["approved_by"] == ["bob", "carol"]
            view = (await http.get(f"/v1/sessions/{r.session_id}", headers=h)).json()
            assert [p["approved_by"] for p in view["pending"]] == [["bob", "carol"]]
    async with so.Runtime([], store=store_url) as cli:  # as `signoff pending` reads the queue
        flt = PendingFilter(session_id=r.session_id, live_at=cli.clock(), limit=10)
        shown, _ = await cli.pending_page(flt)
        assert [p.approved_by for p in shown] == [["bob", "carol"]]
    async with so.Runtime(refund_desk(so.always(approvers=3), ran), store=store_url) as rt:
        done = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=mirror.id, option_id=approve)],
            principal=ALICE,
        )
        assert done.status == "completed" and ran == ["9"]
        assert await rt.pending(session_id=r.session_id) == []
        # Closed, the mirror follows no more: its row holds the votes that approved the
        # subagent's request, as that request's does (it kept its own copy's "0 of 3").
        for rid in (mirror.id, child.request_id):
            closed = await rt.store.get_request(rid)
            assert closed is not None and closed.status == "settled"
            assert closed.request.approved_by == ["bob", "carol", "alice"]
            assert closed.request.progress == "3 of 3"


ESCALATING = so.always(expires_in=60, on_timeout="escalate", escalate_to="finance")
FOLLOWED = ("approved_by", "escalated_to", "expires_at")


async def _views(rt: so.Runtime, session_id: str, mirror_id: str) -> dict[str, so.InputRequest]:
    """The mirror as every surface shows it: Python (`pending`, `state`, a `generate` result),
    the HTTP API (the listing, the request's detail, the session's view) and the CLI's queue."""
    (listed,) = await rt.pending(session_id=session_id)
    state = await rt.state(session_id)
    (resumed,) = (await rt.generate(session_id=session_id)).pending
    app = create_app(rt, auth=TokenAuth(TOKENS))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        h = auth("alice-token")
        page = (await c.get("/v1/requests", params={"agent": "support"}, headers=h)).json()
        one = (await c.get(f"/v1/requests/{mirror_id}", headers=h)).json()["request"]
        view = (await c.get(f"/v1/sessions/{session_id}", headers=h)).json()
    async with so.Runtime([], store=rt.store.url, clock=rt.clock) as cli:  # `signoff pending`
        flt = PendingFilter(session_id=session_id, live_at=cli.now(), limit=10)
        (queued,), _ = await cli.pending_page(flt)
    json_views = {"api-list": page["items"][0], "api-one": one, "api-session": view["pending"][0]}
    return {
        "pending": listed,
        "state": state.requests[mirror_id].request,
        "result": resumed,
        **{k: so.InputRequest.model_validate(v) for k, v in json_views.items()},
        "cli": queued,
    }


def _fields(request: so.InputRequest) -> dict[str, object]:
    return {f: getattr(request, f) for f in FOLLOWED}


async def test_a_mirror_shows_its_subagents_deadline_and_follows_its_escalation(
    store_url: str,
) -> None:
    """The child's request escalated to finance when its deadline passed: the parent's mirror
    kept no deadline and no escalation in every surface (and so a reviewer saw "expires: never"
    on a request about to escalate, then no escalation)."""
    clock = ManualClock()
    ran: list[str] = []
    async with so.Runtime(refund_desk(ESCALATING, ran), store=store_url, clock=clock) as rt:
        r = await rt.generate("support", prompt="refund 9", auth=ALICE)
        (mirror,) = r.pending
        assert mirror.child is not None
        child_id = mirror.child.request_id
        child = (await rt.state(mirror.child.session_id)).requests[child_id].request
        assert child.expires_at == clock.now + 60 and child.escalated_to is None
        views = await _views(rt, r.session_id, mirror.id)
        assert {k: _fields(v) for k, v in views.items() if k != "result"} == {
            k: _fields(child) for k in views if k != "result"
        }
        clock.advance(61)
        # A reader that cannot record the deadline (`signoff pending`) shows it escalated.
        async with so.Runtime([], store=store_url, clock=clock) as cli:
            flt = PendingFilter(session_id=r.session_id, live_at=cli.now(), limit=10)
            (queued,), _ = await cli.pending_page(flt)
            shown = (queued.id, queued.escalated_to, queued.expires_at)
            assert shown == (mirror.id, "finance", None)
        assert await rt.expire_due() == 1
        child = (await rt.state(mirror.child.session_id)).requests[child_id].request
        assert (child.escalated_to, child.expires_at) == ("finance", None)
        views = await _views(rt, r.session_id, mirror.id)
        assert {k: _fields(v) for k, v in views.items()} == {k: _fields(child) for k in views}
        stored = await rt.store.get_request(mirror.id)
        assert stored is not None and stored.request.escalated_to is None  # its own copy
        assert stored.request.expires_at is None  # the parent applies no deadline of its own
        answer = so.InputResponse(request_id=mirror.id, option_id="approve")
        done = await rt.respond(r.session_id, [answer], principal=ALICE)
        assert done.status == "completed" and ran == ["9"]


async def test_a_mirror_whose_subagents_deadline_closes_it_is_not_offered(
    store_url: str,
) -> None:
    """The subagent's request passed a deadline that denies it, and nothing recorded that yet:
    a queue reader shows neither it nor its mirror (both are past answering), not the mirror
    alone as though it had no deadline."""
    clock = ManualClock()
    ran: list[str] = []
    async with so.Runtime(refund_desk(so.always(expires_in=60), ran), store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 9", auth=ALICE)
        (mirror,) = r.pending
        assert mirror.child is not None
    clock.now = r.pending[0].created_at + 61
    async with so.Runtime([], store=store_url, clock=clock) as cli:  # `signoff pending`
        for session_id in (r.session_id, mirror.child.session_id):
            flt = PendingFilter(session_id=session_id, live_at=cli.now(), limit=10)
            assert await cli.pending_page(flt) == ([], False)
    assert ran == []


async def test_a_quorums_mirror_shows_live_votes_in_results_and_state(store_url: str) -> None:
    """The result of a vote given through the mirror, and the parent's state, showed the
    mirror's own copy ("0 of 3") while the subagent's request had counted the votes."""
    ran: list[str] = []
    async with so.Runtime(refund_desk(so.always(approvers=3), ran), store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 9", auth=ALICE)
        (mirror,) = r.pending
        assert mirror.child is not None
        answer = so.InputResponse(request_id=mirror.id, option_id="approve")
        voted = await rt.respond(r.session_id, [answer], principal=BOB)
        assert [p.approved_by for p in voted.pending] == [["bob"]]
        child = so.InputResponse(request_id=mirror.child.request_id, option_id="approve")
        await rt.respond(mirror.child.session_id, [child], principal=CAROL)
        views = await _views(rt, r.session_id, mirror.id)
        assert {k: v.approved_by for k, v in views.items()} == {k: ["bob", "carol"] for k in views}
        assert {v.progress for v in views.values()} == {"2 of 3"}


async def test_the_dashboard_shows_a_mirrors_deadline_and_escalation_as_its_subagents(
    store_url: str,
) -> None:
    """The session page's card of a mirror said "Expires: never", and no escalation once the
    subagent's request had escalated."""
    clock = ManualClock()
    ran: list[str] = []
    async with so.Runtime(refund_desk(ESCALATING, ran), store=store_url, clock=clock) as rt:
        r = await rt.generate("support", prompt="refund 9", auth=ALICE)
        (mirror,) = r.pending
        assert mirror.child is not None
        deadline = clock.now + 60
        app = create_app(rt, auth=TokenAuth(TOKENS))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            login = (await c.get("/_signoff/login")).text
            token = re.search(r'name="csrf-token" content="([^"]+)"', login)
            assert token is not None
            form = {"token": "alice-token", "csrf": token.group(1)}
            assert (await c.post("/_signoff/login", data=form)).status_code == 303

            async def card(path: str) -> str:
                page = (await c.get(path)).text
                start = page.index(f'data-request-id="{mirror.id}"')
                return page[start : page.index("</article>", start)]

            for path in (f"/_signoff/sessions/{r.session_id}", "/_signoff"):
                shown = await card(path)
                assert f'data-ts="{deadline}"' in shown and "never" not in shown, path
            clock.advance(61)
            assert await rt.expire_due() == 1
            for path in (f"/_signoff/sessions/{r.session_id}", "/_signoff"):
                shown = await card(path)
                assert "escalated to <bdi>finance</bdi>" in shown and "never" in shown, path


async def test_a_mirror_of_a_request_settled_before_its_deadline_does_not_follow_it(
    store_url: str,
) -> None:
    """The subagent's request was approved on the child itself (`resume=False`) before its
    deadline, and the parent's mirror was still open when that deadline passed: the queue showed
    the mirror "escalated to finance" (a deny deadline would have hidden it), though nothing
    escalated and the approval stood."""
    clock = ManualClock()
    ran: list[str] = []
    async with so.Runtime(refund_desk(ESCALATING, ran), store=store_url, clock=clock) as rt:
        r = await rt.generate("support", prompt="refund 9", auth=ALICE)
        (mirror,) = r.pending
        assert mirror.child is not None
        child = mirror.child
        answer = so.InputResponse(request_id=child.request_id, option_id="approve")
        await rt.respond(child.session_id, [answer], principal=ALICE, resume=False)
        clock.advance(61)
        (listed,) = await rt.pending(session_id=r.session_id)
        state = (await rt.state(r.session_id)).requests[mirror.id]
        app = create_app(rt, auth=TokenAuth(TOKENS))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            one = (await http.get(f"/v1/requests/{mirror.id}", headers=auth("alice-token"))).json()
        async with so.Runtime([], store=store_url, clock=clock) as cli:  # `signoff pending`
            flt = PendingFilter(session_id=r.session_id, live_at=cli.now(), limit=10)
            (queued,), _ = await cli.pending_page(flt)
        shown = [
            (v.id, v.escalated_to, v.expires_at)
            for v in (listed, state.request, so.InputRequest.model_validate(one["request"]), queued)
        ]
        assert shown == [(mirror.id, None, None)] * 4
        assert one["status"] == "pending" and state.status == "pending"
        assert (await rt.store.get_request(mirror.id)) is not None
        done = await rt.generate(session_id=r.session_id)  # the parent goes on with the approval
        assert done.status == "completed" and ran == ["9"]


def _desk_with_a_child_ttl(ran: list[str]) -> list[so.Agent]:
    """`refund_desk`, its `billing` child sessions expiring after 60 idle seconds."""
    support, billing = refund_desk(so.always(), ran)
    billing.limits = so.Limits(ttl=60)
    return [support, billing]


async def test_an_answer_to_a_mirror_whose_subagents_session_expired_names_the_mirror(
    store_url: str,
) -> None:
    """The subagent's session passed its TTL (nothing had recorded it) while its request was
    mirrored: an answer through the parent raised `SessionExpired` for the child's session (a
    410 over HTTP), though the parent session lives on and went on once the mirror closed; it
    is the mirror that can no longer be answered: `RequestClosed` naming it (a 409)."""
    clock = ManualClock()
    ran: list[str] = []
    async with so.Runtime(_desk_with_a_child_ttl(ran), store=store_url, clock=clock) as rt:
        r = await rt.generate("support", prompt="refund 9", auth=ALICE)
        (mirror,) = r.pending
        assert mirror.child is not None
        clock.advance(61)
        answer = so.InputResponse(request_id=mirror.id, option_id="approve")
        with pytest.raises(so.RequestClosed) as closed:
            await rt.respond(r.session_id, [answer], principal=ALICE)
        assert closed.value.request_ids == [mirror.id]
        assert f"request {mirror.id} (asked for billing's " in str(closed.value)
        state = await rt.state(r.session_id)
        assert state.requests[mirror.id].status == "expired"
        assert state.turn is not None and state.turn.status == "completed"
        assert ran == []
    async with so.Runtime(_desk_with_a_child_ttl(ran), store=store_url, clock=clock) as rt:
        again = await rt.generate("support", prompt="refund 9", auth=ALICE)
        (mirror,) = again.pending
        clock.advance(61)
        app = create_app(rt, auth=TokenAuth(TOKENS))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            body = {"inputResponses": [{"requestId": mirror.id, "optionId": "approve"}]}
            got = await http.post(
                f"/v1/sessions/{again.session_id}/responses", json=body, headers=auth("alice-token")
            )
        assert (got.status_code, got.json()["error"]["code"]) == (409, "request_closed")
        assert ran == []
