"""The dashboard's sign-in cookie: a signed, expiring sign-in that signing out revokes everywhere.

The cookie holds `v1.<id>.<issued>.<credential>.<mac>`, never the API token: a random id, the
sign-in's time (the runtime's clock, whole seconds), a keyed digest naming the configured token
it was made with, and an HMAC of them keyed with the server's key and computed over that token
too, so only someone holding the token can make one. A sign-in is refused once its lifetime has
passed, once its token is no longer configured (removed or changed), and once it is signed out.

Signing out records the sign-in's id in the audit trail (stream `dashboard:sign-outs`), which
every process serving the store reads: each process keeps the ids it has read, and reads the
stream again only when its head has moved (one indexed query a request). Ids of sign-ins past
their lifetime are forgotten, since those are refused anyway. The id, not the credential, is
revoked: signing out in one browser leaves the token's other sign-ins alone. A principal (its
full identity, as `Principal.same_as` compares it) signed out more than `SIGN_OUTS_KEPT` times
within the lifetime (a token holder looping sign-in and sign-out) has its next sign-out end all
its sign-ins made until then, one entry in place of their ids, and may not sign in again until
those have expired: the list, and the stream, grow by at most that many entries a principal a
lifetime. Another principal of the same id (another issuer's, or type) is not held with it.

Without a server secret the key is public, so anyone can make a cookie for a token they guess:
a refused cookie then counts as a guess (`_throttle`), and an address held for its guesses is
served only the cookies this process made or honoured before (`Honoured`), so its answer does
not tell a right guess from a wrong one. A browser signed in through another process is refused
too, until the window ends: nothing tells its cookie from a forged one but a record of every
sign-in in the store, which a secret makes needless.
"""

from __future__ import annotations

import base64
import hashlib
import heapq
import hmac
import math
import secrets
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

from .._audit_trail import SIGN_OUTS_STREAM
from .._settings import seconds
from .._text import storable
from .._types import Principal
from ..stores import Store
from ..stores._audit import AuditRow
from ._auth import TokenAuth

__all__ = [
    "SIGNED_OUT",
    "SIGN_IN_LIFETIME",
    "SIGN_OUTS",
    "SIGN_OUTS_KEPT",
    "Grant",
    "Honoured",
    "SignOuts",
    "checked",
    "issue",
    "lifetime_of",
]

SIGN_IN_LIFETIME = 12 * 3600.0
"""How long a dashboard sign-in lasts by default, in seconds (`create_app(sign_in_lifetime=)`)."""

SIGN_OUTS = SIGN_OUTS_STREAM
SIGNED_OUT = "dashboard.signed_out"

_VERSION = "v1"
_SKEW = 300  # seconds a sign-in's time may be ahead of this process's clock (another process's)
_PAGE = 1000
SIGN_OUTS_KEPT = 1000
"""Sign-outs of one principal within the lifetime kept one by one: past them, a sign-out ends
all of the principal's sign-ins made until then, and it may sign in again once they expired."""
_HONOURED = 10_000  # cookies `Honoured` remembers at most (about 200 bytes each)


@dataclass(frozen=True, slots=True)
class Grant:
    """A sign-in read from a cookie whose mac, lifetime and token all check out."""

    id: str
    issued: int
    principal: Principal


def lifetime_of(value: object) -> float:
    """`value` as a sign-in lifetime: a positive, finite number of seconds (an int too large
    for a float, `10**400`, was an `OverflowError`)."""
    return float(seconds("sign_in_lifetime", value))


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _credential(key: bytes, token: str) -> str:
    raw = b"signoff-sign-in-credential\0" + token.encode()
    return _b64(hmac.new(key, raw, hashlib.sha256).digest()[:16])


def _mac(key: bytes, sign_in: str, token: str) -> str:
    raw = b"signoff-sign-in\0" + sign_in.encode() + b"\0" + token.encode()
    return _b64(hmac.new(key, raw, hashlib.sha256).digest())


def issue(key: bytes, token: str, now: float) -> str:
    """A new sign-in's cookie value for `token`, made at `now`."""
    sign_in = f"{_VERSION}.{secrets.token_urlsafe(18)}.{int(now)}.{_credential(key, token)}"
    return f"{sign_in}.{_mac(key, sign_in, token)}"


