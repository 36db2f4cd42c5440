"""Child for the deletion crash test: `Runtime.delete_session` of a cancelled parent and its
subagent's session, SIGKILLed right before or right after the deletion's commit.

`python -m tests._deletion_crash` serves `[STORE_URL, PARENT, WHEN]` commands (`tests._forks`):
the store's fault hook SIGKILLs the child right `WHEN` ("before", "after", or "never") the
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

from ._forks import serve
from .test_subagents_spend import orders, support, tokens

__all__ = ["agents", "run"]


def agents() -> list[so.Agent]:
    return [support(), orders(tokens(40))]


async def run(argv: list[str]) -> dict[str, Any]:
    url, parent, when = argv

    def hook(at: str, label: str) -> None:
        if at == when and label == SESSION_DELETED:
            os.kill(os.getpid(), signal.SIGKILL)

    async with so.Runtime(agents(), store=url) as rt:
        rt.store.set_fault_hook(hook)
        deleted = await rt.delete_session(parent, reason="erasure")
        return {"deleted": deleted}


if __name__ == "__main__":
    serve(run)
