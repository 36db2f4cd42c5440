"""The audit entries a `ChannelHub` gave a channel up on (it failed on each `max_attempts`
times): kept in the channel state, under the hub's key for the channel, and delivered again
every `REDO_EVERY` seconds while the hub runs and when it next starts on that state (a service
down for a few minutes must not leave what opened meanwhile unshown until a restart, and one
entry it never takes must not hold back the others, nor one request it never takes the others
opened with it: each is told past it, and none told twice while the hub runs)."""

from __future__ import annotations

from collections.abc import Callable

from ..stores import Store
from ._announcements import Damaged, announce, passed
from ._base import Channel, ChannelState, RateLimited, logger, off_loop
from ._retries import Retries

__all__ = ["note_given_up", "redeliver"]

REDO_EVERY = 60.0  # seconds between the rounds that deliver them again while the hub runs
_SKIPPED = "skipped"  # the memo (under the hub's key for a channel) of the entries given up on


async def note_given_up(state: ChannelState, key: str, entry_id: int) -> None:
    """Keep `entry_id` among the entries the channel of `key` was given up on."""
    await off_loop(_note, state, key, entry_id)


def _note(state: ChannelState, key: str, entry_id: int) -> None:
    skipped = _skipped(state.recall(key, _SKIPPED), key)
    if entry_id not in skipped:
        state.remember(key, _SKIPPED, [*skipped, entry_id])


async def redeliver(
    store: Store,
    state: ChannelState,
    key: str,
    ch: Channel,
    retries: Retries,
    live: Callable[[], bool],
    *,
    until_failure: bool = False,
) -> int:
    """Deliver again the entries given up on, oldest first; those failing again are kept (and
    logged) for the next round, or the start after; how many are kept. A rate limit holds them,
    and the channel's feed behind them, until its delay has passed: the next poll then goes on
    with them. Each is delivered only while `live()` (the hub's claim on the channel): once
    not, the rest are kept, as another hub may deliver to the channel now. `until_failure`: a
    round while the hub runs, which stops at the first entry that fails again (the service is
    still down) rather than hold the poll through one failure per entry; see `_in_turn` for
    the one it tries after it."""
    memo = await off_loop(state.recall, key, _SKIPPED)
    skipped = _skipped(memo, key)
    if not skipped:
        if memo is not None:  # damaged, holding no entry id: dropped, logged once
            await off_loop(state.forget, key, _SKIPPED)
        retries.redo.discard(ch.name)
        retries.stuck.pop(ch.name, None)
        return 0
    stuck = retries.stuck.get(ch.name) if until_failure else None
    turn = _in_turn(skipped, stuck)
    queue = list(skipped)
    limited = False
    done: set[int] = set()  # delivered, or no longer in the trail
    failed: int | None = None  # the first entry that failed again
    tried: int | None = None  # the one in turn, once tried
    while queue and live():
        entry_id = queue.pop(0)
        found = await store.audit(after_id=entry_id - 1, limit=1)
        shown = retries.shown.pop((ch.name, entry_id), set())
        if not found or found[0].id != entry_id:
            done.add(entry_id)  # no longer in the trail: nothing to deliver
            continue
        try:
            await announce(store, ch, found[0], shown=shown, every=True)
        except RateLimited as exc:
            retries.keep_shown(ch.name, entry_id, shown)
            retries.rate_limited(ch.name, entry_id, exc)
            limited = True
            break
        except Damaged as exc:  # the rest of it told: reading it again gives the same
            passed(ch, found[0], exc)
        except Exception:
            retries.keep_shown(ch.name, entry_id, shown)
            if until_failure:
                logger.warning(
                    "channel %s still fails on audit entry %s (given up on before); it is "
                    "tried again in %gs and when the hub next starts",
                    ch.name,
                    entry_id,
                    REDO_EVERY,
                    exc_info=True,
                )
                if failed is None:
                    failed = entry_id
                if entry_id == skipped[0] and turn is not None:
                    queue.remove(turn)  # it shows whether the service is back
                    queue.insert(0, turn)
                    tried = turn
                    continue
                break
            logger.exception(
                "channel %s failed again on audit entry %s; it is tried again in %gs and when "
                "the hub next starts",
                ch.name,
                entry_id,
                REDO_EVERY,
            )
            continue
        done.add(entry_id)
    if until_failure and not limited:
        if failed is None:
            retries.stuck.pop(ch.name, None)
        else:
            if tried is None and stuck is not None and stuck[0] == failed:
                tried = stuck[1]
            retries.stuck[ch.name] = (failed, tried)
    left = [i for i in skipped if i not in done]
    if left != memo:  # a damaged memo too, cleaned: its warning logged once, not every round
        if left:
            await off_loop(state.remember, key, _SKIPPED, left)
        else:
            await off_loop(state.forget, key, _SKIPPED)
    if limited:
        retries.redo.add(ch.name)
    else:
        retries.redo.discard(ch.name)
    return 0 if limited else len(left)


def _skipped(memo: object, key: str) -> list[int]:
    """The entry ids a memo of entries given up on holds. A hand-damaged one (not a list of
    entry ids) keeps what ids it has, the rest logged, as a memo that is not JSON is read as
    absent: a bare error here failed every poll of the hub."""
    if memo is None:
        return []
    items = memo if isinstance(memo, list) else [memo]
    ids = [i for i in items if type(i) is int and i > 0]
    bad = [i for i in items if not (type(i) is int and i > 0)]
    if bad:
        logger.warning(
            "channel state: the memo of entries given up on for %s holds what is no entry id "
            "(%s): left out",
            key,
            ", ".join(map(repr, bad))[:200],
        )
    return ids


def _in_turn(skipped: list[int], stuck: tuple[int, int | None] | None) -> int | None:
    """The entry a round tries should the oldest fail again, None if it stops there: when the
    last round failed first on that oldest too (`stuck`), the one after the last tried so
    (cycling through them). One the channel can never deliver holds back none of the others,
    while a service still down costs two attempts a round, and one back gets them in order."""
    if stuck is None or len(skipped) < 2 or skipped[0] != stuck[0]:
        return None
    rest, after = sorted(skipped[1:]), stuck[1]
    return next((i for i in rest if after is None or i > after), rest[0])
