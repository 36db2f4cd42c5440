"""The lines `signoff serve` and `signoff worker` log (`_logs`): what a record quotes cannot
steer the terminal or add a line of its own, a traceback included."""

from __future__ import annotations

import logging
import sys

import pytest

from signoff._logs import LOG_FORMAT, _Escaping

FORGED = "2026-12-02 03:00:00,000 INFO signoff.worker: session s1: completed"


def _record(exc: BaseException) -> logging.LogRecord:
    try:
        raise exc
    except BaseException:
        info = sys.exc_info()
    return logging.LogRecord("signoff.worker", logging.ERROR, __file__, 1, "failed", (), info)


@pytest.mark.parametrize("brk", ["\n", "\r\n", "\u2028"], ids=["lf", "crlf", "u2028"])
def test_an_exception_s_message_in_a_traceback_adds_no_line(brk: str) -> None:
    """The message of a logged exception (a model's error, a webhook receiver's reply) is
    quoted on the traceback's last line: its line breaks show as escapes, as in a message, so
    it cannot write a line that reads as another logger's. The traceback keeps its own."""
    try:
        raise ValueError(f"upstream said no{brk}{FORGED}")
    except ValueError as cause:
        exc = RuntimeError(f"the turn failed{brk}{FORGED}")
        exc.__cause__ = cause
    text = _Escaping(LOG_FORMAT).format(_record(exc))
    lines = text.splitlines()
    assert not [ln for ln in lines if ln.startswith(FORGED)], text
    assert lines[0].endswith("ERROR signoff.worker: failed")
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == f"RuntimeError: the turn failed{ascii(brk)[1:-1]}{FORGED}"
    assert f"ValueError: upstream said no{ascii(brk)[1:-1]}{FORGED}" in lines


def test_a_message_of_a_lone_line_break_keeps_the_traceback_s_lines() -> None:
    """Escaping a message does not touch the traceback's own line breaks."""
    text = _Escaping(LOG_FORMAT).format(_record(ValueError("\n")))
    lines = text.splitlines()
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "ValueError: \\n"


def test_a_message_that_quotes_the_one_it_wraps_is_escaped_whole() -> None:
    """A wrapping exception's message holding its cause's (`f"...: {exc}"`) is escaped whole,
    whichever of the two the traceback shows first."""
    inner = f"no{chr(10)}{FORGED}"
    try:
        raise ValueError(inner)
    except ValueError as cause:
        exc = RuntimeError(f"wrapped: {inner}")
        exc.__cause__ = cause
    text = _Escaping(LOG_FORMAT).format(_record(exc))
    assert not [ln for ln in text.splitlines() if ln.startswith(FORGED)], text
    assert text.splitlines()[-1] == f"RuntimeError: wrapped: no\\n{FORGED}"
