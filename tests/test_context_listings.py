"""The listings of anyone but an admin under the default rule: the store picks the sessions and
requests the caller may see by who started them, so every one is reachable, however many
sessions are newer, and each total is exact (both stores)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

import signoff as so
from signoff.server import _context

from ._audit import alter
from .test_server_common import ALICE, BOB, MALLORY, TOKENS, auth, in_process

CAROL = so.Principal(authenticator="token", principal_id="carol")  # no tenant
ODD = so.Principal(authenticator="token", principal_id="odd", attributes={"tenant": 7})
ODD_TOO = so.Principal(authenticator="token", principal_id="odd2", attributes={"tenant": 7.0})
CALLERS = {**TOKENS, "carol-token": CAROL, "odd-token": ODD, "odd2-token": ODD_TOO}


async def _listed(c: httpx.AsyncClient, path: str, token: str, **params: Any) -> dict[str, Any]:
    r = await c.get(path, params=params, headers=auth(token))
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def test_a_session_older_than_the_scan_is_listed_and_counted(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Alice's session behind more of Mallory's newer ones than a listing once looked through
    (`SESSION_SCAN`, made small here) is listed and counted, on its page; each listing is one
    store read (its page and its count, of one snapshot), whatever the store holds."""
    monkeypatch.setattr(_context, "SESSION_SCAN", 10)
    monkeypatch.setattr(_context, "SESSION_CHUNK", 5)
    async with in_process(store_url, tokens=CALLERS) as (runtime, c):
        oldest = await runtime.create_session("support", auth=ALICE)
        theirs = [await runtime.create_session("support", auth=MALLORY) for _ in range(25)]
        newest = await runtime.create_session("support", auth=BOB)  # Alice's tenant
        reads: list[str] = []
        for name in ("sessions", "count_sessions", "sessions_counted"):
            real = getattr(runtime.store, name)

            async def read(*args: Any, _name: str = name, _real: Any = real, **kw: Any) -> Any:
                reads.append(_name)
                return await _real(*args, **kw)

            monkeypatch.setattr(runtime.store, name, read)
        body = await _listed(c, "/v1/sessions", "alice-token")
        assert [s["id"] for s in body["items"]] == [newest, oldest]
        assert body["total"] == 2
        assert reads == ["sessions_counted"]
        body = await _listed(c, "/v1/sessions", "alice-token", limit=1, offset=1)
        assert ([s["id"] for s in body["items"]], body["total"]) == ([oldest], 2)
        body = await _listed(c, "/v1/sessions", "mallory-token", limit=10, offset=20)
        assert ([s["id"] for s in body["items"]], body["total"]) == (theirs[4::-1], 25)
        body = await _listed(c, "/v1/sessions", "carol-token")  # no tenant: her own and none
        assert (body["items"], body["total"]) == ([], 0)


async def test_tenants_never_see_each_others_sessions_or_requests(store_url: str) -> None:
    """Each caller lists and counts exactly the sessions and open requests `default_access`
    shows it: its own, its tenant's, and with no tenant those started without a principal. A
    tenant that is not text (compared by Python's `==`: 7 == 7.0) is still listed exactly."""
    async with in_process(store_url, tokens=CALLERS) as (runtime, c):
        started: dict[str, list[str]] = {}
        for name, who in (
            ("alice", ALICE),
            ("bob", BOB),
            ("mallory", MALLORY),
            ("carol", CAROL),
            ("none", None),
            ("odd", ODD),
            ("odd2", ODD_TOO),
        ):
            started[name] = []
            for _ in range(2):
                done = await runtime.generate("support", "Refund order 1042", auth=who)
                assert done.status == "waiting" and len(done.pending) == 1
                started[name].append(done.session_id)
        sees = {
            "alice-token": started["alice"] + started["bob"],
            "bob-token": started["alice"] + started["bob"],
            "mallory-token": started["mallory"],
            "carol-token": started["carol"] + started["none"],
            "odd-token": started["odd"] + started["odd2"],
            "odd2-token": started["odd"] + started["odd2"],
            "admin-token": [sid for sids in started.values() for sid in sids],
        }
        for token, expected in sees.items():
            body = await _listed(c, "/v1/sessions", token, limit=3)
            assert body["total"] == len(expected), token
            listed = [s["id"] for s in body["items"]]
            for offset in range(3, len(expected), 3):
                page = await _listed(c, "/v1/sessions", token, limit=3, offset=offset)
                assert page["total"] == len(expected), token
                listed += [s["id"] for s in page["items"]]
            assert listed == expected[::-1], token
            queue = await _listed(c, "/v1/requests", token, limit=500)
            assert [q["session_id"] for q in queue["items"]] == expected, token
            assert queue["total"] == len(expected), token
            second = await _listed(c, "/v1/requests", token, limit=1, offset=1)
            assert [q["session_id"] for q in second["items"]] == expected[1:2], token
            assert second["total"] == len(expected), token
            for sid in started["mallory"]:
                r = await c.get(f"/v1/sessions/{sid}", headers=auth(token))
                assert r.status_code == (200 if sid in expected else 404), token


async def test_a_session_of_unknown_initiator_is_listed_only_to_an_admin(store_url: str) -> None:
    """A row that does not say who started the session (an older signoff still running wrote
    it after the upgrade, or the upgrade could not read its first event) is listed to no one
    but an admin: not even to callers without a tenant, who see sessions of no principal."""
    async with in_process(store_url, tokens=CALLERS) as (runtime, c):
        unowned = await runtime.create_session("support")
        unknown = await runtime.create_session("support")
        alter(store_url, "UPDATE {t}sessions SET initiator = NULL WHERE id = {p}", unknown)
        for token, expected in (("carol-token", [unowned]), ("admin-token", [unknown, unowned])):
            body = await _listed(c, "/v1/sessions", token)
            assert ([s["id"] for s in body["items"]], body["total"]) == (expected, len(expected))
