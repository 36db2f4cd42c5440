"""Mirrored requests: a child session's requests asked again in its parent (`ChildRef`), and
the answers given through the parent, settled in the child under the child's own policies."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import json
import math
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeVar

from ._answer_sizes import check_all_answered
from ._counts import CLOSED, refused_only, settled_before_raising
from ._exceptions import (
    AnswerError,
    InvalidAnswer,
    RequestClosed,
    SessionExpired,
)
from ._idempotency import key_fields, taken_by_another, through
from ._key_holds import hold_key
from ._mirror_keys import MAX_HOPS, keep_vote_key, kept, voted_below
from ._recording import Batch, EventSpec, runnable, shown_recorded
from ._results import GenerateResult, Outcome
from ._state import SessionState
from ._types import ChildRef, InputRequest, Principal
from .stores import Resolve, Store, StoredRequest

if TYPE_CHECKING:
    from ._answering import Answering
    from ._answers import Reply
    from ._approval import Verdict
    from ._response import ResponseVerdict
    from ._tools import Tool

__all__ = [
    "FOLLOWED",
    "JUDGED",
    "MAX_HOPS",
    "REVIEWED",
    "close_mirror",
    "deciding",
    "deciding_way",
    "followed",
    "followed_state",
    "following_mirrors",
    "judged_once",
    "named_as_answered",
    "routed",
    "settle_routed",
    "stored_followed",
    "timed_out_close",
]

_P = ParamSpec("_P")
_R = TypeVar("_R", bound="_Reading")

REVIEWED: contextvars.ContextVar[
    dict[tuple[str, str], tuple[ResponseVerdict | None, Verdict | None]] | None
] = contextvars.ContextVar("reviewed", default=None)
"""While `settle_routed` checks every answer and then settles them: the verdicts on each edit (by
request id and edit), the response policy's and the approval policy's with what its review cost,
so the settlement takes the check's, judging and reviewing nothing again."""

JUDGED: contextvars.ContextVar[dict[str, ResponseVerdict] | None] = contextvars.ContextVar(
    "judged", default=None
)
"""While `settle_routed` checks every answer and then settles them: the response policy's
verdicts on answers judged without settling (to a closed request, or unsound: `judged_once`),
by `_judging_key`, so no pass of the call judges one again. A policy may be slow or ask a model."""


async def judged_once(
    rt: Answering,
    state: SessionState,
    tool: Tool,
    request: InputRequest,
    wanted: dict[str, Any],
    principal: Principal | None,
) -> ResponseVerdict:
    """The verdict of `tool`'s response policy on `principal`'s answer `wanted` to `request`
    (judged in its own session, read unless it is `state`'s), or the one an earlier pass of this
    `settle_routed` call gave it (`JUDGED`)."""
    memo = JUDGED.get()
    key = _judging_key(request, wanted, principal)
    if memo is not None and key in memo:
        return memo[key]
    own = request.session_id == state.id
    judged_in = state if own else await rt._state(request.session_id)
    verdict = await rt._judged(judged_in, tool, request, wanted, principal)
    if memo is not None:
        memo[key] = verdict
    return verdict


def _judging_key(request: InputRequest, wanted: dict[str, Any], principal: Principal | None) -> str:
    """What a response policy sees of an answer that may differ within one call."""
    seen = {
        "request": request.id,
        "decision": wanted["decision"],
        "edited_input": wanted.get("edited_input"),
        "by": None if principal is None else principal.model_dump(mode="json"),
    }
    return json.dumps(seen, sort_keys=True, default=str)


async def deciding(store: Store, request: InputRequest) -> InputRequest:
    """The request an answer to `request` settles: itself, or for a mirror the subagent's
    request it stands for (hop by hop), whose tool, rules and votes decide. No read for a
    request that is no mirror."""
    return (await deciding_way(store, request))[-1]


async def deciding_way(store: Store, request: InputRequest) -> list[InputRequest]:
    """`request`, then for a mirror each request down the way to the one it stands for, hop by
    hop: the last is `deciding`'s, and `named_as_answered` names the first in its faults."""
    return (await _stands_for(store, request))[0]


async def _stands_for(
    store: Store, request: InputRequest
) -> tuple[list[InputRequest], float | None]:
    """`deciding_way`, and the first time a session down the way (not `request`'s own) passes
    its TTL, after which the mirror takes no answer: None if none has a TTL."""
    way, expires = [request], None
    for _ in range(MAX_HOPS):
        if request.child is None:
            break
        stored = await store.get_request(request.child.request_id)
        if stored is None:
            break
        request = stored.request
        way.append(request)
        if stored.session_expires_at is not None:
            expires = min(stored.session_expires_at, math.inf if expires is None else expires)
    return way, expires


