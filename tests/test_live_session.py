"""`LiveSession` over any `SessionRemote`, here an in-memory one: no server and no `AsyncClient`,
which is what lets `_client` make one without an import cycle."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

import pytest

import signoff as so
from signoff._live_session import LiveSession, SessionRemote
from signoff._payloads import RemoteResult
from signoff._results import Outcome


def _asked(seq: int, *ids: str) -> so.Event:
    requests = [
        {
            "kind": "question",
            "id": rid,
            "session_id": "s1",
            "turn_id": "t1",
            "agent": "support",
            "question": "which order?",
            "allow_text": True,
            "created_at": 1.0,
        }
        for rid in ids
    ]
    return _event(seq, "input.requested", {"requests": requests})


def _event(seq: int, kind: Any, data: dict[str, Any]) -> so.Event:
    return so.Event(session_id="s1", seq=seq, type=kind, at=1.0, turn_id="t1", data=data)


class Remote:
    """The session's log, and the answers it was sent (refused with `refuse`, if set)."""

    def __init__(self, log: list[so.Event]) -> None:
        self.log = log
        self.sent: list[list[so.InputResponse]] = []
        self.refuse: so.SignoffError | None = None

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
        answers = [r for r in responses if isinstance(r, so.InputResponse)]
        self.sent.append(answers)
        if self.refuse is not None:
            raise self.refuse
        outcomes = [
            Outcome(request_id=a.request_id, outcome="answered", applied=True) for a in answers
        ]
        return RemoteResult(
            session_id=session_id,
            status="running",
            turn_id="t1",
            text="",
            pending=[],
            outcomes=outcomes,
        )


async def test_a_live_session_folds_and_answers_through_any_remote() -> None:
    remote = Remote([_asked(1, "r1", "r2")])
    typed: SessionRemote = remote
    live = LiveSession(typed, "s1")
    await live.sync()
    assert [r.id for r in live.open_requests()] == ["r1", "r2"]
    await live.respond([{"request_id": "r1", "text": "order 7"}])
    assert live.requests["r1"].status == "responded"
    assert [a.request_id for a in remote.sent[0]] == ["r1"]
    resolved = {"request_id": "r1", "status": "settled", "outcome": "answered"}
    remote.log.append(_event(2, "input.resolved", resolved))
    await live.sync()
    assert (live.seq, live.requests["r1"].status, live.requests["r1"].outcome) == (
        2,
        "settled",
        "answered",
    )
    with pytest.raises(so.RequestClosed, match="r1 is settled"):
        await live.respond([{"request_id": "r1", "text": "again"}])
    assert len(remote.sent) == 1  # refused locally: the remote was not called


async def test_an_answer_the_remote_refuses_leaves_the_request_open() -> None:
    remote = Remote([_asked(1, "r1")])
    live = LiveSession(remote, "s1")
    await live.sync()
    remote.refuse = so.StoreUnavailable("down")
    with pytest.raises(so.StoreUnavailable):
        await live.respond([{"request_id": "r1", "text": "order 7"}])
    assert live.requests["r1"].status == "pending"
    with pytest.raises(so.UnknownRequest):
        await live.respond([{"request_id": "r9", "text": "order 7"}])


async def test_a_vote_a_quorum_counted_leaves_the_request_open() -> None:
    """A two-person approval counts the first approve (`counted`, applied) and stays open on the
    server, where the voter may still deny it; the stream sends no `input.resolved` for a vote.
    The request was left `responded` for good: gone from `open_requests()`, and a deny was
    refused locally as if the request took no answers."""
    remote = Remote([_asked(1, "r1")])
    live = LiveSession(remote, "s1")
    await live.sync()
    counted = [Outcome(request_id="r1", outcome="counted", applied=True, reason="1 of 2")]
    remote.respond = _answering(remote, counted)  # type: ignore[method-assign]
    result = await live.respond([{"request_id": "r1", "option_id": "approve"}])
    assert [o.outcome for o in result.outcomes] == ["counted"]
    assert live.requests["r1"].status == "pending"
    assert [r.id for r in live.open_requests()] == ["r1"]
    await live.respond([{"request_id": "r1", "option_id": "cancel"}])  # reaches the server
    assert len(remote.sent) == 2


