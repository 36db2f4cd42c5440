"""The dashboard's script keeps its relative times true by the server's clock, which the page
gives it (`data-now`), not by the browser's: a viewer whose computer is an hour off still reads
that a request was asked a few seconds ago (Playwright's fake clock stands for that computer)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from playwright.sync_api import Page, expect

from ._dashboard_browser import base, browser, page, start

__all__ = ["base", "browser", "page"]  # the fixtures, used by name


@pytest.mark.parametrize("hours", [1, -1], ids=["an-hour-ahead", "an-hour-behind"])
def test_the_script_refreshes_ages_by_the_servers_clock(page: Page, base: str, hours: int) -> None:
    rid = start(base)["pending"][0]["id"]
    page.clock.install(time=datetime.now(UTC) + timedelta(hours=hours))
    page.goto("/_signoff/")
    asked = page.locator(f"[data-request-id='{rid}'] time[data-ts]").first
    expect(asked).to_have_text("a few seconds ago")  # as the server wrote it
    page.clock.run_for(21_000)  # the script rewrites every such time each 20 s
    expect(asked).to_have_text("a few seconds ago")  # the browser's clock said an hour


def test_the_script_shows_a_date_centuries_away_in_years(page: Page, base: str) -> None:
    """The script rewrote a deadline `expires_in=1e300` away as "in 1.157e+295 days"; it reads
    as the server writes it, in years, and past 9999 of them "over 9999 years"."""
    page.clock.install(time=datetime.now(UTC))
    page.goto("/_signoff/")
    year = 365.25 * 86400
    now = datetime.now(UTC).timestamp()
    page.evaluate(
        """(times) => times.forEach(([id, ts]) => {
            const el = document.createElement("time");
            el.id = id;
            el.dataset.ts = String(ts);
            document.body.append(el);
        })""",
        [["days", now + 3 * 86400 + 60], ["years", now + 150.5 * year], ["far", 1e300]],
    )
    page.clock.run_for(21_000)  # the script rewrites every such time each 20 s
    expect(page.locator("#days")).to_have_text("in 3 days")
    expect(page.locator("#years")).to_have_text("in 150 years")
    expect(page.locator("#far")).to_have_text("in over 9999 years")
