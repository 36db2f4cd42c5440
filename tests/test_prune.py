"""`Runtime.prune`: retention. The finished top-level sessions last active before a cutoff go,
oldest first, a bounded batch at a time, each with its subagents' sessions and its own
`store:deletions` entry; live ones, recent ones and ones touched after the listing stay."""

from __future__ import annotations

import asyncio
import io
import math
from typing import Any

import pytest

import signoff as so
from signoff.stores._deletions import DELETIONS_STREAM
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from .test_deletion import ALICE, ODD, ODD_RECORDED, OPS, agents, chat_with_ttl
from .test_store_edited_rows import edit
from .test_subagents_spend import waiting_child

DAY = 86400.0


def _desk() -> list[so.Agent]:
    """`desk`, whose turn delegates to `helper` and ends, and `front`, whose turn delegates to
    `desk`; `helper` answers a person talking to it directly, and asks for a refund's approval
    when asked for one. With `agents()`."""

    @so.tool(approval=so.always())
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    def helping(conversation: list[Any]) -> so.ModelResponse:
        last = conversation[-1]
        if isinstance(last, so.UserMessage) and "refund" in last.text:
            return call_tools(call("refund", order_id="4"))
        return reply("order 3 is shipped")

    desk = scripted_agent(
        "desk",
        [call_tools(call("helper", message="where is order 3?")), reply("done")],
        tools=[so.delegate("helper")],
    )
    front = scripted_agent(
        "front",
        [call_tools(call("desk", message="where is order 3?")), reply("done")],
        tools=[so.delegate("desk")],
    )
    helper = scripted_agent("helper", [helping], tools=[refund], repeat_last=True)
    return [*agents(), desk, front, helper]


async def _helped(rt: so.Runtime, agent: str = "desk") -> tuple[str, str]:
    """A session of `agent` (`desk`, or `front` above it) whose turn ended, with the `helper`
    session under it (idle)."""
    helpers = {s.id for s in await rt.sessions(agent="helper")}
    r = await rt.generate(agent, prompt="where is order 3?", auth=ALICE)
    assert r.status == "completed"
    [child] = {s.id for s in await rt.sessions(agent="helper")} - helpers
    return r.session_id, child


async def _finished(rt: so.Runtime, clock: ManualClock, n: int = 1) -> list[str]:
    """`n` completed sessions, one a second apart (so oldest first is their order)."""
    ids = []
    for _ in range(n):
        ids.append((await rt.generate("chat", prompt="hi", auth=ALICE)).session_id)
        clock.advance(1)
    return ids


async def test_old_finished_top_level_sessions_go_with_their_subagents(store_url: str) -> None:
    clock = ManualClock()
    async with so.Runtime(agents(), store=store_url, clock=clock) as rt:
        [done] = await _finished(rt, clock)
        parent, child = await waiting_child(rt)
        await rt.cancel(parent, principal=ALICE)
        clock.advance(1)
        waiting = (await rt.generate("chat", prompt="refund it", auth=ALICE)).session_id
        clock.advance(40 * DAY)
        [recent] = await _finished(rt, clock)
        deleted = await rt.prune(older_than=30 * DAY, by=OPS, reason="retention 30d")
        assert deleted == [done, parent]
        for sid in (done, parent, child):
            with pytest.raises(so.UnknownSession):
                await rt.state(sid)
        assert {s.id for s in await rt.sessions()} == {waiting, recent}
        assert await rt.verify_audit() == []
        entries = await rt.audit(stream=DELETIONS_STREAM)
        assert [e.data["session_id"] for e in entries] == [done, parent]
        assert [d["id"] for d in entries[1].data["sessions"]] == [parent, child]
        assert all(e.data["by"] == OPS.model_dump() for e in entries)
        assert all(e.data["reason"] == "retention 30d" for e in entries)
        assert await rt.prune(older_than=30 * DAY) == []  # nothing more is old enough


