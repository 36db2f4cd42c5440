"""`LiveSession`, the client-side reducer: it folds a session's stream into its requests; an
answer it submits marks the request `responded` until the stream confirms it, and answering a
request that is no longer open fails locally, without a server call.

It reads and answers through any `SessionRemote` (`AsyncClient` is the one), so this module
needs nothing of the client's and the client can make a `LiveSession` with no import cycle.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import _exceptions as errors
from ._event_handlers import candidate_applied
from ._events import Event
from ._payloads import RemoteResult, input_responses
from ._types import InputRequest, InputResponse

__all__ = ["LiveSession", "RequestView", "SessionRemote"]


class SessionRemote(Protocol):
    """What a `LiveSession` needs of its client: a session's events, and a way to answer."""

    def events(
        self, session_id: str, after: int = 0, *, follow: bool = True, retries: int = 5
    ) -> AsyncGenerator[Event, None]: ...

    async def respond(
        self, session_id: str, responses: Sequence[InputResponse | Mapping[str, Any]]
    ) -> RemoteResult: ...


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

    client: SessionRemote
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
        elif event.type == "approval.candidate":  # a quorum's vote, or an escalation
            view = self.requests.get(d.get("request_id", ""))
            if view is not None and view.status in ("pending", "responded"):  # open on the server
                view.request = candidate_applied(view.request, d)
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
        answers = input_responses(responses)
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
            if view is not None and view.status == "responded":
                if o.outcome not in ("approved", "cancelled", "answered"):
                    # Refused, or a quorum's vote counted (applied, yet no stream event will
                    # settle it): still open, and its voter may still deny it.
                    view.status = "pending"
        return result
