"""The client's keyed calls: a call that starts a conversation or sends a message goes with an
idempotency key (the caller's, or a new one per call), and one that got no answer (a timeout, a
dropped connection, a proxy's 502 or 504) is sent once more with the same key, which the server
applies once. Any other call is sent once: it has no key to make a second try safe."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable

from . import _exceptions as errors
from ._idempotency import check_key
from ._payloads import RemoteResult

__all__ = ["keyed_turn", "unanswered"]

Send = Callable[[dict[str, str]], Awaitable[RemoteResult]]
"""Sends the call once with the given headers and reads its result."""


def unanswered(exc: errors.RemoteError) -> bool:
    """A call that was sent but got no answer: it may or may not have been applied. A proxy's
    own 502 or 504 page (not a signoff error body) says the same: the server died mid-call,
    or answered later than the proxy waits."""
    if exc.code == "http_error" and exc.status in (502, 504):
        return True
    return exc.status == 0 and exc.code in ("timeout", "connection_lost")


async def keyed_turn(send: Send, key: str | None) -> RemoteResult:
    """A call that starts a conversation or sends a message, under its idempotency key (a
    new one if none is given): if it gets no answer, it is sent once more with the key, and
    if that gets none either (or cannot be sent), the error names the key to retry it with:
    the first may have been applied."""
    key = secrets.token_urlsafe(24) if key is None else check_key(key)
    try:
        return await _sent_twice(send, key)
    except errors.SignoffError as exc:
        # Whatever failed (a bare 500, a store failing mid-turn, a retry refused as busy),
        # the message may have been recorded: calling again under a new key could deliver
        # it twice, so the error names this one.
        exc.idempotency_key = key
        raise


async def _sent_twice(send: Send, key: str) -> RemoteResult:
    """The keyed call of `keyed_turn`, sent once more if the first got no answer."""
    headers = {"Idempotency-Key": key}
    try:
        return await send(headers)
    except errors.RemoteError as exc:
        if not unanswered(exc):
            raise
        first = exc
    try:
        return await send(headers)
    except errors.SignoffError as exc:
        if isinstance(exc, errors.RemoteError) and unanswered(exc):
            last, said = exc, f"{exc} (sent twice with idempotency_key={key!r}"
        elif isinstance(exc, errors.RemoteError) and (
            exc.status == 0 or exc.code == "http_error"
        ):  # not sent again (the server gone), or not answered by it (a proxy's page)
            last, said = first, f"{first} (not sent again: {exc.code}; idempotency_key={key!r}"
        else:  # refused (busy, a store failing for a while): the first may have acted
            exc.add_note(
                "the first try got no answer and may have been applied: call again with "
                f"idempotency_key={key!r}, and the server acts once"
            )
            raise
        raise errors.RemoteError(
            f"{said}: call again with it, and the server acts once)",
            last.code,
            last.status,
            idempotency_key=key,
        ) from exc
