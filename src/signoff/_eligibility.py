"""Who may answer a request: its tool's response policy, a quorum, four eyes, or by default only
the person whose turn asked; judged, for a mirror, on the subagent's request it stands for."""

from __future__ import annotations

from collections.abc import Mapping

from ._agent import Agent
from ._audit_trail import response_policy_recorded
from ._exceptions import NotAllowed
from ._mirrors import deciding_way, named_as_answered
from ._tools import Tool
from ._types import InputRequest, Principal
from .stores import Store

__all__ = [
    "authorize",
    "check_policy_present",
    "check_quorum_eligibility",
    "excluded_requester",
    "is_gated",
    "policy_recorded",
    "refusal",
    "voted",
]


async def refusal(
    agents: Mapping[str, Agent],
    store: Store,
    request: InputRequest,
    principal: Principal | None,
    decision: str | None = None,
) -> NotAllowed | None:
    """Why `principal` may not answer `request` (`None` if they may, as far as can be told
    before answering: a response policy decides only once it sees the answer). A mirror is
    judged on the request an answer to it settles, the subagent's, under the subagent's tool,
    and its refusal names the mirror as a refusal of an answer through it does. `decision`:
    the one an answer to an open request gives, which a four-eyes refusal names."""
    way = await deciding_way(store, request)
    request = way[-1]
    agent = agents.get(request.agent)
    tool = None if agent is None else agent.tools.get(request.tool_name or "")
    try:
        recorded = await policy_recorded(store, request, tool)
        check_policy_present(request, tool, recorded=recorded, here=agent is not None)
        if is_gated(request, tool):
            check_quorum_eligibility(request, principal, decision)  # the policy or quorum decides
        else:
            authorize(request, principal)
    except NotAllowed as exc:
        return named_as_answered(exc, way)
    return None


async def policy_recorded(store: Store, request: InputRequest, tool: Tool | None) -> bool:
    """For a request recorded before requests carried `response_policy`, whose tool this runtime
    lacks, whether the trail records a response policy for it; no read for any other request."""
    return (
        tool is None
        and not request.response_policy
        and await response_policy_recorded(store, request)
    )


def authorize(request: InputRequest, principal: Principal | None) -> None:
    """Default response policy: only the principal whose turn asked may settle; a request
    asked with no principal is bound to no one, so anyone may (README, "Who may answer")."""
    asker = request.requested_by
    if asker is None:
        return
    if principal is None or not principal.same_as(asker):
        asked_by, who = asker.principal_id, "an anonymous caller"
        if principal is not None:
            who = principal.principal_id
            # "asked by alice; alice may not" would say nothing, and "asked by ops" of a token's
            # holder would send `signoff approve --as ops` (local:ops) to be refused again
            if who == asked_by or principal.authenticator != asker.authenticator:
                # two names that differ only in type (the app, and a user posing as it) say so
                typed = _full_name(asker, False) == _full_name(principal, False) or None
                asked_by, who = _full_name(asker, typed), _full_name(principal, typed)
        hint = ""
        if principal is None:  # from Python, where the answer names no one unless told
            hint = f" (pass principal=, e.g. {_constructor(asker)})"
        raise NotAllowed(
            f"request {request.id} was asked by {asked_by}; {who} may not settle it{hint}",
            [request.id],
        )


def _constructor(principal: Principal) -> str:
    """The `so.Principal(...)` that is `principal` (`same_as`): its issuer and type too, where
    they are not the defaults."""
    args = f"authenticator={principal.authenticator!r}, principal_id={principal.principal_id!r}"
    if principal.issuer is not None:
        args += f", issuer={principal.issuer!r}"
    if principal.principal_type != "user":
        args += f", principal_type={principal.principal_type!r}"
    return f"so.Principal({args})"


def _full_name(principal: Principal, typed: bool | None = None) -> str:
    """`authenticator:id`, with the issuer and type where they tell two of one id apart: the
    type if `typed`, or (None) if it is not `user`."""
    name = f"{principal.authenticator}:{principal.principal_id}"
    if principal.issuer is not None:
        name += f" (issuer {principal.issuer})"
    if typed or (typed is None and principal.principal_type != "user"):
        name += f" ({principal.principal_type})"
    return name


def voted(request: InputRequest, principal: Principal | None) -> bool:
    """Whether `principal`'s approval already counts toward `request`'s quorum, so another
    from them would count nothing (votes are counted by principal id)."""
    return (
        request.approvers > 1
        and request.distinct
        and principal is not None
        and principal.principal_id in request.approved_by
    )


def check_policy_present(
    request: InputRequest, tool: Tool | None, *, recorded: bool = False, here: bool = False
) -> None:
    """A request whose tool's response policy decides who may answer (its flag says so, or it
    is `recorded` in the tool's setting) is settled only where that policy runs; anywhere else
    (a runtime without the agent or the tool) no one may settle it. `here`: this runtime runs
    the request's agent, whose tool lost the policy since (a redeploy), which the error says."""
    if (request.response_policy or recorded) and (tool is None or tool.response_policy is None):
        name = f"{request.agent}.{request.tool_name}"
        where = "which this runtime does not have: answer it from a runtime that runs agent "
        where += repr(request.agent)
        if here:  # "a runtime that runs agent X" would be this one, which cannot either
            where = (
                f"which {name} here no longer has"
                if tool is not None
                else f"and agent {request.agent!r} here has no tool {request.tool_name!r} now"
            ) + ": answer it from a runtime whose tool has that policy, or cancel the turn"
        raise NotAllowed(
            f"request {request.id} is decided by the response policy of {name}, {where}",
            [request.id],
        )


def is_gated(request: InputRequest, tool: Tool | None) -> bool:
    """Whether a rule other than the default one decides who may settle this approval: a
    response policy, a quorum, or the requester's exclusion (four eyes)."""
    return request.kind == "tool-approval" and (
        request.approvers > 1
        or request.exclude_requester
        or (tool is not None and tool.response_policy is not None)
    )


def check_quorum_eligibility(
    request: InputRequest, principal: Principal | None, decision: str | None = None
) -> None:
    """Who may count toward a quorum: an identified principal, not the requester if excluded
    (compared by principal id, the key votes are counted by). `decision` ("approve" or
    "cancel", None before any answer) is what the refusal names."""
    if request.approvers <= 1 and not request.exclude_requester:
        return
    if principal is None:
        raise NotAllowed(
            f"request {request.id} needs {request.approvers} identified approver"
            f"{'s' if request.approvers > 1 else ''}; an anonymous answer does not count",
            [request.id],
        )
    if excluded_requester(request, principal):
        raise NotAllowed(f"request {request.id}: {_own_call(decision)}", [request.id])


def excluded_requester(request: InputRequest, principal: Principal | None) -> bool:
    """Whether four eyes bars `principal` from settling `request`, as the person who asked it:
    compared by principal id, the key votes are counted by, so the requester answering through
    another surface (`local:alice` for `sso:alice`) is still the requester."""
    asker = request.requested_by
    return (
        request.exclude_requester
        and asker is not None
        and principal is not None
        and principal.principal_id == asker.principal_id
    )


def _own_call(decision: str | None) -> str:
    """Why the requester four eyes bars may not settle their call, as they tried to."""
    if decision == "approve":
        return "the requester may not approve their own call"
    if decision is None:
        return "the requester may not approve or deny their own call"
    # A deny by request id would settle it too; a message of theirs withdraws it instead, sent
    # however the surface sends one (`send`, the dashboard's box, chat, a thread reply).
    return (
        "the requester may not deny their own call by request id; a message from them withdraws it"
    )
