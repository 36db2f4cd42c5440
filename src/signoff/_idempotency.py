"""Idempotency keys of the calls that start a conversation or send a message: a caller that got
no answer sends the same call again with the same key, and it acts once.

A key is scoped to the principal that gives it (two people's keys never collide). What is
recorded is a digest of the scoped key and one of what it asked for (the agent and prompt, or
the message), in the data of the event that recorded the message (`idem`), in the same commit;
the session state keeps the last `KEPT` of them, with the turn the message went to, so a repeat
is recognised, and answered with that turn, without reading the log. A new session's id derives
from the scoped key, so a repeat finds it instead of making another.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any, NamedTuple, TypeVar

from ._exceptions import IdempotencyKeyReused, UsageError
from ._types import Principal

__all__ = [
    "KEPT",
    "KEYED_TYPES",
    "MAX_KEY",
    "Before",
    "Keyed",
    "Via",
    "before",
    "caller_parts",
    "check_key",
    "free_for",
    "held",
    "key_fields",
    "key_reused",
    "keyed",
    "mark_of",
    "queued_before",
    "records",
    "same_ask",
    "seen",
    "sent_here",
    "session_for",
    "taken_by_another",
    "through",
    "turn_of",
]

_T = TypeVar("_T", bound=str)

KEPT = 32
"""Keys a session state remembers (the newest ones): a repeat of an older one is not known."""

KEYED_TYPES = (
    "session.created",
    "turn.started",
    "turn.message",
    "turn.waiting",
    "approval.candidate",
    "approval.settled",
    "input.resolved",
    "input.repeated",
)
"""The event types that record a key (`_event_handlers._keyed`)."""

MAX_KEY = 200
"""The longest key taken, in characters."""

Keyed = tuple[str, str]
"""A scoped key's digest and the digest of what the call asked for (`_asked`), as recorded
(`idem`)."""

# What the session state keeps per key digest (`SessionState.keys`):
#   [asked, None]                only the session is created, no message recorded yet; or a
#                                message's answer to a mirror holds the key while the subagent's
#                                session settles it (`input.repeated`'s `held_idem`: `_key_holds`;
#                                in a subagent's session with `hops` after it, as below);
#   [asked, turn_id, first_seq]  the turn the message started, steered or answered in, or that
#                                took it from the queue, and the seq of that turn's first event;
#   [asked, "", None]            the message waits in the queue for a turn to take it;
#   [asked, turn_id or ""]       a message recorded before signoff kept where it went;
#   [asked, turn_id, first_seq or None, hops]
#                                in a subagent's session, a message sent to a session `hops`
#                                mirrors above it, whose answer went through them (`Via`), or
#                                to this session itself (0: `sent_here`); a key without `hops`
#                                there was recorded by a signoff before fold 9, which could
#                                not tell the two apart.


class Via(tuple[str, str]):
    """A message's key (`Keyed`) as a subagent's session records the answer the message gave
    to a session `hops` mirrors above it (`via` beside `idem`): the commit closing a mirror keeps
    the keys of the messages sent through it (`_mirror_keys`), not of those sent to the
    subagent's session itself, which are another call there."""

    hops: int

    def __new__(cls, mark: Keyed, hops: int) -> Via:
        made = super().__new__(cls, mark)
        made.hops = hops
        return made


def through(mark: Keyed | None) -> Keyed | None:
    """`mark`, of a message whose answer to a mirror is settled in the subagent's session, as
    that session records it: one mirror further (`Via`)."""
    if mark is None:
        return None
    return Via(mark, (mark.hops if isinstance(mark, Via) else 0) + 1)


def key_fields(mark: Keyed, name: str = "idem") -> dict[str, Any]:
    """The fields an event records `mark` with: `name` (`idem`, or a pending candidate's
    `message_idem`) and, for a key given through mirrors (`Via`), `via` (`message_via`)."""
    hops = {name.replace("idem", "via"): mark.hops} if isinstance(mark, Via) else {}
    return {name: list(mark), **hops}


def mark_of(data: dict[str, Any], name: str = "idem") -> Keyed | None:
    """The key an event's `data` recorded with `key_fields`; None without one."""
    sent = data.get(name)
    if not (isinstance(sent, list) and len(sent) == 2):
        return None
    mark = (str(sent[0]), str(sent[1]))
    hops = data.get(name.replace("idem", "via"))
    return Via(mark, hops) if type(hops) is int and hops > 0 else mark


