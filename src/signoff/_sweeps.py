"""How a sweep (expiries, deadlines, orphaned children) treats one of the many sessions it works
on: a failure of that one is logged and the sweep goes on, a failure of the store ends it."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from ._exceptions import (
    SessionExpired,
    StoreBusy,
    StoreError,
    StoreGone,
    StoreUnavailable,
    UnknownSession,
)

__all__ = ["STORE_FAILING", "deleted_meanwhile", "one_of_many"]

STORE_FAILING = (StoreGone, StoreUnavailable, StoreBusy)
"""The store failing as a whole (gone, down, out of connections): it ends a sweep, where one
session's failure is logged and passed."""


@contextlib.contextmanager
def one_of_many(log: logging.Logger, session_id: str, what: str) -> Iterator[None]:
    """A sweep's work on one of many sessions: its failure is logged and the sweep goes on, so a
    session the store cannot read (listed first at every sweep) does not stop the others'. A
    store failing as a whole (gone, down, out of connections) still ends the sweep. One deleted
    since the sweep listed it (a prune in another process) is passed over quietly. Logged to
    `log`, the sweeping module's."""
    try:
        yield
    except (SessionExpired, *STORE_FAILING):
        raise
    except StoreError as exc:
        log.warning("session %s: %s: %s", session_id, what, exc)
    except Exception as exc:
        if deleted_meanwhile(exc, session_id):
            log.debug("session %s: deleted meanwhile, so %s", session_id, what)
        else:
            log.exception("session %s: %s", session_id, what)


def deleted_meanwhile(exc: BaseException, session_id: str) -> bool:
    """Whether `exc` says that the session a sweep works on is gone: deleted (a prune in
    another process) since the sweep listed it, which is nothing to log."""
    return isinstance(exc, UnknownSession) and exc.session_id == session_id
