"""A forced stop (`signoff serve`'s second signal) reaches the work a channel runs in the
background: `ChannelHub.cut_short` has each channel cancel it (`Channel.cut_short`), so the
hub's stop does not wait for it. Slack's cancels the clicks and replies being settled, a turn
one resumed cut short, and the next start acts on the click again and goes on with the turn."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import Channel, ChannelHub
from signoff.testing import call, call_tools, reply, scripted_agent

from ._slack import PATH, FakeSlack, asgi_client, channel, click, fake, manual, serving, sign

__all__ = ["fake"]  # the fixture, used by name


async def test_a_click_cut_short_leaves_its_turn_to_the_next_start(
    tmp_path: Path, fake: FakeSlack
) -> None:
    """Approve pressed in Slack resumes a turn whose tool waits: `cut_short` cancels it at once
    and the app's stop does not wait for it, its lease given back. The click stays saved: the
    next start acts on it again (the approval, recorded once, is not recorded twice) and the
    turn goes on to its end."""
    started, gate = asyncio.Event(), asyncio.Event()
    runs = 0

    @so.tool(approval=so.always())
    async def nap() -> str:
        """Sleep until woken."""
        nonlocal runs
        runs += 1
        started.set()
        await gate.wait()
        return "rested"

    agent = scripted_agent("napper", [call_tools(call("nap")), reply("Rested.")], tools=[nap])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/state.db") as rt:
        parked = await rt.generate("napper", prompt="Take a nap")
        (request,) = parked.pending
        # Bounded: without the cut the app's stop waits for the nap, which never ends.
        async with asyncio.timeout(30), serving(rt, fake, tmp_path / "hub.db") as (slack, hub, app):
            body = click({"action_id": "signoff.approve", "value": request.id, "type": "button"})
            async with asgi_client(app) as http:
                answered = await http.post(PATH, content=body, headers=sign(body, int(time.time())))
            assert answered.status_code == 200, answered.text
            await started.wait()
            (settling,) = hub.cut_short()
            await asyncio.wait([settling])
            assert settling.cancelled()
            late = slack._spawn(asyncio.sleep(60))  # none is started after it, until a start
            await asyncio.wait([late])
            assert late.cancelled()
            ((_, saved),) = slack.memos("click:")
            assert saved["state"] == "pending"
        lease = await rt.store.acquire_lease(parked.session_id, "another-worker", 30.0, time.time())
        assert lease is not None  # given back
        await rt.store.release_lease(parked.session_id, "another-worker", lease)
        assert (await rt.state(parked.session_id)).status == "running"
        gate.set()
        again = channel(fake)
        async with manual(ChannelHub(rt, [again], state=tmp_path / "hub.db")):
            await asyncio.wait_for(again.idle(), 10)
        types = [e.type async for e in rt.events(parked.session_id, follow=False)]
        assert runs == 2 and types.count("tool.completed") == 1, types  # the body, run again
        assert types.count("input.resolved") == 1, types
        assert (await rt.state(parked.session_id)).status == "idle"


async def test_a_hub_cuts_each_channel_short_past_one_that_fails(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A channel whose `cut_short` raises is logged; the others' work is cut short all the
    same, the tasks still running handed back for the stop to give a moment to end."""

    class Failing(Channel):
        name = "failing"

        def cut_short(self) -> list[asyncio.Task[Any]]:
            raise RuntimeError("no")

    class Busy(Channel):
        name = "busy"

        def __init__(self) -> None:
            super().__init__()
            self.task = asyncio.ensure_future(asyncio.sleep(60))

        def cut_short(self) -> list[asyncio.Task[Any]]:
            self.task.cancel()
            return [self.task]

    busy = Busy()
    async with so.Runtime([], store=f"sqlite:///{tmp_path}/state.db") as rt:
        hub = ChannelHub(rt, [Failing(), busy, Channel(name="plain")])
        with caplog.at_level(logging.ERROR, logger="signoff.channels"):
            assert hub.cut_short() == [busy.task]
        await asyncio.wait([busy.task])
    assert busy.task.cancelled()
    assert "channel failing failed to cut its work short" in caplog.text


def test_a_channel_whose_cut_short_is_async_is_refused_by_the_hub(tmp_path: Path) -> None:
    """A forced stop calls `cut_short` and awaits nothing: an async one would cancel nothing
    (its coroutine never run), and the stop would wait for the channel's work again."""

    class Chat(Channel):
        name = "chat"

        async def cut_short(self) -> list[asyncio.Task[Any]]:  # type: ignore[override]
            return []

    rt = so.Runtime([], store=f"sqlite:///{tmp_path}/state.db")
    with pytest.raises(so.UsageError, match=r"channel 'chat': Chat.cut_short must be a plain def"):
        ChannelHub(rt, [Chat()])
