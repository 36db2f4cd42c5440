"""Who may send a message (not an answer) to a session from a request's Slack thread when the
request's tool has a response policy: the policy judges answers only once it sees them, so
`refusal` lets anyone through, and a message is never judged. Without this check, anyone in
the channel, one the policy refuses every answer, could queue a turn of their own in the
session of the person it serves. The policy is asked, recording nothing, whether it would take
an approve or a deny of theirs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._mirrors import deciding
from ..._policy_inputs import session_info, typed_input
from ..._response import (
    RequestInfo,
    ResponseContext,
    ResponseInfo,
    evaluate_response,
)
from ..._types import InputRequest, Principal

if TYPE_CHECKING:
    from ..._runtime import Runtime

__all__ = ["policy_refuses"]


async def policy_refuses(rt: Runtime, request: InputRequest, principal: Principal) -> bool:
    """Whether the response policy of `request`'s tool (for a mirror, the subagent's) would
    refuse both an approve and a deny from `principal`; False for a request no policy judges."""
    request = await deciding(rt.store, request)
    agent = rt.agents.get(request.agent)
    tool = None if agent is None else agent.tools.get(request.tool_name or "")
    if request.kind != "tool-approval" or tool is None or tool.response_policy is None:
        return False
    state = await rt.state(request.session_id)
    for decision in ("approve", "cancel"):
        info = RequestInfo(  # input of its own for each: what one run changes stays its own
            request_id=request.id,
            call_id=request.call_id or "",
            tool_name=request.tool_name or "",
            tool_input=typed_input(tool, request.input),
            principal=request.requested_by,
            escalated_to=request.escalated_to,
            approved_by=tuple(request.approved_by),
        )
        ctx = ResponseContext(
            request=info,
            response=ResponseInfo(decision=decision, principal=principal),
            session=session_info(state, request),
        )
        verdict = await evaluate_response(tool.response_policy, ctx, tool.response_timeout)
        if verdict.outcome == "allowed":
            return False
    return True
