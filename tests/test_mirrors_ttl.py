"""A mirror whose subagent's session passed its TTL, which nothing has recorded yet: no longer
offered by any surface that lists open requests (Python, the HTTP API, `signoff pending`, the
dashboard's queue), and answering it is `RequestClosed`."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest

import signoff as so
from signoff.server import TokenAuth, create_app
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from ._cli import invoke
from ._delegation import refund_desk
from .test_server_common import ALICE, TOKENS, auth


def _desk(ran: list[str]) -> list[so.Agent]:
    """`refund_desk`, its `billing` child sessions expiring after 60 idle seconds (the parent's
    `support` sessions never do)."""
    support, billing = refund_desk(so.always(), ran)
    billing.limits = so.Limits(ttl=60)
    return [support, billing]


def _front_desk() -> list[so.Agent]:
    """`_desk` under a `front` agent that delegates to `support`: billing's request is mirrored
    twice, on support's session and on front's."""
    front = scripted_agent(
        "front",
        [call_tools(call("support", message="refund 9")), reply("all done")],
        tools=[so.delegate("support")],
    )
    return [front, *_desk([])]


async def _parked(rt: so.Runtime) -> tuple[str, so.InputRequest]:
    """A `support` session waiting on its mirror of `billing`'s approval."""
    r = await rt.generate("support", prompt="refund 9", auth=ALICE)
    (mirror,) = r.pending
    assert mirror.child is not None
    return r.session_id, mirror


async def _listed(rt: so.Runtime, session_id: str, mirror_id: str) -> dict[str, list[str]]:
    """The ids each surface lists as open: `pending`, `pending_page`, `GET /v1/requests` (for
    the session's initiator and for an admin) and the dashboard's queue, besides the status
    `GET /v1/requests/{id}` gives the mirror; sorted, as both were asked at the same time."""
    app = create_app(rt, auth=TokenAuth(TOKENS))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        api = {
            who: [
                i["id"]
                for i in (await c.get("/v1/requests", headers=auth(f"{who}-token"))).json()["items"]
            ]
            for who in ("alice", "admin")
        }
        one = (await c.get(f"/v1/requests/{mirror_id}", headers=auth("alice-token"))).json()
        login = (await c.get("/_signoff/login")).text
        csrf = re.search(r'name="csrf-token" content="([^"]+)"', login)
        assert csrf is not None
        form = {"token": "alice-token", "csrf": csrf.group(1)}
        assert (await c.post("/_signoff/login", data=form)).status_code == 303
        queue = (await c.get("/_signoff")).text
    page, _ = await rt.pending_page(so.stores.PendingFilter(live_at=rt.now(), limit=10))
    listed = {
        "pending": [r.id for r in await rt.pending()],
        "session": [r.id for r in await rt.pending(session_id=session_id)],
        "page": [r.id for r in page],
        "api-alice": api["alice"],
        "api-admin": api["admin"],
        "dashboard": re.findall(r'data-request-id="([^"]+)"', queue),
    }
    return {**{k: sorted(ids) for k, ids in listed.items()}, "detail": [one["status"]]}


async def test_a_mirror_whose_subagents_session_passed_its_ttl_is_not_listed(
    store_url: str,
) -> None:
    """The child's session passed its TTL and nothing closed the mirror yet: `rt.pending()`,
    `GET /v1/requests` and the dashboard's queue still offered it (the child's own request was
    left out), though the only answer it could take was `RequestClosed`."""
    clock = ManualClock()
    ran: list[str] = []
    async with so.Runtime(_desk(ran), store=store_url, clock=clock) as rt:
        session_id, mirror = await _parked(rt)
        assert mirror.child is not None
        before = await _listed(rt, session_id, mirror.id)
        both = sorted([mirror.child.request_id, mirror.id])  # the child's request, its mirror
        assert before == {
            **{k: both for k in before},
            "session": [mirror.id],
            "detail": ["pending"],
        }
        clock.advance(60)  # the TTL itself counts as passed, as it does for `SessionExpired`
        after = await _listed(rt, session_id, mirror.id)
        assert after == {**{k: [] for k in after}, "detail": ["expired"]}
        answer = so.InputResponse(request_id=mirror.id, option_id="approve")
        with pytest.raises(so.RequestClosed) as closed:
            await rt.respond(session_id, [answer], principal=ALICE)
        assert closed.value.request_ids == [mirror.id]
        assert (await rt.state(session_id)).requests[mirror.id].status == "expired"
        assert ran == []


async def test_a_mirror_of_a_mirror_whose_grandchilds_session_passed_its_ttl_is_not_listed(
    store_url: str,
) -> None:
    """`front` delegates to `support`, which delegates to `billing` (TTL 60 s): once billing's
    session passed its TTL, neither mirror takes an answer (each routes down to billing's
    request), so neither is listed, though `support`'s and `front`'s sessions live on."""
    clock = ManualClock()
    async with so.Runtime(_front_desk(), store=store_url, clock=clock) as rt:
        r = await rt.generate("front", prompt="refund 9", auth=ALICE)
        (mirror,) = r.pending
        assert mirror.child is not None
        assert len(await rt.pending()) == 3  # billing's request and its two mirrors
        clock.advance(59)
        assert len(await rt.pending()) == 3
        clock.advance(1)
        assert await rt.pending() == []
        page, _ = await rt.pending_page(so.stores.PendingFilter(live_at=rt.now(), limit=10))
        assert page == []
        answer = so.InputResponse(request_id=mirror.id, option_id="approve")
        with pytest.raises(so.RequestClosed) as closed:
            await rt.respond(r.session_id, [answer], principal=ALICE)
        assert closed.value.request_ids == [mirror.id]


