"""verify_webhook: what a receiver accepts and refuses, and secret rotation."""

from __future__ import annotations

import email.message
from typing import Any

import pytest
from multidict import CIMultiDict
from starlette.datastructures import Headers

import signoff as so
from signoff.channels import (
    InvalidSignature,
    WebhookChannel,
    verify_webhook,
)
from signoff.channels.webhooks import sign_webhook

from .test_webhooks import SECRET, Receiver


def test_verify_webhook_rejects_what_it_should() -> None:
    body = b'{"type":"request.opened"}'
    stamp = 1_700_000_000
    good = {"Signoff-Timestamp": str(stamp), "Signoff-Signature": sign_webhook(SECRET, stamp, body)}
    assert verify_webhook(SECRET, good, body, now=stamp + 10) == {"type": "request.opened"}
    # header names are case-insensitive; several signatures (secret rotation) are accepted
    rotated = {
        "signoff-timestamp": str(stamp),
        "signoff-signature": "v1=00ff, " + sign_webhook(SECRET, stamp, body),
    }
    assert verify_webhook(SECRET, rotated, body.decode(), now=stamp) == {"type": "request.opened"}
    with pytest.raises(InvalidSignature, match="more than 300s"):
        verify_webhook(SECRET, good, body, now=stamp + 301)
    with pytest.raises(InvalidSignature, match="more than 60s"):
        verify_webhook(SECRET, good, body, now=stamp - 61, tolerance=60)
    with pytest.raises(InvalidSignature, match="does not match"):
        verify_webhook(SECRET, good, body + b" ", now=stamp)
    with pytest.raises(InvalidSignature, match="missing"):
        verify_webhook(SECRET, {"Signoff-Timestamp": str(stamp)}, body, now=stamp)
    with pytest.raises(InvalidSignature, match="missing"):
        signed_only = {"Signoff-Signature": good["Signoff-Signature"]}
        verify_webhook(SECRET, signed_only, body, now=stamp)
    with pytest.raises(InvalidSignature, match="not a Unix timestamp"):
        verify_webhook(SECRET, {**good, "Signoff-Timestamp": "yesterday"}, body, now=stamp)
    with pytest.raises(InvalidSignature, match="more than 300s off"):  # too large for a float
        verify_webhook(SECRET, {**good, "Signoff-Timestamp": "9" * 400}, body, now=stamp + 0.5)
    unsigned_json = b"[1]"
    listed = {
        "Signoff-Timestamp": str(stamp),
        "Signoff-Signature": sign_webhook(SECRET, stamp, unsigned_json),
    }
    with pytest.raises(InvalidSignature, match="not a JSON object"):
        verify_webhook(SECRET, listed, unsigned_json, now=stamp)
    with pytest.raises(so.UsageError):
        verify_webhook("", good, body)


def test_verify_webhook_refuses_a_body_that_is_not_raw_bytes_or_text() -> None:
    """Parsed JSON passed as the body (`request.json`, the natural mistake) raised a bare
    TypeError about integers, and an int made `bytes(n)` allocate n bytes first: each is a
    `UsageError` saying to pass the raw body. Bytes in any buffer form still verify."""
    stamp = 1_700_000_000
    body = b'{"id": "whd_1", "type": "request.opened"}'
    good = {"Signoff-Timestamp": str(stamp), "Signoff-Signature": sign_webhook(SECRET, stamp, body)}
    for wrong in ({"id": "whd_1"}, None, [1], 10**12):
        with pytest.raises(so.UsageError, match="raw bytes .*not parsed JSON"):
            verify_webhook(SECRET, good, wrong, now=stamp)  # type: ignore[arg-type]
    for same in (bytearray(body), memoryview(body), body.decode()):
        assert verify_webhook(SECRET, good, same, now=stamp)["id"] == "whd_1"  # type: ignore[arg-type]


