"""Closed requests listed as a resource attack: the store cannot select requests by who may see
them, so a listing of settled (or expired, withdrawn) requests for anyone but an admin read and
decoded every such request the store ever held, on every call: with a few thousand of another
tenant's, a caller who may see none of them spent seconds per call, and the history only grows.
Under the default rule the store now picks the caller's requests by their sessions' initiators
(one page, one count); under a rule it cannot apply, a listing looks through the newest
`REQUEST_SCAN` matching requests, as the sessions' listing does; the open queue and an admin's
listing are read whole.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

import signoff as so
from signoff.server import TokenAuth, _context, create_app

from .test_context import custom_access
from .test_server_common import ALICE, MALLORY, TOKENS, auth, make_agents


@pytest.mark.parametrize("rule", ["default", "custom"])
async def test_a_listing_of_closed_requests_reads_a_bounded_window(
    store_url: str, monkeypatch: pytest.MonkeyPatch, rule: str
) -> None:
    monkeypatch.setattr(_context, "REQUEST_SCAN", 6)
    rt = so.Runtime(make_agents(), store=store_url)
    extra: dict[str, Any] = {"access": custom_access} if rule == "custom" else {}
    app = create_app(rt, auth=TokenAuth(TOKENS), sweep_every=None, close_runtime=True, **extra)
    settled: dict[str, list[str]] = {"alice": [], "mallory": []}
    async with app.router.lifespan_context(app):
        for who, principal in [("alice", ALICE)] * 3 + [("mallory", MALLORY)] * 6:
            r = await rt.generate("support", prompt="Refund order 1042", auth=principal)
            rid = r.pending[0].id
            answer = so.InputResponse(request_id=rid, option_id="approve")
            await rt.respond(r.session_id, [answer], principal=principal)
            settled[who].append(rid)
        opened = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        rows: list[int] = []
        real = rt.store.pending

        async def counted(flt: Any) -> Any:
            page = await real(flt)
            rows.append(len(page))
            return page

        monkeypatch.setattr(rt.store, "pending", counted)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:

            async def listed(token: str, **params: Any) -> dict[str, Any]:
                rows.clear()
                r = await c.get("/v1/requests", params=params, headers=auth(token))
                assert r.status_code == 200, r.text
                body: dict[str, Any] = r.json()
                return body

            alice = await listed("alice-token", status="settled")
            if rule == "custom":
                # Alice's three are older than the newest six settled: not looked at.
                assert (alice["total"], alice["items"]) == (0, [])
                assert sum(rows) <= 6, rows
            else:  # the store picks hers: exact, and only her page is read
                assert alice["total"] == 3
                assert [i["id"] for i in alice["items"]] == settled["alice"]
                assert sum(rows) <= 3, rows
            mallory = await listed("mallory-token", status="settled", limit=2, offset=1)
            assert mallory["total"] == 6
            assert [i["id"] for i in mallory["items"]] == settled["mallory"][1:3]  # oldest first
            assert sum(rows) <= (6 if rule == "custom" else 2), rows
            # An admin's listing is whole under the default rule (a custom rule may not let an
            # admin see everything: the window holds for it too); the open queue is whole.
            admin = await listed("admin-token", status="settled", limit=500)
            everything = settled["alice"] + settled["mallory"]
            shown = everything if rule == "default" else everything[-6:]
            assert [i["id"] for i in admin["items"]] == shown
            queue = await listed("alice-token")
            assert [i["id"] for i in queue["items"]] == [opened.pending[0].id]
            # The dashboard's audit page lists the same window.
            page = await c.get("/_signoff/audit", headers=auth("mallory-token"))
            assert page.status_code == 200
            assert all(rid in page.text for rid in settled["mallory"])
            assert not any(rid in page.text for rid in settled["alice"])
            if rule == "default":  # the whole history is hers to see, also beyond the window
                page = await c.get("/_signoff/audit", headers=auth("alice-token"))
                assert all(rid in page.text for rid in settled["alice"])
