"""`Client`, the blocking twin of `AsyncClient` (in `_async_client`), and the HTTP client's
public names: each call of `AsyncClient` runs on a private loop the client keeps."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ssl
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

import httpx

from . import _exceptions as errors
from ._async_client import DEFAULT_MAX_REPLY_BYTES, AsyncClient, RemoteError
from ._events import Event
from ._live_session import LiveSession, RequestView
from ._payloads import RemoteResult
from ._sync import SyncBridge
from .models._reply_cap import check_reply_cap

__all__ = [
    "AsyncClient",
    "Client",
    "LiveSession",
    "RemoteError",
    "RemoteResult",
    "RequestView",
]

P = ParamSpec("P")
T = TypeVar("T")


def _close(client: AsyncClient, bridge: SyncBridge) -> None:
    """Close a collected `Client`'s connections and loop, as far as can be done then (not from
    its own loop's thread, nor once that loop has stopped, at the interpreter's exit)."""
    with contextlib.suppress(Exception):
        if not client.http.is_closed:
            bridge.run(client.aclose())
    bridge.close()


def _blocking(
    method: Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[Client, P], T]:
    """`Client`'s twin of an `AsyncClient` method: same parameters and docstring, blocking."""
    name = method.__name__

    @functools.wraps(method)
    def blocking(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> T:
        call: Coroutine[Any, Any, T] = getattr(self._opened(), name)(*args, **kwargs)
        return self._run(call)

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
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        check_reply_cap("Client", max_reply_bytes)  # named as the caller knows it
        self._async = AsyncClient(
            base_url,
            token=token,
            timeout=timeout,
            transport=transport,
            max_reply_bytes=max_reply_bytes,
            verify=verify,
        )
        self._bridge = SyncBridge()
        self._closed = False
        # Dropped unclosed: its pooled connections are closed on its loop before the loop
        # stops, not left as sockets the garbage collector warns about (`ResourceWarning`).
        self._closer = weakref.finalize(self, _close, self._async, self._bridge)
        self._closer.atexit = False  # at exit the bridge's loop may be stopped already

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _opened(self) -> AsyncClient:
        """The async client, unless this one is closed (its bridge would start a loop anew)."""
        if self._closed:
            raise errors.UsageError("the client is closed")
        return self._async

    def _run(self, call: Coroutine[Any, Any, T]) -> T:
        """Run `call` on the client's loop, blocking; a timeout met while blocking the caller's
        own event loop says so: a server served on that loop could not answer meanwhile."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._bridge.run(call)
        try:
            return self._bridge.run(call)
        except errors.RemoteError as exc:
            if exc.status == 0 and exc.code == "timeout":
                exc.add_note(
                    "this blocking call blocked the running event loop it was made from until "
                    "it returned: a server served on that loop (in this process) could not "
                    "answer it; await an AsyncClient's call there instead"
                )
            raise

    def close(self) -> None:
        """Close the client's connections and its loop; a later call raises `UsageError`."""
        if self._closed:
            return
        self._closed = True
        self._closer.detach()
        self._bridge.run(self._async.aclose())
        self._bridge.settle_calls()  # calls cut short by that end with their own errors
        self._bridge.close()

    generate = _blocking(AsyncClient.generate)
    send = _blocking(AsyncClient.send)
    respond = _blocking(AsyncClient.respond)
    cancel = _blocking(AsyncClient.cancel)
    delete_session = _blocking(AsyncClient.delete_session)
    prune = _blocking(AsyncClient.prune)
    state = _blocking(AsyncClient.state)
    pending = _blocking(AsyncClient.pending)
    sessions = _blocking(AsyncClient.sessions)

    def events(
        self, session_id: str, after: int = 0, *, retries: int = 5, shown: Event | None = None
    ) -> list[Event]:
        """The session's events after `after`, without following (as `Runtime.events_sync`);
        a stream cut off or refused for a while is asked for again, up to `retries` failures
        in a row, and `shown` is checked (see `AsyncClient.events`)."""

        client = self._opened()

        async def collect() -> list[Event]:
            events = client.events(session_id, after, follow=False, retries=retries, shown=shown)
            return [e async for e in events]

        return self._run(collect())
