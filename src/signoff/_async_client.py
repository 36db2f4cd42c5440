"""`AsyncClient`: the HTTP API from Python, with the method names of `Runtime` (its blocking
twin, `Client`, is in `_client`).

The calls that start a conversation or send a message carry an idempotency key, and one that
got no answer is sent once more with it (`_keyed_calls`).

`LiveSession` (in `_live_session`) folds a session's stream; `RemoteResult` and the bodies the
calls send are in `_payloads`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import (
    AsyncGenerator,
    Callable,
    Mapping,
    Sequence,
)
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import httpx

from . import _exceptions as errors
from . import _wire as wire
from ._answers import decisions
from ._events import Event, check_shown_event
from ._idempotency import check_key
from ._keyed_calls import keyed_turn
from ._live_session import LiveSession
from ._payloads import RemoteResult, decision_body, encode, input_responses, response_body
from ._prompts import check_prompt
from ._remote_events import remote_events, too_large
from ._server_clock import ServerClock
from ._session_cache import check_agent_name
from ._settings import check_page, finite, flag, seconds, whole
from ._text import is_utf8
from ._types import (
    Decision,
    InputRequest,
    InputResponse,
    RequestKind,
    RequestStatus,
    SessionStatus,
)
from .models._reply_cap import KNOWN_ENCODINGS, ReplyTooLarge, cap_reply, check_reply_cap
from .stores import SessionSummary

__all__ = ["DEFAULT_MAX_REPLY_BYTES", "AsyncClient", "RemoteError"]


RemoteError = errors.RemoteError
T = TypeVar("T")

DEFAULT_MAX_REPLY_BYTES = 64 * 1024 * 1024
"""A reply longer than this (as inflated), or a line of an event stream, fails the call: far
over a page of 500 sessions or requests, or a long session's state."""


_MAX_SESSION_ID = 1000
"""The longest session id the client sends: signoff's are 24 characters, and one of 70,000 was
a raw `httpx.InvalidURL` (the URL too long) where `Runtime` says `UnknownSession`."""


def _session_path(session_id: str, tail: str = "") -> str:
    """The path of a session's resource, its id quoted as one segment: a `?`, `#`, `/` or `..`
    in an id must not reach another session (no session has such an id)."""
    if not isinstance(session_id, str):  # as `Runtime` says it (a bare TypeError here)
        raise errors.UsageError(f"session_id must be text, not {type(session_id).__name__}")
    if (
        not session_id
        or "/" in session_id
        or session_id in (".", "..")
        or not is_utf8(session_id)  # a lone surrogate: no URL can hold one either
        or len(session_id) > _MAX_SESSION_ID
    ):
        raise errors.UnknownSession(session_id)
    return f"/v1/sessions/{quote(session_id, safe='')}{tail}"


def _deleted(body: Any) -> list[str]:
    """The ids a deletion's answer lists (`{"deleted": [...]}`)."""
    ids = body["deleted"]
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise TypeError("deleted must be a list of ids")
    return ids


def _pruned(body: Any) -> dict[str, Any]:
    """A prune's answer: `deleted`, `listed` and `damaged` (lists of ids; a server before
    `damaged` answers none) and `more` (a bool)."""
    ids = [body["deleted"], body["listed"], body.get("damaged", [])]
    if not all(isinstance(x, list) and all(isinstance(i, str) for i in x) for x in ids):
        raise TypeError("deleted, listed and damaged must be lists of ids")
    if not isinstance(body["more"], bool):
        raise TypeError("more must be a bool")
    return {"deleted": ids[0], "listed": ids[1], "more": body["more"], "damaged": ids[2]}


def _filter(name: str, value: str | None) -> None:
    """Refuse a listing's text filter that is not text, or holds a lone surrogate, as `Runtime`
    does: the query string carried a number as text, and no URL can carry a lone surrogate."""
    if value is not None and not isinstance(value, str):
        raise errors.UsageError(f"{name} must be text or None, not {value!r}")
    if isinstance(value, str) and not is_utf8(value):
        raise errors.UsageError(f"{name} is not valid Unicode text: it holds a lone surrogate")


