"""Who started each session, kept in its row when it is created (both stores): listings of
sessions and requests filter by it in SQL, served by the indexes of the session rows."""

from __future__ import annotations

from typing import Any

import pytest

import signoff as so
from signoff.stores import Commit, InitiatorFilter, PendingFilter, Store
from signoff.stores._initiators import initiator_columns, initiator_key

from ._procs import query

ALICE = so.Principal(authenticator="token", principal_id="alice", attributes={"tenant": "acme"})
ALICE_ELSEWHERE = ALICE.model_copy(update={"attributes": {"tenant": "evil"}})
BOB = so.Principal(authenticator="token", principal_id="bob", attributes={"tenant": "acme"})
CAROL = so.Principal(authenticator="token", principal_id="carol")  # no tenant
ODD = so.Principal(authenticator="token", principal_id="odd\x00\u00e9", attributes={"tenant": 7})
SSO_ALICE = so.Principal(authenticator="token", principal_id="alice", issuer="sso")


def _created(sid: str, at: float, initiator: so.Principal | None, **more: Any) -> so.Event:
    data = {"agent": "a", "initiator": None if initiator is None else initiator.model_dump()}
    return so.Event(session_id=sid, seq=1, type="session.created", at=at, data={**data, **more})


def _ask(sid: str, at: float) -> so.InputRequest:
    return so.InputRequest(
        kind="question",
        id=f"req_{sid}",
        session_id=sid,
        turn_id="t",
        agent="a",
        question="?",
        created_at=at,
    )


async def _populate(store: Store) -> dict[str, so.Principal | None]:
    """One session per initiator (and a subagent's child of Alice's), each with an open request;
    returns who started each, oldest first."""
    started: dict[str, so.Principal | None] = {
        "ses_alice": ALICE,
        "ses_bob": BOB,
        "ses_carol": CAROL,
        "ses_none": None,
        "ses_odd": ODD,
        "ses_sso": SSO_ALICE,
        "ses_moved": ALICE_ELSEWHERE,
    }
    at = 1.0
    for sid, initiator in started.items():
        await store.create_session(sid, "a", [_created(sid, at, initiator)], None)
        at += 1
    # A subagent's child carries its parent's initiator in its first event, as `_subagents` does.
    child = _created("ses_child", at, ALICE, parent="ses_alice", parent_turn=None)
    await store.create_session("ses_child", "a", [child], None)
    started["ses_child"] = ALICE
    for sid in started:
        waiting = so.Event(session_id=sid, seq=2, type="session.waiting", at=at)
        await store.commit(
            Commit(
                session_id=sid,
                expected_seq=1,
                events=[waiting],
                new_requests=[_ask(sid, at)],
                status="waiting",
            )
        )
        at += 1
    return started


def test_the_columns_name_the_identity_and_a_text_tenant() -> None:
    """The identity is what `Principal.same_as` compares (not attributes); a tenant is kept only
    as text; a NUL or any other character is escaped, so PostgreSQL's text holds it too."""
    assert initiator_columns([_created("s", 1.0, ALICE)]) == (
        '["token",null,"user","alice"]',
        '"acme"',
    )
    assert initiator_key(ALICE) == initiator_key(ALICE_ELSEWHERE) != initiator_key(SSO_ALICE)
    assert initiator_columns([_created("s", 1.0, None)]) == ("", None)
    key, tenant = initiator_columns([_created("s", 1.0, ODD)])
    assert tenant is None and key == '["token",null,"user","odd\\u0000\\u00e9"]'
    damaged = so.Event(session_id="s", seq=1, type="session.created", at=1.0, data={})
    damaged.data["initiator"] = {"principal_id": 5}
    assert initiator_columns([damaged]) == (None, None)  # unknown: no filter matches it
    assert initiator_columns([]) == (None, None)


async def test_a_new_session_row_keeps_who_started_it(store: Store, store_url: str) -> None:
    started = await _populate(store)
    rows = dict(
        (sid, (initiator, tenant))
        for sid, initiator, tenant in query(
            store_url, "SELECT id, initiator, tenant FROM {t}sessions"
        )
    )
    assert rows == {
        sid: initiator_columns([_created(sid, 1.0, who)]) for sid, who in started.items()
    }
    assert rows["ses_child"] == rows["ses_alice"]


