"""Edited arguments from the dashboard's approval form (`server/_dashboard_edits.py`): whether
they are an edit is the answer's rule, not the page's."""

from __future__ import annotations

from pathlib import Path

import signoff as so
from signoff.server import TokenAuth, create_app

from ._dashboard import csrf_of, signed_in, start
from .test_server_common import TOKENS, running

JSON = {"Accept": "application/json"}


def test_arguments_that_validate_to_the_proposal_are_no_edit(tmp_path: Path) -> None:
    """A reviewer cleared a key the form shows at its default: the page took the text for an
    edit, as it differs from the form, and said "Approved with edited arguments", the model
    told so, for the call as proposed. An edit that validates to the proposal is none."""

    @so.tool(approval=so.always())
    async def deploy(ref: str, dry_run: bool = False) -> str:
        """Deploy a ref."""
        return f"deployed {ref}"

    call = so.ToolCall(name="deploy", input={"ref": "v1"})
    script = [so.ModelResponse(tool_calls=[call]), so.ModelResponse(text="done")]
    agent = so.Agent(name="ops", model=so.models.Scripted(script), tools=[deploy])
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/ops.db")
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as base:
        body = start(base, "ops")
        rid = body["pending"][0]["id"]
        with signed_in(base) as c:
            page = c.get(f"/_signoff/sessions/{body['session_id']}").text
            assert "dry_run" in page  # the form shows the default
            form = {"csrf": csrf_of(page), "option": "approve", "edited_input": '{"ref": "v1"}'}
            r = c.post(f"/_signoff/requests/{rid}/respond", data=form, headers=JSON)
        assert r.status_code == 200, r.text
        assert r.json()["outcome"] == "approved" and r.json()["edited"] is False
    events = runtime.events_sync(body["session_id"])
    (settled,) = [e for e in events if e.type == "approval.settled"]
    assert settled.data["edited_input"] is None
    (done,) = [e for e in events if e.type == "tool.completed"]
    assert done.data["result"] == "deployed v1"
    runtime.close_sync()
