"""`Candidates`: approvals settled through a response policy or a quorum. Each response is
recorded as a candidate first, then judged or counted; one whose verdict a dead process never
recorded is judged again (`_recover`). What an answer meets when another process ended its
candidate meanwhile is `_candidate_ends`'s."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from ._answers import AUTO_APPROVED, approved_on_timeout, edit_review
from ._answers import Reply as _Reply
from ._answers import repeat as _repeat
from ._answers import resolution as _resolution
from ._answers import settlement_events as _settlement_events
from ._candidate_ends import RECHECKED, CandidateEnds, already_counted, past_cancel
from ._candidate_ends import EndedElsewhere as _EndedElsewhere
from ._candidate_ends import base as _base
from ._candidate_ends import ending as _ending
from ._candidate_ends import expired_end as _expired_end
from ._candidate_ends import naming as _naming
from ._candidate_ends import sent as _sent
from ._candidate_ends import waiting as _waiting
from ._candidate_keys import keyable
from ._deadlines import due_batch, is_due, lapse
from ._eligibility import authorize, voted
from ._error_text import error_text
from ._exceptions import AnswerError, InvalidAnswer, RequestClosed, SessionExpired, StoreError
from ._idempotency import Keyed, key_fields, key_reused, mark_of, seen, taken_by_another
from ._recording import Batch, EventSpec, billing, new_id, with_usage
from ._refusals import InFlight, Lost, Moved, Refusals
from ._response import ResponseVerdict
from ._results import Outcome
from ._state import SessionState
from ._tools import Tool
from ._types import InputRequest, Principal, Usage
from .stores import Resolve

__all__ = [
    "LATE",
    "RECHECKED",
    "RECOVERY_GRACE",
    "Candidates",
    "already_counted",
]

log = logging.getLogger("signoff.runtime")

LATE = "the deadline passed before this response could settle it"

REUSED = "its message's idempotency key was taken by another message while it was judged"

RECOVERY_GRACE = 5.0
"""Seconds beyond a response policy's timeout after which a pending candidate counts as lost."""


