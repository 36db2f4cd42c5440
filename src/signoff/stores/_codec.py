"""How the stores keep JSON documents: plain text when short, deflated with a preset dictionary
when that is smaller.

Event data is mostly prose and tool arguments with the same keys in every row, so deflate with a
dictionary of those keys stores it in about 45% of its JSON size for about 12 us per row. A
packed value is bytes starting with a format byte; a plain value is the JSON text itself (or
its UTF-8 bytes, a lone surrogate kept as UTF-8 would encode it), so rows written before packing
existed still read back. An event may also be deflated with the text of the event before it as
its dictionary, so a request that repeats the tool call the model just proposed stores only what
is new; reading it then needs that event (at most `CHAIN_MAX`).

A stored value that cannot be read back is `StoreDamaged`: reading it again gives the same. That
includes a format byte or a type code this signoff does not know, which only a hand edit or a
newer signoff writes (the message says so); a read that failed is the store's own error.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeAlias, TypeVar

from .._events import dumps, loads
from .._exceptions import StoreDamaged

__all__ = [
    "CHAIN_MAX",
    "PerSession",
    "DEFLATE_ON_PREVIOUS",
    "EventTexts",
    "Previous",
    "Stored",
    "Tail",
    "Tails",
    "event_text",
    "needs_previous",
    "pack",
    "pack_bytes",
    "pack_event",
    "parse",
    "stored_type",
    "tail_of",
    "type_name",
    "unpack",
    "unpack_event",
    "unpack_snapshot",
    "unpack_text",
]

Stored: TypeAlias = str | bytes | memoryview
"""A document as a store's driver returns it."""

Previous: TypeAlias = tuple[str, int]
"""What `pack_event` stores an event on: the JSON text of the event before it, and how many
events reading that one needs."""

_DEFLATE_V1 = 1
"""Format byte: raw deflate (4 KB window) with `_DICTIONARY_V1` as its preset dictionary."""

_V1 = bytes((_DEFLATE_V1,))

DEFLATE_ON_PREVIOUS = 2
"""Format byte: raw deflate (32 KB window) whose preset dictionary is `_DICTIONARY_V1` followed
by the JSON text of the event just before this one in its session."""

CHAIN_MAX = 2
"""Reading a stored event needs at most this many events before it: an event is stored on the
one before it only when that one needs fewer."""

_PREVIOUS_MAX = 16_384
"""A longer previous event is not offered as a dictionary: deflate's window could not keep both
it and `_DICTIONARY_V1`, and setting the dictionary would cost more than it saves."""

_PREVIOUS_MIN_SAVING = 48
"""An event is stored on the one before it only when that saves this much: a small saving would
make its reads depend on another row, and could take that row's place as the dictionary of the
next event, which may repeat much more of it (a request repeats the model's tool call)."""

_PROBE, _PROBES = 32, 8
"""`_repeats` looks for up to `_PROBES` + 1 slices of `_PROBE` characters."""

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


def _json(value: Any) -> tuple[str, bytes, str | bytes]:
    """The JSON text of `value`, its bytes, and its plain stored form (the text, or the bytes
    when the text holds a lone surrogate, which a text column cannot take)."""
    text = dumps(value)
    try:
        raw = text.encode()
        return text, raw, text
    except UnicodeEncodeError:
        # A lone surrogate (a tool or model can produce one) is kept as itself: as JSON's \u
        # escapes, a high one followed by a low one would read back as the one character they
        # encode together, changing the text and so failing its audit hash.
        raw = text.encode("utf-8", "surrogatepass")
        return text, raw, raw


def _deflate(raw: bytes, wbits: int, dictionary: bytes) -> bytes:
    deflater = zlib.compressobj(6, zlib.DEFLATED, wbits, 4, zlib.Z_DEFAULT_STRATEGY, dictionary)
    return deflater.compress(raw) + deflater.flush()


def _packed(raw: bytes, plain: str | bytes) -> str | bytes:
    if len(raw) < _MIN_SIZE:
        return plain
    packed = _deflate(raw, -12, _DICTIONARY_V1)
    if len(packed) + 1 >= len(raw):
        return plain
    return bytes((_DEFLATE_V1,)) + packed


def pack(value: Any) -> str | bytes:
    """`value` as stored: its JSON text, or the deflated form when that is smaller."""
    _, raw, plain = _json(value)
    return _packed(raw, plain)


def pack_event(value: Any, previous: Previous | None) -> tuple[str | bytes, Previous | None]:
    """An event's data as stored, deflated on the text of the event before it when that is
    worth it. `previous` is that event's JSON text and how many events its own reading needs;
    the same pair for this event is returned, to give the event after it (None when its text
    is too long to be a dictionary, so stores never keep such a text at hand)."""
    text, raw, plain = _json(value)
    stored = _packed(raw, plain)
    after: Previous | None = (text, 0) if len(text) <= _PREVIOUS_MAX else None
    if (
        previous is None
        or previous[1] >= CHAIN_MAX
        or len(stored) <= _PREVIOUS_MIN_SAVING  # could not save enough
        or len(previous[0]) > _PREVIOUS_MAX
        or not _repeats(previous[0], text)
    ):
        return stored, after
    on_previous = _deflate(raw, -15, _DICTIONARY_V1 + _utf8(previous[0]))
    if len(on_previous) + 1 + _PREVIOUS_MIN_SAVING <= len(stored):
        return bytes((DEFLATE_ON_PREVIOUS,)) + on_previous, after and (text, previous[1] + 1)
    return stored, after


