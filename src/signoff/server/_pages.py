"""How a dashboard page is made: the Jinja environment over `templates/` with the dashboard's
filters, and the double-submit CSRF token a page sets and every form posted back must carry."""

from __future__ import annotations

import hmac
import json
import secrets
import time
from datetime import UTC, datetime
from typing import Any

from fastapi import Request
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.responses import HTMLResponse, Response

from .._types import Principal
from ._auth import DASHBOARD_PREFIX
from ._errors import ApiError

__all__ = ["CSRF_COOKIE", "check_csrf", "csrf_token", "env", "render", "who"]

CSRF_COOKIE = "signoff_csrf"

env = Environment(
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


def who(p: Principal | dict[str, Any] | str | None) -> str:
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


env.filters.update(ago=_ago, iso=_iso, pretty=_pretty, who=who, usd=_usd)


def render(name: str, request: Request, code: int = 200, **context: Any) -> HTMLResponse:
    token = csrf_token(request)
    html = env.get_template(name).render(
        prefix=DASHBOARD_PREFIX, csrf=token, path=request.url.path, **context
    )
    response = HTMLResponse(html, status_code=code)
    _set_csrf(request, response, token)
    return response


# -- CSRF: double submit; the cookie and the form field (or header) must match ---------------


def csrf_token(request: Request) -> str:
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
            CSRF_COOKIE,
            token,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path=DASHBOARD_PREFIX,
        )


async def check_csrf(request: Request) -> dict[str, str]:
    form = await request.form()
    fields = {k: v for k, v in form.items() if isinstance(v, str)}
    cookie = request.cookies.get(CSRF_COOKIE, "")
    sent = request.headers.get("x-csrf-token") or fields.get("csrf", "")
    if not cookie or not sent or not hmac.compare_digest(cookie.encode(), sent.encode()):
        raise ApiError(403, "csrf_failed", "the form's CSRF token is missing or does not match")
    return fields