def _answering(remote: Remote, outcomes: list[Outcome]) -> Any:
    """`remote.respond` answering with `outcomes`."""

    async def respond(
        session_id: str, responses: Sequence[so.InputResponse | Mapping[str, Any]]
    ) -> RemoteResult:
        remote.sent.append([r for r in responses if isinstance(r, so.InputResponse)])
        return RemoteResult(
            session_id=session_id,
            status="waiting",
            turn_id="t1",
            text="",
            pending=[],
            outcomes=outcomes,
        )

    return respond


async def test_votes_and_escalations_show_in_the_requests_as_the_server_folds_them() -> None:
    """A quorum's counted vote and a deadline's escalation come as `approval.candidate` events,
    which the server's fold applies to the open request (`approved_by`, `escalated_to`, and no
    deadline once escalated). The live session ignored them: its requests read `0 of 2` after a
    vote, and kept a deadline the server had lifted, unlike `state()` and the queue."""
    asked = _asked(1, "r1", "r2")
    for raw in asked.data["requests"]:
        raw.update(approvers=2, expires_at=50.0, escalate_to="leads", on_timeout="escalate")
    vote = {"request_id": "r1", "candidate_id": "c1", "outcome": "pending", "by": {}}
    counted = {**vote, "outcome": "counted", "by": {"principal_id": "alice"}, "votes": 1}
    escalated = {"request_id": "r2", "outcome": "escalated", "to": "leads", "reason": "timed out"}
    remote = Remote(
        [
            asked,
            _event(2, "approval.candidate", vote),
            _event(3, "approval.candidate", counted),
            _event(4, "approval.candidate", escalated),
        ]
    )
    live = LiveSession(remote, "s1", clock=lambda: 1.0)  # when the events were recorded
    await live.sync()
    r1, r2 = live.open_requests()
    assert (r1.approved_by, r1.progress, r1.expires_at) == (["alice"], "1 of 2", 50.0)
    assert (r2.escalated_to, r2.expires_at, r2.approved_by) == ("leads", None, [])
    assert [v.status for v in live.requests.values()] == ["pending", "pending"]


async def test_a_live_session_shows_a_counted_vote_as_the_runtime_does(store_url: str) -> None:
    """End to end on each store: after bob's vote on a two-person approval, the live session's
    open request carries the vote the runtime's queue shows."""
    from signoff.testing import ExecutionLog

    from .test_quorum import ALICE, BOB, deploy_agent, vote

    class Over:
        """The runtime as a `SessionRemote`, answering as bob."""

        def __init__(self, rt: so.Runtime) -> None:
            self.rt = rt

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
            raise AssertionError("not called")

    agent = deploy_agent(ExecutionLog(), so.always(approvers=2, exclude_requester=True))
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("ops", prompt="deploy api 2.0", auth=ALICE)
        await rt.respond(r.session_id, vote(r.pending[0].id), principal=BOB)
        live = LiveSession(Over(rt), r.session_id)
        await live.sync()
        (queued,) = await rt.pending(session_id=r.session_id)
        (shown,) = live.open_requests()
        assert (shown.approved_by, shown.progress) == (queued.approved_by, queued.progress)
        assert shown.progress == "1 of 2"


