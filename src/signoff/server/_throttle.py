"""A bound on guessing tokens: failed dashboard sign-ins and unrecognised bearer tokens (and,
on a server without a secret, sign-in cookies naming no token: `_sign_ins`) are counted per
client address and over all clients, and a client past the bound is refused (429
`too_many_failures`, with `Retry-After`) before the token it sends is even compared.

The refusal comes before the comparison, whatever the token: refusing only wrong ones would
tell a right guess from a wrong one. A client is held once it failed `per_client` times in a
window; once every client together failed `overall` times in one, any client that failed in its
current window is held too (a guesser spread over many addresses gets one guess each), while a
client that has not failed, a person signing in or a script with its token, is served as ever.
Successes reset nothing: else a token held would let its holder guess at another. At most
`max_clients` addresses are remembered; when full, lapsed ones go first, then the oldest. One
forgotten while its window ran would be new again, free to guess: such addresses are kept in a
Bloom filter for the overall window, and held as failed in it (a rare false positive holds an
address that did not fail, until that window ends).
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from starlette.requests import HTTPConnection

from ._errors import ApiError

__all__ = [
    "MAX_CLIENTS",
    "OVERALL",
    "PER_CLIENT",
    "WINDOW",
    "Failures",
    "client_of",
    "too_many",
]

PER_CLIENT = 10
"""Failures one client address may make in a window before it is held until the window ends."""
OVERALL = 100
"""Failures of all clients in a window past which every client that failed in its own is held."""
WINDOW = 60.0
"""The window, in seconds: a client's starts at its first failure, the overall one at anyone's."""
MAX_CLIENTS = 10_000
"""Client addresses remembered at most (a few hundred bytes each)."""
_FORGOTTEN_BITS = 1 << 20  # the Bloom filter of addresses forgotten in a window: 128 KiB
_HASHES = 3  # bits an address sets: 1 false positive in 176 at 65 536 forgotten


def client_of(request: HTTPConnection) -> str:
    """The address failures are counted by: the client's, an IPv6 one by its /64 (one host
    commonly holds a whole /64); `""` when the server does not know it."""
    host = request.client.host if request.client is not None else ""
    try:
        address = ipaddress.ip_address(_without_port(host))
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:  # ::ffff:1.2.3.4 is the IPv4 client 1.2.3.4
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


def _without_port(host: str) -> str:
    """The address in a client's host as a proxy may forward it: `1.2.3.4:5678` and
    `[2001:db8::1]:443` (what some proxies put in `X-Forwarded-For`, which servers before
    uvicorn 0.30 hand on as is) would otherwise count each connection's port as a client."""
    if host.startswith("["):
        inside, bracket, rest = host[1:].partition("]")
        if bracket and (not rest or (rest[0] == ":" and rest[1:].isdigit())):
            return inside
        return host
    name, colon, port = host.rpartition(":")
    if colon and "." in name and ":" not in name and port.isdigit():
        return name
    return host


def too_many(wait: int) -> ApiError:
    """The refusal of a client that failed too often: try again in `wait` seconds."""
    return ApiError(
        429,
        "too_many_failures",
        f"too many failed sign-ins or unrecognised tokens from this address: try again in {wait} s",
        headers={"Retry-After": str(wait)},
    )