def sent_here(specs: Sequence[tuple[_T, dict[str, Any]]]) -> list[tuple[_T, dict[str, Any]]]:
    """`specs`, a commit on a subagent's session, with each key recorded with no `via` (nor a
    pending candidate's `message_via`) marked as given by a message sent to this session itself
    (0): its parent's calls tell it from a vote through their mirror (`_mirror_keys`)."""
    out = []
    for type_, data in specs:
        for name, via in (
            ("idem", "via"),
            ("message_idem", "message_via"),
            ("held_idem", "held_via"),
        ):
            if isinstance(data.get(name), list) and via not in data:
                data = {**data, via: 0}
        out.append((type_, data))
    return out


def check_key(key: object) -> str:
    """`key`, if it is printable ASCII text of 1 to `MAX_KEY` characters with no space at either
    end (HTTP strips those from a header, so over HTTP ` k` would be the key `k`); else a
    `UsageError`."""
    if not isinstance(key, str):
        raise UsageError(f"idempotency_key must be a string, not {type(key).__name__}")
    if (
        not 0 < len(key) <= MAX_KEY
        or not key.isascii()
        or not key.isprintable()
        or key != key.strip(" ")
    ):
        raise UsageError(
            f"idempotency_key must be 1 to {MAX_KEY} printable ASCII characters with no space "
            f"at either end, not {key!r:.240}"
        )
    return key


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).hexdigest()[:32]


def keyed(key: str | None, principal: Principal | None, *asked: str) -> Keyed | None:
    """The record of `key` given by `principal` for a call that asked `asked`; None without a
    key (checked here)."""
    if key is None:
        return None
    check_key(key)
    return _digest("signoff-key", *caller_parts(principal), key), _asked(asked)


def _asked(asked: tuple[str, ...]) -> str:
    """The digest of what a call asked: its parts joined with NUL, as every ask was digested
    before (a key recorded then still replays). A part holding a NUL (a message may) made that
    ambiguous: "stop\0queue" sent as a `steer` and "stop" sent as `queue` digested alike. Such
    an ask's digest is its parts' JSON form's instead, after its joined one and a dot, which
    `same_ask` still takes for a key recorded before; without them where the joined one is also
    an ask's without a NUL (a `steer` message ending in NUL and "queue" reads as a `queue` one,
    `Messages.send` appending the policy), which is recorded so still and must not match."""
    joined = _digest("signoff-asked", *asked)
    if not any("\0" in part for part in asked):
        return joined
    exact = _digest("signoff-asked-exact", json.dumps(asked, ensure_ascii=False))
    parts = "\0".join(asked).split("\0")
    if len(parts) == 3 and parts[0] == "message" and parts[2] == "queue":
        return exact
    return f"{joined}.{exact}"


def same_ask(recorded: object, idem: Keyed) -> bool:
    """Whether `recorded`, the digest a key was recorded with, is of what the call `idem` asked:
    its own, or the joined form signoff recorded an ask holding a NUL with before (`_asked`),
    so a repeat of a call made then replays; another ask that form matched then, it matches
    still, and no other."""
    before, dot, _ = idem[1].partition(".")
    return recorded == idem[1] or (bool(dot) and recorded == before)


def records(data: object, idem: Keyed) -> bool:
    """Whether an event's `idem` (`data`) recorded the key of `idem` for what it asked."""
    return (
        isinstance(data, list) and len(data) == 2 and data[0] == idem[0] and same_ask(data[1], idem)
    )


def caller_parts(principal: Principal | None) -> tuple[str, ...]:
    """Who gave a key, as its scope: the principal's full identity (`Principal.same_as`). An
    issuer of "" was taken for none, and a NUL in a field could join two fields as another
    pair's: such a principal (rare) is its JSON form instead, so two people never share one
    (its keys recorded before are found by `before`)."""
    fields = _fields(principal)
    if principal is not None and (principal.issuer == "" or any("\0" in f for f in fields)):
        exact = [principal.authenticator, principal.issuer, *fields[2:]]
        return ("exact", json.dumps(exact, ensure_ascii=False))
    return fields  # as keys were scoped before: a key given then still replays


