"""Follow-up messages (`Runtime.send`): a message answers the first open request when it names
one of its options or the request takes free text; otherwise it steers the turn or waits for
its end. Built on `Answering`, which settles what a message answers."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, NamedTuple

from ._answers import Reply, check_principal, check_unambiguous, names_several
from ._answers import check_text as _check_text
from ._answers import match as _match
from ._budgets import stopped_at_limit
from ._call_guards import closes_stop
from ._cancellation import stop_calls
from ._candidates import RECOVERY_GRACE
from ._counts import refused_only
from ._dropped_keys import sent_before
from ._eligibility import check_policy_present
from ._exceptions import (
    ConflictingAnswer,
    NotAllowed,
    PartialAnswer,
    RequestClosed,
    SessionBusy,
    SessionExpired,
    UnknownSession,
    UsageError,
)
from ._idempotency import (
    Before,
    Keyed,
    before,
    free_for,
    keyed,
    seen,
)
from ._key_commits import unchanged
from ._key_forms import as_recorded, held_as, looked_for
from ._message_places import InTurn, Went, queued_last
from ._message_results import MessageResults
from ._mirror_keys import keep_late, keep_vote_key, keeping, mirrored_keys, voted_through
from ._mirrors import following_mirrors, named_as_answered
from ._recording import Answered, Changed, EventSpec, TurnStopped
from ._refusals import wait_ended
from ._response import DEFAULT_RESPONSE_TIMEOUT
from ._results import GenerateResult
from ._state import SessionState, runnable, turn_over, waits_for_retry
from ._text import NOTHING_SAID, is_blank
from ._tools import Tool
from ._types import InputRequest, Principal
from .stores import Resolve

__all__ = ["Messages", "first_open"]


def first_open(pending: list[InputRequest]) -> InputRequest | None:
    """The open request a follow-up message answers, if it answers one: a session-limit prompt
    if one is open, else the request asked first."""
    return sorted(pending, key=lambda r: r.kind != "session-limit")[0] if pending else None


class Messages(MessageResults):
    """`MessageResults` plus the follow-up messages that answer, steer or queue."""

    @closes_stop
    @following_mirrors
    async def send(
        self,
        session_id: str,
        message: str,
        *,
        principal: Principal | None = None,
        turn_policy: Literal["steer", "queue"] = "steer",
        idempotency_key: str | None = None,
    ) -> GenerateResult:
        """Send a message to a session, as a person typing into the conversation would.

        It answers the first open request when it names one of its options (id, label or
        1-based index) or the request takes free text; naming two of them is `InvalidAnswer`,
        which says how to name each. One whose request another answer closed meanwhile is
        delivered anew, but never as the answer to a request opened after it arrived (a
        subagent's next question, once that answer let it go on). Otherwise, with `steer` (the
        default), open approvals are ignored, open questions withdrawn and the model reads the
        message; with `queue` it waits for the end of the turn, unless the turn is held on an
        approval. A turn whose person answered `stop` to a spent budget, not yet ended (no drive
        went on with it since), ends before its model reads anything: a `steer` message waits
        for that end too and starts the next turn. An approval whose deadline (or a
        subagent's, behind a mirror) closed it before the message came holds nothing: the turn
        that deadline resumed is driven on (by this call, inline, unless a live drive holds
        it), with a `queue` message (or someone else's) behind it, a `steer` one read in it; a
        subagent's this runtime lacks the agent to record is `UnknownAgent`, nothing recorded.
        A message from someone other than the person the turn serves waits for the turn's end.
        A turn that failed in a way a retry can resume has not ended: such a message, and a
        `queue` one, waits for the retry to finish it (or a cancel); only a `steer` message from
        the person it serves starts the next turn past it.
        A deny its sender may not give (four eyes excludes the requester) steers as well; an
        approve they may not give is `NotAllowed`.
        To a subagent whose parent, or a session above that, passed its TTL with its turn
        unfinished, a message answering no request open there is `SubagentOrphaned`, nothing
        recorded: its conversation is over.
        A message that answers nothing returns its own turn (the one it started or steered, or
        that took it from the queue), as the drive left it, not one the drive went on to; while
        it still waits in the queue, the turn it waits behind (`queued`).
        With an `idempotency_key`, a message sent again with the same key (by the same
        `principal`) is not delivered again: the call returns the turn the message went to, as
        it stands (`replayed`, see `_replay`), or raises `IdempotencyKeyReused` if the key came
        with another message or `turn_policy`. While a response policy judges the answer its
        message gave, the message sent again waits for that verdict.
        """
        principal = check_principal(principal, "principal")
        await self.open()
        if not isinstance(message, str):
            raise UsageError(f"send() needs a message: a string, not {type(message).__name__}")
        _check_text(message, "the message")  # first: a lone surrogate is invalid, not blank
        if is_blank(message):
            raise UsageError(NOTHING_SAID.format(what="the message"))
        if turn_policy not in ("steer", "queue"):
            raise UsageError(f"turn_policy must be 'steer' or 'queue', not {turn_policy!r}")
        # `steer` keys as `generate` continuing a session does (and as keys did before the
        # policy was part of them); `queue` is another call.
        policy = () if turn_policy == "steer" else (turn_policy,)
        idem = keyed(idempotency_key, principal, "message", message, *policy)
        older = before(idempotency_key, principal, "message", message, *policy)
        async with self._own_turn(session_id):
            return await self._deliver(session_id, message, principal, turn_policy, idem, older)

    async def _deliver(
        self,
        session_id: str,
        message: str,
        principal: Principal | None,
        turn_policy: Literal["steer", "queue"],
        idem: Keyed | None,
        older: Before | None,
    ) -> GenerateResult:
        """`send`, its message checked: answer, start a turn, steer or queue, and drive. Its
        key is taken in the form the session recorded it in (`older`: `as_recorded`)."""
        asked: set[str] | None = None  # the requests open when the message arrived
        waited: set[str] = set()  # the candidates of its answer judged meanwhile, waited for
        verdict: _Judged | None = None  # the last of them
        woke: list[bool] = []  # given True once this call recorded passed deadlines
        for _ in range(20):
            try:
                state = await self._checked(session_id, applied=woke, here=True)
            except SessionExpired:  # its TTL passed: a repeat of a message sent before replays
                state = await self._state(session_id)
                idem = await as_recorded(self, state, idem, principal, older)
                before_here: list[Went] = []  # where it went, its key pushed out of the state
                if not await sent_before(
                    self.store, state, idem, older, principal, went=before_here
                ):
                    raise
                return await self._replay(session_id, idem, *before_here)
            idem = await as_recorded(self, state, idem, principal, older)
            key = {} if idem is None else {"idem": list(idem)}
            if asked is None:
                asked = {r.id for r in state.pending_requests()}
            forms = looked_for(idem, principal, older)
            before_here = []
            if await sent_before(self.store, state, idem, older, principal, went=before_here):
                return await self._replay(session_id, idem, *before_here)
            # Any other delivery goes on with the session's turn, only where its agent is: it is
            # refused first, nothing stored (an answer to a mirror too: see `_settle`).
            self.agent(state.agent)
            # A subagent whose conversation a passed TTL above it ended takes no message, but
            # for an answer to a request still open there (of a turn of its own).
            if state.parent is not None:
                if await self._answering(state, message, principal) is None:
                    await self._refuse_lapsed_tree(state)
            # Its subagents' passed deadlines too, as its own: a mirror they closed holds the
            # turn no more, whoever looked first (a listing records and drives them as well);
            # refused as for its own (`UnknownAgent`) where this runtime lacks their agent.
            if await self._behind_mirrors(state):
                woke.append(True)
                continue
            voted = await self._voted_behind(state, forms, principal)
            if voted is not None:
                return await self._replay(session_id, voted)
            judging = await self._judging(state, forms)
            if judging is None and verdict is not None:
                # Refused (or its policy timed out): judged again only where this runtime can,
                # never delivered as another message; allowed meanwhile, it is replayed; its
                # request closed by another answer meanwhile, it goes on as any message does.
                if idem is not None and await self._taken(session_id, verdict.way[0], idem):
                    return await self._replay(session_id, idem)
                if await self._still_open(verdict):
                    self._judges(verdict)
                verdict = None
            if judging is not None and judging.cid not in waited:
                # Its answer, given by this call sent before, is being judged: its verdict is
                # waited for, then replayed (or the message delivered anew if it was refused).
                waited.add(judging.cid)
                verdict = judging
                await self._verdict(judging)
                continue
            if judging is not None:
                # Still judged past its time (its process died): this message is that answer,
                # judged again below where this runtime can, and never delivered as another.
                self._judges(judging)
            turn = state.turn
            # A turn a retry can resume has not ended: only a `steer` message from the person
            # it serves starts the next turn past it; any other waits, as on a running turn.
            held = waits_for_retry(
                turn, principal, queue=turn_policy == "queue"
            ) and not await self._retry_refused(session_id)
            if turn is None or (turn.status in ("completed", "failed", "cancelled") and not held):
                if judging is not None:
                    raise _still_judged(session_id, judging)
                if state.queued and turn is not None and turn_over(turn):
                    # Messages that waited for the turn's end go first: this one queues too
                    # (a drive or a worker starts the first of them).
                    who = None if principal is None else principal.model_dump()
                    data = {"message": message, "principal": who, "policy": turn_policy, **key}
                    driver = self._driver(state, None)
                    try:
                        await driver.record(
                            unchanged(state, [("turn.message", {**data, "queued": True})]),
                            turn_id=turn.id,
                        )
                    except Changed:
                        continue  # a turn started or ended meanwhile: decide again
                    except Exception:
                        self._cache.pop(session_id, None)
                        raise
                    self._remember(driver.state)
                    return await self._drive_after(session_id, queued_last(driver.state))
                went: list[Went] = []  # the turn it started, or its place in the queue
                try:
                    started = await self._start_turn(
                        session_id,
                        message,
                        principal,
                        idem=idem,
                        queue=turn_policy == "queue",
                        went=went,
                    )
                    if not started:
                        return await self._replay(session_id, idem, *went)
                except (SessionBusy, PartialAnswer):
                    # PartialAnswer: the turn another message started first waits on a request.
                    now = (await self._state(session_id)).turn
                    if now is not None and (turn is None or now.id != turn.id):
                        continue  # another message started a turn first: steer or queue on it
                    raise
                # The turn is this message's, or, behind messages a turn a retry could resume
                # left waiting, it may be queued too.
                return await self._drive_after(session_id, went[0])
            pending = state.pending_requests()
            serves = turn.principal
            same_person = serves is None or (principal is not None and principal.same_as(serves))
            first = await self._answering(state, message, principal)
            if first is not None and first.id not in asked:
                # Asked after the message arrived (a subagent's next question, once an answer
                # to the request it replied to closed that): its sender never saw it.
                first = None
            if judging is not None and (first is None or first.id != judging.way[0].id):
                raise _still_judged(session_id, judging)
            if first is not None:
                check_unambiguous(first, message)
                reply = _match(first, message)
                if reply is not None:
                    kept: list[bool] = []  # its key recorded with its answer's end
                    turns: list[Answered] = []  # the turn it answered, its call's to be told
                    try:
                        outcomes = await self._settle(
                            session_id,
                            [reply],
                            principal,
                            require_all=False,
                            mark=idem,
                            from_message=True,
                            kept=kept,
                            turns=turns,
                        )
                    except (RequestClosed, ConflictingAnswer):
                        # Answered or closed meanwhile: the message is delivered anew, as an
                        # answer only to a request open when it arrived.
                        continue
                    if idem is not None and not kept and not any(o.applied for o in outcomes):
                        # Settled with this answer meanwhile: by this key's call, a repeat?
                        if await self._taken(session_id, first, idem):
                            return await self._replay(session_id, idem)
                        # Counted before, or settled with this answer by another: taken all
                        # the same, so its key is kept (a refused one is not taken).
                        if not refused_only(outcomes) and await self._keep_key(
                            session_id, first, principal, idem
                        ):
                            return await self._replay(session_id, idem)
                    idle = await self._refused_idle(session_id, outcomes)
                    if idle is not None:  # settled nothing, nothing due: drives nothing
                        return self._result(idle, outcomes)
                    went_to = turns[0] if turns else None
                    if went_to is not None and idem is not None:  # as its repeat is told
                        went_to = dataclasses.replace(went_to, keyed=True)
                    return await self._drive(session_id, outcomes=outcomes, answered=went_to)
            held_on_approval = any(r.kind == "tool-approval" for r in pending)
            who = None if principal is None else principal.model_dump()
            # A turn its person chose to stop at a spent budget (answered, not driven yet) ends
            # at its next model step, unread: a steer waits for that end and starts the next.
            stopping = not pending and await stopped_at_limit(state, self.store) is not None
            if not same_person or stopping or (turn_policy == "queue" and not held_on_approval):
                data = {"message": message, "principal": who, "policy": turn_policy, **key}
                driver = self._driver(state, None)
                try:
                    await driver.record(
                        unchanged(state, [("turn.message", {**data, "queued": True})])
                    )
                except (Changed, TurnStopped):
                    continue  # the turn ended or its requests changed meanwhile: decide again
                except Exception:
                    self._cache.pop(session_id, None)
                    raise
                self._remember(driver.state)
                if runnable(driver.state) and (woke or await self._undriven(session_id)):
                    # A passed deadline (this call's record, or an earlier read's) closed the
                    # approval, or a cancelled drive left the turn: the call drives it on, as
                    # an answer would, and the message waits behind it.
                    return await self._drive_after(session_id, queued_last(driver.state))
                return dataclasses.replace(self._result(driver.state), queued=True)
            try:
                return await self._steer(state, message, who, idem)
            except (Changed, TurnStopped):
                continue  # the turn ended or its requests changed meanwhile: decide again
        raise SessionBusy(f"could not deliver the message to {session_id!r}", session_id)

    async def _voted_behind(
        self,
        state: SessionState,
        forms: list[tuple[Keyed, Principal | None]],
        principal: Principal | None,
    ) -> Keyed | None:
        """The key, in the form found (`looked_for`'s `forms`), of the message that cast a vote
        through one of the session's mirrors (open or closed) that only the subagent's session
        records (`voted_through`): a process died between that commit and the one recording
        the key here, or the mirror closed in between. The key is recorded here then, while the
        mirror's turn is the session's (the commit that closed or withdrew it kept it: `kept`).
        None if it cast none; `IdempotencyKeyReused` if it came with another message there."""
        for mark, whose in forms:
            mirror = await voted_through(self, state, mark, whose)
            if mirror is not None:
                await keep_vote_key(self, state.id, mirror, mark, principal)
                return mark
        return None

    async def _judging(
        self, state: SessionState, forms: list[tuple[Keyed, Principal | None]]
    ) -> _Judged | None:
        """The candidate that holds the key (in a form of `forms`: `looked_for`) aside while a
        response policy judges its message's answer, in the session or in a subagent's one of
        its open mirrors stands for (hop by hop): the key is recorded only with its verdict.
        `IdempotencyKeyReused`, naming the session, if it came with another message there: a
        message sent with it meanwhile would act beside that answer."""
        if not forms:
            return None
        todo: list[tuple[SessionState, list[InputRequest]]] = [(state, [])]
        visited: set[str] = set()
        while todo:
            st, way = todo.pop()
            visited.add(st.id)
            cid = next(
                (c for m, w in forms if (c := held_as(st.candidates, m, w, state.id)) is not None),
                None,
            )
            live = None if cid is None else st.requests.get(st.candidates[cid]["request_id"])
            if cid is not None and live is not None:
                return _Judged(st, cid, [*way, live.request])
            for r in st.pending_requests():
                ref = r.child
                if ref is None or ref.session_id in visited:
                    continue
                try:
                    todo.append((await self._state(ref.session_id), [*way, r]))
                except UnknownSession:
                    continue  # a subagent's session gone: it judges nothing
        return None

    def _judging_tool(self, judged: _Judged) -> Tool | None:
        """The tool whose response policy judges `judged`'s answer, if this runtime has it."""
        agent = self.agents.get(judged.state.agent)
        return None if agent is None else agent.tools.get(judged.way[-1].tool_name or "")

    async def _verdict(self, judged: _Judged) -> None:
        """Wait for the verdict on `judged`'s candidate: its end, its request's close, or the
        time its judging may take passing (its process died: a drive or an answer judges it
        again); the default policy's time where this runtime lacks the tool, which some other
        runtime judges it with."""
        tool = self._judging_tool(judged)
        timeout = DEFAULT_RESPONSE_TIMEOUT if tool is None else tool.response_timeout
        st, cid = judged.state, judged.cid
        until = float(st.candidates[cid]["at"]) + timeout + RECOVERY_GRACE
        rid = judged.way[-1].id
        await wait_ended(self.store, st.id, rid, cid, st.seq, self.now, until)

    async def _still_open(self, judged: _Judged) -> bool:
        """Whether the request `judged`'s answer decides is still open (not closed meanwhile by
        another answer, which spent that answer: `stale`)."""
        stored = await self.store.get_request(judged.way[-1].id)
        return stored is not None and stored.status == "pending"

    def _judges(self, judged: _Judged) -> None:
        """`NotAllowed`, as an answer to its request would be, if this runtime cannot judge
        `judged`'s answer again: it lacks the agent, the tool or its response policy."""
        tool = self._judging_tool(judged)
        request = judged.way[-1]
        try:
            check_policy_present(
                request, tool, recorded=True, here=judged.state.agent in self.agents
            )
        except NotAllowed as exc:
            raise named_as_answered(exc, judged.way) from None

    async def _taken(self, session_id: str, request: InputRequest, idem: Keyed) -> bool:
        """Whether the message keyed `idem` answered `request` before: its key is recorded in the
        session, or in the subagent's session a mirrored request stands for, where its vote on
        a quorum is recorded (the parent records it after the child: `keep_vote_key`). A key
        that came with another message there is `IdempotencyKeyReused`, naming `session_id`,
        where the message was sent."""
        sid, rid = session_id, request.id
        visited: set[str] = set()
        while sid not in visited:
            visited.add(sid)
            state = await self._state(sid)
            if seen(state.keys, idem, session_id):
                return True
            live = state.requests.get(rid)
            ref = None if live is None else live.request.child
            if ref is None:
                return False
            sid, rid = ref.session_id, ref.request_id
        return False

    async def _keep_key(
        self, session_id: str, request: InputRequest, principal: Principal | None, idem: Keyed
    ) -> bool:
        """Record the key `idem` of a message taken as an answer to `request` that changed
        nothing (its sender's vote was counted before, or the request was settled with that
        answer meanwhile) on an `input.repeated` of the request's turn, which keeps it with that
        turn: sent again, the message is a repeat, not a new message once the request closed.
        True if the key was recorded meanwhile (by this call sent again: a repeat); nothing is
        recorded then, nor once the session moved past that turn."""
        who = None if principal is None else principal.model_dump()
        data = {"request_id": request.id, "by": who, "idem": list(idem)}
        taken: list[bool] = []

        def build(st: SessionState) -> list[EventSpec]:
            taken[:] = [seen(st.keys, idem, session_id, st.candidates)]
            if not free_for(st.keys, idem) or st.turn is None or st.turn.id != request.turn_id:
                return []
            return [("input.repeated", data)]

        await self._append(session_id, build, turn_id=request.turn_id)
        return taken == [True]

    async def _answering(
        self, state: SessionState, message: str, principal: Principal | None
    ) -> InputRequest | None:
        """The open request `message`, sent by `principal`, is taken as an answer to (or refused
        for naming several of its options): the first, if it reads as one and the sender is the
        person the turn serves or may answer it. None: `send` takes it as a message."""
        first = first_open(state.pending_requests())
        if state.turn is None or first is None:
            return None
        if _match(first, message) is None and not names_several(first, message):
            return None
        serves = state.turn.principal
        if serves is None or (principal is not None and principal.same_as(serves)):
            reply = _match(first, message)
            if _denies(first, reply) and not await self._may_answer(first, principal):
                # A deny they may not give (four eyes excludes them) steers, as any other
                # message of theirs would: the call does not run either way. Their approve is
                # refused instead: a steer would withdraw the call they asked to run.
                return None
            return first
        return first if await self._may_answer(first, principal) else None

    async def _steer(
        self, state: SessionState, message: str, who: dict[str, Any] | None, idem: Keyed | None
    ) -> GenerateResult:
        """Withdraw what the turn waits on and put the message in front of the model, then drive
        it: the call is told that turn, not one queued behind it. A mirror's withdrawal keeps
        the keys its subagent's session recorded for messages sent through it (`keeping`), and
        those it recorded meanwhile (`keep_late`)."""
        steered = state.turn
        assert steered is not None  # a message steers only a turn
        pending = state.pending_requests()
        voted = await mirrored_keys(self, pending)
        specs: list[Any] = []
        resolves = []
        for r in pending:
            outcome = "ignored" if r.kind == "tool-approval" else "cancelled"
            reason = "the user sent a new message instead of answering"
            specs.append(
                (
                    "input.resolved",
                    {
                        "request_id": r.id,
                        "outcome": outcome,
                        "status": "withdrawn",
                        "reason": reason,
                        "by": who,  # who withdrew it, as a cancel records
                    },
                )
            )
            resolves.append(
                Resolve(
                    request_id=r.id,
                    status="withdrawn",
                    outcome=outcome,
                    resolution={"outcome": outcome, "reason": reason, "by": who},
                )
            )
        data = {"message": message, "principal": who, "policy": "steer"}
        specs.append(("turn.message", data if idem is None else {**data, "idem": list(idem)}))
        driver = self._driver(state, None)
        specs = keeping(state, specs, voted)
        try:
            await driver.record(unchanged(state, specs, resolves), durable=bool(resolves))
        except Exception:
            self._cache.pop(state.id, None)
            raise
        # The calls the turn waits on see it, and so does the drive below, which holds it
        # meanwhile (the engine clears it once the model reads).
        stop_calls(self._abort_of(state.id))
        self._remember(driver.state)
        await keep_late(self, state.id, pending, voted)
        return await self._drive_after(state.id, InTurn(steered.id, steered.first_seq))


class _Judged(NamedTuple):
    """A pending candidate holding a message's key (`Messages._judging`): its session's state,
    its id, and the way from the request the message answered down to the candidate's own."""

    state: SessionState
    cid: str
    way: list[InputRequest]


def _still_judged(session_id: str, judged: _Judged) -> SessionBusy:
    """The error of a message whose answer is still judged past its time, which this call
    would otherwise deliver as another message (its request is not the one it answers now)."""
    return SessionBusy(
        f"the answer this message gave to request {judged.way[0].id} is still being judged, "
        "past its response policy's time: send it again later",
        session_id,
    )


def _denies(request: InputRequest, reply: Reply | None) -> bool:
    """Whether `reply` denies the approval `request` (its `cancel` option)."""
    return request.kind == "tool-approval" and reply is not None and reply.option_id == "cancel"
