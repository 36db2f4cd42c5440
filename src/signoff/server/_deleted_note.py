"""The one-time note on the dashboard's Sessions list after a session was deleted from its page:
its id and how many subagent sessions went with it, in a cookie keyed by the server's secret,
so only this server's own note is shown, whatever a cookie says."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json

__all__ = ["DELETED_COOKIE", "deleted_note", "deleted_told"]

DELETED_COOKIE = "signoff_deleted"


def deleted_note(secret: bytes, deleted: list[str]) -> str:
    """The cookie's value for a deletion of `deleted` (the session's id first), signed."""
    raw = base64.urlsafe_b64encode(json.dumps([deleted[0], len(deleted) - 1]).encode()).decode()
    mac = hmac.new(secret, b"deleted " + raw.encode(), hashlib.sha256).hexdigest()[:32]
    return f"{raw}.{mac}"


def deleted_told(secret: bytes, cookie: str | None) -> str | None:
    """What the deletion note's cookie tells, if this server wrote it: "Deleted ses_… and N
    subagent sessions"; None for no cookie or another's."""
    raw, _, mac = (cookie or "").partition(".")
    want = hmac.new(secret, b"deleted " + raw.encode(), hashlib.sha256).hexdigest()[:32]
    if not raw or not hmac.compare_digest(want.encode(), mac.encode()):
        return None
    try:
        sid, others = json.loads(base64.urlsafe_b64decode(raw.encode()))
    except (binascii.Error, ValueError, TypeError):
        return None
    if not isinstance(sid, str) or not isinstance(others, int):
        return None
    if not others:
        return f"Deleted {sid}."
    return f"Deleted {sid} and {others} subagent session{'' if others == 1 else 's'}."
