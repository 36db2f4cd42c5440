"""Where `signoff serve` and `signoff worker` send the runtime's own log (and its database
driver's): stderr, timestamped."""

from __future__ import annotations

import logging
import re
import sys
from types import TracebackType
from typing import TypeAlias

__all__ = ["LOG_FORMAT", "LOG_LEVELS", "log_to_stderr"]

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


class _Escaping(logging.Formatter):
    """Writes what a record quotes (a model's error, a tool's) with its control characters as
    escapes (`\\x1b`, `\\n`): as they are, they steered the terminal reading the log and
    made lines no logger wrote. A traceback keeps its own line breaks, not those of the
    messages it quotes."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return _escaped(_IN_LINE, super().formatMessage(record))

    def formatException(self, ei: _ExcInfo) -> str:
        text = super().formatException(ei)
        # Longest first: a message may hold another (the exception it wraps).
        for said in sorted(_messages(ei[1]), key=len, reverse=True):
            text = text.replace(said, _escaped(_IN_LINE, said))
        return _escaped(_IN_BLOCK, text)

    def formatStack(self, stack_info: str) -> str:
        return _escaped(_IN_BLOCK, super().formatStack(stack_info))


def _messages(exc: BaseException | None) -> set[str]:
    """The messages of `exc` and of the exceptions chained to it that hold a line break, as a
    traceback quotes them (`: message`)."""
    found: set[str] = set()
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        try:
            said = str(exc)
        except Exception:
            said = ""
        if "\n" in said:  # the other controls are escaped with the whole traceback
            found.add(": " + said)
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return found


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
