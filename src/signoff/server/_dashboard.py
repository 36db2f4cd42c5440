"""The reviewer dashboard at `/_signoff`: server-rendered pages, a little JS, CSRF-safe forms."""

from __future__ import annotations

import asyncio
import hmac
import json
import secrets
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)

from .._agent import Agent
from .._audit_trail import TOOL_SETTING
from .._events import EVENT_TYPES, Event
from .._exceptions import SignoffError, UnknownSession
from .._types import InputRequest, InputResponse, Principal
from ..models import Scripted
from ..stores import PendingFilter
from ._auth import DASHBOARD_PREFIX, TOKEN_COOKIE, TokenAuth
from ._context import ServerContext, get_context
from ._errors import ApiError, status_for
from ._sse import sse

__all__ = ["CSRF_COOKIE", "router"]

CSRF_COOKIE = "signoff_csrf"
PAGE_SIZE = 50

router = APIRouter(prefix=DASHBOARD_PREFIX, include_in_schema=False)

_env = Environment(
    loader=PackageLoader("signoff.server", "templates"),
    autoescape=select_autoescape(["html"]),
    trim_blocks=True,
    lstrip_blocks=True,
)


def _ago(ts: float | None) -> str:
    if ts is None:
        return "—"
    delta = time.time() - ts
    future = delta < 0
    delta = abs(delta)
    if delta < 45:
        text = "a few seconds"
    elif delta < 90:
        text = "a minute"
    elif delta < 3600:
        text = f"{round(delta / 60)} minutes"
    elif delta < 5400:
        text = "an hour"
    elif delta < 86400:
        text = f"{round(delta / 3600)} hours"
    else:
        text = f"{round(delta / 86400)} days"
    return f"in {text}" if future else f"{text} ago"


def _iso(ts: float | None) -> str:
    if ts is None:
        return ""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)


def _who(p: Principal | dict[str, Any] | str | None) -> str:
    if p is None:
        return "the application"
    if isinstance(p, str):
        return p
    if isinstance(p, dict):
        try:
            p = Principal.model_validate(p)
        except Exception:
            return "unknown"
    name = p.attributes.get("name")
    return f"{name} ({p.principal_id})" if isinstance(name, str) and name else p.principal_id


def _usd(value: float) -> str:
    return f"${value:,.4f}" if value < 1 else f"${value:,.2f}"


_env.filters.update(ago=_ago, iso=_iso, pretty=_pretty, who=_who, usd=_usd)


def _render(name: str, request: Request, code: int = 200, **context: Any) -> HTMLResponse:
    token = _csrf_token(request)
    html = _env.get_template(name).render(
        prefix=DASHBOARD_PREFIX, csrf=token, path=request.url.path, **context
    )
    response = HTMLResponse(html, status_code=code)
    _set_csrf(request, response, token)
    return response


# -- CSRF: double submit; the cookie and the form field (or header) must match ---------------


def _csrf_token(request: Request) -> str:
    token = request.cookies.get(CSRF_COOKIE)
    if token and len(token) >= 32:
        return token
    cached = getattr(request.state, "csrf", None)
    if isinstance(cached, str):
        return cached
    token = secrets.token_urlsafe(32)
    request.state.csrf = token
    return token


def _set_csrf(request: Request, response: Response, token: str) -> None:
    if request.cookies.get(CSRF_COOKIE) != token:
        response.set_cookie(
            CSRF_COOKIE, token, httponly=True, samesite="strict", path=DASHBOARD_PREFIX
        )


async def _check_csrf(request: Request) -> dict[str, str]:
    form = await request.form()
    fields = {k: v for k, v in form.items() if isinstance(v, str)}
    cookie = request.cookies.get(CSRF_COOKIE, "")
    sent = request.headers.get("x-csrf-token") or fields.get("csrf", "")
    if not cookie or not sent or not hmac.compare_digest(cookie.encode(), sent.encode()):
        raise ApiError(403, "csrf_failed", "the form's CSRF token is missing or does not match")
    return fields


# -- who is looking --------------------------------------------------------------------------


class _SignIn(Exception):
    """The dashboard needs a signed-in reviewer."""


async def _viewer(request: Request) -> tuple[ServerContext, Principal]:
    ctx = get_context(request)
    principal = await ctx.principal(request)
    if principal is None:
        raise _SignIn()
    return ctx, principal


def _base(ctx: ServerContext, viewer: Principal, **extra: Any) -> dict[str, Any]:
    agents = ctx.runtime.agents
    return {
        "viewer": viewer,
        "can_sign_out": isinstance(ctx.auth, TokenAuth),
        "agents": agents,
        "demo_agents": sorted(n for n, a in agents.items() if isinstance(a.model, Scripted)),
        **extra,
    }


