"""How the request a text channel showed closed while no hub ran, told by a hub started anew: in
a new process, with a new channel object, or on another state past that close. Before, only a
channel object that outlived the stop told it; a new one showed the next request at once."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import signoff as so
from signoff.channels import ChannelHub

from ._channels import Texts, manual, three_refunds

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
