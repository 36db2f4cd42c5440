"""The chaos test's check that no child asks after its parent's cancel: a request of the child's
delegated turn still pending once the cancel returned is a surprise; one of a later turn, which
a message sent to the child started, is the child's own and is not.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import signoff as so
from signoff import _subagents

from ._chaos import Chaos, Ledger
from ._chaos_procs import ALICE, CHILD, PARENT, make_agents


async def _check(rt: so.Runtime, swept: list[str]) -> list[str]:
    """The surprises the chaos round's check finds in `rt.pending()`, `swept` being the
    children of the parent turns the test cancelled."""
    ledger = Ledger()
    for child in swept:
        ledger.swept[child] = time.time()
    async with httpx.AsyncClient(base_url="http://127.0.0.1:9") as unused:
        chaos = Chaos(random.Random(0), rt, unused, ledger)
        await chaos.asked_after_cancel(await rt.pending())
    return ledger.surprises


async def test_a_child_asking_in_a_turn_its_queued_message_started_is_no_surprise(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message queued on the child while its delegated turn runs (its model not called yet)
    starts the child's next turn once the parent's cancel ends the delegated one: that turn
    asks the child's approval and question again, which the check must not count as the
    cancelled task's requests (seed 1723997323 on PostgreSQL)."""
    async with so.Runtime(make_agents(str(tmp_path / "runs.jsonl")), store=store_url) as rt:
        sid = await rt.create_session(PARENT, auth=ALICE)
        original = _subagents.RuntimeHost.start_child

        async def start_child(host: _subagents.RuntimeHost, child: str, *args: Any) -> bool:
            started = await original(host, child, *args)
            queued = await rt.send(child, "note", principal=ALICE, turn_policy="queue")
            assert queued.queued and queued.status == "running"
            assert (await rt.cancel(sid, "chaos", principal=ALICE)).status == "cancelled"
            return started

        monkeypatch.setattr(_subagents.RuntimeHost, "start_child", start_child)
        assert (await rt.generate(session_id=sid, prompt="order 1001", auth=ALICE)).status == (
            "cancelled"
        )
        monkeypatch.undo()
        [child] = [s.id for s in await rt.sessions(agent=CHILD)]
        stop = asyncio.Event()
        working = asyncio.create_task(rt.work(stop=stop, idle_wait=0.02))
        try:
            for _ in range(250):
                if (await rt.state(child)).status == "waiting":
                    break
                await asyncio.sleep(0.02)
        finally:
            stop.set()
            await asyncio.wait_for(working, 10)
        asks = await rt.pending()
        assert sorted(r.kind for r in asks) == ["question", "tool-approval"]
        assert {r.session_id for r in asks} == {child}
        assert await _check(rt, [child]) == []


async def test_a_child_asking_in_its_delegated_turn_after_the_cancel_is_a_surprise(
    store_url: str, tmp_path: Path
) -> None:
    """The check still counts what it is for: the child's delegated turn asking (here, as if
    the parent's cancel had never reached it) is one surprise per request, its mirrors none."""
    async with so.Runtime(make_agents(str(tmp_path / "runs.jsonl")), store=store_url) as rt:
        r = await rt.generate(PARENT, prompt="order 1001", auth=ALICE)
        assert r.status == "waiting"
        [child] = [s.id for s in await rt.sessions(agent=CHILD)]
        own = [q.id for q in await rt.pending(session_id=child)]
        assert len(own) == 2
        surprises = await _check(rt, [child])
        assert sorted(surprises) == sorted(
            f"{rid}: a child asks after its parent's cancel" for rid in own
        )
