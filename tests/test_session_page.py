"""A page of the sessions and its total are one read of the store: a session another process
creates or cancels between the page and the count cannot set them apart. Each test makes the
change, on connections of its own, right before the store next counts sessions (after a listing
read its page, before its total), and checks that the total is what the page holds."""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

import signoff as so
from signoff._session_page import counted_sessions
from signoff.server import TokenAuth, create_app
from signoff.stores import InitiatorFilter, SessionSummary, SQLiteStore, Store

from .test_queue_page import Action, _before_count, _desk, _elsewhere
from .test_server_common import ALICE, TOKENS, auth

_COUNTS_SESSIONS = re.compile(r'COUNT\(\*\)(?: AS n)? FROM (?:"\w+"\.)?sessions\b', re.IGNORECASE)


def _counts_sessions(sql: str) -> bool:
    return _COUNTS_SESSIONS.search(sql) is not None


async def _cancel_newest(other: so.Runtime) -> None:
    newest = (await other.sessions(status="waiting", limit=1))[0]
    await other.cancel(newest.id)


async def _start_another(other: so.Runtime) -> None:
    assert (await other.generate("desk", prompt="refund", auth=ALICE)).status == "waiting"


@pytest.mark.parametrize("token", ["admin-token", "alice-token"], ids=["everyone", "own"])
@pytest.mark.parametrize("action", [_cancel_newest, _start_another], ids=["left", "started"])
async def test_a_listing_and_its_total_are_one_read(
    store_url: str, action: Action, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`GET /v1/sessions?status=waiting` (so `Client.sessions()` and the dashboard's sessions),
    for a caller who sees every session and for one who sees those she started, and the store's
    `sessions_counted()`: a waiting session cancelled or started by another process between the
    page and its count leaves the total what the page lists, and the next read shows it."""
    async with so.Runtime([_desk()], store=store_url) as rt:
        for _ in range(3):
            await rt.generate("desk", prompt="refund", auth=ALICE)
        app = create_app(rt, auth=TokenAuth(TOKENS))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:

            async def listed() -> tuple[int, int]:
                got = await c.get("/v1/sessions?status=waiting", headers=auth(token))
                body = got.json()
                return len(body["items"]), body["total"]

            step = -1 if action is _cancel_newest else 1
            elsewhere = partial(_elsewhere, store_url, action)
            with _before_count(rt.store, monkeypatch, elsewhere, _counts_sessions) as ran:
                items, total = await listed()
            assert ran == [None]
            # SQLite's page was read before the change, PostgreSQL's one statement after it.
            assert items == total in (3, 3 + step)
            assert await listed() == (3 + step, 3 + step)
            with _before_count(rt.store, monkeypatch, elsewhere, _counts_sessions) as ran:
                page, counted = await rt.store.sessions_counted(status="waiting")  # type: ignore[attr-defined]
            assert ran == [None]
            assert len(page) == counted in (3 + step, 3 + 2 * step)
            assert await rt.store.count_sessions(status="waiting") == 3 + 2 * step


async def test_sessions_counted_reads_what_sessions_and_count_sessions_do(store: Store) -> None:
    """Every page, at the start, in the middle, past the end, of none, and by every filter:
    the store's one read gives the page `sessions()` lists and the count `count_sessions()`
    gives."""
    async with so.Runtime([_desk()], store=store) as rt:
        for _ in range(4):
            await rt.generate("desk", prompt="refund", auth=ALICE)
        first = (await store.sessions(limit=1))[0]
        await rt.cancel(first.id)
        await rt.generate("desk", prompt="refund")
        alice = InitiatorFilter(principal=ALICE)
        pages: list[dict[str, Any]] = [
            {},
            {"limit": 2},
            {"limit": 2, "offset": 3},
            {"limit": 2, "offset": 5},
            {"offset": 9},
            {"limit": 0},
            {"limit": 0, "offset": 2},
            {"status": "waiting"},
            {"status": "waiting", "limit": 1, "offset": 3},
            {"status": "cancelled"},
            {"status": "idle"},
            {"status": "idle", "offset": 1},
            {"agent": "desk", "limit": 3},
            {"agent": "nobody"},
            {"agent": "\x00"},  # PostgreSQL stores no NUL: nothing matches
            {"initiated_by": alice, "limit": 2, "offset": 1},
        ]
        for keywords in pages:
            page, total = await store.sessions_counted(**keywords)  # type: ignore[attr-defined]
            counting = {k: v for k, v in keywords.items() if k not in ("limit", "offset")}
            assert page == await store.sessions(**keywords), keywords
            assert total == await store.count_sessions(**counting), keywords


async def test_a_store_without_sessions_counted_is_read_twice(tmp_path: Path) -> None:
    """A store of one's own that has no `sessions_counted` still has its pages counted: by
    `sessions()` and `count_sessions()`, one after the other."""

    class TwoReads:
        def __init__(self, store: SQLiteStore) -> None:
            self.store = store
            self.calls: list[str] = []

        async def sessions(self, **keywords: object) -> list[SessionSummary]:
            self.calls.append("sessions")
            return await self.store.sessions(**keywords)  # type: ignore[arg-type]

        async def count_sessions(self, **keywords: object) -> int:
            self.calls.append("count_sessions")
            return await self.store.count_sessions(**keywords)  # type: ignore[arg-type]

    async with so.Runtime([_desk()], store=f"sqlite:///{tmp_path / 'state.db'}") as rt:
        for _ in range(3):
            await rt.generate("desk", prompt="refund")
        assert isinstance(rt.store, SQLiteStore)
        own = TwoReads(rt.store)
        page, total = await counted_sessions(
            own,  # type: ignore[arg-type]
            agent="desk",
            status="waiting",
            limit=2,
            offset=0,
            initiated_by=None,
        )
        assert (len(page), total) == (2, 3)
        assert own.calls == ["sessions", "count_sessions"]
