"""Where `signoff serve` and `signoff worker` send the runtime's own log (and its database
driver's): stderr, timestamped."""

from __future__ import annotations

import logging
import re
import sys
import traceback
from collections.abc import Generator, Sequence
from types import TracebackType
from typing import Any, TypeAlias

__all__ = ["LOG_FORMAT", "LOG_LEVELS", "log_to_stderr", "one_line"]

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
"""The levels the commands take, uvicorn's (`trace` is its own, below debug)."""

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Controls (ESC starts the sequences that retitle, clear or rewrite a terminal), the
# bidirectional ones that reorder the text around them, and lone surrogates. A message's line
# breaks go too: it is one line, whatever text (a model's error, a driver's) it quotes.
_IN_LINE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]"
)
_IN_BLOCK = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]"
)

_ExcInfo: TypeAlias = (
    tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]
)


def _escaped(pattern: re.Pattern[str], text: str) -> str:
    return pattern.sub(lambda m: ascii(m.group())[1:-1], text)


def one_line(text: str) -> str:
    """`text` as a log line quotes it, for a line written without a logger: its controls, line
    breaks and bidirectional marks as escapes (`\\x1b`), so it cannot steer the terminal."""
    return _escaped(_IN_LINE, text)


class _Escaping(logging.Formatter):
    """Writes what a record quotes (a model's error, a tool's) with its control characters as
    escapes (`\\x1b`, `\\n`): as they are, they steered the terminal reading the log and
    made lines no logger wrote. A traceback keeps its own line breaks, not those of the
    messages and notes it quotes."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return _escaped(_IN_LINE, super().formatMessage(record))

    def formatException(self, ei: _ExcInfo) -> str:
        if ei[1] is None:  # logged outside an `except`: "NoneType: None"
            return super().formatException(ei)
        text = "".join(_quoted(ei[1], ei[2]).format())
        return _escaped(_IN_BLOCK, text.removesuffix("\n"))

    def formatStack(self, stack_info: str) -> str:
        return _escaped(_IN_BLOCK, super().formatStack(stack_info))


class _OneLine(traceback.TracebackException):
    """An exception of a traceback whose every line (type and message, a note, a syntax
    error's source) is one line: a break within what it quotes shows as `\\n`."""

    def format_exception_only(self, **kwargs: Any) -> Generator[str, None, None]:
        # The stdlib yields each line with its break: any other break is in what it quotes.
        for line in super().format_exception_only(**kwargs):
            said = line.removesuffix("\n")
            yield _escaped(_IN_LINE, said) + line[len(said) :]


def _quoted(exc: BaseException, tb: TracebackType | None) -> traceback.TracebackException:
    """The traceback `print_exception` writes of `exc`, with the message and notes of each
    exception it shows (causes, contexts, a group's members) one line each, whatever margin the
    line takes. The stdlib cuts the chain's cycles; this walk visits each exception once."""
    top = traceback.TracebackException(type(exc), exc, tb, compact=True)
    stack, seen = [top], set()
    while stack:
        te = stack.pop()
        if id(te) in seen:
            continue
        seen.add(id(te))
        te.__class__ = _OneLine  # the stdlib makes the chained ones of its own class
        notes = te.__notes__
        # The stdlib splits a note at its breaks: they are escaped first.
        if isinstance(notes, Sequence):
            te.__notes__ = [_escaped(_IN_LINE, _note(note)) for note in notes]
        for frame in te.stack:
            frame.filename = _escaped(_IN_LINE, frame.filename)
            frame.name = _escaped(_IN_LINE, frame.name)
        stack.extend(held for held in (te.__cause__, te.__context__) if held is not None)
        stack.extend(te.exceptions or ())
    return top


def _note(note: object) -> str:
    try:
        return str(note)
    except Exception:
        return "<note str() failed>"  # the stdlib's words


def log_to_stderr(level: str = "info") -> None:
    """Send the `signoff` loggers' records at `level` and above to stderr, one timestamped line
    each, unless logging is already set up (a handler on `signoff` or on the root logger): an
    application that configured its own keeps it, levels included, and nothing is logged twice."""
    logger = logging.getLogger("signoff")
    if logger.handlers or logging.getLogger().handlers:
        return
    least = logging.DEBUG if level == "trace" else getattr(logging, level.upper())
    logger.setLevel(least)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Escaping(LOG_FORMAT))
    logger.addHandler(handler)
    # psycopg's pool warns of every failed reconnection (several a second while the database is
    # down), which signoff logs once when it starts and once when it ends: below debug, only
    # its errors are shown, in the same format.
    driver = logging.getLogger("psycopg")
    driver.setLevel(least if least <= logging.DEBUG else max(least, logging.ERROR))
    driver.addHandler(handler)
