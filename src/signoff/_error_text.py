"""Text of objects user code hands signoff to record (an exception a tool, model, policy or step
raised, a policy's reason): reading it runs user code too, and may raise."""

from __future__ import annotations

__all__ = ["error_message", "error_text", "readable"]


def error_text(exc: BaseException) -> str:
    """`Type: message`, as the log records a tool's, model's or policy's failure."""
    return f"{type(exc).__name__}: {error_message(exc)}"


def error_message(exc: BaseException) -> str:
    """`str(exc)`, or a note naming what reading it raised."""
    return readable(exc, "message")


def readable(value: object, what: str = "text") -> str:
    """`str(value)`, or, when that raises, a note naming what it raised: what cannot be written
    out must still be recorded, not escape the drive and leave its turn half done."""
    try:
        return str(value)
    except Exception as inner:
        return f"<its {what} could not be read: {type(inner).__name__}>"