def _utf8(text: str) -> bytes:
    """`text` as UTF-8, a lone surrogate as the bytes UTF-8 would give it (see `_json`)."""
    return text.encode("utf-8", "surrogatepass")


def _repeats(previous: str, text: str) -> bool:
    """Whether `text` looks like it repeats a long run of `previous`: one of a few slices of it
    is found there. A cheap test, so that most events are deflated once, not twice."""
    last = len(text) - _PROBE
    step = max(_PROBE, last // _PROBES)
    return any(text[i : i + _PROBE] in previous for i in range(0, last + 1, step))


def pack_bytes(value: Any) -> bytes:
    """`pack` for a binary column (PostgreSQL `bytea`): plain JSON as its UTF-8 bytes, which
    never start with a format byte (those are control characters)."""
    packed = pack(value)
    return packed.encode() if isinstance(packed, str) else packed


Tail: TypeAlias = tuple[Previous, tuple[str | bytes, ...]]
"""What a session's head event, as a store wrote it, gives the next event to be stored on, with
the stored data of each row its text is read from, the head's first: the store checks they are
still there before storing an event on it, since a crash or a restore may have lost that event
and let another process write other data at its seq."""


def tail_of(
    on: Previous | None, stored: Sequence[str | bytes], previous: Tail | None
) -> Tail | None:
    """The `Tail` of the last of a run of events stored in order (`stored`, stored on
    `previous`): what `pack_event` gave after it (`on`), with its row's data and that of the
    rows it is stored on. None when the next event may not be stored on it."""
    if on is None or on[1] >= CHAIN_MAX:
        return None
    read = on[1] + 1
    mine = tuple(reversed(stored[-read:]))
    return on, mine + (() if previous is None else previous[1])[: read - len(mine)]


def needs_previous(stored: Stored | None) -> bool:
    """Whether a stored event can only be read with the text of the event before it."""
    if not isinstance(stored, bytes | memoryview) or not stored:
        return False  # text, None, or a value a hand edit left (`unpack_text` names it)
    return stored[0] == DEFLATE_ON_PREVIOUS


def unpack_text(stored: str | bytes | memoryview, previous: str | None = None) -> str:
    """The JSON text of a stored value, inflating it if it was packed; `previous` is the text of
    the event before it, needed only by an event stored on it."""
    if isinstance(stored, str):
        return stored
    if not isinstance(stored, bytes):
        if not isinstance(stored, memoryview):  # SQLite keeps what a hand edit put there
            raise StoreDamaged(f"a stored document is neither text nor bytes: {stored!r:.40}")
        stored = bytes(stored)
    if not stored:
        raise StoreDamaged("a stored document is empty")
    form = stored[0]
    if form >= 0x20 or form in b"\t\n\r":  # plain JSON text
        try:
            return stored.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError as exc:
            raise StoreDamaged(f"a stored document is not UTF-8: {exc}") from exc
    if form == _DEFLATE_V1:
        wbits, dictionary = -12, _DICTIONARY_V1
    elif form == DEFLATE_ON_PREVIOUS:
        if previous is None:
            raise StoreDamaged("a stored event is kept on the event before it, which is missing")
        wbits, dictionary = -15, _DICTIONARY_V1 + _utf8(previous)
    else:
        raise StoreDamaged(f"a stored document has unknown format {form} (newer signoff?)")
    return _inflated(stored, wbits, dictionary)


def _inflated(stored: bytes, wbits: int, dictionary: bytes) -> str:
    """The text of a deflated document (`stored` past its format byte)."""
    try:
        inflater = zlib.decompressobj(wbits, dictionary)
        # All of a whole stream comes out of `decompress` (no `max_length`): one that has not
        # ended there is truncated, and `flush` would add nothing to one that has.
        text = inflater.decompress(memoryview(stored)[1:])
        if not inflater.eof or inflater.unused_data:
            raise StoreDamaged("a stored document is corrupt: truncated or followed by garbage")
        return text.decode("utf-8", "surrogatepass")
    except (zlib.error, UnicodeDecodeError) as exc:
        raise StoreDamaged(f"a stored document is corrupt: {exc}") from exc


def parse(text: str) -> Any:
    """The value of a stored document's JSON text."""
    try:
        return loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
        raise StoreDamaged(f"a stored document is not JSON: {exc}") from exc


def unpack(stored: str | bytes | memoryview) -> Any:
    """The value of a stored document (an event stored on another needs `unpack_event`)."""
    return parse(unpack_text(stored))


def unpack_snapshot(stored: str | bytes | memoryview, session_id: str, seq: int) -> Any:
    """The value of a session's stored snapshot (as of event `seq`); one that cannot be read is
    `StoreDamaged` naming the session, as a damaged event is, so the damage can be found."""
    try:
        return unpack(stored)
    except StoreDamaged as exc:
        raise StoreDamaged(f"session {session_id!r}, its snapshot at event {seq}: {exc}") from exc


def event_text(stored: str | bytes | memoryview, earlier: Sequence[Stored | None]) -> str:
    """The JSON text of a stored event, given the stored forms of the events just before it,
    nearest first (None for one not at hand); only as many are read as it needs."""
    if not needs_previous(stored):
        return unpack_text(stored)
    chain = [stored]
    for before in earlier[:CHAIN_MAX]:
        if before is None:
            break
        chain.append(before)
        if not needs_previous(before):
            break
    if needs_previous(chain[-1]):
        raise StoreDamaged(
            "a stored event is kept on the events before it, which are missing "
            f"or need more than {CHAIN_MAX} others"
        )
    text = unpack_text(chain[-1])
    for link in reversed(chain[:-1]):
        text = unpack_text(link, text)
    return text


def unpack_event(stored: str | bytes | memoryview, *earlier: Stored | None) -> Any:
    """The value of a stored event (`earlier` as for `event_text`)."""
    return parse(event_text(stored, earlier))


V = TypeVar("V")


class PerSession(dict[str, V]):
    """What a store remembers of each session it touched to save a round trip (its row key, its
    last-seen state): past `keep` sessions it forgets them all and reads again what it needs, so a
    process serving for weeks does not grow with every session."""

    keep = 100_000

    def __setitem__(self, session_id: str, value: V) -> None:
        if session_id not in self and len(self) >= self.keep:
            self.clear()
        super().__setitem__(session_id, value)


class Tails(Generic[V]):
    """What the last event a store wrote to each of its recent sessions can give the next one
    to be stored on (`Previous | None`, or what else a store keeps of that event), keyed by
    session; valid only while that event is the session's head and the store holds it as
    written (a crash or a restore may lose it and let the seq be written again)."""

    def __init__(self, keep: int = 1024) -> None:
        self._keep = keep
        self._tails: dict[Any, tuple[int, V]] = {}

    def get(self, key: Any, head: int) -> V | None:
        known = self._tails.get(key)
        return known[1] if known is not None and known[0] == head else None

    def knows(self, key: Any, head: int) -> bool:
        known = self._tails.get(key)
        return known is not None and known[0] == head

    def forget(self, key: Any, past: int = -1) -> None:
        """Forget the event kept for `key` if its seq is past `past` (whatever it is, by
        default): a head read below it means the store lost it."""
        known = self._tails.get(key)
        if known is not None and known[0] > past:
            del self._tails[key]

    def put(self, key: Any, seq: int, previous: V) -> None:
        """Remember that event `seq`, now the head, gives `previous` (None: nothing)."""
        self._tails.pop(key, None)
        if len(self._tails) >= self._keep:
            del self._tails[next(iter(self._tails))]
        self._tails[key] = (seq, previous)


class EventTexts:
    """Reads a run of one session's stored events in seq order: an event kept on the one before
    it inflates with the text just read, and `fetch(seq)` (the stored events before `seq`,
    nearest first) is asked only when the run does not start with what it needs."""

    def __init__(self, fetch: Callable[[int], Sequence[Stored | None]]) -> None:
        self._fetch = fetch
        self._last: tuple[int, str] | None = None

    def text(self, seq: int, stored: Stored) -> str:
        if stored.__class__ is bytes and stored[:1] == _V1:  # the most of them: unpack_text's way
            text = _inflated(stored, -12, _DICTIONARY_V1)
        elif stored.__class__ is str or not needs_previous(stored):
            text = unpack_text(stored)
        elif self._last is not None and self._last[0] == seq - 1:
            text = unpack_text(stored, self._last[1])
        else:
            text = event_text(stored, self._fetch(seq))
        self._last = (seq, text)
        return text

    def value(self, seq: int, stored: Stored) -> Any:
        return parse(self.text(seq, stored))


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
    "subagent.spent": "r",
    "model.paused": "s",
    "model.spent": "u",
    "input.repeated": "v",
}
_TYPE_NAMES = {code: name for name, code in _TYPE_CODES.items()}


def stored_type(name: str) -> str:
    """How an event type is kept in a row: its one-letter code, or the name itself."""
    return _TYPE_CODES.get(name, name)


def type_name(stored: object) -> str:
    """The event type a row keeps (`stored_type` in reverse)."""
    if not isinstance(stored, str):
        raise StoreDamaged(f"a stored event has a type that is not text: {stored!r}")
    if "." in stored:
        return stored
    try:
        return _TYPE_NAMES[stored]
    except KeyError:
        raise StoreDamaged(
            f"a stored event has unknown type code {stored!r} (newer signoff?)"
        ) from None
