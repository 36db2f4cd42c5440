"""`AsyncClient` and `Client`: the HTTP API from Python, with the method names of `Runtime`.

The calls that start a conversation or send a message carry an idempotency key (the caller's,
or a new one per call): one that got no answer (a timeout, a dropped connection) is sent once
more with the same key, which the server applies once.

`LiveSession` is the client-side reducer: it folds a session's stream into its requests; an
answer it submits marks the request `responded` until the stream confirms it, and answering a
request that is no longer open fails locally, without a server call.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import secrets
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Coroutine,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, TypeVar
from urllib.parse import quote

import httpx
from pydantic import ValidationError

from . import _exceptions as errors
from . import _wire as wire
from ._answers import decisions
from ._events import Event
from ._idempotency import check_key
from ._results import Outcome
from ._settings import flag, seconds, whole
from ._types import Decision, InputRequest, InputResponse

__all__ = [
    "AsyncClient",
    "Client",
    "LiveSession",
    "RemoteError",
    "RemoteResult",
    "RequestView",
]


RemoteError = errors.RemoteError
P = ParamSpec("P")
T = TypeVar("T")


def _session_path(session_id: str, tail: str = "") -> str:
    """The path of a session's resource, its id quoted as one segment: a `?`, `#`, `/` or `..`
    in an id must not reach another session (no session has such an id)."""
    if not session_id or "/" in session_id or session_id in (".", ".."):
        raise errors.UnknownSession(session_id)
    return f"/v1/sessions/{quote(session_id, safe='')}{tail}"


def _unanswered(exc: errors.RemoteError) -> bool:
    """A call that was sent but got no answer: it may or may not have been applied."""
    return exc.status == 0 and exc.code in ("timeout", "connection_lost")


def _encode(path: str, body: Any) -> bytes:
    """The body as JSON, refused here (as the server would) when it is not plain JSON text."""
    try:
        return json.dumps(body, allow_nan=False, ensure_ascii=False).encode()
    except (TypeError, ValueError, RecursionError) as exc:  # NaN, objects, surrogates, depth
        kind = (
            errors.InvalidAnswer
            if path.endswith(("/responses", "/approvals"))
            else errors.UsageError
        )
        raise kind(f"the request body is not plain JSON: {type(exc).__name__}: {exc}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoteResult:
    """What a call that runs a turn returns: like `GenerateResult`, read from JSON."""

    session_id: str
    status: str
    turn_id: str | None
    text: str
    pending: list[InputRequest]
    outcomes: list[Outcome]
    error: dict[str, Any] | None = None
    retryable: bool = False
    replayed: bool = False
    queued: bool = False

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RemoteResult:
        if not isinstance(data.get("session_id"), str) or not isinstance(data.get("status"), str):
            raise ValueError("it has no session_id and status")
        return cls(
            session_id=data["session_id"],
            status=data["status"],
            turn_id=data.get("turn_id"),
            text=data.get("text", ""),
            pending=[InputRequest.model_validate(r) for r in data.get("pending", [])],
            outcomes=[_outcome(o) for o in data.get("outcomes", [])],
            error=data.get("error"),
            retryable=bool(data.get("retryable")),
            replayed=data.get("replayed") is True,
            queued=data.get("queued") is True,
        )


def _outcome(data: Any) -> Outcome:
    """One answer's `Outcome`, as the runtime returns it in process."""
    reason = data.get("reason") if isinstance(data, Mapping) else None
    if not isinstance(data, Mapping) or not (
        isinstance(data.get("request_id"), str)
        and isinstance(data.get("outcome"), str)
        and isinstance(data.get("applied"), bool)
        and (reason is None or isinstance(reason, str))
    ):
        raise ValueError(f"an outcome is not {{request_id, outcome, applied, reason}}: {data!r}")
    return Outcome(
        request_id=data["request_id"],
        outcome=data["outcome"],
        applied=data["applied"],
        reason=reason,
    )


def _answers(responses: Sequence[InputResponse | Mapping[str, Any]]) -> list[InputResponse]:
    """The responses as `InputResponse`s, refused as `Runtime.respond` refuses them."""
    if isinstance(responses, (str, bytes, Mapping, InputResponse)) or not isinstance(
        responses, Iterable
    ):
        raise errors.InvalidAnswer("responses must be a list of InputResponse")
    answers = []
    for i, raw in enumerate(responses):
        try:
            answers.append(
                raw if isinstance(raw, InputResponse) else InputResponse.model_validate(raw)
            )
        except ValidationError as exc:
            raise errors.InvalidAnswer(f"response #{i + 1} is malformed: {exc}") from None
    if not answers:
        raise errors.InvalidAnswer("no responses given")
    return answers


