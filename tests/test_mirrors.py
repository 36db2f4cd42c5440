"""Mirrored requests as they are read: a quorum's mirror shows the approvals its subagent's
request counted (votes are counted there), in the queue, the API and the CLI's listing."""

from __future__ import annotations

import httpx

import signoff as so
from signoff.server import TokenAuth, create_app
from signoff.stores import PendingFilter

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
