"""Snapshots checked against the event log: a session loads from its snapshot plus the events
after it, so a snapshot must be the fold of the session's events up to the one it was taken
after, or the runtime acts on a state the log never reached (a tool approved that no one
approved). Only the snapshots of this signoff's fold are compared (`of_this_fold`): the runtime
folds the events instead of using another's, which a fold changed since may rightly differ
from; those events must still fold up to it, or the session cannot be loaded."""

from __future__ import annotations

from collections.abc import Container
from typing import Any

from ._exceptions import StoreBusy, StoreError, StoreGone, StoreUnavailable, UnknownSession
from ._state import SessionState, of_this_fold
from .stores import Store
from .stores._audit import StoredSnapshot

__all__ = ["snapshot_problems"]

PAGE = 256  # events read at once
PAGE_BYTES = 1 << 20  # and at most about this much of them
_NOT_THE_DATA = (StoreUnavailable, StoreBusy, StoreGone)


async def snapshot_problems(
    store: Store,
    snapshots: dict[str, StoredSnapshot],
    placed: dict[str, tuple[int, int]],
    broken: Container[str],
) -> list[tuple[int, str, int, str]]:
    """Each snapshot that is not the fold of its session's events, as `AuditProblem` fields
    `(id, stream, n, reason)`: named by the session's last entry at or before the snapshot's
    event (`placed`: its id and `n`; 0 and 0 if none). Sessions named already (`broken`) are
    left out: their logs no longer say what was recorded. A snapshot of another fold than this
    signoff's (an older signoff's), which no session loads from, is not compared with the fold,
    but named if the events it was taken after do not fold up to it: the runtime folds them
    instead, and could not load the session."""
    problems: list[tuple[int, str, int, str]] = []
    for sid, snapshot in snapshots.items():
        if sid in broken:
            continue
        reason = await _differs(store, sid, snapshot)
        if reason is not None:
            entry_id, n = placed.get(sid, (0, 0))
            problems.append((entry_id, sid, n, reason))
    return problems


async def _differs(store: Store, session_id: str, snapshot: StoredSnapshot) -> str | None:
    """How `snapshot` differs from the fold of the session's events up to its `seq`, if it
    does: the fields that differ, as the runtime would read them; only whether the events fold
    up to it, for a snapshot of another fold (not read: the runtime reads its events instead)."""
    what = "the snapshot" if snapshot.seq < 0 else f"the snapshot at event {snapshot.seq}"
    if snapshot.damage is not None:
        return f"{what} cannot be read: {snapshot.damage}"
    kept = None
    try:
        if not isinstance(snapshot.data, dict):
            raise StoreError(f"it is no object but {type(snapshot.data).__name__}")
        if of_this_fold(snapshot.data):
            kept = _form(SessionState.from_snapshot(snapshot.data))
    except StoreError as exc:  # its version a newer signoff's too (`SchemaVersionError`)
        return f"{what} cannot be read: {exc}"
    try:
        folded = await _fold(store, session_id, snapshot.seq)
        if folded.seq != snapshot.seq:
            return f"{what} is past the end of the event log, at event {folded.seq}"
        fields = [] if kept is None else _fields(kept, _form(folded))
    except UnknownSession:
        return f"{what} has no session"  # deleted meanwhile (then not named) or by hand
    except _NOT_THE_DATA:
        raise  # the store failed, not what it holds: verification fails as its other reads do
    except StoreError as exc:
        return f"{what} cannot be checked: its events do not fold: {exc}"
    return f"{what} differs from the event log: {', '.join(fields)}" if fields else None


async def _fold(store: Store, session_id: str, upto: int) -> SessionState:
    """The session's state folded from its events up to event `upto`, a page at a time, as
    the runtime folds them, the conversation left out (a snapshot holds none)."""
    state = SessionState(id=session_id, conversation=None)
    while state.seq < upto:
        before = state.seq
        events = await store.read_events(
            session_id, after=state.seq, limit=PAGE, max_bytes=PAGE_BYTES
        )
        for event in events:
            if event.seq > upto:
                break
            state.apply(event)
        if state.seq == before:  # none left, or the next is past `upto` (the one there deleted):
            break  # read again, the same page came back for ever
    return state


def _form(state: SessionState) -> dict[str, Any]:
    """The snapshot form of `state` with each call's journal, read through `from_snapshot` so
    the fold's and the stored snapshot's are alike in form (lists, defaults)."""
    return SessionState.from_snapshot(state.to_snapshot(journals=True)).to_snapshot(journals=True)


def _fields(kept: dict[str, Any], folded: dict[str, Any]) -> list[str]:
    """The fields of the stored snapshot (read as `kept`) that differ from the fold's (a turn's
    and its calls' by name). A snapshot of this fold holds every field its state does (but a
    call's journal, `_calls`): one missing, read as its default, is named if the fold differs."""
    turn, theirs = kept.get("turn"), folded.get("turn")
    if not (isinstance(turn, dict) and isinstance(theirs, dict)):
        return _unlike(kept, folded)  # a turn on one side only: named as "turn"
    return [
        *_unlike(kept, folded, skip="turn"),
        *_unlike(turn, theirs, "turn.", skip="calls"),
        *_calls(turn["calls"], theirs["calls"]),
    ]


def _calls(kept: list[Any], folded: list[Any]) -> list[str]:
    """The fields of the turn's calls that differ, by name. A call the snapshot keeps without
    its journal has it read back from its events when its body runs (`load_journal` checks it
    there): its journal is not compared."""
    if [c["id"] for c in kept] != [c["id"] for c in folded]:
        return ["turn.calls"]
    fields: set[str] = set()
    for mine, theirs in zip(kept, folded, strict=True):
        if "journal" not in mine:
            theirs = {k: v for k, v in theirs.items() if k != "journal"}
        fields.update(_unlike(mine, theirs, "turn.calls."))
    return sorted(fields)


def _unlike(
    kept: dict[str, Any], folded: dict[str, Any], prefix: str = "", skip: str = ""
) -> list[str]:
    """The keys (but `skip`) whose values in `kept` and `folded` differ, after `prefix`."""
    return [
        prefix + key
        for key in sorted(kept.keys() | folded.keys())
        if key != skip and kept.get(key) != folded.get(key)
    ]
