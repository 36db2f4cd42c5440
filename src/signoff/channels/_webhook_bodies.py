"""What a `WebhookChannel` delivery's body holds, and how one over `max_body_bytes` (or over
what a receiver answering 413 takes) is clipped so the receiver still hears of the request."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from ._base import Escalation, Resolution

__all__ = [
    "CLIPPABLE",
    "CUT_CHARS",
    "MAX_BODY_BYTES",
    "delivery_body",
    "delivery_id",
    "json_bytes",
    "smallest",
    "within",
]

MAX_BODY_BYTES = 256 * 1024
"""The default bound on a delivery's body (`max_body_bytes`): receivers often take no more
than 1 MiB (aiohttp's default), or 100 KB (Express's), and answer a larger one with 413."""

CLIPPABLE = (
    ("request.action.input", ("request", "action", "input"), False),
    ("resolution.edited_input", ("resolution", "edited_input"), False),
    ("request.payload", ("request", "payload"), False),
    ("resolution.answer", ("resolution", "answer"), False),
    ("resolution.reason", ("resolution", "reason"), True),
    ("escalation.reason", ("escalation", "reason"), True),
    ("request.question", ("request", "question"), True),
    ("request.auto_reason", ("request", "auto_reason"), True),
    ("request.policy_error", ("request", "policy_error"), True),
    ("request.options", ("request", "options"), False),
    ("request.requested_by.attributes", ("request", "requested_by", "attributes"), False),
    ("resolution.by.attributes", ("resolution", "by", "attributes"), False),
)
"""What a body over `max_body_bytes` clips, the largest first, until it fits: what a request
is about that may be megabytes, each readable whole at `GET /v1/requests/{id}`. Each is sent as
null, but text marked to be cut (a reason, a question), cut to its first `CUT_CHARS` characters;
none of `CUT_CHARS` bytes or fewer as sent (UTF-8 JSON; text without its quotes) is clipped."""

CUT_CHARS = 500


def json_bytes(body: Mapping[str, Any]) -> bytes:
    """The delivery body as UTF-8 JSON; text with unpaired surrogates (which UTF-8 cannot hold)
    is written with `\\u` escapes instead, so such a request is delivered rather than failing."""
    try:
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return json.dumps(body, separators=(",", ":")).encode()


def within(body: dict[str, Any], limit: int) -> dict[str, Any]:
    """`body`, or if it is over `limit` bytes as sent, with what `CLIPPABLE` names clipped,
    the largest first, until it fits, each named in `clipped` (in `CLIPPABLE`'s order): a
    receiver that caps its bodies (and answers 413, a refusal never sent again) still hears of
    the request, and of its close, with its id and `input_hash` to read it whole."""
    raw = json_bytes(body)
    if len(raw) <= limit:
        return body
    # Each part is measured as the body is sent: an ASCII body has its other characters
    # escaped (or none), measured the same with escapes.
    escaped = raw.isascii()
    found: list[tuple[int, int, dict[str, Any], str]] = []
    for index, (_, path, _) in enumerate(CLIPPABLE):
        *parents, key = path
        holder: Any = body
        for part in parents:
            holder = holder.get(part) if isinstance(holder, dict) else None
        value = holder.get(key) if isinstance(holder, dict) else None
        if value is None:
            continue
        size, cut = _sent_size(value, escaped), CLIPPABLE[index][2]
        # A few hundred bytes are not worth losing; text cut to CUT_CHARS characters must be
        # longer than that for the cut to save anything.
        if size > CUT_CHARS and not (cut and isinstance(value, str) and len(value) <= CUT_CHARS):
            found.append((-size, index, holder, key))
    before = list(body.get("clipped") or [])
    done: list[tuple[int, dict[str, Any], str]] = []
    for _, index, holder, key in sorted(found, key=lambda f: f[:2]):
        if done:  # measured with the names of what was clipped, as it is sent
            body["clipped"] = [*before, *(CLIPPABLE[i][0] for i, _, _ in sorted(done))]
        if len(json_bytes(body)) <= limit:
            break
        value, cut = holder[key], CLIPPABLE[index][2]
        holder[key] = value[:CUT_CHARS] if cut and isinstance(value, str) else None
        done.append((index, holder, key))
    if done:
        body["clipped"] = [*before, *(CLIPPABLE[i][0] for i, _, _ in sorted(done))]
    for _, holder, key in done if limit > 0 else ():  # 0: `smallest`'s, each clipped once
        # Text cut to its first characters saved too little for the list naming it to fit as
        # well: sent as null instead, as a payload is.
        if len(json_bytes(body)) <= limit:
            break
        holder[key] = None
    return body


def _sent_size(value: Any, escaped: bool) -> int:
    """The bytes `value` takes in a body as sent (`escaped`: with `\\u` escapes), a string's
    without its quotes: a CJK character is 3 bytes of UTF-8, not the 6 of its escape."""
    size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=escaped, default=str).encode())
    return size - 2 if isinstance(value, str) else size


def smallest(raw: bytes) -> bytes | None:
    """`raw`'s body with everything `CLIPPABLE` sent as null, for a receiver that answered 413
    to it (its cap below `max_body_bytes`); None when there is nothing left to leave out."""
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    before = list(body.get("clipped") or [])
    body = within(body, 0)
    return None if body.get("clipped", []) == before else json_bytes(body)


def delivery_id(event: str, request_id: str) -> str:
    """The id of the delivery of `event` for the request `request_id`: the same every time."""
    return f"whd_{hashlib.sha256(f'{event}:{request_id}'.encode()).hexdigest()[:24]}"


def delivery_body(
    event: str,
    request_id: str,
    request: dict[str, Any],
    resolution: Resolution | None,
    escalation: Escalation | None,
    at: float,
) -> dict[str, Any]:
    """The JSON body of `event` for the request `request_id` as `request` shows it; its `id`
    is stable for the same event of the same request. A resolution's `edited_input` is null
    until the channel reads the approved input from the store (the audit entry lacks it)."""
    return {
        "id": delivery_id(event, request_id),
        "type": event,
        "at": at,
        "request": request,
        "resolution": None
        if resolution is None
        else {**resolution.to_dict(), "edited_input": None},
        "escalation": None if escalation is None else escalation.to_dict(),
    }