_E = TypeVar("_E", bound=AnswerError | InvalidAnswer)


def named_as_answered(exc: _E, way: Sequence[InputRequest]) -> _E:
    """`exc`, a fault of the last request of `way` (`deciding_way`), naming the first, which
    the caller answered, beside each it stands for, as a refusal of an answer routed through
    them names it (`_naming`): the same words however it was reached."""
    for mirror in reversed(way[:-1]):
        assert mirror.child is not None
        _rename(exc, mirror.id, mirror.child)
    return exc


def _rename(exc: AnswerError | InvalidAnswer, answered: str, ref: ChildRef) -> None:
    """Name `answered`, a mirror, where `exc` names the subagent's request `ref` it stands for."""
    exc.request_ids = [answered if i == ref.request_id else i for i in exc.request_ids]
    named = f"{answered} (asked for {ref.agent}'s {ref.request_id})"
    exc.args = (str(exc).replace(ref.request_id, named), *exc.args[1:])


FOLLOWED = ("approved_by", "escalated_to", "expires_at")
"""What a mirror shows of the subagent's request it stands for, as that request says now: the
votes counted there, the group a passed deadline escalated it to, and its deadline. The
mirror's own copy keeps them as they were when it was asked (and no deadline of its own)."""


async def followed(
    store: Store, requests: list[InputRequest], now: float | None = None
) -> list[InputRequest]:
    """`requests` with each open mirror showing the `FOLLOWED` fields of the request it stands
    for as they are now; a deadline only while that request is open (one settled before it passed is
    neither escalated nor expired by it). One read per mirror (per hop), none for any other.

    Given `now`, a mirror whose subagent's session (or one further down) passed its TTL by then
    shows as `expired`, as recording that will close it: it takes no answer any more."""
    out: list[InputRequest] = []
    for r in requests:
        if r.child is not None and r.status == "pending":
            way, expires = await _stands_for(store, r)
            current = way[-1]
            if now is not None and expires is not None and expires <= now:
                # closed with the votes that request counted, as `close_mirror` records them
                votes = list(current.approved_by)
                out.append(r.model_copy(update={"status": "expired", "approved_by": votes}))
                continue
            update = {f: _copied(getattr(current, f)) for f in FOLLOWED}
            if current.status != "pending" and "expires_at" in update:
                update["expires_at"] = None  # closed: the mirror closes with it, not by this
            if any(v != getattr(r, f) for f, v in update.items()):
                r = r.model_copy(update=update)
        out.append(r)
    return out


def stored_followed(stored: StoredRequest, shown: InputRequest) -> StoredRequest:
    """A stored open mirror as `followed` shows it (`shown`): closed as `expired`, as
    `close_mirror` will record it, when its subagent's session passed its TTL unrecorded."""
    if shown.status != "expired" or stored.status != "pending" or shown.child is None:
        return dataclasses.replace(stored, request=shown)
    resolution = _expired_close(shown, shown.child)
    return dataclasses.replace(
        stored, request=shown, status="expired", outcome="expired", resolution=resolution
    )


def _expired_close(mirror: InputRequest, ref: ChildRef) -> dict[str, Any]:
    """What `close_mirror` records for `mirror` (shown with the votes of the request `ref` it
    stands for: `followed`) once its subagent's session's passed TTL closed that as `expired`."""
    return {
        "outcome": "expired",
        "request_id": mirror.id,
        "status": "expired",
        "child_request_id": ref.request_id,
        **_votes_of(mirror, None),
    }


def timed_out_close(
    mirror: InputRequest, asked: InputRequest, resolution: dict[str, Any]
) -> dict[str, Any]:
    """What `close_mirror` records for `mirror` once time closed `asked`, the subagent's request
    at the end of its way, as `expired` with `resolution` (a deadline's, a TTL's), before any
    session down the way has recorded that: a cancel closes the mirror with it so."""
    assert mirror.child is not None
    return {
        **resolution,
        "request_id": mirror.id,
        "status": "expired",
        "child_request_id": mirror.child.request_id,
        **_votes_of(asked, None),
    }


