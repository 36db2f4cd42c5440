"""Reading what Slack sends: an interaction's form, an Events API request's JSON, the
principal of the Slack user behind either, and the error of a failed Web API call."""

from __future__ import annotations

import contextlib
import json
import math
import urllib.parse
from collections import Counter
from typing import TYPE_CHECKING, Any

from ..._exceptions import SignoffError
from ..._form_fields import TOO_MANY_FIELDS, too_many_fields
from ..._json_keys import cut_repr
from ..._text import cut, is_utf8
from ..._types import Principal

if TYPE_CHECKING:
    from slack_sdk.errors import SlackApiError

__all__ = [
    "ABSENT",
    "REFUSED_TOKEN",
    "SlackPayloadError",
    "api_error",
    "check_ids",
    "envelope_of",
    "interaction_of",
    "maybe_done",
    "member_of",
    "retry_after",
    "slack_principal",
]


# Errors that say the bot cannot reach its channel: removed from it (a private one it no longer
# sees), or the channel archived. A person mends that; until then the channel waits.
ABSENT = frozenset({"not_in_channel", "channel_not_found", "is_archived"})

# Errors that say Slack refuses the bot token itself (see `_token`): a person mends that (a
# new token, the app reinstalled, access given back); until then the channel waits.
REFUSED_TOKEN = frozenset(
    {
        "token_revoked",
        "invalid_auth",
        "not_authed",
        "account_inactive",
        "token_expired",
        "ekm_access_denied",
        "org_login_required",
        "not_allowed_token_type",
    }
)

# Errors Slack documents as possibly after part of the call was carried out.
_MAYBE_DONE = frozenset({"internal_error", "fatal_error"})


class SlackPayloadError(SignoffError):
    """A correctly signed interaction or event whose payload signoff cannot read. Its message
    is cut to `MESSAGE_MOST` characters: a parser's error can quote the whole body, which the
    400 would send back (megabytes of it)."""

    code = "invalid_payload"

    def __init__(self, message: str) -> None:
        super().__init__(cut(message, MESSAGE_MOST))


MESSAGE_MOST = 300  # characters of a payload error's message


def slack_principal(team_id: str, user_id: str) -> Principal:
    """The principal of a Slack user: `slack:<team_id>:<user_id>`, authenticator "slack" (the
    team an Enterprise Grid organization's id for its members, see `member_of`)."""
    return Principal(
        authenticator="slack", principal_id=f"slack:{team_id}:{user_id}", principal_type="user"
    )


def member_of(own: object, host_team: object, host_org: object) -> object:
    """The team a Slack user's principal names: on Enterprise Grid (`host_org`, the id of the
    organization the app's installation is in), the organization for one of its members, who
    has one user id across its workspaces but whose payloads name, depending on the surface,
    the organization (`E...`) or the workspace (`T...`); else `own`, the person's own workspace
    or organization as the payload names it (a Slack Connect guest's is not the host's).

    A member is one whose `own` is the organization or the installation's workspace
    (`host_team`): a payload naming only another workspace cannot tell a member of the same
    organization from a guest, and keeps that workspace's id."""
    if isinstance(host_org, str) and host_org and own in (host_org, host_team):
        return host_org
    return own


def interaction_of(body: bytes) -> dict[str, Any]:
    """The JSON `payload` field of an interaction's form; one of more separators than a form
    has fields is refused unparsed (`too_many_fields`). Slack sends each field once, in UTF-8:
    a field named twice (parsers keep the first or the last, a gateway or a log the other) or
    an escape that is not UTF-8 (read as U+FFFD) is refused too."""
    if too_many_fields(body):
        raise SlackPayloadError(f"expected a form with a JSON payload field: {TOO_MANY_FIELDS}")
    try:
        fields = urllib.parse.parse_qsl(
            body.decode(), keep_blank_values=True, strict_parsing=True, errors="strict"
        )
        counts = Counter(name for name, _ in fields)
        twice = next((name for name, count in counts.items() if count > 1), None)
        if twice is not None:
            shown = cut_repr(twice, 100)
            raise SlackPayloadError(
                f"the form names the field {shown} {counts[twice]} times: Slack sends it once"
            )
        payload = json.loads(dict(fields)["payload"])
    # RecursionError: JSON nested deeper than the parser goes, which no retry makes readable
    except (UnicodeDecodeError, ValueError, KeyError, RecursionError) as exc:
        raise SlackPayloadError(f"expected a form with a JSON payload field: {exc}") from None
    if not isinstance(payload, dict):
        raise SlackPayloadError("the payload is not a JSON object")
    return payload


def envelope_of(body: bytes) -> dict[str, Any]:
    """The JSON object of an Events API request (a challenge or an event callback)."""
    try:
        envelope = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise SlackPayloadError(f"expected a JSON Events API request: {exc}") from None
    if not isinstance(envelope, dict):
        raise SlackPayloadError("the event is not a JSON object")
    return envelope


def check_ids(**ids: object) -> None:
    """Refuse (`SlackPayloadError`) an id given as text holding a lone surrogate: JSON can
    escape one (`"\\ud800"`) though Slack never sends one, and no store can keep or look it up
    (a request taken so would fail later, or an endpoint with a 500)."""
    for name, value in ids.items():
        if isinstance(value, str) and not is_utf8(value):
            raise SlackPayloadError(f"the {name} id is not valid Unicode text: a lone surrogate")


def api_error(exc: SlackApiError, field: str = "error") -> str | None:
    """A field (`error`, `needed`) of a failed call's JSON answer; None when there is none, as
    for a gateway's HTML page with a 5xx (which slack_sdk keeps as text, not a dict)."""
    data = getattr(exc.response, "data", None)
    value = data.get(field) if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


def maybe_done(exc: SlackApiError) -> bool:
    """Whether a failed call may have been carried out all the same: a 5xx other than 501 and
    503 (which say the call was not taken; a gateway's 502 or 504 is sent whatever the server
    did), or the errors Slack documents as possibly after "some aspect of the operation
    succeeded"."""
    status = getattr(exc.response, "status_code", None)
    if not isinstance(status, int) or (status >= 500 and status not in (501, 503)):
        return True
    return api_error(exc) in _MAYBE_DONE


def retry_after(exc: SlackApiError) -> float | None:
    """The seconds a 429 says to wait (Retry-After; 1 if it names none), None for other
    errors."""
    response = exc.response
    if response is None or getattr(response, "status_code", None) != 429:
        return None
    wait = 1.0
    headers = getattr(response, "headers", None) or {}
    for name, value in headers.items():
        if str(name).lower() == "retry-after":
            with contextlib.suppress(TypeError, ValueError):
                seconds = float(value[0] if isinstance(value, (list, tuple)) else value)
                if math.isfinite(seconds) and seconds >= 0:
                    wait = seconds
    return wait
