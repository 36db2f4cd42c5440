"""Stand-in events and sessions the PostgreSQL store's tests commit directly, bypassing the
runtime."""

from __future__ import annotations

import uuid
from typing import Any

from signoff._events import Event
from signoff.stores.postgres import PostgresStore

__all__ = ["T0", "ev", "new_session"]

T0 = 1_700_000_000.0
"""The time of the stand-in events: event `seq` is at `T0 + seq`."""


def ev(sid: str, seq: int, type_: Any = "turn.started", **data: Any) -> Event:
    """Event `seq` of session `sid`, in turn `trn_1`, carrying `data`."""
    return Event(session_id=sid, seq=seq, type=type_, at=T0 + seq, turn_id="trn_1", data=data)


async def new_session(store: PostgresStore, events: int = 1) -> str:
    """A new session of agent `support` holding `events` events (`session.created`, then
    `turn.started` ones); its id."""
    sid = f"ses_{uuid.uuid4().hex[:20]}"
    first = [ev(sid, 1, "session.created")] + [ev(sid, i) for i in range(2, events + 1)]
    await store.create_session(sid, "support", first, None)
    return sid