class Candidates(CandidateEnds):
    """Settles the approvals that have a response policy or a quorum; `Answering` builds on it."""

    async def _recover(self, state: SessionState) -> bool:
        """Evaluate again the responses whose policy verdict was never recorded: the process
        that recorded them died while the policy ran (a live one has had its timeout). Each is
        counted (`_counts`) as accepted or refused here, as its dead process never did, by the
        process that ends it: another judging it at once records and counts nothing. The key of
        a message that gave one (`message_idem`) is recorded with its vote or settlement, as its
        own call would have: the message sent again is a repeat."""
        if not state.candidates:
            return False
        session_id = state.id
        recovered = False
        agent = self.agent(state.agent)
        now = self.now()
        for cid, c in list(state.candidates.items()):
            live = state.requests.get(c["request_id"])
            if live is None or live.status != "pending":
                continue
            tool = agent.tools.get(live.request.tool_name or "")
            if tool is None or tool.response_policy is None:
                continue
            if now - float(c["at"]) < tool.response_timeout + RECOVERY_GRACE:
                continue
            option = "approve" if c.get("decision") == "approve" else "cancel"
            reply = _Reply(
                live.request.id, option, c.get("text"), c.get("value"), c.get("edited_input")
            )
            by = c.get("by")
            principal = None if by is None else Principal.model_validate(by)
            mark = mark_of(c, "message_idem")  # the key of the message that gave it, if keyed
            log.info("re-evaluating response %s to request %s", cid, live.request.id)
            recovered = True
            try:
                # With the `auto()` review of its edit its own call made (not made again).
                wanted = {**_resolution(live.request, reply, tool), **edit_review(c)}
            except (InvalidAnswer, AnswerError) as exc:
                # Valid when given, it is not under this deploy (the tool's schema changed):
                # it ends here, as raising would refuse everyone who touches the session.
                try:
                    if await self._spoiled(session_id, live.request, cid, c, error_text(exc)):
                        self._counts.refuse(exc)  # as that answer given now is refused
                except SessionExpired as lapsed:
                    self._counts.refuse(lapsed)
                    raise
                continue
            try:
                outcome = await self._candidate(
                    session_id, live.request, reply, wanted, principal, recovered=cid, mark=mark
                )
            except _EndedElsewhere:
                continue  # another process judged it again meanwhile, and counted it
            except (AnswerError, SessionExpired) as exc:
                # Its request closed or was answered otherwise meanwhile, or the session's TTL
                # passed: refused, as the answer's own call would have been.
                self._counts.refuse(exc)
                if isinstance(exc, SessionExpired):
                    raise
                continue
            self._counts.answered([outcome])
        return recovered

    async def _candidate(
        self,
        session_id: str,
        request: InputRequest,
        reply: _Reply,
        wanted: dict[str, Any],
        principal: Principal | None,
        *,
        recovered: str | None = None,
        mark: Keyed | None = None,
        usage: Usage | None = None,
        owed: Usage | None = None,
        verdict: ResponseVerdict | None = None,
        kept: list[bool] | None = None,
    ) -> Outcome:
        """`_decide`, on a task of its own once its answer's candidate is being recorded: a
        call cancelled from then on (a caller's timeout) leaves the answer to be judged and
        ended all the same, not pending, so the message sent again with its key meets that
        verdict, neither waiting for the candidate to be taken for dead nor judging it again.
        Cancelled before, nothing is recorded, as before. A runtime's `close` stops it."""
        recording: list[bool] = []

        def decide() -> Coroutine[Any, Any, Outcome]:
            return self._decide(
                session_id,
                request,
                reply,
                wanted,
                principal,
                recovered=recovered,
                mark=mark,
                usage=usage,
                owed=owed,
                verdict=verdict,
                kept=kept,
                recording=recording,
            )

        if recovered is not None:
            return await decide()
        return await past_cancel(self, decide, recording)

    async def _decide(
        self,
        session_id: str,
        request: InputRequest,
        reply: _Reply,
        wanted: dict[str, Any],
        principal: Principal | None,
        *,
        recovered: str | None = None,
        mark: Keyed | None = None,
        usage: Usage | None = None,
        owed: Usage | None = None,
        verdict: ResponseVerdict | None = None,
        kept: list[bool] | None = None,
        recording: list[bool],
    ) -> Outcome:
        """Settle an approval that has a response policy or a quorum, recording its candidacy.

        `recovered` names a candidate recorded earlier whose evaluation never finished (its
        process died): it is evaluated again without being recorded again. Either way the
        candidate is ended only if it is still pending then. If another process ended it
        meanwhile (judging it again, as this one stalled past the policy's timeout and
        `RECOVERY_GRACE`), nothing is recorded: a candidate judged again raises
        `_EndedElsewhere`, the answer's own call returns (or raises) what was recorded (`_told`).
        `mark` is the idempotency key of the message that gave the answer: its vote or its
        settlement records the key too, so the message repeated with it is not taken again (one
        refused, or closed under it by a deadline, is not taken: `send` delivers it anew; one
        whose key another message took meanwhile is spent: `IdempotencyKeyReused`). Its pending
        candidate holds the key aside (`message_idem`, which no other message may take), for the
        process that judges it again if this one dies (`_recover`), or for the commit that
        closes its request meanwhile (`closing_ends`). An answer that changed nothing (its
        sender's vote counted before, its request settled with it meanwhile) is taken all the
        same: the end of its candidate records the key, in a recovery or when `kept` is given,
        which is then told (True appended), as it is when such an end recorded elsewhere did.
        `usage` is what reviewing the answer's edit cost: the first event it records counts it;
        `owed` what reviews of the call's answers after it cost, counted with the session's
        expiry if its TTL passed first (the call ends there); `verdict` the response policy's,
        judged already (before the edit's check), not again.
        `recording` is given True once the answer's candidate is about to be committed.
        """
        rid = request.id
        cid = recovered or new_id("cand")
        gone: list[bool] = []
        closed: list[bool] = []  # no process ended it: its request closed under it (`_told`)
        state = await self._state(session_id)
        tool = self.agent(state.agent).tools.get(request.tool_name or "")
        evaluated = tool is not None and tool.response_policy is not None

        def ours(st: SessionState) -> bool:
            """Whether the candidate is there to end in `st`: still pending, or dropped when its
            request closed with its end recorded by no one (`closed`). Read in the commit's own
            state, this costs nothing when no other process touched it."""
            live = st.requests.get(rid)
            shut = live is None or live.status != "pending"
            mine = not evaluated or cid in st.candidates or (bool(closed) and shut)
            gone[:] = [] if mine else [True]
            return mine

        async def end(
            build: Callable[[SessionState], Any], durable: bool = False
        ) -> Outcome | None:
            """Record `build`, which ends the candidate: None if it did, else what ended it."""
            await self._append(session_id, build, durable=durable, turn_id=tid)
            if gone and recovered is None:
                told = await self._told(session_id, request, cid, after, wanted, kept)
                if told is not None:
                    return told
                closed.append(True)  # its request closed under it: its end is recorded here
                await self._append(session_id, build, durable=durable, turn_id=tid)
                if gone:
                    raise StoreError(
                        f"session {session_id!r} is damaged: response {cid} to request {rid} "
                        "is no longer pending in its log, which records no end of it"
                    )
            if gone:
                raise _EndedElsewhere(cid)
            if keyed and kept is not None:
                kept.append(True)
            return None

        by = None if principal is None else principal.model_dump()
        base = _base(request, cid, wanted["decision"], by)
        key = {} if mark is None else key_fields(mark)
        tid = request.turn_id
        after = 0  # the seq of the candidate this call records: its end is looked for after it
        keep = mark is not None and (recovered is not None or kept is not None)
        keyed: list[bool] = []  # the end recorded keeps the key of an answer that changed nothing

        def taken(st: SessionState, ended: dict[str, Any]) -> dict[str, Any]:
            """`ended`, the end of an answer that changed nothing, with its message's key if it
            is to keep it here (`keep`, `keyable`)."""
            if not (keep and mark is not None and keyable(st, request, mark[0], tid)):
                return ended
            keyed[:] = [True]
            return {**ended, **key}

        lapsed: list[bool] = []  # the session's TTL passed first: its expiry is recorded
        later = billing(owed)  # with that expiry: the call's later answers record none
        live = state.requests.get(rid)
        if (
            evaluated
            and recovered is None
            and wanted["decision"] == "approve"
            and request.approvers > 1
            and live is not None
            and live.status == "pending"
            and _sent(state, mark)
        ):
            # The message was taken before (a retry through a subagent's mirror, whose parent
            # records no vote): its vote counted then, which `voted` misses where one person
            # may vote twice.
            return already_counted(live.request)
        if tool is not None and tool.response_policy is not None:
            # Record the response first (all of it), so slow policy work cannot lose it.
            pending = {
                **base,
                "outcome": "pending",
                "text": reply.text,
                "value": wanted["value"],
                "edited_input": reply.edited_input,
                **edit_review(wanted),
                **({} if mark is None else key_fields(mark, "message_idem")),
            }
            if recovered is None:
                proposed = await self._proposed(
                    state,
                    tool,
                    request,
                    wanted,
                    principal,
                    pending,
                    usage,
                    later,
                    verdict,
                    recording,
                )
                if isinstance(proposed, Outcome):
                    return proposed
                verdict, after = proposed
            verdict = verdict or await self._judged(state, tool, request, wanted, principal)
            if verdict.outcome != "allowed":
                reason = verdict.reason
                refusal = {**base, "outcome": verdict.outcome, "reason": reason}
                held = await self._held_now(state)

                def refuse(st: SessionState) -> Any:
                    lapsed.clear()
                    if not ours(st):
                        return []
                    expiry = lapse(st, self.now(), held, [*_expired_end(base, rid), *later])
                    if expiry is None:
                        return _ending(st, rid, refusal)
                    lapsed.append(True)  # a refusal is activity too: it would revive it
                    return expiry

                told = await end(refuse)
                if told is not None:
                    return told
                if lapsed:
                    raise SessionExpired(session_id, [rid])
                return Outcome(
                    request_id=rid, outcome=verdict.outcome, applied=False, reason=reason
                )
        elif request.approvers <= 1 and not request.exclude_requester:
            authorize(request, principal)
        outcome: list[Outcome] = []
        refused: list[AnswerError] = []
        late: list[InputRequest] = []
        moved: list[str | None] = []  # the group it was escalated to while the policy judged it
        reused: list[bool] = []  # its key was taken by another message meanwhile

        def settle_or_count(st: SessionState) -> Batch:
            late.clear()
            moved.clear()
            lapsed.clear()
            keyed.clear()
            reused.clear()
            if not ours(st):
                return Batch(specs=[])
            live = st.requests.get(rid)
            if live is None or live.status != "pending":
                refused.clear()
                try:
                    outcome.append(
                        _repeat(
                            request,
                            live.status if live else "withdrawn",
                            live.resolution if live else None,
                            wanted,
                        )
                    )
                except AnswerError as exc:
                    refused.append(exc)
                if not evaluated:
                    return Batch(specs=[])
                # Its pending candidate ends too: the request closed while the policy ran.
                why = f"request {rid} was closed before this response could settle it"
                stale = {**base, "outcome": "stale", "reason": why}
                if not refused:  # settled with this answer meanwhile: taken all the same
                    stale = taken(st, stale)
                return Batch(specs=[("approval.candidate", stale)])
            current = live.request
            now = self.now()
            # The session's TTL passed while the response was decided: it wins too, recorded
            # with what reviews cost (a candidate recorded its answer's own).
            ended = [*_expired_end(base, rid), *later] if evaluated else billing(usage, owed)
            expiry = lapse(st, now, held, ended)
            if expiry is not None:
                lapsed.append(True)
                return expiry
            due = due_batch(st, now) if is_due(current, now) else None
            if due is not None:
                # Its deadline passed while the response was decided (a slow policy): the
                # deadline wins, as it would have had anyone looked, and this answer is spent.
                late.append(current)
                spent = {**base, "outcome": "stale", "reason": f"{LATE} (request {rid})"}
                first = [("approval.candidate", spent)] if evaluated else billing(usage)
                # The call ends here (`late`) unless the deadline escalates the request.
                ends = current.on_timeout != "escalate" or current.escalated_to is not None
                return Batch(
                    specs=[*first, *due.specs, *(later if ends else [])],
                    resolve=due.resolve,
                    updated_requests=due.updated_requests,
                )
            if evaluated and current.escalated_to != request.escalated_to:
                # Another process (a sweep) recorded its deadline's escalation while the policy
                # judged the request as it stood before: the deadline won there, as it would
                # have here (`late`), and this answer is spent, the request open to the group.
                moved.append(current.escalated_to)
                spent = {**base, "outcome": "stale", "reason": f"{LATE} (request {rid})"}
                return Batch(specs=[("approval.candidate", spent)])
            if mark is not None and taken_by_another(st.keys, mark):
                # Another message took its key while it was judged (a process of an older
                # signoff let it through): the key stays that message's, and this answer is
                # spent, as its call would have been refused before it was judged.
                reused.append(True)
                spent = {**base, "outcome": "stale", "reason": REUSED}
                return Batch(specs=[("approval.candidate", spent)] if evaluated else [])
            me = None if principal is None else principal.principal_id
            voted_in: list[InputRequest] = []
            if wanted["decision"] == "approve" and current.approvers > 1:
                if voted(current, principal) or _sent(st, mark):
                    again = already_counted(current)
                    outcome.append(again)
                    if not evaluated:
                        return Batch(specs=[])
                    # Its pending candidate ends here, lest every later drive judge it again.
                    spent = {**base, "outcome": "stale", "reason": again.reason}
                    return Batch(specs=[("approval.candidate", taken(st, spent))])
                votes = [*current.approved_by, str(me)]
                if len(votes) < current.approvers:
                    progressed = current.model_copy(update={"approved_by": votes})
                    outcome.append(
                        Outcome(
                            request_id=rid,
                            outcome="counted",
                            applied=True,
                            reason=progressed.progress,
                        )
                    )
                    counted = {
                        **base,
                        **key,
                        "outcome": "counted",
                        "votes": len(votes),
                        "needed": current.approvers,
                    }
                    if not evaluated:  # else its pending candidate recorded the answer
                        counted.update(
                            text=reply.text,
                            value=wanted["value"],
                            edited_input=reply.edited_input,
                        )
                    return Batch(
                        specs=[("approval.candidate", counted), _waiting(st)],
                        updated_requests=[progressed],
                    )
                wanted["approved_by"] = votes
                # The request holds its quorum's votes, the last one too, as its resolution
                # does: else its row read one short once settled ("1 of 2").
                voted_in = [current.model_copy(update={"approved_by": votes})]
            resolution = {**wanted, "by": by}
            outcome.append(Outcome(request_id=rid, outcome=wanted["outcome"], applied=True))
            settled = _settlement_events(current, reply, resolution)
            if not evaluated:  # else its pending candidate counted it
                settled = with_usage(settled, usage)
            if key:
                settled[0] = (settled[0][0], {**settled[0][1], **key})
            return Batch(
                specs=_naming(settled, cid) if evaluated else settled,
                resolve=[
                    Resolve(
                        request_id=rid,
                        status="settled",
                        outcome=wanted["outcome"],
                        resolution=resolution,
                    )
                ],
                updated_requests=voted_in,
            )

        if evaluated and state.parent is not None:
            # Its parent's TTL passed while the policy judged it (its expiry cancels this turn,
            # whose answer then finds its request withdrawn): the parent lives on otherwise.
            await self._orphaned(await self._state(session_id))
        held = await self._held_now(state)
        told = await end(settle_or_count, durable=True)
        if told is not None:
            return told
        if lapsed:
            raise SessionExpired(session_id, [rid])
        if reused:
            if recovered is None:
                raise key_reused(session_id)
            return Outcome(request_id=rid, outcome="stale", applied=False, reason=REUSED)
        why = f"{LATE} (request {rid})"
        if late and late[-1].on_timeout == "escalate" and late[-1].escalated_to is None:
            moved.append(late[-1].escalate_to)
        if moved:
            return Outcome(
                request_id=rid,
                outcome="stale",
                applied=False,
                reason=f"{why}; it was escalated to {moved[-1]!r}",
            )
        if late:
            # A deadline that approved it ran the call: it did not merely expire.
            ran = approved_on_timeout(late[-1], "expired", late[-1].on_timeout)
            ended = AUTO_APPROVED if ran else "expired"
            raise RequestClosed(f"request {rid} {ended}: {why}", [rid])
        if refused:
            raise refused[-1]
        return outcome[-1]

    async def _proposed(
        self,
        state: SessionState,
        tool: Tool,
        request: InputRequest,
        wanted: dict[str, Any],
        principal: Principal | None,
        pending: dict[str, Any],
        usage: Usage | None,
        later: list[EventSpec],
        verdict: ResponseVerdict | None,
        recording: list[bool],
    ) -> Outcome | tuple[ResponseVerdict | None, int]:
        """Record the answer's candidate (`pending`), unless the response policy refused the same
        person's same decision before with the verdict it gives now: the trail records a refusal
        once (clicked a thousand times, it would grow the log a thousand times), so that one is
        returned, recording nothing. A candidate of the same answer being judged meanwhile (by
        another call or process) is waited for, not judged beside it; one whose process died
        is judged again first (`_recover`), so its refusal is the one recorded. Returns the
        verdict given or judged here (None if neither) and the seq of the candidate recorded. An
        answer whose edit review cost usage is always recorded (its usage must be billed): past
        the session's TTL too, spent (`stale`) with the expiry (and `later`: `_decide`'s), and
        `SessionExpired` raised.
        `recording` holds True while the candidate is being committed, and once it is."""
        sid, tid, rid = state.id, request.turn_id, request.id
        once = Refusals(self.store, state, request, pending["by"], wanted["decision"])
        mark = mark_of(pending, "message_idem")
        lost_after = tool.response_timeout + RECOVERY_GRACE

        guarded = [usage is None]
        held = [False]
        lapsed: list[bool] = []
        given = with_usage([("approval.candidate", pending)], usage)
        spent = _expired_end(
            _base(request, pending["candidate_id"], pending["decision"], pending["by"]), rid
        )

        def propose(st: SessionState) -> Any:
            # The session's TTL passed while the answer was checked (its edit): it is recorded
            # spent with the expiry, as its candidate alone is activity, which would revive it.
            expiry = lapse(st, self.now(), held[0], [*given, *spent, *later])
            lapsed[:] = [] if expiry is None else [True]
            if expiry is None:
                seen(st.keys, mark, sid, st.candidates)  # another message took its key meanwhile
                if guarded[0]:
                    once.guard(st, self.now(), lost_after)
            recording[:] = [True]
            return given if expiry is None else expiry

        async def record() -> int:
            held[0] = await self._held_now(state)
            recorded = await self._append(sid, propose, durable=True, turn_id=tid)
            if lapsed:
                raise SessionExpired(sid, [rid])
            return recorded[0].seq

        for _ in range(20 if guarded[0] else 0):
            await once.read()
            if once.refused:
                verdict = verdict or await self._judged(state, tool, request, wanted, principal)
                outcome, reason = verdict.outcome, verdict.reason
                if (outcome, reason) in once.refused:
                    return Outcome(request_id=rid, outcome=outcome, applied=False, reason=reason)
            try:
                seq = await record()
            except Moved:
                recording.clear()
                continue
            except (InFlight, Lost) as other:
                recording.clear()
                if isinstance(other, InFlight):
                    await once.ended(self.now, other.cid, other.at + lost_after)
                self._cache.pop(sid, None)
                state = await self._state(sid)
                if isinstance(other, Lost) and await self._recover(state):
                    # Its dead process's verdict, recorded now as a drive would, is read next.
                    state = await self._state(sid)
                closed = await self._closed_meanwhile(state, request, wanted, principal)
                if closed is not None:
                    return closed
                continue
            return verdict, seq
        guarded[0] = False  # so much contention: recorded as it is
        return verdict, await record()
