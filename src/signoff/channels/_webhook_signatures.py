"""Webhook signatures: how a delivery is signed (`Signoff-Timestamp`, `Signoff-Signature`) and
how a receiver checks one (`verify_webhook`)."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .. import __version__
from .._exceptions import UsageError
from .._settings import finite, seconds, shown_value
from ._base import InvalidSignature

__all__ = [
    "DELIVERY_HEADER",
    "EVENT_HEADER",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "secret_list",
    "sign_webhook",
    "signed_headers",
    "verify_webhook",
]

TIMESTAMP_HEADER = "Signoff-Timestamp"
SIGNATURE_HEADER = "Signoff-Signature"
EVENT_HEADER = "Signoff-Event"
DELIVERY_HEADER = "Signoff-Delivery"
_CHECKED = {
    h.lower(): h for h in (TIMESTAMP_HEADER, SIGNATURE_HEADER, EVENT_HEADER, DELIVERY_HEADER)
}

Headers = (
    Mapping[str, str]
    | Mapping[bytes, bytes]
    | Iterable[tuple[bytes, bytes] | list[bytes]]
    | Iterable[tuple[str, str] | list[str]]
)
"""What `verify_webhook` reads headers from: a framework's `request.headers`, or the list of
`[name, value]` pairs an ASGI scope holds (`scope["headers"]`), each copy of a header kept."""


def sign_webhook(secret: str, timestamp: int, body: bytes) -> str:
    """The `Signoff-Signature` value for `body` sent at `timestamp`."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return "v1=" + mac.hexdigest()


def signed_headers(
    secrets: Sequence[str], stamp: int, raw: bytes, event: str, delivery: str
) -> dict[str, str]:
    """The headers of one attempt to deliver `raw`, signed at `stamp` by each secret."""
    return {
        "Content-Type": "application/json",
        "User-Agent": f"signoff/{__version__}",
        TIMESTAMP_HEADER: str(stamp),
        SIGNATURE_HEADER: ", ".join(sign_webhook(s, stamp, raw) for s in secrets),
        EVENT_HEADER: event,
        DELIVERY_HEADER: delivery,
    }


def verify_webhook(
    secret: str | Sequence[str],
    headers: Headers,
    body: bytes | str,
    *,
    tolerance: float = 300,
    now: float | None = None,
) -> dict[str, Any]:
    """Check a delivery's signature and age; returns the parsed JSON payload.

    `secret` may be several (while rotating): a signature by any of them is accepted.
    `tolerance` must be a finite number of seconds from 0 (a `UsageError` otherwise: an
    infinite one would accept a replay of any age).
    Raises `InvalidSignature` when a header is missing, the timestamp is more than `tolerance`
    seconds away from `now`, no `v1=` signature (comma-separated, for secret rotation)
    matches (the comparison is constant-time), or the unsigned `Signoff-Delivery` or
    `Signoff-Event` header, when present, differs from the signed body's `id` or `type`, or
    one of these four headers is given more than once.

    `headers` is the request's headers (`request.headers`), or in a bare ASGI app the scope's
    `[name, value]` pairs as they are (`scope["headers"]`): `dict(scope["headers"])` keeps the
    last copy of a repeated header, so a replay adding a forged one first would verify.

        payload = verify_webhook(SECRET, request.headers, await request.body())
    """
    secrets = secret_list(secret, "verify_webhook()")
    # NaN compares false with every age and infinity is above each: either lets any replay in.
    seconds("tolerance", tolerance, zero=True)
    if now is not None and not finite(now):  # a str or 10**400 made math.isfinite raise
        raise UsageError(f"now must be a finite Unix time, not {shown_value(now)}")
    if not isinstance(body, str | bytes | bytearray | memoryview):
        # Parsed JSON (`request.json`) is the natural mistake; an int made `bytes(n)` allocate.
        raise UsageError(
            "verify_webhook(): body must be the request's raw bytes (or text), not "
            f"{type(body).__name__}: pass what `await request.body()` returns, not parsed JSON"
        )
    try:
        raw = body.encode() if isinstance(body, str) else bytes(body)
    except UnicodeEncodeError:  # text decoded from invalid UTF-8: the bytes signed are gone
        raise InvalidSignature("the body is not valid UTF-8 text: pass the raw bytes") from None
    lowered = _signoff_headers(headers)
    stamp = lowered.get(TIMESTAMP_HEADER.lower())
    given = lowered.get(SIGNATURE_HEADER.lower())
    if not stamp or not given:
        raise InvalidSignature(f"missing {TIMESTAMP_HEADER} or {SIGNATURE_HEADER} header")
    try:
        if not (stamp.isascii() and stamp.isdigit()):  # int() also reads "1_7", other digits
            raise ValueError(stamp)
        timestamp = int(stamp)  # a ValueError past 4300 digits too
    except ValueError:
        shown = stamp[:40]
        raise InvalidSignature(f"{TIMESTAMP_HEADER} is not a Unix timestamp: {shown!r}") from None
    current = time.time() if now is None else now
    try:
        age = current - timestamp
    except OverflowError:  # an integer too large for a float: no real clock is there
        raise InvalidSignature(f"{TIMESTAMP_HEADER} is more than {tolerance:g}s off") from None
    if abs(age) > tolerance:
        raise InvalidSignature(f"the delivery is {int(age)}s old; more than {tolerance:g}s off")
    expected = [sign_webhook(s, timestamp, raw).encode() for s in secrets]
    candidates = [s.strip() for s in given.split(",") if s.strip().startswith("v1=")]
    # As bytes: compare_digest refuses str with non-ASCII characters (a TypeError, not a no).
    if not any(hmac.compare_digest(e, _utf8(c)) for e in expected for c in candidates):
        raise InvalidSignature("the signature does not match the body and timestamp")
    try:
        payload = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json can read
        raise InvalidSignature("the signed body is not JSON") from None
    if not isinstance(payload, dict):
        raise InvalidSignature("the signed body is not a JSON object")
    # Headers are not signed: a receiver deduping on Signoff-Delivery must not be told a replay
    # is another delivery.
    for header, key in ((DELIVERY_HEADER, "id"), (EVENT_HEADER, "type")):
        claimed = lowered.get(header.lower())
        if claimed is not None and claimed != payload.get(key):
            raise InvalidSignature(f"the {header} header does not match the signed body's {key}")
    return payload


