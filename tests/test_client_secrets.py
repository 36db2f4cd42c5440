"""The client's secrets stay out of what it raises: a password in the base URL's userinfo (a
proxy's basic authentication) is in no error's text or repr, whatever the call met."""

from __future__ import annotations

import base64
import logging
import socket

import httpx
import pytest

import signoff as so
from signoff.server import AsyncClient, Client

from ._client import EVENTS, Canned, canned, dropped, http, stream

__all__ = ["canned"]  # the fixture, used by name

SECRET = "pw-s3cret-9f2"


def with_userinfo(base: str) -> str:
    return base.replace("http://", f"http://proxy-user:{SECRET}@")


def shown(exc: BaseException) -> str:
    """Everything an error shows: its text, repr and notes, and those of its causes."""
    parts: list[str] = []
    seen: BaseException | None = exc
    while seen is not None:
        parts += [str(seen), repr(seen), *getattr(seen, "__notes__", [])]
        seen = seen.__cause__ or seen.__context__
    return "\n".join(parts)


@pytest.mark.parametrize(
    "reply",
    [
        http("200 OK", "<html>a login page</html>", "text/html"),  # not JSON
        http("200 OK", '{"items": 5}'),  # JSON of the wrong shape
        http("200 OK", '{"items": [], "tot'),  # JSON cut off
        dropped,  # the connection lost before the answer
    ],
    ids=["html", "wrong-shape", "truncated", "dropped"],
)
async def test_a_password_in_the_base_url_is_in_no_error(canned: Canned, reply: object) -> None:
    canned.on("/v1/requests", reply)  # type: ignore[arg-type]
    canned.on("/v1/sessions/ses_x", reply)  # type: ignore[arg-type]
    async with AsyncClient(with_userinfo(canned.base), timeout=5) as c:
        for call in (c.pending(), c.state("ses_x")):
            with pytest.raises(so.RemoteError) as caught:
                await call
            assert "127.0.0.1" in str(caught.value)  # the server is still named
            assert SECRET not in shown(caught.value)


async def test_a_password_in_the_base_url_is_not_in_a_streams_error(canned: Canned) -> None:
    canned.on(EVENTS, stream(""))  # closed at once, each time
    async with AsyncClient(with_userinfo(canned.base), timeout=5) as c:
        with pytest.raises(so.RemoteError) as caught:
            [e async for e in c.events("ses_x", retries=0)]
    assert SECRET not in shown(caught.value)


def test_a_password_in_the_base_url_of_a_server_not_there_is_in_no_error() -> None:
    with socket.socket() as free:  # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with Client(f"http://proxy-user:{SECRET}@127.0.0.1:{port}", timeout=5) as c:
        with pytest.raises(so.RemoteError) as caught:
            c.send("ses_x", "hello")
    assert caught.value.code == "unreachable" and f"127.0.0.1:{port}" in str(caught.value)
    assert SECRET not in shown(caught.value)


async def test_a_password_in_the_base_url_is_sent_but_never_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """httpx logs each request's URL at INFO (`HTTP Request: GET http://user:pw@host/...`): the
    password went to the application's log on every call. It is sent as basic authentication
    still, which is what the userinfo asked for."""
    seen: list[str | None] = []

    def server(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(200, json={"status": "idle"})

    caplog.set_level(logging.DEBUG)
    base = f"http://proxy-user:{SECRET}@signoff.test"
    async with AsyncClient(base, transport=httpx.MockTransport(server)) as c:
        assert (await c.state("ses_x"))["status"] == "idle"
    with Client(base, transport=httpx.MockTransport(server)) as blocking:
        blocking.state("ses_x")
    basic = base64.b64encode(f"proxy-user:{SECRET}".encode()).decode()
    assert seen == [f"Basic {basic}"] * 2
    assert caplog.records and "signoff.test" in caplog.text  # the call was logged, and
    assert SECRET not in caplog.text  # without the password


def test_a_token_and_a_password_in_the_base_url_are_refused_at_once() -> None:
    """Both go in the Authorization header: httpx sent the userinfo's basic authentication in
    place of the token, and the server answered `unauthenticated` to a client given one."""
    for make in (AsyncClient, Client):
        with pytest.raises(so.UsageError, match="userinfo") as caught:
            make(f"http://proxy-user:{SECRET}@127.0.0.1:9", token="alice-token")
        assert SECRET not in shown(caught.value)
