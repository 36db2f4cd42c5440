"""Signing in to the dashboard and out of it, and where a visitor who is not signed in is sent:
to the sign-in form, told when their sign-in has expired, and back to the page they were on
once signed in (a path of the dashboard only: the form is no open redirect)."""

from __future__ import annotations

import re
from urllib.parse import SplitResult, quote, unquote, urlencode, urlsplit

from fastapi import APIRouter, Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from ._auth import DASHBOARD_PREFIX, DevAuth, TokenAuth, is_dashboard, sign_in_cookie, token_cookie
from ._context import get_context
from ._errors import error_response
from ._json_response import JSONText
from ._message_page import message_page, wants_json
from ._pages import check_csrf, render
from ._route import check_query
from ._sign_ins import issue
from ._throttle import client_of, too_many

__all__ = ["SIGNED_IN_COOKIE", "return_to", "router", "sign_in_redirect"]

router = APIRouter(prefix=DASHBOARD_PREFIX, include_in_schema=False)

SIGNED_IN_COOKIE = "signoff_signed_in"
"""Set with the sign-in cookie and kept `_REMEMBERED` seconds longer (the browser drops the
sign-in cookie when it expires): a visitor holding it and no sign-in is told it expired."""

_REMEMBERED = 30 * 86400
_LOGIN = f"{DASHBOARD_PREFIX}/login"
_NOT_RETURNED_TO = (_LOGIN, f"{DASHBOARD_PREFIX}/logout")
_UNSAFE = re.compile(r"[\x00-\x20\x7f\\]")  # controls, spaces and `\` (which browsers read as /)
_EXPIRED = "your sign-in has expired: sign in again"
# Without TokenAuth there is no sign-in form here: the authenticator (dev mode's, or the
# application's own, a proxy's header or cookie) decides who a request is.
_DEV = "this server does not recognise you: in dev mode only localhost may connect"
_UNRECOGNISED = (
    "this server's authenticator does not recognise you: sign in as you do for this "
    "application, then reload the page"
)


def _split(address: str) -> SplitResult | None:
    """`address`'s parts, or None where `urlsplit` cannot read it (an unclosed or bad IPv6
    bracket, `//[`, which it raises ValueError for: a 500 on a link or a Referer anyone sends)."""
    try:
        return urlsplit(address)
    except ValueError:
        return None


def return_to(target: object) -> str | None:
    """`target` if it is a page of this dashboard to go back to after signing in: a path under
    its prefix with an optional query, holding no scheme, host, backslash, control character or
    dot segment, even once percent-decoded; None for anything else."""
    if not isinstance(target, str) or not 0 < len(target) <= 2000 or not target.isascii():
        return None
    decoded = unquote(target)
    if _UNSAFE.search(target) or _UNSAFE.search(decoded):
        return None
    parts = _split(target)
    if parts is None:
        return None
    path = unquote(parts.path)
    if parts.scheme or parts.netloc or parts.fragment or not is_dashboard(parts.path):
        return None
    if not is_dashboard(path) or any(s in (".", "..") for s in path.split("/")):
        return None
    if path in _NOT_RETURNED_TO or path.startswith(f"{DASHBOARD_PREFIX}/static/"):
        return None
    return target


def _came_from(request: Request) -> str | None:
    """The page to return to: the one asked for, or for a form's post (and a script's fetch)
    the page it was on, by the `Referer` of this same host. The queue itself needs no return."""
    if request.method in ("GET", "HEAD") and not wants_json(request):
        query = request.url.query
        target = quote(request.url.path) + (f"?{query}" if query else "")
    else:
        referer = _split(request.headers.get("referer", ""))
        if referer is None or not referer.netloc or referer.netloc != request.url.netloc:
            return None
        target = referer.path + (f"?{referer.query}" if referer.query else "")
    if target in (DASHBOARD_PREFIX, f"{DASHBOARD_PREFIX}/"):
        return None
    return return_to(target)


def _login_url(next_page: str | None) -> str:
    return _LOGIN if next_page is None else f"{_LOGIN}?{urlencode({'next': next_page})}"


def _had_sign_in(request: Request) -> bool:
    """Whether this browser was signed in here: it holds the marker or a sign-in cookie."""
    return bool(request.cookies.get(SIGNED_IN_COOKIE) or sign_in_cookie(request))


async def sign_in_redirect(request: Request) -> Response:
    """What a visitor of a dashboard page who is not signed in gets: with `TokenAuth` the
    sign-in form, told when their sign-in has expired, returning to the page afterwards; else
    a page saying the authenticator does not recognise them. A script gets a 401
    `unauthenticated` as JSON, which its banner shows."""
    ctx = get_context(request)
    token = isinstance(ctx.auth, TokenAuth)
    if request.url.path.startswith(f"{DASHBOARD_PREFIX}/fragments") or wants_json(request):
        if token:
            message = _EXPIRED if _had_sign_in(request) else "sign in first"
        else:
            message = _DEV if isinstance(ctx.auth, DevAuth) else _UNRECOGNISED
        return JSONText({"error": {"code": "unauthenticated", "message": message}}, 401)
    if token:
        return RedirectResponse(_login_url(_came_from(request)), status_code=303)
    message = _DEV if isinstance(ctx.auth, DevAuth) else _UNRECOGNISED
    said = f"{message[0].upper()}{message[1:]}."
    return await message_page(request, 401, "Not signed in", said, code="unauthenticated")


