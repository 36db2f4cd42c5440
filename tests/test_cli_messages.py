"""The one-line messages the commands print on stderr show what they quote as it is: brackets
and `:name:` (a driver's or a store's message, an agent's name) are neither markup nor emoji."""

from __future__ import annotations

import pytest

from signoff import StoreUnavailable
from signoff.cli._events import _Failing


def test_events_follow_says_a_store_failure_as_the_store_said_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The line was markup-escaped, then printed with markup off: `\\[` before each bracket and
    `[none][/none]` around every colon once the text held something like `:thumbs_up:`."""
    _Failing().failed(StoreUnavailable('at "[::1]" :thumbs_up: down\x1b[2J'))
    assert capsys.readouterr().err == (
        "the store failed, retrying (said again once it works): "
        'at "[::1]" :thumbs_up: down\\x1b[2J\n'
    )
