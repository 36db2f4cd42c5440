"""`SessionRunner`: a prompt never starts a turn over one that still has work to do (answers
accepted but not resumed, or a turn a dead process left); it finishes that turn first, or is
refused while a live process runs it."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.stores.postgres import PostgresStore
from signoff.stores.sqlite import SQLiteStore
from signoff.testing import (
    Capture,
    ManualClock,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    store_contents,
    timeline,
    tool_results,
)


async def events(rt: so.Runtime, session_id: str) -> list[so.Event]:
    return [e async for e in rt.events(session_id, follow=False)]


def refund_agent(ran: list[int], after: Capture) -> so.Agent:
    @so.tool(approval=so.always())
    async def refund(amount: int) -> dict[str, int]:
        """Refund an amount."""
        ran.append(amount)
        return {"refunded": amount}

    return scripted_agent(
        "a",
        [call_tools(call("refund", amount=180)), after, reply("second turn")],
        tools=[refund],
    )


async def test_a_prompt_after_answers_accepted_without_resuming_runs_the_approved_call_first(
    tmp_path: Path,
) -> None:
    """`respond(resume=False)` leaves the turn waiting with its answers in: a new prompt must
    run the approved call (and let the model read its result) before its own turn starts."""
    ran: list[int] = []
    after = Capture(lambda conv: reply(f"result: {tool_results(conv)[-1].content}"))
    async with sqlite_runtime(tmp_path, refund_agent(ran, after)) as rt:
        parked = await rt.generate("a", prompt="refund it")
        [request] = parked.pending
        answered = await rt.respond(
            parked.session_id,
            [so.InputResponse(request_id=request.id, option_id="approve")],
            resume=False,
        )
        assert answered.pending == []
        assert ran == []
        done = await rt.generate(session_id=parked.session_id, prompt="and now?")
        assert done.status == "completed"
        assert done.text == "second turn"
        assert ran == [180]  # the approved call ran, once
        assert after.last[-1] == tool_results(after.last)[-1]  # the model read its result
        assert timeline(await events(rt, parked.session_id)).count("turn.started") == 2
        assert "tool.completed refund ok" in timeline(await events(rt, parked.session_id))


async def test_a_prompt_to_a_turn_a_dead_process_left_finishes_that_turn_first(
    tmp_path: Path,
) -> None:
    """A turn whose process died inside a tool (its lease lapsed) is resumed from the log,
    the call run again with the same key, before the prompt's own turn starts: no call is left
    without a result, which a model provider would refuse in every later turn."""
    clock = ManualClock()
    entered = asyncio.Event()
    hang = asyncio.Event()
    keys: list[str] = []

    @so.tool
    async def slow(ctx: so.ToolContext, x: int) -> int:
        """A call the first process never finishes."""
        keys.append(ctx.idempotency_key())
        if len(keys) == 1:
            entered.set()
            await hang.wait()
        return x

    def agent(after: Capture) -> so.Agent:
        return scripted_agent(
            "a", [call_tools(call("slow", x=7)), after, reply("second turn")], tools=[slow]
        )

    first = sqlite_runtime(tmp_path, agent(Capture(reply("first turn"))), clock=clock)
    sid = await first.create_session("a")
    stuck = asyncio.create_task(first.generate(session_id=sid, prompt="go"))
    await entered.wait()
    clock.advance(120)  # the first process is gone: its lease lapses
    after = Capture(lambda conv: reply(f"got {tool_results(conv)[-1].content}"))
    async with sqlite_runtime(tmp_path, agent(after), clock=clock) as rt:
        done = await rt.generate(session_id=sid, prompt="are you there?")
        assert done.status == "completed"
        assert done.text == "second turn"
        assert keys == [keys[0], keys[0]]  # run again, with the same idempotency key
        assert tool_results(after.last)[-1].content == 7
        lines = timeline(await events(rt, sid))
        assert lines.count("tool.started slow") == 1
        assert lines.count("tool.completed slow ok") == 1
        assert (
            lines.index("tool.completed slow ok")
            < [i for i, line in enumerate(lines) if line == "turn.started"][1]
        )
    hang.set()
    await stuck  # fenced: it writes nothing after losing its lease
    await first.close()


class _Held:
    """Tool `slow`, a call that runs while the prompt arrives: it sets `entered` once called,
    and returns only once `hang` is set."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.hang = asyncio.Event()

        @so.tool
        async def slow(x: int) -> int:
            """A call that runs while the prompt arrives."""
            self.entered.set()
            await self.hang.wait()
            return x

        self.tool = slow


