"""Checks of the settings a user passes (durations, counts), shared by the runtime, the stores,
the server and the channels so that a bad value gets the same clear error wherever it is set."""

from __future__ import annotations

import math

from ._exceptions import SignoffError, UsageError

__all__ = [
    "check_page",
    "check_read",
    "finite",
    "flag",
    "positive_seconds",
    "seconds",
    "shown_value",
    "whole",
]


def finite(value: object) -> bool:
    """A number (not a bool) that a float holds and is finite: an int too large for one
    (`10**400`) made `math.isfinite`, or the arithmetic of a deadline, raise `OverflowError`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def positive_seconds(value: object) -> bool:
    """A finite number above 0 (not a bool): a duration a loop can wait between its rounds."""
    return finite(value) and value > 0  # type: ignore[operator]


def shown_value(value: object) -> str:
    """`value` as an error shows it; Python refuses to print an int of thousands of digits."""
    try:
        return repr(value)
    except ValueError:
        return f"a whole number of {value.bit_length()} bits"  # type: ignore[attr-defined]


def seconds(
    name: str,
    value: object,
    *,
    least: float = 0.0,
    most: float = math.inf,
    zero: bool = False,
    shown: str | None = None,
    error: type[SignoffError] = UsageError,
) -> float:
    """`value` if it is a finite number of seconds above 0 (or 0 itself if `zero`) within
    `least` and `most`, else `error` naming the setting and its allowed range; `shown` is the
    value as the user wrote it (a URL's text)."""
    if positive_seconds(value) or (zero and finite(value) and value == 0):
        assert isinstance(value, (int, float))
        if (value == 0 or least <= value) and value <= most:
            return value
    if least == 0 and most == math.inf:
        allowed = "a finite number of seconds from 0" if zero else "a positive, finite number"
        allowed += "" if zero else " of seconds"
    else:
        top = f"to {most:g}" if most < math.inf else "up"
        if least > 0:
            span = f"{'0 or ' if zero else ''}from {least:g} {top}"
        else:
            span = f"from 0 {top}" if zero else f"above 0, up {top}"
        allowed = f"a number of seconds, {span}"
    raise error(
        f"{name} must be {allowed}, not {shown if shown is not None else shown_value(value)}"
    )


def whole(
    name: str,
    value: object,
    *,
    least: int,
    most: int | None = None,
    shown: str | None = None,
    error: type[SignoffError] = UsageError,
) -> int:
    """`value` if it is a whole number (an int, not a bool) from `least` (to `most`), else
    `error` naming the setting and its allowed range."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= least:
        if most is None or value <= most:
            return value
    allowed = f"from {least}" if most is None else f"from {least} to {most}"
    raise error(
        f"{name} must be a whole number {allowed}, not "
        f"{shown if shown is not None else shown_value(value)}"
    )


def check_read(after: object, limit: object, newest: object, max_bytes: object) -> None:
    """An event read's bounds, whole numbers every store takes alike (a signed 64-bit integer),
    else `UsageError`: past it SQLite raised a bare OverflowError, PostgreSQL an SQL error."""
    whole("after", after, least=-(2**63), most=2**63 - 1)
    for name, value in (("limit", limit), ("newest", newest), ("max_bytes", max_bytes)):
        if value is not None:
            whole(name, value, least=0, most=2**63 - 1)


def flag(name: str, value: object) -> bool:
    """`value` if it is True or False: any other (`"no"`, `0`) was taken for its truth."""
    if not isinstance(value, bool):
        raise UsageError(f"{name} must be True or False, not {shown_value(value)}")
    return value


def check_page(limit: object, offset: object) -> None:
    """A listing's page is whole numbers from 0 that every store takes alike (a signed 64-bit
    integer), else `UsageError`."""
    whole("limit", limit, least=0, most=2**63 - 1)
    whole("offset", offset, least=0, most=2**63 - 1)