async def test_a_batch_takes_the_oldest_first_up_to_the_limit(store_url: str) -> None:
    clock = ManualClock()
    async with so.Runtime(agents(), store=store_url, clock=clock) as rt:
        ids = await _finished(rt, clock, 5)
        clock.advance(DAY)
        assert await rt.prune(older_than=3600, limit=2) == ids[:2]
        assert await rt.prune(older_than=3600, limit=2) == ids[2:4]
        assert await rt.prune(older_than=3600, limit=2) == ids[4:]
        assert await rt.prune(older_than=3600, limit=2) == []
        assert len(await rt.audit(stream=DELETIONS_STREAM)) == 5
        assert await rt.verify_audit() == []


async def test_a_prune_lets_the_loops_other_tasks_run_between_its_deletions(
    store_url: str,
) -> None:
    """A SQLite store never suspends, and a prune's loop over its deletions never yielded: it
    held the event loop for the whole batch (10,000 sessions: 34 s, past a lease's TTL, so a
    drive beside it lost its lease). A task beside it now runs between each two deletions."""
    clock = ManualClock()
    async with so.Runtime(agents(), store=store_url, clock=clock) as rt:
        await asyncio.gather(*(rt.generate("chat", prompt="hi") for _ in range(200)))
        clock.advance(DAY)
        ticks = 0
        pruning = True

        async def ticker() -> None:
            nonlocal ticks
            while pruning:
                ticks += 1
                await asyncio.sleep(0)

        beside = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        first = ticks
        try:
            assert len(await rt.prune(older_than=3600)) == 200
        finally:
            pruning = False
            await beside
        assert ticks - first >= 200
        assert await rt.sessions() == []


async def test_sessions_it_must_skip_take_no_place_in_the_batch(store_url: str) -> None:
    """The two oldest sessions' subagents wait on a person, so neither can go; behind them,
    three old finished ones. Each prune listed the `limit` oldest, skipped them and returned []
    (fewer than `limit`: "done") for ever. It goes on past the ones it skips."""
    clock = ManualClock()
    async with so.Runtime(_desk(), store=store_url, clock=clock) as rt:
        kept = []
        for _ in range(2):
            parent, child = await _helped(rt)
            r = await rt.generate(session_id=child, prompt="refund order 4", auth=ALICE)
            assert r.status == "waiting"
            kept += [parent, child]
            clock.advance(1)
        ids = await _finished(rt, clock, 3)
        clock.advance(100 * DAY)
        deleted, listed, more, damaged = await rt._prune(
            older_than=90 * DAY, by=OPS, reason=None, limit=2, agent=None
        )
        assert (deleted, listed, more, damaged) == (ids[:2], [kept[0], kept[2], *ids[:2]], True, {})
        assert await rt.prune(older_than=90 * DAY, limit=2) == ids[2:]  # fewer: none left
        assert await rt.prune(older_than=90 * DAY, limit=2) == []
        assert sorted(s.id for s in await rt.sessions()) == sorted(kept)
        assert len(await rt.audit(stream=DELETIONS_STREAM)) == 3
        assert await rt.verify_audit() == []


async def test_a_batch_ending_on_the_last_of_a_page_says_whether_more_are_left(
    store_url: str,
) -> None:
    """A page lists one more than the limit; one skipped, the limit is reached on its last
    row: whether any are left past it is looked up, not guessed."""
    clock = ManualClock()
    async with so.Runtime(agents(), store=store_url, clock=clock) as rt:
        leased, *ids = await _finished(rt, clock, 4)
        clock.advance(DAY)
        token = await rt.store.acquire_lease(leased, "elsewhere", 3 * DAY, rt.now())
        assert token is not None
        found = await rt._prune(older_than=60, by=OPS, reason=None, limit=2, agent=None)
        assert found == (ids[:2], [leased, *ids[:2]], True, {})
        found = await rt._prune(older_than=60, by=OPS, reason=None, limit=1, agent=None)
        assert found == (ids[2:], [leased, ids[2]], False, {})
        assert [s.id for s in await rt.sessions()] == [leased]


