"""The reviewer dashboard at `/_signoff`: server-rendered pages, a little JS, CSRF-safe forms.
Its routes are here except signing in (`_login`) and the forms that cancel a turn or delete a
session (`_session_end`); `_pages` renders a page and checks a form's CSRF
token, `_page_data` reads and shapes what a page shows and `_message_page` shows an error."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import (
    HTMLResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)

from .._answers import check_text
from .._exceptions import (
    ConflictingAnswer,
    InvalidAnswer,
    SignoffError,
    StoreError,
    UnknownRequest,
    UnknownSession,
)
from .._prompts import check_prompt
from .._results import GenerateResult
from .._text import NOTHING_SAID, is_blank
from .._types import InputRequest, InputResponse, Principal
from ..stores import PendingFilter
from ._audit_rows import audit_row
from ._auth import DASHBOARD_PREFIX
from ._context import get_context
from ._dashboard_edits import edit_recorded, posted_edit, posted_object
from ._errors import public_message
from ._forms import Refusal, form_key, form_token
from ._json_response import JSONText
from ._login import return_to
from ._message_page import dashboard_error, form_fault, message_page, refused, wants_json
from ._notes import (
    DELETED_COOKIE,
    NOT_CANCELLED_COOKIE,
    QUEUED_COOKIE,
    clear_note,
    deleted_told,
    session_mark,
    set_note,
)
from ._option_values import chosen_option
from ._page_data import (
    PAGE_SIZE,
    SignIn,
    answered_by_another,
    base,
    query_number,
    queue_context,
    recorded_tools,
    request_place,
    session_context,
    sessions_context,
    setting_history,
    settled_as,
    shown_event,
    signed_in,
    tool_rows,
)
from ._pages import CSRF_COOKIE, check_csrf, csrf_token, env, pretty, render, set_csrf, utf8
from ._queue_stream import queue_changes
from ._sse import LASTING, stream_response

__all__ = ["CSRF_COOKIE", "SignIn", "router"]

log = logging.getLogger("signoff.server")

router = APIRouter(prefix=DASHBOARD_PREFIX, include_in_schema=False)


# What a form's answer may become and still count as taken (the script's wording follows these).
_ACCEPTED = frozenset({"approved", "cancelled", "answered", "counted"})
_SETTLED = {"approved": "approved", "cancelled": "denied", "answered": "answered"}


def _utf8(text: str | None) -> str | None:
    """A model's text for a JSON answer: one holding a lone surrogate failed as a 500 after
    the answer or message had been taken."""
    return None if text is None else utf8(text)


# -- the queue -------------------------------------------------------------------------------


@router.get("", response_class=HTMLResponse)
@router.get("/", response_class=HTMLResponse)
async def queue_page(request: Request) -> Response:
    return await render("queue.html", request, **await queue_context(request))


@router.get("/fragments/queue", response_class=HTMLResponse)
async def queue_fragment(request: Request) -> Response:
    """The queue's cards as the page's filters pick them, with the pager that says which page
    they are (the last, once the queue shrank below the one asked), and their count in
    `X-Total-Count`."""
    context = await queue_context(request)
    response = await render("_queue_fragment.html", request, **context)
    response.headers["X-Total-Count"] = str(context["total"])
    return response


@router.get("/stream")
async def queue_stream(request: Request) -> Response:
    """Server-wide SSE: a `queue` event whenever the set of visible open requests changes,
    until the viewer's sign-in cookie ends (checked every heartbeat)."""
    ctx, viewer = await signed_in(request)
    try:
        await ctx.open_requests_version()
    except LASTING:
        raise  # a 503 stops the page's EventSource: there is nothing to wait for
    except StoreError:
        pass  # the stream waits this out
    return stream_response(queue_changes(request, ctx, viewer), ctx.streams.take(viewer))


@router.get("/requests/{request_id}/place")
async def request_place_page(request: Request, request_id: str) -> Response:
    """Whether a request is open and which page of a list shows it (JSON): a card that left
    its page while the reviewer wrote in it is said closed only if it closed."""
    return JSONText(await request_place(request, request_id))


_BOTH = (
    "a choice in the menu and an answer typed: send one, not both (set the menu back to "
    "Choose… to send what you typed)"
)
_BOTH_BUTTONS = (
    "an option pressed and an answer typed: send one, not both (clear the box to choose an "
    "option, or press Send answer to send what you typed)"
)


