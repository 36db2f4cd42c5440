"""`Answering`: settling answers (edits; response policies and quorum through `Candidates`) and
follow-up messages."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from . import _mirrors
from ._agent import StandIn
from ._answer_refusals import AnswerRefusals
from ._answer_sizes import check_all_answered, check_bounds, check_count
from ._answers import Reply as _Reply
from ._answers import (
    check_asking_tools,
    check_decided,
    check_delegate_tools,
    check_principal,
    input_responses,
)
from ._answers import repeat as _repeat
from ._answers import resolution as _resolution
from ._answers import settlement_events as _settlement_events
from ._call_guards import closes_stop
from ._candidates import already_counted
from ._child_closes import open_mirrors, record_behind_mirrors
from ._counts import counted_answers, refused_only, settled_before_raising
from ._deadlines import after_deadline, due_batch, expiry_specs, in_time, is_due
from ._edit_checks import bills
from ._eligibility import (
    is_gated,
    voted,
)
from ._exceptions import (
    AnswerError,
    InvalidAnswer,
    RequestClosed,
    SessionExpired,
    StaleAnswer,
    StoreError,
    UnknownAgent,
    UnknownSession,
)
from ._idempotency import Keyed, key_fields
from ._key_commits import unclaimed
from ._mirrors import deciding
from ._recording import Answered, Batch, billing, runnable, with_usage
from ._response import ResponseVerdict
from ._results import GenerateResult, Outcome
from ._settings import flag
from ._state import SessionState
from ._subagents import delegate_tools
from ._tools import Tool
from ._types import MAX_ANSWERS, InputRequest, InputResponse, Principal, Usage
from .stores import Resolve

__all__ = ["MAX_ANSWERS", "Answering"]


class Answering(AnswerRefusals):
    """Answers by request id (`respond`) and by message (`send`), built on `SessionRunner`."""

    @closes_stop
    @_mirrors.following_mirrors
    async def respond(
        self,
        session_id: str,
        responses: Sequence[InputResponse | Mapping[str, Any]],
        *,
        principal: Principal | None = None,
        resume: bool = True,
    ) -> GenerateResult:
        """Answer one or more requests by id, then continue the turn if it can.

        An approval takes `option_id` `approve` or `cancel` (to deny; `text` is the reason), a
        question an option id or `text`. Decisions (`so.Decision`) go to `generate(approvals=)`.
        """
        principal = check_principal(principal, "principal")
        flag("resume", resume)
        await self.open()
        answers = [
            _Reply(r.request_id, r.option_id, r.text, r.value, r.edited_input, r.input_hash)
            for r in input_responses(responses)
        ]
        judged: list[SessionState] = []
        turns: list[Answered] = []
        if not resume:
            outcomes = await self._settle(
                session_id,
                answers,
                principal,
                require_all=False,
                drive_expired=False,
                judged=judged,
            )
            state = judged[0] if judged else await self._state(session_id)
            return self._result(state, outcomes)
        async with self._own_turn(session_id):
            outcomes = await self._settle(
                session_id, answers, principal, require_all=False, judged=judged, turns=turns
            )
            went_to = turns[0] if turns else None
            return await self._go_on(session_id, outcomes, judged, answered=went_to)

    async def _go_on(
        self,
        session_id: str,
        outcomes: Sequence[Outcome],
        judged: Sequence[SessionState],
        *,
        retry: bool = False,
        answered: Answered | None = None,
    ) -> GenerateResult:
        """Continue the turn after answers were settled; answers that only repeated earlier
        ones (`judged`: the state they were judged on, which they left as it was) return that
        state if a drive of it would do nothing, without taking and giving back the lease.
        `answered`: the turn the answers went to, which the call is told once it is over, not
        the next person's turn its drive then runs (`ended_under`).
        Answers all refused by their outcome (a response policy's) settled nothing: the call
        drives only what is due anyway (`_refused_idle`)."""
        idle = await self._refused_idle(session_id, outcomes, retry=retry)
        if idle is not None:
            return self._result(idle, outcomes)
        if judged and self._nothing_to_drive(judged[0], retry=retry):
            return self._result(judged[0], outcomes)
        return await self._drive(session_id, outcomes=outcomes, retry=retry, answered=answered)

    async def _behind_mirrors(self, state: SessionState) -> bool:
        # A message's or prompt's: refused first, nothing recorded, where a passed deadline or
        # TTL due below is for another process to record (`_refuse_unrecordable`).
        await self._refuse_unrecordable(state, None, {state.id})
        return await record_behind_mirrors(self, state)

    async def _refuse_unrecordable(
        self, state: SessionState, lacking: tuple[str, str] | None, seen: set[str]
    ) -> None:
        """`UnknownAgent` if a subagent below the session's open mirrors has a passed deadline
        or TTL to record and this runtime lacks its agent, or the agent of a subagent in between
        (`lacking`: that agent and its session), which goes on once it is recorded: only a
        process with it can. Taking the mirror as open, a message would steer past a call the
        deadline approved (or queue behind an approval no longer there), and a prompt be
        refused as waiting on it; refused instead, as a deadline of the session's own is
        (`_checked(here=True)`). It only reads."""
        now = self.now()
        for mirror in open_mirrors(state):
            if mirror.child is None or mirror.child.session_id in seen:
                continue
            seen.add(mirror.child.session_id)
            try:
                kid = await self._state(mirror.child.session_id)
            except (UnknownSession, StoreError):
                continue  # gone, or unreadable: left as `record_behind_mirrors` leaves it
            missing = lacking or (None if kid.agent in self.agents else (kid.agent, kid.id))
            # A deadline that closes a request (deny, approve), not one that only escalates it:
            # that leaves it open, the mirror too, as before the deadline.
            closes = any(
                is_due(r, now) and after_deadline(r, now) is None for r in kid.pending_requests()
            )
            due = closes or (bool(expiry_specs(kid)) and await self._ended(kid, now) is not None)
            if missing is not None and due:
                raise UnknownAgent(
                    f"unknown agent {missing[0]!r}: a passed deadline or TTL in (or below) its "
                    f"subagent session {missing[1]!r} is for a process with that agent to "
                    "record and go on from; this runtime has: "
                    f"{', '.join(self.agents) or 'none'}"
                )
            await self._refuse_unrecordable(kid, missing, seen)

    async def _refused_idle(
        self, session_id: str, outcomes: Sequence[Outcome], *, retry: bool = False
    ) -> SessionState | None:
        """The session as it stands when answers were all refused by their outcome (a response
        policy's) and a drive would find nothing due but the mirrors it checks: the call then
        drives nothing, as one refused with an error (for a parent, that drive would close a
        mirror its subagent's closed request left open, running that turn on, in a refused
        call). None when a drive is due anyway: a deadline the call recorded, a verdict a dead
        process left, a turn runnable."""
        if not refused_only(outcomes):
            return None
        state = await self._state(session_id)
        return state if self._nothing_to_drive(state, retry=retry, mirrors=False) else None

    def _nothing_to_drive(self, state: SessionState, *, retry: bool, mirrors: bool = True) -> bool:
        """Whether a drive of `state` would record nothing: its turn waits on a person for a
        call (or is over), and nothing is due for it to finish first: a deadline or TTL passed,
        a verdict or mirror a dead process left (`_recover`), a subagent's parent to tell (both
        of these mirrors only if `mirrors`), a lease of this process's own to give back."""
        now = self.now()
        if runnable(state, retry=retry) or state.expired(now) or due_batch(state, now) is not None:
            return False
        # A subagent's drive tells its parent (closing its mirrors): nothing to tell of what a
        # refused answer (`mirrors` False) left as it was.
        if (mirrors and state.parent is not None) or state.candidates:
            return False
        if state.id in self._unreleased:
            return False
        if mirrors and any(r.child is not None for r in state.pending_requests()):
            return False
        turn = state.turn
        if turn is None or turn.status != "waiting":
            return True  # over, no message queued, or failed for good: not runnable
        statuses = {c.status for c in turn.calls.values()}
        return "proposed" not in statuses and bool(statuses & {"requested", "awaiting", "asking"})

    @counted_answers
    async def _settle(
        self,
        session_id: str,
        answers: Sequence[_Reply],
        principal: Principal | None,
        *,
        require_all: bool,
        extra: Sequence[Any] = (),
        check_only: bool = False,
        drive_expired: bool = True,
        mark: Keyed | None = None,
        only_approvals: bool = False,
        from_message: bool = False,
        judged: list[SessionState] | None = None,
        kept: list[bool] | None = None,
        turns: list[Answered] | None = None,
        review: bool = True,
    ) -> list[Outcome]:
        """Validate every answer, then review their edits (only once all are good: a review is
        then recorded or refuses by its own denial), then settle them all in one durable commit
        (or none); `check_only` raises what settling would raise and records nothing, and with
        `review` False makes no review (`_mirrors` checks every session's answers so first).
        An answer to a request whose deadline just passed continues the turn without it,
        unless not `drive_expired` (`respond(resume=False)`, which must not run the turn: a
        sweep or worker will).
        `mark` is the idempotency key of the message that gave the answers: the settlement's
        first event records it. `only_approvals`: the answers are decisions (approve or deny),
        which answer approvals only. `from_message`: the answer is a message's, which `send`
        delivers as a message if its request closed meanwhile (no refusal to count: `_counts`).
        `judged` is given the state the answers were judged on when settling recorded nothing
        (they only repeat earlier ones). `kept` is given True when `mark` was recorded with the
        end of an answer that changed nothing (`Candidates._candidate`). `turns` is given the
        turn the answers went to when they found it open (with who gave them)."""
        check_count(session_id, len(answers), require_all=require_all)
        ids = [a.request_id for a in answers]
        dupes = sorted(i for i, n in Counter(ids).items() if n > 1)
        if dupes:
            raise InvalidAnswer(
                f"request id(s) answered twice in one call: {', '.join(dupes)}", dupes
            )
        reviews: dict[str, Usage] = {}  # what reviewing each edit cost, tried again or not
        for _ in range(20):
            state = await self._checked_first(session_id, answers, principal)
            if await self._orphaned(state):
                continue  # its requests are withdrawn now: the answers are refused below
            # In docs/server.md's order: an unknown id, then who may not answer any request.
            known = await self._refuse_first(state, answers, principal)
            # Its turn goes on only where its agent is: refused next, nothing stored (an answer
            # to a mirror too, settled in the subagent's session before its parent is driven).
            agent = self.agent(state.agent)
            # And so only where its agent still has the delegate tool a mirror's call ran, or
            # the tool whose call asked a question, not told by an agent standing in for one
            # the process lacks (the command line's), whose tools are not the real one's.
            if not isinstance(agent.model, StandIn):
                asked = [reply for reply in answers if reply.request_id in state.requests]
                check_delegate_tools(state, delegate_tools(agent.tools), asked)
                check_asking_tools(state, agent.tools, asked)  # a question a body asked too
            if only_approvals:  # before routing: a mirror has the kind of the child's request
                for reply in answers:
                    live = state.requests.get(reply.request_id)
                    if live is not None and live.request.kind != "tool-approval":
                        check_decided(live.request)
            went_to = _answered_turn(state, answers, principal)
            if _mirrors.routed(state, answers):  # mirrored from a subagent: settle it there
                if turns is not None and went_to is not None and not check_only:
                    turns.append(went_to)
                return await _mirrors.settle_routed(
                    self,
                    state,
                    answers,
                    principal,
                    require_all=require_all,
                    check_only=check_only,
                    drive=drive_expired,
                    mark=mark,
                    review=review,
                )
            outcomes: list[Outcome] = []
            specs: list[Any] = []
            resolves: list[Resolve] = []
            gated: list[tuple[InputRequest, _Reply, dict[str, Any]]] = []
            settling: list[tuple[InputRequest, _Reply, dict[str, Any]]] = []
            edits: list[tuple[Tool, InputRequest, dict[str, Any], bool]] = []  # to review
            verdicts: dict[str, ResponseVerdict] = {}  # the response policy's, on edits
            turn_id = None
            refused_open = False  # an open request's answer its policy refused before its fault
            for reply, request, status, resolution in known:
                rid = reply.request_id
                live = state.requests.get(rid)
                tool = agent.tools.get(request.tool_name or "")
                if only_approvals:
                    check_decided(request)
                try:
                    wanted = _resolution(request, reply, tool)
                    if status == "pending":
                        check_bounds(request, tool, wanted, agent.limits)
                except (InvalidAnswer, StaleAnswer):
                    # A response policy's refusal comes first, not the fault: judged on the
                    # answer's decision alone, as neither its edit nor its hash is sound.
                    refused = None
                    if reply.option_id in ("approve", "cancel"):  # else it names no decision
                        bare = {"decision": reply.option_id}
                        refused = await self._policy_refusal(state, request, bare, principal)
                    if refused is None:
                        raise
                    outcomes.append(refused)
                    refused_open |= status == "pending"  # as a sound answer's refusal is
                    continue
                if status != "pending" and live is not None and request.kind == "tool-approval":
                    # The stored resolution holds the edited input the fold leaves out.
                    stored = await self.store.get_request(rid)
                    if stored is not None and stored.resolution is not None:
                        resolution = stored.resolution
                if status != "pending":
                    # Who could not have answered it open is refused as then, not told how (or
                    # whether) it was settled.
                    verdict = await self._policy_refusal(state, request, wanted, principal)
                    if verdict is not None:
                        outcomes.append(verdict)
                        continue
                    try:
                        outcomes.append(_repeat(request, status, resolution, wanted))
                    except RequestClosed:
                        if (
                            status == "expired"
                            and runnable(state)
                            and drive_expired
                            and not check_only
                        ):
                            # Its deadline closed it just now: the turn goes on without it.
                            await self._drive(session_id)
                        raise
                    continue
                gate = is_gated(request, tool)
                edited = tool if wanted.get("edited_input") is not None else None
                if gate and wanted["decision"] == "approve" and voted(request, principal):
                    # Counted already: a no-op, as without a response policy, which need not
                    # judge it again (nor a candidate be recorded, to be closed at once).
                    outcomes.append(already_counted(request))
                    continue
                if edited is not None:
                    edits.append((edited, request, wanted, gate))
                if gate:
                    gated.append((request, reply, wanted))
                    continue
                wanted["by"] = None if principal is None else principal.model_dump()
                settling.append((request, reply, wanted))
                outcomes.append(Outcome(request_id=rid, outcome=wanted["outcome"], applied=True))
                turn_id = request.turn_id
            if require_all and (settling or gated or refused_open):  # one only repeating: no-op
                check_all_answered(state, ids)
            if check_only and not review:
                return []
            # Every answer is good by now: a review made below is recorded with its answer, or
            # refuses the call by its own denial (not billed for an answer refused after it).
            # The edits no review bills first: one their policy denies refuses the call before
            # any billed review runs, whose cost a refusal would leave uncounted.
            for tool, request, wanted, gate in sorted(edits, key=lambda e: bills(e[0])):
                judge = gate and tool.response_policy is not None
                early = await self._review_edit(
                    state, tool, request, wanted, principal, judge, reviews, check_only
                )
                if early is not None:
                    verdicts[request.id] = early
            if check_only:
                if _mirrors.REVIEWED.get() is not None:  # billed now: see `_reviewed_edit`
                    await self._bill(state, billing(*reviews.values()))
                return []
            for request, reply, wanted in settling:
                rid = request.id
                specs.extend(
                    with_usage(_settlement_events(request, reply, wanted), reviews.get(rid))
                )
                resolves.append(
                    Resolve(
                        request_id=rid,
                        status="settled",
                        outcome=wanted["outcome"],
                        resolution=wanted,
                    )
                )
            if resolves:
                if mark is not None:
                    kind, data = specs[0]
                    specs[0] = (kind, {**data, **key_fields(mark)})
                late: list[str] = []
                batch = Batch(specs=[*specs, *extra], resolve=resolves)
                held = await self._held_past_ttl(state)
                driver = self._driver(state, None)
                owed = _spent(reviews, gated)
                try:
                    await driver.record(
                        unclaimed(in_time(self.now, batch, late, held, owed), mark, session_id),
                        durable=True,
                        turn_id=turn_id,
                    )
                except RequestClosed:
                    self._cache.pop(session_id, None)
                    await self._rows_agree(session_id, driver.state.seq, resolves)
                    continue  # someone settled first: re-read and report no-op or conflict
                except Exception:
                    self._cache.pop(session_id, None)
                    raise
                self._remember(driver.state)
                if late:
                    reviews.clear()  # billed with what closed their requests
                    if driver.state.expired(self.now()):
                        raise SessionExpired(session_id, late)
                    continue  # read again: the closed request refuses its answer, the turn goes on
            for i, (request, reply, wanted) in enumerate(gated):
                key = mark if i == 0 and not resolves else None  # one event records the key
                try:
                    outcome = await self._candidate(
                        session_id,
                        request,
                        reply,
                        wanted,
                        principal,
                        mark=key,
                        usage=reviews.get(request.id),
                        owed=_spent(reviews, gated[i + 1 :]),
                        verdict=verdicts.get(request.id),
                        kept=None if key is None else kept,
                    )
                except BaseException as exc:
                    settled_before_raising(outcomes)  # the batch's, and the gated ones' before
                    # Its deadline closed it just now, or another process answered it (with
                    # `resume=False`, say): the turn goes on without it, as nothing else drives it.
                    if not isinstance(exc, AnswerError):
                        raise
                    if drive_expired and runnable(await self._state(session_id)):
                        await self._drive(session_id)
                    raise
                outcomes.append(outcome)
            if judged is not None and not (resolves or gated):
                judged.append(state)
            if turns is not None and went_to is not None:
                turns.append(went_to)
            return outcomes
        raise RequestClosed(f"could not settle in session {session_id!r}: too much contention", ids)

    async def _rows_agree(self, session_id: str, seq: int, resolves: Sequence[Resolve]) -> None:
        """After a settlement found a request's row no longer pending: someone settling first
        also appended to the log, so a log still at `seq` that holds the request pending means
        its row was changed behind the runtime's back, which no retry can get past."""
        state = await self._state(session_id)
        if state.seq != seq:
            return
        ids = [r.request_id for r in resolves if _pending(state, r.request_id)]
        if ids:
            raise StoreError(
                f"session {session_id!r} is damaged: request(s) {', '.join(ids)} are pending in "
                "its log, but their rows in the store are not (or are gone)"
            )

    async def _bare_verdict(
        self, session_id: str, request_id: str, decision: str, principal: Principal | None
    ) -> GenerateResult | None:
        """What `respond` returns to an answer of `decision` whose edit could not be read (a
        dashboard form's) if the response policy refuses it, judged on the decision alone as
        `_settle` judges an unsound answer, after what is refused first; None if it would not
        (the edit's fault is told). Records nothing but a passed deadline or TTL."""
        reply = _Reply(request_id, decision, None, None, None, None)
        with self._counts.refusing():
            state = await self._checked_first(session_id, [reply], principal)
            ((_, request, *_),) = await self._refuse_first(state, [reply], principal)
            verdict = await self._policy_refusal(state, request, {"decision": decision}, principal)
        if verdict is None:
            return None
        self._counts.answered([verdict])
        return self._result(state, [verdict])

    async def _policy_refusal(
        self,
        state: SessionState,
        request: InputRequest,
        wanted: dict[str, Any],
        principal: Principal | None,
    ) -> Outcome | None:
        """The response policy's verdict on `principal`'s answer `wanted` to `request`, closed or
        unable to settle it (judged on its decision alone), who may answer it by the other rules
        (`_may_not_answer`), returned as it would have been recorded for a sound answer to it
        open, but not recorded; None if they could have answered it. A mirror is judged on the
        subagent's request it stood for, under the subagent's tool and state, once for all the
        passes of settling mirrored answers (`_mirrors.judged_once`)."""
        decided = await deciding(self.store, request)
        agent = self.agents.get(decided.agent)
        tool = None if agent is None else agent.tools.get(decided.tool_name or "")
        if decided.kind != "tool-approval" or tool is None or tool.response_policy is None:
            return None
        verdict = await _mirrors.judged_once(self, state, tool, decided, wanted, principal)
        if verdict.outcome == "allowed":
            return None
        return Outcome(
            request_id=request.id, outcome=verdict.outcome, applied=False, reason=verdict.reason
        )


def _spent(reviews: Mapping[str, Usage], answers: Sequence[tuple[InputRequest, Any, Any]]) -> Usage:
    """What reviewing the edits of `answers` (each a request first) cost."""
    return sum((reviews[r.id] for r, *_ in answers if r.id in reviews), Usage())


def _pending(state: SessionState, request_id: str) -> bool:
    live = state.requests.get(request_id)
    return live is not None and live.status == "pending"


def _answered_turn(
    state: SessionState, answers: Sequence[_Reply], principal: Principal | None
) -> Answered | None:
    """The session's turn, if an answer goes to an open request of it (a mirror's too): what
    the call is told once that turn is over (`ended_under`)."""
    turn = state.turn
    if turn is None:
        return None
    for a in answers:
        live = state.requests.get(a.request_id)
        if live is not None and live.status == "pending" and live.request.turn_id == turn.id:
            return Answered(turn.id, turn.first_seq, principal)
    return None
