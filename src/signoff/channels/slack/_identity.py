"""Who a Slack user is: the principal a click, a form's submission or a typed reply acts as.

Without a mapping it is `slack:<team_id>:<user_id>` (`slack_principal`), a name no other
surface gives the same person. With `SlackChannel(identify=...)` the channel looks the user up
(`users.info`, cached) and asks the mapping for the principal they are on the dashboard, the
API or SSO, so four eyes and a distinct quorum see one person wherever they answer.

The mapping is asked only about members of the workspace (or Enterprise Grid organization) the
app is installed in, as `auth.test` names it, and of the teams `external_teams` lists: another
organization's admin in a Slack Connect channel can give a user any email, ours included, so
such a guest stays `slack:<their team>:<user>`.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import aiohttp
from slack_sdk.errors import SlackApiError

from ..._exceptions import SignoffError, UsageError
from ..._sync import in_thread
from ..._types import Principal
from .._base import logger
from ._payloads import api_error, retry_after, slack_principal

if TYPE_CHECKING:
    from ._channel import SlackChannel

__all__ = [
    "CACHE_FOR",
    "CACHED_USERS",
    "LOOKUP_WITHIN",
    "Identities",
    "SlackUserMapping",
    "SlackUserUnknown",
    "by_email",
]

CACHED_USERS = 1000  # users.info answers kept, the least recently used dropped first
CACHE_FOR = 300.0  # seconds one is kept: a changed email or a deactivation shows within them
LOOKUP_WITHIN = 10.0  # seconds users.info and the mapping get, together, per person's action

SlackUserMapping = Callable[
    [str, str, Mapping[str, Any]], "Principal | None | Awaitable[Principal | None]"
]


class SlackUserUnknown(SignoffError):
    """A Slack user the channel cannot map to a principal; its message is what the person is
    told (a mapping raises it to refuse someone with a reason)."""

    code = "slack_user_unknown"


def by_email(
    authenticator: str,
    *,
    issuer: str | None = None,
    domains: Iterable[str] | None = None,
    principals: Iterable[str] | None = None,
) -> Callable[[str, str, Mapping[str, Any]], Principal]:
    """A mapping for `SlackChannel(identify=...)`: the principal of a Slack user is their
    confirmed Slack email as `principal_id` under `authenticator` (and `issuer`), the identity
    your dashboard's SSO gives them. Needs the `users:read` and `users:read.email` scopes;
    `domains` limits it to those email domains. The channel asks it only about its own
    workspace's (or organization's) members and `external_teams`' users: another
    organization's admin sets their users' emails, so one in your domain proves nothing.

    Emails are matched without regard to case, as Slack and most providers treat them (RFC
    5321 lets a local part's case matter; few mail systems use that): the id is the email
    lowercased, or, given the `principals` your other surfaces know, the one of them the email
    names in any case, spelled as they spell it. An email naming two of them (ids that differ
    only in case) is refused, never given to either."""
    if not isinstance(authenticator, str) or not authenticator.strip():
        raise UsageError("by_email needs the authenticator your other surfaces name people with")
    allowed = None if domains is None else {d.lower().lstrip("@") for d in domains}
    if allowed is not None and not all(allowed):
        raise UsageError("by_email: a domain is empty")
    if isinstance(principals, str):
        raise UsageError("by_email: principals is a list of principal ids, not one string")
    known: dict[str, set[str]] = {}
    for pid in principals or ():
        if not isinstance(pid, str) or not pid.strip():
            raise UsageError(f"by_email: a principal id must be text, not {pid!r}")
        known.setdefault(pid.strip().lower(), set()).add(pid)

    def identify(team_id: str, user_id: str, user: Mapping[str, Any]) -> Principal:
        if user.get("deleted") or user.get("is_bot"):
            raise SlackUserUnknown(f"Slack user {user_id} is deactivated or a bot")
        profile = user.get("profile")
        email = profile.get("email") if isinstance(profile, Mapping) else None
        if not isinstance(email, str) or "@" not in email:
            raise SlackUserUnknown(
                f"Slack gave no email for user {user_id}: the Slack app needs the "
                "users:read.email scope (and the user an email)"
            )
        if user.get("is_email_confirmed") is not True:
            raise SlackUserUnknown(f"the email of Slack user {user_id} is not confirmed")
        email = email.strip().lower()
        if allowed is not None and email.rpartition("@")[2] not in allowed:
            raise SlackUserUnknown(f"the email of Slack user {user_id} is not in {sorted(allowed)}")
        named = sorted(known.get(email, ()))
        if len(named) > 1:
            logger.error(
                "slack: the email of user %s names %s principals differing only in case (%s); "
                "neither is given to them",
                user_id,
                len(named),
                ", ".join(named),
            )
            raise SlackUserUnknown(
                f"your email names {len(named)} signoff identities that differ only in case: "
                "ask an administrator to keep one"
            )
        return Principal(
            authenticator=authenticator, principal_id=named[0] if named else email, issuer=issuer
        )

    return identify


class Identities:
    """The principals of one channel's Slack users: `slack_principal` without a mapping; else
    the mapping's, given the user's `users.info` (kept `CACHE_FOR` seconds, `CACHED_USERS` at
    most)."""

    def __init__(
        self,
        channel: SlackChannel,
        identify: SlackUserMapping | None,
        external_teams: Iterable[str] | None = None,
    ) -> None:
        if identify is not None and not callable(identify):
            raise UsageError("SlackChannel: identify must be a callable (team, user, user info)")
        given: object = identify  # typed as a mapping, which by_email itself is not
        if given is by_email:  # else each click failed: by_email() takes an authenticator
            raise UsageError(
                'SlackChannel: identify=by_email is not called: write identify=by_email("sso"), '
                "naming the authenticator your other surfaces give people"
            )
        if isinstance(external_teams, str):
            raise UsageError("SlackChannel: external_teams is a list of team ids, not one string")
        external = list(external_teams or ())
        if external and identify is None:
            raise UsageError("SlackChannel: external_teams is for identify=: give both or neither")
        if not all(isinstance(t, str) and t.strip() and t == t.strip() for t in external):
            raise UsageError(f"SlackChannel: external_teams must be Slack team ids: {external!r}")
        self.channel = channel
        self.identify = identify
        self.external = frozenset(external)
        self.within = LOOKUP_WITHIN
        self._users: OrderedDict[tuple[str, str], tuple[float, Mapping[str, Any]]] = OrderedDict()
        self._home: tuple[frozenset[str], str | None] | None = None  # auth.test's team and org
        self._guests: OrderedDict[tuple[str, str], None] = OrderedDict()  # logged once each

    async def principal(self, team_id: str, user_id: str) -> Principal:
        """The principal a Slack user acts as; `SlackUserUnknown` (its message for them) when
        the mapping refuses them or cannot tell in time."""
        if self.identify is None:
            return slack_principal(team_id, user_id)
        try:
            async with asyncio.timeout(self.within):
                user = await self._eligible(team_id, user_id)
                if user is None:
                    self._note_guest(team_id, user_id)
                    return slack_principal(team_id, user_id)
                found = await self._map(team_id, user_id, user)
        except SlackUserUnknown as exc:
            logger.warning("slack: user %s:%s was refused: %s", team_id, user_id, exc)
            raise
        except TimeoutError:
            logger.warning(
                "slack: telling who %s:%s is took over %gs", team_id, user_id, self.within
            )
            raise SlackUserUnknown(
                "signoff could not tell who you are in time: try again in a moment"
            ) from None
        except Exception as exc:
            logger.warning("slack: telling who %s:%s is failed", team_id, user_id, exc_info=True)
            raise SlackUserUnknown(f"signoff could not tell who you are ({_why(exc)})") from None
        if found is None:
            logger.warning("slack: the mapping refused user %s:%s", team_id, user_id)
            raise SlackUserUnknown("your Slack account is not mapped to a signoff identity")
        if not isinstance(found, Principal):
            logger.error(
                "slack: the mapping gave %r for %s:%s, not a Principal", found, team_id, user_id
            )
            raise SlackUserUnknown("signoff could not tell who you are (a mapping error)")
        if not found.principal_id.strip() or not found.authenticator.strip():
            logger.error("slack: the mapping gave a blank principal for %s:%s", team_id, user_id)
            raise SlackUserUnknown("signoff could not tell who you are (a mapping error)")
        return found

    async def _eligible(self, team_id: str, user_id: str) -> Mapping[str, Any] | None:
        """The `users.info` object of a user the mapping may be asked about, None for a guest.

        One is eligible when both the click's (or reply's) team and `users.info`'s `team_id`
        are the installation's workspace or organization or an `external_teams` one, or, on
        Enterprise Grid, when `users.info`'s `enterprise_user` is of such an organization (a
        member of another of its workspaces)."""
        home, org = await self._installation()
        trusted = home | self.external
        if org is None and team_id not in trusted:
            return None  # a guest: not even looked up
        user = await self._user(team_id, user_id)
        grid = user.get("enterprise_user")
        their_org = grid.get("enterprise_id") if isinstance(grid, Mapping) else None
        if isinstance(their_org, str) and their_org and their_org in trusted:
            return user
        if team_id in trusted and user.get("team_id") in trusted:
            return user
        return None

    async def _installation(self) -> tuple[frozenset[str], str | None]:
        """The ids of the workspace and Enterprise Grid organization the bot token is installed
        in (an org-wide installation may have no workspace), from `auth.test` once it answers."""
        if self._home is None:
            reply = await self._call("auth_test")
            team, org = reply.get("team_id"), reply.get("enterprise_id")
            ids = frozenset(i for i in (team, org) if isinstance(i, str) and i)
            if not ids:
                raise ValueError("auth.test gave neither a team_id nor an enterprise_id")
            self._home = (ids, org if isinstance(org, str) and org else None)
        return self._home

    def _note_guest(self, team_id: str, user_id: str) -> None:
        """Log, once per user (of the last `CACHED_USERS`), why `identify` did not map one."""
        key = (team_id, user_id)
        if key in self._guests:
            self._guests.move_to_end(key)
            return
        self._guests[key] = None
        while len(self._guests) > CACHED_USERS:
            self._guests.popitem(last=False)
        home = ", ".join(sorted(self._home[0])) if self._home is not None else "?"
        logger.warning(
            "slack: user %s of team %s is not of the workspace the app is installed in (%s) "
            "nor of a team external_teams lists, so identify is not asked about them: they act "
            "as %s",
            user_id,
            team_id,
            home,
            slack_principal(team_id, user_id).principal_id,
        )

    async def _user(self, team_id: str, user_id: str) -> Mapping[str, Any]:
        """`users.info`'s user object, from the cache while it is fresh."""
        key, now = (team_id, user_id), time.monotonic()
        cached = self._users.get(key)
        if cached is not None and cached[0] > now:
            self._users.move_to_end(key)
            return cached[1]
        try:
            reply = await self._call("users_info", user=user_id)
        except SlackApiError as exc:
            error = api_error(exc)
            if error == "missing_scope":
                needed = api_error(exc, "needed") or "users:read"
                logger.error(
                    "slack: users.info needs the %s scope: add it to the Slack app", needed
                )
                raise SlackUserUnknown(
                    f"signoff could not look you up: the Slack app lacks the {needed} scope"
                ) from None
            raise
        user = reply.get("user")
        if not isinstance(user, Mapping):
            raise ValueError("users.info gave no user object")
        self._users[key] = (time.monotonic() + CACHE_FOR, user)
        self._users.move_to_end(key)
        while len(self._users) > CACHED_USERS:
            self._users.popitem(last=False)
        return user

    async def _call(self, method: str, **kwargs: Any) -> Any:
        """A Web API call (`users_info`, `auth_test`), made again after a 429's Retry-After
        while that fits in the time a lookup has (`within`; past it the caller's timeout ends
        the wait)."""
        while True:
            try:
                return await getattr(self.channel.client, method)(**kwargs)
            except SlackApiError as exc:
                wait = retry_after(exc)
                if wait is None or wait >= self.within:
                    raise
                await asyncio.sleep(wait)

    async def _map(self, team_id: str, user_id: str, user: Mapping[str, Any]) -> Principal | None:
        """The mapping's answer: an `async` one on the loop, a plain one in a thread (it may
        block on a directory), whose awaitable, if it returns one, is awaited here."""
        identify = self.identify
        assert identify is not None
        if _is_async(identify):
            result: Any = identify(team_id, user_id, user)
        else:
            # Its SystemExit or KeyboardInterrupt is its failure, not the server's end.
            result = await in_thread(identify, team_id, user_id, user)
        if inspect.isawaitable(result):
            result = await result
        return result  # type: ignore[no-any-return]


def _is_async(fn: Callable[..., Any]) -> bool:
    call = getattr(fn, "__call__", None)  # noqa: B004  (an object with an async __call__)
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


def _why(exc: BaseException) -> str:
    """A failed lookup as the person is told it: Slack's error, or the failure's kind."""
    if isinstance(exc, SlackApiError):
        error = api_error(exc)
        return f"Slack answered {error}" if error else "Slack did not answer"
    if isinstance(exc, (aiohttp.ClientError, OSError)):
        return "Slack could not be reached"
    return "the lookup failed"
