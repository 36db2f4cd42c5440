"""How Slack signs what it sends, for the Slack tests and their child processes: the signing
secret they share and the headers of a signed body (no test framework imported: a child
process starts quickly)."""

from __future__ import annotations

import hashlib
import hmac

__all__ = ["SECRET", "sign"]

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"


def sign(body: bytes, timestamp: int, secret: str = SECRET) -> dict[str, str]:
    """Slack's signature headers (`v0` HMAC-SHA256 of `v0:{timestamp}:{body}`) for `body`."""
    base = f"v0:{timestamp}:".encode() + body
    digest = hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
    return {
        "X-Slack-Request-Timestamp": str(timestamp),
        "X-Slack-Signature": f"v0={digest}",
        "Content-Type": "application/x-www-form-urlencoded",
    }