def _fields(principal: Principal | None) -> tuple[str, ...]:
    """The scope of a key given by `principal` before `caller_parts` told an issuer of "" from
    none: its fields, an issuer of None as ""."""
    if principal is None:
        return ()
    return (
        principal.authenticator,
        principal.issuer or "",
        principal.principal_type,
        principal.principal_id,
    )


class Before(NamedTuple):
    """How an older signoff recorded a call's key where it differs from `keyed`'s record:
    `scope`, the key's digest before `caller_parts` scoped the principal exactly; `ask`, a
    `queue` message's ask before the policy was part of it (the message's alone, as a `steer`
    one's still is). Either None where it is as now. Taken only on evidence in the session
    that the call recorded it so (`_key_forms`): the same digests are another's call now."""

    scope: str | None
    ask: str | None


def before(key: str | None, principal: Principal | None, *asked: str) -> Before | None:
    """The forms (`Before`) an older signoff recorded `key` given by `principal` for a call
    that asked `asked` in, where they differ from `keyed`'s; None without a key or a change."""
    if key is None:
        return None
    fields = _fields(principal)
    scope = None if caller_parts(principal) == fields else _digest("signoff-key", *fields, key)
    queued = len(asked) == 3 and asked[0] == "message" and asked[2] == "queue"
    ask = queued_before(asked[1]) if queued else None
    return None if scope is None and ask is None else Before(scope, ask)


def queued_before(message: str) -> str:
    """What a `queue` message asked, as an older signoff digested it (`Before.ask`)."""
    return _digest("signoff-asked", "message", message)


def session_for(idem: Keyed) -> str:
    """The id of the session a call with this key starts (the format of `new_id("ses")`)."""
    return "ses_" + _digest("signoff-session", idem[0])[:20]


def seen(
    keys: dict[str, Any],
    idem: Keyed | None,
    session_id: str,
    candidates: dict[str, dict[str, Any]] | None = None,
) -> bool:
    """Whether the key of `idem` recorded a message in the session already (a repeat); raises
    `IdempotencyKeyReused` if it was recorded for something else, or if one of `candidates`
    (the session's, given) holds it aside for another message (`held`)."""
    if idem is None:
        return False
    if candidates:
        held(candidates, idem, session_id)
    known = keys.get(idem[0])
    if known is None:
        return False
    if not same_ask(known[0], idem):
        raise key_reused(session_id)
    return known[1] is not None


def held(candidates: dict[str, dict[str, Any]], idem: Keyed | None, session_id: str) -> str | None:
    """The pending candidate (its id) that holds the key of `idem` aside for the message whose
    answer a response policy judges (`message_idem`: the key is recorded only with its end), if
    one does; raises `IdempotencyKeyReused` if that message is another, as `seen` does."""
    if idem is None:
        return None
    for cid, c in candidates.items():
        sent = c.get("message_idem")
        if not (isinstance(sent, list) and len(sent) == 2 and sent[0] == idem[0]):
            continue
        if not same_ask(sent[1], idem):
            raise key_reused(session_id)
        return cid
    return None


def free_for(keys: dict[str, Any], idem: Keyed) -> bool:
    """Whether the key of `idem` is free to record for its message: not recorded, or only held
    for that message while its answer to a mirror is settled below (`[asked, None]`)."""
    known = keys.get(idem[0])
    return known is None or (known[1] is None and same_ask(known[0], idem))


def taken_by_another(keys: dict[str, Any], idem: Keyed) -> bool:
    """Whether the key of `idem` is recorded for another call than `idem`'s: one a process of
    an older signoff let through while `idem`'s answer was judged, which that answer's end must
    not take the key from (that call, which acted, would be refused when repeated)."""
    known = keys.get(idem[0])
    return known is not None and not same_ask(known[0], idem)


def key_reused(session_id: str) -> IdempotencyKeyReused:
    """The error of a key given in session `session_id` for another call than it was for."""
    return IdempotencyKeyReused(
        f"this idempotency key was used in session {session_id!r} for another "
        "agent, prompt, message or turn policy: use a new key for a new call",
        session_id,
    )


def turn_of(keys: dict[str, Any], idem: Keyed) -> tuple[str, int] | None:
    """The turn the message recorded under `idem`'s key went to (its id and the seq of its
    first event); None while the message waits in the queue, or if that was not recorded."""
    known = keys.get(idem[0])
    if known is None or len(known) < 3 or not known[1] or known[2] is None:
        return None
    return str(known[1]), int(known[2])
