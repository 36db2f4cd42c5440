"""The audit entries a `ChannelHub` gave a channel up on (it failed on each `max_attempts`
times): kept in the channel state, under the hub's key for the channel, and delivered again
every `REDO_EVERY` seconds while the hub runs and when it next starts on that state (a service
down for a few minutes must not leave what opened meanwhile unshown until a restart)."""

from __future__ import annotations

from ..stores import Store
from ._announcements import announce
from ._base import Channel, ChannelState, RateLimited, logger, off_loop
from ._retries import Retries

__all__ = ["note_given_up", "redeliver"]

REDO_EVERY = 60.0  # seconds between the rounds that deliver them again while the hub runs
_SKIPPED = "skipped"  # the memo (under the hub's key for a channel) of the entries given up on


async def note_given_up(state: ChannelState, key: str, entry_id: int) -> None:
    """Keep `entry_id` among the entries the channel of `key` was given up on."""
    await off_loop(_note, state, key, entry_id)


def _note(state: ChannelState, key: str, entry_id: int) -> None:
    skipped = [int(i) for i in state.recall(key, _SKIPPED) or []]
    if entry_id not in skipped:
        state.remember(key, _SKIPPED, [*skipped, entry_id])


async def redeliver(
    store: Store,
    state: ChannelState,
    key: str,
    ch: Channel,
    retries: Retries,
    *,
    until_failure: bool = False,
) -> int:
    """Deliver again the entries given up on; those failing again are kept (and logged) for
    the next round, or the start after; how many are kept. A rate limit holds them, and the
    channel's feed behind them, until its delay has passed: the next poll then goes on with
    them. `until_failure`: a round while the hub runs, which stops at the first entry that
    fails again (the service is still down) rather than hold the poll through one failure per
    entry."""
    skipped = [int(i) for i in await off_loop(state.recall, key, _SKIPPED) or []]
    if not skipped:
        retries.redo.discard(ch.name)
        return 0
    limited = False
    left: list[int] = []
    for n, entry_id in enumerate(skipped):
        found = await store.audit(after_id=entry_id - 1, limit=1)
        if not found or found[0].id != entry_id:
            continue  # no longer in the trail: nothing to deliver
        try:
            await announce(store, ch, found[0])
        except RateLimited as exc:
            retries.rate_limited(ch.name, entry_id, exc)
            limited = True
            left.extend(skipped[n:])
            break
        except Exception:
            if until_failure:
                logger.warning(
                    "channel %s still fails on audit entry %s (given up on before); it is "
                    "tried again in %gs and when the hub next starts",
                    ch.name,
                    entry_id,
                    REDO_EVERY,
                    exc_info=True,
                )
                left.extend(skipped[n:])
                break
            logger.exception(
                "channel %s failed again on audit entry %s; it is tried again in %gs and when "
                "the hub next starts",
                ch.name,
                entry_id,
                REDO_EVERY,
            )
            left.append(entry_id)
    if left != skipped:
        if left:
            await off_loop(state.remember, key, _SKIPPED, left)
        else:
            await off_loop(state.forget, key, _SKIPPED)
    if limited:
        retries.redo.add(ch.name)
    else:
        retries.redo.discard(ch.name)
    return 0 if limited else len(left)