@dataclass(slots=True)
class Failures:
    """The failures of this process's clients, in fixed windows (see the module's docstring)."""

    clock: Callable[[], float]
    per_client: int = PER_CLIENT
    overall: int = OVERALL
    window: float = WINDOW
    max_clients: int = MAX_CLIENTS
    salt: bytes = field(default_factory=lambda: secrets.token_bytes(16), repr=False)
    """The key of the forgotten-address filter's hash: random, so no one can pick addresses
    that collide in it; a test fixes it to make the filter's false positives repeatable."""
    # client -> (its window's start, its failures in it), in the order the windows began
    _clients: OrderedDict[str, tuple[float, int]] = field(default_factory=OrderedDict)
    _all: tuple[float, int] = (-math.inf, 0)
    # The addresses forgotten to make room while their windows ran, in a Bloom filter, and the
    # start of the overall window they were forgotten in (None: no filter).
    _forgotten: bytearray = field(default_factory=bytearray)
    _forgotten_in: float | None = None

    def retry_after(self, client: str) -> int | None:
        """Seconds until `client` may try a token again, or None when it may now."""
        entry = self._clients.get(client)
        if entry is None:  # never failed, or forgotten: no work for a client that never failed
            return None if self._forgotten_in is None else self._if_forgotten(client)
        now = self.clock()
        start, count = entry
        if not self._current(start, now):
            del self._clients[client]
            return None
        ends = start + self.window
        if count < self.per_client:
            overall_start, overall_count = self._all
            if overall_count < self.overall or not self._current(overall_start, now):
                return None
            ends = min(ends, overall_start + self.window)
        return max(1, min(math.ceil(self.window), math.ceil(ends - now)))

    def _if_forgotten(self, client: str) -> int | None:
        """For an address not remembered: if it was forgotten while its window ran, in the
        overall window still running and past its bound, the seconds left of that window."""
        start, count = self._all
        now = self.clock()
        if self._forgotten_in != start or not self._current(start, now):
            self._forgotten, self._forgotten_in = bytearray(), None
            return None
        if count < self.overall or not all(self._bit(b) for b in self._bits(client)):
            return None
        return max(1, min(math.ceil(self.window), math.ceil(start + self.window - now)))

    def _bits(self, client: str) -> list[int]:
        # Independent positions from one keyed digest; `hash((n, client))` gave three that all
        # followed one 20-bit value, a filter of one hash (1 false positive in 25, not 176).
        digest = hashlib.blake2b(
            client.encode("utf-8", "surrogatepass"), digest_size=4 * _HASHES, key=self.salt
        ).digest()
        return [
            int.from_bytes(digest[4 * n : 4 * n + 4], "little") % _FORGOTTEN_BITS
            for n in range(_HASHES)
        ]

    def _bit(self, bit: int) -> bool:
        return bool(self._forgotten[bit >> 3] & (1 << (bit & 7)))

    def _remember_forgotten(self, client: str) -> None:
        if self._forgotten_in != self._all[0]:  # a filter of its own for each overall window
            self._forgotten, self._forgotten_in = bytearray(_FORGOTTEN_BITS // 8), self._all[0]
        for bit in self._bits(client):
            self._forgotten[bit >> 3] |= 1 << (bit & 7)

    def failed(self, client: str) -> None:
        """Count a failed sign-in, or an unrecognised token, of `client`."""
        now = self.clock()
        start, count = self._all
        self._all = (start, count + 1) if self._current(start, now) else (now, 1)
        entry = self._clients.get(client)
        if entry is not None and self._current(entry[0], now):
            self._clients[client] = (entry[0], entry[1] + 1)
            return
        self._clients.pop(client, None)
        if len(self._clients) >= self.max_clients:
            self._forget(now)
        self._clients[client] = (now, 1)

    def _current(self, start: float, now: float) -> bool:
        """Whether a window that began at `start` still runs. The clock is the runtime's, a
        wall clock: set back by less than a window it keeps the window, by more it ends it (a
        clock stepped back an hour held a client, and the overall count, for that hour)."""
        return -self.window < now - start < self.window

    def _forget(self, now: float) -> None:
        """Make room: drop the lapsed windows, else the oldest one. Windows are kept in the
        order they began, so the lapsed ones come first and this stops at the first current."""
        while self._clients:
            client, (start, _) = next(iter(self._clients.items()))
            current = self._current(start, now)
            if current and len(self._clients) < self.max_clients:
                break
            del self._clients[client]
            if current:
                self._remember_forgotten(client)
