"""The dashboard's errors as a browser meets them: a page it can read, not the API's JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

import signoff as so
from signoff.server import TokenAuth, create_app

from ._dashboard import csrf_of, signed_in, start
from .test_server_common import TOKENS, make_runtime, running

BROWSER = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}


def test_a_store_down_is_a_page_a_browser_can_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database down under the queue (or under a form posted without JavaScript) answered a
    browser with the API's JSON, `{"error": {"code": "store_unavailable", ...}}`, shown raw as
    the page. A browser now gets a page saying the store cannot be reached, with the code and
    the Retry-After; the page's script (asking for JSON) and API clients still get JSON."""
    runtime = make_runtime(f"sqlite:///{tmp_path}/state.db")
    app = create_app(runtime, auth=TokenAuth(TOKENS), poll_interval=0.05)
    with running(app) as base, signed_in(base) as c:
        body = start(base)
        rid, sid = body["pending"][0]["id"], body["session_id"]
        csrf = csrf_of(c.get("/_signoff/").text)

        async def down(*args: Any, **kwargs: Any) -> Any:
            raise so.StoreUnavailable("the database is restarting")

        for name in ("pending", "pending_counted", "count_pending", "get_request", "load", "head"):
            monkeypatch.setattr(runtime.store, name, down)
        for r in (
            c.get("/_signoff/", headers=BROWSER),
            c.get(f"/_signoff/sessions/{sid}", headers=BROWSER),
            c.post(
                f"/_signoff/requests/{rid}/respond",
                data={"csrf": csrf, "option": "approve"},
                headers=BROWSER,
            ),
        ):
            assert r.status_code == 503, r.text
            assert r.headers["content-type"].startswith("text/html"), r.text
            assert r.headers["retry-after"] == "5"
            assert "<h1>The server cannot reach its store</h1>" in r.text
            assert "<code>store_unavailable</code>" in r.text
            assert "Reload the page in a little while" in r.text
        # the page's own script, and anything else, still read the error as JSON
        script = c.get("/_signoff/fragments/queue", headers={"Accept": "application/json"})
        assert script.status_code == 503
        assert script.json()["error"]["code"] == "store_unavailable"
        assert c.get("/_signoff/").json()["error"]["code"] == "store_unavailable"


def test_an_unknown_dashboard_address_is_a_page_a_browser_can_read(tmp_path: Path) -> None:
    runtime = make_runtime(f"sqlite:///{tmp_path}/state.db")
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as base, signed_in(base) as c:
        r = c.get("/_signoff/no-such-page", headers=BROWSER)
        assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
        assert "<h1>Not found</h1>" in r.text and "<code>not_found</code>" in r.text
        assert 'aria-label="Dashboard"' in r.text  # the navigation of a signed-in reviewer
        r = c.post("/_signoff/sessions/x", headers=BROWSER)
        assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD"
        assert "<code>method_not_allowed</code>" in r.text
        # outside the dashboard, the API's JSON
        api = httpx.get(f"{base}/v1/no-such-thing", headers=BROWSER)
        assert api.status_code == 404 and api.json()["error"]["code"] == "not_found"


def test_a_form_post_over_the_body_limit_is_a_page_a_browser_can_read(tmp_path: Path) -> None:
    """A message form posted without JavaScript, over `max_body_size` with its `Content-Length`
    (as a browser sends it), is refused before it is read: the browser got the API's JSON, shown
    raw, where the same body sent in chunks got a page. It gets a page naming the code, drawn
    without asking who is signed in (`bare_error_page`); the page's script and API clients still
    get JSON. Nothing is sent."""
    runtime = make_runtime(f"sqlite:///{tmp_path}/state.db")
    app = create_app(runtime, auth=TokenAuth(TOKENS), max_body_size=64_000)
    with running(app) as base, signed_in(base) as c:
        sid = start(base)["session_id"]
        seq = c.get(f"/v1/sessions/{sid}").json()["seq"]
        path = f"/_signoff/sessions/{sid}/messages"
        form = {"csrf": csrf_of(c.get(f"/_signoff/sessions/{sid}").text), "message": "x" * 70_000}
        r = c.post(path, data=form, headers=BROWSER)
        assert r.request.headers["content-length"] == str(len(r.request.content))
        assert r.status_code == 413 and r.headers["content-type"].startswith("text/html"), r.text
        assert "<code>payload_too_large</code>" in r.text
        assert "larger than this server accepts (64000 bytes)" in r.text
        assert 'aria-label="Dashboard"' not in r.text  # no reviewer's navigation: none asked
        script = c.post(path, data=form, headers={"Accept": "application/json"})
        assert script.status_code == 413
        assert script.json()["error"]["code"] == "payload_too_large"
        api = httpx.post(f"{base}/v1/sessions/{sid}/messages", content=b"x" * 70_000)
        assert api.status_code == 413 and api.json()["error"]["code"] == "payload_too_large"
        assert c.get(f"/v1/sessions/{sid}").json()["seq"] == seq


def test_a_form_post_over_the_body_limit_is_a_413_page_when_telling_who_is_signed_in_fails(
    tmp_path: Path,
) -> None:
    """The body limit's page does not ask who is signed in: an application's authenticator
    that raises (its directory down) turned the browser's 413 into a 500 `internal_error`, as
    the check ran in the middleware, outside the app's error handlers. Nothing is sent."""
    runtime = make_runtime(f"sqlite:///{tmp_path}/state.db")
    calls: list[str] = []

    def directory_down(request: Any) -> so.Principal | None:
        calls.append(request.url.path)
        raise ConnectionError("directory down")

    app = create_app(runtime, auth=directory_down, max_body_size=64_000, sweep_every=None)
    with running(app) as base:
        path = "/_signoff/sessions/ses_x/messages"
        r = httpx.post(f"{base}{path}", data={"message": "x" * 70_000}, headers=BROWSER)
        assert r.status_code == 413 and r.headers["content-type"].startswith("text/html"), r.text
        assert "<code>payload_too_large</code>" in r.text
        assert calls == []
