"""Interactions with a request's Slack message: button presses, select menus and modal
submissions, posted by Slack to the channel's interactivity endpoint.

Each interaction is read, saved in the channel state and only then acknowledged; it is settled
in the background as the person who acted (`slack:<team_id>:<user_id>`, authenticator
"slack", or whom `SlackChannel(identify=...)` maps them to: one it refuses is told so, and
nothing is answered). Slack never sends again an interaction it had a 200 for, so one a
process acknowledged and then died with is settled by the next start (see `_inbox`); one that
cannot be saved gets a 503, and Slack shows the person an error so they can act again.
Settling is idempotent: an answer that repeats the one recorded changes nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp
from slack_sdk.errors import SlackApiError

from ..._answers import closed_text
from ..._eligibility import refusal
from ..._exceptions import (
    AnswerError,
    ConflictingAnswer,
    NotAllowed,
    SessionExpired,
    SignoffError,
    StoreDamaged,
    StoreError,
    UnknownAgent,
    UnknownSession,
)
from ..._text import is_blank
from ..._types import InputRequest, InputResponse, Principal
from ...stores import StoredRequest
from .._base import logger, settled_as
from ._blocks import (
    ANSWER_BLOCK,
    APPROVE,
    DENY,
    DENY_VIEW,
    OPTION,
    REASON_BLOCK,
    TEXT,
    TEXT_VIEW,
    chosen_option,
    deny_view,
    refused_view,
    text_view,
)
from ._identity import SlackUserUnknown
from ._inbox import Inbox, damaged_note
from ._payloads import (
    SlackPayloadError,
    api_error,
    check_ids,
    interaction_of,
    maybe_done,
    member_of,
)
from ._replies import outcome_note
from ._stale import show_closed

if TYPE_CHECKING:
    from ._channel import SlackChannel

__all__ = ["FORM_WAIT", "Clicks", "Interaction"]

ANSWER = "answer"  # what an interaction does: answer the request, or open one of its forms
_FORMS: dict[str, Callable[[InputRequest, dict[str, Any]], dict[str, Any]]] = {
    DENY: deny_view,
    TEXT: text_view,
}


# views.open's answers to a trigger (single-use, fresh from Slack's signed press) used before:
# by an earlier call for the same press, which may have opened the form.
_USED_TRIGGER = frozenset({"invalid_trigger_id", "exchanged_trigger_id"})
# Seconds a form's press waits for the check of who pressed before it opens the form: its
# trigger lasts three seconds from the press, and a slower check goes on once the form is open.
FORM_WAIT = 1.0
_MAYBE_OPEN = "Slack did not confirm that the form opened: if it did not, press the button again."


@dataclass(frozen=True, slots=True)
class Interaction:
    """What a person did with a request's message, as much of it as acting on it needs: an
    answer (`does` is "answer"), or a press that opens Deny's or free text's form (`does` is
    the button's action id, `trigger_id` Slack's handle for opening it)."""

    does: str
    request_id: str
    team: str
    user: str
    channel: str
    option_id: str | None = None
    text: str | None = None
    trigger_id: str | None = None


class Clicks:
    """The interactivity side of a `SlackChannel`: verifies, saves and settles interactions."""

    def __init__(self, channel: SlackChannel) -> None:
        self.channel = channel
        self.inbox = Inbox(channel, "click:", Interaction, self._act, "interaction")

    async def handle(self, body: bytes, headers: Mapping[str, str]) -> dict[str, Any] | None:
        """Verify and take one interaction; the JSON to answer Slack with (None: empty 200).

        The interaction is saved before Slack hears back (a `StoreError` if it cannot be in
        time, see `Inbox.admit`) and acted on in the background. A body taken before (Slack's
        retry of a delivery, signed anew, reaching any process that shares the channel state)
        does nothing again."""
        self.channel.verify(body, headers)
        found, answer = read(interaction_of(body))
        if found is not None:
            taken = (hashlib.sha256(body).hexdigest(), found)
            await self.inbox.admit(lambda: taken)
        return answer

    async def resume(self) -> None:
        """Act on the interactions acknowledged and not finished before a crash."""
        await self.inbox.resume()

    async def tick(self) -> None:
        await self.inbox.tick()

    # -- acting -------------------------------------------------------------------------------

    async def _act(self, click: Interaction, again: bool) -> None:
        """Settle the request or open its form; a request whose stored row is damaged (it
        reads the same every time) is told of and let out, for the inbox to log once."""
        try:
            if click.does == ANSWER:
                await self._settle(click, again)
            else:
                await self._open_form(click, again)
        except StoreDamaged:
            where = {"channel": click.channel, "user": click.user}
            await self.channel._tell(where, damaged_note(click.request_id))
            raise

    async def _settle(self, click: Interaction, again: bool) -> None:
        """Answer the request as the person who acted and tell them what only they need to
        know: a refusal, a count, or that someone else decided first. `again`: an earlier run
        may have settled it, which changes nothing and is not told."""
        ch = self.channel
        where = {"channel": click.channel, "user": click.user}
        principal = await self._principal(click, where, again)
        if principal is None:
            return
        rid = click.request_id
        stored = await ch.runtime.store.get_request(rid)
        if stored is None:
            await ch._tell(where, f"Unknown request {rid}.")
            return
        option = None if click.option_id is None else chosen_option(stored.request, click.option_id)
        response = InputResponse(request_id=rid, option_id=option, text=click.text)
        try:
            outcome = await ch.submit(stored.request, response, principal)
        except StoreError:
            raise  # nothing was taken: tried again later
        except NotAllowed as exc:
            await ch._tell(where, f"You may not answer this request: {exc}")
            return
        except ConflictingAnswer:  # decided otherwise (elsewhere): say how and by whom
            await ch._tell(where, (await self._closed(rid, principal))[0])
            await self._show_closed(rid)
            return
        except AnswerError as exc:
            await ch._tell(where, f"This request can no longer be answered: {exc}")
            await self._show_closed(rid)
            return
        except SignoffError as exc:  # an answer of the wrong shape, an expired session, ...
            await ch._tell(where, f"Your answer was not accepted: {exc}")
            return
        told = outcome_note(outcome)
        if told is not None:
            if not (again and outcome.outcome == "counted" and not outcome.applied):
                await ch._tell(where, told)
        elif not outcome.applied:  # settled before: elsewhere, by a second press, or by this one
            closed, decided = await self._closed(rid, principal)
            if not decided:  # else their answer stands: nothing to tell
                await ch._tell(where, closed)
            await self._show_closed(rid)

    async def _principal(
        self, click: Interaction, where: dict[str, str], again: bool
    ) -> Principal | None:
        """Who acted (`Identities`), or None once they were told why no one can tell (`again`:
        an earlier run may have taken their answer)."""
        try:
            return await self.channel.identities.principal(click.team, click.user)
        except SlackUserUnknown as exc:
            taken = "may not have been taken" if again else "was not taken"
            await self.channel._tell(where, f"Your answer {taken}: {str(exc).rstrip('.')}.")
            return None

    async def _show_closed(self, request_id: str) -> None:
        """The message of a request a click found closed, updated if it still shows it open
        (`show_closed`)."""
        stored = await self.channel.runtime.store.get_request(request_id)
        if stored is not None:
            await show_closed(self.channel, stored)

    async def _closed(self, request_id: str, principal: Principal) -> tuple[str, bool]:
        """How a request closed, as a late responder is told it, and whether `principal` took
        part in that decision: its decider, or a voter of the quorum that approved it (counted,
        as votes are, by principal id)."""
        stored = await self.channel.runtime.store.get_request(request_id)
        resolution = (stored.resolution if stored is not None else None) or {}
        by = resolution.get("by")
        shown, who = settled_as(resolution)
        decided = principal.same_as(Principal.model_validate(by) if isinstance(by, dict) else None)
        if not decided and stored is not None and resolution.get("outcome") == "approved":
            # The quorum's, the decider's vote last, which the row of a request an older
            # signoff settled lacks (it holds the votes before it only).
            votes = resolution.get("approved_by")
            voters = [*stored.request.approved_by, *(votes if isinstance(votes, list) else ())]
            decided = principal.principal_id in voters
        return f"Request {request_id} is already closed: {shown} by {who}.", decided

    async def _open_form(self, click: Interaction, again: bool) -> None:
        """Open Deny's or free text's form for the person who pressed, or tell them why not
        (the request closed, they may not answer it, its session or one above it passed its
        TTL, or a trigger that expired, say after a restart: they press again).

        Who pressed is checked first when that takes at most `FORM_WAIT` seconds (a mapping's
        `users.info` lookup cached, or quick); a slower lookup is finished after the form
        opens, as the trigger lasts three seconds, and a form its check then refuses is turned
        into the reason, with no submit button (its submission would be refused all the same).
        When it is unknown whether the form opened (the connection dropped, a gateway's 5xx,
        or an earlier run of this press was cut short, after which the single-use trigger is
        refused either way), they are told to press again only if no form opened: never
        "Slack could not open it" over an open form."""
        ch = self.channel
        rid = click.request_id
        where = {"channel": click.channel, "user": click.user}
        stored = await ch.runtime.store.get_request(rid)
        if stored is None:
            await ch._tell(where, f"Request {rid} is no longer open.")
            return
        checking = asyncio.ensure_future(self._form_refusal(click, stored))
        try:
            if stored.status != "pending":  # no form to open: the check may take its time
                refused: tuple[str, bool] | None = await checking
            else:
                refused = await asyncio.wait_for(asyncio.shield(checking), FORM_WAIT)
        except TimeoutError:
            opened = await self._open_view(click, stored.request, where, again)
            refused = await checking
            if refused is not None:
                await ch._tell(where, refused[0])
                if opened is not None:
                    await self._refuse_view(opened, refused[0])
                if refused[1]:
                    await self._show_closed(rid)
            return
        finally:
            checking.cancel()  # done by now, unless this task was cancelled
        # Who may not answer it is told so first, open or closed: not whether it closed, as
        # an answer of theirs would not be (`Answering._may_not_answer`).
        if refused is not None:
            await ch._tell(where, refused[0])
            if refused[1]:
                await self._show_closed(rid)
            return
        if stored.status != "pending":
            await ch._tell(where, f"Request {rid} is no longer open.")
            await show_closed(ch, stored)
            return
        await self._open_view(click, stored.request, where, again)

    async def _form_refusal(
        self, click: Interaction, stored: StoredRequest
    ) -> tuple[str, bool] | None:
        """Why the person who pressed may not open a form of `stored` (what they are told, and
        whether that closed the request: its session's expiry, see `_expiry`), or None if they
        may."""
        ch = self.channel
        try:
            principal = await ch.identities.principal(click.team, click.user)
        except SlackUserUnknown as exc:
            return f"Your answer was not taken: {str(exc).rstrip('.')}.", False
        refused = await refusal(ch.runtime.agents, ch.runtime.store, stored.request, principal)
        if refused is not None:
            return f"You may not answer this request: {refused}", False
        if stored.status != "pending":
            return None  # closed: told so by `_open_form`
        expired = await self._expiry(stored.request)
        return None if expired is None else (expired, True)

    async def _expiry(self, request: InputRequest) -> str | None:
        """What the person is told if open `request` can no longer be answered because its
        session passed its TTL, or one above it did (which ended the delegated turn that asked
        it): recorded as an answer (Approve's) records it, its own expiry (`SessionExpired`) or
        the request withdrawn (`_orphaned`), so no form opens whose submission could only be
        refused; None while it lives, or while a live drive runs its turn on past the TTL."""
        rt = self.channel.runtime
        gone = f"Request {request.id} is no longer open."
        try:
            state = await rt._state(request.session_id)
            if state.expired(rt.now()):
                state = await rt._checked(request.session_id)  # records it, unless a drive runs on
            if not await rt._orphaned(state):  # a TTL passed above it: the request withdrawn
                return None
        except UnknownSession:  # deleted meanwhile
            return gone
        except SessionExpired as exc:
            return f"This request can no longer be answered: {exc}"
        except UnknownAgent:  # not this runtime's to record: told as a read sees it
            ended = await rt._ended(state, rt.now())
            return None if ended is None else f"This request can no longer be answered: {ended}"
        stored = await rt.store.get_request(request.id)
        if stored is None:
            return gone
        if stored.status == "pending":  # not closed by it after all: the form may open
            return None
        resolution = stored.resolution or {}
        closed = closed_text(
            stored.request, stored.status, resolution.get("outcome"), resolution.get("on_timeout")
        )
        return f"This request can no longer be answered: {closed}"

    async def _open_view(
        self, click: Interaction, request: InputRequest, where: dict[str, str], again: bool
    ) -> str | None:
        """`views.open` with the press's trigger; the id of the view opened, or None (and the
        person told what to do)."""
        ch = self.channel
        rid = request.id
        meta = {"request_id": rid, **where}
        try:
            reply = await ch.client.views_open(
                trigger_id=str(click.trigger_id), view=_FORMS[click.does](request, meta)
            )
        except SlackApiError as exc:  # e.g. the trigger expired: the click must not vanish
            logger.warning("slack: opening a view for %s failed", rid, exc_info=True)
            error = api_error(exc)
            # A gateway's 5xx or Slack's internal_error may come after the form opened.
            used = error in _USED_TRIGGER or (again and error == "expired_trigger_id")
            if used or maybe_done(exc):
                await ch._tell(where, _MAYBE_OPEN)
                return None
            shown = f" ({error})" if error else ""
            await ch._tell(where, f"Slack could not open the form{shown}: press the button again.")
            return None
        except (aiohttp.ClientError, OSError):  # OSError: a timeout too; the form may be open
            logger.warning("slack: opening a view for %s went unanswered", rid, exc_info=True)
            await ch._tell(where, _MAYBE_OPEN)
            return None
        view = reply.get("view")
        found = view.get("id") if isinstance(view, Mapping) else None
        return found if isinstance(found, str) else None

    async def _refuse_view(self, view_id: str, text: str) -> None:
        """Turn an open form into `text` (`refused_view`); one Slack refuses to update (closed
        meanwhile) is logged: its submission is refused, with a note, all the same."""
        try:
            await self.channel.client.views_update(view_id=view_id, view=refused_view(text))
        except (SlackApiError, aiohttp.ClientError, OSError):
            logger.warning("slack: updating the form %s failed", view_id, exc_info=True)


def read(payload: dict[str, Any]) -> tuple[Interaction | None, dict[str, Any] | None]:
    """What a verified interaction asks for, if it is one of ours, and the JSON to answer Slack
    with (None: an empty 200); a `SlackPayloadError` if it cannot be read."""
    try:
        kind = payload["type"]
        user = payload["user"]["id"]
        # The user's own workspace first: `team` is the one the click came from, which for
        # someone from another organization in a Slack Connect channel is not theirs. On
        # Enterprise Grid a member is named by the organization (`member_of`); `team` is None
        # for an org-wide installation, and a modal's carries its `enterprise_id`.
        host = payload.get("team") or {}
        enterprise = payload.get("enterprise")
        org = enterprise.get("id") if isinstance(enterprise, dict) else enterprise
        own = payload["user"].get("team_id") or host.get("id")
        team = member_of(own, host.get("id"), org or host.get("enterprise_id"))
        if not isinstance(user, str) or not isinstance(team, str):
            raise TypeError("user and team ids must be strings")
        if kind == "block_actions":
            found, answer = _action(payload, team, user), None
        elif kind == "view_submission":
            found, answer = _submission(payload, team, user)
        else:
            return None, None  # other interactions are not ours
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, RecursionError) as exc:
        # AttributeError: a field of the wrong type (a string where an object belongs);
        # RecursionError: modal metadata nested deeper than json reads
        raise SlackPayloadError(f"unreadable Slack interaction: {exc!r}") from None
    if found is not None:  # before it is saved: no store could look such an id up
        check_ids(
            user=found.user,
            team=found.team,
            channel=found.channel,
            request=found.request_id,
            option=found.option_id,
            trigger=found.trigger_id,
        )
    return found, answer


def _action(payload: dict[str, Any], team: str, user: str) -> Interaction | None:
    action = payload["actions"][0]
    action_id = action["action_id"]
    channel = (payload.get("channel") or {}).get("id") or payload["container"]["channel_id"]
    if not isinstance(channel, str):
        raise TypeError("the channel id must be a string")
    if action_id == APPROVE:
        rid = str(action["value"])
        return Interaction(ANSWER, rid, team, user, channel, option_id="approve")
    if action_id == OPTION:
        rid = _request_id(action["block_id"])
        option = str(action["selected_option"]["value"])
        return Interaction(ANSWER, rid, team, user, channel, option_id=option)
    if action_id in _FORMS:
        rid = str(action["value"])
        trigger = str(payload["trigger_id"])
        return Interaction(action_id, rid, team, user, channel, trigger_id=trigger)
    return None


def _submission(
    payload: dict[str, Any], team: str, user: str
) -> tuple[Interaction | None, dict[str, Any] | None]:
    view = payload["view"]
    callback = view["callback_id"]
    if callback not in (DENY_VIEW, TEXT_VIEW):
        return None, None
    meta = json.loads(view["private_metadata"])
    rid = str(meta["request_id"])
    channel = str(meta["channel"])
    values = view["state"]["values"]
    if callback == DENY_VIEW:
        reason = (values.get(REASON_BLOCK, {}).get("reason") or {}).get("value") or ""
        deny = Interaction(ANSWER, rid, team, user, channel, "cancel", reason.strip() or None)
        return deny, None  # an empty 200 closes the modal
    text = ((values.get(ANSWER_BLOCK, {}).get("answer") or {}).get("value") or "").strip()
    if is_blank(text):
        return None, {"response_action": "errors", "errors": {ANSWER_BLOCK: "Write an answer"}}
    return Interaction(ANSWER, rid, team, user, channel, text=text), None


def _request_id(block_id: str) -> str:
    prefix, sep, rid = str(block_id).partition(":")
    if prefix != "signoff" or not sep or not rid:
        raise ValueError(f"not a signoff block: {block_id!r}")
    return rid
