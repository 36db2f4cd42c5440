"""`ServerClock`: the server's time as an HTTP client reckons it, from the time each answer says
it was sent (`X-Signoff-Time`, else `Date`), so a client whose machine's clock is off the
server's judges deadlines and TTLs by the server's clock, as the server does.

The distance is kept from a clock of this machine's that never steps (`awake_clock`), so a
step of the wall clock after a measurement misleads nothing either.
"""

from __future__ import annotations

import email.utils
import math
import time
from collections.abc import Mapping
from datetime import UTC

from ._leasing import awake_clock

__all__ = ["TIME_HEADER", "ServerClock", "header_time"]

TIME_HEADER = "X-Signoff-Time"
"""The response header a signoff server gives its clock's time in (the runtime's, `Runtime.now`:
on PostgreSQL the database's), in seconds since the epoch, to the millisecond."""

_AWAKE = awake_clock()
_wall = time.time  # the machine's wall clock: the time until a server's is known


def header_time(now: float) -> str:
    """`now` as `TIME_HEADER` gives it: to the millisecond, cut (not rounded) so it is never
    ahead of the time it was."""
    return f"{math.floor(now * 1000) / 1000:.3f}"


class ServerClock:
    """The server's time as the answers measured so far say it. An answer's own header is
    stamped as it is sent, so the reckoning lags the server's clock by the time the answer took
    to arrive (and `Date`'s, whole seconds, by up to one more): nothing is judged closed before
    the server's clock says so. Until an answer gives the time, it is the machine's clock."""

    def __init__(self) -> None:
        self._offset: float | None = None  # the server's time minus `_AWAKE()`'s
        self._exact = False  # measured from `TIME_HEADER`: a `Date` (a proxy's?) is not used

    def seen(self, headers: Mapping[str, str]) -> None:
        """Measure the distance again from an answer's headers, just received."""
        at = _AWAKE()
        given = _stamp(headers.get(TIME_HEADER))
        if given is not None:
            self._offset, self._exact = given - at, True
        elif not self._exact:
            dated = _dated(headers.get("Date"))
            if dated is not None:
                self._offset = dated - at

    def now(self) -> float:
        """The server's time now, as far as measured (seconds since the epoch)."""
        offset = self._offset
        return _wall() if offset is None else _AWAKE() + offset


def _stamp(value: str | None) -> float | None:
    """`TIME_HEADER`'s time, or None if absent or not a finite time."""
    if value is None:
        return None
    try:
        stamp = float(value.strip())
    except ValueError:
        return None
    return stamp if math.isfinite(stamp) and stamp > 0 else None


def _dated(value: str | None) -> float | None:
    """An HTTP `Date` header's time (whole seconds), or None if absent or unreadable."""
    if not value:
        return None
    try:
        dated = email.utils.parsedate_to_datetime(value)
        return (dated if dated.tzinfo else dated.replace(tzinfo=UTC)).timestamp()
    except (TypeError, ValueError, OverflowError, IndexError):
        return None
