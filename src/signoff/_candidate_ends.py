"""How a response's candidate ends: the response policy's verdict on it (`_judged`), the
events that end one, what an answer's call meets when another process ended its candidate or
closed its request meanwhile, and the judging that goes on when the call is cancelled
(`past_cancel`). A part of `Candidates`, apart from `_candidates` so that one keeps to
recording responses and settling or counting them."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from ._answers import repeat as _repeat
from ._call_guards import running
from ._candidate_keys import base
from ._counts import counted_elsewhere, unawaited
from ._deadlines import lapse
from ._eligibility import voted
from ._exceptions import AnswerError, SessionExpired, SignoffError
from ._idempotency import Keyed, same_ask
from ._policy_inputs import proposed_input, session_info, typed_input
from ._recording import EventSpec
from ._response import (
    RequestInfo,
    ResponseContext,
    ResponseInfo,
    ResponseVerdict,
    evaluate_response,
)
from ._results import Outcome
from ._sessions import SessionRunner
from ._state import SessionState
from ._text import cut
from ._tool_json import result_bound
from ._tools import Tool
from ._types import InputRequest, Principal

__all__ = [
    "RECHECKED",
    "CandidateEnds",
    "EndedElsewhere",
    "already_counted",
    "base",
    "ending",
    "expired_end",
    "naming",
    "past_cancel",
    "sent",
    "waiting",
]

log = logging.getLogger("signoff.runtime")

RECHECKED = (
    "settled by another process, which judged this response again while this one was stalled "
    "past the response policy's timeout"
)
"""The reason of an answer's outcome when its own call stalled and another process's check of
it settled its request (`CandidateEnds._told`)."""


class CandidateEnds(SessionRunner):
    """The response policy's verdict on an answer, and what an answer's call meets when its
    candidate or its request was ended elsewhere; the base of `Candidates`."""

    async def _told(
        self,
        session_id: str,
        request: InputRequest,
        cid: str,
        after: int,
        wanted: dict[str, Any],
        kept: list[bool] | None = None,
    ) -> Outcome | None:
        """What became of response `cid` to `request`, ended by another process (which judged
        it again, taking this one, stalled, for dead, or closed its request) after seq `after`:
        the outcome its call returns, or the error it raises, as if this process had recorded
        that end; left out of this process's counts, as that one counted it. `kept` is told
        (True appended) when that end recorded the key of the answer's message. None if no one
        ended it: its request closed under it with no end of it recorded (an answer no message
        keyed, or a close an older signoff made), and this call records its end."""
        rid = request.id
        kinds = ["approval.candidate", "approval.settled"]
        for e in await self.store.read_events(session_id, after, types=kinds):
            d = e.data
            if d.get("candidate_id") != cid or d.get("outcome") == "pending":
                continue
            if kept is not None and d.get("idem"):
                kept.append(True)
            if e.type == "approval.settled":
                outcome = Outcome(
                    request_id=rid, outcome=wanted["outcome"], applied=True, reason=RECHECKED
                )
            elif d.get("outcome") == "counted":
                votes = f"{d.get('votes')} of {d.get('needed')}"
                outcome = Outcome(request_id=rid, outcome="counted", applied=True, reason=votes)
            else:
                outcome = await self._ended_as(session_id, request, d, wanted)
            return counted_elsewhere(outcome)
        return None

    async def _ended_as(
        self, session_id: str, request: InputRequest, ended: dict[str, Any], wanted: dict[str, Any]
    ) -> Outcome:
        """The outcome of a response another process refused (`ended` says how): its verdict
        while the request stays open, or what a repeat of the answer meets once it closed (the
        deadline or TTL that overtook it there)."""
        rid = request.id
        state = await self._state(session_id)
        live = state.requests.get(rid)
        if ended.get("outcome") != "stale" or (live is not None and live.status == "pending"):
            return Outcome(
                request_id=rid, outcome=ended["outcome"], applied=False, reason=ended.get("reason")
            )
        if state.lapsed:
            raise counted_elsewhere(SessionExpired(session_id, [rid]))
        try:
            return _repeat(
                request,
                live.status if live else "withdrawn",
                live.resolution if live else None,
                wanted,
            )
        except AnswerError as exc:
            raise counted_elsewhere(exc) from None

    async def _closed_meanwhile(
        self,
        state: SessionState,
        request: InputRequest,
        wanted: dict[str, Any],
        principal: Principal | None,
    ) -> Outcome | None:
        """What an answer meets once another call of the same answer was judged: a repeat's
        outcome (or error) if that settled the request, `already_counted` if it counted the
        person's vote; None if the request is still open to it."""
        rid = request.id
        if state.lapsed:
            raise SessionExpired(state.id, [rid])
        live = state.requests.get(rid)
        if live is not None and live.status == "pending":
            if wanted["decision"] == "approve" and voted(live.request, principal):
                return already_counted(live.request)
            return None
        stored = await self.store.get_request(rid)
        if stored is None:
            return _repeat(request, "withdrawn", None, wanted)
        return _repeat(request, stored.status, stored.resolution, wanted)

    async def _judged(
        self,
        state: SessionState,
        tool: Tool,
        request: InputRequest,
        wanted: dict[str, Any],
        principal: Principal | None,
    ) -> ResponseVerdict:
        """The verdict of `tool`'s response policy on `principal`'s answer `wanted` to `request`
        of session `state`; a reason of megabytes is cut, as an approval policy's is: it is
        recorded for every answer refused, and returned with each."""
        assert tool.response_policy is not None
        edited = wanted.get("edited_input")
        verdict = await evaluate_response(
            tool.response_policy,
            ResponseContext(
                request=RequestInfo(
                    request_id=request.id,
                    call_id=request.call_id or "",
                    tool_name=request.tool_name or "",
                    tool_input=proposed_input(state, tool, request),
                    principal=request.requested_by,
                    escalated_to=request.escalated_to,
                    approved_by=tuple(request.approved_by),
                ),
                response=ResponseInfo(
                    decision=wanted["decision"],
                    principal=principal,
                    edited_input=None if edited is None else typed_input(tool, edited),
                ),
                session=session_info(state, request),
            ),
            tool.response_timeout,
        )
        if verdict.reason is None:
            return verdict
        cap = result_bound(tool, self.agent(state.agent).limits) // 8
        return dataclasses.replace(verdict, reason=cut(verdict.reason, cap))

    async def _orphaned(self, state: SessionState) -> bool:
        """Cancel the session's turn if it is a subagent's that its parent no longer waits on
        (its TTL passed, say; the runtime knows subagents); returns whether it did."""
        return False

    async def _bill(self, state: SessionState, spent: list[EventSpec]) -> None:
        """Record `spent` (`billing`'s) in the session, on its own: it changes no turn, and is
        no activity, which would restart the session's TTL."""
        if spent:
            turn = None if state.turn is None else state.turn.id
            await self._append(state.id, lambda st: spent, turn_id=turn)

    async def _held_now(self, state: SessionState) -> bool:
        """`_held_past_ttl` of the session as it stands now, read again only if `state`, read
        before (a slow policy judged an answer since), is past its TTL: later activity only
        puts the TTL off."""
        if not state.expired(self.now()):
            return False
        return await self._held_past_ttl(await self._state(state.id))

    async def _spoiled(
        self,
        session_id: str,
        request: InputRequest,
        cid: str,
        candidate: dict[str, Any],
        why: str,
    ) -> bool:
        """End a recorded response that can no longer settle its request (`stale`, saying
        why); the request stays open for another answer. False if another process ended it
        meanwhile (nothing recorded). Past the session's TTL, the expiry is recorded with that
        end and `SessionExpired` raised."""
        ended = {
            **base(request, cid, candidate.get("decision"), candidate.get("by")),
            "outcome": "stale",
            "reason": f"this response can no longer settle the request: {why}",
        }
        here: list[bool] = []
        held = await self._held_past_ttl(await self._state(session_id))
        lapsed: list[bool] = []

        def end(st: SessionState) -> Any:
            here[:] = [cid in st.candidates]
            if not here[0]:
                return []  # another process ended it meanwhile
            expiry = lapse(st, self.now(), held, expired_end(ended, request.id))
            lapsed[:] = [] if expiry is None else [True]
            return ending(st, request.id, ended) if expiry is None else expiry

        await self._append(session_id, end, turn_id=request.turn_id)
        if here == [True] and lapsed:
            raise SessionExpired(session_id, [request.id])
        return here == [True]


