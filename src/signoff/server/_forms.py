"""One-time tokens of the dashboard's forms that start a conversation or send a message, so that
a double click or a browser sending a form again acts once: the token's nonce is the idempotency
key of what the form asks the runtime, which acts once per key and viewer, so the second post
is sent where the first one led (the same session) instead of starting or sending again; across
processes and restarts too, since the runtime records the key with the message it sent.

A token is `<issued>.<nonce>.<mac>`: the time its page was made, a random nonce and an HMAC
over them and the viewer (its full identity: authenticator, issuer, type and id), keyed with the
server's key; a token of another viewer, a forged one or one past the sign-in lifetime is
refused.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass

from .._types import Principal

__all__ = ["Refusal", "check_form", "form_key", "form_token"]

_SKEW = 300  # seconds a token's time may be ahead of this process's clock (another process's)


def _viewer(viewer: Principal) -> tuple[str, ...]:
    """The viewer as a token binds it: its full identity (`Principal.same_as`). A principal of
    the default issuer and type, with no NUL to join two fields as another pair's, is bound as
    tokens were before (so pages open across an upgrade still send); any other is its JSON
    form, after another label."""
    fields = (viewer.authenticator, viewer.principal_id)
    if viewer.issuer is None and viewer.principal_type == "user" and "\0" not in "".join(fields):
        return ("signoff-form", *fields)
    exact = [viewer.authenticator, viewer.issuer, viewer.principal_type, viewer.principal_id]
    return ("signoff-form-exact", json.dumps(exact))


def _mac(key: bytes, viewer: Principal, issued: str, nonce: str) -> str:
    """The token's MAC. A lone surrogate in the viewer (a JWT claim's `"\\ud800"`) is encoded
    as the bytes UTF-8 would give it, which no valid text encodes to; valid text is unchanged."""
    raw = "\0".join((*_viewer(viewer), issued, nonce)).encode("utf-8", "surrogatepass")
    return base64.urlsafe_b64encode(hmac.new(key, raw, hashlib.sha256).digest()[:18]).decode()


def form_token(key: bytes, viewer: Principal, now: float) -> str:
    """A new form's token for `viewer`, made at `now`."""
    issued, nonce = str(int(now)), secrets.token_urlsafe(18)
    return f"{issued}.{nonce}.{_mac(key, viewer, issued, nonce)}"


def check_form(
    key: bytes, viewer: Principal, value: str, now: float, lifetime: float
) -> tuple[str, int] | None:
    """The nonce and time of `value` if this server made it for `viewer` within `lifetime` of
    `now`; None for anything else."""
    if not value.isascii() or len(value) > 200:
        return None
    parts = value.split(".")
    if len(parts) != 3 or not parts[0].isdigit() or len(parts[0]) > 15 or not parts[1]:
        return None
    issued = int(parts[0])
    if not now - lifetime < issued <= now + _SKEW:
        return None
    if not hmac.compare_digest(_mac(key, viewer, parts[0], parts[1]).encode(), parts[2].encode()):
        return None
    return parts[1], issued


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a form's sending is refused: an HTTP status, a stable code and a message."""

    status: int
    code: str
    message: str


INVALID = Refusal(
    400, "invalid_form", "this form is out of date or not yours: reload the page and send it again"
)


def form_key(
    key: bytes, viewer: Principal, token: str | None, now: float, lifetime: float
) -> str | Refusal | None:
    """The idempotency key a form's post gives the runtime: None for a post without a token
    (a script's, which acts as asked), a `Refusal` for a token that is not this viewer's."""
    if token is None:
        return None
    checked = check_form(key, viewer, token, now, lifetime)
    return INVALID if checked is None else f"form:{checked[0]}"
