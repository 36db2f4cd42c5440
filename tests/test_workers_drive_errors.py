"""A worker's drive that the store fails: its lease is given back once the store works again,
not kept for the whole TTL, and a session whose drive the store fails every time is retried
less and less often, never in a loop."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

import signoff as so
from signoff import _work
from signoff.stores import Commit

from ._workers import is_, refund_agent, until, working

TTL = 4.0
LONG_TTL = 30.0  # a lease kept until it lapses fails a test by far


def store_down(rt: so.Runtime, *, commits: int | None) -> dict[str, Any]:
    """Make `rt`'s store fail its commits (the first `commits`, or every one if None) and, while
    that lasts, its lease releases: the database going away under a drive. Returns the state:
    `down` (clear it to end the outage), `failed` (the commits it failed), `back` (the
    monotonic time it came back)."""
    outage: dict[str, Any] = {"down": True, "failed": 0, "back": None}
    commit, release = rt.store.commit, rt.store.release_lease

    async def failing_commit(*args: Any, **kwargs: Any) -> None:
        if outage["down"] and (commits is None or outage["failed"] < commits):
            outage["failed"] += 1
            raise so.StoreError("committing: the connection was lost (test)")
        await commit(*args, **kwargs)

    async def failing_release(*args: Any, **kwargs: Any) -> None:
        if outage["down"]:
            raise so.StoreError("releasing a lease: the connection was lost (test)")
        await release(*args, **kwargs)

    rt.store.commit = failing_commit  # type: ignore[method-assign]
    rt.store.release_lease = failing_release  # type: ignore[method-assign]
    return outage


async def test_a_drive_the_store_failed_is_retried_soon_after_the_store_is_back(
    store_url: str,
) -> None:
    """The store failing a worker's drive kept its lease for the whole TTL: the turn waited
    that long after the store came back. It is given back once the store takes it."""
    agent = refund_agent([])
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=LONG_TTL) as worker,
    ):
        outage = store_down(worker, commits=1)
        r = await front.generate("support", prompt="Refund order 1042")
        async with working(worker):
            await until(lambda: _true(outage["failed"] == 1))
            await asyncio.sleep(0.3)  # the store is down for a while after the failed drive
            outage["down"] = False
            back = time.monotonic()
            await until(lambda: is_(front, r.session_id, "waiting"), timeout=LONG_TTL / 3)
            took = time.monotonic() - back
        # Given back within a try of the store coming back (0.5 s apart at most), then claimed
        # and driven: well under a second, and a fifth of the lease kept until it lapses.
        assert took < LONG_TTL / 5, f"{took:.2f}s from the store coming back to the turn"


async def test_a_session_whose_drive_the_store_always_fails_is_not_retried_in_a_loop(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A drive the store fails every time (a row it cannot take, say) is given back after a
    wait that doubles at each failure, up to the TTL: a few tries, not hundreds a second."""
    agent = refund_agent([])
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=TTL) as worker,
    ):
        outage = store_down(worker, commits=None)
        release = worker.store.release_lease
        outage["down"] = False  # releases work; every commit fails
        worker.store.commit = _always_failing  # type: ignore[method-assign]
        worker.store.release_lease = release  # type: ignore[method-assign]
        r = await front.generate("support", prompt="Refund order 1042")
        with caplog.at_level(logging.INFO, logger="signoff.worker"):
            async with working(worker):
                await asyncio.sleep(2.0)
        claims = caplog.text.count(f"claimed session {r.session_id}")
        assert 2 <= claims <= 4, claims  # at about 0, 0, 0.5 and 1.5 s
        assert "given back in" in caplog.text
        assert await is_(front, r.session_id, "running")


async def _always_failing(*args: Any, **kwargs: Any) -> None:
    raise so.StoreError("committing: the row was refused (test)")


async def _true(value: bool) -> bool:
    return value


