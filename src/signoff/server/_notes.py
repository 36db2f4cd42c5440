"""The dashboard's one-time notes: what a form's post did, told once on the page it leads to, by
a short-lived cookie that page takes back (a `?queued=1` in the URL told it again on every
reload). The Sessions list's note after a deletion names the session and how many subagent
sessions went with it, keyed by the server's secret, so only this server's own note is shown,
whatever a cookie says; a session page's notes are a digest of its id."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json

from starlette.requests import Request
from starlette.responses import Response

from ._auth import DASHBOARD_PREFIX

__all__ = [
    "DELETED_COOKIE",
    "NOT_CANCELLED_COOKIE",
    "QUEUED_COOKIE",
    "clear_note",
    "deleted_note",
    "deleted_told",
    "session_mark",
    "set_note",
]

DELETED_COOKIE = "signoff_deleted"
QUEUED_COOKIE = "signoff_queued"  # a form's message queued behind the turn
NOT_CANCELLED_COOKIE = "signoff_not_cancelled"  # a cancel form for a turn that had ended
_PATH = f"{DASHBOARD_PREFIX}/sessions"


def session_mark(session_id: str) -> str:
    """A session page's note's cookie value: a digest, as an id may be any text."""
    return hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def set_note(response: Response, request: Request, name: str, value: str) -> None:
    """Set a short-lived cookie the next page of the dashboard reads once (a one-time note)."""
    response.set_cookie(
        name,
        value,
        max_age=300,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path=_PATH,
    )


def clear_note(response: Response, request: Request, name: str) -> None:
    """Take a note's cookie back once its page told it: a reload does not tell it again."""
    secure = request.url.scheme == "https"
    response.delete_cookie(name, path=_PATH, httponly=True, samesite="strict", secure=secure)


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