def test_verify_webhook_refuses_non_ascii_headers_by_name() -> None:
    """A forged signature or timestamp with non-ASCII characters is an `InvalidSignature`, not a
    TypeError from `hmac.compare_digest` (a 500 in the receiver)."""
    body = b'{"type":"request.opened"}'
    stamp = 1_700_000_000
    good = {"Signoff-Timestamp": str(stamp), "Signoff-Signature": sign_webhook(SECRET, stamp, body)}
    with pytest.raises(InvalidSignature, match="does not match"):
        verify_webhook(SECRET, {**good, "Signoff-Signature": "v1=\u00e9"}, body, now=stamp)
    # int() reads other scripts' digits and underscores; the header is ASCII digits only
    arabic = "\u0661\u0667\u0660\u0660\u0660\u0660\u0660\u0660\u0660\u0660"
    for odd in (arabic, "1_700_000_000", "9" * 5000):
        with pytest.raises(InvalidSignature, match="not a Unix timestamp"):
            verify_webhook(SECRET, {**good, "Signoff-Timestamp": odd}, body, now=stamp)


def test_verify_webhook_refuses_a_tolerance_or_clock_that_checks_nothing() -> None:
    """A NaN tolerance or `now` compares false with every age: replays of any age would pass."""
    body = b'{"type":"request.opened"}'
    stamp = 1_700_000_000
    good = {"Signoff-Timestamp": str(stamp), "Signoff-Signature": sign_webhook(SECRET, stamp, body)}
    for tolerance in (float("nan"), -1.0):
        with pytest.raises(so.UsageError, match="tolerance"):
            verify_webhook(SECRET, good, body, now=stamp, tolerance=tolerance)
    for now in (float("nan"), float("inf")):
        with pytest.raises(so.UsageError, match="now"):
            verify_webhook(SECRET, good, body, now=now)


def test_verify_webhook_refuses_a_tolerance_that_lets_any_age_in() -> None:
    """An infinite tolerance would take a replay of any age; a bool or a string is no number of
    seconds (one would mean 1 s, the other a TypeError). Each is a `UsageError` naming it; 0
    checks the age strictly and is kept."""
    body = b'{"type":"request.opened"}'
    stamp = 1_700_000_000
    good = {"Signoff-Timestamp": str(stamp), "Signoff-Signature": sign_webhook(SECRET, stamp, body)}
    for tolerance in (float("inf"), float("-inf"), True, "300", None):
        with pytest.raises(so.UsageError, match="tolerance must be a finite number"):
            verify_webhook(SECRET, good, body, now=stamp, tolerance=tolerance)  # type: ignore[arg-type]
    assert verify_webhook(SECRET, good, body, now=stamp, tolerance=0) == {"type": "request.opened"}
    with pytest.raises(InvalidSignature, match="more than 0s"):
        verify_webhook(SECRET, good, body, now=stamp + 1, tolerance=0)


def test_verify_webhook_refuses_delivery_headers_that_contradict_the_signed_body() -> None:
    """`Signoff-Delivery` and `Signoff-Event` are not signed: a replay that changes them (so a
    receiver deduping on the header takes it as new) is refused rather than believed."""
    body = b'{"id":"whd_1","type":"request.opened"}'
    stamp = 1_700_000_000
    good = {
        "Signoff-Timestamp": str(stamp),
        "Signoff-Signature": sign_webhook(SECRET, stamp, body),
        "Signoff-Delivery": "whd_1",
        "Signoff-Event": "request.opened",
    }
    assert verify_webhook(SECRET, good, body, now=stamp)["id"] == "whd_1"
    with pytest.raises(InvalidSignature, match="Signoff-Delivery"):
        verify_webhook(SECRET, {**good, "Signoff-Delivery": "whd_2"}, body, now=stamp)
    with pytest.raises(InvalidSignature, match="Signoff-Event"):
        verify_webhook(SECRET, {**good, "Signoff-Event": "request.resolved"}, body, now=stamp)


