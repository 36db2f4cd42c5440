"""The dashboard's relative times ("a few seconds ago", "in 10 minutes") are reckoned by the
runtime's clock (`Runtime.now()`), which stamped the times it shows and judges its deadlines:
on PostgreSQL the database's, or a clock given to the runtime, however far this machine's wall
clock is off it. The page gives the browser that time too, so its script refreshing them does
not fall back to the viewer's clock."""

from __future__ import annotations

import re
import time

import pytest
from starlette.testclient import TestClient

import signoff as so
from signoff.server import TokenAuth, create_app
from signoff.testing import ManualClock, call, call_tools, scripted_agent

from .test_server_common import TOKENS, auth

SKEWS = [pytest.param(3600.0, id="an-hour-ahead"), pytest.param(-3600.0, id="an-hour-behind")]
_TIME = re.compile(r"<time\b([^>]*)>([^<]*)</time>")


def _desk() -> so.Agent:
    """Asks to approve a refund, for 10 minutes."""

    @so.tool(approval=so.always(expires_in=600))
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return "ok"

    return scripted_agent(
        "desk", [call_tools(call("refund", order_id="1"))], tools=[refund], repeat_last=True
    )


def _times(html: str) -> list[str]:
    """The relative times a page shows (its absolute ones, `2026-12-02 07:00:00 UTC`, left)."""
    found = [text for _, text in _TIME.findall(html)]
    return [text for text in found if text.endswith(" ago") or text.startswith("in ")]


def _pages_show_the_runtimes_time(runtime: so.Runtime) -> float:
    """Start a turn that waits on the approval and read every page showing its times: each
    says it was a few seconds ago, or expires in 10 minutes. Returns the time the page gave the
    browser as the runtime's."""
    app = create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None, close_runtime=True)
    with TestClient(app) as client:
        alice = auth("alice-token")
        r = client.post("/v1/sessions", json={"agent": "desk", "message": "hi"}, headers=alice)
        assert r.status_code == 201 and r.json()["status"] == "waiting", r.text
        sid = r.json()["session_id"]
        queue = client.get("/_signoff/", headers=alice)
        assert queue.status_code == 200, queue.text
        assert _times(queue.text) == ["a few seconds ago", "in 10 minutes"]
        fragment = client.get("/_signoff/fragments/queue", headers=alice)
        assert _times(fragment.text) == ["a few seconds ago", "in 10 minutes"]
        listing = client.get("/_signoff/sessions", headers=alice)
        assert _times(listing.text) == ["a few seconds ago"] * 2  # updated, created
        page = client.get(f"/_signoff/sessions/{sid}", headers=alice)
        assert "a few seconds ago" in _times(page.text)
        assert set(_times(page.text)) <= {"a few seconds ago", "in 10 minutes"}
        parts = client.get(f"/_signoff/fragments/sessions/{sid}", headers=alice).json()
        shown = _times(parts["header"]) + _times(parts["pending"]) + _times(parts["rows"])
        assert "a few seconds ago" in shown and "in 10 minutes" in shown
        assert set(shown) <= {"a few seconds ago", "in 10 minutes"}
        rid = r.json()["pending"][0]["id"]
        body = {"approvals": [{"id": rid, "approved": False, "reason": "not today"}]}
        denied = client.post(f"/v1/sessions/{sid}/approvals", json=body, headers=alice)
        assert denied.status_code == 200, denied.text
        audit = client.get("/_signoff/audit", headers=alice)
        assert _times(audit.text) == ["a few seconds ago"]  # when it was asked
        now = re.search(r'<body[^>]* data-now="([^"]+)"', queue.text)
        assert now, "the page gives the browser no time of the runtime's"
        return float(now.group(1))


@pytest.mark.parametrize("skew", SKEWS)
def test_pages_reckon_times_by_a_clock_given_to_the_runtime(store_url: str, skew: float) -> None:
    """A runtime given a clock an hour off this machine's (a test's, or one the application
    keeps): the machine's clock said the request was asked an hour ago (or in an hour) and
    expired 50 minutes ago (or expires in an hour)."""
    clock = ManualClock(time.time() + skew)
    runtime = so.Runtime([_desk()], store=store_url, clock=clock)
    # the page gives it to the millisecond, in a fixed form (a HEAD answers with its length)
    assert _pages_show_the_runtimes_time(runtime) == pytest.approx(clock.now, abs=0.0005)


@pytest.mark.parametrize("skew", SKEWS)
def test_pages_reckon_times_by_the_database_clock(
    pg_store_url: str, skew: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL the runtime's clock is the database's: this machine's wall clock an hour
    off it changes nothing the pages show."""
    runtime = so.Runtime([_desk()], store=pg_store_url)
    wall = time.time
    monkeypatch.setattr(time, "time", lambda: wall() + skew)  # this machine's clock is off
    before = wall()
    shown = _pages_show_the_runtimes_time(runtime)
    assert before - 5 <= shown <= wall() + 5  # the database's time, which the real clock keeps


def test_a_date_centuries_away_reads_in_years_not_hundreds_of_digits() -> None:
    """A request's deadline `expires_in=1e300` away (valid) was shown as "in 1157407407…days",
    a 304-character number of days; as the terminal does, a century or more reads in years,
    and past 9999 of them "over 9999 years"."""
    from signoff.server._pages import env

    def ago(ts: float) -> str:
        return env.from_string("{{ ts | ago }}").render(now=now, ts=ts)

    now = 1.7e9
    year = 365.25 * 86400
    shown = [
        ago(now + s)
        for s in (2 * 86400, 36524 * 86400, 100 * year, 9999 * year + 1, 10_000 * year, 1e300)
    ]
    assert shown == [
        "in 2 days",
        "in 36524 days",
        "in 100 years",
        "in 9999 years",
        "in over 9999 years",
        "in over 9999 years",
    ]
    assert ago(now - 1e12) == "over 9999 years ago"
