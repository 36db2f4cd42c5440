"""The request a `TextChannel` shows, and the escalations it told, kept in the runtime's store
beside the hub's claim (memos `shown`, `escalated:<request>`) as well as in its state: a hub
taking over on another machine (another state) goes on showing what the person was shown, rather
than switch to the oldest request (one escalated in behind it), which their next "yes" would
then approve unread, and does not tell them again of an escalation they were told; and a
standby on another state answers what the delivering hub shows, not what its own state showed
last."""

from __future__ import annotations

from collections.abc import Container
from typing import TYPE_CHECKING, Any

from ._base import Resolution, closing_entry, off_loop
from ._shared import Shared
from ._text_erased import DESCRIBED, described, erased_on_show

if TYPE_CHECKING:
    from .._types import InputRequest
    from .text import TextChannel

__all__ = [
    "ESCALATED",
    "SHOWN",
    "adopt_shown",
    "closed_on_show",
    "keep_escalation",
    "keep_shown",
    "shown_in_store",
    "told_escalation",
]

SHOWN = "shown"
"""The memo, in the state and the store, of the request on show: its id, and in the store's
what describes it too (`described`; the state's is another memo, `DESCRIBED`): its session may
be deleted, which leaves nothing of it to read."""


def _shared(ch: TextChannel) -> Shared | None:
    if ch._runtime is None:
        return None
    shared = Shared(ch)
    return shared if shared.kept else None


async def shown_in_store(ch: TextChannel) -> tuple[bool, str | None]:
    """Whether the store keeps the request shown (False: no memo, e.g. written by an earlier
    signoff, or a store without memos) and its id (None: nothing on show)."""
    shared = _shared(ch)
    memo: Any = None if shared is None else await shared.recall(SHOWN)
    if not isinstance(memo, dict):
        return False, None
    shown = memo.get("request_id")
    return True, shown if isinstance(shown, str) else None


async def keep_shown(ch: TextChannel, request: InputRequest | None) -> None:
    """Keep which request is on show (None: none), in the store first, then in the state, with
    what describes it (`described`)."""
    memo = None if request is None else described(request)
    shared = _shared(ch)
    if shared is not None:
        await shared.keep({SHOWN: memo or {"request_id": None}})
    if request is None:
        await off_loop(ch.forget, SHOWN)
        await off_loop(ch.forget, DESCRIBED)
    else:
        await off_loop(ch.remember, SHOWN, request.id)
        await off_loop(ch.remember, DESCRIBED, memo)


async def adopt_shown(ch: TextChannel) -> None:
    """Make the state's memo of the request shown the store's, where the store keeps one: a
    hub that delivered on another state (a machine since lost) may have shown another."""
    kept, shown = await shown_in_store(ch)
    if not kept or await off_loop(ch.recall, SHOWN) == shown:
        return
    if shown is None:
        await off_loop(ch.forget, SHOWN)
    else:
        await off_loop(ch.remember, SHOWN, shown)


async def closed_on_show(
    ch: TextChannel, now_open: Container[str]
) -> tuple[InputRequest, Resolution | None] | None:
    """The request on show by the memo if `now_open` (the open requests listed) leaves it out,
    with how it closed while no hub delivered to `ch`, as its session's trail records it: a
    channel made anew (in a new process) does not hold it, and a hub that starts past that
    entry does not tell it. One the store no longer has (its session deleted) as the memo
    describes it, closed as the deletion's entry says (`erased_on_show`). One the store has
    still pending (its session's TTL passed, which the listing leaves out, and no one recorded
    the lapse yet) with None as how: it stays on show, as in a hub that went on delivering, so
    a reply to it is refused as expired, not taken by the next, and its close is told when it
    is recorded. None if it is listed, or its close is not found."""
    shown = await off_loop(ch.recall, SHOWN)
    if not isinstance(shown, str) or shown in now_open:
        return None
    store = ch.runtime.store
    stored = await store.get_request(shown)
    if stored is None:  # its session deleted: the memos are all that is left of it
        shared = _shared(ch)
        in_store = None if shared is None else await shared.recall(SHOWN)
        closed = await erased_on_show(ch, shown, in_store)
        await keep_escalation(ch, shown, None)  # the stand-in does not say it was escalated
        return closed
    if stored.status == "pending":
        request = stored.request
        return (request, None) if request.child is None and ch.accepts(request) else None
    entry = await closing_entry(store, stored.request.session_id, shown)
    return None if entry is None else (stored.request, Resolution.from_event(entry.data, entry.at))


ESCALATED = "escalated:"
"""The memo, per request, of the group the person was told it was escalated to (in the state
and the store: a hub taking over on another state does not tell it again)."""


async def told_escalation(ch: TextChannel, request_id: str) -> object:
    """The group the person was told `request_id` went to (None: not told), by the store's memo
    where the store keeps them (a hub on another state may have told it), else the state's."""
    key = f"{ESCALATED}{request_id}"
    shared = _shared(ch)
    if shared is not None:
        return await shared.recall(key)
    return await off_loop(ch.recall, key)


async def keep_escalation(ch: TextChannel, request_id: str, to: str | None) -> None:
    """Keep that the person was told `request_id` went to group `to` (None: drop the memo, the
    request is not shown here again), in the store first, then in the state."""
    key = f"{ESCALATED}{request_id}"
    shared = _shared(ch)
    if shared is not None:
        await shared.keep({key: to})
    if to is None:
        await off_loop(ch.forget, key)
    else:
        await off_loop(ch.remember, key, to)
