"""A new conversation's session, first message and drive's lease are one store write, on each
store: no commit of its own starts the first turn and no lease is acquired apart, the row is
written with the turn's status and who started it, a crash right before that write leaves no
session and right after it a running one that is driven on once its lease lapses, and a keyed
call finds the session its first call made either way."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import signoff as so
from signoff._creation import first_events
from signoff._idempotency import keyed, session_for
from signoff.stores import open_store
from signoff.stores._base import AUDIT_RECORDED
from signoff.stores._initiators import InitiatorFilter
from signoff.testing import call, call_tools, reply, scripted_agent

from ._workers import is_, until, working

ALICE = so.Principal(authenticator="okta", principal_id="alice")


def parking_agent() -> so.Agent:
    @so.tool(approval=so.always())
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return f"refunded {order_id}"

    return scripted_agent(
        "support", [call_tools(call("refund", order_id="7")), reply("Done.")], tools=[refund]
    )


async def test_a_new_session_its_first_turn_and_its_lease_are_one_write(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with so.Runtime([parking_agent()], store=store_url) as rt:
        writes: list[str] = []
        rt.store.set_fault_hook(
            lambda when, label: (
                writes.append(label) if when == "before" and label != AUDIT_RECORDED else None
            )
        )
        acquired: list[str] = []
        acquire = rt.store.acquire_lease

        async def counted(session_id: str, *args: Any) -> int | None:
            acquired.append(session_id)
            return await acquire(session_id, *args)

        monkeypatch.setattr(rt.store, "acquire_lease", counted)
        r = await rt.generate("support", prompt="refund order 7", auth=ALICE)
        assert r.status == "waiting"
        assert writes[0] == "session.created" and "turn.started" not in writes
        assert acquired == []  # the drive's lease was taken with the session
        events = [e async for e in rt.events(r.session_id, follow=False)]
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert [e.type for e in events[:2]] == ["session.created", "turn.started"]
        assert events[1].turn_id == r.turn_id and events[1].at == events[0].at
        assert events[1].data["principal"] == ALICE.model_dump()
        mine = InitiatorFilter(principal=ALICE)
        assert [s.id for s in await rt.store.sessions(initiated_by=mine)] == [r.session_id]
        assert [s.status for s in await rt.sessions()] == ["waiting"]
        assert await rt.verify_audit() == []
        # The cached state the write left is the store's: a fresh runtime folds the same.
        async with so.Runtime([parking_agent()], store=store_url) as other:
            assert (await other.state(r.session_id)).to_snapshot() == (
                await rt.state(r.session_id)
            ).to_snapshot()


async def test_a_new_session_left_to_workers_is_stored_running_and_claimed(
    store_url: str,
) -> None:
    agent = scripted_agent("chat", [reply("hi there")])
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False) as worker,
    ):
        r = await front.schedule("chat", "nightly report")
        assert r.status == "running"
        (row,) = await front.sessions()
        assert (row.id, row.status, row.head) == (r.session_id, "running", 2)
        async with working(worker):
            await until(lambda: is_(front, r.session_id, "completed"))
        done = await front.generate(session_id=r.session_id)
        assert done.text == "hi there"
        started = [e async for e in front.events(r.session_id, follow=False)][1]
        assert (started.type, started.data["source"]) == ("turn.started", "schedule")


@pytest.mark.parametrize("when", ["before", "after"])
async def test_a_crash_at_the_first_write_leaves_no_session_or_a_leased_running_one(
    store_url: str, when: str
) -> None:
    """A process that dies right before the write leaves nothing; right after it, a session
    whose turn is started and runnable, under the dead drive's lease: no worker claims it
    until that lapses, as after a death anywhere in a drive; then it is driven to its end."""

    def crash(at: str, label: str) -> None:
        if (at, label) == (when, "session.created"):
            raise RuntimeError("killed")

    async with so.Runtime([scripted_agent("chat", [reply("hello")])], store=store_url) as rt:
        rt.store.set_fault_hook(crash)
        with pytest.raises(RuntimeError, match="killed"):
            await rt.generate("chat", prompt="hi", auth=ALICE)
        rt.store.set_fault_hook(None)
        left = await rt.sessions()
        now = rt.now()
        assert await rt.store.claim("w", 30.0, now, 10) == []
    if when == "before":
        assert left == []
        return
    (row,) = left
    assert (row.status, row.head) == ("running", 2)
    later = now + rt.lease_ttl + 1  # the dead drive's lease has lapsed
    async with so.Runtime(
        [scripted_agent("chat", [reply("hello")])], store=store_url, clock=lambda: later
    ) as rt:
        done = await rt.generate(session_id=row.id)
        assert (done.status, done.text) == ("completed", "hello")
        events = [e async for e in rt.events(row.id, follow=False)]
        assert [e.type for e in events].count("turn.started") == 1
        assert await rt.verify_audit() == []


async def test_a_keyed_session_an_older_signoff_left_without_its_turn_gets_it(
    store_url: str,
) -> None:
    """An older signoff created a keyed session, then started its turn in a second write; one
    that died between the two left the session alone. The call sent again starts the turn in it
    (not a replay of nothing), and once more replays that turn."""
    agent = scripted_agent("chat", [reply("ok")], repeat_last=True)
    idem = keyed("k-1", ALICE, "start", "chat", "hello")
    assert idem is not None
    sid = session_for(idem)
    events, _ = first_events(sid, agent, ALICE, idem, 1_000.0, None)
    store = open_store(store_url)
    await store.open()
    try:
        await store.create_session(sid, "chat", events, None)
    finally:
        await store.close()
    async with so.Runtime([agent], store=store_url) as rt:
        again: Any = await rt.generate("chat", prompt="hello", auth=ALICE, idempotency_key="k-1")
        assert (again.session_id, again.status, again.replayed) == (sid, "completed", False)
        once_more = await rt.generate("chat", prompt="hello", auth=ALICE, idempotency_key="k-1")
        assert once_more.replayed and once_more.turn_id == again.turn_id
        types = [e.type async for e in rt.events(sid, follow=False)]
        assert types.count("turn.started") == 1 and types[0] == "session.created"


async def test_a_call_cancelled_once_its_first_write_went_through_gives_the_lease_back(
    store_url: str,
) -> None:
    """A call stopped from outside (a caller's timeout, say) right after the write that made
    the session with its drive's lease: the lease is given back, as a drive stopped so gives its
    own, so the session is claimed at once, not left for the lease TTL to lapse."""

    def cancel(at: str, label: str) -> None:
        if (at, label) == ("after", "session.created"):
            raise asyncio.CancelledError

    async with so.Runtime([scripted_agent("chat", [reply("hello")])], store=store_url) as rt:
        rt.store.set_fault_hook(cancel)
        with pytest.raises(asyncio.CancelledError):
            await rt.generate("chat", prompt="hi", auth=ALICE)
        rt.store.set_fault_hook(None)
        (row,) = await rt.sessions()
        assert (row.status, row.head) == ("running", 2)
        claimed = await rt.store.claim("w", 30.0, rt.now(), 10)
        assert [sid for sid, _ in claimed] == [row.id]


@pytest.mark.parametrize("raised", [asyncio.CancelledError, so.StoreError])
async def test_a_keyed_call_stopped_as_it_looks_for_its_first_turn_gives_the_lease_back(
    store_url: str, raised: type[BaseException], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A keyed call reads the session its key made, for the turn to tell it, before its drive
    takes over the lease the creation granted: stopped or failed there, the lease was neither
    given back nor kept, so the session waited undriven for its TTL. It is given back."""
    async with so.Runtime([scripted_agent("chat", [reply("hello")])], store=store_url) as rt:
        real_head, armed = rt.store.head, list[bool]()
        real_start = rt._start_session

        async def head(*args: Any, **kwargs: Any) -> Any:
            if not armed:
                armed.append(True)
                raise raised("store gone") if raised is so.StoreError else raised()
            return await real_head(*args, **kwargs)

        async def start(*args: Any, **kwargs: Any) -> Any:
            made = await real_start(*args, **kwargs)
            monkeypatch.setattr(rt.store, "head", head)  # the first read after the creation
            return made

        monkeypatch.setattr(rt, "_start_session", start)
        with pytest.raises(raised):
            await rt.generate("chat", prompt="hi", auth=ALICE, idempotency_key="k-1")
        monkeypatch.setattr(rt.store, "head", real_head)
        (row,) = await rt.sessions()
        claimed = await rt.store.claim("w", 30.0, rt.now(), 10)
        assert armed and [sid for sid, _ in claimed] == [row.id]


async def test_a_keyed_call_whose_first_write_went_through_unreported_drives_its_turn(
    store_url: str,
) -> None:
    """The write that made a keyed session with its drive's lease went through, but the call was
    told it failed (a PostgreSQL COMMIT whose outcome could not be read back): the call finds the
    session its key made and drives its turn now, not after its own lease lapses."""
    failed: list[str] = []

    def unreported(at: str, label: str) -> None:
        if (at, label) == ("after", "session.created") and not failed:
            failed.append(label)
            raise so.StoreError("connection lost during COMMIT; the outcome is unknown")

    agent = scripted_agent("chat", [reply("hello")])
    async with so.Runtime([agent], store=store_url, lease_wait=0.2) as rt:
        rt.store.set_fault_hook(unreported)
        r = await rt.generate("chat", prompt="hi", auth=ALICE, idempotency_key="k-1")
        assert failed and (r.status, r.text) == ("completed", "hello")
        types = [e.type async for e in rt.events(r.session_id, follow=False)]
        assert types.count("turn.started") == 1