async def test_a_prompt_while_another_process_runs_the_turn_is_refused(tmp_path: Path) -> None:
    held = _Held()
    entered, hang, slow = held.entered, held.hang, held.tool

    def agent() -> so.Agent:
        return scripted_agent("a", [call_tools(call("slow", x=1)), reply("done")], tools=[slow])

    first = sqlite_runtime(tmp_path, agent())
    sid = await first.create_session("a")
    running = asyncio.create_task(first.generate(session_id=sid, prompt="go"))
    await entered.wait()
    async with sqlite_runtime(tmp_path, agent()) as rt:
        before = await store_contents(rt.store, sid)
        with pytest.raises(so.SessionBusy) as caught:
            await rt.generate(session_id=sid, prompt="hurry up")
        assert caught.value.session_id == sid
        assert await store_contents(rt.store, sid) == before
    hang.set()
    assert (await running).status == "completed"
    await first.close()


async def test_a_prompt_while_this_runtime_runs_the_turn_is_refused_saying_so(
    tmp_path: Path,
) -> None:
    # The refusal said "in another process" of a turn this very runtime was running.
    held = _Held()
    entered, hang, slow = held.entered, held.hang, held.tool
    agent = scripted_agent("a", [call_tools(call("slow", x=1)), reply("done")], tools=[slow])
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid = await rt.create_session("a")
        running = asyncio.create_task(rt.generate(session_id=sid, prompt="go"))
        await entered.wait()
        before = await store_contents(rt.store, sid)
        with pytest.raises(so.SessionBusy) as caught:
            await rt.generate(session_id=sid, prompt="hurry up")
        assert "another process" not in str(caught.value)
        assert "send()" in str(caught.value)
        assert await store_contents(rt.store, sid) == before
        hang.set()
        assert (await running).status == "completed"


async def test_a_prompt_to_a_session_waiting_on_a_request_says_what_it_waits_on(
    tmp_path: Path,
) -> None:
    """It said "every pending request ... must be answered in one call; unanswered: req_..."
    to a caller who had answered nothing: it names what the session waits on and the two ways
    on (answer it, or `send` the message to answer or steer), the class and ids as before."""
    ran: list[int] = []
    async with sqlite_runtime(tmp_path, refund_agent(ran, Capture(reply("ok")))) as rt:
        waiting = await rt.generate("a", prompt="refund")
        sid, (req,) = waiting.session_id, waiting.pending
        before = await store_contents(rt.store, sid)
        for ask in (
            lambda: rt.generate(session_id=sid, prompt="and more"),
            lambda: rt.schedule("a", "and more", session_id=sid),
        ):
            with pytest.raises(so.PartialAnswer) as caught:
                await ask()
            assert caught.value.request_ids == [req.id]
            assert str(caught.value) == (
                f"session {sid!r} is waiting on {req.id}: a prompt starts no turn while a "
                "request is open; answer it (generate(approvals=...) or respond()), or send() "
                "the message, which answers or steers the waiting turn"
            )
        assert await store_contents(rt.store, sid) == before and ran == []


async def test_a_prompt_to_a_turn_workers_have_yet_to_run_is_refused(tmp_path: Path) -> None:
    """With `inline=False` a started turn waits for a worker: a second prompt must not start a
    turn over it (its message would be answered by nobody)."""
    kw: dict[str, Any] = {"inline": False}
    async with sqlite_runtime(tmp_path, scripted_agent("a", [reply("one")]), **kw) as rt:
        started = await rt.generate("a", prompt="first")
        assert started.status == "running"
        before = await store_contents(rt.store, started.session_id)
        with pytest.raises(so.SessionBusy):
            await rt.generate(session_id=started.session_id, prompt="second")
        assert await store_contents(rt.store, started.session_id) == before


