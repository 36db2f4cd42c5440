"""The counts of open requests (the dashboard's badge, live and on the page, `X-Total-Count`,
the `total` of `GET /v1/requests`) agree with the listings once a subagent's session passed its
TTL unrecorded: its mirrors are neither listed nor counted."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, cast

import httpx

import signoff as so
from signoff._unlisted import unlisted
from signoff.server import TokenAuth, create_app
from signoff.server._auth import default_access
from signoff.server._context import ServerContext
from signoff.stores import PendingFilter
from signoff.testing import ManualClock

from .test_mirrors_ttl import _desk, _front_desk, _parked
from .test_server_common import ALICE, TOKENS, auth


async def _counted(rt: so.Runtime) -> dict[str, int]:
    """The open requests each surface counts, and (`listed`) how many `GET /v1/requests` lists
    for an admin, all asked at the same time."""
    app = create_app(rt, auth=TokenAuth(TOKENS))
    ctx = ServerContext(runtime=rt, auth=TokenAuth(TOKENS), access=default_access, secret=b"k" * 32)
    counts: dict[str, int] = {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        for who in ("alice", "admin"):
            page = (await c.get("/v1/requests", headers=auth(f"{who}-token"))).json()
            counts[f"api-{who}"] = page["total"]
            counts[f"listed-{who}"] = len(page["items"])
        login = (await c.get("/_signoff/login")).text
        csrf = re.search(r'name="csrf-token" content="([^"]+)"', login)
        assert csrf is not None
        form = {"token": "alice-token", "csrf": csrf.group(1)}
        assert (await c.post("/_signoff/login", data=form)).status_code == 303
        badge = re.search(r'id="queue-count"[^>]*>(\d+)<', (await c.get("/_signoff")).text)
        assert badge is not None
        counts["badge"] = int(badge.group(1))
        fragment = await c.get("/_signoff/fragments/queue")
        counts["fragment"] = int(fragment.headers["X-Total-Count"])
    counts["stream-admin"] = (await ctx.open_requests_version())[0]
    counts["stream-alice"] = (await ctx.queue_version(ALICE))[0]
    return counts


async def test_a_mirror_whose_subagents_session_passed_its_ttl_is_not_counted(
    store_url: str,
) -> None:
    """Two desks parked 30 s apart, each on its mirror of `billing`'s approval (TTL 60 s): once
    the first billing session passed its TTL, nothing recorded it and the listings showed only
    the second desk's two requests, but every count still took in the first desk's mirror."""
    clock = ManualClock()
    async with so.Runtime(_desk([]), store=store_url, clock=clock) as rt:
        await _parked(rt)
        clock.advance(30)
        await _parked(rt)
        before = await _counted(rt)
        assert before == {k: 4 for k in before}
        clock.advance(30)  # the first billing session's TTL passes; the second's has 30 s left
        after = await _counted(rt)
        assert after == {k: 2 for k in after}
        assert len(await rt.pending()) == 2


async def test_mirrors_of_a_mirror_whose_grandchilds_session_passed_its_ttl_are_not_counted(
    store_url: str,
) -> None:
    """`front` delegates to `support`, which delegates to `billing` (TTL 60 s): once billing's
    session passed its TTL, both mirrors were left out of the listings and still counted."""
    clock = ManualClock()
    async with so.Runtime(_front_desk(), store=store_url, clock=clock) as rt:
        await rt.generate("front", prompt="refund 9", auth=ALICE)
        before = await _counted(rt)
        assert before == {k: 3 for k in before}  # billing's request and its two mirrors
        clock.advance(60)
        after = await _counted(rt)
        assert after == {k: 0 for k in after}
        assert await rt.pending() == []


class _Plain:
    """A store without `lapsed_ancestors`, as a custom one may be."""

    def __init__(self, store: so.stores.Store) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        if name == "lapsed_ancestors":
            raise AttributeError(name)
        return getattr(self._store, name)


async def test_the_mirrors_left_out_are_found_from_the_sessions_above_a_lapsed_subagent(
    store_url: str,
) -> None:
    """The store names the sessions above a lapsed subagent session that have open requests
    (none before the TTL passes); a store that cannot has its whole queue read, to the same
    count, and a filter of one session counts only that session's mirror."""
    clock = ManualClock()
    async with so.Runtime(_front_desk(), store=store_url, clock=clock) as rt:
        r = await rt.generate("front", prompt="refund 9", auth=ALICE)
        (mirror,) = r.pending
        assert mirror.child is not None
        live = PendingFilter(live_at=rt.now())
        assert await rt.store.lapsed_ancestors(rt.now()) == []  # type: ignore[attr-defined]
        assert len(await unlisted(rt.store, live, rt.now())) == 0
        clock.advance(60)
        now = rt.now()
        above = await rt.store.lapsed_ancestors(now)  # type: ignore[attr-defined]
        assert above == [r.session_id, mirror.child.session_id]  # front's, then support's
        live = PendingFilter(live_at=now)
        plain = cast(so.stores.Store, _Plain(rt.store))
        assert len(await unlisted(rt.store, live, now)) == 2
        assert len(await unlisted(plain, live, now)) == 2
        for store in (rt.store, plain):
            one = replace(live, session_id=r.session_id)
            assert len(await unlisted(store, one, now)) == 1
            assert len(await unlisted(store, replace(live, status="expired"), now)) == 0