async def test_a_worker_stopping_gives_back_at_once_a_lease_it_was_waiting_to(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker stopped while it waits to give back the lease of a drive the store failed gives
    it back then, and does not wait out the rest: another worker may try the turn at once."""
    # The second failure's lease waits 20 s to be given back (not 0.5 s): the stop cuts it short.
    monkeypatch.setattr(_work, "GIVE_BACK_AFTER", 20.0)
    waits: list[float] = []
    failed_drive = _work._GiveBacks.failed

    def noted(self: Any, *args: Any) -> float:
        waits.append(failed_drive(self, *args))
        return waits[-1]

    monkeypatch.setattr(_work._GiveBacks, "failed", noted)
    agent = refund_agent([])
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=LONG_TTL) as worker,
    ):

        async def failing(*args: Any, **kwargs: Any) -> None:
            raise so.StoreError("committing: the row was refused (test)")

        worker.store.commit = failing  # type: ignore[method-assign]
        r = await front.generate("support", prompt="Refund order 1042")
        async with working(worker):  # which waits 10 s at most for the worker to stop
            await until(lambda: _true(len(waits) == 2))
            assert waits == [0.0, 20.0]  # its lease is given back in 20 s
            started = time.monotonic()
        assert time.monotonic() - started < 5  # at once, not 20 s
        assert await front.store.acquire_lease(r.session_id, "another", 10, front.now())


async def test_a_session_failed_without_end_waits_out_the_ttl_not_an_overflow(
    store_url: str,
) -> None:
    """The wait before a failed drive's lease is given back doubles up to the TTL however many
    times in a row the session failed: the 1,026th failure (8.5 hours of them at 30 s) once
    raised OverflowError computing 2 ** 1024 before the cap, and no lease was given back."""
    async with so.Runtime([refund_agent([])], store=store_url, inline=False) as rt:
        backs = _work._GiveBacks(rt.store, 30.0, asyncio.Event())
        backs.failures["ses"] = 5_000
        assert backs.failed("ses", "owner", 1) == 30.0
        assert backs.failed("ses", "owner", 1) == 30.0
        backs.stop.set()
        await asyncio.gather(*backs.tasks)


class _Refusing:
    """Stores whose writes fail while `down`: of each, those named (a database restarting
    refuses them all). The first store's claims stay refused from the first refusal on, so
    only another worker could take back a session its worker gave back (the claims of two
    workers racing for it made certain)."""

    def __init__(self, first: so.Runtime, names: dict[so.Runtime, tuple[str, ...]]) -> None:
        self.down = False
        self.refused: list[str] = []  # the first store's refused calls, in order
        self.first = first
        for rt, refused in names.items():
            for name in refused:
                real = getattr(rt.store, name)
                setattr(rt.store, name, self._refusing(rt, name, real))

    def _refusing(self, rt: so.Runtime, name: str, real: Any) -> Any:
        async def refusing(*args: Any, **kwargs: Any) -> Any:
            ours = rt is self.first
            if self.down or (ours and name == "claim" and self.refused):
                if ours:
                    self.refused.append(name)
                raise so.StoreError(f"{name}: the database is restarting (test)")
            return await real(*args, **kwargs)

        return refusing


WRITES = ("commit", "claim", "acquire_lease", "renew_lease", "release_lease")


@pytest.mark.parametrize("refused", ["writes", "commits"])
async def test_a_running_worker_keeps_the_lease_of_a_session_whose_outcome_it_holds(
    store_url: str, refused: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A running worker whose tool body ended while the store refused its record kept the
    outcome in memory, yet gave the session's lease back: once the store was back another
    worker claimed it and ran the refund again. It keeps the lease, taken again at each try
    so it does not lapse, and drives the session again until the outcome is recorded: the
    refund runs once. `writes`: every write refused, on both workers (the database
    restarting); `commits`: only the first worker's commits, for longer than its lease."""
    caplog.set_level(logging.INFO, logger="signoff.worker")
    runs: list[str] = []
    hold = asyncio.Event()
    agent = refund_agent(runs, approval=so.never(), hold=hold)
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=1.0) as first,
        so.Runtime([agent], store=store_url, inline=False) as second,
    ):
        if refused == "writes":
            outage = _Refusing(first, {first: WRITES, second: WRITES})
        else:
            outage = _Refusing(first, {first: ("commit", "claim")})
        r = await front.generate("support", prompt="Refund order 1042")
        key = f"{r.session_id}:1:call_refund"
        async with working(first):
            await until(lambda: _true(runs == [key]))  # the first worker runs the body
            async with working(second):
                outage.down = True
                hold.set()  # the refund ran; its record is refused

                async def tried() -> bool:  # the drive failed, and its lease was seen to
                    after = outage.refused[outage.refused.index("commit") + 1 :]
                    done = any(n.endswith("_lease") for n in after) or after.count("commit") > 8
                    return done or len(runs) > 1  # the old worker: given back at once

                await until(lambda: _true("commit" in outage.refused))
                await until(tried)
                outage.down = False  # the database is back
                await until(lambda: is_(front, r.session_id, "completed"))
        assert runs == [key]  # once, by the first worker
        types = [e.type async for e in front.events(r.session_id, follow=False)]
        assert types.count("tool.completed") == types.count("turn.completed") == 1, types
    said = [r.getMessage() for r in caplog.records if r.name == "signoff.worker"]
    claims = [line for line in said if line.startswith(f"claimed session {r.session_id}")]
    assert len(claims) == 1, said  # by the first worker only
    assert any(
        f"session {r.session_id}: the outcome of issue_refund call call_refund recorded" in line
        for line in said
    ), said
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_turn_the_store_fails_once_the_kept_outcome_is_recorded_is_given_back(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The store failing the turn again just after the worker recorded the outcome it kept:
    the outcome stays recorded and the lease is given back at once, as any drive's the store
    failed, not kept until it lapses, so another worker finishes the turn without the refund."""
    caplog.set_level(logging.INFO, logger="signoff.worker")
    runs: list[str] = []
    hold = asyncio.Event()
    agent = refund_agent(runs, approval=so.never(), hold=hold)
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=LONG_TTL) as first,
        so.Runtime([agent], store=store_url, inline=False) as second,
    ):
        outage = _Refusing(first, {first: ("commit", "claim")})
        refusing = first.store.commit
        after: list[str] = []

        async def commit(c: Any) -> None:
            if after == ["recorded"]:
                after.append("refused")
                raise so.StoreError("committing: the connection was lost again (test)")
            await refusing(c)
            if any(e.type == "tool.completed" for e in c.events):
                after.append("recorded")

        first.store.commit = commit  # type: ignore[method-assign,assignment]
        r = await front.generate("support", prompt="Refund order 1042")
        key = f"{r.session_id}:1:call_refund"
        async with working(first):
            await until(lambda: _true(runs == [key]))  # the first worker runs the body
            async with working(second):
                outage.down = True
                hold.set()
                await until(lambda: _true(outage.refused.count("commit") >= 2 or len(runs) > 1))
                outage.down = False
                # Well within the lease the first worker holds: given back, not left to lapse.
                await until(lambda: is_(front, r.session_id, "completed"), timeout=LONG_TTL / 3)
        assert after == ["recorded", "refused"]
        assert runs == [key]
    said = [r.getMessage() for r in caplog.records if r.name == "signoff.worker"]
    assert any(
        line.startswith(f"session {r.session_id}: the outcome of issue_refund call call_refund")
        and "then the store failed the turn" in line
        for line in said
    ), said


async def test_a_kept_outcome_of_a_later_pass_is_recorded_under_that_pass_lease(
    store_url: str,
) -> None:
    """The worker's drive went on to a second pass (its turn cancelled from elsewhere and a
    message sent), which takes a lease under an owner of its own; the store refused the record
    of the refund that pass ran. The worker asked for the lease again as its claim's owner, was
    refused (the pass kept it), and waited for it to lapse, when any worker could claim the
    session and run the refund again. It takes the lease again as the pass's owner, at once."""
    runs: list[str] = []
    hold = asyncio.Event()

    @so.tool
    async def slow() -> str:
        """Slow."""
        await hold.wait()
        return "ok"

    @so.tool
    async def issue_refund(ctx: so.ToolContext, order_id: str) -> str:
        """Refund an order."""
        runs.append(ctx.idempotency_key())
        return f"refunded {order_id}"

    refund = so.ModelResponse(
        tool_calls=[so.ToolCall(name="issue_refund", input={"order_id": "1"})]
    )
    slowly = so.ModelResponse(tool_calls=[so.ToolCall(name="slow", input={})])
    done = so.ModelResponse(text="Done.")

    def agent(*steps: so.ModelResponse) -> so.Agent:
        model = so.models.Scripted(list(steps), repeat_last=True)
        return so.Agent(name="support", model=model, tools=[slow, issue_refund])

    async with (
        so.Runtime([agent(done)], store=store_url, inline=False) as front,
        so.Runtime(
            [agent(slowly, refund, done)], store=store_url, inline=False, lease_ttl=LONG_TTL
        ) as first,
    ):
        commit = first.store.commit
        refused: list[bool] = []

        async def refusing_once(c: Commit) -> None:
            if not refused and any(e.type == "tool.completed" for e in c.events):
                if any(e.data.get("tool_name") == "issue_refund" for e in c.events):
                    refused.append(True)
                    raise so.StoreError("committing: the connection was lost (test)")
            await commit(c)

        first.store.commit = refusing_once  # type: ignore[method-assign,assignment]
        sid = (await front.generate("support", prompt="Hi")).session_id
        async with working(first):
            await until(lambda: _started(front, sid, "slow"))
            await front.cancel(sid)
            await front.send(sid, "Refund order 1")
            hold.set()
            # Well within the lease's TTL: not after waiting for it to lapse.
            await until(lambda: _started(front, sid, "issue_refund", completed=True), 10.0)
    assert refused == [True] and len(runs) == 1, runs


async def _started(rt: so.Runtime, session_id: str, tool: str, completed: bool = False) -> bool:
    """Whether the session's log has a call of `tool` started (or `completed`)."""
    kind = "tool.completed" if completed else "tool.started"
    log = [e async for e in rt.events(session_id, follow=False)]
    return any(e.type == kind and e.data.get("tool_name") == tool for e in log)
