"""`LiveSession` on a parent session whose requests mirror a subagent's: the votes, escalation
and deadline of the subagent's request show on the mirror, as every other surface shows them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

import signoff as so
from signoff._live_session import LiveSession
from signoff._payloads import RemoteResult

from ._delegation import refund_desk
from .test_server_common import ALICE, BOB

CAROL = so.Principal(authenticator="token", principal_id="carol", attributes={"tenant": "acme"})


class Over:
    """A runtime as a `SessionRemote`, answering as `principal`."""

    def __init__(self, rt: so.Runtime, principal: so.Principal) -> None:
        self.rt = rt
        self.principal = principal

    async def events(
        self,
        session_id: str,
        after: int = 0,
        *,
        follow: bool = True,
        retries: int = 5,
        shown: so.Event | None = None,
    ) -> AsyncGenerator[so.Event, None]:
        async for event in self.rt.events(session_id, after, follow=follow, shown=shown):
            yield event

    async def respond(
        self, session_id: str, responses: Sequence[so.InputResponse | Mapping[str, Any]]
    ) -> RemoteResult:
        result = await self.rt.respond(session_id, responses, principal=self.principal)
        return RemoteResult(
            session_id=result.session_id,
            status=result.status,
            turn_id=result.turn_id,
            text=result.text,
            pending=result.pending,
            outcomes=result.outcomes,
        )


async def test_a_vote_counted_in_the_subagents_session_shows_on_the_mirror(
    store_url: str,
) -> None:
    """Carol approved the subagent's request itself, Bob through the parent's mirror: both votes
    were recorded in the child session, whose stream a `LiveSession` on the parent never read,
    so its mirror read "0 of 3" while `pending()` said "2 of 3"."""
    ran: list[str] = []
    async with so.Runtime(refund_desk(so.always(approvers=3), ran), store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 9", auth=ALICE)
        (mirror,) = r.pending
        assert mirror.child is not None
        live = LiveSession(Over(rt, BOB), r.session_id)
        await live.sync()
        (shown,) = live.open_requests()
        assert (shown.id, shown.progress) == (mirror.id, "0 of 3")
        child = mirror.child
        approve = so.InputResponse(request_id=child.request_id, option_id="approve")
        await rt.respond(child.session_id, [approve], principal=CAROL)
        await live.sync()
        (shown,) = live.open_requests()
        (queued,) = await rt.pending(session_id=r.session_id)
        assert (shown.approved_by, shown.progress) == (["carol"], "1 of 3")
        assert (shown.approved_by, shown.progress) == (queued.approved_by, queued.progress)
        voted = await live.respond([{"request_id": mirror.id, "option_id": "approve"}])
        assert [o.outcome for o in voted.outcomes] == ["counted"]
        await live.sync()
        (shown,) = live.open_requests()
        assert (shown.approved_by, shown.progress) == (["carol", "bob"], "2 of 3")
        live.client = Over(rt, ALICE)
        done = await live.respond([{"request_id": mirror.id, "option_id": "approve"}])
        assert done.status == "completed" and ran == ["9"]
        await live.sync()
        assert live.open_requests() == []
        assert live.requests[mirror.id].status == "settled"


async def test_a_followed_live_session_shows_the_subagents_vote_on_each_store(
    store_url: str,
) -> None:
    """End to end: following the parent, the vote Carol gives on the subagent's request comes
    as the child session's event, and the mirror shows it."""
    ran: list[str] = []
    async with so.Runtime(refund_desk(so.always(approvers=3), ran), store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 9", auth=ALICE)
        (mirror,) = r.pending
        assert mirror.child is not None
        child = mirror.child
        live = LiveSession(Over(rt, BOB), r.session_id)
        approve = so.InputResponse(request_id=child.request_id, option_id="approve")

        async def watch() -> so.Event:
            async with contextlib.aclosing(live.follow()) as events:
                async for event in events:
                    if event.session_id == r.session_id and event.type == "input.requested":
                        await rt.respond(child.session_id, [approve], principal=CAROL)
                    elif event.type == "approval.candidate" and event.data["outcome"] == "counted":
                        return event
            raise AssertionError("the stream ended")

        vote = await asyncio.wait_for(watch(), 10)
        assert vote.session_id == child.session_id
        (shown,) = live.open_requests()
        assert (shown.id, shown.approved_by, shown.progress) == (mirror.id, ["carol"], "1 of 3")


def _request(session_id: str, rid: str, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "tool-approval",
        "id": rid,
        "session_id": session_id,
        "turn_id": "t1",
        "agent": "support" if session_id == "p" else "billing",
        "action": {"call_id": "k1", "tool_name": "refund", "input": {}, "input_hash": "h"},
        "created_at": 1.0,
        **extra,
    }


def _event(session_id: str, seq: int, kind: Any, data: dict[str, Any]) -> so.Event:
    return so.Event(session_id=session_id, seq=seq, type=kind, at=1.0, turn_id="t1", data=data)


class Streams:
    """Sessions' logs as a `SessionRemote`: a followed stream stays open for what is appended,
    and `open` counts the streams being read."""

    def __init__(self, logs: dict[str, list[so.Event]]) -> None:
        self.logs = logs
        self.grown = asyncio.Condition()
        self.open: dict[str, int] = {}

    async def append(self, event: so.Event) -> None:
        async with self.grown:
            self.logs[event.session_id].append(event)
            self.grown.notify_all()

    async def events(
        self,
        session_id: str,
        after: int = 0,
        *,
        follow: bool = True,
        retries: int = 5,
        shown: so.Event | None = None,
    ) -> AsyncGenerator[so.Event, None]:
        self.open[session_id] = self.open.get(session_id, 0) + 1
        try:
            while True:
                for event in list(self.logs[session_id]):
                    if event.seq > after:
                        after = event.seq
                        yield event
                if not follow:
                    return
                async with self.grown:
                    while self.logs[session_id][-1].seq <= after:
                        await self.grown.wait()
        finally:
            self.open[session_id] -= 1

    async def respond(
        self, session_id: str, responses: Sequence[so.InputResponse | Mapping[str, Any]]
    ) -> RemoteResult:
        raise AssertionError("not called")


def _desk() -> Streams:
    """`p` asks `m1`, a mirror of the subagent session `c`'s two-person approval `r1`."""
    ref = {"session_id": "c", "request_id": "r1", "agent": "billing", "call_id": "k0"}
    mirror = _request("p", "m1", source="child", child=ref, approvers=2)
    child = _request("c", "r1", approvers=2, expires_at=50.0)
    return Streams(
        {
            "p": [_event("p", 1, "input.requested", {"requests": [mirror]})],
            "c": [_event("c", 1, "input.requested", {"requests": [child]})],
        }
    )


async def test_a_followed_live_session_shows_a_vote_in_the_subagents_session_as_it_comes() -> None:
    """`follow()` read the parent's stream alone: a vote counted in the subagent's session
    never reached the mirror, nor woke the person watching it."""
    remote = _desk()
    live = LiveSession(remote, "p", clock=lambda: 1.0)
    counted = {"request_id": "r1", "outcome": "counted", "by": {"principal_id": "carol"}}

    async def watch() -> list[so.Event]:
        seen: list[so.Event] = []
        async with contextlib.aclosing(live.follow()) as events:
            async for event in events:
                seen.append(event)
                if event.session_id == "p":
                    await remote.append(_event("c", 2, "approval.candidate", counted))
                elif event.type == "approval.candidate":
                    return seen
        raise AssertionError("the stream ended")

    seen = await asyncio.wait_for(watch(), 5)
    assert [(e.session_id, e.seq) for e in seen][-1] == ("c", 2)
    (shown,) = live.open_requests()
    assert (shown.id, shown.approved_by, shown.progress, shown.expires_at) == (
        "m1",
        ["carol"],
        "1 of 2",
        50.0,
    )
    assert remote.open == {"p": 0, "c": 0}  # both streams closed with `follow()`


async def test_a_closed_mirror_stops_following_its_subagents_session() -> None:
    """Once the mirror closes, its subagent's session is no longer read (a stream held for
    nothing), and the closed mirror shows no deadline of the request it stood for."""
    remote = _desk()
    live = LiveSession(remote, "p")
    resolved = {"request_id": "m1", "status": "settled", "outcome": "approved"}
    counted = {"request_id": "r1", "outcome": "counted", "by": {"principal_id": "carol"}}

    async def watch() -> None:
        async with contextlib.aclosing(live.follow()) as events:
            async for event in events:
                if event.session_id == "c":
                    assert remote.open == {"p": 1, "c": 1}
                    await remote.append(_event("p", 2, "input.resolved", resolved))
                elif event.seq == 1:
                    await remote.append(_event("c", 2, "approval.candidate", counted))
                elif event.seq == 2:
                    assert remote.open == {"p": 1, "c": 0}
                    return

    await asyncio.wait_for(watch(), 5)
    assert live.requests["m1"].status == "settled"
    await live.sync()
    assert remote.open == {"p": 0, "c": 0}


async def test_a_mirror_shown_closed_by_its_subagents_ttl_shows_open_once_it_went_on() -> None:
    """The subagent's session looked past its TTL as far as read, so its mirror showed closed;
    the subagent's session was then no longer read, and the mirror stayed closed though a
    later event (a vote) had kept that session alive."""
    remote = _desk()
    created = so.Event(
        session_id="c", seq=1, type="session.created", at=1.0, data={"agent": "billing", "ttl": 30}
    )
    asked = _event("c", 2, "input.requested", remote.logs["c"][0].data)
    remote.logs["c"] = [created, asked]
    live = LiveSession(remote, "p", clock=lambda: 40.0)  # its deadline: 50
    await live.sync()
    assert live.open_requests() == [] and live.requests["m1"].status == "expired"
    counted = {"request_id": "r1", "outcome": "counted", "by": {"principal_id": "carol"}}
    voted = so.Event(session_id="c", seq=3, type="approval.candidate", at=35.0, data=counted)
    await remote.append(voted)
    await live.sync()
    (shown,) = live.open_requests()
    assert (shown.id, shown.approved_by) == ("m1", ["carol"])


async def test_an_answer_to_a_mirror_shown_closed_by_its_subagents_ttl_reads_again_first() -> None:
    """A mirror shown closed only by its subagent's TTL, as far as read, was refused locally:
    the subagent's session had gone on since, and the server would have taken the answer."""
    remote = _desk()
    created = so.Event(
        session_id="c", seq=1, type="session.created", at=1.0, data={"agent": "billing", "ttl": 30}
    )
    asked = _event("c", 2, "input.requested", remote.logs["c"][0].data)
    remote.logs["c"] = [created, asked]
    live = LiveSession(remote, "p", clock=lambda: 40.0)  # its deadline: 50
    await live.sync()
    assert live.requests["m1"].status == "expired"
    counted = {"request_id": "r1", "outcome": "counted", "by": {"principal_id": "carol"}}
    await remote.append(
        so.Event(session_id="c", seq=3, type="approval.candidate", at=35.0, data=counted)
    )
    sent: list[str] = []

    async def respond(
        session_id: str, responses: Sequence[so.InputResponse | Mapping[str, Any]]
    ) -> RemoteResult:
        sent.extend(r.request_id for r in responses if isinstance(r, so.InputResponse))
        return RemoteResult(
            session_id=session_id, status="waiting", turn_id="t1", text="", pending=[], outcomes=[]
        )

    remote.respond = respond  # type: ignore[method-assign]
    await live.respond([{"request_id": "m1", "option_id": "approve"}])
    assert sent == ["m1"]


async def test_a_live_session_over_http_shows_the_subagents_vote(store_url: str) -> None:
    """Through the server: the caller may read the subagent's session (it was started for
    theirs), so `AsyncClient.session()` shows the vote counted there on the mirror."""
    import httpx

    from signoff.server import AsyncClient, TokenAuth, create_app

    from .test_server_common import TOKENS

    ran: list[str] = []
    async with so.Runtime(refund_desk(so.always(approvers=3), ran), store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 9", auth=ALICE)
        (mirror,) = r.pending
        assert mirror.child is not None
        approve = so.InputResponse(request_id=mirror.child.request_id, option_id="approve")
        await rt.respond(mirror.child.session_id, [approve], principal=CAROL)
        transport = httpx.ASGITransport(app=create_app(rt, auth=TokenAuth(TOKENS)))
        async with AsyncClient("http://t", token="alice-token", transport=transport) as c:
            live = await c.session(r.session_id)
            (shown,) = live.open_requests()
            assert (shown.id, shown.approved_by, shown.progress) == (mirror.id, ["carol"], "1 of 3")


async def test_following_yields_only_the_subagents_events_that_change_a_mirror() -> None:
    """The subagent's own turn events came through `follow()` too: a caller waiting for
    `turn.completed`, as one follows a session, stopped at the subagent's turn's end."""
    remote = _desk()
    live = LiveSession(remote, "p", clock=lambda: 1.0)
    counted = {"request_id": "r1", "outcome": "counted", "by": {"principal_id": "carol"}}

    async def watch() -> list[tuple[str, int]]:
        seen: list[tuple[str, int]] = []
        async with contextlib.aclosing(live.follow()) as events:
            async for event in events:
                seen.append((event.session_id, event.seq))
                if event.session_id == "p":
                    await remote.append(_event("c", 2, "turn.completed", {"text": "asked"}))
                    await remote.append(_event("c", 3, "approval.candidate", counted))
                elif event.seq == 3:
                    return seen
        raise AssertionError("the stream ended")

    seen = await asyncio.wait_for(watch(), 5)
    assert ("c", 2) not in seen and seen[-1] == ("c", 3)


class _Read(Streams):
    """`Streams` that tells how far each followed stream was read (`taken`), and whose `slow`
    subagents' followed streams bring nothing after their first event until `released` (their
    poll has not come round yet), while a read not followed brings all; `gone` are deleted."""

    def __init__(self, logs: dict[str, list[so.Event]]) -> None:
        super().__init__(logs)
        self.taken: dict[str, int] = {}
        self.read = asyncio.Condition()
        self.released = asyncio.Event()
        self.released.set()
        self.gone: set[str] = set()
        self.slow = {"c"}

    async def events(
        self,
        session_id: str,
        after: int = 0,
        *,
        follow: bool = True,
        retries: int = 5,
        shown: so.Event | None = None,
    ) -> AsyncGenerator[so.Event, None]:
        if session_id in self.gone:
            raise so.UnknownSession(session_id)
        async for event in super().events(session_id, after, follow=follow, shown=shown):
            if follow and session_id in self.slow and event.seq > 1:
                await self.released.wait()
            yield event
            if follow:  # asked for the next one: this one was taken
                async with self.read:
                    self.taken[session_id] = event.seq
                    self.read.notify_all()

    async def past(self, session_id: str, seq: int) -> None:
        async with self.read:
            await self.read.wait_for(lambda: self.taken.get(session_id, 0) >= seq)


async def test_a_subagents_vote_read_but_not_yielded_when_following_stops_comes_next_time() -> None:
    """The subagent's stream was folded as read, ahead of what `follow()` had yielded: Bob's
    vote, read while the caller held Carol's, was lost once the caller stopped following (the
    next `follow()` read on after it), though the session's own events were not."""
    remote = _Read(_desk().logs)
    live = LiveSession(remote, "p", clock=lambda: 1.0)
    carol = {"request_id": "r1", "outcome": "counted", "by": {"principal_id": "carol"}}
    bob = {"request_id": "r1", "outcome": "counted", "by": {"principal_id": "bob"}}
    events = live.follow()
    try:
        first = await asyncio.wait_for(anext(events), 5)
        assert (first.session_id, first.seq) == ("p", 1)
        await remote.append(_event("c", 2, "approval.candidate", carol))
        await remote.append(_event("c", 3, "approval.candidate", bob))
        voted = await asyncio.wait_for(anext(events), 5)
        assert (voted.session_id, voted.seq) == ("c", 2)
        await asyncio.wait_for(remote.past("c", 3), 5)  # Bob's vote read, not yet yielded
    finally:
        await events.aclose()
    assert live.children["c"].seq == 2
    async with contextlib.aclosing(live.follow()) as again:
        voted = await asyncio.wait_for(anext(again), 5)
    assert (voted.session_id, voted.seq, voted.data["by"]) == ("c", 3, {"principal_id": "bob"})
    (shown,) = live.open_requests()
    assert shown.approved_by == ["carol", "bob"]
    assert remote.open == {"p": 0, "c": 0}


async def test_a_mirror_closing_yields_its_subagents_close_first() -> None:
    """The parent's stream brought the mirror's close before the subagent's stream brought its
    request's: that stream was stopped at once, and the subagent's `input.resolved`, which
    `follow()` says it yields, never came. It now comes (read then), before the mirror's."""
    remote = _Read(_desk().logs)
    live = LiveSession(remote, "p", clock=lambda: 1.0)
    closed = {"request_id": "r1", "status": "settled", "outcome": "approved"}
    mirrored = {"request_id": "m1", "status": "settled", "outcome": "approved"}

    async def watch() -> list[tuple[str, int, str]]:
        seen: list[tuple[str, int, str]] = []
        async with contextlib.aclosing(live.follow()) as events:
            async for event in events:
                seen.append((event.session_id, event.seq, event.type))
                if event.session_id == "p" and event.seq == 1:
                    remote.released.clear()  # the subagent's poll has not come round yet
                    await remote.append(_event("c", 2, "input.resolved", closed))
                    await remote.append(_event("p", 2, "input.resolved", mirrored))
                elif event.session_id == "p":
                    assert remote.open == {"p": 1, "c": 0}
                    return seen
        raise AssertionError("the stream ended")

    seen = await asyncio.wait_for(watch(), 5)
    assert seen == [
        ("p", 1, "input.requested"),
        ("c", 2, "input.resolved"),
        ("p", 2, "input.resolved"),
    ]
    assert live.children["c"].requests["r1"].status == "settled"
    assert live.requests["m1"].status == "settled"


async def test_a_mirror_whose_subagent_is_gone_closes_without_its_close() -> None:
    """A subagent's session deleted before its request's close was read: the mirror's close
    is yielded all the same, its stream stopped, not waited on."""
    remote = _Read(_desk().logs)
    live = LiveSession(remote, "p", clock=lambda: 1.0)
    mirrored = {"request_id": "m1", "status": "settled", "outcome": "approved"}

    async def watch() -> list[tuple[str, int]]:
        seen: list[tuple[str, int]] = []
        async with contextlib.aclosing(live.follow()) as events:
            async for event in events:
                seen.append((event.session_id, event.seq))
                if event.seq == 1:
                    remote.released.clear()
                    remote.gone.add("c")
                    await remote.append(_event("p", 2, "input.resolved", mirrored))
                else:
                    assert remote.open.get("c", 0) == 0
                    return seen
        raise AssertionError("the stream ended")

    assert await asyncio.wait_for(watch(), 5) == [("p", 1), ("p", 2)]
    assert live.requests["m1"].status == "settled"


async def test_a_mirror_of_a_mirror_closes_after_the_requests_below_it() -> None:
    """`p`'s mirror stands for `c`'s, a mirror of `g`'s request: their closes come deepest
    first, each subagent's session read up to it, and both subagents' streams stop."""
    ref = {"session_id": "g", "request_id": "q1", "agent": "billing", "call_id": "k0"}
    remote = _Read(_desk().logs)
    remote.logs["c"] = [
        _event("c", 1, "input.requested", {"requests": [_request("c", "r1", child=ref)]})
    ]
    remote.logs["g"] = [_event("g", 1, "input.requested", {"requests": [_request("g", "q1")]})]
    remote.slow = {"c", "g"}
    live = LiveSession(remote, "p", clock=lambda: 1.0)
    closes = [("g", "q1"), ("c", "r1"), ("p", "m1")]
    closed = {"status": "settled", "outcome": "approved"}

    async def watch() -> list[tuple[str, int]]:
        seen: list[tuple[str, int]] = []
        async with contextlib.aclosing(live.follow()) as events:
            async for event in events:
                seen.append((event.session_id, event.seq))
                if event.session_id != "p":
                    continue
                if event.seq == 2:
                    assert remote.open == {"p": 1, "c": 0, "g": 0}
                    return seen
                remote.released.clear()
                for session_id, request_id in closes:
                    data = {"request_id": request_id, **closed}
                    await remote.append(_event(session_id, 2, "input.resolved", data))
        raise AssertionError("the stream ended")

    assert await asyncio.wait_for(watch(), 5) == [("p", 1), ("g", 2), ("c", 2), ("p", 2)]
    assert live.children["c"].children["g"].requests["q1"].status == "settled"


async def test_a_synced_view_follows_its_mirrors_subagents_two_levels_down_at_once() -> None:
    """A view read first (`sync()`, as `AsyncClient.session()` returns it), then followed, read
    its mirror's subagent's stream but that subagent's own mirror's subagent's only once the
    subagent's stream brought an event: a vote in the grandchild's session never came."""
    ref = {"session_id": "g", "request_id": "q1", "agent": "billing", "call_id": "k0"}
    remote = _desk()
    remote.logs["c"] = [
        _event(
            "c", 1, "input.requested", {"requests": [_request("c", "r1", child=ref, approvers=2)]}
        )
    ]
    remote.logs["g"] = [
        _event("g", 1, "input.requested", {"requests": [_request("g", "q1", approvers=2)]})
    ]
    live = LiveSession(remote, "p", clock=lambda: 1.0)
    await live.sync()
    counted = {"request_id": "q1", "outcome": "counted", "by": {"principal_id": "carol"}}
    await remote.append(_event("g", 2, "approval.candidate", counted))

    async def watch() -> tuple[str, int, str]:
        async with contextlib.aclosing(live.follow()) as events:
            async for event in events:
                return event.session_id, event.seq, event.type
        raise AssertionError("the stream ended")

    assert await asyncio.wait_for(watch(), 5) == ("g", 2, "approval.candidate")
    (shown,) = live.open_requests()  # the vote two levels down shows on the mirror
    assert (shown.id, shown.approved_by, shown.progress) == ("m1", ["carol"], "1 of 2")


class _SlowClose(Streams):
    """`Streams` whose followed stream of `c` closes only once `closed` is set (an HTTP
    stream's close taking a while)."""

    def __init__(self, logs: dict[str, list[so.Event]]) -> None:
        super().__init__(logs)
        self.closed = asyncio.Event()

    async def events(
        self,
        session_id: str,
        after: int = 0,
        *,
        follow: bool = True,
        retries: int = 5,
        shown: so.Event | None = None,
    ) -> AsyncGenerator[so.Event, None]:
        try:
            async for event in super().events(session_id, after, follow=follow, shown=shown):
                yield event
        finally:
            if session_id == "c" and follow:
                await self.closed.wait()


async def test_a_mirrors_close_a_timeout_cut_short_comes_with_the_next_follow() -> None:
    """The mirror's close was folded, then its subagent's stream stopped before it was
    yielded: a caller's timeout then (`asyncio.wait_for(anext(...))`) left it folded but
    never yielded, and the next `follow()` read on after it."""
    remote = _SlowClose(_desk().logs)
    live = LiveSession(remote, "p", clock=lambda: 1.0)
    closed = {"request_id": "r1", "status": "settled", "outcome": "approved"}
    mirrored = {"request_id": "m1", "status": "settled", "outcome": "approved"}
    events = live.follow()
    try:
        first = await asyncio.wait_for(anext(events), 5)
        assert (first.session_id, first.seq) == ("p", 1)
        await remote.append(_event("c", 2, "input.resolved", closed))
        below = await asyncio.wait_for(anext(events), 5)
        assert (below.session_id, below.seq) == ("c", 2)
        await remote.append(_event("p", 2, "input.resolved", mirrored))
        with contextlib.suppress(TimeoutError):  # `c`'s stream stopping, not yet closed
            await asyncio.wait_for(anext(events), 0.2)
    finally:
        remote.closed.set()
        await events.aclose()
    assert live.requests["m1"].status == "settled"  # folded
    await remote.append(_event("p", 3, "turn.completed", {"text": "done"}))
    async with contextlib.aclosing(live.follow()) as again:
        seen = [await asyncio.wait_for(anext(again), 5) for _ in range(2)]
    assert [(e.session_id, e.seq) for e in seen] == [("p", 2), ("p", 3)]
    assert remote.open == {"p": 0, "c": 0}
