"""`Runtime`: the public facade. Starts and resumes turns, settles answers, lists the queue.

Nothing is held in memory between calls that the store does not also hold: the in-process cache
of session states is checked against the store's head before every use.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Literal

from pydantic import ValidationError

from ._agent import Agent
from ._answers import Reply as _Reply
from ._answers import decisions as _decisions
from ._answers import match as _match
from ._answers import repeat as _repeat
from ._answers import resolution as _resolution
from ._answers import settlement_events as _settlement_events
from ._approval import SessionAuth, SessionInfo
from ._deadlines import due_batch
from ._engine import Batch, Driver, EventSpec, load_state, new_id, runnable
from ._events import Event
from ._exceptions import (
    InvalidAnswer,
    NotAllowed,
    PartialAnswer,
    RequestClosed,
    SessionBusy,
    SessionExpired,
    UnknownRequest,
    UnknownSession,
    UsageError,
)
from ._response import RequestInfo, ResponseContext, ResponseInfo, evaluate_response
from ._results import GenerateResult, Outcome
from ._state import SessionState, fold
from ._sync import SyncBridge
from ._types import Decision, InputRequest, InputResponse, Principal
from .stores import PendingFilter, Resolve, Store, open_store

__all__ = ["Runtime"]


class Runtime:
    """Runs agents' turns against a store; every method has a `*_sync` twin."""

    def __init__(
        self,
        agents: Sequence[Agent],
        store: str | Store | None = None,
        *,
        clock: Callable[[], float] = time.time,
        lease_ttl: float = 30.0,
        lease_wait: float = 10.0,
        cache_size: int = 1024,
        poll_interval: float = 0.2,
    ) -> None:
        self.agents: dict[str, Agent] = {}
        for agent in agents:
            if agent.name in self.agents:
                raise UsageError(f"two agents are named {agent.name!r}")
            self.agents[agent.name] = agent
        self.store = open_store(store)
        self.clock = clock
        self.lease_ttl = lease_ttl
        self.lease_wait = lease_wait
        self.poll_interval = poll_interval
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{new_id('rt')}"
        self._cache: OrderedDict[str, SessionState] = OrderedDict()
        self._cache_size = cache_size
        self._aborts: dict[str, asyncio.Event] = {}
        # Serializes this process's appends to one session: commit, then apply to the state.
        self._locks: dict[str, asyncio.Lock] = {}
        self._opened = False
        self._sync = SyncBridge()

    # -- lifecycle ----------------------------------------------------------------------------

    async def open(self) -> None:
        if not self._opened:
            await self.store.open()
            self._opened = True

    async def close(self) -> None:
        await self.store.close()
        self._opened = False
        self._sync.close()

    async def __aenter__(self) -> Runtime:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def agent(self, name: str) -> Agent:
        try:
            return self.agents[name]
        except KeyError:
            known = ", ".join(self.agents) or "none"
            raise UsageError(f"unknown agent {name!r}; this runtime has: {known}") from None

    # -- state --------------------------------------------------------------------------------

    async def state(self, session_id: str) -> SessionState:
        """The session's current state, checked against the store's head."""
        await self.open()
        cached = self._cache.get(session_id)
        if cached is not None:
            head = await self.store.head(session_id)
            if head is None:
                raise UnknownSession(session_id)
            if head == cached.seq:
                self._remember(cached)  # another task may have dropped it while we awaited
                return cached
            try:
                tail = await self.store.read_events(session_id, after=cached.seq)
                state = fold(tail, cached)
                self._remember(state)
                return state
            except Exception:
                self._cache.pop(session_id, None)
        state = await load_state(self.store, session_id)
        self._remember(state)
        return state

    def _remember(self, state: SessionState) -> None:
        self._cache[state.id] = state
        self._cache.move_to_end(state.id)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    async def _checked(self, session_id: str) -> SessionState:
        state = await self.state(session_id)
        now = self.clock()
        if state.expired(now):
            await self._expire(state)
        if due_batch(state, now) is not None:
            await self._append(
                session_id,
                lambda st: due_batch(st, self.clock()) or Batch(specs=[]),
                durable=True,
                turn_id=state.turn.id if state.turn else None,
            )
            state = await self.state(session_id)
        return state

    async def expire_due(self) -> int:
        """Apply every passed request deadline across sessions and resume their turns.

        Run it periodically (a worker does); returns how many sessions it touched.
        """
        await self.open()
        now = self.clock()
        sessions: list[str] = []
        offset = 0
        while True:
            page = await self.store.pending(PendingFilter(limit=500, offset=offset))
            for r in page:
                if r.expires_at is not None and r.expires_at <= now:
                    if r.session_id not in sessions:
                        sessions.append(r.session_id)
            if len(page) < 500:
                break
            offset += 500
        for sid in sessions:
            with contextlib.suppress(SessionExpired):
                await self._drive(sid)
        return len(sessions)

    async def _expire(self, state: SessionState) -> None:
        pending = state.pending_requests()
        if pending:
            driver = self._driver(state, None)
            with contextlib.suppress(Exception):
                await driver.record(
                    [
                        (
                            "input.resolved",
                            {
                                "request_id": r.id,
                                "outcome": "expired",
                                "status": "expired",
                                "reason": "session expired",
                            },
                        )
                        for r in pending
                    ],
                    resolve=[
                        Resolve(
                            request_id=r.id,
                            status="expired",
                            outcome="expired",
                            resolution={"outcome": "expired"},
                        )
                        for r in pending
                    ],
                )
            self._cache.pop(state.id, None)
        raise SessionExpired(state.id, [r.id for r in pending])

    def _driver(self, state: SessionState, token: int | None) -> Driver:
        return Driver(
            store=self.store,
            agent=self.agent(state.agent),
            state=state,
            lease_token=token,
            clock=self.clock,
            abort_signal=self._aborts.setdefault(state.id, asyncio.Event()),
            lock=self._locks.setdefault(state.id, asyncio.Lock()),
        )

    # -- starting turns -----------------------------------------------------------------------

    async def generate(
        self,
        agent: str | None = None,
        prompt: str | None = None,
        *,
        session_id: str | None = None,
        approvals: Sequence[Decision | Mapping[str, Any]] | None = None,
        auth: Principal | None = None,
    ) -> GenerateResult:
        """Run a turn until it completes, fails or waits (helix style).

        With `approvals`, settle every pending approval of the session in one call (no prompt
        beside them) and continue. With neither, resume the session's turn (a retry after a
        failure, or picking up a turn another process left).
        """
        await self.open()
        if approvals is not None:
            if prompt is not None:
                raise InvalidAnswer(
                    "approvals must be sent on their own: this call carries a prompt too; "
                    "send the prompt in the next call"
                )
            if session_id is None:
                raise UsageError("approvals need the session_id they belong to")
            decisions = _decisions(approvals)
            if not decisions:
                raise InvalidAnswer("approvals is empty: answer the session's pending requests")
            answers = [
                _Reply(
                    d.id,
                    "approve" if d.approved else "cancel",
                    d.reason,
                    d.value,
                    d.edited_input,
                    d.input_hash,
                )
                for d in decisions
            ]
            outcomes = await self._settle(session_id, answers, auth, require_all=True)
            return await self._drive(session_id, outcomes=outcomes, retry=True)
        if session_id is None:
            if agent is None:
                raise UsageError("generate() needs an agent name for a new session")
            if prompt is None:
                raise UsageError("generate() needs a prompt to start a session")
            session_id = await self._create(self.agent(agent), auth)
        elif agent is not None:
            state = await self.state(session_id)
            if state.agent != agent:
                raise UsageError(f"session {session_id!r} belongs to agent {state.agent!r}")
        if prompt is None:
            return await self._drive(session_id, retry=True)
        await self._start_turn(session_id, prompt, auth)
        return await self._drive(session_id)

    async def create_session(self, agent: str, *, auth: Principal | None = None) -> str:
        """Open an empty session for `agent` and return its id."""
        await self.open()
        return await self._create(self.agent(agent), auth)

    async def _create(self, agent: Agent, auth: Principal | None) -> str:
        session_id = new_id("ses")
        now = self.clock()
        ttl = agent.limits.ttl_seconds
        event = Event(
            session_id=session_id,
            seq=1,
            type="session.created",
            at=now,
            data={
                "agent": agent.name,
                "initiator": None if auth is None else auth.model_dump(),
                "parent": None,
                "ttl": ttl,
            },
        )
        await self.store.create_session(
            session_id, agent.name, [event], None if ttl is None else now + ttl
        )
        self._remember(fold([event]))
        return session_id

    async def _start_turn(self, session_id: str, prompt: str, auth: Principal | None) -> None:
        if not isinstance(prompt, str):
            raise UsageError(f"prompt must be a string, not {type(prompt).__name__}")
        for _ in range(10):
            state = await self._checked(session_id)
            pending = state.pending_requests()
            if pending:
                raise PartialAnswer(session_id, [r.id for r in pending])
            if state.turn is not None and state.turn.status in ("running",):
                if await self._busy(session_id):
                    raise SessionBusy(
                        f"session {session_id!r} is running a turn in another process",
                        session_id,
                    )
            driver = self._driver(state, None)
            turn_id = new_id("trn")
            try:
                await driver.record(
                    [
                        (
                            "turn.started",
                            {
                                "message": prompt,
                                "principal": None if auth is None else auth.model_dump(),
                                "source": "message",
                            },
                        )
                    ],
                    turn_id=turn_id,
                )
            except Exception:
                self._cache.pop(session_id, None)
                raise
            self._remember(driver.state)
            return

    async def _busy(self, session_id: str) -> bool:
        token = await self.store.acquire_lease(session_id, self.owner, 1.0, self.clock())
        if token is None:
            return True
        await self.store.release_lease(session_id, self.owner, token)
        return False

    # -- driving ------------------------------------------------------------------------------

    async def _drive(
        self, session_id: str, *, outcomes: Sequence[Outcome] = (), retry: bool = False
    ) -> GenerateResult:
        for _ in range(100):
            # One owner per drive, not per runtime: two tasks of this runtime must not share
            # (and so steal) the session's lease.
            owner = f"{self.owner}:{new_id('drv')}"
            token = await self._acquire(session_id, owner)
            if token is None:
                state = await self.state(session_id)
                return self._result(state, outcomes, busy=True)
            renew = asyncio.create_task(self._renew(session_id, owner, token))
            state = await self._checked(session_id)
            driver = self._driver(state, token)
            try:
                state = await driver.drive(retry=retry)
            finally:
                renew.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await renew
                self._remember(driver.state)
                await self.store.release_lease(session_id, owner, token)
            retry = False
            state = await self.state(session_id)
            if not runnable(state):
                return self._result(state, outcomes)
        raise RuntimeError("turn did not settle after 100 passes")  # pragma: no cover

    async def _acquire(self, session_id: str, owner: str) -> int | None:
        deadline = time.monotonic() + self.lease_wait
        delay = 0.005
        while True:
            token = await self.store.acquire_lease(session_id, owner, self.lease_ttl, self.clock())
            if token is not None or time.monotonic() >= deadline:
                return token
            # Jitter: waiters that started together must not all retry in lockstep.
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 0.2)

    async def _renew(self, session_id: str, owner: str, token: int) -> None:
        while True:
            await asyncio.sleep(self.lease_ttl / 3)
            await self.store.renew_lease(session_id, owner, token, self.lease_ttl, self.clock())

    def _result(
        self, state: SessionState, outcomes: Sequence[Outcome] = (), *, busy: bool = False
    ) -> GenerateResult:
        turn = state.turn
        status: Any
        if busy:
            status = "running"
        elif turn is None:
            status = "idle"
        else:
            status = turn.status
        return GenerateResult(
            status=status,
            session_id=state.id,
            turn_id=None if turn is None else turn.id,
            text="" if turn is None else turn.text,
            pending=state.pending_requests(),
            error=None if turn is None else turn.error,
            retryable=False if turn is None else turn.retryable,
            outcomes=list(outcomes),
        )

    # -- answering ----------------------------------------------------------------------------

    async def respond(
        self,
        session_id: str,
        responses: Sequence[InputResponse | Mapping[str, Any]],
        *,
        principal: Principal | None = None,
        resume: bool = True,
    ) -> GenerateResult:
        """Answer one or more requests by id (eve style), then continue the turn if it can."""
        await self.open()
        answers: list[_Reply] = []
        for i, raw in enumerate(responses):
            try:
                r = raw if isinstance(raw, InputResponse) else InputResponse.model_validate(raw)
            except ValidationError as exc:
                raise InvalidAnswer(f"response #{i + 1} is malformed: {exc}") from None
            answers.append(
                _Reply(r.request_id, r.option_id, r.text, r.value, r.edited_input, r.input_hash)
            )
        if not answers:
            raise InvalidAnswer("no responses given")
        outcomes = await self._settle(session_id, answers, principal, require_all=False)
        if not resume:
            return self._result(await self.state(session_id), outcomes)
        return await self._drive(session_id, outcomes=outcomes)

    async def _settle(
        self,
        session_id: str,
        answers: Sequence[_Reply],
        principal: Principal | None,
        *,
        require_all: bool,
        extra: Sequence[Any] = (),
    ) -> list[Outcome]:
        """Validate every answer, then settle them all in one durable commit (or none)."""
        ids = [a.request_id for a in answers]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise InvalidAnswer(
                f"request id(s) answered twice in one call: {', '.join(dupes)}", dupes
            )
        for _ in range(20):
            state = await self._checked(session_id)
            agent = self.agent(state.agent)
            outcomes: list[Outcome] = []
            specs: list[Any] = []
            resolves: list[Resolve] = []
            unknown: list[str] = []
            gated: list[tuple[InputRequest, _Reply, dict[str, Any]]] = []
            turn_id = None
            for reply in answers:
                rid = reply.request_id
                live = state.requests.get(rid)
                if live is not None:
                    request, status, resolution = live.request, live.status, live.resolution
                else:
                    stored = await self.store.get_request(rid)
                    if stored is None or stored.request.session_id != session_id:
                        unknown.append(rid)
                        continue
                    request, status, resolution = stored.request, stored.status, stored.resolution
                tool = agent.tools.get(request.tool_name or "")
                wanted = _resolution(request, reply, tool)
                if status != "pending":
                    outcomes.append(_repeat(request, status, resolution, wanted))
                    continue
                if request.kind == "tool-approval" and (
                    request.approvers > 1 or (tool is not None and tool.response_policy)
                ):
                    gated.append((request, reply, wanted))
                    continue
                self._authorize(request, principal)
                wanted["by"] = None if principal is None else principal.model_dump()
                specs.extend(_settlement_events(request, reply, wanted))
                resolves.append(
                    Resolve(
                        request_id=rid,
                        status="settled",
                        outcome=wanted["outcome"],
                        resolution=wanted,
                    )
                )
                outcomes.append(Outcome(request_id=rid, outcome=wanted["outcome"], applied=True))
                turn_id = request.turn_id
            if unknown:
                raise UnknownRequest(session_id, unknown)
            if require_all:
                answered = set(ids)
                missing = [r.id for r in state.pending_requests() if r.id not in answered]
                if missing:
                    raise PartialAnswer(session_id, missing)
            for request, _, _ in gated:
                _check_quorum_eligibility(request, principal)
            if resolves:
                driver = self._driver(state, None)
                try:
                    await driver.record(
                        [*specs, *extra], resolve=resolves, durable=True, turn_id=turn_id
                    )
                except RequestClosed:
                    self._cache.pop(session_id, None)
                    continue  # someone settled first: re-read and report no-op or conflict
                except Exception:
                    self._cache.pop(session_id, None)
                    raise
                self._remember(driver.state)
            for request, reply, wanted in gated:
                outcome = await self._candidate(session_id, request, reply, wanted, principal)
                outcomes.append(outcome)
            return outcomes
        raise RequestClosed(f"could not settle in session {session_id!r}: too much contention")

    async def _append(
        self, session_id: str, build: Callable[[SessionState], Any], **kw: Any
    ) -> None:
        state = await self.state(session_id)
        driver = self._driver(state, None)
        try:
            await driver.record(build, **kw)
        except Exception:
            self._cache.pop(session_id, None)
            raise
        self._remember(driver.state)

    async def _candidate(
        self,
        session_id: str,
        request: InputRequest,
        reply: _Reply,
        wanted: dict[str, Any],
        principal: Principal | None,
    ) -> Outcome:
        """Settle an approval that has a response policy or a quorum, recording its candidacy."""
        rid = request.id
        state = await self.state(session_id)
        tool = self.agent(state.agent).tools.get(request.tool_name or "")
        by = None if principal is None else principal.model_dump()
        base = {
            "request_id": rid,
            "call_id": request.call_id,
            "candidate_id": new_id("cand"),
            "decision": wanted["decision"],
            "by": by,
        }
        tid = request.turn_id

        def waiting(st: SessionState) -> EventSpec:
            ids = [r.id for r in st.pending_requests()]
            return ("turn.waiting", {"on": "input", "request_ids": ids})

        if tool is not None and tool.response_policy is not None:
            # Record the response first, so slow policy work cannot lose it.
            await self._append(
                session_id,
                lambda st: [("approval.candidate", {**base, "outcome": "pending"})],
                durable=True,
                turn_id=tid,
            )
            verdict = await evaluate_response(
                tool.response_policy,
                ResponseContext(
                    request=RequestInfo(
                        request_id=rid,
                        call_id=request.call_id or "",
                        tool_name=request.tool_name or "",
                        tool_input=request.input,
                        principal=request.requested_by,
                        escalated_to=request.escalated_to,
                    ),
                    response=ResponseInfo(decision=wanted["decision"], principal=principal),
                    session=_session_info(state, request),
                ),
                tool.response_timeout,
            )
            if verdict.outcome != "allowed":
                refusal = {**base, "outcome": verdict.outcome, "reason": verdict.reason}

                def refuse(st: SessionState) -> list[EventSpec]:
                    if rid not in st.requests or st.requests[rid].status != "pending":
                        return [("approval.candidate", {**refusal, "outcome": "stale"})]
                    return [("approval.candidate", refusal), waiting(st)]

                await self._append(session_id, refuse, turn_id=tid)
                return Outcome(
                    request_id=rid, outcome=verdict.outcome, applied=False, reason=verdict.reason
                )
        elif request.approvers <= 1:
            self._authorize(request, principal)
        outcome: list[Outcome] = []

        def settle_or_count(st: SessionState) -> Batch:
            live = st.requests.get(rid)
            if live is None or live.status != "pending":
                outcome.append(
                    _repeat(
                        request,
                        live.status if live else "withdrawn",
                        live.resolution if live else None,
                        wanted,
                    )
                )
                return Batch(specs=[])
            current = live.request
            me = None if principal is None else principal.principal_id
            if wanted["decision"] == "approve" and current.approvers > 1:
                if current.distinct and me in current.approved_by:
                    outcome.append(
                        Outcome(
                            request_id=rid,
                            outcome="counted",
                            applied=False,
                            reason=f"already counted: {current.progress}",
                        )
                    )
                    return Batch(specs=[])
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
                        "outcome": "counted",
                        "votes": len(votes),
                        "needed": current.approvers,
                    }
                    return Batch(
                        specs=[("approval.candidate", counted), waiting(st)],
                        updated_requests=[progressed],
                    )
                wanted["approved_by"] = votes
            resolution = {**wanted, "by": by}
            outcome.append(Outcome(request_id=rid, outcome=wanted["outcome"], applied=True))
            return Batch(
                specs=_settlement_events(current, reply, resolution),
                resolve=[
                    Resolve(
                        request_id=rid,
                        status="settled",
                        outcome=wanted["outcome"],
                        resolution=resolution,
                    )
                ],
            )

        await self._append(session_id, settle_or_count, durable=True, turn_id=tid)
        return outcome[-1]

    async def send(
        self,
        session_id: str,
        message: str,
        *,
        principal: Principal | None = None,
        turn_policy: Literal["steer", "queue"] = "steer",
    ) -> GenerateResult:
        """Send a message to a session (eve style).

        It answers the first open request when it names one of its options (id, label or
        1-based index) or the request takes free text. Otherwise, with `steer` (the default),
        open approvals are ignored, open questions withdrawn and the model reads the message;
        with `queue` it waits for the end of the turn, unless the turn is held on an approval.
        A message from someone other than the person the turn serves waits for the turn's end.
        """
        await self.open()
        if not isinstance(message, str) or not message.strip():
            raise UsageError("send() needs a non-empty message")
        if turn_policy not in ("steer", "queue"):
            raise UsageError(f"turn_policy must be 'steer' or 'queue', not {turn_policy!r}")
        for _ in range(20):
            state = await self._checked(session_id)
            turn = state.turn
            if turn is None or turn.status in ("completed", "failed", "cancelled"):
                await self._start_turn(session_id, message, principal)
                return await self._drive(session_id)
            pending = state.pending_requests()
            serves = turn.principal
            same_person = serves is None or (principal is not None and principal.same_as(serves))
            if pending:
                first = sorted(pending, key=lambda r: r.kind != "session-limit")[0]
                reply = _match(first, message)
                if reply is not None and (same_person or self._may_answer(first, principal)):
                    try:
                        outcomes = await self._settle(
                            session_id, [reply], principal, require_all=False
                        )
                    except RequestClosed:
                        continue
                    return await self._drive(session_id, outcomes=outcomes)
            held_on_approval = any(r.kind == "tool-approval" for r in pending)
            who = None if principal is None else principal.model_dump()
            if not same_person or (turn_policy == "queue" and not held_on_approval):
                data = {"message": message, "principal": who, "policy": turn_policy}
                driver = self._driver(state, None)
                try:
                    await driver.record([("turn.message", {**data, "queued": True})])
                except Exception:
                    self._cache.pop(session_id, None)
                    raise
                self._remember(driver.state)
                return self._result(driver.state)
            return await self._steer(state, message, who)
        raise SessionBusy(f"could not deliver the message to {session_id!r}", session_id)

    async def _steer(
        self, state: SessionState, message: str, who: dict[str, Any] | None
    ) -> GenerateResult:
        """Withdraw what the turn waits on and put the message in front of the model."""
        pending = state.pending_requests()
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
                    },
                )
            )
            resolves.append(
                Resolve(
                    request_id=r.id,
                    status="withdrawn",
                    outcome=outcome,
                    resolution={"outcome": outcome, "reason": reason},
                )
            )
        specs.append(("turn.message", {"message": message, "principal": who, "policy": "steer"}))
        abort = self._aborts.pop(state.id, None)
        if abort is not None:
            abort.set()  # running workflow calls see it; later calls get a fresh signal
        driver = self._driver(state, None)
        try:
            await driver.record(specs, resolve=resolves, durable=bool(resolves))
        except Exception:
            self._cache.pop(state.id, None)
            raise
        self._remember(driver.state)
        return await self._drive(state.id)

    def _may_answer(self, request: InputRequest, principal: Principal | None) -> bool:
        try:
            self._authorize(request, principal)
        except NotAllowed:
            return False
        return True

    def _authorize(self, request: InputRequest, principal: Principal | None) -> None:
        """Default response policy: only the principal whose turn asked may settle."""
        asker = request.requested_by
        if asker is None:
            return
        if principal is None or not principal.same_as(asker):
            who = "an anonymous caller" if principal is None else principal.principal_id
            raise NotAllowed(
                f"request {request.id} was asked by {asker.principal_id}; {who} may not settle it",
                [request.id],
            )

    # -- the queue, the stream, cancelling ----------------------------------------------------

    async def pending(
        self,
        flt: PendingFilter | None = None,
        *,
        agent: str | None = None,
        tool_name: str | None = None,
        kind: str | None = None,
        session_id: str | None = None,
        older_than: float | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[InputRequest]:
        """Open requests across sessions, oldest first."""
        await self.open()
        if flt is None:
            flt = PendingFilter(
                agent=agent,
                tool_name=tool_name,
                kind=kind,
                session_id=session_id,
                created_before=None if older_than is None else self.clock() - older_than,
                limit=limit,
                offset=offset,
            )
        return await self.store.pending(flt)

    async def events(
        self, session_id: str, after: int = 0, *, follow: bool = True
    ) -> AsyncIterator[Event]:
        """The session's events after `seq`; with `follow`, keeps waiting for new ones."""
        await self.open()
        if await self.store.head(session_id) is None:
            raise UnknownSession(session_id)
        while True:
            batch = await self.store.read_events(session_id, after=after, limit=500)
            for event in batch:
                yield event
                after = event.seq
            if not batch and not follow:
                return
            if len(batch) < 500:
                if not follow:
                    return
                await asyncio.sleep(self.poll_interval)

    async def cancel(self, session_id: str, reason: str | None = None) -> GenerateResult:
        """Cancel the running or waiting turn; its open requests are withdrawn."""
        await self.open()
        for _ in range(20):
            state = await self.state(session_id)
            turn = state.turn
            if turn is None or turn.status in ("completed", "cancelled", "failed"):
                return self._result(state)
            abort = self._aborts.get(session_id)
            if abort is not None:
                abort.set()
            pending = state.pending_requests()
            specs: list[Any] = [
                (
                    "input.resolved",
                    {
                        "request_id": r.id,
                        "outcome": "cancelled",
                        "status": "withdrawn",
                        "reason": "turn cancelled",
                    },
                )
                for r in pending
            ]
            specs.append(("turn.cancelled", {"reason": reason}))
            specs.append(("session.waiting", {}))
            driver = self._driver(state, None)
            try:
                await driver.record(
                    specs,
                    durable=True,
                    resolve=[
                        Resolve(
                            request_id=r.id,
                            status="withdrawn",
                            outcome="cancelled",
                            resolution={"outcome": "cancelled", "reason": "turn cancelled"},
                        )
                        for r in pending
                    ],
                )
            except RequestClosed:
                self._cache.pop(session_id, None)
                continue
            self._remember(driver.state)
            self._aborts.pop(session_id, None)
            return self._result(driver.state)
        raise SessionBusy(f"could not cancel session {session_id!r}", session_id)

    # -- sync twins ---------------------------------------------------------------------------

    def generate_sync(self, *args: Any, **kwargs: Any) -> GenerateResult:
        return self._sync.run(self.generate(*args, **kwargs))

    def send_sync(self, *args: Any, **kwargs: Any) -> GenerateResult:
        return self._sync.run(self.send(*args, **kwargs))

    def respond_sync(self, *args: Any, **kwargs: Any) -> GenerateResult:
        return self._sync.run(self.respond(*args, **kwargs))

    def expire_due_sync(self) -> int:
        return self._sync.run(self.expire_due())

    def pending_sync(self, *args: Any, **kwargs: Any) -> list[InputRequest]:
        return self._sync.run(self.pending(*args, **kwargs))

    def cancel_sync(self, *args: Any, **kwargs: Any) -> GenerateResult:
        return self._sync.run(self.cancel(*args, **kwargs))

    def state_sync(self, session_id: str) -> SessionState:
        return self._sync.run(self.state(session_id))

    def create_session_sync(self, agent: str, *, auth: Principal | None = None) -> str:
        return self._sync.run(self.create_session(agent, auth=auth))

    def events_sync(self, session_id: str, after: int = 0) -> list[Event]:
        """The session's events after `seq`, without following."""

        async def collect() -> list[Event]:
            return [e async for e in self.events(session_id, after, follow=False)]

        return self._sync.run(collect())

    def close_sync(self) -> None:
        self._sync.run(self.store.close())
        self._opened = False
        self._sync.close()


def _check_quorum_eligibility(request: InputRequest, principal: Principal | None) -> None:
    """Who may count toward a quorum: an identified principal, not the requester if excluded."""
    if request.approvers <= 1:
        return
    if principal is None:
        raise NotAllowed(
            f"request {request.id} needs {request.approvers} identified approvers; "
            "an anonymous answer does not count",
            [request.id],
        )
    if request.exclude_requester and principal.same_as(request.requested_by):
        raise NotAllowed(
            f"request {request.id}: the requester may not approve their own call", [request.id]
        )


def _session_info(state: SessionState, request: InputRequest) -> SessionInfo:
    turn = state.turn
    return SessionInfo(
        id=state.id,
        agent=state.agent,
        turn=request.turn_id,
        parent=state.parent,
        auth=SessionAuth(
            current=None if turn is None else turn.principal, initiator=state.initiator
        ),
    )
