"""How a dashboard page is made: the Jinja environment over `templates/` with the dashboard's
filters, and the CSRF token a page sets and every form posted back must carry.

The token is `nonce.mac`, the mac an HMAC (keyed with the server's secret, if it has one) of
the nonce and the sign-in the page was made for: the principal and the credential it signed in
with. It is kept in a cookie and sent back in the form (or header), and both must be made for
the current sign-in: a token planted by another host (cookie tossing) or left from another
sign-in in the same browser is refused, and a cross-site post carries no cookie at all. The
sign-in form's token is made for no one, so it is valid in every anonymous browser: a post that
the browser's `Sec-Fetch-Site` says another site made is refused as well."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
from importlib.resources import files
from typing import Any

from fastapi import Request
from jinja2 import Environment, PackageLoader, pass_context, select_autoescape
from jinja2.runtime import Context
from markupsafe import Markup
from starlette.responses import HTMLResponse, Response

from .._exceptions import UsageError
from .._text import BIDI, HIDDEN, escape_as_json, utc_text
from .._types import Principal
from ._auth import DASHBOARD_PREFIX, bearer_token, token_cookie
from ._context import get_context
from ._errors import ApiError
from ._form_body import form_fields
from ._option_values import option_value

__all__ = [
    "CLIP",
    "CSRF_COOKIE",
    "HOST_CSRF_COOKIE",
    "check_csrf",
    "csrf_cookie",
    "csrf_key",
    "csrf_token",
    "env",
    "pretty",
    "principal_of",
    "render",
    "set_csrf",
    "utf8",
    "viewer_mark",
    "who",
]

CSRF_COOKIE = "signoff_csrf"
HOST_CSRF_COOKIE = "__Host-signoff_csrf"
"""The CSRF cookie over https, which no other host can set (`Secure`, `Path=/`, no `Domain`): a
page of a sibling subdomain could set a `signoff_csrf` for the parent domain, which the browser
sends beside the dashboard's own, and refuse every form for as long as it lives."""

# How much of a JSON value (a tool input, an event's data) a page shows; a link gives the rest,
# so a huge input neither bloats the page nor pushes its buttons out of reach.
CLIP = 10_000

_SURROGATE = re.compile("[\ud800-\udfff]")


def utf8(text: str) -> str:
    """`text` with any lone surrogate (a model's JSON can carry one; UTF-8 cannot, and a page
    or JSON answer holding one failed as a 500) as U+FFFD."""
    return _SURROGATE.sub("\ufffd", text)


def _shown(value: Any) -> Any:
    """What a page shows of a value: in text, a lone surrogate (a model's JSON can carry one;
    UTF-8 cannot, and the page failed) becomes U+FFFD and a character that reorders the text
    around it shows as its escape (`\\u202e`), as in Slack."""
    if not isinstance(value, str):
        return value
    text = BIDI.sub(escape_as_json, utf8(value))
    return Markup(text) if isinstance(value, Markup) else text


env = Environment(
    loader=PackageLoader("signoff.server", "templates"),
    autoescape=select_autoescape(["html"]),
    trim_blocks=True,
    lstrip_blocks=True,
    finalize=_shown,
)


_YEAR = 31_557_600
"""A Julian year in seconds (365.25 days), as the terminal's `duration` counts years."""


@pass_context
def _ago(context: Context, ts: float | None) -> str:
    """How long ago `ts` was (or how far ahead), at the page's `now`: the runtime's clock,
    which stamped the times shown (on PostgreSQL the database's, not this machine's). A
    century or more reads in years, and past 9999 of them `over 9999 years`, not a number of
    days hundreds of digits long (a deadline `expires_in=1e300` away is valid)."""
    if ts is None:
        return "—"
    delta = context["now"] - ts
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
    elif delta < 100 * _YEAR:
        text = f"{round(delta / 86400)} days"
    elif delta < 10_000 * _YEAR:
        text = f"{int(delta // _YEAR)} years"
    else:
        text = "over 9999 years"
    return f"in {text}" if future else f"{text} ago"