async def test_the_cutoff_is_last_activity_not_creation(store_url: str) -> None:
    clock = ManualClock()
    async with so.Runtime(agents(), store=store_url, clock=clock) as rt:
        old, active = await _finished(rt, clock, 2)
        clock.advance(10 * DAY)
        await rt.generate(session_id=active, prompt="again", auth=ALICE)
        clock.advance(DAY)
        assert await rt.prune(older_than=5 * DAY) == [old]
        assert [s.id for s in await rt.sessions()] == [active]


async def test_a_session_is_as_old_as_the_newest_activity_under_it(store_url: str) -> None:
    """A person talked to a subagent's subagent a minute ago; the session at the top was last
    active 100 days ago. A prune of 90 days deleted the three, the one just used with them:
    a session's tree is as old as its newest activity, in the listing and in the deletion."""
    clock = ManualClock()
    async with so.Runtime(_desk(), store=store_url, clock=clock) as rt:
        top, grandchild = await _helped(rt, "front")
        old = await _finished(rt, clock, 2)
        clock.advance(100 * DAY)
        r = await rt.generate(session_id=grandchild, prompt="and order 4?", auth=ALICE)
        assert r.status == "completed"
        clock.advance(60)
        tree = {s.id for s in await rt.sessions()} - set(old)
        assert len(tree) == 3
        for limit, listed, more in ((10, old, False), (1, old[:1], True)):
            assert await rt._prune(
                older_than=90 * DAY, by=OPS, reason=None, limit=limit, agent=None, dry_run=True
            ) == ([], listed, more, {})
        assert await rt.prune(older_than=90 * DAY) == old
        assert {s.id for s in await rt.sessions()} == tree
        clock.advance(91 * DAY)  # the grandchild's activity is old enough now too
        assert await rt.prune(older_than=90 * DAY) == [top]
        assert await rt.sessions() == []
        assert await rt.verify_audit() == []


async def test_a_subagents_session_touched_after_the_listing_keeps_its_tree(
    store_url: str,
) -> None:
    """Listed when the whole tree was old, a person talks to the subagent before the deletion:
    its check, in the deletion's transaction, reads every session of the tree, not only the
    top's, and the tree stays, nothing written for it."""
    clock = ManualClock()
    async with so.Runtime(_desk(), store=store_url, clock=clock) as rt:
        parent, child = await _helped(rt)
        clock.advance(DAY)
        listing = rt.store.stale_sessions  # type: ignore[attr-defined]

        async def then_touched(**kw: Any) -> list[tuple[str, Any]]:
            found: list[tuple[str, Any]] = await listing(**kw)
            await rt.generate(session_id=child, prompt="and order 4?", auth=ALICE)
            return found

        rt.store.stale_sessions = then_touched  # type: ignore[attr-defined]
        assert await rt.prune(older_than=60) == []
        assert {s.id for s in await rt.sessions()} == {parent, child}
        assert await rt.audit(stream=DELETIONS_STREAM) == []
        cutoff = rt.now() - 60
        assert await listing(before=cutoff, now=rt.now(), limit=10) == []
        store_delete = rt.store.delete_session  # type: ignore[attr-defined]
        assert await store_delete(parent, now=rt.now(), before=cutoff) == []


async def test_live_sessions_are_skipped_and_the_prune_goes_on(store_url: str) -> None:
    clock = ManualClock()
    async with so.Runtime(agents(), store=store_url, clock=clock) as rt:
        leased, done = await _finished(rt, clock, 2)
        parent, child = await waiting_child(rt)  # its child waits: parent and child are live
        waiting = (await rt.generate("chat", prompt="refund it", auth=ALICE)).session_id
        r = await rt.generate("chat", prompt="refund it", auth=ALICE)
        answer = {"request_id": r.pending[0].id, "option_id": "approve"}
        await rt.respond(r.session_id, [answer], principal=ALICE, resume=False)  # work to do
        clock.advance(DAY)
        token = await rt.store.acquire_lease(leased, "elsewhere", 3 * DAY, rt.now())
        assert token is not None
        assert await rt.prune(older_than=60) == [done]
        left = {s.id for s in await rt.sessions()}
        assert left == {leased, parent, child, waiting, r.session_id}
        await rt.store.release_lease(leased, "elsewhere", token)
        assert await rt.prune(older_than=60) == [leased]
        assert await rt.verify_audit() == []
        assert len(await rt.audit(stream=DELETIONS_STREAM)) == 2


