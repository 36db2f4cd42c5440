"""Child processes for the keyed-call crash test: one `generate` (or `schedule`) with an
idempotency key.

`python -m tests._keyed_child` serves `[STORE_URL, KEY, KILL_AT, WHEN, CALL]` commands, each in
a child of its own (`_forks`): the call (`generate` as Alice, or with CALL "schedule" a
`schedule` as the app) starts a conversation with "hello" under KEY, and the
store's fault hook SIGKILLs the child right `WHEN` (before or after) its KILL_AT-th commit
(0: never). A call that ends gives its result, how many commits it saw and what each was
(the fault hook's label: the type of its first event).
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import signoff as so
import signoff.stores.postgres
import signoff.stores.sqlite  # the stores imported once here, not again in each child
from signoff.stores._base import AUDIT_RECORDED, LEASE_RENEWED
from signoff.testing import reply, scripted_agent

from ._forks import serve

ALICE = so.Principal(authenticator="okta", principal_id="alice")


async def run(argv: list[str]) -> dict[str, Any]:
    url, key, kill_at, when = argv[0], argv[1], int(argv[2]), argv[3]
    scheduled = argv[4:] == ["schedule"]
    points = 0
    labels: list[str] = []

    def hook(at: str, label: str) -> None:
        nonlocal points
        if at != when or label in (AUDIT_RECORDED, LEASE_RENEWED):  # a timer makes renewals
            return
        points += 1
        labels.append(label)
        if points == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    agent = scripted_agent("chat", [reply("ok")], repeat_last=True)
    # A TTL a loaded machine's stalls cannot outlast (a drive waking past its lease's expiry
    # gives the renewal a tenth of it); the parent lapses a killed child's lease (`lapse_leases`).
    async with so.Runtime([agent], store=url, lease_ttl=5.0) as rt:
        rt.store.set_fault_hook(hook)

        async def call() -> so.GenerateResult:
            if scheduled:
                return await rt.schedule("chat", "hello", idempotency_key=key)
            return await rt.generate("chat", prompt="hello", auth=ALICE, idempotency_key=key)

        r = await call()
        for _ in range(40):  # busy elsewhere: not once the parent lapsed a killed call's lease
            if r.status != "running":
                break
            await asyncio.sleep(0.1)
            r = await call()
        return {
            "session": r.session_id,
            "status": r.status,
            "text": r.text,
            "replayed": r.replayed,
            "points": points,
            "labels": labels,
        }


if __name__ == "__main__":
    serve(run)
