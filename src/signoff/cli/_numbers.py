"""Numbers on the command line: each numeric option parses its own value against its range, so
`nan`, `inf`, a negative or a huge value is refused naming the option and its bounds (exit 2)."""

from __future__ import annotations

import math

import typer

__all__ = ["Bounded", "number_of_seconds", "seconds", "whole"]


class Bounded:
    """The parser of one numeric option: an `int` or a finite `float` from `low` to `high`.

    Typer hands it the text typed (or an environment variable's) and the default as given."""

    def __init__(self, kind: type[int] | type[float], low: float, high: float, what: str) -> None:
        self.kind = kind
        self.low = low
        self.high = high
        self.what = what

    @property
    def range(self) -> str:
        """The bounds as the help and the error show them: `from 0.1 to 3600`."""
        return f"from {_shown(self.low)} to {_shown(self.high)}"

    def __call__(self, value: object) -> int | float:
        number = self._number(value)
        if number is None or not self.low <= number <= self.high:
            raise typer.BadParameter(f"{str(value)!r} is not {self.what} {self.range}")
        return number

    def _number(self, value: object) -> int | float | None:
        if isinstance(value, bool):
            return None
        if self.kind is int:
            if isinstance(value, int):
                return value
            try:
                return int(str(value).strip())
            except ValueError:  # not a whole number, or more digits than int() takes
                return None
        try:
            number = float(value) if isinstance(value, int | float) else float(str(value))
        except (ValueError, OverflowError):
            return None
        return number if math.isfinite(number) else None


def whole(low: int, high: int) -> Bounded:
    """A whole number from `low` to `high` (a count, a port, a sequence number)."""
    return Bounded(int, low, high, "a whole number")


def seconds(low: float, high: float) -> Bounded:
    """A finite number of seconds from `low` to `high`."""
    return Bounded(float, low, high, "a number of seconds")


def number_of_seconds(value: object) -> float:
    """A number of seconds whose range the command checks itself (`--sign-in-lifetime`, as
    `create_app` checks it): text that is no number at all is refused here, with the option."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    try:
        return float(str(value))
    except ValueError:
        raise typer.BadParameter(f"{str(value)!r} is not a number of seconds") from None


def _shown(bound: float) -> str:
    return str(bound) if isinstance(bound, int) else f"{bound:g}"
