"""The chaos test's traffic: the test process's side that starts sessions, answers (some twice,
some both ways), cancels and steers, and the ledger of what it asked for and was told.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

import httpx

import signoff as so

from ._chaos_procs import ALICE, CHILD, PARENT

__all__ = ["Chaos", "Ledger", "_root"]


PARENT_CANCELS = 3
LIVE = ("running", "waiting")
_OTHER = {"approve": "cancel", "cancel": "approve", "yes": "no", "no": "yes"}


@dataclass
class Ledger:
    """What the test process asked for and what it was told."""

    decisions: dict[str, str] = field(default_factory=dict)  # request id -> option id sent
    applied: Counter[str] = field(default_factory=Counter)  # acknowledged applied answers
    acknowledged: dict[str, so.InputRequest] = field(default_factory=dict)  # answer acknowledged
    cancelled: dict[str, str | None] = field(default_factory=dict)  # session -> turn cancelled
    messages: dict[str, bool] = field(default_factory=dict)  # text -> acknowledged
    routes: dict[str, str] = field(default_factory=dict)  # child request -> answered on
    swept: dict[str, float] = field(default_factory=dict)  # child of a cancelled parent -> when
    own_turns: set[str] = field(default_factory=set)  # swept children asking in a later turn
    via: Counter[str] = field(default_factory=Counter)  # answers sent on a mirror, on a child
    beaten_by_text: set[str] = field(default_factory=set)  # refused: a message answered
    raced: set[str] = field(default_factory=set)  # answered both ways at once, mirror and child
    acked_options: dict[str, set[str]] = field(default_factory=dict)  # request -> acknowledged
    conflicts: int = 0
    duplicates: int = 0
    lost_transport: int = 0
    unavailable: int = 0
    surprises: list[str] = field(default_factory=list)


class Chaos:
    """The test process's side: starts sessions, answers, cancels, and checks replies."""

    def __init__(
        self, rng: random.Random, front: so.Runtime, http: httpx.AsyncClient, ledger: Ledger
    ) -> None:
        self.rng, self.front, self.http, self.ledger = rng, front, http, ledger
        self.started = 0
        self.cancels = self.parent_cancels = 0
        # Sessions never cancelled: the one whose worker the test froze in a step (and its
        # parent), so that the turn goes on and another process runs the step again.
        self.spared: set[str] = set()
        self._roots: dict[str, str] = {}  # request id -> the request it stands for
        self._delegated: dict[str, str | None] = {}  # child session -> its delegated turn

    def _http_error(self, where: str, r: httpx.Response, allowed: tuple[str, ...]) -> str | None:
        """The error code of a refused request; a code not in `allowed` is a surprise."""
        code = str(r.json().get("error", {}).get("code")) if r.content else ""
        if r.status_code == 503 and code in ("store_unavailable", "store_error"):
            self.ledger.unavailable += 1
        elif code not in allowed:
            self.ledger.surprises.append(f"{where}: HTTP {r.status_code} {r.text[:300]}")
        return code

    async def start_session(self, agent: str) -> None:
        i = self.started
        self.started += 1
        prompt = f"order {1000 + i}" + (" two" if self.rng.random() < 0.5 else "")
        try:
            if self.rng.random() < 0.5:
                r = await self.http.post("/v1/sessions", json={"agent": agent, "message": prompt})
                if r.status_code != 201:
                    self._http_error("create", r, ())
            else:
                await self.front.generate(agent, prompt=prompt, auth=ALICE)
        except httpx.TransportError:
            self.ledger.lost_transport += 1  # serve died: the session may or may not exist
        except so.StoreError as exc:
            self.ledger.surprises.append(f"create: {type(exc).__name__}: {exc}")

    async def answer(self, req: so.InputRequest, option: str, note: str) -> None:
        """Send one answer over HTTP or with `respond`; a reply must be what the rules say."""
        mine = self.ledger.decisions[_root(req)]
        self._roots[req.id] = _root(req)
        if req.child is not None or req.agent == CHILD:
            self.ledger.via["mirror" if req.child is not None else "child"] += 1
        try:
            if self.rng.random() < 0.5:
                body = {"inputResponses": [{"requestId": req.id, "optionId": option}]}
                r = await self.http.post(f"/v1/sessions/{req.session_id}/responses", json=body)
                if r.status_code == 200:
                    applied = r.json()["outcomes"][0]["applied"]
                    self._acknowledged(req, option, mine, bool(applied), note)
                    return
                code = self._http_error(note, r, ("conflicting_answer", "request_closed"))
                self._refused(req.id, option, mine, code, note)
            else:
                res = await self.front.respond(
                    req.session_id,
                    [so.InputResponse(request_id=req.id, option_id=option)],
                    principal=ALICE,
                )
                self._acknowledged(req, option, mine, res.outcomes[0].applied, note)
        except httpx.TransportError:
            self.ledger.lost_transport += 1
        except (so.ConflictingAnswer, so.RequestClosed) as exc:
            self._refused(req.id, option, mine, exc.code, note)
        except so.StoreError as exc:
            self.ledger.surprises.append(f"{note} {req.id}: {type(exc).__name__}: {exc}")

    def _acknowledged(
        self, req: so.InputRequest, option: str, mine: str, applied: bool, note: str
    ) -> None:
        rid = req.id
        self.ledger.acked_options.setdefault(_root(req), set()).add(option)
        if note == "race" and option != mine:  # it won: later answers repeat it (checked later)
            self.ledger.decisions[_root(req)] = option
        elif option != mine:
            self.ledger.surprises.append(f"{note} {rid}: a conflicting answer was accepted")
        self.ledger.acknowledged[rid] = req
        if applied:  # once for a child's request and its mirror together
            self.ledger.applied[_root(req)] += 1

    def _refused(self, rid: str, option: str, mine: str, code: str | None, note: str) -> None:
        if code == "conflicting_answer":
            if option == mine and self._roots.get(rid, rid) not in self.ledger.raced:
                # only if a message answered the question first: checked later
                self.ledger.beaten_by_text.add(rid)
            self.ledger.conflicts += 1
        # request_closed: the session was cancelled (or its turn moved on) meanwhile

    async def cancel(self, session_id: str) -> None:
        via_http = self.rng.random() < 0.5
        if session_id in self.spared:
            return
        try:
            if via_http:
                r = await self.http.post(f"/v1/sessions/{session_id}/cancel", json={})
                if r.status_code != 200:
                    self._http_error("cancel", r, ())
                    return
                status, turn_id = r.json()["status"], r.json()["turn_id"]
            else:
                res = await self.front.cancel(session_id, "chaos", principal=ALICE)
                status, turn_id = res.status, res.turn_id
        except httpx.TransportError:
            self.ledger.lost_transport += 1
            return
        except so.SignoffError as exc:
            self.ledger.surprises.append(f"cancel {session_id}: {type(exc).__name__}: {exc}")
            return
        if status == "cancelled":
            self.ledger.cancelled[session_id] = turn_id
            returned = time.time()
            with contextlib.suppress(so.StoreError):  # the children its cancelled turn delegated
                async for e in self.front.events(session_id, follow=False):
                    if e.turn_id == turn_id and e.type == "tool.step":
                        if e.data["name"] == "subagent.session":
                            self.ledger.swept[str(e.data["result"])] = returned

    async def message(self, session_id: str) -> None:
        """Send a message that names no option: it steers the turn or waits for its end."""
        text = f"note {len(self.ledger.messages)} for {session_id}"
        self.ledger.messages[text] = False
        policy: Literal["steer", "queue"] = self.rng.choice(["steer", "queue"])
        try:
            if self.rng.random() < 0.5:
                body = {"text": text, "turnPolicy": policy}
                r = await self.http.post(f"/v1/sessions/{session_id}/messages", json=body)
                if r.status_code != 200:
                    child = await self._is_child(session_id)
                    self._http_error("message", r, ("session_busy",) if child else ())
                    return
            else:
                await self.front.send(session_id, text, principal=ALICE, turn_policy=policy)
        except httpx.TransportError:
            self.ledger.lost_transport += 1
            return
        except so.SessionBusy as exc:
            if not await self._is_child(session_id):
                self.ledger.surprises.append(f"message {session_id}: SessionBusy: {exc}")
            return
        except so.SignoffError as exc:
            self.ledger.surprises.append(f"message {session_id}: {type(exc).__name__}: {exc}")
            return
        self.ledger.messages[text] = True

    async def _is_child(self, session_id: str) -> bool:
        """Whether the session is a subagent's: a message is refused (`SessionBusy`) while its
        delegated task has not started, which a kill between the delegate call's creating the
        child and starting it leaves so until the parent's turn goes on."""
        async for e in self.front.events(session_id, follow=False):
            return e.type == "session.created" and e.data.get("parent") is not None
        return False

    async def asked_after_cancel(self, pending: list[so.InputRequest]) -> None:
        """A pending request of the delegated turn of a child whose parent's turn the test
        cancelled is a surprise. A later turn of the child, which a message sent to the child
        started (one queued behind the delegated turn starts once the cancel ends it), is the
        child's own: the parent's cancel leaves it alone."""
        for req in pending:
            if req.session_id not in self.ledger.swept or req.child is not None:
                continue
            if req.turn_id == await self._delegated_turn(req.session_id):
                self.ledger.surprises.append(f"{req.id}: a child asks after its parent's cancel")
            else:
                self.ledger.own_turns.add(req.session_id)

    async def _delegated_turn(self, child: str) -> str | None:
        """The child's first turn: the one its parent's delegate call started."""
        if child not in self._delegated:
            async for e in self.front.events(child, follow=False):
                if e.type == "turn.started":
                    self._delegated[child] = e.turn_id
                    break
        return self._delegated.get(child)

    async def round(self, may_cancel: bool) -> None:
        """Answer what is pending (some twice, some in conflict); maybe cancel a session."""
        try:
            pending = await self.front.pending(limit=1000)
        except so.StoreError as exc:
            self.ledger.surprises.append(f"pending: {type(exc).__name__}: {exc}")
            return
        await self.asked_after_cancel(pending)
        sends = []
        sides: dict[str, list[so.InputRequest]] = {}  # child requests and their mirrors
        for req in pending:
            root = _root(req)
            if req.child is not None or req.agent == CHILD:
                sides.setdefault(root, []).append(req)
            if root not in self.ledger.decisions:
                if req.kind == "question":
                    option = self.rng.choice(["yes", "no"])
                else:
                    option = "approve" if self.rng.random() < 0.75 else "cancel"
                self.ledger.decisions[root] = option
                if req.child is not None or req.agent == CHILD:
                    self.ledger.routes[root] = self.rng.choice(["mirror", "child", "both"])
            elif self.rng.random() < 0.5:
                continue  # answered already, perhaps not yet applied: later
            route = self.ledger.routes.get(root, "both")
            side = "mirror" if req.child is not None else "child"
            if may_cancel and route not in (side, "both"):
                continue  # answered on the other side (once the killing stops: on either)
            option = self.ledger.decisions[root]
            sends.append(self.answer(req, option, "answer"))
            if self.rng.random() < 0.3:
                self.ledger.duplicates += 1
                sends.append(self.answer(req, option, "duplicate"))
        for root, reqs in sides.items():  # the other answer on one side at once: one wins
            if len(reqs) == 2 and may_cancel and self.rng.random() < 0.4:
                self.ledger.raced.add(root)
                other = _OTHER[self.ledger.decisions[root]]
                sends.append(self.answer(self.rng.choice(reqs), other, "race"))
        if self.ledger.acknowledged and self.rng.random() < 0.3:  # long after, maybe
            req = self.ledger.acknowledged[self.rng.choice(list(self.ledger.acknowledged))]
            option = self.ledger.decisions[_root(req)]
            if self.rng.random() < 0.5:
                self.ledger.duplicates += 1
                sends.append(self.answer(req, option, "late duplicate"))
            else:
                sends.append(self.answer(req, _OTHER[option], "conflict"))
        if may_cancel and self.rng.random() < 0.08:
            sessions = await self.front.sessions(limit=1000)
            if sessions:
                sends.append(self.message(self.rng.choice(sessions).id))
        if may_cancel and self.rng.random() < 0.08:  # a parent or a child, running or waiting
            agent = self.rng.choice([PARENT, CHILD])
            live = [
                s for s in await self.front.sessions(agent=agent, limit=1000) if s.status in LIVE
            ]
            if live:
                sends.append(self.message(self.rng.choice(live).id))
        self.rng.shuffle(sends)
        await asyncio.gather(*sends)
        if may_cancel and pending and self.rng.random() < 0.04 and self.cancels < 3:
            self.cancels += 1
            await self.cancel(self.rng.choice(pending).session_id)
        if may_cancel and self.rng.random() < 0.05 and self.parent_cancels < PARENT_CANCELS:
            live = [
                s for s in await self.front.sessions(agent=PARENT, limit=1000) if s.status in LIVE
            ]
            if live:  # its child runs its turn or waits on a person
                self.parent_cancels += 1
                await self.cancel(self.rng.choice(live).id)


def _root(req: so.InputRequest) -> str:
    """The request a mirror stands for (the child's); a request that is no mirror itself."""
    return req.id if req.child is None else req.child.request_id