def _votes_of(asked: InputRequest, resolution: dict[str, Any] | None) -> dict[str, Any]:
    """The `approved_by` a mirror's close records: the votes of the subagent's request `asked`
    it stands for, whatever closed it (a denial's or an expiry's resolution holds none), or the
    list an approval's `resolution` holds, its quorum's; nothing for a question (no votes)."""
    if asked.kind != "tool-approval":
        return {}
    votes = (resolution or {}).get("approved_by")
    return {
        "approved_by": [str(v) for v in (votes if isinstance(votes, list) else asked.approved_by)]
    }


def _copied(value: Any) -> Any:
    return list(value) if isinstance(value, list) else value


async def followed_state(
    store: Store, state: SessionState, now: float | None = None
) -> SessionState:
    """`state` with its open mirrors `followed`: a copy when it has any, else `state` itself.
    Given `now`, one whose subagent's TTL passed by then, unrecorded, is shown closed as
    `close_mirror` records it, its delegate call going on (`shown_recorded`: nothing written)."""
    mirrors = [
        live
        for live in state.requests.values()
        if live.status == "pending" and live.request.child is not None
    ]
    if not mirrors:
        return state
    requests = dict(state.requests)
    closes: list[EventSpec] = []
    for live in mirrors:
        [shown] = await followed(store, [live.request], now)
        if shown.status == "expired" and shown.child is not None:
            closes.append(("input.resolved", _expired_close(shown, shown.child)))
        else:
            requests[shown.id] = dataclasses.replace(live, request=shown)
    state = dataclasses.replace(state, requests=requests)
    return shown_recorded(state, closes, now) if closes and now is not None else state


class _Reading(Protocol):
    """What `following_mirrors` reads the subagents' requests from: a runtime's store."""

    store: Store


def following_mirrors(
    method: Callable[Concatenate[_R, _P], Coroutine[Any, Any, GenerateResult]],
) -> Callable[Concatenate[_R, _P], Coroutine[Any, Any, GenerateResult]]:
    """A runtime method whose result shows its open mirrors' votes, escalation and deadline as
    their subagents' requests say now, as every other surface does. A result with no mirror
    costs nothing more."""

    @functools.wraps(method)
    async def shown(self: _R, /, *args: _P.args, **kwargs: _P.kwargs) -> GenerateResult:
        result = await method(self, *args, **kwargs)
        if all(r.child is None for r in result.pending):
            return result
        pending = await followed(self.store, result.pending)
        return dataclasses.replace(result, pending=pending)

    return shown


def routed(state: SessionState, answers: Sequence[Reply]) -> bool:
    """Whether any answer is for a request mirrored from a child session that is open, or
    settled (a repeat is judged by the child's request, under the child's tool)."""
    return any(_routed_ref(state, a) is not None for a in answers)


def _routed_ref(state: SessionState, answer: Reply) -> ChildRef | None:
    """The child request an answer to a mirror goes to; None for an answer settled here (one to
    a request of this session's own, or to a mirror withdrawn or expired: those take none)."""
    live = state.requests.get(answer.request_id)
    if live is None or live.status not in ("pending", "settled"):
        return None
    return live.request.child


async def settle_routed(
    rt: Answering,
    state: SessionState,
    answers: Sequence[Reply],
    principal: Principal | None,
    **kwargs: Any,
) -> list[Outcome]:
    """`_settle_routed`, with the reviews of edits its check makes kept for its settlement,
    and the response policy's verdicts on answers it judges without settling for every pass.
    An answer refused as closed once the session's own TTL passed (a subagent's slow policy
    judged it meanwhile, and the session's expiry withdrew the subagent's request) raises
    `SessionExpired`, the expiry recorded, as an answer to a request of its own does."""
    try:
        if REVIEWED.get() is not None:  # a mirror of a mirror: the outermost call keeps them
            return await _settle_routed(rt, state, answers, principal, **kwargs)
        token, judged = REVIEWED.set({}), JUDGED.set({})
        try:
            return await _settle_routed(rt, state, answers, principal, **kwargs)
        finally:
            JUDGED.reset(judged)
            REVIEWED.reset(token)
    except CLOSED:
        if (await rt._state(state.id)).expired(rt.now()):
            await rt._checked(state.id)  # raises `SessionExpired`, unless a live drive runs on
        raise