def _no_form(next_page: str | None) -> Response:
    """The sign-in form's address without `TokenAuth`, which has no token to type: the page to
    return to (or the queue), which the authenticator serves or says it does not recognise."""
    return RedirectResponse(next_page or DASHBOARD_PREFIX, status_code=303)


@router.get("/login", response_class=HTMLResponse)
async def login_page(request: Request) -> Response:
    """The sign-in form (with `TokenAuth`; any other authenticator has none); `?next=` names
    the page to return to once signed in."""
    check_query(request)
    ctx = get_context(request)
    next_page = return_to(request.query_params.get("next"))
    if not isinstance(ctx.auth, TokenAuth):
        return _no_form(next_page)
    expired = _had_sign_in(request) and await ctx.principal(request) is None
    return await render(
        "login.html", request, viewer=None, error=None, expired=expired, next_page=next_page
    )


@router.post("/login")
async def login(request: Request) -> Response:
    """Sign in with a token: a new sign-in cookie, and the browser's earlier sign-in, if any,
    signed out (in every process), so a copy of its cookie no longer signs anyone in."""
    ctx = get_context(request)
    fields = await check_csrf(request)
    token = fields.get("token", "").strip()
    next_page = return_to(fields.get("next"))
    auth = ctx.auth
    if not isinstance(auth, TokenAuth):
        return _no_form(next_page)
    client = client_of(request)
    wait = ctx.failures.retry_after(client) if token else None
    if wait is not None:  # before the token is compared: the answer tells nothing of it
        refusal = too_many(wait)
        if wants_json(request):
            response: Response = error_response(refusal.status, refusal.code, refusal.message)
        else:
            response = await render(
                "login.html",
                request,
                refusal.status,
                viewer=None,
                error=f"Too many failed sign-ins from your address: try again in {wait} s.",
                expired=False,
                next_page=next_page,
            )
        response.headers.update(refusal.headers)
        return response
    principal = auth.lookup(token) if token else None
    if principal is None or ctx.naming(principal) is None:  # no cookie for no one
        if principal is None and token:
            ctx.failures.failed(client)
        return await render(
            "login.html",
            request,
            401,
            viewer=None,
            error="That token is not recognised.",
            expired=False,
            next_page=next_page,
        )
    await ctx.runtime.open()
    now = ctx.runtime.now()
    await ctx.sign_outs.read(ctx.runtime.store, now)
    held = ctx.sign_outs.held(principal, now)
    if held is not None:
        return await _too_many_sign_ins(request, held, next_page)
    earlier = await ctx.sign_in(request)
    if earlier is not None:  # this browser's sign-in before: one browser, one sign-in
        await ctx.sign_out(earlier)
    response = RedirectResponse(next_page or DASHBOARD_PREFIX, status_code=303)
    secure = request.url.scheme == "https"
    lifetime = max(1, int(ctx.sign_in_lifetime))
    # A signed, expiring sign-in, never the token; over https a `__Host-` cookie (Secure,
    # Path=/, no Domain), which a page of a sibling domain cannot plant.
    value = issue(ctx.secret, token, now)
    if ctx.keyless:
        ctx.honoured.add(value)
    response.set_cookie(
        token_cookie(request),
        value,
        max_age=lifetime,
        httponly=True,
        samesite="strict",
        secure=secure,
        path="/",
    )
    response.set_cookie(
        SIGNED_IN_COOKIE,
        "1",
        max_age=lifetime + _REMEMBERED,
        httponly=True,
        samesite="strict",
        secure=secure,
        path=DASHBOARD_PREFIX,
    )
    return response


async def _too_many_sign_ins(request: Request, wait: int, next_page: str | None) -> Response:
    """The refusal of a sign-in whose principal signed out too often within the lifetime."""
    message = (
        "this token was signed in and out too often: its sign-ins until now have ended, and it "
        f"may sign in again in {wait} s"
    )
    if wants_json(request):
        response: Response = error_response(429, "too_many_sign_ins", message)
    else:
        response = await render(
            "login.html",
            request,
            429,
            viewer=None,
            error=f"This token was signed in and out too often: try again in {wait} s.",
            expired=False,
            next_page=next_page,
        )
    response.headers["Retry-After"] = str(wait)
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    """Sign out: the sign-in is revoked in the store, so a copy of the cookie stops working in
    every process too, and the browser is told to drop the cookie (and that it was signed in:
    the form then says nothing of an expired sign-in)."""
    await check_csrf(request)
    ctx = get_context(request)
    grant = await ctx.sign_in(request)
    if grant is not None:
        await ctx.sign_out(grant)
    response = RedirectResponse(_LOGIN, status_code=303)
    secure = request.url.scheme == "https"
    response.delete_cookie(
        token_cookie(request), path="/", httponly=True, samesite="strict", secure=secure
    )
    response.delete_cookie(
        SIGNED_IN_COOKIE, path=DASHBOARD_PREFIX, httponly=True, samesite="strict", secure=secure
    )
    return response
