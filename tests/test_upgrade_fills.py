"""The upgrades that fill new columns from what older rows hold (SQLite schema 5 and 6,
PostgreSQL migrations 6 and 7): a store written by this signoff, taken back to the schema before
them, reads back the same columns once upgraded, on both stores."""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Any

import pytest

import signoff as so
from signoff.stores import Commit

from ._audit import alter
from ._child_deadlines import before_child_deadlines
from ._procs import query
from .conftest import make_store

DAMAGED = b"\x07not a document"


def _event(sid: str, seq: int, type: Any, at: float, **data: Any) -> so.Event:
    turn = data.pop("turn", None)
    return so.Event(session_id=sid, seq=seq, type=type, at=at, turn_id=turn, data=data)


def _question(rid: str, sid: str, expires_at: float) -> so.InputRequest:
    return so.InputRequest(
        kind="question",
        id=rid,
        session_id=sid,
        turn_id="trn_c",
        agent="a",
        question="which one?",
        created_at=5.0,
        expires_at=expires_at,
    )


def _columns(url: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    sessions = query(
        url,
        "SELECT c.id, p.id, c.parent_turn FROM {t}sessions c "
        "LEFT JOIN {t}sessions p ON p.sk = c.parent ORDER BY c.id",
    )
    requests = query(url, "SELECT id, expires_at FROM {t}requests ORDER BY id")
    return sessions, requests


def _back_to_an_older_schema(url: str, deadlines: bool) -> None:
    """Undo the upgrade of session parents (and the ones after it), and with `deadlines` the one
    before it too, as a file or database they never ran on would be."""
    if url.startswith("sqlite:///"):
        with contextlib.closing(sqlite3.connect(url[len("sqlite:///") :])) as conn, conn:
            conn.execute("UPDATE sessions SET parent = NULL, parent_turn = NULL")
            if deadlines:
                conn.execute("UPDATE requests SET expires_at = NULL")
            mark = "4" if deadlines else "5"
            conn.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (mark,))
        return
    before_child_deadlines(url)  # migration 11's, after these
    alter(url, "DROP INDEX {t}sessions_by_initiator")  # migration 8's
    alter(url, "DROP INDEX {t}sessions_by_tenant")
    alter(url, "ALTER TABLE {t}sessions DROP COLUMN initiator, DROP COLUMN tenant")
    alter(url, "DROP INDEX {t}sessions_children")
    alter(url, "ALTER TABLE {t}sessions DROP COLUMN parent, DROP COLUMN parent_turn")
    if deadlines:
        alter(url, "DROP INDEX {t}requests_due")
        alter(url, "ALTER TABLE {t}requests DROP COLUMN expires_at")
    alter(url, "DELETE FROM {t}schema_version WHERE version >= {p}", 6 if deadlines else 7)


@pytest.mark.parametrize("deadlines", [True, False])
async def test_an_upgrade_fills_parents_and_deadlines_as_this_signoff_writes_them(
    store_url: str, deadlines: bool
) -> None:
    """A subagent's row names its parent and the parent's turn current when it was created
    (not an earlier or a later one); each open request row keeps its deadline, and one whose
    request cannot be read is due at once (its creation), so the sweep reads and reports it."""
    store = make_store(store_url)
    await store.open()
    try:
        await store.create_session(
            "ses_p",
            "a",
            [
                _event("ses_p", 1, "session.created", 1.0),
                _event("ses_p", 2, "turn.started", 1.5, turn="trn_0"),
                _event("ses_p", 3, "turn.started", 2.0, turn="trn_1"),
            ],
            None,
        )
        child = _event("ses_c", 1, "session.created", 3.0, parent="ses_p")
        await store.create_session("ses_c", "a", [child], None)
        later = _event("ses_p", 4, "turn.started", 4.0, turn="trn_2")
        await store.commit(Commit(session_id="ses_p", expected_seq=3, events=[later]))
        asks = [_question("req_a", "ses_c", 99.0), _question("req_b", "ses_c", 50.0)]
        waiting = _event("ses_c", 2, "session.waiting", 5.0)
        await store.commit(
            Commit(session_id="ses_c", expected_seq=1, events=[waiting], new_requests=asks)
        )
    finally:
        await store.close()
    written = _columns(store_url)
    assert written == (
        [("ses_c", "ses_p", "trn_1"), ("ses_p", None, None)],
        [("req_a", 99.0), ("req_b", 50.0)],
    )
    _back_to_an_older_schema(store_url, deadlines)
    alter(store_url, "UPDATE {t}requests SET data = {p} WHERE id = 'req_b'", DAMAGED)
    store = make_store(store_url)
    await store.open()
    await store.close()
    # only an upgrade adding the deadlines fills them: after, a deadline is the request's own
    filled = [("req_a", 99.0), ("req_b", 5.0 if deadlines else 50.0)]
    assert _columns(store_url) == (written[0], filled)