async def _settle_routed(
    rt: Answering,
    state: SessionState,
    answers: Sequence[Reply],
    principal: Principal | None,
    *,
    require_all: bool,
    check_only: bool = False,
    drive: bool = True,
    mark: tuple[str, str] | None = None,
    review: bool = True,
) -> list[Outcome]:
    """Settle answers to mirrored requests in their child sessions (each under the child's own
    policies), close the mirrors the children closed, and settle the rest here. `mark`, the
    idempotency key of the message that gave the answers, is recorded here, by the first
    mirror's closing, or the vote it counted there (`keep_vote_key`), or the rest's
    settlement, so the message repeated is not taken again, and in the child with its answer
    (marked as given through the mirror: `through`), where a vote it cast is not counted
    again.

    Every answer is checked before any is settled: a bad one leaves every session unchanged,
    but for a mirror whose child's request had closed unseen, which an answer refused as
    closed (`CLOSED`) closes too (the parent's turn then goes on, if `drive`); one refused for
    who gave it or what it says (`NotAllowed`, a response policy's verdict) closes nothing.
    They are settled one by one, each in its session: one that another process settled after
    the check raises, the ones settled before it stand (counted, and the parent's turn goes on
    with them, if `drive`) and the ones after it stay open.
    """
    mirrored: list[tuple[Reply, InputRequest, ChildRef]] = []
    rest: list[Reply] = []
    for a in answers:
        ref = _routed_ref(state, a)
        if ref is None:
            rest.append(a)
        else:
            mirrored.append((a, state.requests[a.request_id].request, ref))
    # Every answer is checked, then every edit reviewed (`REVIEWED`): a review is made only
    # for answers that all pass, so none is billed for a call that is refused for another.
    for reviewing in (False, True) if review else (False,):
        for a, mirror, ref in mirrored:
            try:
                with _naming(a, ref):
                    await rt._settle(
                        ref.session_id,
                        [_for_child(a, ref)],
                        principal,
                        require_all=False,
                        check_only=True,
                        review=reviewing,
                    )
            except CLOSED:
                if not check_only:
                    await _closed_behind(rt, state.id, mirror, drive=drive)
                raise
        if rest:
            await rt._settle(
                state.id, rest, principal, require_all=False, check_only=True, review=reviewing
            )
        # Complete only after who may answer was checked (above), as `_settle` has it; a call
        # that only repeats answers to closed requests is a no-op.
        if require_all and any(_open(state, a.request_id) for a in answers):
            check_all_answered(state, [a.request_id for a in answers])
    if check_only:
        return []
    if mark is not None and mirrored:  # held here first: another message sees it (`hold_key`)
        await hold_key(rt, state.id, mirrored[0][1], principal, mark)
    outcomes: list[Outcome] = []
    try:
        for i, (a, mirror, ref) in enumerate(mirrored):
            refused = False
            try:
                with _naming(a, ref):
                    got = await rt._settle(
                        ref.session_id,
                        [_for_child(a, ref)],
                        principal,
                        require_all=False,
                        drive_expired=drive,
                        # a vote there counts the message once, as given through the mirror
                        mark=through(mark) if i == 0 else None,
                    )
                refused = refused_only(got)
            except (AnswerError, InvalidAnswer) as exc:
                refused = not isinstance(exc, CLOSED)
                raise
            finally:  # whatever the child now says, unless it refused the caller
                if not refused:
                    await close_mirror(rt, state.id, mirror, mark=mark if i == 0 else None)
            if i == 0 and mark is not None:
                await keep_vote_key(rt, state.id, mirror, mark, principal)
            outcomes.extend(dataclasses.replace(o, request_id=a.request_id) for o in got)
        if rest:
            key = None if mirrored else mark
            got = await rt._settle(
                state.id, rest, principal, require_all=False, drive_expired=drive, mark=key
            )
            outcomes.extend(got)
    except BaseException as exc:
        # Another process settled a request between the check and here: the answers settled
        # before it stand, as if given alone, and the rest are left open.
        settled_before_raising(outcomes)
        if drive and isinstance(exc, AnswerError):
            await _go_on(rt, state.id, settled=bool(outcomes))
        raise
    return outcomes


async def _closed_behind(rt: Answering, parent: str, mirror: InputRequest, *, drive: bool) -> None:
    """An answer to `mirror` was refused as closed (`CLOSED`): if its subagent's request had
    closed with the mirror left open (the process that closed it died first), close the mirror
    as it closed (and the open mirrors between, deepest first) and, if `drive`, let the
    parent's turn go on, which nothing else would: it waits on no one. The sessions between go
    on as it drives them."""
    chain = [mirror]
    for _ in range(MAX_HOPS):
        ref = chain[-1].child
        stored = None if ref is None else await rt.store.get_request(ref.request_id)
        if stored is None or stored.status != "pending" or stored.request.child is None:
            break
        chain.append(stored.request)
    for r in reversed(chain):
        await close_mirror(rt, r.session_id, r)
    state = await rt._state(parent)
    live = state.requests.get(mirror.id)
    if live is None or live.status == "pending":
        return
    if drive and state.agent in rt.agents and runnable(state):
        await rt._drive(parent)


