"""How a `ChannelHub` stops: it lets a poll in progress finish, so a delivery the service already
has (a Slack post) is saved rather than made again later, unless a forced stop (`signoff
serve`'s second Ctrl-C or SIGTERM) cut it short, which also has each channel cancel the work it
runs in the background. What a stop cuts off is not lost: the hub's position was not saved past
it, so the next start delivers it again."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from ._base import Channel, logger

__all__ = ["STOP_GRACE", "cut_channels", "finish_poll"]

STOP_GRACE = 10.0  # seconds: how long a stop lets a poll in progress finish its deliveries


async def finish_poll(lock: asyncio.Lock, cut: asyncio.Event, hub: str) -> None:
    """Wait (at most `STOP_GRACE` seconds) for the poll holding `lock` to end; not at all once
    `cut` is set (a forced stop), also while it waits."""
    if not lock.locked() or cut.is_set():
        return
    waiter = asyncio.ensure_future(lock.acquire())
    cutting = asyncio.ensure_future(cut.wait())
    try:
        await asyncio.wait(
            {waiter, cutting}, timeout=STOP_GRACE, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        cutting.cancel()
        if not waiter.cancel():  # it took the lock: no await follows until the task is cancelled
            lock.release()
        else:
            logger.warning("channel hub %s: stopping in the middle of a delivery", hub)


def cut_channels(channels: Sequence[Channel]) -> list[asyncio.Task[Any]]:
    """Have each channel cancel the work it runs in the background (`Channel.cut_short`; one
    that raises is logged); the tasks still running, to be given a moment to end."""
    cut: list[asyncio.Task[Any]] = []
    for ch in channels:
        try:
            cut.extend(ch.cut_short())
        except Exception:
            logger.exception("channel %s failed to cut its work short", ch.name)
    return cut