@router.post("/requests/{request_id}/respond")
async def respond(request: Request, request_id: str) -> Response:
    """Settle one request from a dashboard form: an option (approve / deny / an answer) + text."""
    ctx, viewer = await signed_in(request)
    fields = await check_csrf(request)
    # A question's option as its button or menu sent it: a JSON string where a browser would
    # change the id on the way (a line break in it, sent as CRLF).
    option = chosen_option(fields.get("option") or "") or None
    text = (fields.get("text") or "").strip() or None
    try:
        stored = await ctx.request(request_id, viewer)
    except UnknownRequest as exc:
        ctx.runtime._counts.refuse(exc)  # a refused answer, as the API's is counted
        return await dashboard_error(
            request, 404, "unknown_request", f"unknown request {request_id!r}"
        )
    session_id = stored.request.session_id
    edited: dict[str, Any] | None = None
    judged: GenerateResult | None = None  # the policy's verdict on an edit that is no JSON
    action = stored.request.action
    # The hash of the call the page showed, and the edit box: a question's or a session limit's
    # form posts neither, but one sent goes to the runtime, which refuses it as the API does.
    input_hash = fields.get("input_hash") or None
    raw = (fields.get("edited_input") or "").strip()
    if stored.request.kind != "tool-approval":
        if option is not None and text is not None:
            # A choice (a menu's, or an option's button) sent with an answer typed beside it:
            # neither is plainly meant, and the choice taken dropped the typed answer unsaid.
            said = _BOTH if fields.get("menu") else _BOTH_BUTTONS
            return await form_fault(
                request, stored.request, viewer, InvalidAnswer(said, [request_id])
            )
        if raw:
            try:
                edited = posted_object(raw)  # any edit, the call as proposed too
            except InvalidAnswer as exc:
                return await form_fault(request, stored.request, viewer, exc)
    # An approval's Deny ignores the edit box, which a browser's Deny posts too.
    elif option == "approve" and raw and action is not None:
        try:
            edited = posted_edit(stored.request, raw)
        except InvalidAnswer as exc:
            # The response policy's verdict on the bare decision comes before the edit's
            # fault, as the runtime judges an answer it cannot settle (`_bare_verdict`).
            try:
                judged = await ctx.runtime._bare_verdict(session_id, request_id, option, viewer)
            except SignoffError as refusal:
                return await refused(request, refusal)
            if judged is None:
                return await form_fault(request, stored.request, viewer, exc)
    if judged is None:
        answer = InputResponse(
            request_id=request_id,
            option_id=option,
            text=text,
            edited_input=edited,
            input_hash=input_hash,
        )
        try:
            judged = await ctx.runtime.respond(session_id, [answer], principal=viewer)
        except SignoffError as exc:
            message = public_message(exc)
            if isinstance(exc, ConflictingAnswer):
                # A stale page's other answer: who closed the request first, as a like one is.
                closed = await settled_as(ctx, request_id, viewer)
                message = message if closed is None else f"{closed}: {message}"
            return await refused(request, exc, message)
    result = judged
    mine = next((o for o in result.outcomes if o.request_id == request_id), None)
    outcome = None if mine is None else mine.outcome
    already = None
    if mine is not None and not mine.applied and outcome in _SETTLED:
        # An approval's text is its reason; a question's is its answer, which may not differ.
        reason = text if stored.request.kind == "tool-approval" else None
        already = await answered_by_another(ctx, request_id, viewer, reason)
    if wants_json(request):
        took_edit = edited is not None and outcome == "approved"
        took_edit = took_edit and await edit_recorded(ctx, request_id)
        return JSONText(
            {
                "ok": True,
                "request_id": request_id,
                "outcome": outcome,
                "reason": None if mine is None else _utf8(mine.reason),
                "session_id": session_id,
                "status": result.status,
                "text": _utf8(result.text),
                "edited": took_edit,
                "already_by": already,
            }
        )
    if outcome not in _ACCEPTED:  # a response policy refused it: open or closed, not said
        why = f": {mine.reason}" if mine is not None and mine.reason else ""
        message = f"Not accepted ({outcome}){why}. It is for someone else to answer."
        return await message_page(request, 409, "Not accepted", message)
    if already is not None:
        message = f"Already {_SETTLED[str(outcome)]} by {already}: your answer changed nothing."
        return await message_page(request, 200, "Already answered", message)
    # The page the form was on, by the sign-in form's rule: no path that leaves the dashboard.
    return RedirectResponse(return_to(fields.get("next")) or DASHBOARD_PREFIX, status_code=303)