@pytest.mark.parametrize(
    "kind, data",
    [
        ("input.requested", {"requests": [{"kind": "question", "id": "r2"}]}),
        ("input.requested", {"requests": 7}),
        ("input.resolved", {"request_id": ["r1"], "status": "settled"}),
        ("approval.candidate", {"request_id": "r1", "outcome": "counted", "by": "bob"}),
        ("session.created", {"agent": "support", "ttl": "soon"}),
        ("session.created", {"agent": "support", "ttl": 10**400}),
    ],
)
async def test_an_event_that_is_not_a_signoff_event_is_a_remote_error(
    kind: str, data: dict[str, Any]
) -> None:
    """A stream (a proxy's, a server of another version) whose event does not hold what its
    type says raised pydantic's `ValidationError`, a `TypeError` or an `AttributeError` from
    the fold, or later (a TTL that is no number); and the event counted as read. It is a
    `RemoteError` (`http_error`), as the client's other calls say it, and nothing is folded."""
    import httpx

    from signoff.server import AsyncClient

    asked = _asked(1, "r1")
    bad = _event(2, kind, data)

    def sse(e: so.Event) -> str:
        body = {"session_id": "s1", "seq": e.seq, "type": e.type, "at": 1.0, "data": e.data}
        return f"id: {e.seq}\nevent: {e.type}\ndata: {json.dumps(body)}\n\n"

    def serve(request: httpx.Request) -> httpx.Response:
        text = sse(asked) + sse(bad)
        return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})

    async with AsyncClient("http://signoff.test", transport=httpx.MockTransport(serve)) as c:
        live = LiveSession(c, "s1")
        with pytest.raises(so.RemoteError) as broken:
            await live.sync()
        assert broken.value.code == "http_error"
        assert live.seq == 1 and [r.id for r in live.open_requests()] == ["r1"]


async def test_what_a_failed_read_folded_shows() -> None:
    """The events read before one that is not a signoff event show in `requests` as folded."""
    resolved = {"request_id": "r1", "status": "settled", "outcome": "answered"}
    bad = _event(3, "input.requested", {"requests": 7})
    remote = Remote([_asked(1, "r1"), _event(2, "input.resolved", resolved), bad])
    live = LiveSession(remote, "s1", clock=lambda: 1.0)
    with pytest.raises(so.RemoteError):
        await live.sync()
    assert (live.seq, live.requests["r1"].status) == (2, "settled")


async def test_an_answer_to_a_request_asked_since_the_last_read_reads_it_first() -> None:
    """r1 answered elsewhere (another tab, the dashboard), the turn asks r2, open on the
    server; the view answering r2 before reading it raised `UnknownRequest` locally, the answer
    not sent. It reads the stream first, then sends it; an id still unknown once read fails
    here, nothing sent."""
    remote = Remote([_asked(1, "r1")])
    live = LiveSession(remote, "s1")
    await live.sync()
    resolved = {"request_id": "r1", "status": "settled", "outcome": "answered"}
    remote.log += [_event(2, "input.resolved", resolved), _asked(3, "r2")]
    await live.respond([{"request_id": "r2", "text": "order 8"}])
    assert [[a.request_id for a in sent] for sent in remote.sent] == [["r2"]]
    assert live.seq == 3
    assert (live.requests["r1"].status, live.requests["r2"].status) == ("settled", "responded")
    with pytest.raises(so.UnknownRequest):
        await live.respond([{"request_id": "r9", "text": "order 8"}])
    assert len(remote.sent) == 1  # still unknown once read: refused here


async def test_a_live_view_answers_a_request_asked_after_it_was_opened(store_url: str) -> None:
    """End to end on each store: the first approval answered through the client, the turn asks
    a second; the view opened before it answers it as the client does (it raised
    `UnknownRequest` without asking the server), and the turn completes."""
    import httpx

    from signoff.server import AsyncClient, TokenAuth, create_app
    from signoff.testing import ExecutionLog, call, call_tools, reply, scripted_agent

    from .test_server_common import TOKENS

    log = ExecutionLog()

    @log.tool(approval=so.always())
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    steps = [call_tools(call("refund", order_id=n)) for n in ("1", "2")] + [reply("done")]
    agent = scripted_agent("support", steps, tools=[refund])
    async with so.Runtime([agent], store=store_url) as rt:
        app = create_app(rt, auth=TokenAuth(TOKENS), sweep_every=None)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with AsyncClient("http://t", token="alice-token", transport=transport) as c:
                r = await c.generate("support", "refund both")
                live = await c.session(r.session_id)
                approve = {"request_id": r.pending[0].id, "option_id": "approve"}
                (second,) = (await c.respond(r.session_id, [approve])).pending
                done = await live.respond([{"request_id": second.id, "option_id": "approve"}])
                assert done.status == "completed"
                assert [o.outcome for o in done.outcomes] == ["approved"]
                assert live.requests[second.id].status == "responded"
                assert [e.input["order_id"] for e in log.of("refund")] == ["1", "2"]