async def test_a_session_touched_after_the_listing_is_skipped(store_url: str) -> None:
    """The deletion checks the last activity the listing saw, in its transaction: a session a
    new turn touched in between stays (it is no longer old), nothing written for it."""
    clock = ManualClock()
    async with so.Runtime(agents(), store=store_url, clock=clock) as rt:
        touched, old = await _finished(rt, clock, 2)
        clock.advance(DAY)
        listing = rt.store.stale_sessions  # type: ignore[attr-defined]

        async def then_touched(**kw: Any) -> list[tuple[str, Any]]:
            found: list[tuple[str, Any]] = await listing(**kw)
            await rt.generate(session_id=touched, prompt="still here", auth=ALICE)
            return found

        rt.store.stale_sessions = then_touched  # type: ignore[attr-defined]
        assert await rt.prune(older_than=60) == [old]
        assert [s.id for s in await rt.sessions()] == [touched]
        [entry] = await rt.audit(stream=DELETIONS_STREAM)
        assert entry.data["session_id"] == old
        assert await rt.verify_audit() == []


async def test_a_session_whose_ttl_passed_is_pruned(store_url: str) -> None:
    """Waiting on people when its TTL passed: it can never go on. Recorded expired, deleted."""
    clock = ManualClock()
    limited = chat_with_ttl()
    async with so.Runtime([limited], store=store_url, clock=clock) as rt:
        r = await rt.generate("chat", prompt="refund it", auth=ALICE)
        assert r.status == "waiting"
        clock.advance(30)
        assert await rt.prune(older_than=10) == []  # old enough, but still live
        clock.advance(DAY)
        assert await rt.prune(older_than=3600) == [r.session_id]
        assert await rt.sessions() == []
        assert await rt.verify_audit() == []


