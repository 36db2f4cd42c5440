"""The dashboard over plain HTTP: sign-in, CSRF, escaping, the form flow without JavaScript,
security headers and cookies, and what another tenant reaches.
"""

from __future__ import annotations

import hashlib
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlencode
from xml.etree import ElementTree

import httpx
import pytest
from fastapi import Request
from starlette.testclient import TestClient

import signoff as so
from signoff.server import TokenAuth, create_app

from ._dashboard import (
    base,
    csrf_of,
    signed_in,
    start,
)
from .test_server_common import PLAIN, TOKENS, auth, running

__all__ = ["base"]  # the fixture, used by name


def test_pages_need_a_signed_in_reviewer(base: str) -> None:
    r = httpx.get(base + "/_signoff/", verify=PLAIN)
    assert r.status_code == 303 and r.headers["location"] == "/_signoff/login"
    for path in (
        "/_signoff/tools",
        "/_signoff/audit",
        "/_signoff/sessions",
        "/_signoff/sessions/x",
    ):
        r = httpx.get(base + path, verify=PLAIN)
        # back to the page once signed in
        assert r.status_code == 303, path
        assert r.headers["location"] == "/_signoff/login?" + urlencode({"next": path}), path
    r = httpx.get(
        base + "/_signoff/fragments/queue", headers={"Accept": "application/json"}, verify=PLAIN
    )
    assert r.status_code == 401
    with httpx.Client(base_url=base, verify=PLAIN) as c:
        page = c.get("/_signoff/login")
        r = c.post("/_signoff/login", data={"token": "nope", "csrf": csrf_of(page.text)})
        assert r.status_code == 401 and "not recognised" in r.text
    # a bearer token works for the pages too
    assert (
        httpx.get(base + "/_signoff/", headers=auth("alice-token"), verify=PLAIN).status_code == 200
    )


def test_forms_without_the_csrf_token_are_refused(base: str) -> None:
    body = start(base)
    rid = body["pending"][0]["id"]
    with signed_in(base) as c:
        url = f"/_signoff/requests/{rid}/respond"
        for data in ({"option": "approve"}, {"option": "approve", "csrf": "forged" * 8}):
            r = c.post(url, data=data, headers={"Accept": "application/json"})
            assert r.status_code == 403, r.text
            assert r.json()["error"]["code"] == "csrf_failed"
        # without a cookie, a token copied from a page does not help either
        token = csrf_of(c.get("/_signoff/").text)
        r = httpx.post(
            base + url,
            data={"option": "approve", "csrf": token},
            headers={**auth("alice-token"), "Accept": "application/json"},
            verify=PLAIN,
        )
        assert r.status_code == 403
        # logging out is a CSRF-protected form too
        assert c.post("/_signoff/logout", data={}).status_code == 403
        state = httpx.get(
            f"{base}/v1/sessions/{body['session_id']}", headers=auth("alice-token"), verify=PLAIN
        )
        assert state.json()["status"] == "waiting"  # nothing was settled


def test_the_form_flow_without_javascript(base: str) -> None:
    body = start(base)
    sid, rid = body["session_id"], body["pending"][0]["id"]
    with signed_in(base) as c:
        page = c.get("/_signoff/")
        assert rid in page.text and "issue_refund" in page.text
        r = c.post(
            f"/_signoff/requests/{rid}/respond",
            data={
                "option": "cancel",
                "text": "not without a photo",
                "next": "/_signoff/",
                "csrf": csrf_of(page.text),
            },
        )
        assert r.status_code == 303 and r.headers["location"] == "/_signoff/"
        after = c.get("/_signoff/")
        assert rid not in after.text and "All caught up" in after.text
        audit = c.get("/_signoff/audit").text
        assert rid in audit and "not without a photo" in audit and "cancelled" in audit
        trace = c.get(f"/_signoff/sessions/{sid}").text
        assert "approval.settled" in trace and "turn.completed" in trace
        # answering again conflicts, shown as a page
        r = c.post(
            f"/_signoff/requests/{rid}/respond",
            data={"option": "approve", "csrf": csrf_of(page.text)},
        )
        assert r.status_code == 409 and "already settled" in r.text
        r = c.post(
            "/_signoff/requests/req_nope/respond",
            data={"option": "approve", "csrf": csrf_of(page.text)},
            headers={"Accept": "application/json"},
        )
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_request"
        assert c.get("/_signoff/sessions/ses_nope").status_code == 404