@pytest.mark.parametrize(
    ("picks", "expected"),
    [
        (InitiatorFilter(principal=ALICE), ["ses_alice", "ses_moved", "ses_child"]),
        (InitiatorFilter(tenant="acme"), ["ses_alice", "ses_bob", "ses_child"]),
        (InitiatorFilter(anonymous=True), ["ses_none"]),
        (
            InitiatorFilter(principal=BOB, tenant="evil"),
            ["ses_bob", "ses_moved"],
        ),
        (InitiatorFilter(principal=CAROL, anonymous=True), ["ses_carol", "ses_none"]),
        (InitiatorFilter(principal=ODD), ["ses_odd"]),
        (InitiatorFilter(principal=SSO_ALICE), ["ses_sso"]),
        (InitiatorFilter(tenant="nobody"), []),
    ],
)
async def test_listings_pick_sessions_and_requests_by_initiator(
    store: Store, picks: InitiatorFilter, expected: list[str]
) -> None:
    """`initiated_by` picks the sessions started by the principal (its identity, whatever its
    attributes), by anyone of the tenant, or by no one, whichever it names; sessions, their
    count, requests and their count agree, and pages split them without gap or overlap."""
    await _populate(store)
    newest_first = expected[::-1]
    listed = await store.sessions(initiated_by=picks)
    assert [s.id for s in listed] == newest_first
    assert await store.count_sessions(initiated_by=picks) == len(expected)
    pages = [await store.sessions(initiated_by=picks, limit=2, offset=o) for o in (0, 2, 4)]
    assert [s.id for page in pages for s in page] == newest_first
    assert await store.count_sessions(initiated_by=picks, agent="b") == 0
    assert await store.count_sessions(initiated_by=picks, status="waiting") == len(expected)
    flt = PendingFilter(initiated_by=picks)
    assert [r.session_id for r in await store.pending(flt)] == expected
    assert await store.count_pending(flt) == len(expected)
    second = PendingFilter(initiated_by=picks, limit=1, offset=1)
    assert [r.session_id for r in await store.pending(second)] == expected[1:2]


async def test_a_filter_that_is_not_one_is_refused(store: Store) -> None:
    with pytest.raises(so.UsageError, match="needs a principal, a tenant or anonymous"):
        InitiatorFilter()
    with pytest.raises(so.UsageError, match="tenant=...\\) must be text"):
        InitiatorFilter(tenant=7)  # type: ignore[arg-type]
    with pytest.raises(so.UsageError, match="principal=...\\) must be a Principal"):
        InitiatorFilter(principal={"principal_id": "alice"})  # type: ignore[arg-type]
    with pytest.raises(so.UsageError, match="anonymous=...\\) must be True or False"):
        InitiatorFilter(anonymous=1)  # type: ignore[arg-type]
    with pytest.raises(so.UsageError, match="initiated_by=...\\) must be an InitiatorFilter"):
        PendingFilter(initiated_by="alice")  # type: ignore[arg-type]
    with pytest.raises(so.UsageError, match="initiated_by must be an InitiatorFilter"):
        await store.sessions(initiated_by="alice")  # type: ignore[arg-type]
    with pytest.raises(so.UsageError, match="initiated_by must be an InitiatorFilter"):
        await store.count_sessions(initiated_by="alice")  # type: ignore[arg-type]


async def test_the_indexes_of_the_session_rows_serve_the_filter(
    store: Store, store_url: str
) -> None:
    """The plan of a listing by initiator, tenant or none reads the session rows through their
    indexes (PostgreSQL with sequential scans off: a table this small is cheaper scanned)."""
    await _populate(store)
    picks = InitiatorFilter(principal=ALICE, tenant="acme")
    none = InitiatorFilter(principal=CAROL, anonymous=True)
    assert _plan(store_url, picks) == {"sessions_by_initiator", "sessions_by_tenant"}
    assert "sessions_by_initiator" in _plan(store_url, none)


def _plan(url: str, flt: InitiatorFilter) -> set[str]:
    """The indexes the plan of a session listing filtered by `flt` names."""
    condition, params = flt.where("{p}", "sessions")
    sql = "SELECT id FROM {t}sessions WHERE " + condition + " ORDER BY updated_at DESC LIMIT 50"
    if url.startswith("sqlite:///"):
        rows = query(url, "EXPLAIN QUERY PLAN " + sql, *params)
        text = " ".join(str(r[-1]) for r in rows)
    else:
        import psycopg

        with psycopg.connect(url.partition("?")[0]) as conn:
            conn.execute("SET enable_seqscan = off")
            done = conn.execute(("EXPLAIN " + sql.format(t='"signoff".', p="%s")).encode(), params)
            text = " ".join(str(r[0]) for r in done.fetchall())
    return {name for name in ("sessions_by_initiator", "sessions_by_tenant") if name in text}