def _signoff_headers(headers: Headers) -> dict[str, str]:
    """The `Signoff-*` headers by lowercase name. One given twice (a repeat in a framework's
    headers or an ASGI scope's pairs, or two spellings in a dict) is an `InvalidSignature`: the
    check would read the last copy while the receiver's `headers[name]` reads the first."""
    items = getattr(headers, "items", None)
    if callable(items) and not isinstance(headers, str | bytes | bytearray):
        pairs: Iterable[object] = items()
    elif isinstance(headers, Iterable) and not isinstance(headers, str | bytes | bytearray):
        pairs = headers  # an ASGI scope's [name, value] pairs
    else:
        raise UsageError(
            "verify_webhook(): headers must be the request's headers, a mapping of names to "
            "values (request.headers) or an ASGI scope's [name, value] pairs, not "
            f"{type(headers).__name__}"
        )
    found: dict[str, str] = {}
    for pair in pairs:
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            raise UsageError(
                "verify_webhook(): headers given as pairs must each be a [name, value] pair, "
                f"not {type(pair).__name__}"
            )
        name, value = _header_text(pair[0]), _header_text(pair[1])
        key = name.lower()
        if key not in _CHECKED:
            continue
        if key in found:
            raise InvalidSignature(f"the {_CHECKED[key]} header is given more than once")
        found[key] = value
    return found


def _header_text(value: object) -> str:
    """A header's name or value as text: raw bytes (an ASGI scope's) read as Latin-1, as HTTP
    and Starlette read them; anything else is a `UsageError`, not a bare TypeError."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("latin-1")
    raise UsageError(
        f"verify_webhook(): header names and values must be text or bytes, not "
        f"{type(value).__name__}"
    )


def secret_list(secret: str | Sequence[str], who: str) -> list[str]:
    """The signing secrets as a list: one, or several while rotating, none of them empty, blank
    or with blanks around it (a secret file's newline: every signature would disagree)."""
    if isinstance(secret, str):
        secrets = [secret]
    elif isinstance(secret, Iterable) and not isinstance(secret, bytes | bytearray | Mapping):
        secrets = list(secret)
    else:  # named by its type only: the value is a secret
        raise UsageError(
            f"{who}: secret must be a non-empty string, or a list of them while rotating, "
            f"not {type(secret).__name__}"
        )
    if not secrets or not all(isinstance(s, str) and s for s in secrets):
        raise UsageError(f"{who} needs the shared secret: a non-empty string, or several")
    for number, s in enumerate(secrets, 1):
        try:
            s.encode()
        except UnicodeEncodeError:  # e.g. from an environment holding invalid UTF-8
            raise UsageError(f"{who}: a secret is not valid Unicode (a lone surrogate)") from None
        if s != s.strip():
            # Read from a file written by `echo` ("...\n"): every delivery was signed with the
            # newline, and the receiver's 401 is final. Named by position: it is a secret.
            which = "the secret" if len(secrets) == 1 else f"secret #{number}"
            if not s.strip():
                raise UsageError(f"{who}: {which} is blank: give the shared secret")
            raise UsageError(f"{who}: {which} has spaces or a newline around it: drop them")
    return secrets


def _utf8(text: str) -> bytes:
    """`text` as UTF-8, unpaired surrogates kept as they are (they then match nothing)."""
    return text.encode("utf-8", "surrogatepass")