class AsyncClient:
    """The signoff HTTP API (`/v1`), async; pass `token` for bearer authentication, and `verify`
    an `ssl.SSLContext` for an https server whose certificate authority is a private one. A
    reply is read up to `max_reply_bytes` (a stream's, line by line), so a broken or hostile
    server cannot fill the process's memory."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = 60.0,
        transport: httpx.AsyncBaseTransport | None = None,
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        if not isinstance(verify, (bool, ssl.SSLContext)):  # a CA file's path: httpx deprecates it
            raise errors.UsageError(
                "verify must be True, False or an ssl.SSLContext (for a CA file: "
                f"ssl.create_default_context(cafile=...)), not {verify!r}"
            )
        if token is not None and not isinstance(token, str):  # an AttributeError below
            raise errors.UsageError(f"the token must be text, not {type(token).__name__}")
        if not isinstance(base_url, str):  # httpx's TypeError
            raise errors.UsageError(f"the base URL must be text (http(s)://…), not {base_url!r}")
        if token and not (token.isascii() and token.isprintable() and token == token.strip()):
            raise errors.UsageError(
                "the token is not printable ASCII without spaces around it: "
                "no Authorization header can carry it"
            )
        try:
            url = httpx.URL(base_url)
        except httpx.InvalidURL:
            url = httpx.URL()
        if url.scheme not in ("http", "https"):
            shown = wire.shown_url(url) if url.userinfo else base_url
            raise errors.UsageError(f"the base URL must be http(s)://host[:port], not {shown!r}")
        if b"?" in url.raw_path or url.fragment:  # each call's path would go in the query
            bare = wire.shown_url(url.copy_with(query=None, fragment=None))
            raise errors.UsageError(
                f"the base URL takes no query or fragment (each call's path goes after it): "
                f"{bare!r} with ?… or #… (left out here: it may hold a key)"
            )
        # A user and password in the URL are sent as basic authentication, but from `auth`,
        # not the URL, which httpx logs at each call (and errors show).
        basic = None
        if url.userinfo:
            if token:
                raise errors.UsageError(
                    "the base URL holds a userinfo (user:password@) and a token is given: both "
                    "go in the Authorization header, and the token would not be sent"
                )
            basic = httpx.BasicAuth(url.username, url.password)
            base_url = str(url.copy_with(userinfo=b""))
        seconds("timeout", timeout)  # httpx took 0, NaN or "5", and every call failed
        if transport is not None and not isinstance(transport, httpx.AsyncBaseTransport):
            # Taken as it was, every call (and the close) was a bare AttributeError.
            sync = (
                " (a sync transport cannot serve the client's async calls)"
                if isinstance(transport, httpx.BaseTransport)
                else ""
            )
            raise errors.UsageError(
                "transport must be an httpx.AsyncBaseTransport (httpx.AsyncHTTPTransport, "
                f"httpx.ASGITransport), not {type(transport).__name__}{sync}"
            )
        self._max_reply = cap = check_reply_cap("AsyncClient", max_reply_bytes)
        self._timeout = float(timeout)
        headers = {"Accept-Encoding": KNOWN_ENCODINGS}
        if token:
            headers["Authorization"] = f"Bearer {token}"

        self._clock = clock = ServerClock()

        async def cap_replies(response: httpx.Response) -> None:
            clock.seen(response.headers)  # the server's time, as each answer arrives
            cap_reply(response, cap, ReplyTooLarge, streams=True)

        self.http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers=headers,
            auth=basic,
            timeout=timeout,
            transport=transport,
            verify=verify,
            event_hooks={"response": [cap_replies]},
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = asyncio.Event()  # set by `aclose`: it ends a stream's pause at once

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the client's connections; a later call raises `UsageError`."""
        self._closing.set()
        if self._loop not in (None, asyncio.get_running_loop()):
            # Its pooled connections belong to an earlier loop (closed by its asyncio.run), so
            # closing them here is a bare RuntimeError: they were dropped with that loop.
            with contextlib.suppress(RuntimeError):
                await self.http.aclose()
            return
        await self.http.aclose()

    def server_time(self) -> float:
        """The server's time now, as its answers so far give it (`X-Signoff-Time`, else `Date`),
        in seconds since the epoch: its runtime's clock (`Runtime.now`), not this machine's,
        which may be off it. Before any answer (or from a server giving neither), this
        machine's clock."""
        return self._clock.now()

    async def _pause(self, seconds: float) -> None:
        """Wait `seconds` before a stream's next try, or until the client closes, which raises
        `UsageError`: a pause of up to a `Retry-After`'s 30 s held `Client.close()` back."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._closing.wait(), seconds)
        self._check_open()

    def _check_open(self) -> None:
        """Refuse a call on a closed client, or from another event loop than the first call's
        (its pooled connections belong to that loop: httpx would fail, `Event loop is closed`)."""
        if self.http.is_closed:
            raise errors.UsageError("the client is closed")
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            raise errors.UsageError(
                "this AsyncClient was first used on another event loop (an earlier asyncio.run?)"
                ": make one per loop, or use the blocking Client"
            )

    def _url(self, path: str) -> str:
        """The full URL of `path`, for an error to name (without a password: `shown_url`):
        httpx gives a base URL without a path no trailing slash (`http://host:8000v1/sessions`,
        the errors said)."""
        return f"{wire.shown_url(self.http.base_url).rstrip('/')}{path}"

    def _too_slow(self, path: str) -> errors.RemoteError:
        """A call (or a stream's opening) whose answer took longer than twice the timeout."""
        return errors.RemoteError(
            f"{self._url(path)}: the server did not finish its answer within "
            f"{2 * self._timeout:g} s (twice the client's timeout); the call may or may not "
            "have been applied",
            "timeout",
            0,
        )

    async def _call(
        self, method: str, path: str, parse: Callable[[Any], T], wanted: str, **kwargs: Any
    ) -> T:
        """Send a request and read its JSON answer with `parse`: an answer `parse` cannot read
        (another server, a proxy's page) is a `RemoteError` naming what was `wanted`. The whole
        call gives up after twice the timeout, which httpx applies to each wait only."""
        self._check_open()
        if "json" in kwargs:
            kwargs["content"] = encode(path, kwargs.pop("json"))
            kwargs["headers"] = {**kwargs.get("headers", {}), "Content-Type": "application/json"}
        try:  # httpx's timeout bounds each wait, not an answer trickled byte by byte
            async with asyncio.timeout(2 * self._timeout):
                response = await self.http.request(method, path, **kwargs)
        except TimeoutError:
            raise self._too_slow(path) from None
        except httpx.TransportError as exc:
            raise wire.transport_error(exc, self._url(path)) from exc
        except ReplyTooLarge as exc:
            raise too_large(exc) from None
        except httpx.InvalidURL as exc:  # a filter of 70,000 characters: no URL holds it
            raise errors.UsageError(
                f"the request cannot be sent: its URL is unusable ({exc})"
            ) from None
        wire.raise_for(response)
        try:
            data = response.json()
        except (ValueError, RecursionError):  # not JSON (or nested past the parser's depth):
            # the base URL is not a signoff server
            raise wire.not_signoff(response, "JSON") from None
        try:
            return parse(data)
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise wire.malformed(response, wanted, exc) from None

    async def _turn(self, path: str, body: Any) -> RemoteResult:
        return await self._call("POST", path, RemoteResult.from_json, "a turn's result", json=body)

    async def _keyed_turn(self, path: str, body: Any, key: str | None) -> RemoteResult:
        """A call that starts a conversation or sends a message: sent under its idempotency
        key, and once more if it got no answer (`_keyed_calls`)."""

        async def send(headers: dict[str, str]) -> RemoteResult:
            parse, wanted = RemoteResult.from_json, "a turn's result"
            return await self._call("POST", path, parse, wanted, json=body, headers=headers)

        return await keyed_turn(send, key)

    async def generate(
        self,
        agent: str | None = None,
        prompt: str | None = None,
        *,
        session_id: str | None = None,
        approvals: Sequence[Decision | Mapping[str, Any]] | None = None,
        idempotency_key: str | None = None,
    ) -> RemoteResult:
        """Start a session (agent + prompt), open an empty one (agent alone), continue one
        (session_id + prompt: refused while its turn runs or waits on a request, as
        `Runtime.generate` does), settle all of its approvals at once (session_id + approvals),
        or resume its turn (session_id alone: a retry after a failure).
        A prompt or a new session goes with an idempotency key, `idempotency_key` or a new one
        (see `send`): a new session is opened once, however often the call is sent."""
        if idempotency_key is not None and prompt is None and session_id is not None:
            raise errors.UsageError(
                "idempotency_key goes with a prompt or a new session: it keys the message it "
                "sends or the session it opens"
            )
        if approvals is not None:
            if prompt is not None:  # as `Runtime.generate` refuses them
                raise errors.InvalidAnswer(
                    "approvals must be sent on their own: this call carries a prompt too; "
                    "send the prompt in the next call"
                )
            if session_id is None:
                raise errors.UsageError("approvals need the session_id they belong to")
            given = decisions(approvals)
            if not given:
                raise errors.InvalidAnswer(
                    "approvals is empty: answer the session's pending requests"
                )
            body: dict[str, Any] = {"approvals": [decision_body(d) for d in given]}
            if agent is not None:  # the server refuses another agent's name, as in process
                if not isinstance(agent, str):  # as `Runtime` says it, before asking
                    raise errors.UsageError(
                        f"agent must be text (an agent's name), not {type(agent).__name__}"
                    )
                body["agent"] = agent
            return await self._turn(_session_path(session_id, "/approvals"), body)
        if session_id is None:
            if agent is None:
                raise errors.UsageError("generate() needs an agent name for a new session")
            payload: dict[str, Any] = {"agent": agent}
            if prompt is not None:
                payload["message"] = prompt
            return await self._keyed_turn("/v1/sessions", payload, idempotency_key)
        return await self._next_turn(agent, session_id, prompt, idempotency_key)

    async def _next_turn(
        self, agent: str | None, session_id: str, prompt: str | None, key: str | None
    ) -> RemoteResult:
        """`generate(session_id=...)` as `Runtime.generate` takes it, which the server calls
        (`POST .../generate`): with a prompt, another agent's session is a `UsageError`, a turn
        running a `SessionBusy` and a session waiting on a request a `PartialAnswer` (answer it,
        or `send()` the message to steer), each recording nothing; without one, the session's
        turn is resumed. The prompt and the agent's name are checked here first, as `Runtime`
        checks them."""
        path = _session_path(session_id, "/generate")
        body: dict[str, Any] = {}
        if agent is not None:
            check_agent_name(agent)
            body["agent"] = agent
        if prompt is None:
            return await self._turn(path, body)
        if key is not None:
            check_key(key)
        check_prompt(prompt)
        body["message"] = prompt
        return await self._keyed_turn(path, body, key)

    async def send(
        self,
        session_id: str,
        message: str,
        *,
        turn_policy: Literal["steer", "queue"] = "steer",
        idempotency_key: str | None = None,
    ) -> RemoteResult:
        """Send a message under `idempotency_key` (a new one per call if none is given): a call
        that gets no answer is sent once more with it, and the server delivers it once; pass
        your own key to retry a call yourself later (`RemoteError.idempotency_key`)."""
        body = {"text": message, "turnPolicy": turn_policy}
        path = _session_path(session_id, "/messages")
        return await self._keyed_turn(path, body, idempotency_key)

    async def respond(
        self, session_id: str, responses: Sequence[InputResponse | Mapping[str, Any]]
    ) -> RemoteResult:
        """Answer one or more requests of the session by id, as `Runtime.respond` does."""
        body = {"inputResponses": [response_body(r) for r in input_responses(responses)]}
        return await self._turn(_session_path(session_id, "/responses"), body)

    async def cancel(
        self, session_id: str, reason: str | None = None, *, turn_id: str | None = None
    ) -> RemoteResult:
        """Cancel the session's running or waiting turn (with `turn_id`, only that one, as
        `Runtime.cancel`); its open requests are withdrawn."""
        body: dict[str, str | None] = {"reason": reason}
        if turn_id is not None:
            body["turnId"] = turn_id
        return await self._turn(_session_path(session_id, "/cancel"), body)

    async def delete_session(
        self, session_id: str, *, reason: str | None = None, force: bool = False
    ) -> list[str]:
        """Delete the session and its subagents' sessions (`Runtime.delete_session`, `force`
        too) as the caller; returns the ids deleted."""
        if not isinstance(force, bool):
            raise errors.UsageError(f"force must be True or False, not {force!r}")
        body: dict[str, Any] = {"reason": reason}
        if force:  # sent only when given: a server from before it refuses the field
            body["force"] = True
        return await self._call(
            "DELETE", _session_path(session_id), _deleted, "a deletion", json=body
        )

    async def prune(
        self,
        *,
        older_than: float,
        limit: int = 1000,
        agent: str | None = None,
        reason: str | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """Retention over HTTP (`Runtime.prune`; an admin's token): delete the finished sessions
        last active more than `older_than` seconds ago, at most `limit`, oldest first.
        `{"deleted": [...], "listed": [...], "more": bool, "damaged": [...]}` (`damaged`: those
        listed it could not read, left to a forced deletion); `dry_run` deletes nothing."""
        body = {
            "olderThan": older_than,
            "limit": limit,
            "agent": agent,
            "reason": reason,
            "dryRun": dry_run,
        }
        return await self._call("POST", "/v1/prune", _pruned, "a prune", json=body)

    async def state(self, session_id: str) -> dict[str, Any]:
        """The session as the server shows it (status, turn, usage, pending)."""
        return await self._call("GET", _session_path(session_id), wire.session_view, "a session")

    async def pending(
        self,
        *,
        agent: str | None = None,
        tool_name: str | None = None,
        kind: RequestKind | None = None,
        status: RequestStatus = "pending",
        older_than: float | None = None,
        limit: int = 50,
        offset: int = 0,
        inputs: bool = True,
    ) -> tuple[list[InputRequest], int]:
        """One page of the queue across sessions, and the total. `inputs=False` lists each
        request with its call's input and its payload as None (the input's hash as it is): a
        page of calls with megabytes of arguments stays small; `state(session_id)` has a
        session's pending requests whole."""
        if not isinstance(inputs, bool):
            raise errors.UsageError(f"inputs must be True or False, not {inputs!r}")
        params: dict[str, Any] = {"status": status, "limit": limit, "offset": offset}
        if not inputs:
            params["inputs"] = "false"
        for name, text in (("agent", agent), ("tool_name", tool_name), ("kind", kind)):
            _filter(name, text)
        _filter("status", status)
        check_page(limit, offset)  # as `Runtime` refuses them: "5" went out, and was read
        if older_than is not None and not (finite(older_than) and older_than >= 0):
            raise errors.UsageError(f"older_than must be seconds from 0, not {older_than!r}")
        for key, value in (("agent", agent), ("tool", tool_name), ("kind", kind)):
            if value is not None:
                params[key] = value
        if older_than is not None:
            params["older_than"] = older_than
        return await self._call(
            "GET", "/v1/requests", wire.page, "a page of requests", params=params
        )

    async def sessions(
        self,
        *,
        agent: str | None = None,
        status: SessionStatus | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> tuple[list[SessionSummary], int]:
        """One page of the sessions this caller may see, most recently active first, and the
        total (as `Runtime.sessions` lists them)."""
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        check_page(limit, offset)
        for key, value in (("agent", agent), ("status", status)):
            _filter(key, value)
            if value is not None:
                params[key] = value
        return await self._call(
            "GET", "/v1/sessions", wire.session_page, "a page of sessions", params=params
        )

    async def events(
        self,
        session_id: str,
        after: int = 0,
        *,
        follow: bool = True,
        retries: int = 5,
        shown: Event | None = None,
    ) -> AsyncGenerator[Event, None]:
        """The session's events after `after`; reconnects with `Last-Event-ID` if cut off, or
        refused for a while (a proxy's 429 or 502-504 while the server restarts, a busy store,
        a reconnect's 429 `too_many_streams`), up to `retries` failures in a row. A stream
        that sends nothing at all (a signoff server sends its `retry:` line at once), or a read
        not followed that stays silent for `timeout`, is such a failure: only a followed stream
        that was heard may stay quiet. A reconnect asks again for the last event it yielded, and
        raises `EventsRewritten` if the server has another one there, or none (the store lost
        commits: a crash, a restored copy), rather than go on after it, skipping what was
        written anew. `shown`, the event at `after` the caller already has (from an earlier
        read), is checked so too, from the first connection on."""
        if isinstance(after, bool) or not isinstance(after, int) or not 0 <= after < 2**63:
            # As `Runtime.events` says it: "3" was sent, and a TypeError met the first event.
            raise errors.UsageError(
                f"after must be an event seq, a whole number from 0, not {after!r}"
            )
        flag("follow", follow)
        whole("retries", retries, least=0)  # "5" was a TypeError at the first refusal
        check_shown_event(shown, session_id, after)
        path = _session_path(session_id, "/events")
        # Closed with this generator, so a caller's break closes the connection at once.
        stream = remote_events(self, path, session_id, after, follow, retries, shown)
        async with contextlib.aclosing(stream):
            async for event in stream:
                yield event

    async def session(self, session_id: str) -> LiveSession:
        """A `LiveSession` caught up with the session's events, judging deadlines and TTLs by
        the server's time (`server_time`)."""
        live = LiveSession(self, session_id)
        await live.sync()
        return live
