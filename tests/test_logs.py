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


def _unforged(text: str) -> list[str]:
    """The lines of `text` that read, margins aside, as a line another logger wrote."""
    return [ln for ln in text.splitlines() if ln.lstrip(" |").startswith(FORGED)]


def test_an_exception_s_note_adds_no_line() -> None:
    """A note (`add_note`, as libraries add them) is quoted under its exception's message: its
    line breaks show as escapes too, each note on its own line as the stdlib writes them."""
    exc = RuntimeError("the turn failed")
    exc.add_note(f"while calling the model{chr(10)}{FORGED}")
    exc.add_note("second note")
    text = _Escaping(LOG_FORMAT).format(_record(exc))
    assert not _unforged(text), text
    assert text.splitlines()[-3:] == [
        "RuntimeError: the turn failed",
        f"while calling the model\\n{FORGED}",
        "second note",
    ]


def test_the_members_of_an_exception_group_add_no_line() -> None:
    """A group's members (an `asyncio.TaskGroup`'s failures) are quoted inside its margins:
    their messages, notes and causes, nested groups included, show their breaks as escapes."""
    try:
        raise KeyError(f"lookup{chr(10)}{FORGED}")
    except KeyError as cause:
        member = ValueError(f"sub{chr(13)}{chr(10)}{FORGED}")
        member.__cause__ = cause
    member.add_note(f"noted{chr(10)}{FORGED}")
    inner = ExceptionGroup(f"inner{chr(10)}{FORGED}", [TypeError(f"deep{chr(10)}{FORGED}")])
    text = _Escaping(LOG_FORMAT).format(_record(ExceptionGroup("several", [member, inner])))
    assert not _unforged(text), text
    lines = [ln.lstrip(" |") for ln in text.splitlines()]
    for quoted in [
        f"ValueError: sub\\r\\n{FORGED}",
        f"noted\\n{FORGED}",
        f"KeyError: 'lookup\\n{FORGED}'",
        f"ExceptionGroup: inner\\n{FORGED} (1 sub-exception)",
        f"TypeError: deep\\n{FORGED}",
    ]:
        assert quoted in lines, text


def test_an_exception_s_type_and_a_syntax_error_s_source_add_no_line() -> None:
    """What a traceback says of an exception besides its message (a class named at run time,
    the source line a `SyntaxError` quotes, as `compile` of a model's text raises) is one line."""
    named = type(f"Odd{chr(10)}{FORGED}", (Exception,), {})
    syntax = SyntaxError("invalid syntax", ("<model>", 1, 1, f"x{chr(10)}{FORGED}", 1, 2))
    for exc in [named("no"), syntax]:
        text = _Escaping(LOG_FORMAT).format(_record(exc))
        assert not _unforged(text), text
        assert f"\\n{FORGED}" in text


def test_a_cyclic_or_long_chain_is_logged_once_each() -> None:
    """A chain that loops back on itself (through a group's member) ends, and a long one is
    written whole, each exception once."""
    member = ValueError(f"member{chr(10)}{FORGED}")
    group = ExceptionGroup("loop", [member])
    member.__context__ = group
    text = _Escaping(LOG_FORMAT).format(_record(group))
    assert not _unforged(text), text
    assert text.count(f"ValueError: member\\n{FORGED}") == 1
    exc: BaseException = ValueError("first")
    for n in range(2000):
        wrapper = RuntimeError(f"step {n}{chr(10)}{FORGED}")
        wrapper.__cause__ = exc
        exc = wrapper
    text = _Escaping(LOG_FORMAT).format(_record(exc))
    assert not _unforged(text)
    assert text.count(f"\\n{FORGED}") == 2000


def test_a_record_logged_outside_an_except_keeps_the_stdlib_s_line() -> None:
    """`logger.exception` with no exception being handled writes what logging writes."""
    record = logging.LogRecord("signoff", logging.ERROR, __file__, 1, "m", (), (None, None, None))
    assert _Escaping(LOG_FORMAT).format(record).splitlines()[-1] == "NoneType: None"
