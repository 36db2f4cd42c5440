"""The `Store` protocol under faults and concurrency: the fault hook, racing commits and
settlements, reopening, and change notifications.

Part of the one suite for the `Store` protocol (test_store_conformance.py and
test_store_{requests,leases,concurrency,runtime,edited_rows}.py): the `store` and `store_url`
fixtures in conftest.py run it against both backends.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from signoff._exceptions import (
    AppendConflict,
    RequestClosed,
    UnknownSession,
)
from signoff.stores import Commit, PendingFilter, Store

from .conftest import make_store
from .test_store_conformance import approval, ev, new_session, settle

# -- faults and concurrency ------------------------------------------------------------------


async def test_fault_hook_brackets_every_commit(store: Store) -> None:
    calls: list[tuple[str, str]] = []
    store.set_fault_hook(lambda when, label: calls.append((when, label)))
    sid = await new_session(store)
    await store.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2, "tool.started")]))
    assert calls == [
        ("before", "session.created"),
        ("after", "session.created"),
        ("before", "tool.started"),
        ("after", "tool.started"),
    ]

    def crash(when: str, label: str) -> None:
        if when == "before":
            raise RuntimeError("simulated crash")

    store.set_fault_hook(crash)
    with pytest.raises(RuntimeError):
        await store.commit(Commit(session_id=sid, expected_seq=2, events=[ev(sid, 3)]))
    store.set_fault_hook(None)
    assert await store.head(sid) == 2


async def test_concurrent_commits_at_one_seq_exactly_one_wins(store_url: str) -> None:
    stores = [make_store(store_url) for _ in range(4)]
    for s in stores:
        await s.open()
    try:
        sid = await new_session(stores[0])
        await stores[0].commit(
            Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)], new_requests=[])
        )

        async def attempt(i: int) -> str:
            s = stores[i % len(stores)]
            try:
                await s.commit(
                    Commit(
                        session_id=sid,
                        expected_seq=2,
                        events=[ev(sid, 3, "model.completed", writer=i), ev(sid, 4, writer=i)],
                        new_requests=[approval(sid, f"req_w{i}")],
                    )
                )
            except AppendConflict:
                return "conflict"
            return "won"

        results = await asyncio.gather(*(attempt(i) for i in range(12)))
        assert results.count("won") == 1, results
        assert results.count("conflict") == 11
        winner = results.index("won")
        events = await stores[1].read_events(sid)
        assert [e.seq for e in events] == [1, 2, 3, 4]
        assert {e.data.get("writer") for e in events[2:]} == {winner}
        assert [r.id for r in await stores[2].pending(PendingFilter(session_id=sid))] == [
            f"req_w{winner}"
        ]
    finally:
        for s in stores:
            await s.close()


async def test_concurrent_settlements_of_one_request_exactly_one_wins(store_url: str) -> None:
    stores = [make_store(store_url) for _ in range(3)]
    for s in stores:
        await s.open()
    try:
        sid = await new_session(stores[0])
        await stores[0].commit(
            Commit(
                session_id=sid,
                expected_seq=1,
                events=[ev(sid, 2)],
                new_requests=[approval(sid, "r")],
            )
        )

        async def answer(i: int) -> str:
            s = stores[i % len(stores)]
            for _ in range(50):
                head = await s.head(sid)
                assert head is not None
                try:
                    await s.commit(
                        Commit(
                            session_id=sid,
                            expected_seq=head,
                            events=[ev(sid, head + 1, "input.resolved", by=i)],
                            resolve=[settle("r")],
                            durable=True,
                        )
                    )
                except AppendConflict:
                    continue
                except RequestClosed:
                    return "closed"
                return "settled"
            return "starved"

        results = await asyncio.gather(*(answer(i) for i in range(9)))
        assert results.count("settled") == 1, results
        assert results.count("closed") == 8
        assert await stores[0].head(sid) == 3
    finally:
        for s in stores:
            await s.close()


async def test_store_can_be_reopened(store_url: str) -> None:
    s = make_store(store_url)
    await s.open()
    sid = await new_session(s)
    await s.close()
    await s.close()  # twice is fine
    await s.open()
    try:
        assert await s.head(sid) == 1
    finally:
        await s.close()


# -- change notifications --------------------------------------------------------------------


async def test_wait_for_change(store_url: str) -> None:
    waiter, writer = make_store(store_url), make_store(store_url)
    await waiter.open()
    await writer.open()
    try:
        s1 = await new_session(writer)
        s2 = await new_session(writer)
        wait = waiter.wait_for_change  # type: ignore[attr-defined]
        assert await wait(s1, 0.2) is False  # nothing happens: times out
        assert await wait(s1, 5, after=0) is True  # already past seq 0
        assert await wait(s1, 0.2, after=1) is False

        async def commit_later(sid: str, seq: int) -> None:
            await asyncio.sleep(0.1)
            await writer.commit(Commit(session_id=sid, expected_seq=seq, events=[ev(sid, seq + 1)]))

        task = asyncio.create_task(commit_later(s1, 1))
        assert await wait(s1, 10) is True
        await task
        task = asyncio.create_task(commit_later(s2, 1))
        assert await wait(s1, 0.5) is False  # another session's commit does not wake s1
        await task
        task = asyncio.create_task(commit_later(s2, 2))
        assert await wait(None, 10) is True  # any session
        await task
        task = asyncio.create_task(commit_later(s1, 2))
        assert await wait(s1, 10, after=2) is True
        await task
        with pytest.raises(UnknownSession):
            await wait("ses_nope", 1, after=0)
    finally:
        await waiter.close()
        await writer.close()


async def test_a_wait_since_a_mark_returns_at_once_for_a_commit_made_after_it(
    store_url: str,
) -> None:
    """A worker reads `change_mark()` before it claims and waits with it as `since`: on SQLite
    a commit made in between (while it claimed) ended no wait, which looked only for commits
    made once it began, and the worker slept its whole `idle_wait` with work to do."""
    waiter, writer = make_store(store_url), make_store(store_url)
    await waiter.open()
    await writer.open()
    try:
        s1 = await new_session(writer)
        wait = waiter.wait_for_change  # type: ignore[attr-defined]
        assert await wait(None, 0.05) is False  # PostgreSQL: starts the listener
        mark = waiter.change_mark()  # type: ignore[attr-defined]
        await writer.commit(Commit(session_id=s1, expected_seq=1, events=[ev(s1, 2)]))
        began = time.monotonic()
        assert await wait(None, 10, since=mark) is True
        assert time.monotonic() - began < 5
        mark = waiter.change_mark()  # type: ignore[attr-defined]
        assert await wait(None, 0.2, since=mark) is False  # none since
    finally:
        await waiter.close()
        await writer.close()