@router.get("/requests/{request_id}/input")
async def request_input(request: Request, request_id: str) -> Response:
    """All of a request's tool input (or payload) as text: a page shows only the start of it."""
    return await _whole(request, request_id, payload=False)


@router.get("/requests/{request_id}/payload")
async def request_payload(request: Request, request_id: str) -> Response:
    """All of the payload a tool asked for approval with, as text."""
    return await _whole(request, request_id, payload=True)


@router.get("/requests/{request_id}/edited")
async def request_edited(request: Request, request_id: str) -> Response:
    """All of the arguments an approver edited a request's call to, as text (the audit shows
    only the start of them); a 404 where no edit is recorded."""
    edited = (await _resolution(request, request_id)).get("edited_input")
    if edited is None:
        return await dashboard_error(
            request, 404, "not_found", f"no edited arguments of request {request_id!r}"
        )
    return PlainTextResponse(pretty(edited))


@router.get("/requests/{request_id}/reason")
async def request_reason(request: Request, request_id: str) -> Response:
    """All of the reason a request was closed with, as text (the audit shows only its start);
    a 404 where none is recorded."""
    reason = (await _resolution(request, request_id)).get("reason")
    if not reason:
        return await dashboard_error(
            request, 404, "not_found", f"no reason recorded for request {request_id!r}"
        )
    return PlainTextResponse(reason if isinstance(reason, str) else pretty(reason))


async def _resolution(request: Request, request_id: str) -> dict[str, Any]:
    """How a request was closed, as recorded, for a reviewer who may see it (else empty)."""
    ctx, viewer = await signed_in(request)
    try:
        stored = await ctx.request(request_id, viewer)
    except UnknownRequest:
        return {}
    return stored.resolution or {}


async def _whole(request: Request, request_id: str, *, payload: bool) -> Response:
    """A request's payload (`payload`) or tool input as text, for a reviewer who may see it."""
    ctx, viewer = await signed_in(request)
    try:
        stored = await ctx.request(request_id, viewer)
    except UnknownRequest:
        return await dashboard_error(
            request, 404, "unknown_request", f"unknown request {request_id!r}"
        )
    asked = stored.request
    if payload or asked.action is None:
        return PlainTextResponse(pretty(asked.payload))
    return PlainTextResponse(pretty(asked.action.input))


# -- a session's trace -----------------------------------------------------------------------


@router.get("/sessions", response_class=HTMLResponse)
async def sessions_page(request: Request) -> Response:
    """Every session the viewer may see, most recently active first, waiting or not; once,
    after a session was deleted from its page, a note that says so."""
    context = await sessions_context(request)
    cookie = request.cookies.get(DELETED_COOKIE)
    deleted = deleted_told(get_context(request).secret, cookie) if cookie else None
    response = await render("sessions.html", request, **context, deleted=deleted)
    if cookie is not None:  # told once: a reload does not tell it again
        clear_note(response, request, DELETED_COOKIE)
    return response


@router.get("/sessions/{session_id}", response_class=HTMLResponse)
async def session_page(request: Request, session_id: str) -> Response:
    upto = query_number(request.query_params.get("upto", ""), 0, 1, 2**53) or None
    try:
        context = await session_context(request, session_id, 0, upto=upto)
    except UnknownSession:
        return await message_page(request, 404, "No such session", session_id)
    ctx, viewer = await signed_in(request)
    form = form_token(ctx.secret, viewer, ctx.runtime.now())
    notes = {
        name: request.cookies.get(name) == session_mark(session_id)
        for name in (QUEUED_COOKIE, NOT_CANCELLED_COOKIE)
    }
    queued, not_cancelled = notes[QUEUED_COOKIE], notes[NOT_CANCELLED_COOKIE]
    response = await render(
        "session.html", request, **context, form=form, queued=queued, not_cancelled=not_cancelled
    )
    for name, told in notes.items():
        if told:  # told once: a reload does not tell it again
            clear_note(response, request, name)
    return response


