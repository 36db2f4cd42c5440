"""The whole `signoff` command, its commands registered: what `main` imports once it can stop
cleanly on a Ctrl-C, and the names `signoff.cli` exports."""

from __future__ import annotations

import io
import sys
from typing import TextIO

# Each registers its commands, which `--help` lists in this order: the queue's before the log's.
from . import _chat, _queue  # noqa: F401  # isort: skip
from . import _events, _cancellation, _deletion, _prune, _serve, _worker  # noqa: F401  # isort: skip
from ..channels._tty import lenient_stdin
from ._app import app, local_principal, parse_principal
from ._commands import ClosedOutput, finish_help
from ._loading import load_runtime

__all__ = ["app", "load_runtime", "local_principal", "parse_principal", "run"]

finish_help(app)


def run() -> None:
    """Run the command line `sys.argv` gives."""
    # Closed (`>&-`), Python gives it as None: what was printed went nowhere, exit 0, or a
    # traceback (`events --follow`). Writing to it fails now as to any file that takes nothing.
    sys.stdout = ClosedOutput() if sys.stdout is None else _whole_writes(sys.stdout)
    for stream in (sys.stdout, sys.stderr):
        # Output that is not UTF-8 (a Windows pipe's code page, a Latin-1 locale) shows what it
        # cannot hold (an agent's name, a model's text) as escapes rather than failing on it. A
        # C or POSIX locale's (UTF-8 mode off) is ASCII with `surrogateescape`, which fails on
        # all else; what is printed holds no lone surrogate for it to pass on (`printable`).
        if isinstance(stream, io.TextIOWrapper) and stream.errors in _FAILING:
            stream.reconfigure(errors="backslashreplace")
    # Input read strictly (en_US.UTF-8) failed on a byte that is not UTF-8, piped in or typed
    # (Latin-1, a meta key), and lost the lines read with it: read as a lone surrogate, the
    # line is refused and asked again, as in a C.UTF-8 locale.
    lenient_stdin()
    app()


_FAILING = frozenset({"strict", "surrogateescape"})  # error handlers that raise on a "€" in ASCII


def _whole_writes(stream: TextIO) -> TextIO:
    """`stream`, or when it writes straight to its file (PYTHONUNBUFFERED=1, as container images
    set it) the same written through a buffer flushed at each line: Python's text layer drops
    what a raw write could not take (a reader gone mid-write, a disk full), where a buffer
    writes it again and raises, so the command ends 141 or names the error, never 0."""
    if not isinstance(stream, io.TextIOWrapper) or not isinstance(stream.buffer, io.FileIO):
        return stream
    stream.flush()
    raw = io.FileIO(stream.fileno(), "w", closefd=False)
    return io.TextIOWrapper(
        io.BufferedWriter(raw),
        encoding=stream.encoding,
        errors=stream.errors,
        line_buffering=True,
        write_through=True,
    )
