"""Printing a listing's table (`signoff sessions`, `pending`) fast and as Rich prints it.

Rich measures and renders every cell of a table through its whole layout machinery, about
1.5 ms a row: 10,000 sessions took 15.7 s to print, where their JSON took one. A listing's cells
are plain styled text, so Rich lays out only the few rows that decide the column widths (the
widest of each column), and the rows are written here line for line as Rich writes them.

Rich's public API gives no table's column widths, so `_widths` calls its private
`Table._calculate_column_widths`, and `Column` is copied with its `_cells` (as of Rich 15):
tests/test_cli_tables.py prints tables both ways and checks the output is the same, byte for byte.
A Rich without those internals gets Rich's own (slower) printing, never an error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from rich.cells import cell_len
from rich.console import Console
from rich.measure import Measurement
from rich.segment import Segment, Segments
from rich.table import Column, Table
from rich.text import Text

from ..channels.terminal import _CONTROLS

__all__ = ["cell", "fit", "print_table"]

# Whether this Rich has the internals the fast path copies; without them Rich prints alone.
_FAST = hasattr(Table, "_calculate_column_widths") and "_cells" in {
    f.name for f in dataclasses.fields(Column)
}


def cell(*parts: str | tuple[str, str]) -> Text:
    """A table cell of `parts` (text, or text and its style) as printed: control characters
    (from a model, a reviewer, a store) show as `\\x1b` and the like, as `printable` shows them."""
    text = Text()
    for part in parts:
        shown, style = (part, "") if isinstance(part, str) else part
        text.append(_CONTROLS.sub(lambda m: ascii(m.group())[1:-1], shown), style)
    return text


def fit(console: Console, table: Table, give_way: int | None = None) -> Table:
    """Make `console` wide enough to print `table` without cutting its ids or leaving out a
    column, and return the few of its rows that decide its layout: when it is wider than the
    terminal (or a pipe's 80 columns), column `give_way` alone is shortened, to its header at
    most, where Rich would cut every column evenly; else a column that wraps is narrowed, to its
    longest word at most; what still does not fit is printed wider than the terminal."""
    sample = _sample(table) if _FAST else table
    unbounded = console.options.update_width(1_000_000)
    needed = Measurement.get(console, unbounded, sample)
    if give_way is not None and needed.maximum > console.width:
        widest = max(_measure(c)[1] for c in _texts(table.columns[give_way]))
        header = len(str(table.columns[give_way].header))
        max_width = max(header, widest - (needed.maximum - console.width))
        for t in (table, sample):
            t.columns[give_way].max_width = max_width
        needed = Measurement.get(console, unbounded, sample)
    least = needed.maximum if give_way is not None else _unwrapped(console, sample)
    console.width = max(console.width, needed.minimum, least)
    return sample


def print_table(console: Console, table: Table, sample: Table | None = None) -> None:
    """Print `table` (of `Text` cells) as `console.print(table)` would, its column widths laid
    out from `sample` (`fit`'s), which holds the rows that decide them."""
    if not _FAST or not _plain(table):
        console.print(table)
        return
    sample = sample or _sample(table)
    widths = _widths(console, sample)
    if any(w - sum(_padding(table, i)) < 1 for i, w in enumerate(widths)):
        console.print(table)  # a column cut to nothing, which only Rich knows how to show
        return
    head = _copy(table, [], widths)  # title, edge, header and rule, as Rich prints them
    options = console.options  # as `console.print` renders the table
    if console.soft_wrap:
        options = options.update(no_wrap=True, overflow="ignore")
    # As wide as the whole table: Rich's last resort cuts its columns past what the console
    # holds, and the header at the widths given would be cut again.
    options = options.update_width(sum(widths) + _edges(table))
    lines = console.render_lines(head, options, pad=False, new_lines=True)
    assert table.box is not None  # `_plain`
    box = table.box.substitute(console.options, safe=table.safe_box or console.safe_box)
    bottom = lines.pop() if table.show_edge else None
    segments: list[Segment] = [s for line in lines for s in line]
    columns = table.columns
    rows = list(zip(*(_texts(c) for c in columns), strict=True))
    for index, row in enumerate(rows):
        last = index == len(rows) - 1
        left, divider, right = (
            (box.foot_left, box.foot_vertical, box.foot_right)
            if last
            else (box.mid_left, box.mid_vertical, box.mid_right)
        )
        segments.extend(_row(console, table, widths, row, left, divider, right))
    if bottom is not None:
        segments.extend(bottom)
    console.print(Segments(segments))


def _row(
    console: Console,
    table: Table,
    widths: Sequence[int],
    row: Sequence[Text],
    left: str,
    divider: str,
    right: str,
) -> Iterable[Segment]:
    """The lines of one row, as Rich renders a row of `Text` cells aligned to the top."""
    cells: list[list[list[Segment]]] = []
    for index, (width, text, column) in enumerate(zip(widths, row, table.columns, strict=True)):
        before, after = _padding(table, index)
        inner = width - before - after
        lines = _lines(console, text, inner, column)
        cells.append(
            [[Segment(" " * before), *line, Segment(" " * after)] for line in lines]
            if before or after
            else lines
        )
    height = max(len(c) for c in cells)
    blank = [[Segment(" " * w)] for w in widths]
    for line_no in range(height):
        if table.show_edge:
            yield Segment(left)
        for index, lines in enumerate(cells):
            if index:
                yield Segment(divider)
            yield from lines[line_no] if line_no < len(lines) else blank[index]
        if table.show_edge:
            yield Segment(right)
        yield Segment.line()


def _lines(console: Console, text: Text, width: int, column: Column) -> list[list[Segment]]:
    """`text` in a cell `width` wide, as Rich wraps or cuts it, each line padded to `width`."""
    plain = text.plain
    if "\t" in plain or any(cell_len(line) > width for line in plain.split("\n")):
        parts: Iterable[Text] = text.wrap(
            console, width, justify=column.justify, overflow=column.overflow, no_wrap=column.no_wrap
        )
    else:  # what nearly every cell is: lines that fit, which Rich's wrap only pads
        parts = text.split("\n", allow_blank=True) if "\n" in plain else [text]
    out = []
    for part in parts:
        segments = list(part.render(console)) if part.spans or part.style else [Segment(part.plain)]
        out.append(Segment.adjust_line_length(segments, width))  # cut or padded, as Rich does
    return out


def _plain(table: Table) -> bool:
    """Whether `table` is one `print_table` writes as Rich would: `Text` cells in left-justified
    columns of no style, aligned to the top, whitespace between them and no lines between rows."""
    box = table.box
    return (
        box is not None
        and not (box.mid_vertical + box.mid_left + box.mid_right).strip()
        and not (box.foot_vertical + box.foot_left + box.foot_right + box.bottom).strip()
        and table.show_header
        and not table.show_footer
        and not table.show_lines
        and not table.leading
        and not table.row_styles
        and table.style in ("", "none", None)
        and not table.caption
        and table.width is None
        and table.min_width is None
        and not table.expand
        and all(r.style is None and not r.end_section for r in table.rows)
        and all(
            c.justify == "left"
            and c.vertical == "top"
            and c.style in ("", "none", None)
            and c.width is None
            and all(isinstance(t, Text) for t in c.cells)
            for c in table.columns
        )
    )


def _padding(table: Table, index: int) -> tuple[int, int]:
    """The spaces before and after the cells of column `index`."""
    _, right, _, left = table.padding
    if not table.pad_edge:
        left = 0 if index == 0 else left
        right = 0 if index == len(table.columns) - 1 else right
    return left, right


def _widths(console: Console, sample: Table) -> list[int]:
    """The widths Rich gives `sample`'s columns (padding included), as `Table` lays them out."""
    options = console.options.update_width(console.width - _edges(sample))
    return list(sample._calculate_column_widths(console, options))


def _unwrapped(console: Console, table: Table) -> int:
    """The width `table` needs for its column that wraps (the queue's Input) to be no narrower
    than its longest word. Rich gives a column that does not wrap its widest and narrows only
    those that wrap, to nothing if it must: at the table's measured minimum, one was left out."""
    options = console.options.update_width(1_000_000)
    needed = _edges(table)
    for index, column in enumerate(table.columns):
        cells = [*([column.header] if table.show_header else []), *column.cells]
        cells += [column.footer] if table.show_footer else []
        least, most = 0, 0
        for renderable in cells:
            measured = Measurement.get(console, options, renderable)
            least, most = max(least, measured.minimum), max(most, measured.maximum)
        padding = sum(_padding(table, index))
        if column.width is not None:
            least = most = column.width
        kept = Measurement(least + padding, most + padding).clamp(
            None if column.min_width is None else column.min_width + padding,
            None if column.max_width is None else column.max_width + padding,
        )
        wraps = column.width is None and not column.no_wrap
        needed += kept.minimum if wraps else kept.maximum
    return needed


def _edges(table: Table) -> int:
    """The width of `table`'s edges and the dividers between its columns."""
    return (2 if table.box is not None and table.show_edge else 0) + len(table.columns) - 1


def _texts(column: Column) -> list[Text]:
    return [c if isinstance(c, Text) else Text(str(c)) for c in column.cells]


def _measure(text: Text) -> tuple[int, int]:
    """(least, most) width of `text`, as Rich measures a `Text`: longest word, longest line."""
    plain = text.plain
    lines = plain.splitlines()
    most = max(map(cell_len, lines)) if lines else 0
    words = plain.split()
    return (max(map(cell_len, words)) if words else most), most


def _sample(table: Table) -> Table:
    """A copy of `table` with only the rows that decide its layout: in each column, the cell
    widest at its least and the one widest at its most. Rich measures a column by these two
    alone, so the copy lays out as the whole table does."""
    keep: set[int] = set()
    for column in table.columns:
        measured = [_measure(t) for t in _texts(column)]
        if measured:
            keep.add(max(range(len(measured)), key=lambda i: measured[i][0]))
            keep.add(max(range(len(measured)), key=lambda i: measured[i][1]))
    return _copy(table, sorted(keep))


def _copy(table: Table, rows: Sequence[int], widths: Sequence[int] | None = None) -> Table:
    """`table` with only its rows `rows`, each column `widths` wide (padding included) if given."""
    copied = Table.__new__(Table)
    copied.__dict__.update(table.__dict__)
    copied.rows = [table.rows[i] for i in rows]
    copied.columns = []
    for index, column in enumerate(table.columns):
        fixed = None
        if widths is not None:
            before, after = _padding(table, index)
            fixed = widths[index] - before - after
        copied.columns.append(
            dataclasses.replace(
                column,
                _cells=[column._cells[i] for i in rows],
                width=fixed if fixed is not None else column.width,
            )
        )
    return copied
