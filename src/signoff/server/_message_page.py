"""A dashboard page that only says something (an error, a refused or repeated answer), with the
navigation every page of a signed-in reviewer has; JSON instead for the dashboard's script."""

from __future__ import annotations

from fastapi import Request
from starlette.responses import HTMLResponse, Response

from .._eligibility import refusal
from .._exceptions import (
    IdempotencyKeyReused,
    InvalidAnswer,
    SignoffError,
    StoreBusy,
    StoreUnavailable,
)
from .._types import InputRequest, Principal
from ._auth import DASHBOARD_PREFIX
from ._context import get_context
from ._errors import public_message, status_for
from ._json_response import JSONText
from ._page_data import base
from ._pages import env, render

__all__ = [
    "bare_error_page",
    "dashboard_error",
    "error_page",
    "form_fault",
    "message_page",
    "refused",
    "wants_json",
    "wants_page",
]


def wants_json(request: Request) -> bool:
    """Whether the dashboard's own script asked (it sends `Accept: application/json`)."""
    return "application/json" in request.headers.get("accept", "")


def wants_page(request: Request) -> bool:
    """Whether a browser asked, to show what it gets (a page it went to, a form it posted):
    it accepts HTML, where the page's script asks for JSON and an API client for anything."""
    return "text/html" in request.headers.get("accept", "").lower() and not wants_json(request)


async def message_page(
    request: Request,
    status: int,
    title: str,
    message: str,
    *,
    code: str | None = None,
    hint: str | None = None,
) -> HTMLResponse:
    """A page saying `message` (and an error's `code`, as the API names it), with the navigation
    back to the queue when someone is signed in (an error page without it left a reviewer only
    the browser's Back button)."""
    ctx = get_context(request)
    viewer = await ctx.principal(request)
    shared = {"viewer": None} if viewer is None else base(ctx, viewer)
    return await render(
        "message.html",
        request,
        status,
        title=title,
        message=message,
        error=code,
        hint=hint,
        **shared,
    )


_TITLES = {
    404: "Not found",
    503: "The server cannot reach its store",
}
_HINTS = {
    503: "Reload the page in a little while: the dashboard works again once the server reaches "
    "its store. What you sent may not have been taken; sending it again is safe (the same "
    "answer, or a form sent twice, counts once).",
}


async def error_page(request: Request, status: int, code: str, message: str) -> HTMLResponse:
    """A failure on a dashboard address (its store down, no such page) as a page for a browser,
    which showed the API's JSON as it is. With the navigation of a signed-in reviewer, unless
    telling who is signed in fails too (a sign-in cookie is checked in the store): then
    without it."""
    title = _TITLES.get(status, "That did not work")
    hint = _HINTS.get(status)
    try:
        return await message_page(request, status, title, message, code=code, hint=hint)
    except SignoffError as exc:
        get_context(request).met(exc)
        return bare_error_page(request, status, code, message)


def bare_error_page(request: Request, status: int, code: str, message: str) -> HTMLResponse:
    """`error_page` without the navigation, drawn without asking who is signed in (neither the
    authenticator nor the store): for a refusal that must not depend on them, as a body over
    the limit, refused before the request reaches the store's time bound (`PromptStore`)."""
    html = env.get_template("message.html").render(
        prefix=DASHBOARD_PREFIX,
        csrf="",
        path=request.url.path,
        now=get_context(request).runtime.now(),
        viewer=None,
        title=_TITLES.get(status, "That did not work"),
        message=message,
        error=code,
        hint=_HINTS.get(status),
    )
    return HTMLResponse(html, status)


async def dashboard_error(request: Request, status: int, code: str, message: str) -> Response:
    """An error on a dashboard route: JSON for its scripts, a page for a plain form post."""
    if wants_json(request):
        return JSONText({"ok": False, "error": {"code": code, "message": message}}, status)
    return await message_page(request, status, "That did not work", message, code=code)


_RESENT = "this form was sent already with other content: reload the page to send a new message"


async def refused(request: Request, exc: SignoffError, message: str | None = None) -> Response:
    """The runtime refused what a form asked (nothing was done: sending it again may try again),
    said in `message` or the error's own words; a form sent again with other content is told to
    reload, not about keys. A store down or busy says when to try again, as the API does; a
    store gone is noted (`ServerContext.met`), as the API's error handler notes it."""
    get_context(request).met(exc)
    if isinstance(exc, IdempotencyKeyReused):
        return await dashboard_error(request, 409, "form_already_sent", _RESENT)
    said = public_message(exc) if message is None else message
    response = await dashboard_error(request, status_for(exc), exc.code, said)
    if isinstance(exc, (StoreUnavailable, StoreBusy)):
        response.headers["Retry-After"] = str(exc.retry_after)
    return response


async def form_fault(
    request: Request, asked: InputRequest, viewer: Principal | None, fault: InvalidAnswer
) -> Response:
    """A fault of an answer's form found before the runtime sees it, told only to one who may
    answer `asked`: another is refused as the runtime refuses them, before the answer's faults
    (README, "Who may answer is checked first"). Counted as the runtime counts a refusal."""
    runtime = get_context(request).runtime
    try:
        denied = await refusal(runtime.agents, runtime.store, asked, viewer)
    except SignoffError as exc:
        return await refused(request, exc)
    runtime._counts.refuse(denied or fault)
    return await refused(request, denied or fault)
