"""An exception as one line of text, for exceptions raised by user code (a tool, a model, a
policy, a step) that signoff records: reading the message is user code too, and may raise."""

from __future__ import annotations

__all__ = ["error_message", "error_text"]


def error_text(exc: BaseException) -> str:
    """`Type: message`, as the log records a tool's, model's or policy's failure."""
    return f"{type(exc).__name__}: {error_message(exc)}"


def error_message(exc: BaseException) -> str:
    """`str(exc)`, or, when that raises, a note naming what it raised: a failure that cannot
    be described must still be recorded, not escape the drive and leave its turn half done."""
    try:
        return str(exc)
    except Exception as inner:
        return f"<its message could not be read: {type(inner).__name__}>"