def _iso(ts: float | None) -> str:
    """`ts` as a UTC date and time; one past the years a datetime holds (a request that may
    wait 1e12 seconds) is named by the bound it passes, as its raising made the page a 500."""
    if ts is None or ts != ts:  # NaN
        return ""
    return utc_text(ts, "%Y-%m-%d %H:%M:%S UTC")


def pretty(value: Any) -> str:
    """`value` as indented JSON, as the pages show it, with hidden characters escaped (they can
    only be in its strings, so the text still parses to `value`)."""
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)
    return HIDDEN.sub(escape_as_json, text)


def principal_of(value: object) -> Principal | None:
    """A stored principal as one, or None when it is not one (an old or hand-edited store):
    pages name it "unknown" rather than fail."""
    if isinstance(value, Principal):
        return value
    if not isinstance(value, dict):
        return None
    try:
        return Principal.model_validate(value)
    except Exception:
        return None


def who(p: object) -> str:
    if p is None:
        return "the application"
    if isinstance(p, str):
        return p
    principal = principal_of(p)
    if principal is None:
        return "unknown"
    name = principal.attributes.get("name")
    if isinstance(name, str) and name:
        return f"{name} ({principal.principal_id})"
    return principal.principal_id


def viewer_mark(principal: Principal) -> str:
    """A mark of `principal`'s full identity (as `Principal.same_as` compares it; a digest, so
    any text fits a header): a page holds its viewer's, which its script's reads send back."""
    identity = [principal.authenticator, principal.issuer, principal.principal_type]
    text = json.dumps([*identity, principal.principal_id])  # ASCII: a lone surrogate escaped
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _usd(value: float) -> str:
    return f"${value:,.4f}" if value < 1 else f"${value:,.2f}"


def _asset_version() -> str:
    """A hash of the static files, in their URLs: they are served without a lifetime, so a
    browser may keep an old copy for days, and an upgraded page would run the old script."""
    digest = hashlib.sha256()
    static = files("signoff.server").joinpath("static")
    for item in sorted(static.iterdir(), key=lambda f: f.name):
        digest.update(item.read_bytes())
    return digest.hexdigest()[:12]


env.globals.update(clip_at=CLIP, asset_version=_asset_version())


def _bdi(value: object) -> Markup:
    """`value` (text a model, tool, person or channel wrote) in `<bdi>`: isolated, so
    right-to-left text in it cannot reorder the words and punctuation beside it."""
    return Markup("<bdi>{}</bdi>").format(value)


env.filters.update(
    ago=_ago,
    bdi=_bdi,
    iso=_iso,
    option_value=option_value,
    pretty=pretty,
    who=who,
    usd=_usd,
    viewer_mark=viewer_mark,
)


async def render(name: str, request: Request, code: int = 200, **context: Any) -> HTMLResponse:
    token = await csrf_token(request)
    html = env.get_template(name).render(
        prefix=DASHBOARD_PREFIX,
        csrf=token,
        path=request.url.path,
        now=get_context(request).runtime.now(),
        # The nav marks a page it links to; a form posted to a listing's path is not that page.
        listing=request.method in ("GET", "HEAD"),
        **context,
    )
    response = HTMLResponse(html, status_code=code)
    set_csrf(request, response, token)
    return response


# -- CSRF: a token bound to the sign-in, in a cookie and in the form (or header) -------------


def csrf_key(secret: str | bytes | None) -> bytes:
    """The key of the CSRF tokens, from `secret`. Without one the key is fixed, so processes and
    restarts agree, and a token is unforgeable only through the sign-in's credential it binds."""
    if secret is None:
        return hashlib.sha256(b"signoff-csrf\0").digest()
    if isinstance(secret, str):
        try:
            secret = secret.encode()
        except UnicodeEncodeError:  # a lone surrogate: a byte of the environment not UTF-8
            raise UsageError("the server's secret is not valid Unicode text") from None
    if not isinstance(secret, bytes) or not secret:
        raise UsageError("the server's secret must be a non-empty str or bytes")
    return hashlib.sha256(b"signoff-csrf\0" + secret).digest()