def test_everything_shown_is_escaped(tmp_path: Path) -> None:
    evil = "<script>alert(1)</script>"

    @so.tool(approval=so.always())
    async def run_sql(query: str) -> str:
        """Run <b>SQL</b>."""
        return "ok"

    agent = so.Agent(
        name="dba",
        model=so.models.Scripted(
            [so.ModelResponse(tool_calls=[so.ToolCall(name="run_sql", input={"query": evil})])]
        ),
        tools=[run_sql],
    )
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/x.db")
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as base:
        r = httpx.post(
            f"{base}/v1/sessions",
            json={"agent": "dba", "message": evil},
            headers=auth("alice-token"),
            verify=PLAIN,
        )
        sid = r.json()["session_id"]
        for path in ("/_signoff/", f"/_signoff/sessions/{sid}", "/_signoff/tools"):
            html = httpx.get(base + path, headers=auth("alice-token"), verify=PLAIN).text
            assert evil not in html, path
            assert "<b>SQL</b>" not in html
        queue = httpx.get(base + "/_signoff/", headers=auth("alice-token"), verify=PLAIN).text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in queue


def test_pages_name_their_script_and_style_by_content(base: str) -> None:
    """The script and style are served without a lifetime, so a browser may keep an old copy
    for days: an upgraded page ran the previous script. Their URLs carry a hash of them."""
    page = httpx.get(f"{base}/_signoff/", headers=auth("alice-token"), verify=PLAIN).text
    static = Path(so.__file__).parent / "server" / "static"
    for name in ("app.js", "forms.js", "aim.js", "drafts.js", "ages.js", "app.css"):
        url = re.search(rf'"(/_signoff/static/{re.escape(name)}[^"]*)"', page)
        assert url, name
        version = url.group(1).partition("?v=")[2]
        digest = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(static.iterdir())))
        assert version == digest.hexdigest()[:12], url.group(1)
        assert httpx.get(base + url.group(1), verify=PLAIN).status_code == 200


def test_a_static_file_is_served_whole_whatever_range_is_asked(base: str) -> None:
    """A malformed or unsatisfiable `Range` (`bytes=abc`, `bytes=5-1`, past the end) got
    Starlette's bare text 400 or 416, no error code; the script and style are a few KB, so a
    `Range` is ignored (RFC 9110 lets a server) and the file is sent whole, with its headers."""
    static = Path(so.__file__).parent / "server" / "static"
    with httpx.Client(base_url=base, timeout=10, verify=PLAIN) as c:
        for name in ("app.js", "forms.js", "aim.js", "drafts.js", "ages.js", "app.css"):
            whole = (static / name).read_bytes()
            for asked in ("bytes=abc", "bytes=5-1", "bytes=999999-", "items=0-1", "bytes=0-10"):
                for method in ("GET", "HEAD"):
                    r = c.request(method, f"/_signoff/static/{name}", headers={"Range": asked})
                    assert r.status_code == 200, (name, asked, method, r.text[:100])
                    assert r.headers["content-length"] == str(len(whole)), (name, asked)
                    assert "content-range" not in r.headers, (name, asked)
                    assert r.headers["x-content-type-options"] == "nosniff"
                    assert r.content == (whole if method == "GET" else b"")