def checked(
    key: bytes, auth: TokenAuth, value: str, now: float, lifetime: float
) -> tuple[Grant | None, bool]:
    """The sign-in `value` holds, if it was made by this key for a token still configured and
    is within its lifetime at `now` (whether it was signed out is for `SignOuts`); and, when
    refused, whether for naming no configured token while well formed and current: what a
    cookie made for a guessed token is (or one of a token since removed). A tampered, expired
    or malformed cookie guesses nothing."""
    if not value.isascii() or len(value) > 1000:
        return None, False
    sign_in, _, mac = value.rpartition(".")
    parts = sign_in.split(".")
    if len(parts) != 4 or parts[0] != _VERSION or not parts[1]:
        return None, False
    issued_text, credential = parts[2], parts[3]
    if not issued_text.isdigit() or len(issued_text) > 15:
        return None, False
    issued = int(issued_text)
    if not now - lifetime < issued <= now + _SKEW:
        return None, False
    found: tuple[str, Principal] | None = None
    for token, principal in auth.tokens.items():  # every token, so the time names none
        if hmac.compare_digest(_credential(key, token).encode(), credential.encode()):
            found = (token, principal)
    if found is None:
        return None, True
    if not hmac.compare_digest(_mac(key, sign_in, found[0]).encode(), mac.encode()):
        return None, False
    return Grant(id=parts[1], issued=issued, principal=found[1]), False


Who = tuple[str | None, ...]
"""A principal as a sign-out names it: its full identity as `Principal.same_as` compares it,
(authenticator, issuer, principal_type, principal_id). An entry written before the issuer and
type were recorded names (authenticator, principal_id): every principal spelled so, as it was
honoured then."""


def _who_of(principal: Principal) -> Who:
    """`principal` as its sign-outs name it, as text a store can hold: a token's principal
    changed in place to one holding a lone surrogate (which no request authenticates as) may
    still be a browser's earlier sign-in, signed out when it signs in again."""
    return (
        storable(principal.authenticator),
        None if principal.issuer is None else storable(principal.issuer),
        storable(principal.principal_type),
        storable(principal.principal_id),
    )


def _who(data: Mapping[str, object]) -> Who:
    authenticator, principal_id = data.get("authenticator"), data.get("principal_id")
    if not isinstance(authenticator, str) or not isinstance(principal_id, str):
        return ("", None, "", "")  # no principal's: a malformed entry ends no one's sign-ins
    if "issuer" not in data and "principal_type" not in data:
        return authenticator, principal_id
    issuer, principal_type = data.get("issuer"), data.get("principal_type", "user")
    if (issuer is None or isinstance(issuer, str)) and isinstance(principal_type, str):
        return authenticator, issuer, principal_type, principal_id
    return ("", None, "", "")


def _covers(who: Who, other: Who) -> bool:
    """Whether a sign-out of all of `who`'s sign-ins ends `other`'s too."""
    return other == who or (len(who) == 2 and (other[0], other[-1]) == who)