async def test_text_over_the_input_limit_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    """A prompt, message, answer or reason of many megabytes through Python (HTTP bounds its
    bodies) is refused with a named error, as over `MAX_TEXT_BYTES`, and nothing is stored."""
    huge = "x" * (so.MAX_TEXT_BYTES + 1)

    @so.tool(approval=so.always())
    async def refund(order_id: str) -> str:
        """Refund."""
        return "ok"

    @so.tool
    async def confirm(ctx: so.ToolContext, x: int) -> str:
        """Confirm."""
        return (await ctx.ask("Why?")).value

    gated = scripted_agent(
        "a", [call_tools(call("refund", order_id="1")), reply("done")], tools=[refund]
    )
    asking = scripted_agent("b", [call_tools(call("confirm", x=1)), reply("done")], tools=[confirm])
    async with sqlite_runtime(tmp_path, gated, asking) as rt:
        with pytest.raises(so.TooLarge, match="over the limit"):
            await rt.generate("a", prompt=huge)
        assert await rt.sessions() == []
        for agent in ("a", "b"):
            r = await rt.generate(agent, prompt="go")
            sid, (request,) = r.session_id, r.pending
            before = await store_contents(rt.store, sid)
            with pytest.raises(so.TooLarge, match="over the limit"):
                await rt.generate(session_id=sid, prompt=huge)
            with pytest.raises(so.TooLarge, match="over the limit"):
                await rt.send(sid, huge)
            with pytest.raises(so.InvalidAnswer, match="over the limit"):
                if agent == "a":
                    decision = so.Decision(id=request.id, approved=False, reason=huge)
                    await rt.generate(session_id=sid, approvals=[decision])
                else:
                    await rt.respond(sid, [so.InputResponse(request_id=request.id, text=huge)])
            with pytest.raises(so.TooLarge, match="over the limit"):
                await rt.cancel(sid, reason=huge)
            assert await store_contents(rt.store, sid) == before


async def test_per_session_locks_and_abort_signals_are_dropped_once_unused(tmp_path: Path) -> None:
    """A long-running process drives, steers, cancels and reads many sessions: the lock and
    abort signal it keeps per session must not outlive their use, or memory grows for ever."""
    ran: list[int] = []
    async with sqlite_runtime(tmp_path, refund_agent(ran, Capture(reply("ok")))) as rt:

        async def serve(i: int) -> None:
            r = await rt.generate("a", prompt="refund")
            sid = r.session_id
            if i % 3 == 0:
                decision = so.Decision(id=r.pending[0].id, approved=True)
                await rt.generate(session_id=sid, approvals=[decision])
            elif i % 3 == 1:
                await rt.send(sid, "never mind")
            else:
                await rt.cancel(sid)
            await rt.state(sid)

        # Each in a task of its own, as a server serves requests: what a finished task handled
        # last is gone with it.
        for i in range(60):
            await asyncio.create_task(serve(i))
        gc.collect()
        assert len(ran) == 20
        assert (len(rt._locks), len(rt._aborts)) == (0, 0)


async def test_a_turn_that_parks_or_ends_returns_its_state_without_reading_the_store_again(
    store_url: str,
) -> None:
    """The commit that parks a turn (or ends it) gives the drive's lease back, and the drive's
    state is then the store's: the result is built from it, with no head check after."""
    ran: list[int] = []
    agent = refund_agent(ran, Capture(reply("done")))
    async with so.Runtime([agent], store=store_url) as rt:
        calls: list[str] = []
        for name in ("head", "read_events", "load", "commit", "acquire_lease"):
            method = getattr(rt.store, name)

            def counted(*args: Any, _name: str = name, _method: Any = method, **kw: Any) -> Any:
                calls.append(_name)
                return _method(*args, **kw)

            setattr(rt.store, name, counted)
        parked = await rt.generate("a", prompt="refund it")
        assert parked.status == "waiting"
        assert calls[-1] == "commit"  # the one that parked: nothing read after it
        assert [r.id for r in parked.pending] == [r.id for r in await rt.pending()]
        calls.clear()
        decision = so.Decision(id=parked.pending[0].id, approved=True)
        done = await rt.generate(session_id=parked.session_id, approvals=[decision])
        assert (done.status, done.text, ran) == ("completed", "done", [180])
        assert calls[-1] == "commit"
        stored = await events(rt, parked.session_id)
        state = await rt.state(parked.session_id)
        assert (state.turn_status, state.seq) == ("completed", stored[-1].seq)


