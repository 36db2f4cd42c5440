"""How each event type changes a `SessionState`: one handler per type, looked up in `HANDLERS`
by `SessionState.apply`. Apart from `_state`, which keeps the state itself, its snapshot form
and the fold."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._events import EXPIRED, Event
from ._exceptions import StoreError
from ._idempotency import KEPT, free_for
from ._journal_fold import asked, stepped
from ._snapshot_fields import budgets_of, error_of, text_of, ttl_of
from ._state_parts import (
    CallState,
    RequestState,
    TurnState,
    candidate_applied,
    kept_usage,
    load_principal,
    settled_applied,
)
from ._types import InputRequest

if TYPE_CHECKING:
    from ._state import SessionState

__all__ = ["HANDLERS"]


# -- one handler per event type ----------------------------------------------------------------


def _session_created(s: SessionState, e: Event) -> None:
    d = e.data
    # Checked as a snapshot's are (`_snapshot_fields`): a null or a text a hand edit left here
    # was kept, and a later read failed on it with a bare TypeError or ValidationError.
    s.agent = text_of(d["agent"], "agent")
    s.created_at = e.at
    s.ttl = ttl_of(d.get("ttl"))
    s.initiator = load_principal(d.get("initiator"))
    parent = d.get("parent")
    s.parent = None if parent is None else text_of(parent, "parent")
    s.headroom = budgets_of(d.get("headroom"), "headroom")
    s.parent_spent = budgets_of(d.get("parent_spent"), "parent_spent")
    _keyed(s, e, [None])


def _keyed(s: SessionState, e: Event, went: list[Any], name: str = "idem") -> None:
    """Remember the idempotency key the event recorded a message (or a session) under (its
    field `name`, its `via` beside it), and where the message went (`went`, in the forms
    `_idempotency` lists)."""
    idem = e.data.get(name)
    if idem is None:
        return
    key, asked = idem
    s.keys.pop(key, None)  # to the end: the newest are kept
    s.keys[key] = _entry(asked, went, e.data.get(name.replace("idem", "via")))
    while len(s.keys) > KEPT:
        del s.keys[next(iter(s.keys))]


def _entry(asked: str, went: list[Any], hops: object) -> list[Any]:
    """A key's entry in `SessionState.keys`: with `hops`, in a subagent's session, the mirrors
    above it the message was sent through (`Via`; 0: sent to this session itself)."""
    entry = [asked, *went]
    if type(hops) is int and hops >= 0:
        entry = [*entry, *[None] * (3 - len(entry)), hops]
    return entry


def _keep_before(s: SessionState, idem: list[Any], went: list[Any], turn_id: str | None) -> None:
    """Remember a key a mirror's close kept (`kept`) as older than every key recorded in its
    turn or waiting in the queue: it pushes none of those out, so neither one recorded since
    its vote nor its own record here, pushed out before, which would come back as the newest.
    Its `via` (none: 0) is the mirrors above this session the message was sent through. It
    takes the place of a hold of the key for its message (`held_idem`), recorded before."""
    key, asked, *via = idem
    s.keys.pop(key, None)
    entries = list(s.keys.items())
    at = next((i for i, (_, k) in enumerate(entries) if k[1:2] in ([turn_id], [""])), None)
    entry = _entry(asked, went, via[0] if via else 0)
    entries.insert(len(entries) if at is None else at, (key, entry))
    s.keys.clear()
    s.keys.update(entries[-KEPT:])


def _in_turn(s: SessionState, e: Event) -> list[Any]:
    """Where a message recorded in the open turn went: that turn and its first event."""
    if s.turn is not None and s.turn.id == e.turn_id:
        return [e.turn_id, s.turn.first_seq]
    return [e.turn_id or ""]


def _turn_started(s: SessionState, e: Event) -> None:
    if e.turn_id is None:
        raise StoreError(f"event {e.id} (turn.started) has no turn id")
    ended = s.turn
    if ended is not None and (
        ended.status in ("running", "waiting") or (ended.status == "failed" and ended.retryable)
    ):
        _owe(s, ended)  # replaced while it could still take its calls' results
    taken = None
    if e.data.get("dequeued"):
        taken = s.queued[0].get("idem") if s.queued else None
        s.queued = s.queued[1:]
    s.turn = TurnState(
        id=e.turn_id,
        principal=load_principal(e.data.get("principal")),
        started_at=e.at,
        first_seq=e.seq,
        source=e.data.get("source", "message"),
    )
    _keyed(s, e, [e.turn_id, e.seq])
    known = None if taken is None else s.keys.get(taken)
    if taken is not None and known is not None and known[1:3] == ["", None]:
        # its queued message's turn, at last
        s.keys[taken] = [known[0], e.turn_id, e.seq, *known[3:]]
    # Requests of earlier turns are all closed by now; keep the state small.
    kept = {k: r for k, r in s.requests.items() if r.status == "pending"}
    s.earlier_requests = s.earlier_requests or len(kept) < len(s.requests)
    s.requests = kept
    if s.conversation is not None:
        s.conversation.add(e)


def _model_completed(s: SessionState, e: Event) -> None:
    turn = _turn(s, e)
    s.model_responses += 1
    usage = kept_usage(e.data.get("usage", {}), strict=False)
    s.usage = s.usage + usage
    # What the next call reads again: less than the reply's input when the provider billed
    # input the conversation does not keep (`ModelResponse.context_tokens`).
    kept = e.data.get("context_tokens")
    if kept is not None and (isinstance(kept, bool) or not isinstance(kept, int) or kept < 0):
        raise ValueError(f"context_tokens is not a count of tokens: {kept!r}")  # would give back
    s.last_input_tokens = usage.input_tokens if kept is None else kept
    turn.steps += 1
    turn.model_seq = e.seq
    read = e.data.get("read_through")  # a message came while it answered, which it did not read
    turn.read_seq = min(read, e.seq) if isinstance(read, int) else e.seq
    turn.answered = []  # a new reply: every answer of the turn was gone on with
    turn.status = "running"
    turn.retryable = False
    turn.error = None
    text = e.data.get("text", "")
    if text:
        turn.text = text if not turn.text else f"{turn.text}\n\n{text}"
    cut = e.data.get("cut_off")
    turn.cut_off = cut if isinstance(cut, str) else None
    turn.calls = {
        text_of(c["id"], "call id"): CallState(
            id=c["id"], tool_name=text_of(c["name"], "tool name"), input=c.get("input"), since=e.seq
        )
        for c in e.data.get("tool_calls", [])
    }
    if turn.paused:
        turn.paused = ()  # the reply they were parts of is made
    turn.share_spent = None  # its step went past it
    if s.conversation is not None:
        s.conversation.add(e)


def _model_paused(s: SessionState, e: Event) -> None:
    """A part of the reply being made, which the provider paused: billed, so counted now, and
    kept for a resumed drive to continue from. Not a message: the reply is its `model.completed`."""
    turn = _turn(s, e)
    s.usage = s.usage + kept_usage(e.data["usage"], strict=False)
    turn.paused = (*turn.paused, e.data)
    turn.answered = []  # the model is called: every answer of the turn was gone on with


def _tool_started(s: SessionState, e: Event) -> None:
    call = _call(s, e)
    call.status = "running"
    _went_on(s, call.id)
    _revive(_turn(s, e))
    call.idempotency_key = e.data.get("idempotency_key")
    _billed(s, e)  # what reviewing the call cost (an auto() policy's model)
    reason = e.data.get("policy_reason")
    if reason is not None:  # so.Approved(reason): a re-run of the body tells the model why too
        call.decision = {"approved": True, "by": "policy", "reason": reason}
    if e.data.get("filled") is not None:  # what a re-run of the body gets again
        call.filled = e.data["filled"]
    if e.data.get("keyed"):  # signoff 0c4a186 marked keyed journals here, not on their entries
        call.keyed = True


def _tool_step(s: SessionState, e: Event) -> None:
    stepped(_call(s, e), e.data)


def _turn_message(s: SessionState, e: Event) -> None:
    d = e.data
    if d.get("queued"):
        _keyed(s, e, ["", None])
        entry = {"message": d["message"], "principal": d.get("principal")}
        if d.get("source"):  # a scheduled prompt queued behind messages stays scheduled
            entry["source"] = d["source"]
        if d.get("idem"):  # so the turn that takes it is kept with its key
            entry["idem"] = d["idem"][0]
        s.queued.append(entry)
        return
    _keyed(s, e, _in_turn(s, e))
    if s.turn is not None and s.turn.id == e.turn_id:
        s.turn.last_message_seq = e.seq
    if s.conversation is not None:
        s.conversation.add(e)


def _tool_completed(s: SessionState, e: Event) -> None:
    call = _call(s, e)
    call.status = "done"
    _went_on(s, call.id)
    _revive(_turn(s, e))
    _billed(s, e)  # a review (an auto() policy's model) of a call that did not run
    if "delegated" in e.data:  # what a delegate call's child spent (`with_spend`)
        s.delegated = s.delegated + kept_usage(e.data["delegated"], strict=False)
    for child, counted in (e.data.get("short") or {}).items():  # the rest counted later
        s.short.setdefault(child, [_turn(s, e).id, counted])
    stopped = e.data.get("share_spent")  # its child stopped on the share: the next step asks
    if isinstance(stopped, str):
        _turn(s, e).share_spent = stopped
    if s.conversation is not None:
        s.conversation.add(e)


def _input_requested(s: SessionState, e: Event) -> None:
    turn = _turn(s, e)
    _billed(s, e)  # what reviewing the calls cost, or the reply a budget cut off
    for raw in e.data["requests"]:
        request = InputRequest.model_validate(raw)
        if request.kind == "session-limit":  # its usage is a reply cut at what was left
            _read_again(s, e)
        s.requests[request.id] = RequestState(request=request, raise_to=e.data.get("raise_to"))
        if request.kind == "session-limit" and request.child is None:
            turn.answered = []  # asked before a model call: every answer was gone on with
        if request.child is not None:  # mirrored from a subagent: its delegate call waits
            if request.child.call_id in turn.calls:
                turn.calls[request.child.call_id].status = "asking"
            continue
        if request.action is None or request.action.call_id not in turn.calls:
            continue
        call = turn.calls[request.action.call_id]
        _went_on(s, call.id)  # asking again: its body ran past what it asked before
        if request.source == "ask":
            asked(call, request, e.data)
            call.status = "asking"
        else:
            call.request_id = request.id
            call.status = "awaiting" if request.source == "tool" else "requested"


def _turn_waiting(s: SessionState, e: Event) -> None:
    turn = _turn(s, e)
    turn.status = "waiting"
    _keyed(s, e, _in_turn(s, e))  # a keyed message's vote counted through a mirror
    # Only a traced drive stores its context; a re-park without one (a rejected answer, an
    # untraced runtime) keeps the last: the drive that resumes links to it (`_tracing`).
    traceparent = e.data.get("traceparent")
    if isinstance(traceparent, str):
        turn.traceparent = traceparent


def _went_on(s: SessionState, call_id: str) -> None:
    """The call moved (started, ended, or asked again): a drive went on with the answers it
    waited on, which leave the turn's `answered`. A park does not: a vote parks it again (a
    quorum's, a keyed message's through a mirror) with answers still to go on with."""
    turn = s.turn
    if turn is None or not turn.answered:
        return
    turn.answered = [
        rid
        for rid in turn.answered
        if (r := s.requests.get(rid)) is None
        or r.request.action is None
        or r.request.action.call_id != call_id
    ]


def _read_again(s: SessionState, e: Event) -> None:
    """A billed reply the turn did not use read the conversation as it stands: the next call
    reads at least that much again, which the budgets hold back before it (`_input_floor`)."""
    if "usage" in e.data:
        kept = e.data.get("context_tokens")  # less than its input, as on `model.completed`
        if not (type(kept) is int and kept >= 0):
            kept = kept_usage(e.data["usage"], strict=False).input_tokens
        s.last_input_tokens = max(s.last_input_tokens, kept)


def _billed(s: SessionState, e: Event) -> None:
    """Count what the event says was spent beside the model's replies (`usage`)."""
    if "usage" in e.data:
        s.usage = s.usage + kept_usage(e.data["usage"], strict=False)


