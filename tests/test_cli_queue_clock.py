"""`signoff pending` (`cli._queue`) shows ages and deadlines by the runtime's clock, which
stamped them and judges them: on PostgreSQL the database's, however far this machine's wall
clock is off it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import signoff as so
from signoff.testing import call, call_tools, scripted_agent

from ._cli import invoke


def _desk() -> so.Agent:
    """Asks to approve a refund, for 10 minutes."""

    @so.tool(approval=so.always(expires_in=600))
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return "ok"

    return scripted_agent("desk", [call_tools(call("refund", order_id="1"))], tools=[refund])


@pytest.mark.parametrize("skew", [3600.0, -3600.0], ids=["ahead", "behind"])
def test_pending_times_the_queue_by_the_database_clock(
    pg_store_url: str, skew: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request with 10 minutes to answer it, listed on a machine whose clock is an hour
    ahead of the database's (or behind it): it expires in 9 minutes and some seconds, and was
    asked seconds ago; the local clock said it expired (`0s`) an hour ago, or expires in an
    hour and was asked in the future (`0s ago`)."""
    rt = so.Runtime([_desk()], store=pg_store_url)
    try:
        assert rt.generate_sync("desk", "refund 1").status == "waiting"
    finally:
        rt.close_sync()
    wall = time.time
    monkeypatch.setattr(time, "time", lambda: wall() + skew)  # this machine's clock is off
    result = invoke("pending", "--store", pg_store_url)
    assert result.exit_code == 0, result.output
    assert "expires in 9m" in result.output
    assert "s ago" in result.output and "h ago" not in result.output


def test_pending_shows_a_deadline_centuries_away_in_years(tmp_path: Path) -> None:
    """`expires_in=1e300` is a valid deadline: `signoff pending` printed its time left as a
    number of days three hundred digits long; it reads `over 9999y`."""

    @so.tool(approval=so.always(expires_in=1e300))
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return "ok"

    desk = scripted_agent("desk", [call_tools(call("refund", order_id="1"))], tools=[refund])
    url = f"sqlite:///{tmp_path}/s.db"
    rt = so.Runtime([desk], store=url)
    try:
        assert rt.generate_sync("desk", "refund 1").status == "waiting"
    finally:
        rt.close_sync()
    result = invoke("pending", "--store", url)
    assert result.exit_code == 0, result.output
    assert "expires in over 9999y" in result.output
