"""Host lookups of the `WebhookChannel`'s own client, kept off the event loop's default executor.

`getaddrinfo` cannot be cancelled: a receiver's name whose DNS servers do not answer holds a
thread for as long as the resolver tries (30 s and more), past each attempt's `timeout`. Through
httpx each retry started another lookup in the default executor, until its threads were all
held and every other user of it waited (the channels' state, other URLs' lookups). Here a host
has at most one lookup in flight, in a daemon thread of its own, which later attempts wait for
(each up to its own timeout) rather than start again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import ipaddress
import os
import socket
import threading
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from ._webhook_urls import httpx_module

if TYPE_CHECKING:
    import httpcore
    import httpx

__all__ = ["STAGGER", "addresses", "interleaved", "own_client"]

STAGGER = 0.25
"""Seconds an address may take to connect before the next one is tried alongside it (happy
eyeballs, as anyio does): an unreachable IPv6 address does not cost the whole attempt."""


class _Lookups:
    """The lookups in flight, by host name: one thread per host, however many attempts wait."""

    lock = threading.Lock()
    running: dict[str, concurrent.futures.Future[list[str]]] = {}

    @classmethod
    def of(cls, host: str) -> concurrent.futures.Future[list[str]]:
        """The lookup of `host` in flight, started unless one is."""
        with cls.lock:
            lookup = cls.running.get(host)
            if lookup is None:
                lookup = concurrent.futures.Future()
                # A daemon thread: one hung for minutes holds up neither a pool nor the exit.
                threading.Thread(
                    target=cls._resolve, args=(host, lookup), name="signoff-lookup", daemon=True
                ).start()
                cls.running[host] = lookup  # once started: a failed start leaves none waited on
            return lookup

    @classmethod
    def _resolve(cls, host: str, lookup: concurrent.futures.Future[list[str]]) -> None:
        try:
            found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except Exception as exc:  # gaierror; a UnicodeError for a name IDNA cannot encode
            failure: Exception | None = exc
        else:
            failure = None
        with cls.lock:  # done: the next attempt looks the host up afresh (nothing is cached)
            if cls.running.get(host) is lookup:
                del cls.running[host]
        if failure is not None:
            lookup.set_exception(failure)
        else:  # in getaddrinfo's order (RFC 6724's preference), each address once
            lookup.set_result(list(dict.fromkeys(str(info[4][0]) for info in found)))

    @classmethod
    def forked(cls) -> None:
        """In a forked child, where the parent's lookup threads do not run: none in flight."""
        cls.lock = threading.Lock()
        cls.running = {}


os.register_at_fork(after_in_child=_Lookups.forked)


async def addresses(host: str, timeout: float | None) -> list[str]:
    """`host`'s addresses, from the lookup of it in flight (started if none is), waited for up
    to `timeout` seconds (a `TimeoutError`); its failure (`socket.gaierror`) is raised."""
    lookup = _Lookups.of(host)
    if not lookup.done():
        loop = asyncio.get_running_loop()
        ready = loop.create_future()

        def settle() -> None:
            if not ready.done():  # the waiter gave up: nobody wants it
                ready.set_result(None)

        def wake(_: object) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(settle)

        lookup.add_done_callback(wake)
        async with asyncio.timeout(timeout):
            await ready
    return lookup.result()


def own_client(timeout: float) -> httpx.AsyncClient:
    """The channel's own httpx client (proxies and CA bundle from the environment, as httpx
    reads them), each of whose connection pools looks host names up with `addresses`.

    httpx takes no network backend, so the pools it made are given one; should a later httpx
    keep them elsewhere, the client is left as httpx made it."""
    client = httpx_module().AsyncClient(timeout=timeout)
    for transport in (client._transport, *client._mounts.values()):
        pool = getattr(transport, "_pool", None)
        if pool is not None and hasattr(pool, "_network_backend"):
            pool._network_backend = _backend_class()(pool._network_backend)
    return client  # type: ignore[no-any-return]


def interleaved(found: list[str]) -> list[str]:
    """`found` with the first address of the other family second, as anyio (RFC 8305) tries
    them: several silent IPv6 addresses do not each cost `STAGGER` before an IPv4 one."""
    if not found:
        return found
    v6 = ":" in found[0]
    other = next((a for a in found[1:] if (":" in a) != v6), None)
    if other is None:
        return found
    return [found[0], other, *(a for a in found[1:] if a != other)]


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@functools.cache
def _backend_class() -> Callable[[Any], httpcore.AsyncNetworkBackend]:
    import httpcore  # present: httpx needs it

    class LookingUp(httpcore.AsyncNetworkBackend):
        """`inner`, connecting to the addresses `addresses` finds for a host name; TLS still
        verifies the name (httpcore gives the origin's host as the server's name)."""

        def __init__(self, inner: httpcore.AsyncNetworkBackend) -> None:
            self._inner = inner

        async def connect_tcp(
            self,
            host: str,
            port: int,
            timeout: float | None = None,
            local_address: str | None = None,
            socket_options: Iterable[Any] | None = None,
        ) -> httpcore.AsyncNetworkStream:
            def to(address: str) -> Callable[[], Awaitable[httpcore.AsyncNetworkStream]]:
                return functools.partial(
                    self._inner.connect_tcp, address, port, timeout, local_address, socket_options
                )

            if _is_address(host):  # nothing to look up
                return await to(host)()
            try:
                found = await addresses(host, timeout)
            except TimeoutError as exc:
                raise httpcore.ConnectTimeout(f"looking up {host} took over {timeout}s") from exc
            except (OSError, UnicodeError) as exc:
                raise httpcore.ConnectError(str(exc)) from exc
            if not found:
                raise httpcore.ConnectError(f"{host} has no address")
            return await first_connected(host, [to(address) for address in interleaved(found)])

        async def connect_unix_socket(
            self, path: str, timeout: float | None = None, socket_options: Any = None
        ) -> httpcore.AsyncNetworkStream:
            return await self._inner.connect_unix_socket(path, timeout, socket_options)

        async def sleep(self, seconds: float) -> None:
            await self._inner.sleep(seconds)

    async def first_connected(
        host: str, connects: list[Callable[[], Awaitable[httpcore.AsyncNetworkStream]]]
    ) -> httpcore.AsyncNetworkStream:
        """The stream of the first of `connects` to succeed, each started in turn once the one
        before failed or took `STAGGER` seconds; the others are cancelled (a stream one made
        meanwhile closed). When all fail, the first failure is raised."""
        waiting = list(connects)
        running: set[asyncio.Task[httpcore.AsyncNetworkStream]] = set()
        failures: list[BaseException] = []
        won: httpcore.AsyncNetworkStream | None = None
        try:
            while won is None and (waiting or running):
                if waiting:
                    running.add(asyncio.ensure_future(waiting.pop(0)()))
                done, running = await asyncio.wait(
                    running,
                    timeout=STAGGER if waiting else None,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                for task in done:
                    if (failure := task.exception()) is not None:
                        failures.append(failure)
                    elif won is None:
                        won = task.result()
                    else:
                        await task.result().aclose()
        finally:
            for task in running:
                task.cancel()
            if running:
                await asyncio.wait(running)
            for task in running:
                if not task.cancelled() and task.exception() is None:
                    await task.result().aclose()
        if won is not None:
            return won
        first = failures[0]
        if len(failures) > 1 and isinstance(first, httpcore.ConnectError | httpcore.ConnectTimeout):
            raise type(first)(
                f"none of {host}'s {len(failures)} addresses connected: {first}"
            ) from first
        raise first

    return LookingUp