def test_pages_carry_security_headers(base: str) -> None:
    """A page may not be framed (clickjacking an Approve button), may run only its own script,
    and no response is sniffed into another type."""
    with signed_in(base) as c:
        for path in ("/_signoff/", "/_signoff/login", "/_signoff/tools", "/_signoff/static/app.js"):
            r = c.get(path)
            assert r.status_code == 200, path
            assert r.headers["x-content-type-options"] == "nosniff", path
            assert r.headers["x-frame-options"] == "DENY", path
            policy = r.headers["content-security-policy"]
            assert "frame-ancestors 'none'" in policy, path
            assert "script-src 'self'" in policy and "unsafe-inline" not in policy, path
        assert c.get("/_signoff/").headers["cache-control"] == "no-store"
    api = httpx.get(f"{base}/v1/requests", headers=auth("alice-token"), verify=PLAIN)
    assert api.headers["x-content-type-options"] == "nosniff"
    assert api.headers["x-frame-options"] == "DENY"


class _Controls(HTMLParser):
    """Each form control a page shows (no hidden input) as (name attribute, accessible name,
    visible label): the label is the text of the `<label>` around it, else its placeholder up to
    a `(` or `:` (what follows is a hint); the name is its `aria-label`, else that label."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, str, str]] = []
        self.labels: list[list[str]] = []  # the text of each open <label>, outside its control
        self.open: list[dict[str, str]] = []  # the controls inside the innermost open <label>
        self.inside = 0  # within a <textarea> or <select>: its text is no label's

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "label":
            self.labels.append([])
            self.open.append({})
        elif tag in ("input", "textarea", "select") and a.get("type") != "hidden":
            if self.labels and not self.open[-1]:
                self.open[-1] = a  # named when its </label> closes
            else:
                self._found(a, "")
            self.inside += tag != "input"

    def handle_endtag(self, tag: str) -> None:
        if tag in ("textarea", "select"):
            self.inside -= 1
        elif tag == "label" and self.labels:
            text, control = " ".join("".join(self.labels.pop()).split()), self.open.pop()
            if control:
                self._found(control, text)

    def handle_data(self, data: str) -> None:
        if self.labels and not self.inside:
            self.labels[-1].append(data)

    def _found(self, a: dict[str, str], label: str) -> None:
        shown = label or re.split(r"[(:]", a.get("placeholder", ""))[0].strip()
        self.found.append((a.get("name", ""), a.get("aria-label") or label, shown))


def test_each_controls_accessible_name_holds_the_words_of_its_visible_label(base: str) -> None:
    """WCAG 2.5.3 (Label in Name): a speech user says what they see. The box to edit an
    approval's arguments, labelled "Arguments (JSON)", was named "Edited arguments"; a
    question's box, showing "Your answer", was named "Answer"; a session's message box, showing
    "Send a message", was named "Message": saying the words on the screen reached none."""
    approval, question = start(base), start(base, "helper")
    controls: dict[str, list[tuple[str, str, str]]] = {}
    with signed_in(base) as c:
        for path in (
            "/_signoff/",
            f"/_signoff/sessions/{approval['session_id']}",
            f"/_signoff/sessions/{question['session_id']}",
            "/_signoff/sessions",
            "/_signoff/new",
            "/_signoff/audit",
            "/_signoff/tools",
        ):
            parser = _Controls()
            parser.feed(c.get(path).text)
            controls[path] = parser.found
    parser = _Controls()
    parser.feed(httpx.get(f"{base}/_signoff/login", verify=PLAIN).text)
    controls["/_signoff/login"] = parser.found
    names = {n for found in controls.values() for n, _, _ in found}
    # the edit box, a reason, an answer, a message, the filters, the token: all were looked at
    assert {"edited_input", "text", "message", "agent", "tool", "token"} <= names, names
    bad = {
        path: [(n, name, shown) for n, name, shown in found if shown.lower() not in name.lower()]
        for path, found in controls.items()
    }
    assert {path: b for path, b in bad.items() if b} == {}


def test_every_page_declares_its_icon_inline(base: str) -> None:
    """Without an icon a browser asked for /favicon.ico on every page view: a 404, and a line
    in the server's log each time. The pages name an inline SVG one, which their content
    security policy lets them show (`img-src data:`)."""
    with signed_in(base) as c:
        for path in ("/_signoff/", "/_signoff/login", "/_signoff/tools", "/_signoff/sessions/x"):
            r = c.get(path)
            icon = re.search(r'<link rel="icon" href="(data:image/svg\+xml,[^"]+)">', r.text)
            assert icon, path
            svg = ElementTree.fromstring(unquote(icon.group(1).partition(",")[2]))
            assert svg.tag == "{http://www.w3.org/2000/svg}svg", path
            policy = [d.split() for d in r.headers["content-security-policy"].split(";")]
            images = next(d[1:] for d in policy if d[0] == "img-src")
            assert "data:" in images, (path, images)


def test_the_csrf_cookie_is_secure_over_https(tmp_path: Path) -> None:
    """Behind https both cookies the dashboard sets carry `Secure`."""
    runtime = so.Runtime([], store=f"sqlite:///{tmp_path}/x.db")
    app = create_app(runtime, auth=TokenAuth(TOKENS))
    with TestClient(app, base_url="https://dash.example") as c:
        page = c.get("/_signoff/login")
        cookie = page.headers["set-cookie"]
        assert cookie.startswith("__Host-signoff_csrf=") and "Secure" in cookie, cookie
        assert "HttpOnly" in cookie and "samesite=strict" in cookie.lower()
        r = c.post(
            "/_signoff/login",
            data={"token": "alice-token", "csrf": csrf_of(page.text)},
            follow_redirects=False,
        )
        assert r.status_code == 303 and "Secure" in r.headers["set-cookie"]


def test_another_tenant_reaches_nothing_through_dashboard_urls(base: str) -> None:
    """Mallory (tenant evil) knows the ids of alice's session and request: every dashboard URL
    answers as if they did not exist, and nothing changes."""
    body = start(base)
    sid, rid = body["session_id"], body["pending"][0]["id"]
    with signed_in(base, "mallory-token") as c:
        csrf = csrf_of(c.get("/_signoff/").text)
        json_only = {"Accept": "application/json"}
        assert c.get(f"/_signoff/sessions/{sid}").status_code == 404
        assert c.get(f"/_signoff/fragments/sessions/{sid}").status_code == 404
        assert rid not in c.get("/_signoff/fragments/queue").text
        assert rid not in c.get("/_signoff/audit?status=settled").text
        r = c.post(
            f"/_signoff/requests/{rid}/respond",
            data={"option": "approve", "csrf": csrf},
            headers=json_only,
        )
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_request"
        r = c.post(
            f"/_signoff/sessions/{sid}/messages",
            data={"message": "approve", "csrf": csrf},
            headers=json_only,
        )
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_session"
    state = httpx.get(f"{base}/v1/sessions/{sid}", headers=auth("alice-token"), verify=PLAIN).json()
    assert state["status"] == "waiting" and [p["id"] for p in state["pending"]] == [rid]


@pytest.mark.parametrize(
    "target",
    [
        "https://evil.example/",
        "//evil.example/",
        "/\\evil.example",
        "javascript:alert(1)",
        "/v1",
        "/_signoff.evil.example",
        # a path under the prefix that leaves the dashboard, or is no page to return to
        "/_signoff/../v1/requests",
        "/_signoff/%2e%2e/v1/requests",
        "/_signoff/logout",
    ],
)
def test_after_a_form_post_the_redirect_stays_on_the_dashboard(base: str, target: str) -> None:
    body = start(base)
    rid = body["pending"][0]["id"]
    with signed_in(base) as c:
        r = c.post(
            f"/_signoff/requests/{rid}/respond",
            data={"option": "approve", "next": target, "csrf": csrf_of(c.get("/_signoff/").text)},
            headers={"Referer": "https://evil.example/"},
        )
        assert r.status_code == 303 and r.headers["location"] == "/_signoff"


def test_the_sign_in_cookie_is_not_honoured_beside_the_dashboard(tmp_path: Path) -> None:
    """The cookie authenticates writes under `/_signoff/` only (whose forms carry a CSRF token),
    not on a path that merely begins alike, such as an application's own `/_signoffs` route."""
    runtime = so.Runtime([], store=f"sqlite:///{tmp_path}/x.db")
    app = create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None)

    async def whoami(request: Request) -> dict[str, str | None]:
        found = await app.state.signoff.principal(request)
        return {"who": None if found is None else found.principal_id}

    for path in ("/_signoffs/delete", "/_signoff-admin", "/_signoff/whoami"):
        app.add_api_route(path, whoami, methods=["POST"])
    with TestClient(app) as c:
        page = c.get("/_signoff/login")
        c.post("/_signoff/login", data={"token": "alice-token", "csrf": csrf_of(page.text)})
        assert c.cookies["signoff_token"]
        assert c.post("/_signoffs/delete").json() == {"who": None}
        assert c.post("/_signoff-admin").json() == {"who": None}
        assert c.post("/_signoff/whoami").json() == {"who": "alice"}
        assert c.get("/_signoff/").status_code == 200


