"""What the dashboard's pages show: the signed-in reviewer, the context every page shares, and
the queue, trace and tool rows read from the runtime for the templates."""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from typing import Any
from urllib.parse import urlencode

from fastapi import Request

from .._agent import Agent
from .._approval import guardrail_setting
from .._audit_trail import TOOL_SETTING, TOOLS_STREAM, entries
from .._eligibility import refusal, voted
from .._events import EVENT_TYPES, Event
from .._exceptions import UnknownRequest, UnknownSession
from .._mirrors import deciding_way, named_as_answered
from .._state import SessionState
from .._subagents import tool_gone
from .._trace_content import shown_data
from .._types import ChildRef, InputRequest, Principal
from ..models import Scripted
from ..stores import PendingFilter, SessionSummary
from ..stores._audit import AuditEntry
from ._auth import DASHBOARD_PREFIX, TokenAuth
from ._context import ServerContext, get_context
from ._errors import ApiError
from ._pages import principal_of, viewer_mark, who
from ._route import check_query
from ._trace_summary import trace_summary

__all__ = [
    "PAGE_SIZE",
    "TRACE_ROWS",
    "VIEWER_HEADER",
    "SignIn",
    "answered_by_another",
    "base",
    "query_number",
    "recorded_tools",
    "queue_context",
    "request_place",
    "session_context",
    "sessions_context",
    "setting_history",
    "shown_event",
    "signed_in",
    "tool_rows",
]

PAGE_SIZE = 50

VIEWER_HEADER = "X-Signoff-Viewer"
"""The mark of the viewer a page was made for (`viewer_mark`), sent by its script's reads."""
_ANOTHER = "you have signed in as someone else in another tab"


# -- who is looking --------------------------------------------------------------------------


class SignIn(Exception):
    """The dashboard needs a signed-in reviewer."""


async def signed_in(request: Request) -> tuple[ServerContext, Principal]:
    """The viewer of a dashboard page, who must be signed in, and the page's query string read
    as the API reads one: one not UTF-8 was a filter for U+FFFD (`check_query`)."""
    ctx = get_context(request)
    principal = await ctx.principal(request)
    if principal is None:
        raise SignIn()
    # Signing in as someone else in another tab gives this page's reads the new cookie: they
    # are refused rather than answered as that person (a request of this viewer's said closed,
    # its session deleted); the page then says to sign in again, keeping what was typed.
    said = request.headers.get(VIEWER_HEADER)
    if said is not None and said != viewer_mark(principal):
        raise ApiError(401, "unauthenticated", _ANOTHER)
    check_query(request)
    return ctx, principal


def base(ctx: ServerContext, viewer: Principal, **extra: Any) -> dict[str, Any]:
    agents = ctx.runtime.agents
    return {
        "viewer": viewer,
        "can_sign_out": isinstance(ctx.auth, TokenAuth),
        "agents": agents,
        "demo_agents": sorted(n for n, a in agents.items() if isinstance(a.model, Scripted)),
        **extra,
    }


def query_number(raw: str, default: int, low: int, high: int) -> int:
    """A page or seq from the query string; anything unusable falls back to `default`."""
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        return default
    value = int(raw)
    return value if low <= value <= high else default


# -- the queue -------------------------------------------------------------------------------


def _queue_filter(request: Request) -> tuple[PendingFilter, dict[str, str], int]:
    q = request.query_params
    page = q.get("page", "1")
    number = query_number(page, 1, 1, 1_000_000)
    picked = {k: q[k] for k in ("agent", "tool", "kind") if q.get(k)}
    flt = PendingFilter(
        agent=picked.get("agent"),
        tool_name=picked.get("tool"),
        kind=picked.get("kind"),
        limit=PAGE_SIZE,
        offset=(number - 1) * PAGE_SIZE,
    )
    return flt, picked, number


