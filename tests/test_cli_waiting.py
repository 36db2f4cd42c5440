"""`open_when_up`: what `signoff serve` and `signoff worker` say while their store is down."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import signoff as so
from signoff.cli._waiting import open_when_up


class _Down:
    """A runtime whose store is down, its driver quoting a URL with terminal escapes in it."""

    def __init__(self, stop: asyncio.Event) -> None:
        self.stop = stop

    async def open(self) -> None:
        self.stop.set()
        raise so.StoreUnavailable(
            "cannot connect to PostgreSQL at postgresql://h/post\x1b[31mgres\x1b]0;PWNED\x07:\n"
            "  connection refused \u202eevil"
        )


async def test_the_waiting_line_cannot_steer_the_terminal() -> None:
    """`serve` echoed the store error as it came: an escape in the database's name (or in a
    driver's message) set the terminal's colour and window title; `worker`'s logger escaped it."""
    said: list[str] = []
    stop = asyncio.Event()
    up = await open_when_up(cast(Any, _Down(stop)), stop, said.append)
    assert up is False
    assert said == [
        "waiting for the store (retrying in 0.5s): cannot connect to PostgreSQL at "
        "postgresql://h/post\\x1b[31mgres\\x1b]0;PWNED\\x07: connection refused \\u202eevil"
    ]
