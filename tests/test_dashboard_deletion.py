"""Deleting a session from its dashboard page: offered to whoever may see (and so cancel) it once
it is finished, with a ticked box as the confirmation and a CSRF token; deleted as the viewer,
who lands on the Sessions list told so once; a live session, a subagent's, one of another
tenant and one gone already are refused, nothing deleted."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

import signoff as so
from signoff.server import TokenAuth, create_app
from signoff.stores._deletions import DELETIONS_STREAM

from ._dashboard import PLAIN, csrf_of, signed_in
from .conftest import make_store
from .test_server_common import TOKENS, auth, make_runtime, running
from .test_subagents_spend import orders, support, tokens

JSON = {"Accept": "application/json"}
HTML = {"Accept": "text/html"}
SURE = {"confirm": "yes"}


@contextmanager
def served(rt: so.Runtime) -> Iterator[str]:
    with running(create_app(rt, auth=TokenAuth(TOKENS), poll_interval=0.05)) as base:
        yield base


def _api(base: str) -> httpx.Client:
    return httpx.Client(base_url=base, headers=auth("alice-token"), verify=PLAIN, timeout=10)


def _start(base: str, agent: str = "support", message: str = "refund order 1042") -> Any:
    with _api(base) as c:
        r = c.post("/v1/sessions", json={"agent": agent, "message": message})
        assert r.status_code == 201, r.text
        return r.json()


def _cancel(base: str, sid: str) -> None:
    with _api(base) as c:
        assert c.post(f"/v1/sessions/{sid}/cancel").status_code == 200


def _delete(c: httpx.Client, sid: str, **fields: str) -> httpx.Response:
    """Post the page's delete form as a browser does, with the page's CSRF token."""
    page = c.get(f"/_signoff/sessions/{sid}")
    token = csrf_of(page.text) if page.status_code == 200 else csrf_of(c.get("/_signoff/").text)
    return c.post(f"/_signoff/sessions/{sid}/delete", data={"csrf": token, **fields}, headers=HTML)


def _exists(base: str, sid: str) -> bool:
    with _api(base) as c:
        return c.get(f"/v1/sessions/{sid}").status_code == 200


def test_a_finished_session_is_deleted_from_its_page_as_the_viewer(tmp_path: Path) -> None:
    rt = make_runtime(f"sqlite:///{tmp_path / 's.db'}")
    with served(rt) as base:
        sid = _start(base)["session_id"]
        with signed_in(base) as alice, signed_in(base, "mallory-token") as mallory:
            page = alice.get(f"/_signoff/sessions/{sid}").text
            # waiting on an approval: no form, but why and what to do
            assert "/delete" not in page and 'name="confirm"' not in page
            assert "can be deleted once it has finished: it is waiting" in page
            _cancel(base, sid)
            page = alice.get(f"/_signoff/sessions/{sid}").text
            assert f'action="/_signoff/sessions/{sid}/delete"' in page
            assert 'name="confirm" value="yes" required' in page
            assert '<label class="delete-label" for="delete-reason">' in page
            # the live page's read redraws it as the session changes
            assert "/delete" in alice.get(f"/_signoff/fragments/sessions/{sid}").json()["delete"]
            # another tenant's person: no page, and the session does not exist for their post
            assert mallory.get(f"/_signoff/sessions/{sid}").status_code == 404
            r = _delete(mallory, sid, **SURE)
            assert r.status_code == 404 and "unknown_session" in r.text
            # a post without the page's token, or without the box ticked: nothing deleted
            r = alice.post(f"/_signoff/sessions/{sid}/delete", data=SURE, headers=HTML)
            assert r.status_code == 403 and "csrf" in r.text
            r = _delete(alice, sid, reason="tidy up")
            assert r.status_code == 422 and "invalid_request" in r.text
            assert "I understand this erases the conversation for good" in r.text
            assert _exists(base, sid)
            r = _delete(alice, sid, reason="GDPR erasure", **SURE)
            assert r.status_code == 303 and r.headers["location"] == "/_signoff/sessions"
            assert not _exists(base, sid)
            listed = alice.get("/_signoff/sessions").text
            assert f"Deleted {sid}." in listed and 'role="status"' in listed
            assert "Deleted " not in alice.get("/_signoff/sessions").text  # told once
            # sent again (a second click, a back button): the session is gone
            r = _delete(alice, sid, **SURE)
            assert r.status_code == 404 and "unknown_session" in r.text
            assert alice.get(f"/_signoff/sessions/{sid}").status_code == 404
    [entry] = rt.audit_sync(stream=DELETIONS_STREAM)
    assert entry.data["by"]["principal_id"] == "alice"
    assert entry.data["reason"] == "GDPR erasure"
    rt.close_sync()


def test_an_admin_who_may_cancel_may_delete_and_a_forged_note_is_not_shown(
    tmp_path: Path,
) -> None:
    rt = make_runtime(f"sqlite:///{tmp_path / 's.db'}")
    with served(rt) as base:
        sid = _start(base)["session_id"]
        _cancel(base, sid)
        with signed_in(base, "admin-token") as admin:
            assert f"/sessions/{sid}/delete" in admin.get(f"/_signoff/sessions/{sid}").text
            admin.cookies.set("signoff_deleted", "eyJ4IjoxfQ.0000", path="/_signoff/sessions")
            assert "Deleted " not in admin.get("/_signoff/sessions").text
            page = admin.get(f"/_signoff/sessions/{sid}")
            r = admin.post(
                f"/_signoff/sessions/{sid}/delete",
                data={"csrf": csrf_of(page.text), **SURE},
                headers=JSON,
            )
            assert r.status_code == 200 and r.json() == {
                "ok": True,
                "deleted": [sid],
                "url": "/_signoff/sessions",
            }
    [entry] = rt.audit_sync(stream=DELETIONS_STREAM)
    assert entry.data["by"]["principal_id"] == "root" and entry.data["reason"] is None
    rt.close_sync()


def test_a_live_session_is_refused_with_its_code_and_nothing_deleted(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    rt = make_runtime(url)
    with served(rt) as base:
        waiting = _start(base)["session_id"]
        busy = _start(base)["session_id"]
        with signed_in(base) as alice:
            r = _delete(alice, waiting, **SURE)
            assert r.status_code == 409 and "session_waiting" in r.text
            assert "That did not work" in r.text  # the dashboard's error page
            # a turn started since the page was shown: its lease is held by a worker
            _cancel(base, busy)
            page = alice.get(f"/_signoff/sessions/{busy}").text
            assert f"/sessions/{busy}/delete" in page

            async def lease() -> None:
                store = make_store(url)
                await store.open()
                try:
                    assert await store.acquire_lease(busy, "elsewhere", 30.0, time.time())
                finally:
                    await store.close()

            asyncio.run(lease())
            r = alice.post(
                f"/_signoff/sessions/{busy}/delete",
                data={"csrf": csrf_of(page), **SURE},
                headers=JSON,
            )
            assert r.status_code == 409 and r.json()["error"]["code"] == "session_busy"
        assert _exists(base, waiting) and _exists(base, busy)
    assert rt.audit_sync(stream=DELETIONS_STREAM) == []
    rt.close_sync()


def test_a_subagents_session_points_to_its_parent_which_deletes_both(tmp_path: Path) -> None:
    rt = so.Runtime([support(), orders(tokens(40))], store=f"sqlite:///{tmp_path / 's.db'}")
    with served(rt) as base:
        body = _start(base, "support", "refund 3")
        parent = body["session_id"]
        child = body["pending"][0]["child"]["session_id"]
        _cancel(base, parent)
        with signed_in(base) as alice:
            page = alice.get(f"/_signoff/sessions/{child}").text
            assert "/delete" not in page
            assert f'deleted with <a href="/_signoff/sessions/{parent}">its parent session' in page
            r = _delete(alice, child, **SURE)
            assert r.status_code == 409 and "subagent_session" in r.text
            assert _exists(base, child)
            r = _delete(alice, parent, **SURE)
            assert r.status_code == 303
            note = f"Deleted {parent} and 1 subagent session."
            assert note in alice.get("/_signoff/sessions").text
            assert not _exists(base, child)
    rt.close_sync()
