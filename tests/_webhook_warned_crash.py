"""The child of `tests/test_webhooks_warned_crash.py`: a hub whose webhook channel warns of a
request's deadline (`request.expiring`), SIGKILLed right before or right after the store's
commit of the memo that it warned (`<hub>.<channel>:warned:<request>`).

`main(argv)` runs `[STORE_URL, STATE, RECEIVER, WHEN]` in a forked child (`Scripts.run`): a hub
on state file STATE starts with the request open (it is due a warning at once) and polls; the
store's fault hook SIGKILLs the child right WHEN (before or after) the commit of channel memos
that keeps the warned memo. Exit code 3: it never got there.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import signoff as so
from signoff.channels import ChannelHub, WebhookChannel
from signoff.stores._base import CHANNEL_MEMOS

__all__ = ["CLAIM_TTL", "SECRET", "hooks", "hub", "main"]

CLAIM_TTL = 1.0
SECRET = "whsec_warned_crash_7c1d"


def hooks(url: str) -> WebhookChannel:
    """A channel that warns of every deadline within two hours: at once, for an hour's."""
    return WebhookChannel(url, SECRET, expiring_within=7200, backoff=0.05, max_backoff=0.1)


def hub(rt: so.Runtime, channel: WebhookChannel, state: str) -> ChannelHub:
    return ChannelHub(rt, [channel], state=state, poll_interval=0.05, claim_ttl=CLAIM_TTL)


async def _main(url: str, state: str, receiver: str, when: str) -> int:
    async with so.Runtime([], store=url) as rt:
        store: Any = rt.store
        keep = store.keep_channel_memos
        warned = [False]  # the commit under way keeps the warned memo

        async def marked(memos: dict[str, str | None], *args: Any, **kw: Any) -> None:
            warned[0] = any(":warned:" in name for name in memos)
            try:
                await keep(memos, *args, **kw)
            finally:
                warned[0] = False

        store.keep_channel_memos = marked

        def die(at: str, label: str) -> None:
            if at == when and label == CHANNEL_MEMOS and warned[0]:
                os.kill(os.getpid(), signal.SIGKILL)

        store.set_fault_hook(die)
        delivering = hub(rt, hooks(receiver), state)
        await delivering.start(follow=False)
        try:
            for _ in range(100):
                await delivering.poll()
                await asyncio.sleep(0.02)
        finally:
            await delivering.stop()
    return 3


def main(argv: list[str]) -> None:
    raise SystemExit(asyncio.run(_main(*argv)))