@dataclass(slots=True)
class SignOuts:
    """The sign-ins signed out, as this process last read them from the store: their ids, and
    for a principal signed out more than `limit` times within the lifetime, the time up to
    which all its sign-ins are (`revoke`), so the list stays bounded however often one
    signs in and out."""

    lifetime: float
    limit: int = SIGN_OUTS_KEPT
    _ids: dict[str, tuple[int, Who]] = field(default_factory=dict)  # id -> its time, principal
    _expiry: list[tuple[int, str]] = field(default_factory=list)  # a heap of (time, id)
    _counts: dict[Who, int] = field(default_factory=dict)  # ids kept of each principal
    _upto: dict[Who, int] = field(default_factory=dict)  # principal -> all its sign-ins until
    _head: int = 0  # the stream's length when last read
    _after: int = 0  # the id of the last entry read

    async def revoked(self, store: Store, grant: Grant, now: float) -> bool:
        """Whether `grant` was signed out, in any process serving `store`."""
        await self.read(store, now)
        return grant.id in self._ids or grant.issued <= self._until(_who_of(grant.principal))

    async def read(self, store: Store, now: float) -> None:
        """Take in the sign-outs recorded since the last read, if the stream's head moved."""
        heads = await store.audit_heads(stream=SIGN_OUTS)
        head = heads.get(SIGN_OUTS, (0, None))[0]
        if head == self._head:
            return
        while True:
            batch = await store.audit(stream=SIGN_OUTS, after_id=self._after, limit=_PAGE)
            for entry in batch:
                self._take(entry.data)
                self._after = max(self._after, entry.id)
            if len(batch) < _PAGE:
                break
        self._head = head
        self._forget_expired(now)

    def held(self, principal: Principal, now: float) -> int | None:
        """Seconds until `principal` may sign in again, once it was signed out more than
        `limit` times within the lifetime (its sign-ins until then ended at once); else None."""
        upto = self._until(_who_of(principal))
        if upto <= now - self.lifetime:
            return None
        return max(1, math.ceil(upto + self.lifetime - now))

    async def revoke(self, store: Store, grant: Grant, now: float) -> None:
        """Record that `grant` is signed out, for every process serving `store`: past `limit`
        sign-outs of its principal kept, as every sign-in of the principal made until now."""
        who = _who_of(grant.principal)
        data: dict[str, object] = {
            "sign_in": grant.id,
            "issued": grant.issued,
            "authenticator": who[0],
            "issuer": who[1],
            "principal_type": who[2],
            "principal_id": who[3],
        }
        if self._counts.get(who, 0) >= self.limit:
            data["upto"] = max(int(now), grant.issued)
        await store.record_audit(
            [AuditRow(stream=SIGN_OUTS, type=SIGNED_OUT, at=now, seq=None, data=data)]
        )
        self._take(data)

    def _take(self, data: Mapping[str, object]) -> None:
        """Keep one sign-out entry's id, or its principal's time until which all are out."""
        who, upto = _who(data), data.get("upto")
        sign_in, issued = data.get("sign_in"), data.get("issued")
        if isinstance(upto, int):
            self._upto[who] = max(upto, self._upto.get(who, upto))
            for gone in [i for i, (t, w) in self._ids.items() if _covers(who, w) and t <= upto]:
                self._drop(gone)
            if len(self._expiry) > 2 * len(self._ids):  # the heap's entries of ids dropped
                self._expiry = [(t, i) for i, (t, _) in self._ids.items()]
                heapq.heapify(self._expiry)
            return
        if not isinstance(sign_in, str) or not isinstance(issued, int) or sign_in in self._ids:
            return
        if issued <= self._until(who):
            return
        self._ids[sign_in] = (issued, who)
        self._counts[who] = self._counts.get(who, 0) + 1
        heapq.heappush(self._expiry, (issued, sign_in))

    def _until(self, who: Who) -> int:
        """The time until which all of `who`'s sign-ins are out (-1 for none): its own, or an
        older entry's for every principal spelled with its authenticator and id."""
        return max(self._upto.get(who, -1), self._upto.get((who[0], who[-1]), -1))

    def _drop(self, sign_in: str) -> None:
        _, who = self._ids.pop(sign_in)
        left = self._counts[who] - 1
        if left:
            self._counts[who] = left
        else:
            del self._counts[who]

    def _forget_expired(self, now: float) -> None:
        """Forget the sign-outs of sign-ins past their lifetime, which are refused anyway: the
        oldest first, off a heap, so a read costs the entries forgotten, not all those kept."""
        cutoff = now - self.lifetime
        while self._expiry and self._expiry[0][0] <= cutoff:
            issued, sign_in = heapq.heappop(self._expiry)
            kept = self._ids.get(sign_in)
            if kept is not None and kept[0] == issued:
                self._drop(sign_in)
        for who in [w for w, upto in self._upto.items() if upto <= cutoff]:
            del self._upto[who]


@dataclass(slots=True)
class Honoured:
    """The sign-in cookies this process made or honoured, the most recent `limit` of them: the
    ones an address held for its guesses may still use, since it did not forge them now."""

    limit: int = _HONOURED
    _values: OrderedDict[str, None] = field(default_factory=OrderedDict)

    def add(self, value: str) -> None:
        self._values[value] = None
        self._values.move_to_end(value)
        while len(self._values) > self.limit:
            self._values.popitem(last=False)

    def __contains__(self, value: str) -> bool:
        return value in self._values