def _drop_candidates(s: SessionState, request_id: str) -> None:
    """A closed request has nothing left to evaluate."""
    for cid in [c for c, d in s.candidates.items() if d.get("request_id") == request_id]:
        del s.candidates[cid]


def _approval_candidate(s: SessionState, e: Event) -> None:
    d = e.data
    _keyed(s, e, _in_turn(s, e))  # a keyed message's vote, counted toward a quorum
    _billed(s, e)  # what reviewing the answer's edit cost (an auto() policy's model)
    cid = d.get("candidate_id")
    if cid is not None:
        if d.get("outcome") == "pending":
            s.candidates[cid] = {**d, "at": e.at}
        else:
            s.candidates.pop(cid, None)
    req = s.requests.get(d["request_id"])
    if req is None or req.status != "pending":
        return
    req.request = candidate_applied(req.request, d)


def _approval_settled(s: SessionState, e: Event) -> None:
    d = e.data
    _keyed(s, e, _in_turn(s, e))
    _billed(s, e)  # what reviewing the answer's edit cost (an auto() policy's model)
    _drop_candidates(s, d["request_id"])
    req = s.requests.get(d["request_id"])
    if req is not None and req.status == "pending":  # a quorum's votes, the last one too
        req.request = settled_applied(req.request, d)
    approve = d["decision"] == "approve"
    if req is not None and req.request.action is not None and approve and _a_persons(d):
        s.approved_tools.add(req.request.action.tool_name)
    if s.turn is None or d.get("call_id") not in s.turn.calls:
        return
    call = s.turn.calls[d["call_id"]]
    decision = {
        "approved": approve,
        "outcome": "approved" if approve else "cancelled",
        "reason": d.get("reason"),
        "by": d.get("by"),
    }
    if d.get("value") is not None:
        decision["value"] = d["value"]
    call.decision = decision
    if d.get("edited_input") is not None:
        call.edited_input = d["edited_input"]
    if call.status == "awaiting":
        call.status = "decided"
    elif call.status == "requested":
        call.status = "approved" if approve else "denied"


