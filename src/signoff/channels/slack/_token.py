"""A bot token Slack refuses (revoked, invalid, expired, its account deactivated, access
denied) or one lacking a scope a call needs: no retry cures it, a person must. Like a bot out
of its channel, the call raises `ChannelUnreachable`, so the hub holds the channel's feed,
spending no attempt, and delivers what waited, in order, once Slack takes the token again (a
restart with a new token goes on from the same position). What to do is logged as an error
when it starts, when Slack's error changes and every `RELOG_EVERY` seconds while it lasts, not
at each try, and never with the token."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .._base import ChannelUnreachable, logger
from ._payloads import REFUSED_TOKEN, api_error

if TYPE_CHECKING:
    from slack_sdk.errors import SlackApiError

__all__ = ["RELOG_EVERY", "TOKEN_WAIT", "TokenRefusals"]

TOKEN_WAIT = 60.0  # seconds between the tries of a channel whose token or scope Slack refuses
RELOG_EVERY = 900.0  # seconds between the error lines of one refusal that goes on

_NEW_TOKEN = "give the channel a working bot token (xoxb-...) and restart"
_WHAT = {
    "token_revoked": (
        "the bot token was revoked (the app uninstalled, or its tokens revoked)",
        f"reinstall the Slack app to the workspace, {_NEW_TOKEN}",
    ),
    "invalid_auth": (
        "Slack does not accept the bot token (mistyped, or of another app or workspace)",
        f"copy the Bot User OAuth Token from the app's OAuth & Permissions page, {_NEW_TOKEN}",
    ),
    "not_authed": ("no bot token reached Slack", _NEW_TOKEN),
    "account_inactive": (
        "the bot's user or the workspace is deactivated",
        f"reactivate it or reinstall the app, {_NEW_TOKEN}",
    ),
    "token_expired": (
        "the bot token expired (the app rotates its tokens)",
        f"refresh it, or turn token rotation off and reinstall the app, {_NEW_TOKEN}",
    ),
    "ekm_access_denied": (
        "the workspace's Enterprise Key Management denies the app access",
        "ask the workspace's admins to give it back",
    ),
    "org_login_required": (
        "the workspace is being moved into an Enterprise Grid organization",
        "wait for the move to end",
    ),
    "not_allowed_token_type": (
        "the token is not a bot token",
        f"use the Bot User OAuth Token (xoxb-...), {_NEW_TOKEN}",
    ),
}


class TokenRefusals:
    """The refusals of a Slack channel's token: turned into `ChannelUnreachable`, logged."""

    def __init__(self) -> None:
        self.refused: str | None = None  # Slack's error (and the scope needed) being logged
        self.told_at = 0.0  # monotonic time it was last logged

    def check(self, exc: SlackApiError, method: str) -> None:
        """Raise `ChannelUnreachable` (`TOKEN_WAIT` seconds) when Slack refused `method` for
        the token itself or a scope it lacks, logging what to do (see the module)."""
        error = api_error(exc)
        if error == "missing_scope":
            needed = api_error(exc, "needed") or "the one it names"
            what = f"the bot token lacks the scope {needed} that {method} needs"
            todo = (
                f"add {needed} to the app's Bot Token Scopes (OAuth & Permissions) and "
                "reinstall the app to the workspace"
            )
            error = f"missing_scope {needed}"
        elif error in REFUSED_TOKEN:
            what, todo = _WHAT[error]
        else:
            return
        message = (
            f"slack: Slack refused {method}: {what} ({error}): {todo}; the channel's requests "
            f"wait and are delivered in order once Slack takes the token (tried every "
            f"{TOKEN_WAIT:g}s)"
        )
        now = time.monotonic()
        if error != self.refused or now - self.told_at >= RELOG_EVERY:
            logger.error("%s", message)
            self.refused, self.told_at = error, now
        raise ChannelUnreachable(message, TOKEN_WAIT, logged=True) from exc

    def worked(self) -> None:
        """Slack took a call of the channel's: a refusal logged before is over."""
        if self.refused is not None:
            logger.info("slack: Slack takes the bot token again (it refused: %s)", self.refused)
            self.refused = None
