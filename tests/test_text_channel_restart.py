"""How the request a text channel showed closed while no hub ran, told by a hub started anew: in
a new process, with a new channel object, or on another state past that close. Before, only a
channel object that outlived the stop told it; a new one showed the next request at once."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import ChannelHub
from signoff.testing import ManualClock, call, call_tools, scripted_agent

from ._channels import Texts, manual, status, three_refunds
from .test_deletion import OPS, refunds

_HUB = """
import asyncio, json, sys
import signoff as so
from signoff.channels import ChannelHub, TextChannel

class Printed(TextChannel):
    async def send_text(self, text):
        print(json.dumps(text), flush=True)

async def main():
    async with so.Runtime([], store=sys.argv[1]) as rt:
        hub = ChannelHub(rt, [Printed()], state=sys.argv[2])
        await hub.start(follow=False)
        try:
            await hub.poll()
        finally:
            await hub.stop()

asyncio.run(main())
"""


ALICE = so.Principal(authenticator="test", principal_id="alice")


async def _two_refunds(rt: so.Runtime) -> tuple[so.GenerateResult, so.GenerateResult]:
    """Two sessions, each waiting on a refund's approval (order 7 first, then 8)."""
    x = await rt.generate("refunds", prompt="refund 7", auth=ALICE)
    y = await rt.generate("refunds", prompt="refund 8", auth=ALICE)
    return x, y


async def _erase(rt: so.Runtime, session_id: str) -> None:
    await rt.cancel(session_id, principal=ALICE)
    await rt.delete_session(session_id, by=OPS, reason="GDPR request 12")


async def _deny(rt: so.Runtime, request: so.InputRequest) -> None:
    response = so.InputResponse(request_id=request.id, option_id="cancel")
    await rt.respond(request.session_id, [response], resume=False)


async def test_a_new_channel_says_how_the_request_shown_closed_while_no_hub_ran(
    store_url: str, tmp_path: Path
) -> None:
    runs: list[str] = []
    async with so.Runtime([three_refunds(runs)], store=store_url) as rt:
        a, b, _ = (await rt.generate("support", prompt="Refund A, B and C")).pending
        first = Texts()
        async with manual(ChannelHub(rt, [first], state=tmp_path / "channels.db")):
            assert first.sent == [first.render(a)]
        await _deny(rt, a)
        again = Texts()  # as a new process makes it
        async with manual(ChannelHub(rt, [again], state=tmp_path / "channels.db")) as hub:
            assert again.sent == []  # A is still the one shown: not sent again, nor B yet
            await hub.poll()
            assert again.sent[0].startswith("issue_refund was denied by the policy at ")
            assert again.sent[1:] == [again.render(b)]
            outcome = await again.reply("yes", None)  # answers B, not the closed A
            assert outcome is not None and outcome.request_id == b.id
        assert runs == ["B-2"]