def _a_persons(d: dict[str, Any]) -> bool:
    """Whether an approval is a person's, which `once()` remembers: not a deadline's
    (`on_timeout="approve"`, by no one) nor the app's (`so.APP_PRINCIPAL`, a `runtime`)."""
    by = d.get("by")
    return not d.get("auto") and not (
        isinstance(by, dict) and by.get("principal_type") == "runtime"
    )


def _input_resolved(s: SessionState, e: Event) -> None:
    d = e.data
    _keyed(s, e, _in_turn(s, e))
    for idem in (d.get("kept") or [])[-KEPT:]:  # a mirror's: its subagent's session's keys
        if free_for(s.keys, (idem[0], idem[1])):  # or held here for that message
            _keep_before(s, idem, _in_turn(s, e), e.turn_id)
    _drop_candidates(s, d["request_id"])
    req = s.requests.get(d["request_id"])
    if req is None:
        return
    outcome = d["outcome"]
    req.status = d.get("status") or "settled"
    mine = req.request.child is None  # a subagent's budget or expiry is not this session's
    if mine and req.request.kind == "session-limit" and outcome == "answered":
        if (d.get("answer") or {}).get("option_id") == "continue":
            if req.raise_to is None:  # an older signoff's: a size more
                s.limit_grants += 1
            for k, v in (req.raise_to or {}).items():  # at least what it said it raises them to
                s.raised[k] = max(s.raised.get(k, 0), v)
        if s.turn is not None and req.request.turn_id == s.turn.id:
            s.turn.share_spent = None  # answered: a subagent stopped on its share is asked about
    if mine and outcome == "expired" and d.get("reason") == EXPIRED:
        s.lapsed = True
    req.request = settled_applied(req.request, d)  # a mirror's: its subagent's votes
    req.outcome = outcome
    req.resolution = d
    child = req.request.child
    turn = s.turn
    if child is None and turn is not None and req.request.turn_id == turn.id:
        if req.request.id not in turn.answered:
            turn.answered.append(req.request.id)
    if child is not None:  # a subagent's request, settled there: its delegate call re-runs
        call = None if s.turn is None else s.turn.calls.get(child.call_id)
        still_waiting = any(
            r.status == "pending"
            and r.request.child is not None
            and r.request.child.call_id == child.call_id
            for r in s.requests.values()
        )
        if call is not None and call.status == "asking" and not still_waiting:
            call.status = "running"
            assert s.turn is not None
            s.turn.status = "running"
        return
    action = req.request.action
    if action is None or s.turn is None or action.call_id not in s.turn.calls:
        return
    call = s.turn.calls[action.call_id]
    if req.request.source == "ask":
        still_asking = any(
            r.status == "pending"
            and r.request.source == "ask"
            and r.request.action is not None
            and r.request.action.call_id == call.id
            for r in s.requests.values()
        )
        if call.status == "asking" and not still_asking:
            call.status = "running"  # re-run the body; answered asks replay
            s.turn.status = "running"  # so its next park records a turn.waiting of its own
        return
    if call.status in ("requested", "awaiting") and outcome not in ("approved", "answered"):
        # withdrawn without an approval: the call never runs
        call.decision = {
            "approved": False,
            "outcome": outcome,
            "reason": d.get("reason"),
            # Who withdrew it (a steering message's sender) decided nothing of the call: the
            # model reads signoff's reason, not a note of theirs (`denial`).
            "by": None if d.get("status") == "withdrawn" else d.get("by"),
        }
        call.status = "denied" if call.status == "requested" else "decided"


