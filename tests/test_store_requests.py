"""The `Store` protocol's requests: opened, resolved once, filtered and counted.

Part of the one suite for the `Store` protocol (test_store_conformance.py and
test_store_{requests,leases,concurrency,runtime,edited_rows}.py): the `store` and `store_url`
fixtures in conftest.py run it against both backends.
"""

from __future__ import annotations

from typing import Any

import pytest

import signoff as so
from signoff._exceptions import (
    AppendConflict,
    RequestClosed,
    StoreError,
)
from signoff._recording import dump_request
from signoff.stores import Commit, PendingFilter, Resolve, Store
from signoff.stores._pending import cursor_past

from .test_store_conformance import T0, approval, ev, new_session, question, settle
from .test_store_edited_rows import edit

# -- requests --------------------------------------------------------------------------------


async def test_new_request_then_resolve(store: Store) -> None:
    sid = await new_session(store)
    req = approval(sid, "req_a")
    await store.commit(
        Commit(
            session_id=sid,
            expected_seq=1,
            events=[ev(sid, 2, "input.requested", request_ids=["req_a"])],
            new_requests=[req],
        )
    )
    stored = await store.get_request("req_a")
    assert stored is not None
    assert (stored.status, stored.outcome, stored.resolution) == ("pending", None, None)
    assert stored.request == req
    assert stored.request.session_id == sid and stored.request.tool_name == "issue_refund"
    await store.commit(
        Commit(
            session_id=sid,
            expected_seq=2,
            events=[ev(sid, 3, "approval.settled"), ev(sid, 4, "input.resolved")],
            resolve=[
                Resolve(
                    request_id="req_a",
                    status="settled",
                    outcome="approved",
                    resolution={"outcome": "approved", "by": {"principal_id": "bob"}},
                )
            ],
            durable=True,
        )
    )
    stored = await store.get_request("req_a")
    assert stored is not None
    assert stored.status == "settled" and stored.request.status == "settled"
    assert stored.outcome == "approved"
    assert stored.resolution == {"outcome": "approved", "by": {"principal_id": "bob"}}
    assert await store.get_request("req_missing") is None


async def test_updated_requests_replace_the_stored_data(store: Store) -> None:
    sid = await new_session(store)
    req = approval(sid, "req_a")
    await store.commit(
        Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)], new_requests=[req])
    )
    changed = req.model_copy(update={"question": "Refund 180?", "expires_at": T0 + 60})
    await store.commit(
        Commit(session_id=sid, expected_seq=2, events=[ev(sid, 3)], updated_requests=[changed])
    )
    stored = await store.get_request("req_a")
    assert stored is not None and stored.request == changed and stored.status == "pending"
    assert await store.pending(PendingFilter(session_id=sid)) == [changed]
    # An update in a commit that fails is not applied either.
    again = changed.model_copy(update={"question": "never stored"})
    with pytest.raises(AppendConflict):
        await store.commit(
            Commit(session_id=sid, expected_seq=2, events=[ev(sid, 3)], updated_requests=[again])
        )
    stored = await store.get_request("req_a")
    assert stored is not None and stored.request.question == "Refund 180?"


async def test_resolve_of_a_closed_request_rolls_back_everything(store: Store) -> None:
    sid = await new_session(store)
    await store.commit(
        Commit(
            session_id=sid,
            expected_seq=1,
            events=[ev(sid, 2, "input.requested")],
            new_requests=[approval(sid, "req_a"), approval(sid, "req_b")],
        )
    )
    await store.commit(
        Commit(
            session_id=sid,
            expected_seq=2,
            events=[ev(sid, 3, "input.resolved")],
            resolve=[settle("req_a")],
        )
    )
    # req_b is still pending, req_a is not: the whole commit must fail and write nothing.
    with pytest.raises(RequestClosed) as info:
        await store.commit(
            Commit(
                session_id=sid,
                expected_seq=3,
                events=[ev(sid, 4, "input.resolved"), ev(sid, 5, "input.resolved")],
                resolve=[settle("req_b", "cancelled"), settle("req_a", "cancelled")],
                new_requests=[question(sid, "req_c")],
                snapshot={"seq": 5},
            )
        )
    assert info.value.request_ids == ["req_a"]
    assert await store.head(sid) == 3
    b = await store.get_request("req_b")
    assert b is not None and b.status == "pending" and b.outcome is None
    a = await store.get_request("req_a")
    assert a is not None and a.outcome == "approved"
    assert await store.get_request("req_c") is None
    loaded = await store.load(sid)
    assert loaded is not None and loaded.snapshot is None and len(loaded.events) == 3