async def test_a_session_whose_ttl_passed_but_cannot_be_read_is_logged_and_the_others_go(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The oldest of three sessions whose TTL passed while they waited has a damaged event:
    its expiry, recorded before it is deleted, cannot be read. Every prune raised that
    StoreError, so none of them was deleted, at every run. It is logged naming the session,
    told in the prune's answer (`damaged`) and left, the others deleted; a forced deletion
    takes it."""
    clock = ManualClock()
    async with so.Runtime([chat_with_ttl()], store=store_url, clock=clock) as rt:
        ids = []
        for _ in range(3):
            r = await rt.generate("chat", prompt="refund it", auth=ALICE)
            assert r.status == "waiting"
            ids.append(r.session_id)
            clock.advance(1)
    edit(
        store_url,
        "UPDATE {t}events SET data = {p} WHERE seq = 2 AND sk = "
        "(SELECT sk FROM {t}sessions WHERE id = {p})",
        b"\x01not deflate",
        ids[0],
    )
    clock.advance(DAY)
    async with so.Runtime([chat_with_ttl()], store=store_url, clock=clock) as rt:  # no cache
        with caplog.at_level("WARNING", logger="signoff.runtime"):
            # Skipped, it takes no place in the batch: the next oldest is deleted instead.
            assert await rt.prune(older_than=3600, limit=1) == [ids[1]]
            deleted, listed, more, damaged = await rt._prune(
                older_than=3600, by=OPS, reason=None, limit=1000, agent=None
            )
        assert (deleted, listed, more) == ([ids[2]], [ids[0], ids[2]], False)
        assert list(damaged) == [ids[0]] and "event 2" in damaged[ids[0]]
        lines = [r.getMessage() for r in caplog.records if r.name == "signoff.runtime"]
        assert len(lines) == 2 and all(f"session {ids[0]}: not pruned" in ln for ln in lines)
        assert [s.id for s in await rt.sessions()] == [ids[0]]
        with pytest.raises(so.StoreError, match="event 2"):
            await rt.delete_session(ids[0])  # unforced, it still says what is wrong
        assert await rt.delete_session(ids[0], force=True) == [ids[0]]
        assert await rt.prune(older_than=3600) == []


@pytest.mark.parametrize(
    ("column", "value", "key"),
    [("head", 2.5, "events"), ("audit_n", "x", "audit_n"), ("audit_hash", "x", "audit_hash")],
)
async def test_a_session_whose_row_is_damaged_is_skipped_and_deleted_with_force(
    tmp_path: Any, caplog: pytest.LogCaptureFixture, column: str, value: object, key: str
) -> None:
    """SQLite keeps text in a number's column: the oldest finished session's chain head (or
    last event) hand-edited so. Every prune raised its `StoreDamaged`, deleting none, and so
    did a forced deletion. It is skipped, logged and told (`damaged`), the others deleted;
    forced, it goes, its entry saying what the row held, and the trail verifies, exported
    too. (PostgreSQL's typed columns hold no such value.)"""
    url = f"sqlite:///{tmp_path / 's.db'}"
    clock = ManualClock()
    async with so.Runtime(agents(), store=url, clock=clock) as rt:
        r = await rt.generate("chat", prompt="refund it", auth=ALICE)
        await rt.cancel(r.session_id, principal=ALICE)  # finished, with audit entries
        clock.advance(1)
        ids = [r.session_id, *await _finished(rt, clock, 2)]
    edit(url, f"UPDATE sessions SET {column} = ? WHERE id = ?", value, ids[0])
    async with so.Runtime(agents(), store=url, clock=clock) as rt:
        with caplog.at_level("WARNING", logger="signoff.runtime"):
            assert await rt.prune(older_than=0, limit=1) == [ids[1]]
            deleted, listed, more, damaged = await rt._prune(
                older_than=0, by=OPS, reason=None, limit=1000, agent=None
            )
        assert (deleted, listed, more) == ([ids[2]], [ids[0], ids[2]], False)
        assert list(damaged) == [ids[0]] and f"its {column} is" in damaged[ids[0]]
        lines = [r.getMessage() for r in caplog.records if r.name == "signoff.runtime"]
        assert len(lines) == 2 and all(f"session {ids[0]}: not pruned" in ln for ln in lines)
        with pytest.raises(so.StoreDamaged, match=f"its {column} is"):
            await rt.delete_session(ids[0])  # unforced, it says what is wrong
        assert await rt.delete_session(ids[0], by=OPS, force=True) == [ids[0]]
        entry = (await rt.audit(stream=DELETIONS_STREAM))[-1]
        [gone] = entry.data["sessions"]
        assert entry.data["force"] is True and gone["id"] == ids[0]
        assert gone[key] is None and gone["damaged"] == {key: repr(value)}
        assert gone["audit_n" if key != "audit_n" else "events"] > 0
        assert await rt.sessions() == []
        assert await rt.verify_audit() == []
        out = io.StringIO()
        await rt.export_audit(out)
        out.seek(0)
        assert so.verify_audit_export(out) == []


async def test_prune_of_one_agent_leaves_the_others(store_url: str) -> None:
    clock = ManualClock()
    async with so.Runtime(agents(), store=store_url, clock=clock) as rt:
        [mine] = await _finished(rt, clock)
        parent, _ = await waiting_child(rt)
        await rt.cancel(parent, principal=ALICE)
        clock.advance(DAY)
        assert await rt.prune(older_than=60, agent="support") == [parent]
        assert await rt.prune(older_than=60, agent="nobody") == []
        # a NUL names no agent: PostgreSQL raised StoreError (its text cannot hold one)
        assert await rt.prune(older_than=60, agent="support\x00") == []
        assert [s.id for s in await rt.sessions()] == [mine]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"older_than": -1}, "older_than must be"),
        ({"older_than": math.nan}, "older_than must be"),
        ({"older_than": math.inf}, "older_than must be"),
        ({"older_than": "90d"}, "older_than must be"),
        ({"older_than": True}, "older_than must be"),
        ({"older_than": 60, "limit": 0}, "limit must be a whole number from 1"),
        ({"older_than": 60, "limit": 1.5}, "limit must be a whole number from 1"),
        ({"older_than": 60, "limit": True}, "limit must be a whole number from 1"),
        ({"older_than": 60, "agent": 5}, "agent must be text"),
        ({"older_than": 60, "reason": 5}, "reason must be a string"),
        ({"older_than": 60, "by": "ops"}, "by"),
        ({"older_than": 60, "by": so.Principal(authenticator="t", principal_id=" ")}, "by"),
    ],
)
async def test_bad_arguments_are_usage_errors_and_delete_nothing(
    tmp_path: Any, kwargs: dict[str, Any], message: str
) -> None:
    async with so.Runtime(agents(), store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        sid = (await rt.generate("chat", prompt="hi", auth=ALICE)).session_id
        with pytest.raises(so.UsageError, match=message):
            await rt.prune(**kwargs)
        assert [s.id for s in await rt.sessions()] == [sid]


async def test_a_prune_by_a_principal_holding_a_lone_surrogate_records_it_escaped(
    store_url: str,
) -> None:
    """Each of its deletions' entries holds `by` as `delete_session`'s does, escaped: a prune by
    one was refused (`UsageError`), and before that stopped at its first deletion."""
    clock = ManualClock()
    async with so.Runtime(agents(), store=store_url, clock=clock) as rt:
        sids = [(await rt.generate("chat", prompt="hi", auth=ODD)).session_id for _ in range(2)]
        clock.advance(DAY)
        assert sorted(await rt.prune(older_than=60, by=ODD)) == sorted(sids)
        entries = await rt.audit(stream=DELETIONS_STREAM)
        assert [e.data["by"] for e in entries] == [ODD_RECORDED] * 2
        assert await rt.verify_audit() == []


def test_the_sync_twin_prunes(tmp_path: Any) -> None:
    clock = ManualClock()
    with so.Runtime(agents(), store=f"sqlite:///{tmp_path / 's.db'}", clock=clock) as rt:
        sid = rt.generate_sync("chat", prompt="hi", auth=ALICE).session_id
        clock.advance(DAY)
        assert rt.prune_sync(older_than=3600, by=OPS) == [sid]
        assert rt.sessions_sync() == []


async def test_a_prune_syncs_its_deletions_to_disk_once_before_it_returns(
    store_url: str,
) -> None:
    """SQLite committed every deletion with `synchronous=NORMAL`: one its caller was told of
    could be undone by a power loss (PostgreSQL waited for each flush). `delete_session` now
    syncs its own; a prune commits its deletions without waiting for the disk and syncs them
    together (`flush`) before it returns, so a batch costs no more than before."""
    clock = ManualClock()
    async with so.Runtime(agents(), store=store_url, clock=clock) as rt:
        ids = await _finished(rt, clock, 4)
        clock.advance(DAY)
        calls: list[str] = []
        delete, flush = rt.store.delete_session, rt.store.flush  # type: ignore[attr-defined]

        async def deleting(*args: Any, **kwargs: Any) -> list[str]:
            calls.append("durable" if kwargs.get("durable", True) else "not durable")
            return list(await delete(*args, **kwargs))

        async def flushing() -> None:
            calls.append("flush")
            await flush()

        rt.store.delete_session = deleting  # type: ignore[attr-defined]
        rt.store.flush = flushing  # type: ignore[attr-defined]
        assert await rt.prune(older_than=60, limit=3) == ids[:3]
        assert calls == ["not durable"] * 3 + ["flush"]
        calls.clear()
        assert await rt.prune(older_than=10 * DAY) == []  # nothing deleted: nothing to sync
        assert calls == []
        assert await rt.delete_session(ids[3]) == [ids[3]]
        assert calls == ["durable"]
        assert await rt.verify_audit() == []


async def test_a_prune_failing_midway_raises_its_first_error_not_the_syncs(
    store_url: str,
) -> None:
    """A store failing on the third deletion, and on the sync of the two before it: the prune
    raised the sync's error, which hid why it stopped. It raises the deletion's, with the sync's
    failure noted on it; the two deleted stay deleted."""
    clock = ManualClock()
    async with so.Runtime(agents(), store=store_url, clock=clock) as rt:
        ids = await _finished(rt, clock, 3)
        clock.advance(DAY)
        delete = rt.store.delete_session  # type: ignore[attr-defined]

        async def deleting(session_id: str, *args: Any, **kwargs: Any) -> list[str]:
            if session_id == ids[2]:
                raise so.StoreError("the disk is full")
            return list(await delete(session_id, *args, **kwargs))

        async def flushing() -> None:
            raise so.StoreError("the sync failed")

        rt.store.delete_session = deleting  # type: ignore[attr-defined]
        rt.store.flush = flushing  # type: ignore[attr-defined]
        with pytest.raises(so.StoreError, match="the disk is full") as raised:
            await rt.prune(older_than=60)
        assert raised.value.__notes__ == [
            "the 2 deletion(s) before it may not be on disk: "
            "syncing them failed too (StoreError: the sync failed)"
        ]
        assert [s.id for s in await rt.sessions()] == [ids[2]]


async def test_a_sqlite_flush_syncs_the_write_ahead_log(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `flush` does on SQLite: an fsync of the `-wal` file, as a `synchronous=FULL`
    commit ends with; a durable deletion leaves the connection at `synchronous=NORMAL` again."""
    import os

    path = tmp_path / "s.db"
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    async with so.Runtime(agents(), store=f"sqlite:///{path}") as rt:
        sid = (await rt.generate("chat", prompt="hi", auth=ALICE)).session_id
        monkeypatch.setattr(os, "fsync", fsync)
        await rt.store.flush()  # type: ignore[attr-defined]
        assert synced == [f"{path}-wal"]
        assert await rt.delete_session(sid) == [sid]
        conn = rt.store.conn  # type: ignore[attr-defined]
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL


@pytest.mark.parametrize("opened_by", ["a symlink", "a relative path, then a chdir"])
async def test_a_sqlite_prune_syncs_the_wal_beside_the_file_it_opened(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, opened_by: str
) -> None:
    """`flush` synced the store's path plus "-wal": through a symlink (SQLite keeps the -wal
    beside the file it names) or by a relative path after a chdir no such file was there, which
    it took for no WAL, so prune returned with its deletions not on disk."""
    import os

    data = tmp_path / "data"
    data.mkdir()
    real = data / "s.db"
    if opened_by == "a symlink":
        (tmp_path / "link.db").symlink_to(real)
        url = f"sqlite:///{tmp_path / 'link.db'}"
    else:
        monkeypatch.chdir(data)
        url = "sqlite:///s.db"
    synced: list[str] = []
    fsync = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        fsync(fd)

    clock = ManualClock()
    async with so.Runtime(agents(), store=url, clock=clock) as rt:
        ids = await _finished(rt, clock, 2)
        clock.advance(DAY)
        monkeypatch.chdir(tmp_path)
        monkeypatch.setattr(os, "fsync", spy)
        assert await rt.prune(older_than=3600) == ids
        assert os.path.getsize(f"{real}-wal") > 0  # the deletions are in the WAL
        assert synced == [f"{real}-wal"]