def _input_repeated(s: SessionState, e: Event) -> None:
    """A keyed message's answer that changed nothing: only its key is kept, with its turn. Or
    (`held_idem`) its answer to a mirror, going down to the subagent's session: the key is
    held for it, where the message went not known yet, unless it is recorded already."""
    _keyed(s, e, _in_turn(s, e))
    held = e.data.get("held_idem")
    if isinstance(held, list) and len(held) == 2 and held[0] not in s.keys:
        _keyed(s, e, [None], "held_idem")


def _turn_completed(s: SessionState, e: Event) -> None:
    _turn(s, e).status = "completed"


def _turn_failed(s: SessionState, e: Event) -> None:
    turn = _turn(s, e)
    turn.status = "failed"
    turn.retryable = bool(e.data.get("retryable"))
    turn.error = error_of(e.data.get("error"))  # text a hand edit left failed every page
    if e.data.get("start_over") is True:
        turn.paused = ()  # counted when journaled, and never gone on from: a retry asks afresh
    _billed(s, e)  # a reply the provider billed that the turn could not use
    _read_again(s, e)
    if e.data.get("reason") == EXPIRED:
        s.lapsed = True  # it ended because the TTL passed: the session stays expired
    if not turn.retryable:
        _owe(s, turn)


def _turn_resumed(s: SessionState, e: Event) -> None:
    turn = _turn(s, e)
    if turn.status == "failed":  # a retry was asked for: the turn has work again
        turn.status = "running"