async def test_a_new_process_says_how_the_request_shown_closed_while_no_hub_ran(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    async with so.Runtime([three_refunds([])], store=url) as rt:
        a, b, _ = (await rt.generate("support", prompt="Refund A, B and C")).pending
        first = Texts()
        async with manual(ChannelHub(rt, [first], state=tmp_path / "channels.db")):
            assert first.sent == [first.render(a)]
        await _deny(rt, a)
    args = [sys.executable, "-c", _HUB, url, str(tmp_path / "channels.db")]
    done = await asyncio.to_thread(
        subprocess.run, args, capture_output=True, text=True, timeout=120, check=True
    )
    sent = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(sent) == 2, done.stdout
    assert sent[0].startswith("issue_refund was denied by the policy at ")
    assert sent[1] == first.render(b)


async def test_a_hub_past_the_close_of_the_request_shown_tells_it_at_its_first_poll(
    tmp_path: Path,
) -> None:
    """A's close reached a hub whose SMS service was down; it gave up on the entry and its
    machine was lost. The hub on another state goes on from the position past it (the store's
    claim), so no poll brings that close: it is read from the trail and told before B is
    shown."""
    runs: list[str] = []
    async with so.Runtime([three_refunds(runs)], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        a, b, _ = (await rt.generate("support", prompt="Refund A, B and C")).pending
        lost = Texts()
        hub = ChannelHub(rt, [lost], state=tmp_path / "a.db", max_attempts=1, retry_backoff=0)
        async with manual(hub):
            assert lost.sent == [lost.render(a)]
            await _deny(rt, a)

            async def down(text: str) -> None:
                raise ConnectionError("SMS service down")

            lost.send_text = down  # type: ignore[method-assign]
            await hub.poll()  # given up on A's close: the position goes past it
        other = Texts()
        async with manual(ChannelHub(rt, [other], state=tmp_path / "b.db")) as hub:
            assert other.sent == []
            await hub.poll()
            assert other.sent[0].startswith("issue_refund was denied by the policy at ")
            assert other.sent[1:] == [other.render(b)]
            await hub.poll()
            assert len(other.sent) == 2  # told once


# A request erased with its session while no hub ran: the store has nothing left of it, so the
# memo of the request shown describes it (its tool), and the deletion's entry says who and why.
# Before, a channel made anew showed the next request at once, with no word of the one it showed.


async def test_a_new_channel_says_the_request_shown_was_erased_while_no_hub_ran(
    store_url: str, tmp_path: Path
) -> None:
    async with so.Runtime([refunds()], store=store_url) as rt:
        x, y = await _two_refunds(rt)
        first = Texts()
        async with manual(ChannelHub(rt, [first], state=tmp_path / "channels.db")):
            assert first.sent == [first.render(x.pending[0])]
        await _erase(rt, x.session_id)
        again = Texts()  # as a new process makes it
        async with manual(ChannelHub(rt, [again], state=tmp_path / "channels.db")) as hub:
            assert again.sent == []  # the erased one is still the one shown: not the next yet
            await hub.poll()
            told, shown = again.sent
            assert told.startswith("refund was withdrawn at ")
            assert told.endswith(": its session was deleted by ops (GDPR request 12).")
            assert shown == again.render(y.pending[0])
            await hub.poll()
            assert len(again.sent) == 2  # told once
            outcome = await again.reply("yes", ALICE)  # answers the next, shown
            assert outcome is not None and outcome.request_id == y.pending[0].id


async def test_a_new_process_says_the_request_shown_was_erased_while_no_hub_ran(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    async with so.Runtime([refunds()], store=url) as rt:
        x, y = await _two_refunds(rt)
        first = Texts()
        async with manual(ChannelHub(rt, [first], state=tmp_path / "channels.db")):
            assert first.sent == [first.render(x.pending[0])]
        await _erase(rt, x.session_id)
    args = [sys.executable, "-c", _HUB, url, str(tmp_path / "channels.db")]
    done = await asyncio.to_thread(
        subprocess.run, args, capture_output=True, text=True, timeout=120, check=True
    )
    sent = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(sent) == 2, done.stdout
    assert sent[0].startswith("refund was withdrawn at ")
    assert sent[0].endswith(": its session was deleted by ops (GDPR request 12).")
    assert sent[1] == first.render(y.pending[0])


async def test_a_hub_past_the_deletion_of_the_request_shown_tells_it_from_the_deletion(
    tmp_path: Path,
) -> None:
    """The hub read the deletion while its SMS service was down, gave up on the entry, and its
    machine was lost; the hub on another state goes on from the position past it (the store's
    claim), so no poll brings it: the store's memo describes the request shown, and the
    deletion's entry on `store:deletions` says who deleted it and why."""
    async with so.Runtime([refunds()], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        x, y = await _two_refunds(rt)
        lost = Texts()
        hub = ChannelHub(rt, [lost], state=tmp_path / "a.db", max_attempts=1, retry_backoff=0)
        async with manual(hub):
            assert lost.sent == [lost.render(x.pending[0])]
            await _erase(rt, x.session_id)

            async def down(text: str) -> None:
                raise ConnectionError("SMS service down")

            lost.send_text = down  # type: ignore[method-assign]
            await hub.poll()  # given up on the deletion: the position goes past it
        other = Texts()
        async with manual(ChannelHub(rt, [other], state=tmp_path / "b.db")) as hub:
            assert other.sent == []
            await hub.poll()
            told, shown = other.sent
            assert told.startswith("refund was withdrawn at ")
            assert told.endswith(": its session was deleted by ops (GDPR request 12).")
            assert shown == other.render(y.pending[0])


async def test_a_memo_written_before_descriptions_says_the_request_shown_was_erased(
    tmp_path: Path,
) -> None:
    """A memo of the request shown written by an earlier signoff holds only its id: the person
    is told `the request shown` was withdrawn, as its tool is not known any more."""
    async with so.Runtime([refunds()], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        x, y = await _two_refunds(rt)
        first = Texts()
        state = so.channels.ChannelState(tmp_path / "channels.db")
        async with manual(ChannelHub(rt, [first], state=state)):
            assert first.sent == [first.render(x.pending[0])]
        state.forget("text", "shown_as", hub="hub")
        memos: Any = rt.store  # the SQLite store's memos, beside the hub's claim
        memo = json.dumps({"request_id": x.pending[0].id})
        await memos.keep_channel_memos({"hub.text:shown": memo}, rt.now())
        await _erase(rt, x.session_id)
        again = Texts()
        async with manual(ChannelHub(rt, [again], state=state)) as hub:
            await hub.poll()
            told, shown = again.sent
            assert told.startswith("the request shown was withdrawn at ")
            assert told.endswith(": its session was deleted by ops (GDPR request 12).")
            assert shown == again.render(y.pending[0])
        state.close()


def _lapsing() -> so.Agent:
    """An agent asking for approval of one refund, in sessions a minute's TTL expires."""

    @so.tool(approval=so.always())
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    asks = call_tools(call("refund", order_id="7"))
    return scripted_agent("lapsing", [asks], tools=[refund], limits=so.Limits(ttl=60))


@pytest.mark.parametrize("recorded_by", ["reply", "sweep"])
async def test_a_new_channel_keeps_on_show_the_request_whose_session_lapsed_unrecorded(
    store_url: str, tmp_path: Path, recorded_by: str
) -> None:
    """The TTL of the shown request's session passed while no hub ran, and no one recorded the
    lapse yet: the open requests a hub starts with leave it out, but the new channel keeps it on
    show, as a hub that went on delivering does. A reply to it is refused as expired (which
    records the lapse), or a sweep records it; its close is told, then the next is shown.
    Before, the next was shown with no word of it, and the reply meant for it approved that."""
    clock = ManualClock()
    state = tmp_path / "channels.db"
    async with so.Runtime([_lapsing(), refunds()], store=store_url, clock=clock) as rt:
        x = await rt.generate("lapsing", prompt="go", auth=ALICE)
        clock.advance(1)  # asked after it
        y = await rt.generate("refunds", prompt="refund 8", auth=ALICE)
        first = Texts()
        async with manual(ChannelHub(rt, [first], clock=clock, state=state)):
            assert first.sent == [first.render(x.pending[0])]
        clock.advance(120)
        again = Texts()  # as a new process makes it
        async with manual(ChannelHub(rt, [again], clock=clock, state=state)) as hub:
            await hub.poll()
            assert again.sent == []  # still the one shown: not sent again, nor the next
            assert again.current is not None and again.current.id == x.pending[0].id
            if recorded_by == "reply":
                assert await again.reply("yes", ALICE) is None
                refused = again.sent.pop(0)
                assert refused.startswith("Your answer was not accepted: ")
                assert "expired" in refused
            else:
                assert await rt.expire_due() == 1
            await hub.poll()
            told, shown = again.sent
            assert told.startswith("refund expired at ")
            assert told.endswith(" (session expired).")
            assert shown == again.render(y.pending[0])
        assert await status(rt, x.pending[0].id) == ("expired", "expired")
        assert await status(rt, y.pending[0].id) == ("pending", None)
