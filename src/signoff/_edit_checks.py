"""`EditChecks`: an approver's edit is a new call, checked before its answer settles: the tool's
response policy judges the answer, then its approval policy and guardrails the edit (an `auto()`
review with `review_edits`, whose cost the answer's record bills). A part of `Answering`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from . import _mirrors
from ._approval import ApprovalContext, Verdict
from ._candidates import Candidates
from ._exceptions import InvalidAnswer
from ._output_caps import spare
from ._policy_inputs import session_info, typed_input
from ._response import ResponseVerdict
from ._state import SessionState
from ._text import cut
from ._tool_json import result_bound
from ._tools import Tool
from ._types import InputRequest, Principal, Usage

__all__ = ["EditChecks", "bills"]


class EditChecks(Candidates):
    """The checks of answers' edits; the base of `Answering`."""

    async def _review_edit(
        self,
        state: SessionState,
        tool: Tool,
        request: InputRequest,
        wanted: dict[str, Any],
        principal: Principal | None,
        judge: bool,
        reviews: dict[str, Usage],
        check_only: bool,
    ) -> ResponseVerdict | None:
        """`_reviewed_edit` of the edit in `wanted`, whose review's cost is added to `reviews` and
        whose `auto()` verdict goes into `wanted`, for the trail; returns the response policy's
        verdict, if `judge`."""
        rid = request.id
        early, on_edit = await self._reviewed_edit(
            state, tool, request, wanted, principal, judge, reviews, check_only
        )
        usage = None if on_edit is None else on_edit.usage
        if usage is not None:
            reviews[rid] = usage + reviews[rid] if rid in reviews else usage
        if on_edit is not None and on_edit.auto is not None:
            limit = result_bound(tool, self.agent(state.agent).limits)
            wanted["auto_verdict"] = on_edit.auto[0]
            wanted["auto_reason"] = cut(on_edit.auto[1], limit // 8)
        return early

    async def _reviewed_edit(
        self,
        state: SessionState,
        tool: Tool,
        request: InputRequest,
        wanted: dict[str, Any],
        principal: Principal | None,
        judge: bool,
        reviews: Mapping[str, Usage],
        check_only: bool,
    ) -> tuple[ResponseVerdict | None, Verdict | None]:
        """The verdict of the tool's response policy on an answer with an edit (if `judge`),
        then `_check_edit`'s of the edit unless that policy refused the answer: neither the
        approval policy nor a billed review sees an answer that cannot settle the request.
        Once for the check of every answer that settling mirrored requests makes first
        (`_mirrors.REVIEWED`) and the settlement after; that check bills the review as it is
        made, whatever comes of the call after (a TTL passing, its parent's), so the verdict
        kept for the settlement has no usage."""
        edited = wanted["edited_input"]
        memo = _mirrors.REVIEWED.get()
        key = (request.id, json.dumps(edited, sort_keys=True, default=str))
        if memo is not None and key in memo:
            return memo[key] if check_only else memo.pop(key)
        early = await self._judged(state, tool, request, wanted, principal) if judge else None
        verdict = None
        if early is None or early.outcome == "allowed":
            spent = sum(reviews.values(), Usage())
            verdict = await self._check_edit(state, tool, request, edited, spent)
        if memo is not None and check_only:
            memo[key] = (early, verdict if verdict is None else replace(verdict, usage=None))
        return early, verdict

    async def _check_edit(
        self,
        state: SessionState,
        tool: Tool,
        request: InputRequest,
        edited: dict[str, Any],
        spent: Usage,
    ) -> Verdict:
        """An edit is a new call: the tool's approval policy and guardrails must not deny it.
        Returns their verdict, with what their review cost (`auto()` with `review_edits`),
        capped as a proposal's is at what the budgets leave, less what reviews of this answer's
        other edits (`spent`) cost."""
        driver = self._driver(state, None)
        left = spare(await driver.budget_left(), spent)
        ctx = ApprovalContext(
            session=session_info(state, request),
            tool_name=tool.name,
            tool_input=typed_input(tool, edited),
            approved_tools=frozenset(state.approved_tools),
            call_id=request.call_id or "",
            abort_signal=asyncio.Event(),
            pending_tools=frozenset(r.tool_name for r in state.pending_requests() if r.tool_name),
            budget_left=left,
            edited=True,
        )
        # Only a denial refuses the edit: a caution asks a person, and the approver is one.
        verdict = await driver.verdict(tool, ctx, edited)
        if verdict.action == "deny":
            whose = " or a guardrail" if driver.agent.guardrails else ""
            why = f": {verdict.reason}" if verdict.reason else ""
            raise InvalidAnswer(
                f"request {request.id}: {tool.name}'s approval policy{whose} denies the edited "
                f"input{why}",
                [request.id],
            )
        return verdict


def bills(tool: Tool) -> bool:
    """Whether checking an edit of `tool`'s calls may bill a review (`auto(review_edits=True)`)."""
    return bool(getattr(tool.approval, "review_edits", False))
