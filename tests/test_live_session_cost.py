"""What following a session costs the client: an event shows anew only the requests it touched,
not every request read so far, unless a deadline or the TTL passed since."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

import pytest

import signoff as so
from signoff._live_session import LiveSession
from signoff._payloads import RemoteResult
from signoff.testing import ManualClock


def _request(rid: str, expires_at: float | None = None) -> dict[str, Any]:
    return {
        "kind": "question",
        "id": rid,
        "session_id": "s1",
        "turn_id": "t1",
        "agent": "support",
        "question": "which order?",
        "allow_text": True,
        "created_at": 1.0,
        "expires_at": expires_at,
    }


def _event(seq: int, kind: Any, data: dict[str, Any], at: float = 1.0) -> so.Event:
    return so.Event(session_id="s1", seq=seq, type=kind, at=at, turn_id="t1", data=data)


class Remote:
    def __init__(self, log: list[so.Event]) -> None:
        self.log = log

    async def events(
        self,
        session_id: str,
        after: int = 0,
        *,
        follow: bool = True,
        retries: int = 5,
        shown: so.Event | None = None,
    ) -> AsyncGenerator[so.Event, None]:
        for event in list(self.log):
            if event.seq > after:
                yield event

    async def respond(
        self, session_id: str, responses: Sequence[so.InputResponse | Mapping[str, Any]]
    ) -> RemoteResult:
        raise AssertionError("not answered here")


async def test_following_shows_anew_only_what_each_event_touched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """200 open requests, then 100 events that touch none and one that closes one: each
    request was shown anew at most once or twice, not at each of the 101 events."""
    asked = {"requests": [_request(f"r{i}", expires_at=10_000.0) for i in range(200)]}
    log = [_event(1, "session.created", {"ttl": 3600}), _event(2, "input.requested", asked)]
    log += [_event(seq, "turn.started", {}, at=float(seq)) for seq in range(3, 103)]
    closed = {"request_id": "r7", "status": "settled", "outcome": "answered"}
    log.append(_event(103, "input.resolved", closed, at=103.0))
    live = LiveSession(Remote(log), "s1", clock=ManualClock(50.0))
    shown = 0
    original = LiveSession._shown

    def counted(self: LiveSession, *args: Any) -> Any:
        nonlocal shown
        shown += 1
        return original(self, *args)

    monkeypatch.setattr(LiveSession, "_shown", counted)
    followed = [event.seq async for event in live.follow()]
    assert followed == list(range(1, 104))
    assert shown <= 2 * 200 + 10  # it was 200 at each event: over 20,000
    assert live.requests["r7"].status == "settled" and len(live.open_requests()) == 199


async def test_an_event_after_a_deadline_or_the_ttl_passed_shows_every_request_anew() -> None:
    """What passed since the last event (a deadline; the TTL, and an event that lifts it again)
    shows in `requests` at the next event, as it did when each event showed every request."""
    clock = ManualClock(10.0)
    asked = {"requests": [_request("due", expires_at=50.0), _request("open")]}
    live = LiveSession(Remote([]), "s1", clock=clock)
    live.apply(_event(1, "session.created", {"ttl": 100}, at=5.0))
    live.apply(_event(2, "input.requested", asked, at=5.0))
    assert live.requests["due"].status == live.requests["open"].status == "pending"
    clock.advance(45.0)  # 55: past the deadline
    live.apply(_event(3, "turn.started", {}, at=55.0))
    assert live.requests["due"].status == "expired"
    assert live.requests["open"].status == "pending"
    clock.advance(200.0)  # 255: past the TTL (from the last event, at 55)
    live.apply(_event(4, "turn.started", {}, at=55.0))
    assert live.requests["open"].status == "expired"
    live.apply(_event(5, "turn.started", {}, at=250.0))  # the session went on: not lapsed
    assert live.requests["open"].status == "pending"