def test_signoff_pending_leaves_out_a_mirror_whose_subagents_session_passed_its_ttl(
    store_url: str,
) -> None:
    """`signoff pending` reads by the wall clock: a child session created at the manual clock's
    start (2023) is long past its 60 s TTL, its parent (no TTL) lives on. The command listed the
    mirror, the one open request it showed."""

    async def park() -> tuple[str, so.InputRequest]:
        async with so.Runtime(_desk([]), store=store_url, clock=ManualClock()) as rt:
            return await _parked(rt)

    session_id, mirror = asyncio.run(park())
    for args in (("--json",), ("--session", session_id, "--json")):
        result = invoke("pending", "--store", store_url, *args)
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout) == []
    result = invoke("pending", "--store", store_url)
    assert result.exit_code == 0, result.output
    assert mirror.id not in result.stdout and "No pending requests." in result.stdout


async def test_a_session_read_shows_a_mirror_its_subagents_unrecorded_ttl_closed(
    store_url: str,
) -> None:
    """A runtime (or server) without the agents cannot record the subagent's passed TTL: its
    `rt.state`, `GET /v1/sessions/{id}` and dashboard page showed the parent `waiting` on the
    mirror, `pending`, while its queue and `GET /v1/requests/{id}` said the mirror expired. It is
    shown closed as recording closes it, the delegate call going on (`running`), as the runtime
    with the agents reads it once it recorded that; nothing is written by reading it."""
    clock = ManualClock()
    async with so.Runtime(_desk([]), store=store_url, clock=clock) as rt:
        session_id, mirror = await _parked(rt)
    clock.advance(60)
    async with so.Runtime([], store=store_url, clock=clock) as reader:
        before = [e.type async for e in reader.events(session_id, follow=False)]
        shown = await reader.state(session_id)
        assert (shown.status, shown.pending_requests()) == ("running", [])
        assert shown.requests[mirror.id].status == "expired" and shown.seq == len(before)
        app = create_app(reader, auth=TokenAuth(TOKENS))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            body = (await c.get(f"/v1/sessions/{session_id}", headers=auth("alice-token"))).json()
            one = (await c.get(f"/v1/requests/{mirror.id}", headers=auth("alice-token"))).json()
            login = (await c.get("/_signoff/login")).text
            csrf = re.search(r'name="csrf-token" content="([^"]+)"', login)
            assert csrf is not None
            form = {"token": "alice-token", "csrf": csrf.group(1)}
            assert (await c.post("/_signoff/login", data=form)).status_code == 303
            page = (await c.get(f"/_signoff/sessions/{session_id}")).text
        assert (body["status"], body["pending"], one["status"]) == ("running", [], "expired")
        assert re.findall(r"data-session-status>([a-z]+)<", page) == ["running"]
        assert [e.type async for e in reader.events(session_id, follow=False)] == before
    async with so.Runtime(_desk([]), store=store_url, clock=clock) as rt:
        recorded = await rt.state(session_id)
    assert (recorded.status, recorded.turn_status) == (shown.status, shown.turn_status)
    assert recorded.turn is not None and shown.turn is not None
    assert {c.id: c.status for c in recorded.turn.calls.values()} == {
        c.id: c.status for c in shown.turn.calls.values()
    }
    closed, seen = recorded.requests[mirror.id], shown.requests[mirror.id]
    assert (closed.status, closed.outcome, closed.resolution) == (
        seen.status,
        seen.outcome,
        seen.resolution,
    )


async def test_a_mirror_its_subagents_ttl_closed_keeps_the_votes_counted(store_url: str) -> None:
    """Bob approved through the mirror of a call that needs two, then billing's session passed
    its TTL: read before anything recorded it, the mirror showed closed with none of its
    subagent's votes ("0 of 2"), as recording then closed it; both now hold Bob's, as the
    subagent's request does."""
    clock = ManualClock()
    support, billing = refund_desk(so.always(approvers=2, exclude_requester=True), [])
    billing.limits = so.Limits(ttl=60)
    bob = so.Principal(authenticator="sso", principal_id="bob")
    async with so.Runtime([support, billing], store=store_url, clock=clock) as rt:
        session_id, mirror = await _parked(rt)
        answer = so.InputResponse(request_id=mirror.id, option_id="approve")
        await rt.respond(session_id, [answer], principal=bob)
    clock.advance(60)
    async with so.Runtime([], store=store_url, clock=clock) as reader:
        seen = (await reader.state(session_id)).requests[mirror.id]
        assert (seen.status, seen.request.approved_by, seen.request.progress) == (
            "expired",
            ["bob"],
            "1 of 2",
        )
        app = create_app(reader, auth=TokenAuth(TOKENS))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            one = (await c.get(f"/v1/requests/{mirror.id}", headers=auth("alice-token"))).json()
        assert (one["status"], one["request"]["approved_by"]) == ("expired", ["bob"])
    async with so.Runtime([support, billing], store=store_url, clock=clock) as rt:
        closed = (await rt.state(session_id)).requests[mirror.id]
        stored = await rt.store.get_request(mirror.id)
        assert stored is not None and stored.request.approved_by == ["bob"]
        assert (closed.status, closed.request.approved_by) == ("expired", ["bob"])
        assert closed.resolution == seen.resolution
        assert await rt.verify_audit() == []