def test_verify_webhook_refuses_a_signed_body_nested_too_deeply_by_name() -> None:
    body = b"[" * 100_000 + b"]" * 100_000
    stamp = 1_700_000_000
    signed = {
        "Signoff-Timestamp": str(stamp),
        "Signoff-Signature": sign_webhook(SECRET, stamp, body),
    }
    with pytest.raises(InvalidSignature, match="not JSON"):
        verify_webhook(SECRET, signed, body, now=stamp)


async def test_secret_rotation_signs_with_each_secret_and_verifies_with_any() -> None:
    """Rotating the secret: the channel signs with the new and the old one at once, so
    receivers that still check the old secret accept every delivery (a refusal is final,
    so a rotation without this drops deliveries), and a receiver may check both."""
    async with Receiver([]) as receiver:
        hooks = WebhookChannel(receiver.url, ["whsec_new", SECRET])
        sent = b'{"id":"whd_1","type":"request.opened"}'
        assert await hooks.deliver(receiver.url, "whd_1", "request.opened", sent) is True
        await hooks.close()
    ((headers, body),) = receiver.accepted
    assert verify_webhook(SECRET, headers, body)["id"] == "whd_1"
    assert verify_webhook("whsec_new", headers, body)["id"] == "whd_1"
    assert verify_webhook(["whsec_newer", "whsec_new"], headers, body)["id"] == "whd_1"
    with pytest.raises(InvalidSignature, match="does not match"):
        verify_webhook(["whsec_other", "whsec_newer"], headers, body)
    for bad in ([], [""], ["ok", 7]):
        with pytest.raises(so.UsageError, match="secret"):
            WebhookChannel(receiver.url, bad)  # type: ignore[arg-type]
        with pytest.raises(so.UsageError, match="secret"):
            verify_webhook(bad, headers, body)  # type: ignore[arg-type]


def test_verify_webhook_refuses_a_text_body_utf8_cannot_hold_by_name() -> None:
    """A body passed as text with a lone surrogate (a framework that decoded invalid UTF-8
    with surrogateescape) is an `InvalidSignature`, not a UnicodeEncodeError (a 500)."""
    stamp = 1_700_000_000
    headers = {"Signoff-Timestamp": str(stamp), "Signoff-Signature": "v1=00"}
    with pytest.raises(InvalidSignature, match="raw bytes"):
        verify_webhook(SECRET, headers, '{"a":"caf\udce9"}', now=stamp)


def _framework_headers(pairs: list[tuple[str, str]]) -> list[Any]:
    """`pairs` as the header objects receivers are handed: Starlette's (FastAPI), aiohttp's and
    the standard library's (`http.server`). Each lists a repeated header in `items()` once per
    copy, and its `headers[name]` reads the first copy."""
    message = email.message.Message()
    for name, value in pairs:
        message[name] = value
    raw = [(name.lower().encode(), value.encode()) for name, value in pairs]
    return [Headers(raw=raw), CIMultiDict(pairs), message]


def test_verify_webhook_refuses_a_repeated_signoff_header() -> None:
    """A replay that adds a second `Signoff-Delivery` (or `Signoff-Event`) before the true one
    must not pass: the check would read the true copy while the receiver's framework hands the
    receiver the first, so a receiver deduping on it would take the replay as a new delivery."""
    body = b'{"id":"whd_1","type":"request.opened"}'
    stamp = 1_700_000_000
    signed = [
        ("Signoff-Timestamp", str(stamp)),
        ("Signoff-Signature", sign_webhook(SECRET, stamp, body)),
    ]
    true = [("Signoff-Delivery", "whd_1"), ("Signoff-Event", "request.opened")]
    for headers in _framework_headers(signed + true):
        assert verify_webhook(SECRET, headers, body, now=stamp)["id"] == "whd_1"
    for name, forged in (
        ("Signoff-Delivery", "whd_2"),
        ("Signoff-Event", "request.resolved"),
        ("Signoff-Timestamp", str(stamp + 1)),
        ("Signoff-Signature", "v1=00"),
    ):
        for headers in _framework_headers([(name, forged), *signed, *true]):
            assert headers[name] == forged  # what the receiver reads
            with pytest.raises(InvalidSignature, match=f"{name} header is given more than once"):
                verify_webhook(SECRET, headers, body, now=stamp)
    # a plain dict may hold one header under two spellings: as repeated
    twice = {**dict(signed + true), "signoff-delivery": "whd_1"}
    with pytest.raises(InvalidSignature, match="Signoff-Delivery header is given more than once"):
        verify_webhook(SECRET, twice, body, now=stamp)


