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
revoked: signing out in one browser leaves the token's other sign-ins alone.

Without a server secret the key is public, so anyone can make a cookie for a token they guess:
a refused cookie then counts as a guess (`_throttle`), and an address held for its guesses is
served only the cookies this process made or honoured before (`Honoured`), so its answer does
not tell a right guess from a wrong one.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections import OrderedDict
from dataclasses import dataclass, field

from .._audit_trail import SIGN_OUTS_STREAM
from .._settings import seconds
from .._types import Principal
from ..stores import Store
from ..stores._audit import AuditRow
from ._auth import TokenAuth

__all__ = [
    "SIGNED_OUT",
    "SIGN_IN_LIFETIME",
    "SIGN_OUTS",
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


@dataclass(slots=True)
class SignOuts:
    """The ids of the sign-ins signed out, as this process last read them from the store."""

    lifetime: float
    _ids: dict[str, int] = field(default_factory=dict)  # id -> its sign-in's time
    _head: int = 0  # the stream's length when last read
    _after: int = 0  # the id of the last entry read

    async def revoked(self, store: Store, grant: Grant, now: float) -> bool:
        """Whether `grant` was signed out, in any process serving `store`."""
        heads = await store.audit_heads(stream=SIGN_OUTS)
        head = heads.get(SIGN_OUTS, (0, None))[0]
        if head != self._head:
            while True:
                batch = await store.audit(stream=SIGN_OUTS, after_id=self._after, limit=_PAGE)
                for entry in batch:
                    issued = entry.data.get("issued")
                    sign_in = entry.data.get("sign_in")
                    if isinstance(sign_in, str) and isinstance(issued, int):
                        self._ids[sign_in] = issued
                    self._after = max(self._after, entry.id)
                if len(batch) < _PAGE:
                    break
            self._head = head
            self._forget_expired(now)
        return grant.id in self._ids

    async def revoke(self, store: Store, grant: Grant, now: float) -> None:
        """Record that `grant` is signed out, for every process serving `store`."""
        who = grant.principal
        data = {
            "sign_in": grant.id,
            "issued": grant.issued,
            "authenticator": who.authenticator,
            "principal_id": who.principal_id,
        }
        await store.record_audit(
            [AuditRow(stream=SIGN_OUTS, type=SIGNED_OUT, at=now, seq=None, data=data)]
        )
        self._ids[grant.id] = grant.issued

    def _forget_expired(self, now: float) -> None:
        for sign_in in [i for i, issued in self._ids.items() if issued <= now - self.lifetime]:
            del self._ids[sign_in]


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
