"""Where sessions' event logs end, and the gaps in them, for verification: a log holds each
event from 1 to the one its session row keeps as its last. An event row deleted from the middle
(of a type the trail does not audit, and no snapshot taken after it) leaves every chain and the
log's end as they were: only how many rows the log holds tells."""

from __future__ import annotations

from dataclasses import dataclass

from .stores import Store
from .stores._audit import LogShape

__all__ = ["Gap", "log_ends"]


@dataclass(frozen=True, slots=True)
class Gap:
    """Events missing from a session's log before its last: `first`, the first of them, if
    that can be told (0 if not), and the `reason` verification names them with."""

    first: int
    reason: str


async def log_ends(
    store: Store, sessions: list[str]
) -> tuple[dict[str, tuple[int, int]], dict[str, Gap]]:
    """Where the event logs of `sessions` end and where their session rows say they end, and
    the gaps before that: no gaps from a store written for an earlier signoff, which cannot
    count its logs, and neither from one that cannot read where they end."""
    if hasattr(store, "log_shapes"):
        shapes = await store.log_shapes(sessions)
        gaps = {sid: gap for sid, shape in shapes.items() if (gap := _gap(shape)) is not None}
        return {sid: (shape.head, shape.last) for sid, shape in shapes.items()}, gaps
    if hasattr(store, "log_ends"):
        return await store.log_ends(sessions), {}
    return {}, {}


def _gap(shape: LogShape) -> Gap | None:
    """What is missing from a log before its last event, if anything: the event, if one alone
    is, else how many events it holds where it should hold `last`."""
    last, count, low = shape.last, shape.count, shape.low
    if last <= 0:
        return None  # no whole number to count to: named as where the log ends
    if count == last and low == 1:
        if shape.total == last * (last + 1) // 2:
            return None  # each of 1 to `last` once: whole
        # As many rows as seqs, from 1 to `last`: one of them is no whole number (a hand edit).
        return Gap(0, f"the event log holds a seq that is not a whole number of 1 to {last}")
    if low >= 1 and count == last - 1:
        # Seqs from 1 to `last`, but one: their sum falls short of 1 + ... + last by that one.
        missing = last * (last + 1) // 2 - shape.total
        if 1 <= missing < last:
            return Gap(missing, f"event {missing} is missing from the event log")
    reason = f"the event log has {count} events for seqs 1 to {last}"
    if low != 1:
        reason += f", the first at seq {low}"
    return Gap(1 if low > 1 else 0, reason)
