"""`printable`: text from a model, a reviewer or a store prints on a Rich console as it is."""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from signoff.channels.terminal import _CONTROLS, printable

from . import _proof


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


def _shown(markup: str) -> str:
    """What a plain console (no color, no wrapping) prints for `markup`."""
    out = io.StringIO()
    console = Console(file=out, width=10_000, color_system=None, highlight=False)
    console.print(markup, soft_wrap=True, end="")
    return out.getvalue()


@pytest.mark.parametrize(
    "text",
    [
        '{"pattern":"^\\\\[ERROR\\\\] disk"}',  # a regex's escaped brackets, as JSON writes them
        "\\[ x \\]",  # LaTeX display math
        "\\[",
        "a\\[b",
        "\\[1]",
        "\\[x]",
        "\\\\[",
        "x\\\\[y]",
        "C:\\[dir]\\",
        "C:\\[Backup] is :smile:",
        "rm \\[abc\\]",
        "\\[[b]",
        "[a\\[b]",
        ":\\[:",
    ],
)
def test_printable_keeps_a_backslash_before_an_opening_bracket(text: str) -> None:
    """Rich prints `\\[` in text as `[` when no tag follows it, which `rich.markup.escape`
    leaves as it is: an approval of `grep("^\\[ERROR\\]")` showed `^[ERROR\\]`, not what ran."""
    assert _shown(printable(text)) == text
    assert _shown(f"[dim]{printable(text)} :[/]") == text + " :"


_PIECES = st.sampled_from(
    [
        "\\",
        "[",
        "]",
        ":",
        "/",
        "#",
        "@",
        "=",
        "a",
        "b",
        "Z",
        " ",
        "é",
        "👍",
        "smile",
        "thumbs_up",
        "bold",
        "red",
        "link",
        "none",
        "/none",
        "on",
    ]  # fmt: skip
)


@given(
    text=st.one_of(st.lists(_PIECES, max_size=12).map("".join), st.text(max_size=40)),
    around=st.sampled_from(["{}", "[dim]{}[/]", "[dim]x {} y[/]", "[dim]:{}[/]", "{}: ok"]),
)
@settings(deadline=None, max_examples=1000)
def test_printable_prints_any_text_as_it_is(text: str, around: str) -> None:
    """Whatever a model, a reviewer or a store gives (backslashes, brackets, colons, emoji
    codes), `printable` prints it as it is, its controls as `\\x1b`-style escapes; and the
    markup around it stays markup."""
    _proof.record("hypothesis:test_printable_prints_any_text_as_it_is:examples")
    text = text.replace("\t", " ").replace("\n", " ")  # a tab is expanded, a line break kept
    before, after = around.split("{}")
    visible = _CONTROLS.sub(lambda m: ascii(m.group())[1:-1], text)
    plain = before.replace("[dim]", "") + visible + after.replace("[/]", "")
    assert _shown(before + printable(text) + after) == plain
