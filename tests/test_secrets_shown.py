"""A tool's secret input in the views of the event log: the dashboard's trace and event page and
`signoff events` show a call's input as spans do, secrets masked (masked whole where the agent
is unknown), while the log itself keeps the input as the model gave it, for the call to run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import SecretStr
from starlette.testclient import TestClient

import signoff as so
from signoff._trace_content import MASK, shown_data
from signoff.server import TokenAuth, create_app
from signoff.testing import call, call_tools, reply

from ._cli import invoke
from ._dashboard import csrf_of
from .test_server_common import TOKENS, auth

SECRET = "hunter2-s3cret"


@so.tool(approval=so.always())
async def login(user: str, password: SecretStr) -> str:
    """Log in."""
    return f"in as {user}"


def _agent(name: str = "locksmith") -> so.Agent:
    asked = call_tools(call("login", user="bob", password=SECRET))
    model = so.models.Scripted([asked, reply("in")])
    return so.Agent(name=name, model=model, tools=[login])


def secret_runtime() -> so.Runtime:
    """What `signoff events tests.test_secrets_shown:secret_runtime` loads: the agent, whose
    store `--store` replaces."""
    return so.Runtime([_agent()], store="sqlite:///:memory:")


def _parked(url: str) -> str:
    """A session whose model called `login` with the secret, waiting on its approval."""
    rt = so.Runtime([_agent()], store=url)
    try:
        r = rt.generate_sync("locksmith", "log in")
        assert r.status == "waiting"
        (asked,) = r.pending
        assert asked.action is not None and asked.action.input["password"] == MASK
        # The log keeps the input as the model gave it: the approved call runs with it.
        (completed,) = [e for e in rt.events_sync(r.session_id) if e.type == "model.completed"]
        assert completed.data["tool_calls"][0]["input"] == {"user": "bob", "password": SECRET}
        return r.session_id
    finally:
        rt.close_sync()


def test_a_calls_input_is_shown_by_its_tool_or_masked_whole_without_the_agent() -> None:
    data = {
        "text": "",
        "tool_calls": [
            {"id": "c1", "name": "login", "input": {"user": "bob", "password": SECRET}},
            {"id": "c2", "name": "nope", "input": {"password": "plain"}},
        ],
    }
    kept = json.dumps(data)
    shown = shown_data("model.completed", data, {"login": login})
    assert shown["tool_calls"][0]["input"] == {"user": "bob", "password": MASK}
    assert shown["tool_calls"][1]["input"] == {"password": "plain"}  # no tool: as spans show it
    blind = shown_data("model.completed", data, None)
    assert [c["input"] for c in blind["tool_calls"]] == [MASK, MASK]
    assert [c["name"] for c in blind["tool_calls"]] == ["login", "nope"]
    assert json.dumps(data) == kept  # the event's own data is left as it was
    other = {"call_id": "c1", "tool_name": "login", "input": SECRET}
    assert shown_data("tool.started", other, None) is other


@pytest.mark.parametrize("knows_agent", [True, False], ids=["agent", "no-agent"])
def test_the_dashboard_shows_no_secret_of_a_calls_input(tmp_path: Path, knows_agent: bool) -> None:
    """The request's card masked the password while the same session page's trace row, and the
    event's own page, showed the model's call with it in clear."""
    url = f"sqlite:///{tmp_path}/s.db"
    sid = _parked(url)
    runtime = so.Runtime([_agent()] if knows_agent else [], store=url)
    app = create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None)
    with TestClient(app, base_url="https://dash.example") as c:
        page = c.get("/_signoff/login")
        c.post("/_signoff/login", data={"token": "admin-token", "csrf": csrf_of(page.text)})
        trace = c.get(f"/_signoff/sessions/{sid}")
        assert trace.status_code == 200
        assert SECRET not in trace.text
        event = c.get(f"/_signoff/sessions/{sid}/events/3")
        assert event.status_code == 200
        shown = json.loads(event.text)
        assert shown["tool_calls"][0]["name"] == "login"
        expected = {"user": "bob", "password": MASK} if knows_agent else MASK
        assert shown["tool_calls"][0]["input"] == expected
        # The API's stream is the log as stored (docs/server.md says so).
        raw = c.get(f"/v1/sessions/{sid}/events?follow=false", headers=auth("admin-token"))
        assert SECRET in raw.text


def test_signoff_events_shows_no_secret_of_a_calls_input(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    sid = _parked(url)
    target = "tests.test_secrets_shown:secret_runtime"
    for args, expected in [
        ([], MASK),  # only a store: the tool, and so which parameter is secret, is unknown
        ([target], {"user": "bob", "password": MASK}),
    ]:
        lines = invoke("events", sid, *args, "--store", url)
        assert lines.exit_code == 0, lines.output
        assert SECRET not in lines.output
        assert f"login({json.dumps(expected, separators=(',', ':'))})" in lines.output.replace(
            " ", ""
        ), lines.output
        printed = invoke("events", sid, *args, "--store", url, "--json")
        assert printed.exit_code == 0, printed.output
        assert SECRET not in printed.output
        events = [json.loads(line) for line in printed.output.splitlines()]
        (completed,) = [e for e in events if e["type"] == "model.completed"]
        assert completed["data"]["tool_calls"][0]["input"] == expected
