"""Races on one request: 50 asyncio tasks, then 4 processes, answer it at once. Exactly one
settlement is recorded; every other answer gets the no-op outcome or `ConflictingAnswer`.
On SQLite (plain, and behind awaits that really yield) and on PostgreSQL. Then cancels and
follow-up messages whose append lands on a turn that moved on since they looked at it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any, Literal

import pytest

import signoff as so
from signoff.stores import Commit, Loaded, StoredRequest
from signoff.stores.sqlite import SQLiteStore
from signoff.testing import Capture, ExecutionLog, call, call_tools, reply, scripted_agent

from ._procs import Child, make_agent, query, read_executions, spawn, sqlite_url

N_TASKS = 50


class YieldingStore(SQLiteStore):
    """SQLite whose calls suspend first, as a networked store's do, so racing tasks interleave
    between reading a request and settling it; counts the compare-and-sets that lost."""

    def __init__(self, url: str, lost: list[str]) -> None:
        super().__init__(url)
        self.lost = lost

    async def head(self, session_id: str, *, shown: so.Event | None = None) -> int | None:
        await asyncio.sleep(0)
        return await super().head(session_id, shown=shown)

    async def load(self, session_id: str) -> Loaded | None:
        await asyncio.sleep(0)
        return await super().load(session_id)

    async def get_request(self, request_id: str) -> StoredRequest | None:
        await asyncio.sleep(0)
        return await super().get_request(request_id)

    async def commit(self, commit: Commit) -> None:
        await asyncio.sleep(0)
        try:
            await super().commit(commit)
        except (so.RequestClosed, so.AppendConflict) as exc:
            self.lost.append(type(exc).__name__)
            raise

    async def acquire_lease(
        self, session_id: str, owner: str, ttl: float, now: float
    ) -> int | None:
        await asyncio.sleep(0)
        return await super().acquire_lease(session_id, owner, ttl, now)


def _request_row(url: str, request_id: str) -> tuple[str, str]:
    """The request's row in the store's `requests` table, read directly."""
    rows = query(url, "SELECT status, outcome FROM {t}requests WHERE id={p}", request_id)
    assert len(rows) == 1
    return str(rows[0][0]), str(rows[0][1])


def _check_log(events: list[so.Event], request_id: str) -> Counter[str]:
    assert [e.seq for e in events] == list(range(1, len(events) + 1))  # no gap, no duplicate
    settled = [e for e in events if e.type == "approval.settled"]
    resolved = [e for e in events if e.type == "input.resolved"]
    assert [e.data["request_id"] for e in settled] == [request_id]
    assert [e.data["request_id"] for e in resolved] == [request_id]
    return Counter(e.type for e in events)


def _check_answers(answers: list[tuple[str, Any]], request_id: str) -> str:
    """Exactly one answer applied; the rest are no-ops (same answer) or conflicts (different).

    `answers` holds (wanted outcome, result) where result is a list of `Outcome` dicts or the
    name of the exception raised. Returns the winning outcome.
    """
    applied = [
        (wanted, o) for wanted, r in answers if isinstance(r, list) for o in r if o["applied"]
    ]
    assert len(applied) == 1, applied
    winner = str(applied[0][1]["outcome"])
    assert applied[0][0] == winner
    for wanted, result in answers:
        if wanted == winner:
            assert isinstance(result, list), result
            assert [o["request_id"] for o in result] == [request_id]
            assert result[0]["outcome"] == winner
        else:
            assert result == "ConflictingAnswer", (wanted, result)
    return winner


async def _park(rt: so.Runtime) -> tuple[str, str]:
    r = await rt.generate("support", prompt="Refund order 1042, it arrived broken")
    assert r.status == "waiting"
    return r.session_id, r.pending[0].id


@pytest.fixture
def race_url(request: pytest.FixtureRequest, tmp_path: Path, store_kind: str) -> str:
    """The store of a race: a SQLite file, or a fresh PostgreSQL database (small pools)."""
    if store_kind == "postgres":
        return str(request.getfixturevalue("pg_store_url")) + "?pool_max=2"
    return sqlite_url(tmp_path)


@pytest.mark.parametrize(
    ("store_kind", "runtimes"),
    [
        *(
            (kind, r)
            for kind in ("sqlite", "yielding")
            for r in ("shared", "mixed", "one-per-task")
        ),
        # PostgreSQL's driver suspends for real; one runtime per task would need 100 connections
        ("postgres", "shared"),
        ("postgres", "mixed"),
    ],
)
async def test_fifty_tasks_race_to_answer_one_request(
    tmp_path: Path, store_kind: str, runtimes: str, race_url: str
) -> None:
    url = race_url
    records = str(tmp_path / "runs.jsonl")
    lost: list[str] = []

    def runtime() -> so.Runtime:
        store = YieldingStore(url, lost) if store_kind == "yielding" else url
        return so.Runtime([make_agent(records, delay=0.01)], store=store)

    main = runtime()
    opened = [main]
    try:
        session_id, request_id = await _park(main)
        if runtimes == "shared":
            racers = [main] * N_TASKS
        elif runtimes == "mixed":  # half share one runtime (and its cache), half have their own
            racers = [main if i % 2 else runtime() for i in range(N_TASKS)]
        else:
            racers = [runtime() for _ in range(N_TASKS)]
        opened.extend(r for r in racers if r is not main)
        for rt in racers:
            await rt.open()
        gate = asyncio.Event()

        async def answer(i: int, rt: so.Runtime) -> tuple[str, Any]:
            # a third approve through respond, a third through generate, a third cancel
            mode = i % 3
            wanted = "cancelled" if mode == 2 else "approved"
            await gate.wait()
            try:
                if mode == 1:
                    r = await rt.generate(
                        session_id=session_id,
                        approvals=[so.Decision(id=request_id, approved=True, reason=f"task {i}")],
                    )
                else:
                    option = "cancel" if mode == 2 else "approve"
                    r = await rt.respond(
                        session_id,
                        [so.InputResponse(request_id=request_id, option_id=option)],
                    )
            except so.ConflictingAnswer as exc:
                assert exc.request_ids == [request_id]
                return wanted, "ConflictingAnswer"
            assert r.status == "completed", r
            return wanted, [dataclasses.asdict(o) for o in r.outcomes]

        tasks = [asyncio.create_task(answer(i, rt)) for i, rt in enumerate(racers)]
        await asyncio.sleep(0)
        gate.set()
        answers = await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)

        winner = _check_answers(answers, request_id)
        if store_kind == "yielding" and runtimes != "shared":
            # The tasks really raced: several read the request as pending and lost the CAS.
            assert "RequestClosed" in lost or "AppendConflict" in lost, lost
        assert _request_row(url, request_id) == ("settled", winner)
        types = _check_log([e async for e in main.events(session_id, follow=False)], request_id)
        runs = read_executions(records)
        if winner == "approved":
            assert [r["key"] for r in runs] == [f"{session_id}:1:call_refund"]
            assert types["tool.started"] == 1
        else:
            assert runs == []
            assert types["tool.started"] == 0
        assert types["tool.completed"] == 1  # the result, or the denial the model reads
        assert types["model.completed"] == 2
        assert types["turn.completed"] == 1
    finally:
        for rt in opened:
            await rt.close()


def test_four_processes_race_to_answer_one_request(tmp_path: Path, store_url: str) -> None:
    records = str(tmp_path / "runs.jsonl")
    rt = so.Runtime([make_agent(records)], store=store_url)
    children: list[Child] = []
    try:
        parked = rt.generate_sync("support", prompt="Refund order 1042, it arrived broken")
        assert parked.status == "waiting"
        session_id, request_id = parked.session_id, parked.pending[0].id
        start = tmp_path / "go"
        plans = [
            ("approved", ["--decision", "approve", "--via", "respond"]),
            ("approved", ["--decision", "approve", "--via", "generate"]),
            ("approved", ["--decision", "approve", "--via", "respond", "--reason", "same"]),
            ("cancelled", ["--decision", "cancel", "--via", "respond"]),
        ]
        for _, extra in plans:
            children.append(
                spawn(
                    tmp_path,
                    "race",
                    "--session",
                    session_id,
                    "--request",
                    request_id,
                    "--start-file",
                    str(start),
                    *extra,
                    store=store_url,
                )
            )
        for child in children:  # every racer has imported, opened its store and is polling
            child.expect("ready")
        start.touch()
        answers: list[tuple[str, Any]] = []
        for (wanted, _), child in zip(plans, children, strict=True):
            line = child.expect(("result", "error"))
            answers.append(
                (wanted, line["outcomes"] if line["event"] == "result" else line["type"])
            )
            child.wait()
        winner = _check_answers(answers, request_id)
        assert _request_row(store_url, request_id) == ("settled", winner)
        types = _check_log(rt.events_sync(session_id), request_id)
        runs = read_executions(records)
        expected_runs = 1 if winner == "approved" else 0
        assert len(runs) == expected_runs
        assert types["tool.started"] == expected_runs
        assert types["tool.completed"] == 1
        assert types["model.completed"] == 2
        assert types["turn.completed"] == 1
    finally:
        for child in children:
            child.close()
        rt.close_sync()


async def test_an_uncommitted_settlement_is_never_reported_to_another_task(tmp_path: Path) -> None:
    """Two tasks share a runtime (and its cache); a third, in another runtime, settles first.

    The first shared task's settlement is still in flight when the second shared task reads the
    request: the second must not report that answer as the settled one.
    """
    url = sqlite_url(tmp_path)
    records = str(tmp_path / "runs.jsonl")
    lost: list[str] = []
    shared = so.Runtime([make_agent(records, delay=0.01)], store=YieldingStore(url, lost))
    other = so.Runtime([make_agent(records, delay=0.01)], store=YieldingStore(url, lost))
    try:
        session_id, request_id = await _park(shared)
        await other.open()

        async def answer(rt: so.Runtime, option: str) -> tuple[str, Any]:
            wanted = "approved" if option == "approve" else "cancelled"
            try:
                r = await rt.respond(
                    session_id, [so.InputResponse(request_id=request_id, option_id=option)]
                )
            except so.ConflictingAnswer:
                return wanted, "ConflictingAnswer"
            return wanted, [dataclasses.asdict(o) for o in r.outcomes]

        answers = await asyncio.wait_for(
            asyncio.gather(
                answer(other, "cancel"), answer(shared, "approve"), answer(shared, "approve")
            ),
            timeout=30,
        )
        winner = _check_answers(list(answers), request_id)
        assert _request_row(url, request_id) == ("settled", winner)
        _check_log([e async for e in shared.events(session_id, follow=False)], request_id)
    finally:
        await shared.close()
        await other.close()


class OvertakenStore(SQLiteStore):
    """Before its first `turn.started` commit goes in, lets another runtime act on the file."""

    def __init__(self, url: str, meanwhile: Any) -> None:
        super().__init__(url)
        self.meanwhile = meanwhile

    async def commit(self, commit: Commit) -> None:
        if self.meanwhile is not None and commit.events[0].type == "turn.started":
            meanwhile, self.meanwhile = self.meanwhile, None
            await meanwhile()
        await super().commit(commit)


async def test_a_turn_started_elsewhere_meanwhile_is_not_overrun(tmp_path: Path) -> None:
    """Two processes send a message to one idle session at once: the one that loses the race
    checks the session again (here: an approval is now open) instead of starting a turn over
    the winner's."""
    url = f"sqlite:///{tmp_path / 'state.db'}"

    def agent() -> so.Agent:
        @so.tool(approval=so.always())
        async def refund(order_id: str) -> str:
            """Refund an order."""
            return "refunded"

        steps = [call_tools(call("refund", order_id="1")), reply("done")]
        return scripted_agent("a", steps, tools=[refund])

    async with so.Runtime([agent()], store=url) as other:
        sid = await other.create_session("a")

        async def winner() -> None:
            parked = await other.generate(session_id=sid, prompt="refund order 1")
            assert parked.status == "waiting"

        async with so.Runtime([agent()], store=OvertakenStore(url, winner)) as loser:
            with pytest.raises(so.PartialAnswer):
                await loser.generate(session_id=sid, prompt="something else")
        events = [e async for e in other.events(sid, follow=False)]
        assert [e.type for e in events].count("turn.started") == 1
        assert len(await other.pending()) == 1


