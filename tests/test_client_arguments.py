"""`AsyncClient` / `Client` given arguments of the wrong type: a `UsageError` naming the mistake,
before any call is sent, as `Runtime` raises for the same mistake; and an error for a server
that cannot be reached names the URL that was called."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

import signoff as so
from signoff.server import AsyncClient, Client

from ._client import Canned, canned

__all__ = ["canned"]  # the fixture, used by name


@pytest.mark.parametrize("token", [5, b"secret", ["t"]], ids=["int", "bytes", "list"])
def test_a_token_that_is_not_text_is_refused_at_once(token: Any) -> None:
    """It was an AttributeError (`'int' object has no attribute 'isascii'`)."""
    for make in (AsyncClient, Client):
        with pytest.raises(so.UsageError, match="^the token must be text, not "):
            make("http://127.0.0.1:9", token=token)


@pytest.mark.parametrize("base_url", [None, 5, b"http://127.0.0.1:9"], ids=["none", "int", "bytes"])
def test_a_base_url_that_is_not_text_is_refused_at_once(base_url: Any) -> None:
    """It was httpx's TypeError (`Invalid type for url`)."""
    for make in (AsyncClient, Client):
        with pytest.raises(so.UsageError, match="^the base URL must be text"):
            make(base_url)


@pytest.mark.parametrize("session_id", [5, None, ["ses_x"]], ids=["int", "none", "list"])
async def test_a_session_id_that_is_not_text_is_a_usage_error_without_a_call(
    canned: Canned, session_id: Any
) -> None:
    """As `Runtime` says it (`session_id must be text`); a number was a bare TypeError
    (`argument of type 'int' is not iterable`), None an `UnknownSession` of `None`."""
    async with AsyncClient(canned.base) as c:
        calls = [
            lambda: c.state(session_id),
            lambda: c.cancel(session_id),
            lambda: c.send(session_id, "hi"),
            lambda: c.respond(session_id, [{"request_id": "req_1", "option_id": "approve"}]),
            lambda: c.session(session_id),
        ]
        for call in calls:
            with pytest.raises(so.UsageError, match="^session_id must be text, not "):
                await call()
        with pytest.raises(so.UsageError, match="^session_id must be text, not "):
            _ = [e async for e in c.events(session_id, follow=False)]
    with Client(canned.base) as blocking:
        with pytest.raises(so.UsageError, match="^session_id must be text, not "):
            blocking.state(session_id)
        with pytest.raises(so.UsageError, match="^session_id must be text, not "):
            blocking.events(session_id)
    assert canned.seen == []


async def test_a_session_id_or_filter_holding_a_lone_surrogate_is_refused_without_a_call(
    canned: Canned,
) -> None:
    """As `Runtime` refuses them: an id no session can have is an unknown session, and a
    filter no store can look up a usage error. Each was a bare UnicodeEncodeError, raised
    while the URL was made."""
    odd = "ses_\ud800"
    async with AsyncClient(canned.base) as c:
        calls = [
            lambda: c.state(odd),
            lambda: c.cancel(odd),
            lambda: c.send(odd, "hi"),
            lambda: c.respond(odd, [{"request_id": "req_1", "option_id": "approve"}]),
            lambda: c.generate(session_id=odd, approvals=[so.Decision(id="r", approved=True)]),
            lambda: c.session(odd),
        ]
        for call in calls:
            with pytest.raises(so.UnknownSession) as info:
                await call()
            assert info.value.session_id == odd
        with pytest.raises(so.UnknownSession):
            _ = [e async for e in c.events(odd, follow=False)]
        for listing in (
            lambda: c.pending(agent=odd),
            lambda: c.pending(tool_name=odd),
            lambda: c.sessions(agent=odd),
        ):
            with pytest.raises(so.UsageError, match="lone surrogate"):
                await listing()
    with Client(canned.base) as blocking:
        with pytest.raises(so.UnknownSession):
            blocking.state(odd)
    assert canned.seen == []


async def test_a_session_id_or_filter_too_long_for_a_url_is_refused_without_a_call(
    canned: Canned,
) -> None:
    """As `Runtime` answers them (no session has such an id); each was a raw
    `httpx.InvalidURL`, the URL too long."""
    long = "x" * 70_000
    async with AsyncClient(canned.base) as c:
        with pytest.raises(so.UnknownSession):
            await c.state("ses_" + long)
        with pytest.raises(so.UsageError, match="URL is unusable"):
            await c.pending(kind=long)  # type: ignore[arg-type]
        with pytest.raises(so.UsageError, match="URL is unusable"):
            await c.sessions(status=long)  # type: ignore[arg-type]
    with Client(canned.base) as blocking:
        with pytest.raises(so.UsageError, match="URL is unusable"):
            blocking.pending(agent=long)
    assert canned.seen == []


@pytest.mark.parametrize("base", ["http://signoff.test:8000", "http://signoff.test:8000/"])
async def test_a_server_that_cannot_be_reached_is_named_by_the_url_called(base: str) -> None:
    """The URL was the base and the path run together (`http://signoff.test:8000v1/sessions`)
    when the base URL had no path, as a server's usually has not."""

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    async with AsyncClient(base, transport=httpx.MockTransport(refuse)) as c:
        with pytest.raises(so.RemoteError) as info:
            await c.state("ses_x")
        assert str(info.value).startswith("http://signoff.test:8000/v1/sessions/ses_x: ")
        with pytest.raises(so.RemoteError) as info:
            _ = [e async for e in c.events("ses_x", follow=False, retries=0)]
        assert str(info.value).startswith("http://signoff.test:8000/v1/sessions/ses_x/events: ")


async def test_a_base_url_with_a_path_keeps_it_in_the_url_named() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    transport = httpx.MockTransport(refuse)
    async with AsyncClient("http://signoff.test/api", transport=transport) as c:
        with pytest.raises(so.RemoteError, match=r"^http://signoff\.test/api/v1/requests: "):
            await c.pending()


LISTING_MISTAKES: dict[str, dict[str, Any]] = {
    "limit-text": {"limit": "5"},
    "offset-text": {"offset": "10"},
    "limit-float": {"limit": 5.0},
    "limit-bool": {"limit": True},
    "agent-int": {"agent": 5},
    "older-than-text": {"older_than": "90"},
    "older-than-nan": {"older_than": float("nan")},
}


@pytest.mark.parametrize("mistake", LISTING_MISTAKES, ids=list(LISTING_MISTAKES))
async def test_a_listing_given_the_wrong_type_is_a_usage_error_without_a_call(
    canned: Canned, mistake: str
) -> None:
    """As `Runtime.pending` / `Runtime.sessions` refuse them: a text limit or agent went out in
    the query string and the server took it (`limit="5"` read a page of 5, `agent=5` listed
    the sessions of an agent named "5"), so the same call passed over HTTP and failed in
    process; the others were refused only by the server, after a round trip."""
    kwargs = LISTING_MISTAKES[mistake]
    async with AsyncClient(canned.base) as c:
        with pytest.raises(so.UsageError):
            await c.pending(**kwargs)
        if "older_than" not in kwargs:
            with pytest.raises(so.UsageError):
                await c.sessions(**kwargs)
    with Client(canned.base) as blocking:
        with pytest.raises(so.UsageError):
            blocking.pending(**kwargs)
    assert canned.seen == []
