"""A dashboard page that only says something (an error, a refused or repeated answer), with the
navigation every page of a signed-in reviewer has; JSON instead for the dashboard's script."""

from __future__ import annotations

from fastapi import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from ._context import get_context
from ._page_data import base
from ._pages import render

__all__ = ["dashboard_error", "message_page", "wants_json"]


def wants_json(request: Request) -> bool:
    """Whether the dashboard's own script asked (it sends `Accept: application/json`)."""
    return "application/json" in request.headers.get("accept", "")


async def message_page(
    request: Request, status: int, title: str, message: str, *, code: str | None = None
) -> HTMLResponse:
    """A page saying `message` (and an error's `code`, as the API names it), with the navigation
    back to the queue when someone is signed in (an error page without it left a reviewer only
    the browser's Back button)."""
    ctx = get_context(request)
    viewer = await ctx.principal(request)
    shared = {"viewer": None} if viewer is None else base(ctx, viewer)
    return await render(
        "message.html", request, status, title=title, message=message, error=code, **shared
    )


async def dashboard_error(request: Request, status: int, code: str, message: str) -> Response:
    """An error on a dashboard route: JSON for its scripts, a page for a plain form post."""
    if wants_json(request):
        return JSONResponse({"ok": False, "error": {"code": code, "message": message}}, status)
    return await message_page(request, status, "That did not work", message, code=code)
