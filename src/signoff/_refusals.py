"""`Refusals`: what the log says about a response policy's earlier refusals of one person's answer
to one request, read from its turn's start and then only what is new, and the guard that records
that answer's candidate only if no identical one was recorded or is being judged meanwhile."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ._state import SessionState
from ._types import InputRequest
from .stores import Store

__all__ = ["REFUSAL_OUTCOMES", "InFlight", "Lost", "Moved", "Refusals", "ended", "wait_ended"]

REFUSAL_OUTCOMES = frozenset({"rejected", "failed", "timed-out"})
"""A response policy's verdicts that refuse an answer (`ResponseVerdict.outcome`)."""

_POLL = (0.02, 0.5)  # first and longest pause between reads while another judges the same answer


class Moved(Exception):
    """Internal: the session has events the refusals were not read from; read them first."""


class InFlight(Exception):
    """Internal: another call is judging the same person's same decision on the request now
    (candidate `cid`, recorded at `at`): its verdict is waited for, not judged beside it."""

    def __init__(self, cid: str, at: float) -> None:
        super().__init__(cid)
        self.cid = cid
        self.at = at


class Lost(Exception):
    """Internal: a candidate of the same person's same decision on the request is pending past
    the time its judging may take (its process died): it is judged again (`_recover`) before
    this answer is recorded, else both would record the same refusal."""


class Refusals:
    """The (outcome, reason) pairs a response policy refused `by`'s `decision` on `request`
    with, read from the start of the request's turn (a request is asked within its turn, so
    earlier turns hold none of its candidates), and each read after only what is new."""

    def __init__(
        self, store: Store, state: SessionState, request: InputRequest, by: Any, decision: Any
    ) -> None:
        self.store = store
        self.session_id = state.id
        self.request_id = request.id
        self.by = by
        self.decision = decision
        turn = state.turn
        own = turn is not None and turn.id == request.turn_id
        self.seen = turn.first_seq - 1 if own and turn is not None else 0
        self.refused: set[tuple[Any, Any]] = set()

    async def read(self) -> None:
        """Read the candidates recorded since the last read; `seen` is then the head read
        before them, which every event read at or below it is."""
        head = await self.store.head(self.session_id)
        for e in await self.store.read_events(
            self.session_id, self.seen, types=["approval.candidate"]
        ):
            d = e.data
            if self._same(d) and d.get("outcome") in REFUSAL_OUTCOMES:
                self.refused.add((d.get("outcome"), d.get("reason")))
        if head is not None:
            self.seen = max(self.seen, head)

    def _same(self, d: dict[str, Any]) -> bool:
        return (
            d.get("request_id") == self.request_id
            and d.get("by") == self.by
            and d.get("decision") == self.decision
        )

    def guard(self, st: SessionState, now: float, lost_after: float) -> None:
        """Refuse to record the answer's candidate while another candidate of the same answer
        is pending (`InFlight`, or `Lost` once taken for lost), or (`Moved`) on a state with
        events not read: any may be the refusal this answer would record again. A state older
        than the last read is let be: its commit conflicts, and this is asked again on a newer
        one."""
        if st.seq < self.seen:
            return
        for cid, c in st.candidates.items():
            if self._same(c):
                if now - float(c["at"]) < lost_after:
                    raise InFlight(cid, float(c["at"]))
                raise Lost(cid)
        if st.seq > self.seen:
            raise Moved

    async def ended(self, clock: Callable[[], float], cid: str, until: float) -> None:
        """`wait_ended` for candidate `cid` of the request, recorded after the last read."""
        await wait_ended(self.store, self.session_id, self.request_id, cid, self.seen, clock, until)


async def wait_ended(
    store: Store,
    session_id: str,
    request_id: str,
    cid: str,
    after: int,
    clock: Callable[[], float],
    until: float,
) -> None:
    """Wait until candidate `cid`, not ended by seq `after`, is ended (its verdict recorded),
    its request closed, or `until` passed by `clock` (its process died: the next drive judges
    it again), or as many seconds of real time (a clock a test holds still)."""
    pause, longest = _POLL
    loop = asyncio.get_running_loop()
    stop = loop.time() + max(until - clock(), 0.0)
    while clock() < until and loop.time() < stop:
        if await ended(store, session_id, request_id, cid, after):
            return
        await asyncio.sleep(pause)
        pause = min(pause * 2, longest)


async def ended(store: Store, session_id: str, request_id: str, cid: str, after: int) -> bool:
    """Whether candidate `cid`, recorded after seq `after`, is ended, or its request closed."""
    kinds = ["approval.candidate", "approval.settled"]
    for e in await store.read_events(session_id, after, types=kinds):
        if e.data.get("candidate_id") == cid and e.data.get("outcome") != "pending":
            return True
    stored = await store.get_request(request_id)
    return stored is None or stored.status != "pending"