async def queue_context(request: Request) -> dict[str, Any]:
    ctx, viewer = await signed_in(request)
    flt, picked, page = _queue_filter(request)
    items, total = await ctx.visible_requests(viewer, flt)
    pages = max(1, -(-total // PAGE_SIZE))
    asked = page
    if page > pages:  # the queue shrank below this page (or an old link): show its last page
        page = pages
        flt = replace(flt, offset=(page - 1) * PAGE_SIZE)
        items, total = await ctx.visible_requests(viewer, flt)
        pages = max(1, -(-total // PAGE_SIZE))
    tools = sorted({t for a in ctx.runtime.agents.values() for t in a.tools})
    return base(
        ctx,
        viewer,
        items=items,
        total=total,
        page=page,
        pages=pages,
        picked=picked,
        tool_names=tools,
        shrank=asked if asked > page else None,  # the pager says so
        query=urlencode({**picked, **({"page": page} if page > 1 else {})}),
        page_query=lambda n: urlencode({**picked, "page": n}),
        **await _offers(ctx, viewer, items),
    )


async def request_place(request: Request, request_id: str) -> dict[str, Any]:
    """Where a list of open requests shows one now (its session's with `?in=session`, else the
    queue filtered as the query says): `open`, and the `page` and `url` that list it. A card
    that left its page may only have moved to another (requests before it closed), not closed;
    an open request the list does not show is not `open` there."""
    ctx, viewer = await signed_in(request)
    nowhere: dict[str, Any] = {"open": False, "page": None, "url": None}
    try:
        stored = await ctx.request(request_id, viewer)
    except UnknownRequest:
        return nowhere
    if stored.status != "pending":
        return nowhere
    r = stored.request
    picked: dict[str, str] = {}
    if request.query_params.get("in") == "session":
        try:
            state = await ctx.session(r.session_id, viewer, shown=True)
        except UnknownSession:
            return nowhere
        listed = [p.id for p in state.pending_requests()]
        if request_id not in listed:
            return nowhere
        index = listed.index(request_id)
        path = f"{DASHBOARD_PREFIX}/sessions/{r.session_id}"
    else:
        flt, picked, _ = _queue_filter(request)
        its = {"agent": r.agent, "tool": r.tool_name, "kind": r.kind}
        if any(its[name] != value for name, value in picked.items()):
            return nowhere  # the queue's filter leaves it out
        first = replace(flt, offset=0, limit=1)
        _, total = await ctx.visible_requests(viewer, first)
        _, later = await ctx.visible_requests(viewer, replace(first, after=(r.created_at, r.id)))
        index = total - later - 1
        found = await ctx.visible_requests(viewer, replace(first, offset=max(index, 0)))
        if index < 0 or [q.id for q in found[0]] != [request_id]:
            # Open, but where is not known: the queue changed between these reads.
            return {**nowhere, "open": True}
        path = f"{DASHBOARD_PREFIX}/"
    page = index // PAGE_SIZE + 1
    query = urlencode({**picked, **({"page": page} if page > 1 else {})})
    return {"open": True, "page": page, "url": path + ("?" + query if query else "")}


SESSION_STATUSES = ("idle", "running", "waiting", "failed", "cancelled")


async def sessions_context(request: Request) -> dict[str, Any]:
    """The sessions page: the viewer's sessions as `GET /v1/sessions` lists them, most recently
    active first, filtered by agent and status (an unknown status is no filter)."""
    ctx, viewer = await signed_in(request)
    q = request.query_params
    picked = {k: q[k] for k in ("agent", "status") if q.get(k)}
    if picked.get("status") not in (None, *SESSION_STATUSES):
        del picked["status"]
    page = query_number(q.get("page", "1"), 1, 1, 1_000_000)

    async def read(page: int) -> tuple[list[SessionSummary], int]:
        return await ctx.visible_sessions(
            viewer,
            agent=picked.get("agent"),
            status=picked.get("status"),
            limit=PAGE_SIZE,
            offset=(page - 1) * PAGE_SIZE,
        )

    rows, total = await read(page)
    pages = max(1, -(-total // PAGE_SIZE))
    if page > pages:  # fewer sessions than this page needs (an old link): the last page
        page = pages
        rows, total = await read(page)
    return base(
        ctx,
        viewer,
        rows=rows,
        total=total,
        page=page,
        pages=pages,
        picked=picked,
        statuses=SESSION_STATUSES,
        page_query=lambda n: urlencode({**picked, "page": n}),
    )


async def _offers(
    ctx: ServerContext, viewer: Principal, items: list[InputRequest]
) -> dict[str, Any]:
    """What each card may offer the viewer, judged on the request an answer to it settles
    (`deciding`), by the runtime's own rules: the tool to edit against (`schemas`), why the
    viewer may not answer (`refusals`), where a mirror whose delegate tool is gone can be
    answered instead (`answer_in`) and the quorum their approval already counts toward
    (`votes`)."""
    ways: dict[str, list[InputRequest]] = {}
    for r in items:
        ways[r.id] = await deciding_way(ctx.runtime.store, r)
    deciding = {rid: way[-1] for rid, way in ways.items()}
    refusals, answer_in = await _refusals(ctx, viewer, items, ways)
    return {
        "deciding": deciding,
        "schemas": _schemas(ctx, deciding),
        "refusals": refusals,
        "answer_in": answer_in,
        "votes": {i: d.progress for i, d in deciding.items() if voted(d, viewer)},
    }


async def _refusals(
    ctx: ServerContext,
    viewer: Principal,
    items: list[InputRequest],
    ways: dict[str, list[InputRequest]],
) -> tuple[dict[str, str], dict[str, ChildRef]]:
    """Per request the viewer may see but not answer (another's question, their own call that
    needs someone else, one of a session whose agent this server does not run, a mirror whose
    delegate tool a deploy took away, a question whose asking call's tool it took away), why:
    its card offers no buttons that could only fail. A mirror's is judged on the request it
    stands for (the last of its `deciding_way`) and names the mirror, as an answer's refusal
    does. Second, for a mirror refused for its delegate tool, the subagent's request to answer
    directly, if the viewer may see its session."""
    out: dict[str, str] = {}
    answer_in: dict[str, ChildRef] = {}
    rt = ctx.runtime
    for item in items:
        way = ways[item.id]
        rid, r = item.id, way[-1]
        refused = await refusal(rt.agents, rt.store, r, viewer)
        if refused is not None:
            out[rid] = str(named_as_answered(refused, way))
            continue
        # The runtime refuses such an answer as `unknown_agent`, whoever gives it: it would
        # continue that agent's turn (for a mirror, the subagent's, then each parent's).
        lacking = next((a for a in (r.agent, *(m.agent for m in way)) if a not in rt.agents), None)
        if lacking is not None:
            out[rid] = _elsewhere(rid, lacking)
            continue
        gone = await tool_gone(rt, way)
        if gone is not None:
            out[rid], ref = gone
            if ref is None:  # a question whose tool is gone: no other request to answer
                continue
            try:
                await ctx.session(ref.session_id, viewer)
            except UnknownSession:
                continue  # a session the viewer may not see: no link to it
            answer_in[rid] = ref
    return out, answer_in


def _elsewhere(request_id: str, agent: str) -> str:
    """Why a request of a session whose agent this server does not run cannot be answered here."""
    return (
        f"request {request_id} waits in a session of agent {agent!r}, which this server does"
        f" not run: answer it from a runtime that runs agent {agent!r}"
    )


async def answered_by_another(
    ctx: ServerContext, request_id: str, viewer: Principal, reason: str | None
) -> str | None:
    """Who gave the answer that the viewer's like one repeated, unless it was this very answer
    of theirs (sent twice): a reviewer on a stale page is told their answer changed nothing,
    not that it was theirs; "you" when another tab of theirs gave it with another `reason`
    (an approval's), which this one did not send."""
    stored = await ctx.runtime.store.get_request(request_id)
    if stored is None or stored.resolution is None:  # settled, but its record was damaged
        return "unknown"
    by = stored.resolution.get("by")
    principal = principal_of(by)
    if principal is not None and principal.same_as(viewer):
        return None if stored.resolution.get("reason") == reason else "you"
    return who(by)


async def settled_as(ctx: ServerContext, request_id: str, viewer: Principal) -> str | None:
    """How a settled request was closed, for a reviewer whose other answer it refused: "Already
    denied by Bob (bob)", "Already approved by you" (another tab of theirs); None if its
    record names no one."""
    stored = await ctx.runtime.store.get_request(request_id)
    resolution = (stored.resolution if stored else None) or {}
    by = resolution.get("by")
    if stored is None or by is None:
        return None
    principal = principal_of(by)
    named = "you" if principal is not None and principal.same_as(viewer) else who(by)
    outcome = resolution.get("outcome")
    if stored.request.kind == "tool-approval":
        verb = {"approved": "approved", "cancelled": "denied"}.get(str(outcome), "settled")
    else:
        verb = "answered" if outcome == "answered" else "settled"
    return f"Already {verb} by {named}"


def _schemas(ctx: ServerContext, deciding: dict[str, InputRequest]) -> dict[str, Any]:
    """Per request: the tool's description and input schema (for edit-then-approve)."""
    out: dict[str, Any] = {}
    for rid, r in deciding.items():
        agent = ctx.runtime.agents.get(r.agent)
        if r.tool_name and agent is not None and r.tool_name in agent.tools:
            tool = agent.tools[r.tool_name]
            out[rid] = {"description": tool.description, "schema": tool.json_schema()}
    return out


# -- a session's trace -----------------------------------------------------------------------


def shown_event(ctx: ServerContext, agent: str, event: Event) -> dict[str, Any]:
    """The data of `event`, of a session of `agent`, as the dashboard shows it: each tool call's
    input as a span shows it, secrets masked, or masked whole if this process lacks the agent,
    as a request's card shows it masked (`shown_data`)."""
    known = ctx.runtime.agents.get(agent)
    return shown_data(event.type, event.data, None if known is None else known.tools)


def _rows(ctx: ServerContext, state: SessionState, events: list[Event]) -> list[dict[str, Any]]:
    return [
        {
            "seq": e.seq,
            "type": e.type,
            "family": e.type.split(".")[0],
            "at": e.at,
            "summary": trace_summary(e, state.requests),
            "data": shown_event(ctx, state.agent, e),
        }
        for e in events
    ]


TRACE_ROWS = 300
"""Events a session page shows at once: a long conversation's whole trace, thousands of events,
made pages of megabytes; earlier ones are a link away."""


async def session_context(
    request: Request, session_id: str, after: int, *, upto: int | None = None
) -> dict[str, Any]:
    """A session page's data: with `after`, the events since (at most `TRACE_ROWS`, `more` says
    whether others follow); else the newest `TRACE_ROWS` events, or those ending at `upto`. Its
    open requests are paged as the queue's (`?page=`): a session that asked 5,000 at once made
    a page, and every live read of it, of 13 MB."""
    ctx, viewer = await signed_in(request)
    page = query_number(request.query_params.get("page", "1"), 1, 1, 1_000_000)
    state = await ctx.session(session_id, viewer, shown=True)
    # The trace ends where the state read ends: events another process committed since would
    # put the page's `seq` past its header and cards, and a live page never reads those again.
    if after or (upto is None and state.seq <= TRACE_ROWS):
        start, end = after, min(after + TRACE_ROWS, state.seq)
    elif upto is None or upto >= state.seq:
        upto = None
        start, end = max(0, state.seq - TRACE_ROWS), state.seq
    else:
        start, end = max(0, upto - TRACE_ROWS), upto
    events = []
    if end > start:
        events = await ctx.runtime.store.read_events(session_id, after=start, limit=end - start)
    seq = events[-1].seq if events else after
    waiting = state.pending_requests()
    pages = max(1, -(-len(waiting) // PAGE_SIZE))
    asked, page = page, min(page, pages)  # fewer open requests than this page needs: the last
    pending = waiting[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]
    kept = {"upto": upto} if upto else {}  # the trace's place, kept by the pager's links
    # Past its TTL the session takes no message (`SessionExpired`), whatever its status says
    # (an idle one shows `idle`: nothing is recorded of an expiry that closed nothing), unless
    # a live drive runs its turn on past the TTL (shown `running`), which is not idle.
    expired = state.expired(ctx.runtime.now()) and state.status != "running"
    # A subagent's whose conversation a passed TTL above it ended takes none either
    # (`subagent_orphaned`): the page names the session that expired.
    orphaned = None if expired else await ctx.runtime._lapsed_above(state)
    return base(
        ctx,
        viewer,
        session=state,
        expired=expired,
        orphaned=orphaned,
        rows=_rows(ctx, state, events),
        seq=seq,
        more=seq < state.seq,
        earlier=events[0].seq - 1 if events and not after else 0,
        live=upto is None,
        trace_rows=TRACE_ROWS,
        items=pending,
        total=len(waiting),
        page=page,
        pages=pages,
        shrank=asked if asked > page else None,  # the pager says so
        query=urlencode({**kept, **({"page": page} if page > 1 else {})}),
        page_query=lambda n: urlencode({**kept, "page": n}),
        **await _offers(ctx, viewer, pending),
        event_types=sorted(EVENT_TYPES),
    )


# -- tools -----------------------------------------------------------------------------------


def tool_rows(agent: Agent) -> list[dict[str, Any]]:
    rows = []
    for t in agent.tools.values():
        label = t.approval.label
        rows.append(
            {
                "name": t.name,
                "description": t.description,
                "label": label,
                "detail": t.approval.describe(),
                "guardrail": guardrail_setting(agent.guardrails, t.name),
                "run_as": t.run_as,
                "schema": t.json_schema(),
            }
        )
    return rows


SETTING_HISTORY = 200
"""How many of a tool's setting changes the pages show, the newest."""


async def recorded_tools(ctx: ServerContext) -> list[tuple[str, str]]:
    """The agent and name of every tool whose setting the audit trail records, whether or not
    this runtime has it: a tool a deployment dropped keeps the record of its settings."""
    await ctx.runtime.open()
    found = []
    for stream in await ctx.runtime.store.audit_heads(others=True):
        if stream.startswith(TOOLS_STREAM):
            # A tool's name holds no dot (`TOOL_NAME`); its agent's may.
            agent, dot, tool = stream.removeprefix(TOOLS_STREAM).rpartition(".")
            if dot:
                found.append((agent, tool))
    return sorted(found)


async def setting_history(ctx: ServerContext, agent: str, tool: str) -> list[dict[str, Any]]:
    """The tool's newest `SETTING_HISTORY` approval setting changes as recorded in the audit
    trail, newest first. The trail reads oldest first: its first 200 made a tool changed more
    often show a history that had ended long ago."""
    await ctx.runtime.open()
    newest: deque[AuditEntry] = deque(maxlen=SETTING_HISTORY)
    async for e in entries(ctx.runtime.store, stream=f"{TOOLS_STREAM}{agent}.{tool}"):
        if e.type == TOOL_SETTING:
            newest.append(e)
    return [
        {"at": e.at, "old": e.data.get("old"), "new": e.data.get("new")} for e in reversed(newest)
    ]
