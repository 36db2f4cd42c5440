"""The runtime end to end on each store: a turn that waits and completes, resumed by another
runtime, raced by answers, across event loops.

Part of the one suite for the `Store` protocol (test_store_conformance.py and
test_store_{requests,leases,concurrency,runtime,edited_rows}.py): the `store` and `store_url`
fixtures in conftest.py run it against both backends.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.stores import Store
from signoff.testing import call, call_tools, reply, scripted_agent

from .conftest import make_store

# -- the runtime end to end, on each store ---------------------------------------------------


def refund_agent(runs: list[dict[str, Any]]) -> so.Agent:
    @so.tool(approval=lambda input: input.amount > 100)
    async def issue_refund(order_id: str, amount: float, reason: str) -> dict[str, Any]:
        """Refund an order."""
        runs.append({"order_id": order_id, "amount": amount})
        return {"refunded": amount}

    return scripted_agent(
        "support",
        [
            call_tools(call("issue_refund", order_id="1042", amount=180, reason="broken")),
            reply("Done."),
        ],
        tools=[issue_refund],
    )


@pytest.mark.parametrize("given", ["url", "instance"])
async def test_runtime_generate_wait_approve_complete(store_url: str, given: str) -> None:
    runs: list[dict[str, Any]] = []
    store: str | Store = store_url if given == "url" else make_store(store_url)
    rt = so.Runtime([refund_agent(runs)], store=store)
    try:
        r = await rt.generate("support", prompt="Refund order 1042")
        assert r.status == "waiting" and runs == []
        assert len(r.pending) == 1 and r.pending[0].tool_name == "issue_refund"
        queue = await rt.pending()
        assert [q.id for q in queue] == [r.pending[0].id]
        r = await rt.generate(
            session_id=r.session_id,
            approvals=[so.Decision(id=r.pending[0].id, approved=True, reason="ok")],
        )
        assert r.status == "completed" and r.text == "Done."
        assert runs == [{"order_id": "1042", "amount": 180.0}]
        assert await rt.pending() == []
        events = [e async for e in rt.events(r.session_id, after=0, follow=False)]
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        types = [e.type for e in events]
        assert types[0] == "session.created" and "approval.settled" in types
        assert types.index("approval.settled") < types.index("tool.completed")
        assert types[-1] == "session.waiting" or "turn.completed" in types
    finally:
        await rt.close()


async def test_runtime_resumes_from_another_runtime(store_url: str) -> None:
    runs: list[dict[str, Any]] = []
    first = so.Runtime([refund_agent(runs)], store=store_url)
    try:
        r = await first.generate("support", prompt="Refund order 1042")
        assert r.status == "waiting"
    finally:
        await first.close()
    second = so.Runtime([refund_agent(runs)], store=store_url)
    try:
        r2 = await second.respond(
            r.session_id, [so.InputResponse(request_id=r.pending[0].id, option_id="approve")]
        )
        assert r2.status == "completed" and len(runs) == 1
        again = await second.respond(
            r.session_id, [so.InputResponse(request_id=r.pending[0].id, option_id="approve")]
        )
        assert again.outcomes[0].applied is False and len(runs) == 1
    finally:
        await second.close()


def test_both_backends_implement_the_protocol(tmp_path: Path) -> None:
    assert isinstance(make_store(f"sqlite:///{tmp_path}/x.db"), Store)
    assert isinstance(make_store("postgresql://u@127.0.0.1:1/db"), Store)


async def test_runtimes_racing_to_answer_settle_once(store_url: str) -> None:
    runs: list[dict[str, Any]] = []
    first = so.Runtime([refund_agent(runs)], store=store_url)
    try:
        r = await first.generate("support", prompt="Refund order 1042")
        rid = r.pending[0].id
    finally:
        await first.close()
    racers = [so.Runtime([refund_agent(runs)], store=store_url) for _ in range(4)]
    try:
        answers = [so.InputResponse(request_id=rid, option_id="approve")]
        results = await asyncio.gather(
            *(rt.respond(r.session_id, answers) for rt in racers), return_exceptions=True
        )
        errors = [x for x in results if isinstance(x, BaseException)]
        assert not errors, errors
        applied = [
            o.applied for x in results if isinstance(x, so.GenerateResult) for o in x.outcomes
        ]
        assert applied.count(True) == 1 and applied.count(False) == 3
        assert runs == [{"order_id": "1042", "amount": 180.0}]
        events = [e async for e in racers[0].events(r.session_id, follow=False)]
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert [e.type for e in events].count("approval.settled") == 1
        assert [e.type for e in events].count("tool.completed") == 1
        state = await racers[1].state(r.session_id)
        assert state.turn is not None and state.turn.status == "completed"
    finally:
        for rt in racers:
            await rt.close()


def test_runtime_across_event_loops(store_url: str) -> None:
    """A script may call asyncio.run() once per step with one Runtime; and the sync twins."""
    runs: list[dict[str, Any]] = []
    rt = so.Runtime([refund_agent(runs)], store=store_url)
    r = asyncio.run(rt.generate("support", prompt="Refund order 1042"))
    assert r.status == "waiting"
    decision = so.Decision(id=r.pending[0].id, approved=True)
    r = asyncio.run(rt.generate(session_id=r.session_id, approvals=[decision]))
    assert r.status == "completed" and len(runs) == 1
    asyncio.run(rt.close())
    rt = so.Runtime([refund_agent(runs)], store=store_url)
    r = rt.generate_sync("support", prompt="Refund order 1043")
    assert rt.pending_sync()[0].id == r.pending[0].id
    r = rt.generate_sync(
        session_id=r.session_id, approvals=[decision.model_copy(update={"id": r.pending[0].id})]
    )
    assert r.status == "completed" and len(runs) == 2
    rt.close_sync()


async def test_a_read_that_is_not_followed_stops_at_the_head_it_read(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`events(follow=False)` reads the head, then the events up to it, and stops there: it read
    once more to find the log's end, a round trip for nothing on every such call. A read bounded
    by bytes still reads on to the head. It is a snapshot as of the call: events written while
    it yields are not among them."""
    from signoff import stores

    runs: list[dict[str, Any]] = []
    rt = so.Runtime([refund_agent(runs)], store=store_url)
    try:
        r = await rt.generate("support", prompt="Refund order 1042")
        sid = r.session_id
        head = await rt.store.head(sid)
        assert head is not None and head > 2
        calls: list[str] = []
        real_head, real_read = rt.store.head, rt.store.read_events

        async def counted_head(*args: Any, **kwargs: Any) -> int | None:
            calls.append("head")
            return await real_head(*args, **kwargs)

        async def counted_read(*args: Any, **kwargs: Any) -> list[so.Event]:
            calls.append("read")
            return await real_read(*args, **kwargs)

        monkeypatch.setattr(rt.store, "head", counted_head)
        monkeypatch.setattr(rt.store, "read_events", counted_read)

        async def seqs(after: int = 0) -> list[int]:
            calls.clear()
            return [e.seq async for e in rt.events(sid, after, follow=False)]

        assert await seqs() == list(range(1, head + 1)) and calls == ["head", "read"]
        assert await seqs(2) == list(range(3, head + 1)) and calls == ["head", "read"]
        assert await seqs(head) == [] and calls == ["head"]
        with monkeypatch.context() as m:
            m.setattr(stores, "READ_BYTES", 1)  # one event a read
            assert await seqs() == list(range(1, head + 1))
            assert calls == ["head"] + ["read"] * head

        stream = rt.events(sid, follow=False)
        first = await anext(stream)
        r = await rt.respond(
            sid, [so.InputResponse(request_id=r.pending[0].id, option_id="approve")]
        )
        assert r.status == "completed" and (await real_head(sid) or 0) > head
        assert [first.seq] + [e.seq async for e in stream] == list(range(1, head + 1))
    finally:
        await rt.close()