def test_verify_webhook_reads_raw_header_bytes_and_refuses_other_headers_by_name() -> None:
    """Headers as an ASGI scope holds them (bytes, read as Latin-1) verify as text does; headers
    that are no mapping, or hold other values, are a `UsageError` naming them, not a bare
    TypeError or AttributeError (a 500 in the receiver)."""
    body = b'{"type":"request.opened"}'
    stamp = 1_700_000_000
    good = {"Signoff-Timestamp": str(stamp), "Signoff-Signature": sign_webhook(SECRET, stamp, body)}
    raw = {k.encode(): v.encode() for k, v in good.items()}
    assert verify_webhook(SECRET, raw, body, now=stamp) == {"type": "request.opened"}
    forged = {**raw, b"Signoff-Signature": b"v1=\xe9"}
    with pytest.raises(InvalidSignature, match="does not match"):
        verify_webhook(SECRET, forged, body, now=stamp)
    for odd in (None, "Signoff-Timestamp: 1", b"Signoff-Timestamp: 1", 1):
        with pytest.raises(so.UsageError, match="headers must be the request's headers"):
            verify_webhook(SECRET, odd, body, now=stamp)  # type: ignore[arg-type]
    for pairs in (["Signoff-Timestamp: 1"], [("Signoff-Timestamp", "1", "2")], [None]):
        with pytest.raises(so.UsageError, match=r"must each be a \[name, value\] pair"):
            verify_webhook(SECRET, pairs, body, now=stamp)  # type: ignore[arg-type]
    with pytest.raises(so.UsageError, match="must be text or bytes, not int"):
        verify_webhook(SECRET, {**good, "Signoff-Timestamp": stamp}, body, now=stamp)  # type: ignore[arg-type]


def test_verify_webhook_reads_an_asgi_scopes_header_pairs_each_copy_kept() -> None:
    """A bare ASGI app has the headers as `scope["headers"]`, a list of `[name, value]` byte
    pairs (README: "as the raw bytes an ASGI scope holds"): they verify as they are, and a
    replay adding a forged `Signoff-Delivery` before the true one is refused, as from a
    framework's headers. They were a `UsageError`, so such an app reached for
    `dict(scope["headers"])`, which keeps the last copy: the replay verified, while
    `Headers(scope=scope)["signoff-delivery"]` read the forged id."""
    body = b'{"id":"whd_1","type":"request.opened"}'
    stamp = 1_700_000_000
    signed = {
        "Signoff-Timestamp": str(stamp),
        "Signoff-Signature": sign_webhook(SECRET, stamp, body),
        "Signoff-Delivery": "whd_1",
        "Signoff-Event": "request.opened",
    }
    scope = [[k.lower().encode(), v.encode()] for k, v in signed.items()]
    for pairs in (scope, [(k, v) for k, v in scope], iter(scope), list(signed.items())):
        assert verify_webhook(SECRET, pairs, body, now=stamp)["id"] == "whd_1"
    replay = [[b"signoff-delivery", b"whd_2"], *scope]
    assert Headers(scope={"type": "http", "headers": replay})["signoff-delivery"] == "whd_2"
    with pytest.raises(InvalidSignature, match="Signoff-Delivery header is given more than once"):
        verify_webhook(SECRET, replay, body, now=stamp)
