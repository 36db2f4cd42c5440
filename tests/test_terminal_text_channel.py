"""`TerminalTextChannel` in a hub: a prompt is asked again by a process started anew."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

import signoff as so
from signoff.channels import ChannelHub, TerminalChannel, TerminalTextChannel

from ._channels import BOB, manual, status, three_refunds


def _prompts(read: Callable[[str], str | None]) -> tuple[TerminalTextChannel, io.StringIO]:
    out = io.StringIO()
    terminal = TerminalChannel(Console(file=out, width=200, highlight=False), read=read)
    return TerminalTextChannel(terminal, principal=BOB), out


async def test_a_prompt_left_open_is_asked_again_when_the_hub_starts_again(
    store_url: str, tmp_path: Path
) -> None:
    """The memo of the request on show outlives the process, its prompt does not: a hub started
    again on the same state asks it again, else the terminal stays silent and all wait."""
    runs: list[str] = []
    state = tmp_path / "channels.db"
    asked: list[str] = []
    async with so.Runtime([three_refunds(runs)], store=store_url) as rt:
        r = await rt.generate("support", prompt="Refund A, B and C")
        a, b, c = r.pending

        def leave(prompt: str) -> str | None:
            asked.append(prompt)
            return None  # end of input: the request stays pending

        first, _ = _prompts(leave)
        async with manual(ChannelHub(rt, [first], state=state)) as hub:
            await hub.poll()
            await first.idle()
        assert len(asked) == 1 and await status(rt, a.id) == ("pending", None)

        lines = iter(["y", "y", "y"])
        again, _ = _prompts(lambda prompt: next(lines, None))
        async with manual(ChannelHub(rt, [again], state=state)) as hub:
            await hub.poll()
            await again.idle()
        assert [await status(rt, x.id) for x in (a, b, c)] == [("settled", "approved")] * 3
        assert runs == ["A-1", "B-2", "C-3"]