@router.get("/sessions/{session_id}/events/{seq}")
async def session_event(request: Request, session_id: str, seq: str) -> Response:
    """All of one event's data as text: the trace shows only the start of it."""
    ctx, viewer = await signed_in(request)
    number = query_number(seq, 0, 1, 2**53)
    events = []
    agent = ""
    try:
        agent = (await ctx.session(session_id, viewer)).agent
    except UnknownSession:
        pass  # a foreign session's events do not exist for this viewer either
    else:
        if number:
            events = await ctx.runtime.store.read_events(session_id, after=number - 1, limit=1)
    if not events or events[0].seq != number:
        return await dashboard_error(
            request, 404, "not_found", f"no event {seq!r} in session {session_id!r}"
        )
    return PlainTextResponse(pretty(shown_event(ctx, agent, events[0])))


@router.get("/new", response_class=HTMLResponse)
async def new_session_page(request: Request) -> Response:
    ctx, viewer = await signed_in(request)
    picked = request.query_params.get("agent")
    form = form_token(ctx.secret, viewer, ctx.runtime.now())
    return await render("new.html", request, **base(ctx, viewer, picked=picked, form=form))


def _repeated(
    request: Request, secret: bytes, viewer: Principal, now: float, where: str
) -> Response:
    """A form's second sending, sent where the first one led: with the token for the form's
    next message, for a script, as a first sending."""
    if wants_json(request):
        fresh = form_token(secret, viewer, now)
        return JSONText({"ok": True, "repeated": True, "url": where, "form": fresh})
    return RedirectResponse(where, status_code=303)


@router.post("/sessions")
async def start_session(request: Request) -> Response:
    """Start a conversation from the dashboard, as the signed-in person: once per form (its
    token's nonce is the call's idempotency key)."""
    ctx, viewer = await signed_in(request)
    fields = await check_csrf(request)
    agent = fields.get("agent", "")
    message = fields.get("message", "").strip()
    if agent not in ctx.runtime.agents:
        return await dashboard_error(request, 422, "unknown_agent", f"unknown agent {agent!r}")
    if is_blank(message):
        return await dashboard_error(
            request, 422, "invalid_request", "write a message to start with"
        )
    now = ctx.runtime.now()
    key = form_key(ctx.secret, viewer, fields.get("form"), now, ctx.sign_in_lifetime)
    if isinstance(key, Refusal):
        return await dashboard_error(request, key.status, key.code, key.message)
    try:
        check_prompt(message)  # before anything is recorded
        result = await ctx.runtime.generate(agent, prompt=message, auth=viewer, idempotency_key=key)
    except SignoffError as exc:
        return await refused(request, exc)
    where = f"{DASHBOARD_PREFIX}/sessions/{result.session_id}"
    if result.replayed:
        return _repeated(request, ctx.secret, viewer, now, where)
    if wants_json(request):
        return JSONText({"ok": True, "session_id": result.session_id, "url": where})
    return RedirectResponse(where, status_code=303)


@router.post("/sessions/{session_id}/messages")
async def send_message(request: Request, session_id: str) -> Response:
    """Send a message to a session (it answers, steers or queues, as `Runtime.send` decides),
    once per form. A JSON answer carries the token for the form's next message."""
    ctx, viewer = await signed_in(request)
    fields = await check_csrf(request)
    text = fields.get("message", "").strip()
    try:
        await ctx.session(session_id, viewer)
    except UnknownSession:
        return await dashboard_error(
            request, 404, "unknown_session", f"unknown session {session_id!r}"
        )
    if is_blank(text):
        return await dashboard_error(
            request, 422, "invalid_request", NOTHING_SAID.format(what="the message")
        )
    now = ctx.runtime.now()
    key = form_key(ctx.secret, viewer, fields.get("form"), now, ctx.sign_in_lifetime)
    if isinstance(key, Refusal):
        return await dashboard_error(request, key.status, key.code, key.message)
    where = f"{DASHBOARD_PREFIX}/sessions/{session_id}"
    try:
        check_text(text, "the message")
        result = await ctx.runtime.send(session_id, text, principal=viewer, idempotency_key=key)
    except SignoffError as exc:
        return await refused(request, exc)
    if result.replayed:
        return _repeated(request, ctx.secret, viewer, now, where)
    if wants_json(request):
        fresh = form_token(ctx.secret, viewer, ctx.runtime.now())
        return JSONText(
            {
                "ok": True,
                "status": result.status,
                "text": _utf8(result.text),
                "queued": result.queued,
                "form": fresh,
            }
        )
    response = RedirectResponse(where, status_code=303)
    if result.queued:  # a form's post (no script) is told on the page it lands on
        set_note(response, request, QUEUED_COOKIE, session_mark(session_id))
    return response


