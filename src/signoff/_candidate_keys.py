"""The ends of the answers a keyed message gave that a response policy still judges when their
request closes (another answer settled it, a deadline, a cancel): recorded by the commit that
closes it (`Driver.record`), each keeping its message's key if that answer was taken. The
answer's process may have died in the policy, and the fold drops a closed request's candidates:
recorded later, or by no one, the key would be lost, and the message sent again delivered anew."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._answers import repeat
from ._exceptions import AnswerError
from ._idempotency import key_fields, mark_of
from ._recording import EventSpec
from ._state import SessionState
from ._types import InputRequest

__all__ = ["base", "closing_ends", "keyable", "taken"]


def base(request: InputRequest, cid: str, decision: Any, by: Any) -> dict[str, Any]:
    """What every `approval.candidate` event of candidate `cid` (a response to `request`)
    says."""
    return {
        "request_id": request.id,
        "call_id": request.call_id,
        "candidate_id": cid,
        "decision": decision,
        "by": by,
    }


def closing_ends(
    state: SessionState, specs: Sequence[EventSpec], turn_id: str | None
) -> list[EventSpec]:
    """The `stale` ends of the keyed messages' candidates (`message_idem`) pending in `state`
    whose requests `specs`, a commit on it for turn `turn_id`, close without ending them. One
    whose request was settled with its answer (as a live call finds it: `repeat`) was taken,
    and its end records its key (`idem`, `via`) with that turn, as its call would have: the message
    sent again is a repeat. Another (closed otherwise, or settled with another answer) takes
    no key: its call would have delivered the message anew, and so does the message sent
    again."""
    if not state.candidates:
        return []
    closed = {d.get("request_id"): d for t, d in specs if t == "input.resolved"}
    if not closed:
        return []
    named = {d.get("candidate_id") for t, d in specs if t.startswith("approval.")}
    keys = {d["idem"][0] for _, d in specs if isinstance(d.get("idem"), list)}
    ends: list[EventSpec] = []
    for cid, c in state.candidates.items():
        rid = c.get("request_id")
        sent = mark_of(c, "message_idem")
        live = state.requests.get(rid) if isinstance(rid, str) else None
        if live is None or live.status != "pending" or rid not in closed or cid in named:
            continue
        if sent is None:
            continue  # no key to keep: the fold drops it, as before
        why = f"request {rid} was closed before this response could settle it"
        end = {**base(live.request, cid, c.get("decision"), c.get("by")), "outcome": "stale"}
        end["reason"] = why
        if (
            keyable(state, live.request, sent[0], turn_id)
            and sent[0] not in keys
            and taken(live.request, closed[rid], specs, c)
        ):
            end.update(key_fields(sent))
            keys.add(sent[0])
        ends.append(("approval.candidate", end))
    return ends


def keyable(state: SessionState, request: InputRequest, key: str, turn_id: str | None) -> bool:
    """Whether a commit on `state` for turn `turn_id` may record `key` for a message that
    answered `request`: the key is not recorded yet, and the request's turn is the session's
    and the commit's (a repeat is answered with the turn the key is kept with)."""
    turn = state.turn
    return (
        key not in state.keys
        and turn is not None
        and turn.id == request.turn_id
        and turn_id == request.turn_id
    )


def taken(
    request: InputRequest,
    resolved: dict[str, Any],
    specs: Sequence[EventSpec],
    candidate: dict[str, Any],
) -> bool:
    """Whether `candidate`'s answer was taken by the close of `request` that `resolved` (its
    `input.resolved`, among `specs`) records: settled with the same answer, as a repeat of it
    meets it then (`repeat`)."""
    if request.kind != "tool-approval":
        return False
    settled = next(
        (d for t, d in specs if t == "approval.settled" and d.get("request_id") == request.id),
        {},
    )
    first = {
        "outcome": resolved.get("outcome"),
        "value": settled.get("value"),
        "edited_input": settled.get("edited_input"),
    }
    approve = candidate.get("decision") == "approve"
    wanted = {
        "outcome": "approved" if approve else "cancelled",
        "value": candidate.get("value"),
        "edited_input": candidate.get("edited_input"),
    }
    try:
        repeat(request, str(resolved.get("status") or "settled"), first, wanted)
    except AnswerError:
        return False
    return True