def _number(raw: str, default: int, low: int, high: int) -> int:
    """A page or seq from the query string; anything unusable falls back to `default`."""
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        return default
    value = int(raw)
    return value if low <= value <= high else default


def _wants_json(request: Request) -> bool:
    return "application/json" in request.headers.get("accept", "")


# -- the queue -------------------------------------------------------------------------------


def _queue_filter(request: Request) -> tuple[PendingFilter, dict[str, str], int]:
    q = request.query_params
    page = q.get("page", "1")
    number = _number(page, 1, 1, 1_000_000)
    picked = {k: q[k] for k in ("agent", "tool", "kind") if q.get(k)}
    flt = PendingFilter(
        agent=picked.get("agent"),
        tool_name=picked.get("tool"),
        kind=picked.get("kind"),
        limit=PAGE_SIZE,
        offset=(number - 1) * PAGE_SIZE,
    )
    return flt, picked, number


async def _queue_context(request: Request) -> dict[str, Any]:
    ctx, viewer = await _viewer(request)
    flt, picked, page = _queue_filter(request)
    items, total = await ctx.visible_requests(viewer, flt)
    tools = sorted({t for a in ctx.runtime.agents.values() for t in a.tools})
    return _base(
        ctx,
        viewer,
        items=items,
        total=total,
        page=page,
        pages=max(1, -(-total // PAGE_SIZE)),
        picked=picked,
        tool_names=tools,
        query=urlencode({**picked, **({"page": page} if page > 1 else {})}),
        page_query=lambda n: urlencode({**picked, "page": n}),
        schemas=_schemas(ctx, items),
    )


def _schemas(ctx: ServerContext, items: list[InputRequest]) -> dict[str, Any]:
    """Per request: the tool's description and input schema (for edit-then-approve)."""
    out: dict[str, Any] = {}
    for r in items:
        agent = ctx.runtime.agents.get(r.agent)
        if r.tool_name and agent is not None and r.tool_name in agent.tools:
            tool = agent.tools[r.tool_name]
            out[r.id] = {"description": tool.description, "schema": tool.json_schema()}
    return out


@router.get("", response_class=HTMLResponse)
@router.get("/", response_class=HTMLResponse)
async def queue_page(request: Request) -> Response:
    return _render("queue.html", request, **await _queue_context(request))


@router.get("/fragments/queue", response_class=HTMLResponse)
async def queue_fragment(request: Request) -> Response:
    return _render("_queue_items.html", request, **await _queue_context(request))


@router.get("/stream")
async def queue_stream(request: Request) -> Response:
    """Server-wide SSE: a `queue` event whenever the set of visible open requests changes."""
    ctx, viewer = await _viewer(request)

    async def changes() -> AsyncIterator[str]:
        last = None
        beat = time.monotonic()
        yield "retry: 1000\n\n"
        while True:
            total, digest = await ctx.queue_version(viewer)
            if digest != last:
                last = digest
                beat = time.monotonic()
                yield sse({"total": total, "version": digest}, event="queue")
            elif time.monotonic() - beat >= ctx.heartbeat:
                beat = time.monotonic()
                yield ": keep-alive\n\n"
            if await request.is_disconnected():
                return
            await asyncio.sleep(ctx.poll_interval)

    return StreamingResponse(
        changes(), media_type="text/event-stream", headers={"Cache-Control": "no-store"}
    )


@router.post("/requests/{request_id}/respond")
async def respond(request: Request, request_id: str) -> Response:
    """Settle one request from a dashboard form: an option (approve / deny / an answer) + text."""
    ctx, viewer = await _viewer(request)
    fields = await _check_csrf(request)
    option = fields.get("option") or None
    text = (fields.get("text") or "").strip() or None
    stored = await ctx.runtime.store.get_request(request_id)
    try:
        if stored is None:
            raise UnknownSession("")
        session_id = stored.request.session_id
        await ctx.session(session_id, viewer)
    except UnknownSession:
        return dashboard_error(request, 404, "unknown_request", f"unknown request {request_id!r}")
    edited: dict[str, Any] | None = None
    input_hash: str | None = None
    action = stored.request.action
    if stored.request.kind != "tool-approval":
        if option is not None:
            text = None  # a chosen option is the answer; the text box is for a typed answer
    else:
        input_hash = fields.get("input_hash") or None
        raw = (fields.get("edited_input") or "").strip()
        if option == "approve" and raw and action is not None:
            try:
                parsed = json.loads(raw)
            except (ValueError, RecursionError) as exc:  # RecursionError: absurd nesting
                return dashboard_error(
                    request, 422, "invalid_answer", f"the edited arguments are not JSON: {exc}"
                )
            if not isinstance(parsed, dict):
                return dashboard_error(
                    request, 422, "invalid_answer", "the edited arguments must be a JSON object"
                )
            if parsed != action.input:
                edited = parsed
    answer = InputResponse(
        request_id=request_id,
        option_id=option,
        text=text,
        edited_input=edited,
        input_hash=input_hash,
    )
    try:
        result = await ctx.runtime.respond(session_id, [answer], principal=viewer)
    except SignoffError as exc:
        return dashboard_error(request, status_for(exc), exc.code, str(exc))
    mine = next((o for o in result.outcomes if o.request_id == request_id), None)
    outcome = None if mine is None else mine.outcome
    if _wants_json(request):
        return JSONResponse(
            {
                "ok": True,
                "request_id": request_id,
                "outcome": outcome,
                "reason": None if mine is None else mine.reason,
                "session_id": session_id,
                "status": result.status,
                "text": result.text,
                "edited": edited is not None,
            }
        )
    back = fields.get("next") or DASHBOARD_PREFIX
    if not back.startswith(DASHBOARD_PREFIX):
        back = DASHBOARD_PREFIX
    return RedirectResponse(back, status_code=303)


def dashboard_error(request: Request, status: int, code: str, message: str) -> Response:
    """An error on a dashboard route: JSON for its scripts, a page for a plain form post."""
    if _wants_json(request):
        return JSONResponse({"ok": False, "error": {"code": code, "message": message}}, status)
    return _render("message.html", request, status, title="That did not work", message=message)


# -- a session's trace -----------------------------------------------------------------------


def _summary(e: Event) -> str:
    d = e.data
    t = e.type
    if t == "session.created":
        return f"Session with {d.get('agent')} opened by {_who(d.get('initiator'))}"
    if t == "turn.started":
        msg = d.get("message")
        return f"“{msg}”" if msg else f"Turn started ({d.get('source', 'message')})"
    if t == "model.completed":
        calls = ", ".join(c.get("name", "?") for c in d.get("tool_calls", []))
        text = d.get("text") or ""
        parts = [f"“{text}”"] if text else []
        if calls:
            parts.append(f"calls {calls}")
        return " — ".join(parts) or "empty response"
    if t in ("tool.started", "tool.step"):
        return f"{d.get('tool_name') or d.get('call_id', '')} {d.get('name', '')}".strip()
    if t == "tool.completed":
        return f"{d.get('tool_name')} → {d.get('status')}"
    if t == "input.requested":
        names = [
            (r.get("action") or {}).get("tool_name") or r.get("question") or r.get("kind")
            for r in d.get("requests", [])
        ]
        return "Waiting for a person: " + ", ".join(str(n) for n in names)
    if t == "approval.settled":
        reason = f": “{d['reason']}”" if d.get("reason") else ""
        verb = "Approved" if d.get("decision") == "approve" else "Denied"
        return f"{verb} by {_who(d.get('by'))}{reason}"
    if t == "input.resolved":
        return f"{d.get('request_id')} {d.get('outcome')}"
    if t == "turn.failed":
        err = d.get("error") or {}
        return str(err.get("message") or err) if err else "failed"
    if t == "turn.completed":
        return "Turn completed"
    if t == "turn.waiting":
        return f"Waiting on {d.get('on', 'input')}"
    if t == "session.waiting":
        return "Idle: waiting for the next message"
    if t == "turn.cancelled":
        return f"Cancelled: {d['reason']}" if d.get("reason") else "Cancelled"
    if t == "turn.message":
        return f"Message: “{d.get('message')}”" + (" (queued)" if d.get("queued") else "")
    return ""


def _rows(events: list[Event]) -> list[dict[str, Any]]:
    return [
        {
            "seq": e.seq,
            "type": e.type,
            "family": e.type.split(".")[0],
            "at": e.at,
            "summary": _summary(e),
            "data": e.data,
        }
        for e in events
    ]


async def _session_context(request: Request, session_id: str, after: int) -> dict[str, Any]:
    ctx, viewer = await _viewer(request)
    state = await ctx.session(session_id, viewer)
    events = await ctx.runtime.store.read_events(session_id, after=after)
    seq = events[-1].seq if events else after
    return _base(
        ctx,
        viewer,
        session=state,
        rows=_rows(events),
        seq=seq,
        items=state.pending_requests(),
        schemas=_schemas(ctx, state.pending_requests()),
        event_types=sorted(EVENT_TYPES),
    )


@router.get("/sessions/{session_id}", response_class=HTMLResponse)
async def session_page(request: Request, session_id: str) -> Response:
    try:
        context = await _session_context(request, session_id, 0)
    except UnknownSession:
        return _render("message.html", request, 404, title="No such session", message=session_id)
    return _render("session.html", request, **context)


@router.get("/new", response_class=HTMLResponse)
async def new_session_page(request: Request) -> Response:
    ctx, viewer = await _viewer(request)
    picked = request.query_params.get("agent")
    return _render("new.html", request, **_base(ctx, viewer, picked=picked))


@router.post("/sessions")
async def start_session(request: Request) -> Response:
    """Start a conversation from the dashboard, as the signed-in person."""
    ctx, viewer = await _viewer(request)
    fields = await _check_csrf(request)
    agent = fields.get("agent", "")
    message = fields.get("message", "").strip()
    if agent not in ctx.runtime.agents:
        return dashboard_error(request, 422, "unknown_agent", f"unknown agent {agent!r}")
    if not message:
        return dashboard_error(request, 422, "invalid_request", "write a message to start with")
    try:
        result = await ctx.runtime.generate(agent, prompt=message, auth=viewer)
    except SignoffError as exc:
        return dashboard_error(request, status_for(exc), exc.code, str(exc))
    where = f"{DASHBOARD_PREFIX}/sessions/{result.session_id}"
    if _wants_json(request):
        return JSONResponse({"ok": True, "session_id": result.session_id, "url": where})
    return RedirectResponse(where, status_code=303)


@router.post("/sessions/{session_id}/messages")
async def send_message(request: Request, session_id: str) -> Response:
    """Send a message to a session (it answers, steers or queues, as `Runtime.send` decides)."""
    ctx, viewer = await _viewer(request)
    fields = await _check_csrf(request)
    text = fields.get("message", "").strip()
    try:
        await ctx.session(session_id, viewer)
    except UnknownSession:
        return dashboard_error(request, 404, "unknown_session", f"unknown session {session_id!r}")
    if not text:
        return dashboard_error(request, 422, "invalid_request", "the message is empty")
    try:
        result = await ctx.runtime.send(session_id, text, principal=viewer)
    except SignoffError as exc:
        return dashboard_error(request, status_for(exc), exc.code, str(exc))
    if _wants_json(request):
        return JSONResponse({"ok": True, "status": result.status, "text": result.text})
    return RedirectResponse(f"{DASHBOARD_PREFIX}/sessions/{session_id}", status_code=303)


@router.get("/fragments/sessions/{session_id}")
async def session_fragment(request: Request, session_id: str) -> Response:
    """New trace rows after `?after=` plus the refreshed header and pending list, as JSON."""
    raw = request.query_params.get("after", "0")
    after = _number(raw, 0, 0, 2**53)
    context = await _session_context(request, session_id, after)
    token = _csrf_token(request)
    common = {"prefix": DASHBOARD_PREFIX, "csrf": token, "path": request.url.path, **context}
    return JSONResponse(
        {
            "seq": context["seq"],
            "rows": _env.get_template("_trace_rows.html").render(**common),
            "header": _env.get_template("_session_header.html").render(**common),
            "pending": _env.get_template("_queue_items.html").render(**common, compact=True),
        }
    )


# -- tools and audit -------------------------------------------------------------------------


def _tool_rows(agent: Agent) -> list[dict[str, Any]]:
    guarded: dict[str, str] = {}
    for g in agent.guardrails:
        deny: frozenset[str] = getattr(g, "deny", frozenset())
        for name in g.tool_names():
            guarded[name] = "Never (denied)" if name in deny else "Always (guardrail)"
    rows = []
    for t in agent.tools.values():
        label = t.approval.label
        rows.append(
            {
                "name": t.name,
                "description": t.description,
                "label": label,
                "detail": t.approval.describe(),
                "guardrail": guarded.get(t.name),
                "run_as": t.run_as,
                "schema": t.json_schema(),
            }
        )
    return rows


@router.get("/tools", response_class=HTMLResponse)
async def tools_page(request: Request) -> Response:
    """Each agent's tools with their approval setting and its recorded history."""
    ctx, viewer = await _viewer(request)
    agents = []
    for agent in ctx.runtime.agents.values():
        rows = _tool_rows(agent)
        for row in rows:
            row["history"] = await _setting_history(ctx, agent.name, row["name"])
        agents.append((agent, rows))
    return _render("tools.html", request, **_base(ctx, viewer, agent_tools=agents))


async def _setting_history(ctx: ServerContext, agent: str, tool: str) -> list[dict[str, Any]]:
    """The tool's approval setting changes as recorded in the audit trail, newest first."""
    entries = await ctx.runtime.audit(stream=f"tools:{agent}.{tool}", limit=200)
    return [
        {"at": e.at, "old": e.data.get("old"), "new": e.data.get("new")}
        for e in reversed(entries)
        if e.type == TOOL_SETTING
    ]


@router.get("/audit/tools", response_class=HTMLResponse)
async def tool_changes_page(request: Request) -> Response:
    """Every recorded change of a tool's approval setting, newest first."""
    ctx, viewer = await _viewer(request)
    changes = []
    for agent in ctx.runtime.agents.values():
        for name in agent.tools:
            for change in await _setting_history(ctx, agent.name, name):
                changes.append({"agent": agent.name, "tool": name, **change})
    changes.sort(key=lambda c: c["at"], reverse=True)
    verified = None
    if request.query_params.get("verify") and viewer.attributes.get("admin") is True:
        verified = await ctx.runtime.verify_audit()
    return _render(
        "tool_changes.html",
        request,
        **_base(ctx, viewer, changes=changes, status="tools", verified=verified),
    )


@router.get("/audit", response_class=HTMLResponse)
async def audit_page(request: Request) -> Response:
    """Closed requests, newest first: who settled what, how and why."""
    ctx, viewer = await _viewer(request)
    q = request.query_params
    status = q.get("status", "settled")
    if status not in ("settled", "expired", "withdrawn"):
        status = "settled"
    page_raw = q.get("page", "1")
    page = _number(page_raw, 1, 1, 1_000_000)
    # oldest first in the store: the newest page is at the end
    _, total = await ctx.visible_requests(viewer, PendingFilter(status=status, limit=1))
    end = max(0, total - (page - 1) * PAGE_SIZE)
    begin = max(0, end - PAGE_SIZE)
    chunk: list[InputRequest] = []
    if end > begin:
        chunk, _ = await ctx.visible_requests(
            viewer, PendingFilter(status=status, limit=end - begin, offset=begin)
        )
    newest = list(reversed(chunk))
    entries = []
    for r in newest:
        stored = await ctx.runtime.store.get_request(r.id)
        resolution = (stored.resolution if stored else None) or {}
        entries.append(
            {
                "request": r,
                "outcome": stored.outcome if stored else None,
                **{
                    "by": resolution.get("by"),
                    "reason": resolution.get("reason"),
                    "value": resolution.get("value"),
                },
            }
        )
    return _render(
        "audit.html",
        request,
        **_base(
            ctx,
            viewer,
            entries=entries,
            total=total,
            status=status,
            page=page,
            pages=max(1, -(-total // PAGE_SIZE)),
        ),
    )


# -- signing in ------------------------------------------------------------------------------


@router.get("/login", response_class=HTMLResponse)
async def login_page(request: Request) -> Response:
    return _render("login.html", request, viewer=None, error=None)


@router.post("/login")
async def login(request: Request) -> Response:
    ctx = get_context(request)
    fields = await _check_csrf(request)
    token = fields.get("token", "").strip()
    auth = ctx.auth
    if not isinstance(auth, TokenAuth) or not token or auth.lookup(token) is None:
        return _render(
            "login.html", request, 401, viewer=None, error="That token is not recognised."
        )
    response = RedirectResponse(DASHBOARD_PREFIX, status_code=303)
    secure = request.url.scheme == "https"
    response.set_cookie(
        TOKEN_COOKIE, token, httponly=True, samesite="strict", secure=secure, path="/"
    )
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    await _check_csrf(request)
    response = RedirectResponse(f"{DASHBOARD_PREFIX}/login", status_code=303)
    response.delete_cookie(TOKEN_COOKIE, path="/")
    return response


def sign_in_redirect(request: Request) -> Response:
    """What an unauthenticated visitor of a dashboard page gets."""
    ctx = get_context(request)
    if isinstance(ctx.auth, TokenAuth):
        if request.url.path.startswith(f"{DASHBOARD_PREFIX}/fragments") or _wants_json(request):
            return JSONResponse(
                {"error": {"code": "unauthenticated", "message": "sign in first"}}, 401
            )
        return RedirectResponse(f"{DASHBOARD_PREFIX}/login", status_code=303)
    return _render(
        "message.html",
        request,
        401,
        viewer=None,
        title="Not signed in",
        message="This server does not recognise you. In dev mode only localhost may connect.",
    )


SignIn = _SignIn