@router.get("/fragments/sessions/{session_id}")
async def session_fragment(request: Request, session_id: str) -> Response:
    """New trace rows after `?after=` plus the refreshed header, message box (or why there is
    none) and the page of open requests `?page=` asks (the last, once fewer are open) with its
    pager, as JSON."""
    raw = request.query_params.get("after", "0")
    after = query_number(raw, 0, 0, 2**53)
    context = await session_context(request, session_id, after)
    token = await csrf_token(request)
    ctx = get_context(request)
    now = ctx.runtime.now()
    common = {
        "prefix": DASHBOARD_PREFIX,
        "csrf": token,
        "path": f"{DASHBOARD_PREFIX}/sessions/{session_id}",  # where a card's form returns to
        "now": now,
        "form": form_token(ctx.secret, context["viewer"], now),  # a message box drawn anew
        **context,
    }
    response = JSONText(
        {
            "seq": context["seq"],
            "more": context["more"],
            "rows": env.get_template("_trace_rows.html").render(**common),
            "header": env.get_template("_session_header.html").render(**common),
            "delete": env.get_template("_session_delete.html").render(**common),
            "send": env.get_template("_session_send.html").render(**common),
            "pending": env.get_template("_queue_items.html").render(**common, compact=True),
            "pager": env.get_template("_pager.html").render(**common),
            "total": context["total"],
        }
    )
    set_csrf(request, response, token)
    return response


# -- tools and audit -------------------------------------------------------------------------


@router.get("/tools", response_class=HTMLResponse)
async def tools_page(request: Request) -> Response:
    """Each agent's tools with their approval setting and its recorded history."""
    ctx, viewer = await signed_in(request)
    agents = []
    for agent in ctx.runtime.agents.values():
        rows = tool_rows(agent)
        for row in rows:
            row["history"] = await setting_history(ctx, agent.name, row["name"])
        agents.append((agent, rows))
    return await render("tools.html", request, **base(ctx, viewer, agent_tools=agents))


@router.get("/audit/tools", response_class=HTMLResponse)
async def tool_changes_page(request: Request) -> Response:
    """Every recorded change of a tool's approval setting, newest first: of every tool the trail
    records, those this runtime does not have too."""
    ctx, viewer = await signed_in(request)
    changes = []
    for agent, name in await recorded_tools(ctx):
        for change in await setting_history(ctx, agent, name):
            changes.append({"agent": agent, "tool": name, **change})
    changes.sort(key=lambda c: c["at"], reverse=True)
    verified = None
    # The check reads every tenant's trail: for a caller who sees them all, as `/metrics` and
    # prune (an admin under the default rule; no one under an app's own `access=`).
    can_verify = ctx.sees_every_request(viewer)
    if request.query_params.get("verify") and can_verify:
        verified = await ctx.runtime.verify_audit()
    return await render(
        "tool_changes.html",
        request,
        **base(
            ctx,
            viewer,
            changes=changes,
            status="tools",
            verified=verified,
            can_verify=can_verify,
        ),
    )


@router.get("/audit", response_class=HTMLResponse)
async def audit_page(request: Request) -> Response:
    """Closed requests, newest first: who settled what, how and why."""
    ctx, viewer = await signed_in(request)
    q = request.query_params
    status = q.get("status", "settled")
    if status not in ("settled", "expired", "withdrawn"):
        status = "settled"
    page_raw = q.get("page", "1")
    page = query_number(page_raw, 1, 1, 1_000_000)
    # oldest first in the store: the newest page is at the end
    _, total = await ctx.visible_requests(viewer, PendingFilter(status=status, limit=1))
    pages = max(1, -(-total // PAGE_SIZE))
    page = min(page, pages)  # past the end (an old link): the last page, as the queue does
    end = max(0, total - (page - 1) * PAGE_SIZE)
    begin = max(0, end - PAGE_SIZE)
    chunk: list[InputRequest] = []
    if end > begin:
        chunk, _ = await ctx.visible_requests(
            viewer, PendingFilter(status=status, limit=end - begin, offset=begin)
        )
    newest = list(reversed(chunk))
    entries = [audit_row(r, await ctx.runtime.store.get_request(r.id)) for r in newest]
    return await render(
        "audit.html",
        request,
        **base(
            ctx,
            viewer,
            entries=entries,
            total=total,
            status=status,
            page=page,
            pages=pages,
        ),
    )