async def test_resolve_of_another_sessions_request_is_refused(store: Store) -> None:
    s1 = await new_session(store)
    s2 = await new_session(store)
    await store.commit(
        Commit(session_id=s1, expected_seq=1, events=[ev(s1, 2)], new_requests=[approval(s1, "r1")])
    )
    with pytest.raises(RequestClosed):
        await store.commit(
            Commit(session_id=s2, expected_seq=1, events=[ev(s2, 2)], resolve=[settle("r1")])
        )
    r1 = await store.get_request("r1")
    assert r1 is not None and r1.status == "pending"
    assert await store.head(s2) == 1


async def test_a_requests_session_is_read_without_its_data(store: Store, store_url: str) -> None:
    """`request_session(id)`: the session holding a request, open or closed, read without the
    request's data, so even a damaged row answers it (the server decides from it whether a
    caller may see the request before reading that); None for an id no request has."""
    s1, s2 = await new_session(store), await new_session(store)
    for sid, rid in ((s1, "req_a"), (s2, "req_b")):
        await store.commit(
            Commit(session_id=sid, expected_seq=1, events=[], new_requests=[approval(sid, rid)])
        )
    await store.commit(Commit(session_id=s2, expected_seq=1, events=[], resolve=[settle("req_b")]))
    edit(store_url, "UPDATE {t}requests SET data = {p} WHERE id = {p}", b"garbage", "req_a")
    with pytest.raises(so.StoreDamaged, match="req_a"):
        await store.get_request("req_a")
    session_of = store.request_session  # type: ignore[attr-defined]
    assert await session_of("req_a") == s1
    assert await session_of("req_b") == s2
    for unknown in ("req_c", "req_a\x00", s1, ""):
        assert await session_of(unknown) is None, unknown


async def test_duplicate_request_id_conflicts_and_writes_nothing(store: Store) -> None:
    sid = await new_session(store)
    await store.commit(
        Commit(
            session_id=sid, expected_seq=1, events=[ev(sid, 2)], new_requests=[approval(sid, "r")]
        )
    )
    with pytest.raises(StoreError):
        await store.commit(
            Commit(
                session_id=sid,
                expected_seq=2,
                events=[ev(sid, 3)],
                new_requests=[approval(sid, "r")],
            )
        )
    assert await store.head(sid) == 2


