"""A request that gives both a `Content-Length` and a `Transfer-Encoding` is refused and its
connection closed (RFC 9112, section 6.3): a proxy that frames it by the length and the server
by the chunks would read two requests where the proxy passed one."""

from __future__ import annotations

import json
import socket

import httpx

from .test_server_common import PLAIN, auth, make_runtime, served


def _exchange(base: str, data: bytes) -> bytes:
    """What the server sends back on one connection to `data`, until it closes it (or 3 s)."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=3) as conn:
        conn.sendall(data)
        out = b""
        try:
            while chunk := conn.recv(65536):
                out += chunk
        except TimeoutError:
            pass
    return out


def _events(store_url: str, session_id: str) -> list[str]:
    rt = make_runtime(store_url)
    try:
        return [e.type for e in rt.events_sync(session_id)]
    finally:
        rt.close_sync()


def test_a_request_with_a_length_and_chunks_is_refused_and_its_connection_closed(
    store_url: str,
) -> None:
    """Under uvicorn's h11 parser such a request was framed by its chunks and served (the
    approval applied), and the bytes its length still covered were served as a second request
    on the same connection (a cancel no proxy saw): now one 400 `malformed_request`, with
    `Connection: close`, and nothing of either is stored."""
    with (
        served(store_url) as base,
        httpx.Client(base_url=base, headers=auth("alice-token"), verify=PLAIN) as alice,
    ):
        r = alice.post("/v1/sessions", json={"agent": "support", "message": "Refund 1042"})
        sid, rid = r.json()["session_id"], r.json()["pending"][0]["id"]
        before = _events(store_url, sid)
        body = json.dumps({"approvals": [{"id": rid, "approved": True}]}).encode()
        hidden = (
            f"POST /v1/sessions/{sid}/cancel HTTP/1.1\r\nHost: x\r\n"
            "Authorization: Bearer alice-token\r\nContent-Length: 0\r\n\r\n"
        ).encode()
        framed = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n" + hidden
        head = (
            f"POST /v1/sessions/{sid}/approvals HTTP/1.1\r\nHost: x\r\n"
            "Authorization: Bearer alice-token\r\nContent-Type: application/json\r\n"
            f"Transfer-Encoding: chunked\r\nContent-Length: {len(framed)}\r\n\r\n"
        ).encode()
        out = _exchange(base, head + framed)
        assert out.count(b"HTTP/1.1 ") == 1, out
        status, _, rest = out.partition(b"\r\n")
        headers, _, answer = rest.partition(b"\r\n\r\n")
        assert status == b"HTTP/1.1 400 Bad Request", out
        assert b"connection: close" in headers.lower(), out
        error = json.loads(answer)["error"]
        assert error["code"] == "malformed_request", error
        assert "Transfer-Encoding" in error["message"], error
        assert _events(store_url, sid) == before
        assert alice.get(f"/v1/sessions/{sid}").json()["status"] == "waiting"
        # The same request framed one way only is served.
        plain = head.replace(f"Content-Length: {len(framed)}\r\n".encode(), b"")
        out = _exchange(base, plain + framed[: -len(hidden)])
        assert out.startswith(b"HTTP/1.1 200 OK"), out
        assert alice.get(f"/v1/sessions/{sid}").json()["status"] == "idle"