class EndedElsewhere(Exception):
    """A candidate judged again after its process died was ended by another process judging it
    at the same time: this one recorded nothing, and counts nothing."""


def sent(st: SessionState, mark: Keyed | None) -> bool:
    """Whether the message keyed `mark` is recorded in `st` already: sent again at once, it
    counted its vote meanwhile (which `voted` misses where one person may vote twice)."""
    return mark is not None and same_ask((st.keys.get(mark[0]) or [None])[0], mark)


def already_counted(request: InputRequest) -> Outcome:
    """The outcome of an approval from someone whose vote `request` has counted already: a
    no-op, saying how far the quorum is."""
    reason = f"already counted: {request.progress}"
    return Outcome(request_id=request.id, outcome="counted", applied=False, reason=reason)


def naming(specs: list[EventSpec], cid: str) -> list[EventSpec]:
    """A settlement's events, its `approval.settled` naming candidate `cid`, whose response it
    is: a process that judged the same response finds it there (`CandidateEnds._told`)."""
    return [(t, {**d, "candidate_id": cid} if t == "approval.settled" else d) for t, d in specs]


def waiting(st: SessionState) -> EventSpec:
    """The turn waiting again, on the requests still pending."""
    return ("turn.waiting", {"on": "input", "request_ids": [r.id for r in st.pending_requests()]})