# -- follow-ups that race the turn: cancels and messages decided on a state that moved on ------


class MeanwhileStore(SQLiteStore):
    """Before its first commit that starts with an event of type `on` goes in, lets another
    runtime act on the file: the commit then lands on a state its caller did not check."""

    def __init__(self, url: str, on: str, meanwhile: Any) -> None:
        super().__init__(url)
        self.on, self.meanwhile = on, meanwhile

    async def commit(self, commit: Commit) -> None:
        if self.meanwhile is not None and commit.events and commit.events[0].type == self.on:
            meanwhile, self.meanwhile = self.meanwhile, None
            await meanwhile()
        await super().commit(commit)


def _refund_then(*steps: Any, log: ExecutionLog | None = None) -> so.Agent:
    log = log or ExecutionLog()

    @log.tool(approval=so.always())
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    return scripted_agent("a", list(steps), tools=[refund])


def _types(events: list[so.Event]) -> list[str]:
    assert [e.seq for e in events] == list(range(1, len(events) + 1))  # no gap, no duplicate
    return [e.type for e in events]


@pytest.mark.parametrize("store_kind", ["yielding", "postgres"])
async def test_two_cancels_at_once_both_report_the_cancelled_turn(
    tmp_path: Path, store_kind: str, race_url: str
) -> None:
    """Two runtimes cancel one waiting turn at once: one records it, the other (which lost the
    append) reports the cancelled turn, as a second cancel after the first would; it used to
    raise the engine's internal `TurnStopped`."""
    steps = [call_tools(call("refund", call_id="c1", order_id="1")), reply("done")]

    def runtime() -> so.Runtime:
        store = YieldingStore(race_url, []) if store_kind == "yielding" else race_url
        return so.Runtime([_refund_then(*steps)], store=store)

    async with runtime() as a, runtime() as b:
        sids = []
        for _ in range(5):  # several sessions: PostgreSQL's interleaving is not scripted
            r = await a.generate("a", prompt="refund order 1")
            assert r.status == "waiting"
            sids.append(r.session_id)
        results = await asyncio.gather(*(rt.cancel(s) for s in sids for rt in (a, b)))
        assert [r.status for r in results] == ["cancelled"] * 10
        for sid in sids:
            types = _types([e async for e in a.events(sid, follow=False)])
            assert types.count("turn.cancelled") == 1
            assert types.count("input.resolved") == 1
        assert await a.pending() == []