async def test_pending_filters_and_count(store: Store) -> None:
    s1 = await new_session(store, "support")
    s2 = await new_session(store, "billing")
    await store.commit(
        Commit(
            session_id=s1,
            expected_seq=1,
            events=[ev(s1, 2, "input.requested")],
            new_requests=[
                approval(s1, "req_1", at=T0 + 1),
                question(s1, "req_2", at=T0 + 2),
                approval(s1, "req_3", tool="delete_account", at=T0 + 3),
            ],
        )
    )
    await store.commit(
        Commit(
            session_id=s2,
            expected_seq=1,
            events=[ev(s2, 2, "input.requested")],
            new_requests=[approval(s2, "req_4", agent="billing", at=T0 + 4)],
        )
    )
    await store.commit(
        Commit(
            session_id=s1,
            expected_seq=2,
            events=[ev(s1, 3, "input.resolved")],
            resolve=[settle("req_3", "cancelled")],
        )
    )

    async def ids(**kw: Any) -> list[str]:
        flt = PendingFilter(**kw)
        found = [r.id for r in await store.pending(flt)]
        if "limit" not in kw and "offset" not in kw:
            assert await store.count_pending(flt) == len(found)
        return found

    assert await ids() == ["req_1", "req_2", "req_4"]
    assert await ids(agent="billing") == ["req_4"]
    assert await ids(session_id=s1) == ["req_1", "req_2"]
    assert await ids(kind="question") == ["req_2"]
    assert await ids(tool_name="issue_refund") == ["req_1", "req_4"]
    assert await ids(tool_name="delete_account") == []
    assert await ids(status="settled") == ["req_3"]
    assert await ids(status=None) == ["req_1", "req_2", "req_3", "req_4"]
    assert await ids(created_before=T0 + 2) == ["req_1"]
    assert await ids(created_after=T0 + 1) == ["req_2", "req_4"]
    assert await ids(limit=2) == ["req_1", "req_2"]
    assert await ids(limit=2, offset=2) == ["req_4"]
    assert await ids(excluded=("req_2",)) == ["req_1", "req_4"]
    assert await ids(excluded=("req_2",), limit=1, offset=1) == ["req_4"]
    assert await ids(excluded=("req_1", "req_4", "no such", 'it\'s "quoted"')) == ["req_2"]
    assert await ids(agent="billing", excluded=("req_1",)) == ["req_4"]
    assert await ids(session_ids=(s2, "no such", 'it\'s "quoted"')) == ["req_4"]
    assert await ids(session_ids=(s1, s2), kind="tool-approval") == ["req_1", "req_4"]
    assert await ids(session_ids=(s2,), session_id=s1) == []
    assert await ids(session_ids=()) == []
    assert await store.count_pending(PendingFilter(limit=1)) == 3
    listed = await store.pending(PendingFilter(session_id=s1))
    assert all(r.status == "pending" for r in listed)
    settled = await store.pending(PendingFilter(status="settled"))
    assert settled[0].status == "settled"


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"agent": 5}, r"PendingFilter\(agent=...\) must be text or None, not 5"),
        ({"tool_name": b"x"}, r"PendingFilter\(tool_name=...\) must be text or None"),
        ({"status": 1}, r"PendingFilter\(status=...\) must be text or None, not 1"),
        ({"session_id": ["s"]}, r"PendingFilter\(session_id=...\) must be text or None"),
        ({"kind": 0}, r"PendingFilter\(kind=...\) must be text or None, not 0"),
        ({"created_before": "1"}, r"PendingFilter\(created_before=...\) must be a finite"),
        ({"live_at": float("nan")}, r"PendingFilter\(live_at=...\) must be a finite"),
        ({"due_by": True}, r"PendingFilter\(due_by=...\) must be a finite"),
        ({"created_after": float("inf")}, r"PendingFilter\(created_after=...\) must be a fin"),
        # No float holds it (an OverflowError), or SQLite cannot bind it where psycopg can.
        ({"created_before": 10**400}, r"PendingFilter\(created_before=...\) must be a finite"),
        ({"due_by": -(2**63) - 1}, r"PendingFilter\(due_by=...\) must be a finite"),
        ({"live_at": 2**63}, r"PendingFilter\(live_at=...\) must be a finite time"),
        ({"limit": -1}, r"PendingFilter\(limit=...\) must be a whole number from 0, not -1"),
        ({"limit": "5"}, r"PendingFilter\(limit=...\) must be a whole number from 0"),
        ({"offset": 2.0}, r"PendingFilter\(offset=...\) must be a whole number from 0"),
        ({"offset": 2**63}, r"PendingFilter\(offset=...\) must be a whole number from 0"),
        ({"excluded": ["req_1"]}, r"PendingFilter\(excluded=...\) must be a tuple of request"),
        ({"excluded": ("req_1", 2)}, r"PendingFilter\(excluded=...\) must be a tuple of req"),
        ({"session_ids": ["s"]}, r"PendingFilter\(session_ids=...\) must be a tuple of sess"),
        ({"session_ids": ("s", 2)}, r"PendingFilter\(session_ids=...\) must be a tuple of s"),
        ({"session_ids": ("s\ud800",)}, r"PendingFilter\(session_ids=...\) must be a tuple"),
        ({"after": (T0, 5)}, r"PendingFilter\(after=...\) must be a request's \(created_at, id\)"),
        ({"after": ["1", "req_1"]}, r"PendingFilter\(after=...\) must be a request's"),
        ({"after": (True, "req_1")}, r"PendingFilter\(after=...\) must be a request's"),
        ({"after": (float("nan"), "req_1")}, r"PendingFilter\(after=...\) must be a request's"),
        ({"after": (T0, "req_\ud800")}, r"PendingFilter\(after=...\) must be a request's"),
        ({"after": (T0, "req_\x00")}, r"PendingFilter\(after=...\) must be a request's"),
        ({"after": (T0,)}, r"PendingFilter\(after=...\) must be a request's"),
    ],
)
def test_a_pending_filter_of_the_wrong_kind_is_refused_when_made(
    given: dict[str, Any], message: str
) -> None:
    """SQLite matched `agent=5` as the text '5' where psycopg failed on it, and a negative
    limit was "no limit" to SQLite: a filter the two stores would read differently is refused
    before either sees it."""
    with pytest.raises(so.UsageError, match=message):
        PendingFilter(**given)
    assert PendingFilter(agent="a", live_at=1, due_by=2.5, limit=0, offset=2**63 - 1).limit == 0
    assert PendingFilter(created_before=2**63 - 1, created_after=-(2**63)).created_after == -(2**63)