REFUSED_SETTINGS: list[tuple[str, Any]] = [
    # A renewal gets about half the TTL to get through (every third of it, given up a tenth
    # before it lapses): at 1 ms a healthy store just a little slow loses every lease.
    ("lease_ttl", 0.001),
    ("lease_ttl", 0.0999),
    ("lease_ttl", 86_401),  # a dead worker's sessions would wait more than a day
    ("lease_ttl", True),
    ("poll_interval", True),
    ("poll_interval", 0),
    ("poll_interval", float("nan")),
    ("clock", 1_700_000_000.0),  # a time, not a function: the first call failed, store open
    ("inline", "no"),  # read as true: turns ran in process
    ("inline", 0),
    ("lease_wait", float("inf")),
    ("lease_wait", True),
    ("cache_size", 1.0),
]


async def test_a_runtime_refuses_settings_that_make_no_sense_and_the_store_is_unchanged(
    store_url: str,
) -> None:
    agent = scripted_agent("support", [reply("hi")])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("support", prompt="hello")
        before = await store_contents(rt.store, r.session_id)
        for name, value in REFUSED_SETTINGS:
            with pytest.raises(so.UsageError, match=f"^{name} must be "):
                so.Runtime([agent], store=store_url, **{name: value})
        assert await store_contents(rt.store, r.session_id) == before
        assert [s.id for s in await rt.sessions()] == [r.session_id]


