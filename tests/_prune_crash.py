"""Child for the prune crash test: `Runtime.prune` of every finished session, SIGKILLed right
before or right after the commit of its `NTH` session's deletion.

`python -m tests._prune_crash` serves `[STORE_URL, WHEN, NTH]` commands (`tests._forks`): the
store's fault hook SIGKILLs the child right `WHEN` ("before", "after", or "never") the `NTH`
write labelled `session.deleted`. A child that ends gives the ids it deleted.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import signoff as so
import signoff.stores.postgres
import signoff.stores.sqlite  # the stores imported once here, not again in each child
from signoff.stores._deletions import SESSION_DELETED

from ._deletion_crash import agents
from ._forks import serve

__all__ = ["run"]


async def run(argv: list[str]) -> dict[str, Any]:
    url, when, nth = argv
    seen = 0

    def hook(at: str, label: str) -> None:
        nonlocal seen
        if label != SESSION_DELETED:
            return
        seen += at == "before"
        if at == when and seen == int(nth):
            os.kill(os.getpid(), signal.SIGKILL)

    async with so.Runtime(agents(), store=url) as rt:
        rt.store.set_fault_hook(hook)
        deleted = await rt.prune(older_than=0, reason="retention")
        return {"deleted": deleted}


if __name__ == "__main__":
    serve(run)
