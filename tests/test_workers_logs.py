"""What a worker's log says of a turn it ran: a failed one is a warning with its error code,
message and whether a retry can resume it (it said only `failed`, so the operator had to
read the session's log to learn why)."""

from __future__ import annotations

import logging

import pytest

import signoff as so

from ._workers import is_, until, working


async def test_a_failed_turn_is_logged_with_why(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    agent = so.Agent(
        name="support",
        model=so.models.Scripted([so.ModelError("the provider answered 529 overloaded")]),
    )
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False) as worker,
    ):
        r = await front.generate("support", prompt="Refund order 1042")
        with caplog.at_level(logging.INFO, logger="signoff.worker"):
            async with working(worker):
                await until(lambda: is_(front, r.session_id, "failed"))
        (line,) = [rec for rec in caplog.records if "failed" in rec.getMessage()]
        assert line.levelname == "WARNING"
        assert line.getMessage() == (
            f"session {r.session_id}: failed (model_error: ModelError: the provider answered 529 "
            "overloaded); retryable"
        )
