"""What the runtime reads and writes in the store: following events, the message window, listing
pages and filters, and the lease given back with the last commit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.stores import SQLiteStore
from signoff.testing import (
    Capture,
    ExecutionLog,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
)

from .test_runtime import refund_agent, tools, waiting_session


async def test_events_follow_live(tmp_path: Path) -> None:
    import asyncio

    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log), poll_interval=0.01) as rt:
        r = await waiting_session(rt)
        head = (await rt.state(r.session_id)).seq
        seen: list[so.Event] = []

        async def follow() -> None:
            async for event in rt.events(r.session_id, after=head - 1):
                seen.append(event)
                if event.type == "session.waiting":
                    return

        task = asyncio.create_task(follow())
        async with asyncio.timeout(10):  # its first read, however busy the machine
            while not seen:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # a few polls (0.01 s): nothing more comes meanwhile
        assert [e.type for e in seen] == ["turn.waiting"]
        await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=r.pending[0].id, approved=True)]
        )
        await asyncio.wait_for(task, timeout=5)
        assert [e.seq for e in seen] == list(range(head, head + len(seen)))
        assert seen[-1].type == "session.waiting"


@pytest.mark.parametrize("after", [-1, 2**63, None, float("nan"), "3", True, 1.5])
async def test_events_refuse_a_start_that_is_not_a_seq(tmp_path: Path, after: Any) -> None:
    """A bad `after` was a bare OverflowError from SQLite (2**63), or matched nothing, so a
    followed stream (None, NaN, "3") waited for ever without a word."""
    import asyncio

    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log)) as rt:
        r = await waiting_session(rt)
        for follow in (False, True):
            with pytest.raises(so.UsageError, match="after"):
                async with asyncio.timeout(5):
                    async for _ in rt.events(r.session_id, after, follow=follow):
                        pass


class CountingStore(SQLiteStore):
    """Counts the events read, to show what loading a conversation costs."""

    read = 0

    async def read_events(self, *args: Any, **kwargs: Any) -> list[so.Event]:
        events = await super().read_events(*args, **kwargs)
        self.read += len(events)
        return events


@pytest.mark.parametrize("long_turn", [False, True])
async def test_a_new_runtime_reads_only_the_window_and_sends_the_same_messages(
    tmp_path: Path, long_turn: bool
) -> None:
    """With `max_messages`, a runtime that did not run the session reads the newest message
    events, not the whole history, and the model sees exactly what a warm runtime shows it."""
    turns = 60
    lookups = [call_tools(call("lookup_order", order_id=str(i))) for i in range(12)]
    script: list[Any] = [reply(f"answer {i}") for i in range(turns)]
    script += [
        *(lookups if long_turn else lookups[:1]),
        call_tools(call("issue_refund", order_id="2", amount=5)),
    ]
    warm_seen, cold_seen = Capture(reply("refunded")), Capture(reply("refunded"))
    log = ExecutionLog()
    url = f"sqlite:///{tmp_path / 'state.db'}"

    def agent(seen: Capture) -> so.Agent:
        return scripted_agent(
            "a", [*script, seen], tools=tools(log), limits=so.Limits(max_messages=6)
        )

    async def park(rt: so.Runtime) -> tuple[str, str]:
        sid = (await rt.generate("a", prompt="turn 0")).session_id
        for i in range(1, turns):
            await rt.generate(session_id=sid, prompt=f"turn {i}")
        r = await rt.generate(session_id=sid, prompt="refund order 2")
        assert r.status == "waiting"
        return sid, r.pending[0].id

    async with so.Runtime([agent(warm_seen)], store=url) as rt:
        sid, rid = await park(rt)
        done = await rt.generate(session_id=sid, approvals=[so.Decision(id=rid, approved=True)])
        assert done.text == "refunded"
    url2 = f"sqlite:///{tmp_path / 'cold.db'}"
    async with so.Runtime([agent(Capture(reply("unused")))], store=url2) as rt:
        sid, rid = await park(rt)
    store = CountingStore(url2)
    async with so.Runtime([agent(cold_seen)], store=store) as cold:
        done = await cold.generate(session_id=sid, approvals=[so.Decision(id=rid, approved=True)])
        assert done.text == "refunded"
        # loaded in part, so not offered as the conversation; in full when the turn is long
        messages = (await cold.state(sid)).messages
        assert (messages is not None) == long_turn
    assert cold_seen.last == warm_seen.last
    assert so.UserMessage(text="refund order 2") in cold_seen.last
    assert len(cold_seen.last) == (27 if long_turn else 6)  # the whole turn, or the window
    history = turns * 2 + (28 if long_turn else 6)
    if long_turn:  # the turn is longer than the tail read: everything is read, as before
        assert store.read > history
    else:
        assert store.read < 40 < history


class ReleaseCountingStore(SQLiteStore):
    """Counts the separate lease releases (a drive's last commit can release it instead)."""

    releases = 0

    async def release_lease(self, session_id: str, owner: str, token: int) -> None:
        self.releases += 1
        await super().release_lease(session_id, owner, token)


async def test_the_commit_that_parks_or_ends_a_turn_gives_the_lease_back(tmp_path: Path) -> None:
    log = ExecutionLog()
    store = ReleaseCountingStore(f"sqlite:///{tmp_path / 'state.db'}")
    async with so.Runtime([refund_agent(log)], store=store) as rt:
        parked = await rt.generate("a", prompt="refund order 1")
        assert parked.status == "waiting"
        # free at once: another owner takes it without waiting for the lease to expire
        token = await store.acquire_lease(parked.session_id, "someone", 30, rt.clock())
        assert token is not None
        await store.release_lease(parked.session_id, "someone", token)
        store.releases = 0
        done = await rt.generate(
            session_id=parked.session_id,
            approvals=[so.Decision(id=parked.pending[0].id, approved=True)],
        )
        assert done.status == "completed"
        assert store.releases == 0  # the completing commit released it
        assert await store.acquire_lease(parked.session_id, "someone", 30, rt.clock()) is not None


@pytest.mark.parametrize(
    "page",
    [{"limit": -1}, {"offset": -3}, {"limit": "5"}, {"limit": 2**64}, {"offset": 1.5}],
    ids=["limit-negative", "offset-negative", "limit-str", "limit-huge", "offset-float"],
)
async def test_listing_pages_are_checked(tmp_path: Path, page: dict[str, Any]) -> None:
    # SQLite reads LIMIT -1 as "no limit" and PostgreSQL refuses it with its own error: the
    # runtime refuses a bad page the same way for both, as a usage error.
    async with sqlite_runtime(tmp_path, refund_agent(ExecutionLog())) as rt:
        await waiting_session(rt)
        with pytest.raises(so.UsageError):
            await rt.pending(**page)
        with pytest.raises(so.UsageError):
            await rt.sessions(**page)


@pytest.mark.parametrize(
    ("listing", "message"),
    [
        (lambda rt: rt.sessions_sync(status="wait"), "status must be one of idle, running"),
        (lambda rt: rt.pending_sync(kind="approval"), "kind must be one of tool-approval"),
        (lambda rt: rt.pending_sync(older_than=float("nan")), "older_than must be seconds"),
        (lambda rt: rt.pending_sync(older_than=-5), "older_than must be seconds"),
        (lambda rt: rt.pending_sync(older_than=10**400), "older_than must be seconds"),
        # limit=0 lists nothing, as for sessions and pending (tests/test_audit_trail.py)
        (lambda rt: rt.audit_sync(limit=-1), "limit must be a whole number from 0"),
        (lambda rt: rt.audit_sync(limit="5"), "limit must be a whole number from 0"),
    ],
)
def test_a_listing_refuses_a_filter_that_can_match_nothing(
    tmp_path: Path, listing: Any, message: str
) -> None:
    """A misspelt status or kind, or a NaN age, listed nothing, as if the queue were empty (the
    CLI refused them; Python did not), and `audit(limit=-1)` returned an entry."""
    agent = scripted_agent("a", [call_tools(call_of_refund()), reply("done")], tools=[refund()])
    rt = so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db")
    try:
        assert rt.generate_sync("a", prompt="go").status == "waiting"
        with pytest.raises(so.UsageError, match=message):
            listing(rt)
        assert len(rt.pending_sync(kind="tool-approval", older_than=0)) == 1
        assert [s.status for s in rt.sessions_sync(status="waiting")] == ["waiting"]
        assert len(rt.audit_sync(limit=1)) == 1
    finally:
        rt.close_sync()


def call_of_refund() -> so.ToolCall:
    return call("refund", amount=5)


def refund() -> so.Tool:
    @so.tool(approval=so.always())
    async def refund(amount: int) -> int:
        """Refund."""
        return amount

    return refund


async def test_a_pending_filter_that_is_not_one_is_a_usage_error(tmp_path: Path) -> None:
    """`rt.pending(filter)` takes a `PendingFilter`: anything else raised a bare AttributeError."""
    async with sqlite_runtime(tmp_path, scripted_agent("a", [reply("hi")])) as rt:
        for bad in ("tool-approval", {"agent": "a"}):
            with pytest.raises(so.UsageError, match="PendingFilter"):
                await rt.pending(bad)  # type: ignore[arg-type]
            with pytest.raises(so.UsageError, match="PendingFilter"):
                await rt.pending_page(bad)  # type: ignore[arg-type]


async def test_a_pending_filter_of_a_kind_or_status_no_request_has_is_a_usage_error(
    tmp_path: Path,
) -> None:
    """`rt.pending(kind="approval")` is refused, but the same filter given whole matched no
    request: an empty queue, as if none were open, beside one waiting. Both are refused now."""
    async with sqlite_runtime(tmp_path, refund_agent(ExecutionLog())) as rt:
        await waiting_session(rt)
        for given, named in (
            ({"kind": "approval"}, r"PendingFilter\(kind=...\) must be one of tool-approval, "),
            ({"status": "open"}, r"PendingFilter\(status=...\) must be one of pending, settled"),
        ):
            flt = so.stores.PendingFilter(**given)  # type: ignore[arg-type]
            with pytest.raises(so.UsageError, match=named):
                await rt.pending(flt)
            with pytest.raises(so.UsageError, match=named):
                await rt.pending_page(flt)
        assert len(await rt.pending(so.stores.PendingFilter(kind="tool-approval"))) == 1


async def test_a_listing_filter_holding_a_lone_surrogate_is_a_usage_error_on_both_stores(
    store_url: str,
) -> None:
    """A filter value no store can look up (text holding a lone surrogate) raised a bare
    UnicodeEncodeError from the driver; it is refused by name, as `audit(stream=...)` was."""
    async with so.Runtime([refund_agent(ExecutionLog())], store=store_url) as rt:
        await waiting_session(rt)
        odd = "a\ud800"
        for listing, what in (
            (lambda: rt.pending(agent=odd), "agent"),
            (lambda: rt.pending(tool_name=odd), "tool_name"),
            (lambda: rt.pending(session_id=f"ses_{odd}"), "session_id"),
            (lambda: rt.pending_page(so.stores.PendingFilter(agent=odd)), "agent"),
            (lambda: rt.sessions(agent=odd), "agent"),
        ):
            with pytest.raises(so.UsageError, match=f"{what}.*lone surrogate"):
                await listing()
        assert len(await rt.pending(agent="a")) == 1


async def test_pending_refuses_keywords_beside_a_filter(tmp_path: Path) -> None:
    """`rt.pending(flt, agent=..., limit=...)` read only `flt`: the keywords were dropped
    unsaid, so the listing held another agent's requests, or more than the limit asked."""
    async with sqlite_runtime(tmp_path, refund_agent(ExecutionLog())) as rt:
        await waiting_session(rt)
        flt = so.stores.PendingFilter()
        for given in ({"agent": "b"}, {"limit": 0}, {"offset": 1}, {"older_than": 60}):
            with pytest.raises(so.UsageError, match="PendingFilter"):
                await rt.pending(flt, **given)
        assert len(await rt.pending(flt)) == 1
        assert await rt.pending(agent="b") == []


async def test_the_state_a_caller_reads_is_its_own(tmp_path: Path) -> None:
    """`rt.state()` handed out the runtime's cached state: the runtime's later calls changed it
    under its reader (waiting, then idle), and a reader's edits changed what the runtime decided
    next (here a gated call marked approved ran, no one having approved it, and an edit of its
    input would have run with it). It is a copy, with the conversation, the calls' journals and
    the event data they hold, which neither the runtime nor its reader changes for the other."""
    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log)) as rt:
        r = await waiting_session(rt)
        sid, [request] = r.session_id, r.pending
        state = await rt.state(sid)
        kept = (await rt.state(sid)).to_snapshot(journals=True)  # another copy: not edited below
        messages = list(state.messages or [])
        assert state.turn is not None and messages
        [gated] = state.turn.calls.values()
        gated.status, gated.request_id = "approved", None  # edits of its own copy
        gated.input["amount"] = 500
        state.requests.clear()
        state.approved_tools.add("issue_refund")
        again = await rt.generate(session_id=sid)
        assert again.status == "waiting" and log.count("issue_refund") == 0
        assert (await rt.state(sid)).to_snapshot(journals=True) == kept
        answer = so.Decision(id=request.id, approved=True)
        assert (await rt.generate(session_id=sid, approvals=[answer])).status == "completed"
        assert [e.input["amount"] for e in log.of("issue_refund")] == [5]
        assert state.seq == kept["seq"] and state.turn.status == "waiting"
        assert state.messages == messages  # the runtime's later folds left it as it was
        assert await rt.state(sid) is not await rt.state(sid)


async def test_the_error_of_a_result_is_the_callers_own(tmp_path: Path) -> None:
    """A failed turn's result carried the cached turn's own error: an edit of it went into what
    the runtime showed next (and into the next snapshot it wrote)."""
    agent = scripted_agent("a", [ConnectionError("model unavailable")])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="hi")
        assert r.status == "failed" and r.error is not None
        shown = dict(r.error)
        r.error.clear()
        state = await rt.state(r.session_id)
        assert state.turn is not None and state.turn.error == shown