async def test_pages_read_after_a_request_skip_none_when_an_earlier_one_closes(
    store: Store,
) -> None:
    """`PendingFilter.after` pages by the listing's order (`created_at`, then, for rows that
    no event holds, as here, the id byte by byte): a request closed on the first page before
    the second is read shifts nothing out of it, where an offset would skip the request that
    moved up to the first page."""
    sid = await new_session(store)
    made = [("req_b", T0), ("req_B", T0), ("req_a", T0), ("req_z", T0 - 1), ("req_0", T0 + 1)]
    new = [approval(sid, rid, at=at) for rid, at in made]
    events = [ev(sid, 2, "input.requested", request_ids=[r.id for r in new])]
    await store.commit(Commit(session_id=sid, expected_seq=1, events=events, new_requests=new))
    order = ["req_z", "req_B", "req_a", "req_b", "req_0"]
    assert [r.id for r in await store.pending(PendingFilter())] == order
    first = await store.pending(PendingFilter(limit=2))
    assert [r.id for r in first] == order[:2]
    resolved = Commit(
        session_id=sid, expected_seq=2, events=[ev(sid, 3)], resolve=[settle("req_z")]
    )
    await store.commit(resolved)
    skipping = await store.pending(PendingFilter(limit=2, offset=2))
    assert [r.id for r in skipping] == ["req_b", "req_0"]  # the offset's page: no req_a
    seen = [r.id for r in first]
    after = (first[-1].created_at, first[-1].id)
    while page := await store.pending(PendingFilter(limit=2, after=after)):
        seen += [r.id for r in page]
        after = (page[-1].created_at, page[-1].id)
    assert seen == order
    assert await store.count_pending(PendingFilter(after=(T0, "req_B"))) == 3
    assert await store.pending(PendingFilter(after=(T0 + 1, "req_0"))) == []


async def test_requests_of_one_moment_are_listed_and_paged_in_the_order_asked(
    store: Store,
) -> None:
    """Requests made at one moment (one response's, or a clock that stands still) are listed
    in the order their `input.requested` events asked them, not by their random ids: a page,
    each page past the last one's request, the keys of a damaged page, and the count past one."""
    sid = await new_session(store)
    first = [question(sid, rid) for rid in ("req_d", "req_c", "req_b")]
    asked = [ev(sid, 2, "input.requested", requests=[dump_request(r) for r in first])]
    await store.commit(Commit(session_id=sid, expected_seq=1, events=asked, new_requests=first))
    later = [approval(sid, "req_a"), approval(sid, "req_0", at=T0 - 1)]
    asked = [ev(sid, 3, "input.requested", requests=[dump_request(r) for r in later])]
    await store.commit(Commit(session_id=sid, expected_seq=2, events=asked, new_requests=later))
    order = ["req_0", "req_d", "req_c", "req_b", "req_a"]
    assert [r.id for r in await store.pending(PendingFilter(session_id=sid))] == order
    keys = await store.pending_keys(PendingFilter(session_id=sid))  # type: ignore[attr-defined]
    assert [rid for _, rid, _ in keys] == order
    seen: list[str] = []
    after: tuple[float, str] | None = None
    while page := await store.pending(PendingFilter(limit=2, after=after)):
        seen += [r.id for r in page]
        after = cursor_past(page[-1], after)
    assert seen == order
    assert await store.count_pending(PendingFilter(after=(T0, "req_c"))) == 2
    assert [r.id for r in await store.pending(PendingFilter(after=(T0, "req_d")))] == order[2:]
    # A cursor whose request is gone (its session deleted meanwhile) skips none of its moment.
    assert [r.id for r in await store.pending(PendingFilter(after=(T0, "req_e")))] == order[1:]
