"""The dashboard's forms that end something on a session's page: "Cancel turn" while a turn runs
or waits on people, "Delete session" once it has finished. Each acts as the signed-in person,
who may as they may see the session (the rule of the API's cancel and delete)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import RedirectResponse, Response

from .._exceptions import SignoffError, UnknownSession
from .._types import Principal
from ._auth import DASHBOARD_PREFIX
from ._context import ServerContext
from ._json_response import JSONText
from ._message_page import dashboard_error, refused, wants_json
from ._notes import DELETED_COOKIE, NOT_CANCELLED_COOKIE, deleted_note, session_mark, set_note
from ._page_data import signed_in
from ._pages import check_csrf, utf8

__all__ = ["router"]

router = APIRouter(prefix=DASHBOARD_PREFIX, include_in_schema=False)


async def _posted(
    request: Request, session_id: str
) -> tuple[ServerContext, Principal, dict[str, str]] | Response:
    """The signed-in person and their form's fields, CSRF-checked, for a session they may see;
    or the error page for one they may not (404, as one that does not exist)."""
    ctx, viewer = await signed_in(request)
    fields = await check_csrf(request)
    try:
        await ctx.session(session_id, viewer)
    except UnknownSession:
        message = f"unknown session {session_id!r}"
        return await dashboard_error(request, 404, "unknown_session", message)
    return ctx, viewer, fields


@router.post("/sessions/{session_id}/cancel")
async def cancel_turn(request: Request, session_id: str) -> Response:
    """Cancel the turn the page showed (the form names it: sent again, or from a page shown
    before, it stops no later turn), with the reason given; then the session's page, which says
    once when that turn had ended already and nothing was cancelled."""
    posted = await _posted(request, session_id)
    if isinstance(posted, Response):
        return posted
    ctx, viewer, fields = posted
    turn = fields.get("turn", "")
    if not turn:
        return await dashboard_error(
            request, 422, "invalid_request", "the form names no turn to cancel: reload the page"
        )
    reason = fields.get("reason", "").strip() or None
    try:
        result = await ctx.runtime.cancel(session_id, reason, principal=viewer, turn_id=turn)
    except SignoffError as exc:
        return await refused(request, exc)
    # Not the result's status: a turn this form's first sending cancelled reads cancelled too.
    cancelled = result.turn_id == turn and result.cancelled
    where = f"{DASHBOARD_PREFIX}/sessions/{session_id}"
    if wants_json(request):
        return JSONText({"ok": True, "cancelled": cancelled, "status": result.status, "url": where})
    response = RedirectResponse(where, status_code=303)
    if not cancelled:
        set_note(response, request, NOT_CANCELLED_COOKIE, session_mark(session_id))
    return response


@router.post("/sessions/{session_id}/delete")
async def delete_session(request: Request, session_id: str) -> Response:
    """Delete a finished session, and its subagents' sessions, once the person ticked that
    they understand it is for good; then the Sessions list, which says what was deleted. A
    session running or waiting, or a subagent's, is refused as the runtime refuses it, nothing
    deleted."""
    posted = await _posted(request, session_id)
    if isinstance(posted, Response):
        return posted
    ctx, viewer, fields = posted
    if fields.get("confirm") != "yes":
        return await dashboard_error(
            request,
            422,
            "invalid_request",
            "tick “I understand this erases the conversation for good” to delete the session",
        )
    reason = fields.get("reason", "").strip() or None
    try:
        deleted = await ctx.runtime.delete_session(session_id, by=viewer, reason=reason)
    except SignoffError as exc:
        return await refused(request, exc)
    where = f"{DASHBOARD_PREFIX}/sessions"
    if wants_json(request):
        return JSONText({"ok": True, "deleted": [utf8(d) for d in deleted], "url": where})
    response = RedirectResponse(where, status_code=303)
    set_note(response, request, DELETED_COOKIE, deleted_note(ctx.secret, deleted))
    return response
