"""A request's message that still shows it open after it closed: the hub gave up updating it
(Slack failed past its `max_attempts`) and would try again only at its next start. A click on
that message finds the request closed; it then updates the message as the hub would have, so
nobody else is offered buttons that can only be refused."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...stores import StoredRequest
from .._announcements import announce
from .._base import closing_entry, logger, off_loop

if TYPE_CHECKING:
    from ._channel import SlackChannel

__all__ = ["show_closed"]


async def show_closed(ch: SlackChannel, stored: StoredRequest) -> None:
    """Update the message of `stored`, closed, if it still shows it open though the hub has read
    past its close; a close the hub has yet to read is left to it (one update, not two). A
    failure is logged: the click it came with was answered already."""
    rid = stored.request.id
    try:
        if stored.status == "pending" or await ch.posts.where(rid, adopt=False) is None:
            return  # open, or its message shows it closed already (or was never posted)
        entry = await closing_entry(ch.runtime.store, stored.request.session_id, rid)
        if entry is None:
            return
        position = await off_loop(ch.state.position, f"{ch._hub}:{ch.name}")
        if position is None or position < entry.id:
            return  # the hub reads that close next and updates the message itself
        logger.info("slack: updating the message of %s, closed, which a click found open", rid)
        await announce(ch.runtime.store, ch, entry)
    except Exception:
        logger.warning(
            "slack: the message of closed request %s was not updated", rid, exc_info=True
        )