async def _sign_in(request: Request) -> bytes:
    """Who the request is signed in as: the principal (None if none) and its credential."""
    principal = await get_context(request).principal(request)
    who: list[str | None] | None = None
    if principal is not None:  # its full identity; the default issuer and type as before
        who = [principal.authenticator, principal.principal_id]
        if principal.issuer is not None or principal.principal_type != "user":
            who += [principal.issuer, principal.principal_type]
    credential = bearer_token(request) or request.cookies.get(token_cookie(request), "")
    return json.dumps([who, credential]).encode()


def _mac(request: Request, sign_in: bytes, nonce: str) -> str:
    key: bytes = get_context(request).secret
    digest = hmac.new(key, sign_in + b"\0" + nonce.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _valid(request: Request, token: str, sign_in: bytes) -> bool:
    nonce, dot, mac = token.partition(".")
    if not dot or not nonce or not token.isascii():
        return False
    return hmac.compare_digest(_mac(request, sign_in, nonce).encode(), mac.encode())


def csrf_cookie(request: Request) -> str:
    """The name of the CSRF cookie for this request: the `__Host-` one over https."""
    return HOST_CSRF_COOKIE if request.url.scheme == "https" else CSRF_COOKIE


async def csrf_token(request: Request) -> str:
    """This page's token: the browser's own when it was made for this sign-in, else a new one."""
    cached = getattr(request.state, "csrf", None)
    if isinstance(cached, str):
        return cached
    sign_in = await _sign_in(request)
    token = request.cookies.get(csrf_cookie(request), "")
    if not _valid(request, token, sign_in):
        nonce = secrets.token_urlsafe(18)
        token = f"{nonce}.{_mac(request, sign_in, nonce)}"
    request.state.csrf = token
    return token


def set_csrf(request: Request, response: Response, token: str) -> None:
    """Keep `token` in the browser's cookie (when it does not hold it already)."""
    name = csrf_cookie(request)
    if request.cookies.get(name) != token:
        secure = request.url.scheme == "https"
        response.set_cookie(
            name,
            token,
            httponly=True,
            samesite="strict",
            secure=secure,
            path="/" if secure else DASHBOARD_PREFIX,  # a `__Host-` cookie's path is `/`
        )


# What a browser's `Sec-Fetch-Site` names a post that no page of this origin made. A sibling
# subdomain or another port is "same-site": it could plant a CSRF cookie, and an anonymous
# visitor's token (the sign-in form's) is valid for every anonymous browser.
_OTHER_SITES = frozenset({"same-site", "cross-site"})


async def check_csrf(request: Request) -> dict[str, str]:
    """The posted form's fields, once its token and the cookie's were both made for this
    sign-in (they may differ: two tabs loaded at once each got their own), and the browser
    does not say another site posted it. A body that is not a readable form is 400
    `malformed_form`, and one naming a field twice 422 `invalid_request` (`form_fields`)."""
    fields = await form_fields(request)
    if request.headers.get("sec-fetch-site", "same-origin").strip().lower() in _OTHER_SITES:
        raise ApiError(
            403, "csrf_failed", "the form was posted from another site: use the dashboard's own"
        )
    cookie = request.cookies.get(csrf_cookie(request), "")
    sent = request.headers.get("x-csrf-token") or fields.get("csrf", "")
    sign_in = await _sign_in(request)
    if not _valid(request, cookie, sign_in) or not _valid(request, sent, sign_in):
        raise ApiError(
            403,
            "csrf_failed",
            "the form's CSRF token is missing, or not the one for this sign-in: reload the page",
        )
    return fields
