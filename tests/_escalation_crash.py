"""The child of `tests/test_escalation_crash.py`: a hub that tells a text channel's person of an
escalation, SIGKILLed right before or right after the store's commit of the memo that it told it.

`main(argv)` runs `[STORE_URL, STATE, SENT, WHEN]` in a forked child (`Scripts.run`): a hub on
state file STATE goes on from its position and polls; its channel (`Told`) appends each text it
sends to SENT, and once it sent an escalation the store's fault hook SIGKILLs the child right
WHEN (before or after) the next commit of channel memos, the memo of that escalation. Exit code
3: it never got there.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import signoff as so
from signoff.channels import ChannelHub, TextChannel
from signoff.stores._base import CHANNEL_MEMOS

__all__ = ["CLAIM_TTL", "ESCALATED", "Told", "hub", "main", "sent"]

CLAIM_TTL = 1.0
ESCALATED = "was escalated to finance"
"""What the text telling the person of the escalation says."""


class Told(TextChannel):
    """A text channel that appends each text it sends to a file, synced (kept across a kill)."""

    name = "sms"

    def __init__(self, path: str | Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.path = str(path)
        self.escalations = 0

    async def send_text(self, text: str) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(text) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        self.escalations += ESCALATED in text


def sent(path: str | Path) -> list[str]:
    """Every text the channels sent to the person, oldest first."""
    p = Path(path)
    return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []


def hub(rt: so.Runtime, channel: Told, state: str | Path) -> ChannelHub:
    return ChannelHub(rt, [channel], state=state, poll_interval=0.05, claim_ttl=CLAIM_TTL)


async def _main(url: str, state: str, path: str, when: str) -> int:
    async with so.Runtime([], store=url) as rt:
        sms = Told(path)

        def die(at: str, label: str) -> None:
            if at == when and label == CHANNEL_MEMOS and sms.escalations:
                os.kill(os.getpid(), signal.SIGKILL)

        rt.store.set_fault_hook(die)
        delivering = hub(rt, sms, state)
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