async def test_a_cancel_that_loses_to_the_turns_end_records_nothing(tmp_path: Path) -> None:
    """The turn completes between a cancel's look and its append: the cancel reports the
    completed turn and records nothing, as a cancel after the end would; it used to append
    `turn.cancelled` to the completed turn."""
    url = sqlite_url(tmp_path)
    agent = scripted_agent("a", [reply("done")])
    async with (
        so.Runtime([agent], store=url, inline=False) as starter,
        so.Runtime([scripted_agent("a", [reply("done")])], store=url) as driver,
    ):
        sid = (await starter.generate("a", prompt="hi")).session_id

        async def finish() -> None:
            assert (await driver.generate(session_id=sid)).status == "completed"

        store = MeanwhileStore(url, "turn.cancelled", finish)
        async with so.Runtime([scripted_agent("a", [])], store=store) as canceller:
            result = await canceller.cancel(sid, reason="stop")
        assert (result.status, result.text) == ("completed", "done")
        types = _types([e async for e in starter.events(sid, follow=False)])
        assert "turn.cancelled" not in types
        assert types[-2:] == ["turn.completed", "session.waiting"]


async def test_a_request_opened_while_cancelling_is_withdrawn_with_the_turn(
    tmp_path: Path,
) -> None:
    """The turn opens an approval between a cancel's look and its append: the cancel withdraws
    it too. It used to commit the withdrawals it had computed before, leaving that request
    pending on a cancelled turn (in the queue for good)."""
    url = sqlite_url(tmp_path)
    log = ExecutionLog()
    steps = [call_tools(call("refund", call_id="c1", order_id="1")), reply("done")]
    async with so.Runtime([_refund_then(*steps, log=log)], store=url, inline=False) as starter:
        sid = (await starter.generate("a", prompt="refund order 1")).session_id
        async with so.Runtime([_refund_then(*steps, log=log)], store=url) as driver:

            async def park() -> None:
                assert (await driver.generate(session_id=sid)).status == "waiting"

            store = MeanwhileStore(url, "turn.cancelled", park)
            async with so.Runtime([_refund_then(*steps, log=log)], store=store) as canceller:
                result = await canceller.cancel(sid)
        assert (result.status, result.pending) == ("cancelled", [])
        assert await starter.pending() == []
        types = _types([e async for e in starter.events(sid, follow=False)])
        assert types[-3:] == ["input.resolved", "turn.cancelled", "session.waiting"]
        assert log.count() == 0


