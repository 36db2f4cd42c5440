"""How the stores keep JSON documents: plain text when short, deflated with a preset dictionary
when that is smaller.

Event data is mostly prose and tool arguments with the same keys in every row, so deflate with a
dictionary of those keys stores it in about 45% of its JSON size for about 12 us per row. A
packed value is bytes starting with a format byte; a plain value is the JSON text itself, so
rows written before packing existed still read back.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from .._events import dumps, loads
from .._exceptions import StoreError

__all__ = ["pack", "pack_bytes", "stored_type", "type_name", "unpack", "unpack_text"]

_DEFLATE_V1 = 1
"""Format byte: raw deflate (4 KB window) with `_DICTIONARY_V1` as its preset dictionary."""

_MIN_SIZE = 24
"""Shorter JSON stays text: the format byte and deflate's framing would eat the saving. Longer
JSON is packed only when that is smaller; with the dictionary, even a resolution of 80 bytes
packs into 18."""

# Keys and values that recur in event data, requests and snapshots. Deflate looks back into it,
# most useful text last. Changing it breaks every row written with it: add a new format instead.
_DICTIONARY_V1 = (
    b'{"v":1,"id":"ses_","agent":"","seq":,"created_at":,"updated_at":,"ttl":null,'
    b'"initiator":null,"parent":null,"approved_tools":[],"model_responses":,"queued":[],'
    b'"lapsed":false,"limit_grants":0,"candidates":{},"requests":[],"turn":{"steps":,'
    b'"retryable":false,"error":null,"first_seq":,"calls":{},"kind":"question","question":"",'
    b'"allow_text":false,"payload":null,"source":"policy","index":null,"requested_by":null,'
    b'"expires_at":null,"policy_error":null,"approvers":null,"quorum":1,'
    b'"principal":{"id":"","attributes":{}},"source":"message","message":"",'
    b'"idempotency_key":"ses_","edited_input":null,"approved_by":null,"value":null,'
    b'"decision":"approve","outcome":"approved","status":"settled","on":"input","request_ids":'
    b'["req_"],"result":{"approval":{"approved":true,"by":null,"reason":"ok"},"result":'
    b'{"request_id":"req_","call_id":"call_","tool_name":"","status":"ok","by":null,"reason":'
    b'"text":"","tool_calls":[{"id":"call_","name":"","input":{}}],'
    b'"usage":{"input_tokens":0,"output_tokens":0,"cost_usd":0.0}}'
    b'{"requests":[{"kind":"tool-approval","id":"req_","session_id":"ses_","turn_id":"trn_",'
    b'"agent":"","action":{"call_id":"call_","tool_name":"","input":{},"input_hash":"sha256:'
    b'"},"options":[{"id":"approve","label":"Approve","description":"Run the call as proposed.'
    b'"},{"id":"cancel","label":"Deny","description":"Do not run the call."}],"created_at":'
)


def pack(value: Any) -> str | bytes:
    """`value` as stored: its JSON text, or the deflated form when that is smaller."""
    text = dumps(value)
    try:
        raw = text.encode()
    except UnicodeEncodeError:
        # A lone surrogate (a tool or model can produce one): JSON's \u escapes keep it exact.
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=True)
        raw = text.encode()
    if len(raw) < _MIN_SIZE:
        return text
    deflater = zlib.compressobj(6, zlib.DEFLATED, -12, 4, zlib.Z_DEFAULT_STRATEGY, _DICTIONARY_V1)
    packed = deflater.compress(raw) + deflater.flush()
    if len(packed) + 1 >= len(raw):
        return text
    return bytes((_DEFLATE_V1,)) + packed


def pack_bytes(value: Any) -> bytes:
    """`pack` for a binary column (PostgreSQL `bytea`): plain JSON as its UTF-8 bytes, which
    never start with a format byte (those are control characters)."""
    packed = pack(value)
    return packed.encode() if isinstance(packed, str) else packed


def unpack_text(stored: str | bytes | memoryview) -> str:
    """The JSON text of a stored value, inflating it if it was packed."""
    if isinstance(stored, str):
        return stored
    stored = bytes(stored)
    if not stored:
        raise StoreError("a stored document is empty")
    if stored[0] >= 0x20 or stored[0] in b"\t\n\r":  # plain JSON text
        try:
            return stored.decode()
        except UnicodeDecodeError as exc:
            raise StoreError(f"a stored document is not UTF-8: {exc}") from exc
    if stored[0] != _DEFLATE_V1:
        raise StoreError(f"a stored document has unknown format {stored[0]} (newer signoff?)")
    try:
        inflater = zlib.decompressobj(-12, _DICTIONARY_V1)
        text = (inflater.decompress(stored[1:]) + inflater.flush()).decode()
        if not inflater.eof or inflater.unused_data:
            raise StoreError("a stored document is corrupt: truncated or followed by garbage")
        return text
    except (zlib.error, UnicodeDecodeError) as exc:
        raise StoreError(f"a stored document is corrupt: {exc}") from exc


def unpack(stored: str | bytes | memoryview) -> Any:
    """The value of a stored document."""
    text = unpack_text(stored)
    try:
        return loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
        raise StoreError(f"a stored document is not JSON: {exc}") from exc


# One character per event type, so an event row does not spend 10-16 bytes on its type name.
# Codes are forever: a new type gets a new letter, and a name with no code is stored as itself
# (every name has a dot; no code does).
_TYPE_CODES: dict[str, str] = {
    "session.created": "a",
    "turn.started": "b",
    "turn.message": "c",
    "model.completed": "d",
    "tool.started": "e",
    "tool.step": "f",
    "tool.completed": "g",
    "input.requested": "h",
    "turn.waiting": "i",
    "approval.candidate": "j",
    "approval.settled": "k",
    "input.resolved": "l",
    "turn.completed": "m",
    "turn.failed": "n",
    "turn.resumed": "o",
    "turn.cancelled": "p",
    "session.waiting": "q",
}
_TYPE_NAMES = {code: name for name, code in _TYPE_CODES.items()}


def stored_type(name: str) -> str:
    """How an event type is kept in a row: its one-letter code, or the name itself."""
    return _TYPE_CODES.get(name, name)


def type_name(stored: object) -> str:
    """The event type a row keeps (`stored_type` in reverse)."""
    if not isinstance(stored, str):
        raise StoreError(f"a stored event has a type that is not text: {stored!r}")
    if "." in stored:
        return stored
    try:
        return _TYPE_NAMES[stored]
    except KeyError:
        raise StoreError(
            f"a stored event has unknown type code {stored!r} (newer signoff?)"
        ) from None