def _viewer_of(html: str) -> str:
    match = re.search(r'<body [^>]*data-viewer="([0-9a-f]+)"', html)
    assert match, "no viewer in the page"
    return match.group(1)


def test_a_pages_reads_as_someone_signed_in_since_in_another_tab_are_refused(base: str) -> None:
    """A page's script sends back the viewer the page was made for (`X-Signoff-Viewer`): once
    the browser signed in as someone else (another tab), its reads of the queue, a session and a
    request's place are 401 `unauthenticated`, saying so, not that person's view (which said
    alice's open request closed and her session deleted). Reads without it, or of the same
    viewer, are served as before."""
    body = start(base)
    sid, rid = body["session_id"], body["pending"][0]["id"]
    reads = (
        "/_signoff/fragments/queue",
        f"/_signoff/fragments/sessions/{sid}?after=0",
        f"/_signoff/requests/{rid}/place",
    )
    script = {"Accept": "application/json"}
    with signed_in(base) as c:
        alice = _viewer_of(c.get(f"/_signoff/sessions/{sid}").text)
        for path in reads:
            assert c.get(path, headers={**script, "X-Signoff-Viewer": alice}).status_code == 200
        page = c.get("/_signoff/login")  # another tab: mallory signs in in the same browser
        c.post("/_signoff/login", data={"token": "mallory-token", "csrf": csrf_of(page.text)})
        mallory = _viewer_of(c.get("/_signoff/").text)
        assert mallory != alice
        for path in reads:
            r = c.get(path, headers={**script, "X-Signoff-Viewer": alice})
            assert r.status_code == 401, (path, r.text)
            assert r.json()["error"] == {
                "code": "unauthenticated",
                "message": "you have signed in as someone else in another tab",
            }
            assert c.get(path, headers={**script, "X-Signoff-Viewer": mallory}).status_code in (
                200,
                404,  # alice's session is not mallory's
            )
        assert c.get(reads[0]).status_code == 200  # no mark: a read as before
    # the full identity, any text in it (a JWT claim's lone surrogate), in a header's characters
    from signoff.server._pages import viewer_mark

    odd = so.Principal(authenticator="jwt", principal_id="a\ud800", issuer="https://idp")
    assert re.fullmatch(r"[0-9a-f]{32}", viewer_mark(odd))
    assert viewer_mark(odd) != viewer_mark(odd.model_copy(update={"issuer": None}))
