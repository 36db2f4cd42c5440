"""A JSON body labelled with a charset other than UTF-8 is refused, as a form's is: the server
reads every body as UTF-8, and a gateway that decodes one by its label reads something else."""

from __future__ import annotations

import json

import httpx
import pytest

from ._server_api import error
from .test_server_common import PLAIN, auth, make_runtime, served


def _events(store_url: str) -> list[tuple[str, int]]:
    rt = make_runtime(store_url)
    try:
        return sorted((s.id, len(rt.events_sync(s.id))) for s in rt.sessions_sync())
    finally:
        rt.close_sync()


@pytest.mark.parametrize("charset", ["utf-16", "latin-1", "UTF-32LE", "ebcdic-x", '"utf-16"'])
def test_a_json_body_labelled_another_charset_is_refused(store_url: str, charset: str) -> None:
    """`Content-Type: application/json; charset=utf-16` on a UTF-8 body approved the call:
    the server read the bytes as UTF-8 while a gateway decoding by the label (as the
    dashboard's forms are decoded) inspected other text. It is 400 `malformed_json` naming
    the label, and nothing is stored; `charset=utf-8` (any spelling) is taken."""
    with (
        served(store_url) as base,
        httpx.Client(base_url=base, headers=auth("alice-token"), verify=PLAIN) as alice,
    ):
        r = alice.post("/v1/sessions", json={"agent": "support", "message": "Refund 1042"})
        sid, rid = r.json()["session_id"], r.json()["pending"][0]["id"]
        before = _events(store_url)
        approve = json.dumps({"approvals": [{"id": rid, "approved": True}]}).encode()
        start = json.dumps({"agent": "support", "message": "Refund 1043"}).encode()
        labelled = {"Content-Type": f"application/json; charset={charset}"}
        for path, body in ((f"/v1/sessions/{sid}/approvals", approve), ("/v1/sessions", start)):
            r = alice.post(path, content=body, headers=labelled)
            assert charset.strip('"') in error(r, 400, "malformed_json")["message"]
        assert _events(store_url) == before
        for spelling in ("utf-8", "UTF8", '"UTF-8"'):
            sent = {"Content-Type": f"application/json;charset={spelling}"}
            r = alice.post("/v1/sessions", content=start, headers=sent)
            assert r.status_code == 201, r.text
        r = alice.post(f"/v1/sessions/{sid}/approvals", content=approve, headers=labelled)
        error(r, 400, "malformed_json")