def test_a_lease_ttl_error_names_the_range_and_the_bounds_themselves_are_taken(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    with pytest.raises(so.UsageError) as info:
        so.Runtime([], store=url, lease_ttl=0.001)
    assert str(info.value) == "lease_ttl must be a number of seconds, from 0.1 to 86400, not 0.001"
    assert not (tmp_path / "state.db").exists()  # refused before the store is touched
    for ttl in (0.1, 0.3, 30, 86_400):
        assert so.Runtime([], store=url, lease_ttl=ttl).lease_ttl == ttl


def test_agents_or_a_store_of_the_wrong_kind_are_refused_when_the_runtime_is_made(
    tmp_path: Path,
) -> None:
    """A name or one agent where the list goes, or a path where the URL goes, failed with a bare
    AttributeError, or only at the first call."""
    agent = scripted_agent("support", [reply("hi")])
    url = f"sqlite:///{tmp_path / 'state.db'}"
    for agents in ("support", agent, [agent, "support"], None, 5):  # None, 5: a TypeError
        with pytest.raises(so.UsageError, match="^agents must be a list of Agent objects"):
            so.Runtime(agents, store=url)  # type: ignore[arg-type]
    for store in (tmp_path / "state.db", 5, url.encode()):
        with pytest.raises(so.UsageError, match=r"^store must be a URL \(sqlite:///path"):
            so.Runtime([agent], store=store)  # type: ignore[arg-type]
    # The class, not a store made of it: its `open` was a bare TypeError at the first call.
    for kind in (SQLiteStore, PostgresStore):
        with pytest.raises(
            so.UsageError, match=rf"^store must be .* not the class {kind.__name__}"
        ):
            so.Runtime([agent], store=kind)  # type: ignore[arg-type]
    assert not (tmp_path / "state.db").exists()


@pytest.mark.parametrize("when", ["before", "after"])
async def test_a_message_queued_by_another_process_around_the_commit_that_ends_a_drive_is_run(
    store_url: str, when: str
) -> None:
    """A drive whose last commit gives its lease back returns its own state without reading the
    store again. A message another process queues on the running turn just before that commit
    makes the commit meet a newer head, so the drive reads it and runs the message's turn; one
    sent just after finds the turn ended and the lease free, and its sender runs it. Either way
    nothing is left waiting in the queue."""
    alice = so.Principal(authenticator="okta", principal_id="alice")
    bob = so.Principal(authenticator="okta", principal_id="bob")
    model = so.models.Scripted([so.ModelResponse(text="Done.")], repeat_last=True)
    agent = so.Agent(name="support", model=model)
    async with (
        so.Runtime([agent], store=store_url) as first,
        so.Runtime([agent], store=store_url) as second,
    ):
        sid = await first.create_session("support")
        commit = first.store.commit
        sent: list[so.GenerateResult] = []

        async def last_commit_raced(c: Any) -> None:
            ending = c.release_lease and not sent
            if ending and when == "before":
                sent.append(await second.send(sid, "And the invoice?", principal=bob))
            await commit(c)
            if ending and when == "after":
                sent.append(await second.send(sid, "And the invoice?", principal=bob))

        first.store.commit = last_commit_raced  # type: ignore[method-assign,assignment]
        result = await first.generate(session_id=sid, prompt="Refund 1042", auth=alice)
        assert len(sent) == 1
        assert sent[0].queued is (when == "before")  # it waited for alice's turn to end
        state = await second.state(sid)
        assert state.queued == [] and state.turn is not None
        assert state.turn.status == "completed"
        assert state.turn.principal == bob  # bob's message had its turn
        assert result.status == "completed"


@pytest.mark.parametrize("bad", [5, 1.5, b"ses_1", ["ses_1"]])
async def test_a_session_id_that_is_not_text_is_a_usage_error_on_both_stores(
    store_url: str, bad: Any
) -> None:
    """Every call naming a session refuses an id that is not text by name, before the store
    is asked: PostgreSQL raised a bare TypeError for a number, and both stores one for a list."""
    async with so.Runtime([scripted_agent("a", [reply("hi")])], store=store_url) as rt:
        calls = {
            "state": lambda: rt.state(bad),
            "cancel": lambda: rt.cancel(bad),
            "respond": lambda: rt.respond(
                bad, [so.InputResponse(request_id="req_1", option_id="approve")]
            ),
            "send": lambda: rt.send(bad, "hi"),
            "generate": lambda: rt.generate(session_id=bad, prompt="hi"),
            "approvals": lambda: rt.generate(
                session_id=bad, approvals=[so.Decision(id="req_1", approved=True)]
            ),
            "schedule": lambda: rt.schedule("a", "hi", session_id=bad),
            "events": lambda: anext(aiter(rt.events(bad, follow=False))),
        }
        for name, make in calls.items():
            with pytest.raises(so.UsageError, match="session_id must be text"):
                await make()
            assert await rt.sessions() == [], name


@pytest.mark.parametrize("bad", [5, ["a"]])
async def test_an_agent_named_by_anything_but_text_is_refused_alike_on_both_stores(
    store_url: str, bad: Any
) -> None:
    """`rt.sessions(agent=5)` listed nothing on SQLite and raised a bare TypeError on
    PostgreSQL (a list the other way round), and a list as the agent of `generate` raised
    one on both: each is now a named error and nothing is stored."""
    async with so.Runtime([scripted_agent("a", [reply("hi")])], store=store_url) as rt:
        with pytest.raises(so.UsageError, match="agent must be text or None"):
            await rt.sessions(agent=bad)
        for start in (
            lambda: rt.generate(bad, prompt="hi"),
            lambda: rt.schedule(bad, "hi"),
            lambda: rt.create_session(bad),
        ):
            # A wrong type is misuse (as the HTTP client says it), not an agent unknown.
            with pytest.raises(so.UsageError, match="agent must be text") as caught:
                await start()
            assert not isinstance(caught.value, so.UnknownAgent)
        assert await rt.sessions() == []


ODD_ID = "ses_\ud800"  # a lone surrogate: Python text, but no UTF-8 a store could look up


async def test_a_session_id_holding_a_lone_surrogate_is_an_unknown_session_on_both_stores(
    store_url: str,
) -> None:
    """No session's id holds a lone surrogate, and neither store can even look one up: every
    call naming such a session raised a bare UnicodeEncodeError from the driver. It is now an
    unknown session, as any other id no session has, and nothing is stored."""
    ran: list[int] = []
    async with so.Runtime([refund_agent(ran, Capture(reply("x")))], store=store_url) as rt:
        parked = await rt.generate("a", prompt="refund it")
        [request] = parked.pending
        before = await store_contents(rt.store, parked.session_id)
        answer = [so.InputResponse(request_id=request.id, option_id="approve")]
        calls = {
            "state": lambda: rt.state(ODD_ID),
            "cancel": lambda: rt.cancel(ODD_ID),
            "respond": lambda: rt.respond(ODD_ID, answer),
            "respond, not resumed": lambda: rt.respond(ODD_ID, answer, resume=False),
            "send": lambda: rt.send(ODD_ID, "hi"),
            "generate": lambda: rt.generate(session_id=ODD_ID, prompt="hi"),
            "generate, to resume": lambda: rt.generate(session_id=ODD_ID),
            "generate, its agent named": lambda: rt.generate("a", session_id=ODD_ID),
            "approvals": lambda: rt.generate(
                session_id=ODD_ID, approvals=[so.Decision(id=request.id, approved=True)]
            ),
            "schedule": lambda: rt.schedule("a", "hi", session_id=ODD_ID),
            "events": lambda: anext(aiter(rt.events(ODD_ID, follow=False))),
        }
        for name, make in calls.items():
            with pytest.raises(so.UnknownSession) as info:
                await make()
            assert info.value.session_id == ODD_ID, name
        assert await store_contents(rt.store, parked.session_id) == before
        assert [s.id for s in await rt.sessions()] == [parked.session_id]
        assert ran == []


def test_the_sync_twins_take_a_session_id_holding_a_lone_surrogate_as_unknown(
    store_url: str,
) -> None:
    """The sync twins go the same way: an unknown session, not a UnicodeEncodeError."""
    rt = so.Runtime([scripted_agent("a", [reply("hi")])], store=store_url)
    try:
        for make in (
            lambda: rt.state_sync(ODD_ID),
            lambda: rt.cancel_sync(ODD_ID),
            lambda: rt.generate_sync(session_id=ODD_ID, prompt="hi"),
            lambda: rt.send_sync(ODD_ID, "hi"),
            lambda: rt.events_sync(ODD_ID),
        ):
            with pytest.raises(so.UnknownSession):
                make()
        assert rt.sessions_sync() == []
    finally:
        rt.close_sync()


@pytest.mark.parametrize("starter", ["this-runtime", "another-process"])
async def test_a_call_whose_turn_is_cancelled_mid_drive_reports_that_turn_not_the_next(
    store_url: str, starter: str
) -> None:
    """While a tool of Alice's turn runs, the turn is cancelled and a new prompt starts the next
    one. Alice's `generate` reports her turn, cancelled; it used to return the next turn's result
    (`completed`, with the other prompt's answer and turn id), which its drive went on to run.
    That next turn still runs to its end, and its own caller gets it."""
    entered = asyncio.Event()
    release = asyncio.Event()

    @so.tool
    async def crawl() -> str:
        """A long task."""
        entered.set()
        await asyncio.wait_for(release.wait(), timeout=10)
        return "crawled"

    def agent() -> so.Agent:
        script = [call_tools(call("crawl")), reply("Answer to the new prompt.")]
        return scripted_agent("bot", script, tools=[crawl])

    alice = so.Principal(authenticator="okta", principal_id="alice")
    async with (
        so.Runtime([agent()], store=store_url) as rt,
        so.Runtime([agent()], store=store_url, lease_wait=0) as elsewhere,
    ):
        other = rt if starter == "this-runtime" else elsewhere
        sid = await rt.create_session("bot", auth=alice)
        first = asyncio.create_task(rt.generate(session_id=sid, prompt="crawl", auth=alice))
        await asyncio.wait_for(entered.wait(), timeout=10)
        old = (await rt.state(sid)).turn
        assert old is not None
        assert (await other.cancel(sid, "changed my mind")).status == "cancelled"
        second = asyncio.create_task(other.generate(session_id=sid, prompt="new", auth=alice))
        for _ in range(500):  # until the new turn is recorded
            now = (await rt.state(sid)).turn
            if now is not None and now.id != old.id:
                break
            await asyncio.sleep(0.01)
        assert now is not None and now.id != old.id
        release.set()
        a = await asyncio.wait_for(first, timeout=10)
        b = await asyncio.wait_for(second, timeout=10)
        assert (a.status, a.turn_id, a.text, a.pending) == ("cancelled", old.id, "", [])
        assert b.turn_id == now.id
        state = await rt.state(sid)
        assert state.turn is not None
        assert (state.turn.id, state.turn.status) == (now.id, "completed")
        assert state.turn.text == "Answer to the new prompt."
        if starter == "this-runtime":
            assert (b.status, b.text) == ("completed", "Answer to the new prompt.")
        tl = timeline(await events(rt, sid))
        assert "tool.completed crawl ok" not in tl
        assert tl[-2:] == ["turn.completed", "session.waiting"]
