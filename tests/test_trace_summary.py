"""A session page's trace rows on a damaged log: a field the fold never reads (a parked turn's
`request_ids`, a failure's `error`, a reply's `tool_calls`, a usage figure) may hold anything
there, and the row says what it can of it rather than failing the page (a 500)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

import signoff as so
from signoff._events import EventType
from signoff.server import create_app
from signoff.server._trace_summary import summary
from signoff.testing import Flaky, call, call_tools, reply, scripted_agent

from .test_channels_hub_damaged import rewrite_events


def _line(type_: EventType, **data: Any) -> str:
    e = so.Event(session_id="ses_1", seq=2, type=type_, at=2.0, turn_id="trn_1", data=data)
    return "".join(text for text, _ in summary(e, {}))


@pytest.mark.parametrize(
    ("type_", "data", "line"),
    [
        ("turn.waiting", {"on": "input", "request_ids": 7}, "Waiting on input"),
        ("turn.waiting", {"on": "input", "request_ids": None}, "Waiting on input"),
        ("turn.waiting", {"on": "input", "request_ids": [7, {"id": "x"}]}, "Waiting on input"),
        ("turn.failed", {"error": "model unavailable"}, "model unavailable"),
        ("turn.failed", {"error": {"message": 5}}, "5"),
        ("turn.failed", {"error": ["boom"]}, "['boom']"),
        ("turn.failed", {"error": 0}, "failed"),
        ("model.completed", {"text": "hi", "tool_calls": 7}, "“hi”"),
        ("model.completed", {"tool_calls": [5, {"name": "refund"}]}, "calls ?, refund"),
        ("input.requested", {"requests": 7}, "Waiting for a person: "),
        (
            "input.requested",
            {"requests": [5, {"action": "x", "question": "Which?"}]},
            "Waiting for a person: ?, Which?",
        ),
        (
            "subagent.spent",
            {"session_id": "ses_2", "delegated": {"input_tokens": "9", "output_tokens": 1e999}},
            "Subagent ses_2 spent 0 tokens (counted after its turn)",
        ),
        (
            "model.spent",
            {"usage": {"input_tokens": [1], "output_tokens": 4.0}},
            "Billed 4 tokens after the turn ended (counted)",
        ),
        (
            "model.paused",
            {"usage": {"input_tokens": None, "output_tokens": True}},
            "The model's reply paused (its server tools ran): 0 tokens",
        ),
    ],
)
def test_a_damaged_events_row_says_what_it_can(
    type_: EventType, data: dict[str, Any], line: str
) -> None:
    """Each once raised (TypeError, AttributeError, ValueError, OverflowError), failing the
    session page: a parked turn's `request_ids` of 7, a failure's `error` as text, a reply's
    `tool_calls` that is no list of objects, a usage count that is no number."""
    assert _line(type_, **data) == line


def test_a_step_that_raised_says_so_in_its_row() -> None:
    """A journaled step's row named the tool and step alone, the same for one that raised (it
    records `error` instead of `result`) as for one that returned: it says what it raised."""
    assert _line("tool.step", tool_name="pay", name="lookup", result=None) == "pay lookup"
    failed = {"type": "RuntimeError", "message": "card declined"}
    assert _line("tool.step", tool_name="pay", name="charge", error=failed) == (
        "pay charge raised RuntimeError: card declined"
    )
    assert _line("tool.step", tool_name="pay", name="charge", error={"type": "KeyError"}) == (
        "pay charge raised KeyError"
    )
    assert _line("tool.step", tool_name="pay", name="charge", error="boom") == (
        "pay charge raised boom"
    )


@so.tool(approval=so.always())
async def deploy(version: str) -> str:
    """Deploy a version."""
    return f"deployed {version}"


async def _page(rt: so.Runtime, session_id: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=create_app(rt, dev=True), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        return await c.get(f"/_signoff/sessions/{session_id}")


async def test_a_session_page_shows_a_damaged_parked_turn_and_names_a_damaged_failure(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A parked turn whose `turn.waiting` names its requests as 7 made `GET /_signoff/sessions/{id}`
    a 500 (the fold never reads them): the page shows it now, its request still open. A failed
    turn whose `error` is text did too, in its header, as every reader of the turn's error takes
    it for an object (`GET /v1/sessions/{id}` as well): the fold names that event as malformed,
    as it names the other fields later code reads, and the page is a 503 `store_error`, as for
    them, the event named in the server's log."""
    agents = [
        scripted_agent("ops", [call_tools(call("deploy", version="2.0"))], tools=[deploy]),
        scripted_agent("flaky", [Flaky(reply("hi"), failures=9, error=RuntimeError("boom"))]),
    ]
    async with so.Runtime(agents, store=store_url) as rt:
        parked = await rt.generate("ops", prompt="deploy 2.0")
        failed = await rt.generate("flaky", prompt="hello")
    assert parked.status == "waiting" and failed.status == "failed"

    def damage(kind: str, data: Any) -> Any:
        if kind == "turn.waiting":
            return {**data, "request_ids": 7}
        if kind == "turn.failed":
            return {**data, "error": "the model is down"}
        return data

    rewrite_events(store_url, parked.session_id, damage)
    rewrite_events(store_url, failed.session_id, damage)
    async with so.Runtime(agents, store=store_url) as rt:
        page = await _page(rt, parked.session_id)
        assert page.status_code == 200 and "Waiting on input" in page.text
        assert f'data-request-id="{parked.pending[0].id}"' in page.text
        page = await _page(rt, failed.session_id)
        assert (page.status_code, page.json()["error"]["code"]) == (503, "store_error")
        assert "(turn.failed) is malformed: TypeError" in caplog.text  # the server's log says
        with pytest.raises(so.StoreError, match=r"\(turn.failed\) is malformed"):
            await rt.state(failed.session_id)