async def _go_on(rt: Answering, parent: str, *, settled: bool) -> None:
    """An answer through `parent` was refused after the call's earlier ones `settled` requests
    (their subagents' turns go on in its drive) or mirrors closed left its turn runnable: drive
    it, as the call would have had it not raised. Nothing else would: it waits on no one."""
    state = await rt._state(parent)
    if state.agent in rt.agents and (settled or runnable(state)):
        await rt._drive(parent)


def _open(state: SessionState, request_id: str) -> bool:
    live = state.requests.get(request_id)
    return live is not None and live.status == "pending"


def _for_child(answer: Reply, ref: ChildRef) -> Reply:
    return dataclasses.replace(answer, request_id=ref.request_id)


@contextlib.contextmanager
def _naming(answer: Reply, ref: ChildRef) -> Iterator[None]:
    """Name the request the caller answered in an error, beside the child's it stands for. A
    child session past its TTL closes the mirror (its expiry is recorded): `RequestClosed`,
    not `SessionExpired`, which would say the caller's session, alive, had expired."""
    try:
        try:
            yield
        except SessionExpired as exc:
            if exc.session_id != ref.session_id:
                raise
            raise RequestClosed(
                f"request {ref.request_id} is expired: {ref.agent}'s session {ref.session_id} "
                "passed its TTL; it takes no answers",
                [ref.request_id],
            ) from None
    except (AnswerError, InvalidAnswer) as exc:
        _rename(exc, answer.request_id, ref)
        raise


async def close_mirror(
    rt: Answering, parent: str, mirror: InputRequest, *, mark: tuple[str, str] | None = None
) -> None:
    """Resolve the mirror as its child request was resolved; nothing while that is open, nor
    once the parent's TTL passed (unless a live drive runs it on): its expiry closes the mirror.

    The resolution is the child's stored one, which holds the decision, value and edited input
    the session's fold leaves out, so the mirror reads (and is repeated) as the child's does.
    Its event records `mark`, the idempotency key of the message whose answer closed it, and
    keeps the keys the child (and any session below it) recorded in that request's turn for
    messages sent through it (`voted_below`), whose own record here a process killed after
    the child's commit never made (`kept`).
    """
    ref = mirror.child
    assert ref is not None
    child = await rt._state(ref.session_id)
    live = child.requests.get(ref.request_id)
    if live is not None and live.status == "pending":
        return
    stored = await rt.store.get_request(ref.request_id)
    if stored is not None and stored.status != "pending":
        status, resolution, asked = stored.status, stored.resolution, stored.request
    elif live is not None:
        status, resolution, asked = live.status, live.resolution, live.request
    else:
        return
    if status == "pending":
        return
    voted = await voted_below(rt, child, asked)
    data = {
        **(resolution or {}),
        "request_id": mirror.id,
        "status": status,
        "child_request_id": ref.request_id,
        **_votes_of(asked, resolution),
    }
    data.setdefault("outcome", "cancelled")
    closed_as: Any = status
    held = await rt._held_past_ttl(await rt._state(parent))

    def build(st: SessionState) -> Batch:
        now = st.requests.get(mirror.id)
        if now is None or now.status != "pending":
            return Batch(specs=[])
        if st.expired(rt.now()) and not held:
            return Batch(specs=[])  # closing it is activity, which would revive the parent
        # Its key, unless another call took it here (an older process let it through).
        key = {} if mark is None or taken_by_another(st.keys, mark) else key_fields(mark)
        spec: EventSpec = ("input.resolved", {**data, **key, **kept(st, voted, mark)})
        resolve = Resolve(
            request_id=mirror.id, status=closed_as, outcome=data["outcome"], resolution=data
        )
        # Its row holds the votes of the child's request, as its close records them: open, it
        # showed them as it followed that request; closed, it follows no more.
        votes = data.get("approved_by")
        if not isinstance(votes, list) or now.request.approved_by == votes:
            return Batch(specs=[spec], resolve=[resolve])
        shown = now.request.model_copy(update={"approved_by": [str(v) for v in votes]})
        return Batch(specs=[spec], resolve=[resolve], updated_requests=[shown])

    await rt._append(parent, build, durable=True, turn_id=mirror.turn_id)