def _turn_cancelled(s: SessionState, e: Event) -> None:
    turn = _turn(s, e)
    if turn.status != "failed" or turn.retryable:  # one failed for good owes them already
        _owe(s, turn)
        for child in e.data.get("children") or ():  # created, not journaled: owed alike
            s.owed.setdefault(str(child), turn.id)
    turn.status = "cancelled"
    turn.retryable = False  # a failure's before it: no retry resumes a cancelled turn (fold 2)


def _subagent_spent(s: SessionState, e: Event) -> None:
    child = e.data["session_id"]
    # Counted once, however recorded: an owed child whole, a short one's rest.
    if s.owed.pop(child, None) is not None or s.short.pop(child, None) is not None:
        s.delegated = s.delegated + kept_usage(e.data["delegated"], strict=False)


def _model_spent(s: SessionState, e: Event) -> None:
    """What a reply (or review) was billed once its turn had ended elsewhere: counted, and the
    turn, which may be another by now, left as it is."""
    s.usage = s.usage + kept_usage(e.data["usage"], strict=False)


def _owe(s: SessionState, turn: TurnState) -> None:
    """The turn ended (or was replaced) for good: the children of its delegate calls without a
    result are owed, their spend counted by a `subagent.spent` once their own turn ended."""
    for call in turn.calls.values():
        if call.status != "done":
            for child in call.subagents():
                s.owed.setdefault(child, turn.id)


def _session_waiting(s: SessionState, e: Event) -> None:
    pass


def _revive(turn: TurnState) -> None:
    """A call moving again means the turn runs again, unless it already ended."""
    if turn.status == "waiting":
        turn.status = "running"


def _turn(s: SessionState, e: Event) -> TurnState:
    if s.turn is None or s.turn.id != e.turn_id:
        raise StoreError(
            f"session {e.session_id} is damaged: event {e.id} ({e.type}) refers to a turn that "
            "is not open"
        )
    return s.turn


def _call(s: SessionState, e: Event) -> CallState:
    turn = _turn(s, e)
    try:
        return turn.calls[e.data["call_id"]]
    except KeyError:
        raise StoreError(
            f"session {e.session_id} is damaged: event {e.id} ({e.type}) refers to an unknown call"
        ) from None


HANDLERS = {
    "session.created": _session_created,
    "turn.started": _turn_started,
    "turn.message": _turn_message,
    "model.completed": _model_completed,
    "model.paused": _model_paused,
    "tool.started": _tool_started,
    "tool.step": _tool_step,
    "tool.completed": _tool_completed,
    "input.requested": _input_requested,
    "turn.waiting": _turn_waiting,
    "approval.candidate": _approval_candidate,
    "approval.settled": _approval_settled,
    "input.resolved": _input_resolved,
    "input.repeated": _input_repeated,
    "turn.completed": _turn_completed,
    "turn.failed": _turn_failed,
    "turn.resumed": _turn_resumed,
    "turn.cancelled": _turn_cancelled,
    "session.waiting": _session_waiting,
    "subagent.spent": _subagent_spent,
    "model.spent": _model_spent,
}
