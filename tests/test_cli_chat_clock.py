"""`signoff chat` (`_chat`) says how long a request has left by the runtime's clock, which set
its deadline and judges it (on PostgreSQL the database's, or a clock given to the runtime),
however far this machine's wall clock is off it."""

from __future__ import annotations

import time

import pytest
from typer.testing import CliRunner

import signoff as so
from signoff.cli import app
from signoff.testing import ManualClock

from ._cli import treasurer

SKEWS = [pytest.param(3600.0, id="an-hour-ahead"), pytest.param(-3600.0, id="an-hour-behind")]
CLOCK = ManualClock()
STORE = {"url": ""}
"""The clock and store of the runtime `skewed` makes; each test sets them."""


def skewed() -> so.Runtime:
    """The `MODULE:RUNTIME` target: the treasurer, on `CLOCK` and `STORE`."""
    return so.Runtime([treasurer], clock=CLOCK, store=STORE["url"])


@pytest.mark.parametrize("skew", SKEWS)
def test_chat_says_when_a_request_expires_by_the_runtimes_clock(
    store_url: str, skew: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An approval that expires in an hour, asked by a runtime whose clock is an hour off this
    machine's: this machine's clock said it had expired (`0s`) or had two hours left."""
    monkeypatch.setattr(CLOCK, "now", time.time() + skew)
    monkeypatch.setitem(STORE, "url", store_url)
    chat = CliRunner().invoke(
        app, ["chat", "tests.test_cli_chat_clock:skewed"], input="pay ACME\ny\n"
    )
    assert chat.exit_code == 0, chat.output
    assert "expires in 1h; then it is denied" in chat.output, chat.output
