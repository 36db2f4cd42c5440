"""`printable`: text from a model, a reviewer or a store prints on a Rich console as it is."""

from __future__ import annotations

import pytest
from rich.console import Console

from signoff.channels.terminal import printable


@pytest.mark.parametrize(
    "text",
    [
        ":thumbs_up:",
        'issue_refund({"note":":white_check_mark: approved by finance"})',
        "a:smile:b",
        ":red_circle-emoji: :x-text:",
        "::smile::",
        "[b]:smile:[/b]",
        "time 10:30: ok",
        "ends in a colon:",
        ":warning:\\",
    ],
)
@pytest.mark.parametrize("around", ["{}", "[red]{}[/]", "[dim]{} :[/]"])
def test_printable_shows_emoji_codes_as_typed(text: str, around: str) -> None:
    """Rich replaced `:thumbs_up:` in markup with 👍: a reviewer read an emoji where the
    call's input held the code, so what they approved was not what they saw."""
    before, after = around.split("{}")
    console = Console(highlight=False, width=200)
    with console.capture() as captured:
        console.print(before + printable(text) + after, end="")
    assert captured.get() == before.replace("[red]", "").replace("[dim]", "") + text + (
        after.replace("[/]", "")
    )