@pytest.mark.parametrize("policy", ["steer", "queue"])
async def test_a_message_sent_as_the_turn_ends_starts_the_next_turn(
    tmp_path: Path, policy: Literal["steer", "queue"]
) -> None:
    """A message decided on a running turn (steer it, or queue behind it) lands after that turn
    completed: it starts the next turn and the model answers it, as if sent after the end. It
    used to be appended to the completed turn, and the caller got the old turn's answer: the
    message was never read (steer) or waited for someone else to drive it (queue)."""
    url = sqlite_url(tmp_path)
    second = Capture(reply("second answer"))

    def agent() -> so.Agent:
        return scripted_agent("a", [reply("first answer"), second])

    async with (
        so.Runtime([agent()], store=url, inline=False) as starter,
        so.Runtime([agent()], store=url) as driver,
    ):
        sid = (await starter.generate("a", prompt="hi")).session_id

        async def finish() -> None:
            assert (await driver.generate(session_id=sid)).status == "completed"

        store = MeanwhileStore(url, "turn.message", finish)
        async with so.Runtime([agent()], store=store) as sender:
            result = await sender.send(sid, "and another thing", turn_policy=policy)
        assert (result.status, result.text) == ("completed", "second answer")
        assert [m.text for m in second.last if isinstance(m, so.UserMessage)] == [
            "hi",
            "and another thing",
        ]
        types = _types([e async for e in starter.events(sid, follow=False)])
        assert types.count("turn.started") == 2
        assert "turn.message" not in types
