"""How a span names an exception (`_tracing`): its type and, without content, its description."""

from __future__ import annotations

from ._exceptions import SignoffError

__all__ = ["error_type", "exception_type", "named"]


def error_type(exc: BaseException) -> str:
    """`error.type`: signoff's stable code for its own errors, else the exception's class."""
    return exc.code if isinstance(exc, SignoffError) else type(exc).__qualname__


def exception_type(exc: BaseException) -> str:
    """`exception.type`: the exception's class, qualified by its module as the SDK names it."""
    kind = type(exc)
    module = kind.__module__
    return kind.__qualname__ if module in ("builtins", "") else f"{module}.{kind.__qualname__}"


def named(exc: BaseException) -> str:
    """A span's error description without the exception's text: its class, and signoff's
    error code if it has one."""
    name = type(exc).__name__
    return f"{name} ({exc.code})" if isinstance(exc, SignoffError) else name