def _response_body(resp: InputResponse) -> dict[str, Any]:
    body: dict[str, Any] = {"requestId": resp.request_id}
    for key, name in (
        ("optionId", resp.option_id),
        ("text", resp.text),
        ("value", resp.value),
        ("editedInput", resp.edited_input),
        ("inputHash", resp.input_hash),
    ):
        if name is not None:
            body[key] = name
    return body


def _decision_body(dec: Decision) -> dict[str, Any]:
    body: dict[str, Any] = {"id": dec.id, "approved": dec.approved}
    for key, value in (
        ("reason", dec.reason),
        ("value", dec.value),
        ("editedInput", dec.edited_input),
        ("inputHash", dec.input_hash),
    ):
        if value is not None:
            body[key] = value
    return body


class AsyncClient:
    """The signoff HTTP API (`/v1`), async; pass `token` for bearer authentication."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = 60.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if token and not (token.isascii() and token.isprintable() and token == token.strip()):
            raise errors.UsageError(
                "the token is not printable ASCII without spaces around it: "
                "no Authorization header can carry it"
            )
        try:
            scheme = httpx.URL(base_url).scheme
        except httpx.InvalidURL:
            scheme = ""
        if scheme not in ("http", "https"):
            raise errors.UsageError(f"the base URL must be http(s)://host[:port], not {base_url!r}")
        seconds("timeout", timeout)  # httpx took 0, NaN or "5", and every call failed
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout, transport=transport
        )
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the client's connections; a later call raises `UsageError`."""
        await self.http.aclose()

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

    async def _call(
        self, method: str, path: str, parse: Callable[[Any], T], wanted: str, **kwargs: Any
    ) -> T:
        """Send a request and read its JSON answer with `parse`: an answer `parse` cannot read
        (another server, a proxy's page) is a `RemoteError` naming what was `wanted`."""
        self._check_open()
        if "json" in kwargs:
            kwargs["content"] = _encode(path, kwargs.pop("json"))
            kwargs["headers"] = {**kwargs.get("headers", {}), "Content-Type": "application/json"}
        try:
            response = await self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise wire.transport_error(exc, f"{self.http.base_url}{path[1:]}") from exc
        wire.raise_for(response)
        try:
            data = response.json()
        except ValueError:  # not JSON: the base URL is not a signoff server
            raise wire.not_signoff(response, "JSON") from None
        try:
            return parse(data)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise wire.malformed(response, wanted, exc) from None

    async def _turn(self, path: str, body: Any) -> RemoteResult:
        return await self._call("POST", path, RemoteResult.from_json, "a turn's result", json=body)

    async def _keyed_turn(self, path: str, body: Any, key: str | None) -> RemoteResult:
        """A call that starts a conversation or sends a message, under its idempotency key (a
        new one if none is given): if it gets no answer, it is sent once more with the key, and
        if that gets none either, the error names the key to retry it with."""
        key = secrets.token_urlsafe(24) if key is None else check_key(key)
        headers = {"Idempotency-Key": key}
        parse, wanted = RemoteResult.from_json, "a turn's result"
        try:
            return await self._call("POST", path, parse, wanted, json=body, headers=headers)
        except errors.RemoteError as exc:
            if not _unanswered(exc):
                raise
        try:
            return await self._call("POST", path, parse, wanted, json=body, headers=headers)
        except errors.RemoteError as exc:
            if not _unanswered(exc):
                raise
            raise errors.RemoteError(
                f"{exc} (sent twice with idempotency_key={key!r}: call again with it, and the "
                "server acts once)",
                exc.code,
                0,
                idempotency_key=key,
            ) from exc

    async def generate(
        self,
        agent: str | None = None,
        prompt: str | None = None,
        *,
        session_id: str | None = None,
        approvals: Sequence[Decision | Mapping[str, Any]] | None = None,
        idempotency_key: str | None = None,
    ) -> RemoteResult:
        """Start a session (agent + prompt), continue one (session_id + prompt), or settle all of
        its approvals at once (session_id + approvals). A prompt goes with an idempotency key,
        `idempotency_key` or a new one (see `send`)."""
        if idempotency_key is not None and prompt is None:
            raise errors.UsageError(
                "idempotency_key goes with a prompt: it keys the message it sends"
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
            body = {"approvals": [_decision_body(d) for d in given]}
            return await self._turn(_session_path(session_id, "/approvals"), body)
        if session_id is None:
            if agent is None:
                raise errors.UsageError("generate() needs an agent name for a new session")
            payload: dict[str, Any] = {"agent": agent}
            if prompt is None:
                return await self._turn("/v1/sessions", payload)
            payload["message"] = prompt
            return await self._keyed_turn("/v1/sessions", payload, idempotency_key)
        if prompt is None:
            raise errors.UsageError("generate(session_id=...) needs a prompt or approvals")
        return await self.send(session_id, prompt, idempotency_key=idempotency_key)

    async def send(
        self,
        session_id: str,
        message: str,
        *,
        turn_policy: str = "steer",
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
        body = {"inputResponses": [_response_body(r) for r in _answers(responses)]}
        return await self._turn(_session_path(session_id, "/responses"), body)

    async def cancel(self, session_id: str, reason: str | None = None) -> RemoteResult:
        """Cancel the session's running or waiting turn; its open requests are withdrawn."""
        return await self._turn(_session_path(session_id, "/cancel"), {"reason": reason})

    async def state(self, session_id: str) -> dict[str, Any]:
        """The session as the server shows it (status, turn, usage, pending)."""
        return await self._call("GET", _session_path(session_id), wire.session_view, "a session")

    async def pending(
        self,
        *,
        agent: str | None = None,
        tool_name: str | None = None,
        kind: str | None = None,
        status: str = "pending",
        older_than: float | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> tuple[list[InputRequest], int]:
        """One page of the queue across sessions, and the total."""
        params: dict[str, Any] = {"status": status, "limit": limit, "offset": offset}
        for key, value in (("agent", agent), ("tool", tool_name), ("kind", kind)):
            if value is not None:
                params[key] = value
        if older_than is not None:
            params["older_than"] = older_than
        return await self._call(
            "GET", "/v1/requests", wire.page, "a page of requests", params=params
        )

    async def events(
        self, session_id: str, after: int = 0, *, follow: bool = True, retries: int = 5
    ) -> AsyncGenerator[Event, None]:
        """The session's events after `after`; reconnects with `Last-Event-ID` if cut off, or
        refused for a while (a proxy's 429 or 502-504 while the server restarts, a busy store),
        up to `retries` failures in a row."""
        flag("follow", follow)
        whole("retries", retries, least=0)  # "5" was a TypeError at the first refusal
        self._check_open()
        path = _session_path(session_id, "/events")
        last = after
        failures = 0
        while True:
            params = {"after": last, "follow": "true" if follow else "false"}
            headers = {"Last-Event-ID": str(last), "Accept": "text/event-stream"}
            pause = 0.0
            streaming = False
            try:
                async with self.http.stream(
                    "GET",
                    path,
                    params=params,
                    headers=headers,
                    # `timeout` bounds each read too, so a stream gone silent (its server
                    # vanished without closing it) is asked for again, not waited on for ever.
                    timeout=self.http.timeout,
                ) as response:
                    if not response.is_success:
                        await response.aread()
                        if failures >= retries or not wire.transient(response):
                            wire.raise_for(response)
                        failures += 1
                        pause = wire.backoff(failures, response)
                    elif not response.headers.get("content-type", "").startswith(
                        "text/event-stream"
                    ):
                        await response.aread()
                        raise wire.not_signoff(response, "an event-stream")
                    else:
                        streaming = True
                        async for kind, data in wire.sse_data(response.aiter_lines()):
                            if kind == ":":  # a keep-alive: the server is alive
                                failures = 0
                                continue
                            event = wire.streamed(kind, data)
                            if event.seq <= last:
                                continue  # sent again by a server that ignored Last-Event-ID
                            last = event.seq
                            failures = 0
                            yield event
                if pause:
                    await asyncio.sleep(pause)
                    continue
                if not follow:
                    return
                await asyncio.sleep(0.1)  # the server closed a followed stream: reconnect
            except httpx.TransportError as exc:
                if streaming and isinstance(exc, httpx.ReadTimeout):
                    continue  # quiet, or dead: a reconnect tells; a dead server fails it
                failures += 1
                if failures > retries:
                    raise wire.transport_error(exc, f"{self.http.base_url}{path[1:]}") from exc
                await asyncio.sleep(wire.backoff(failures))

    async def session(self, session_id: str) -> LiveSession:
        """A `LiveSession` caught up with the session's events."""
        live = LiveSession(self, session_id)
        await live.sync()
        return live


@dataclass(slots=True, kw_only=True)
class RequestView:
    """A request as the client knows it: `pending`, `responded` (sent, not yet confirmed),
    or closed (`settled`, `expired`, `withdrawn`) with its outcome."""

    request: InputRequest
    status: str = "pending"
    outcome: str | None = None


@dataclass(slots=True)
class LiveSession:
    """Client-side fold of one session's stream: its requests and how far it has read."""

    client: AsyncClient
    session_id: str
    seq: int = 0
    requests: dict[str, RequestView] = field(default_factory=dict)

    def apply(self, event: Event) -> None:
        """Fold one event in; one at or before `seq` was already folded and is skipped."""
        if event.seq <= self.seq:
            return
        self.seq = event.seq
        d = event.data
        if event.type == "input.requested":
            for raw in d.get("requests", []):
                request = InputRequest.model_validate(raw)
                self.requests[request.id] = RequestView(request=request)
        elif event.type == "input.resolved":
            view = self.requests.get(d.get("request_id", ""))
            if view is not None:
                view.status = d.get("status") or "settled"
                view.outcome = d.get("outcome")

    async def sync(self) -> None:
        """Read and fold everything the server has after `seq`."""
        async for event in self.client.events(self.session_id, self.seq, follow=False):
            self.apply(event)

    async def follow(self) -> AsyncIterator[Event]:
        """Fold and yield live events until the caller stops."""
        # closed with this generator: left to the garbage collector, the stream's close would
        # race the event loop's shutdown (an `aclose(): ... already running` error at exit)
        async with contextlib.aclosing(self.client.events(self.session_id, self.seq)) as events:
            async for event in events:
                self.apply(event)
                yield event

    def open_requests(self) -> list[InputRequest]:
        """The requests still pending, as far as this session has read, in asked order."""
        return [v.request for v in self.requests.values() if v.status == "pending"]

    async def respond(self, responses: Sequence[InputResponse | Mapping[str, Any]]) -> RemoteResult:
        """Answer requests; a request that is no longer open fails here, with no server call."""
        answers = _answers(responses)
        for a in answers:
            view = self.requests.get(a.request_id)
            if view is None:
                raise errors.UnknownRequest(self.session_id, [a.request_id])
            if view.status != "pending":
                raise errors.RequestClosed(
                    f"request {a.request_id} is {view.status}"
                    + (f" ({view.outcome})" if view.outcome else "")
                    + "; it takes no answers",
                    [a.request_id],
                )
        for a in answers:
            self.requests[a.request_id].status = "responded"
        try:
            result = await self.client.respond(self.session_id, answers)
        except BaseException as exc:
            for a in answers:
                if self.requests[a.request_id].status == "responded":
                    self.requests[a.request_id].status = "pending"
            if isinstance(exc, (errors.ConflictingAnswer, errors.RequestClosed)):
                # Closed on the server meanwhile: learn how from the stream, so the request
                # is not shown open (and answered again) when it is not.
                with contextlib.suppress(errors.SignoffError):
                    await self.sync()
            raise
        for o in result.outcomes:
            view = self.requests.get(o.request_id)
            if view is not None and view.status == "responded" and not o.applied:
                if o.outcome not in ("approved", "cancelled", "answered"):
                    view.status = "pending"  # refused or counted: still open
        return result


def _blocking(
    method: Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[Client, P], T]:
    """`Client`'s twin of an `AsyncClient` method: same parameters and docstring, blocking."""
    name = method.__name__

    @functools.wraps(method)
    def blocking(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> T:
        call: Coroutine[Any, Any, T] = getattr(self._opened(), name)(*args, **kwargs)
        return self._bridge.run(call)

    blocking.__qualname__ = f"Client.{name}"
    return blocking


class Client:
    """The synchronous twin of `AsyncClient` for scripts (each call runs on a private loop)."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = 60.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        from ._sync import SyncBridge

        self._async = AsyncClient(base_url, token=token, timeout=timeout, transport=transport)
        self._bridge = SyncBridge()
        self._closed = False

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _opened(self) -> AsyncClient:
        """The async client, unless this one is closed (its bridge would start a loop anew)."""
        if self._closed:
            raise errors.UsageError("the client is closed")
        return self._async

    def close(self) -> None:
        """Close the client's connections and its loop; a later call raises `UsageError`."""
        if self._closed:
            return
        self._closed = True
        self._bridge.run(self._async.aclose())
        self._bridge.close()

    generate = _blocking(AsyncClient.generate)
    send = _blocking(AsyncClient.send)
    respond = _blocking(AsyncClient.respond)
    cancel = _blocking(AsyncClient.cancel)
    state = _blocking(AsyncClient.state)
    pending = _blocking(AsyncClient.pending)

    def events(self, session_id: str, after: int = 0, *, retries: int = 5) -> list[Event]:
        """The session's events after `after`, without following (as `Runtime.events_sync`);
        a stream cut off or refused for a while is asked for again, up to `retries` failures
        in a row (see `AsyncClient.events`)."""

        client = self._opened()

        async def collect() -> list[Event]:
            events = client.events(session_id, after, follow=False, retries=retries)
            return [e async for e in events]

        return self._bridge.run(collect())