def expired_end(ended: dict[str, Any], rid: str) -> list[EventSpec]:
    """The `stale` end of a pending candidate (`ended`: what its events say) whose session's TTL
    passed before it could settle request `rid`."""
    why = f"the session expired before this response could settle request {rid}"
    return [("approval.candidate", {**ended, "outcome": "stale", "reason": why})]


def ending(st: SessionState, rid: str, ended: dict[str, Any]) -> list[EventSpec]:
    """A candidate ending as `ended` says, the turn waiting on again; or `stale` if its request
    `rid` closed meanwhile."""
    live = st.requests.get(rid)
    if live is None or live.status != "pending":
        return [("approval.candidate", {**ended, "outcome": "stale"})]
    return [("approval.candidate", ended), waiting(st)]


_LEFT: set[asyncio.Task[Outcome]] = set()
"""Answers whose callers stopped waiting (`past_cancel`), held until they end."""


async def past_cancel(
    rt: CandidateEnds, decide: Callable[[], Coroutine[Any, Any, Outcome]], recording: list[bool]
) -> Outcome:
    """`decide()`, on a task of its own, one of `rt`'s calls (`running`: its `close` stops it).
    Cancelled, the caller leaves it running once `recording` says its answer's candidate is
    being committed, what it comes to counted as the caller's settlement would have counted
    it (`unawaited`); before that, it is cancelled too."""

    async def guarded() -> Outcome:
        with running(rt):
            return await decide()

    task = asyncio.ensure_future(guarded())
    rt._acting_for(task)  # its commit may lease the turn it makes runnable to the call's drive
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if not recording:
            task.cancel()
        count = unawaited(rt._counts)
        _LEFT.add(task)

        def ended(task: asyncio.Task[Outcome]) -> None:
            _LEFT.discard(task)
            if task.cancelled():
                return
            exc = task.exception()
            if exc is not None and not isinstance(exc, SignoffError):
                log.error("an answer left to end after its call's cancel failed", exc_info=exc)
            count(task.result() if exc is None else exc)

        task.add_done_callback(ended)
        raise
