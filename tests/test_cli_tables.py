"""The listings' tables, printed fast (`cli._tables`), are what Rich prints for them byte for
byte: the same widths, cuts, wrapping, styles and edges, in a terminal and in a pipe."""

from __future__ import annotations

import io
import random
from collections.abc import Callable

import pytest
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from signoff.cli._tables import cell, fit, print_table

_PIECES = [
    "req_0a1b2c3d4e5f6a7b8c9d",
    "ses_1234",
    "support",
    "issue_refund",
    "支払い処理",  # two cells a character
    "👍",
    "a-very-long-word-that-no-column-holds-whole-at-all",
    " ",
    "  ",
    "\t",
    "\n",
    "x",
    "[bold]not markup[/]",
    ":thumbs_up:",
    "\x1b[31m",
    "",
]


def _text(rng: random.Random, lines: bool) -> Text:
    parts: list[str | tuple[str, str]] = []
    for _ in range(rng.randint(0, 6)):
        piece = rng.choice(_PIECES if lines else [p for p in _PIECES if p != "\n"])
        parts.append((piece, "dim") if rng.random() < 0.3 else piece)
    return cell(*parts)


def _sessions(rng: random.Random, rows: int) -> Table:
    table = Table(
        title="Sessions (3 of 9)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        show_edge=False,
    )
    for column in ("Session", "Agent", "Status", "Events", "Last active"):
        table.add_column(column, no_wrap=True, overflow="ellipsis")
    for _ in range(rows):
        table.add_row(*(_text(rng, lines=False) for _ in range(5)))
    return table


def _pending(rng: random.Random, rows: int) -> Table:
    table = Table(
        title="Pending requests (2)", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False
    )
    table.add_column("Request / session", no_wrap=True, min_width=24)
    table.add_column("Agent / asked by", no_wrap=True, max_width=22, overflow="ellipsis")
    table.add_column("Tool / age", no_wrap=True, max_width=24, overflow="ellipsis")
    table.add_column("Input", overflow="fold", ratio=1)
    for _ in range(rows):
        table.add_row(*(_text(rng, lines=True) for _ in range(4)))
    return table


def _printed(
    make: Callable[[], Table], width: int, terminal: bool, give_way: int | None, fast: bool
) -> str:
    out = io.StringIO()
    console = Console(
        file=out,
        width=width,
        force_terminal=terminal,
        color_system="truecolor" if terminal else None,
        highlight=False,
        soft_wrap=True,  # as the commands' console
    )
    table = make()
    sample = fit(console, table, give_way)
    if fast:
        print_table(console, table, sample)
    else:
        console.print(table)
    return out.getvalue()


@pytest.mark.parametrize("terminal", [False, True], ids=["pipe", "terminal"])
@pytest.mark.parametrize("width", [30, 80, 200])
@pytest.mark.parametrize("kind", ["sessions", "pending"])
@pytest.mark.parametrize("seed", range(16))
def test_a_table_printed_fast_is_what_rich_prints(
    kind: str, width: int, terminal: bool, seed: int
) -> None:
    rows = [1, 2, 7, 40][seed % 4]

    def make() -> Table:
        rng = random.Random(seed)
        return _sessions(rng, rows) if kind == "sessions" else _pending(rng, rows)

    give_way = 1 if kind == "sessions" else None
    fast = _printed(make, width, terminal, give_way, fast=True)
    assert fast == _printed(make, width, terminal, give_way, fast=False)


def test_a_table_it_cannot_print_as_rich_does_is_left_to_rich() -> None:
    """Lines between rows (or a cell of another kind than `Text`) are Rich's to print."""

    def make() -> Table:
        table = Table(show_lines=True)
        table.add_column("a")
        table.add_row("[bold]x[/]")
        table.add_row(Text("y"))
        return table

    for terminal in (False, True):
        fast = _printed(make, 40, terminal, None, fast=True)
        assert fast == _printed(make, 40, terminal, None, fast=False)


def test_the_installed_rich_takes_the_fast_path() -> None:
    """The comparisons above test the fast path only if this Rich has the internals it copies."""
    from signoff.cli import _tables

    assert _tables._FAST


@pytest.mark.parametrize("kind", ["sessions", "pending"])
def test_a_rich_without_the_internals_prints_the_table_itself(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Rich release that renames `Table._calculate_column_widths` or `Column._cells` (seen
    at import as `_FAST` false) gets Rich's own printing of the same table, not an error."""
    from signoff.cli import _tables

    def make() -> Table:
        rng = random.Random(7)
        return _sessions(rng, 12) if kind == "sessions" else _pending(rng, 12)

    expected = _printed(make, 80, False, 1 if kind == "sessions" else None, fast=False)
    monkeypatch.setattr(_tables, "_FAST", False)
    assert _printed(make, 80, False, 1 if kind == "sessions" else None, fast=True) == expected


@pytest.mark.parametrize("width", [20, 50, 60, 80])
@pytest.mark.parametrize("seed", range(16))
def test_a_column_that_wraps_is_never_narrower_than_its_longest_word(width: int, seed: int) -> None:
    """Rich narrows only the columns that wrap, to nothing if the others fill the console: at the
    table's measured minimum, the queue's Input column (what a reviewer approves) was left out,
    header and all. `fit` makes room for each such column's longest word."""
    from signoff.cli._tables import _measure, _texts, _widths

    console = Console(file=io.StringIO(), width=width, highlight=False, soft_wrap=True)
    table = _pending(random.Random(seed), [1, 2, 7, 40][seed % 4])
    sample = fit(console, table)
    longest = max(_measure(t)[0] for t in [Text("Input"), *_texts(table.columns[3])])
    assert _widths(console, sample)[3] >= longest + 1  # and its space of padding
