"""`AnswerRefusals`: the refusals an answer meets before anything else is said of it, in
docs/server.md's order: an id that names none of the session's requests, then who may not
answer one (before the session's expiry is told), then the rest (`Answering._settle`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._answers import Reply as _Reply
from ._edit_checks import EditChecks
from ._eligibility import (
    authorize,
    check_policy_present,
    check_quorum_eligibility,
    is_gated,
    policy_recorded,
    refusal,
)
from ._exceptions import SessionExpired, UnknownAgent, UnknownRequest
from ._request_session import request_in
from ._state import SessionState
from ._text import is_utf8
from ._tools import Tool
from ._types import InputRequest, Principal

__all__ = ["AnswerRefusals"]


class AnswerRefusals(EditChecks):
    """`EditChecks` plus who may answer and which ids name a request, told first."""

    async def _checked_first(
        self, session_id: str, answers: Sequence[_Reply], principal: Principal | None
    ) -> SessionState:
        """`_checked`, whose `SessionExpired` (or `UnknownAgent`, a deadline this runtime
        cannot record) comes only after the refusals that come first (`_refuse_first`): who
        could not have answered is refused as before the TTL passed, not told it did."""
        try:
            return await self._checked(session_id)
        except (SessionExpired, UnknownAgent):
            await self._refuse_first(await self._state(session_id), answers, principal)
            raise

    async def _refuse_first(
        self, state: SessionState, answers: Sequence[_Reply], principal: Principal | None
    ) -> list[tuple[_Reply, InputRequest, str, dict[str, Any] | None]]:
        """Each answer with its request's status and resolution, once the refusals that come
        before anything else are raised (docs/server.md's order): `UnknownRequest` naming every
        id that is none of the session's, then `NotAllowed` for who may not answer one (by the
        session's agent's rules if this runtime has it, else as a runtime without it judges)."""
        known: list[tuple[_Reply, InputRequest, str, dict[str, Any] | None]] = []
        unknown: list[str] = []
        for reply in answers:
            rid = reply.request_id
            live = state.requests.get(rid)
            if live is not None:
                known.append((reply, live.request, live.status, live.resolution))
                continue
            # An id holding a lone surrogate names no request (no store can look it up), and
            # one a state holding every request of the session lacks names none. Another
            # session's is not read whole: its refusal costs a missing one's.
            looked_up = state.earlier_requests and is_utf8(rid)
            stored = await request_in(self.store, rid, state.id) if looked_up else None
            if stored is None:
                unknown.append(rid)
            else:
                known.append((reply, stored.request, stored.status, stored.resolution))
        if unknown:
            raise UnknownRequest(state.id, unknown)
        agent = self.agents.get(state.agent)
        for reply, request, status, _ in known:
            tool = None if agent is None else agent.tools.get(request.tool_name or "")
            await self._may_not_answer(request, status, tool, reply, principal, agent is not None)
        return known

    async def _may_not_answer(
        self,
        request: InputRequest,
        status: str,
        tool: Tool | None,
        reply: _Reply,
        principal: Principal | None,
        here: bool = True,
    ) -> None:
        """Raise `NotAllowed` if `principal` may not answer `request` (open, or closed: as they
        could not have answered it open), before anything is said of the answer `reply` (an edit
        of the wrong type, a stale input hash); a response policy decides once it sees it, or
        (judging its decision alone) before that fault is told. A mirror is judged on the
        subagent's request it stands for; `here`: this runtime has the session's agent."""
        decision = reply.option_id if reply.option_id in ("approve", "cancel") else None
        if status != "pending" or request.child is not None:
            opened = decision if status == "pending" else None
            refused = await refusal(self.agents, self.store, request, principal, opened)
            if refused is not None:
                raise refused
            return
        # A request recorded before requests carried the flag: the trail tells.
        recorded = await policy_recorded(self.store, request, tool)
        check_policy_present(request, tool, recorded=recorded, here=here)
        if is_gated(request, tool):
            check_quorum_eligibility(request, principal, decision)
        else:
            authorize(request, principal)

    async def _may_answer(self, request: InputRequest, principal: Principal | None) -> bool:
        """Whether `principal` may answer `request` (for a mirror, the subagent's request)."""
        return await refusal(self.agents, self.store, request, principal) is None
