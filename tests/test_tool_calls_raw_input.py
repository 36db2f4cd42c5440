"""A validator that sees the model's raw arguments (`mode="before"`), or a body holding them
(`Any`), got the call's stored input itself: one changing it in place (a normalising idiom)
changed the input the model was sent back, and what a body's re-run got (validated again from
it) differed from a re-run in another process, which reads the log. Each validation that lets
code see raw input is of a copy of it now (`Tool.validate`, `raw_copy`)."""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

import signoff as so
from signoff.testing import Capture, call, call_tools, reply, scripted_agent, tool_results

GIVEN: dict[str, Any] = {"mail": {"to": "  Bob@X.COM "}}


class Mail(BaseModel):
    to: str
    body: str

    @model_validator(mode="before")
    @classmethod
    def _normal(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data["to"] = data["to"].strip().lower()  # in place, on the model's own arguments
            data.setdefault("body", "(empty)")
        return data


class Job(BaseModel):
    steps: list[str]

    @model_validator(mode="before")
    @classmethod
    def _audited(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("steps"), list):
            data["steps"].append("audit")
        return data


class StrictJob(BaseModel):
    model_config = ConfigDict(strict=True)
    steps: list[str]
    on: date

    @field_validator("steps", mode="before")
    @classmethod
    def _audited(cls, steps: Any) -> Any:
        if isinstance(steps, list):
            steps.append("audit")
        return steps


async def test_the_model_is_sent_its_call_as_it_gave_it(tmp_path: Path) -> None:
    """Its next request held the input the validator made, where the log (and a resumed
    process) keeps what the model gave; the body gets the validated input all the same."""

    @so.tool
    async def send(mail: Mail) -> str:
        """Send mail."""
        return f"sent to {mail.to}: {mail.body}"

    seen = Capture(reply("ok"))
    proposal = call_tools(so.ToolCall(id="c1", name="send", input=GIVEN))
    agent = scripted_agent("a", [proposal, seen], tools=[send])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("a", prompt="go")
        assert r.status == "completed", r
        events = [e.data async for e in rt.events(r.session_id, follow=False)]
    [asked] = [m for m in seen.last if isinstance(m, so.AssistantMessage) and m.tool_calls]
    assert asked.tool_calls[0].input == GIVEN
    assert [c["input"] for e in events for c in e.get("tool_calls", [])] == [GIVEN]
    [result] = tool_results(seen.last)
    assert result.content == "sent to bob@x.com: (empty)"


def _deploy(runs: list[list[str]], changes: bool = False) -> so.Tool:
    """A workflow tool that asks a question: its body runs again once it is answered."""
    if changes:

        @so.tool(name="deploy")
        async def deploy_dict(ctx: so.ToolContext, job: dict[str, Any]) -> str:
            """Deploy."""
            job["steps"].append("audit")  # the body's own change, of a value `Any` keeps
            runs.append(list(job["steps"]))
            region = (await ctx.ask("Region?", options=["eu", "us"])).value
            return f"{region}: {job['steps']}"

        return deploy_dict

    @so.tool
    async def deploy(ctx: so.ToolContext, job: Job) -> str:
        """Deploy."""
        runs.append(list(job.steps))
        region = (await ctx.ask("Region?", options=["eu", "us"])).value
        return f"{region}: {job.steps}"

    return deploy


async def _answered(store: str, runs: list[list[str]], changes: bool, elsewhere: bool) -> str:
    """The result of a `deploy` call whose question is answered in the runtime that asked, or
    (`elsewhere`) in another one, as by a server restarted since."""

    def agent() -> so.Agent:
        proposal = call_tools(call("deploy", job={"steps": ["build"]}))
        return scripted_agent("a", [proposal, reply("ok")], tools=[_deploy(runs, changes)])

    async with so.Runtime([agent()], store=store) as rt:
        r = await rt.generate("a", prompt="go")
        [question] = r.pending
        answer = so.InputResponse(request_id=question.id, option_id="eu")
        if not elsewhere:
            r = await rt.respond(r.session_id, [answer])
    if elsewhere:
        async with so.Runtime([agent()], store=store) as rt:
            r = await rt.respond(r.session_id, [answer])
    async with so.Runtime([agent()], store=store) as rt:
        events = [e async for e in rt.events(r.session_id, follow=False)]
    [done] = [e.data["result"] for e in events if e.type == "tool.completed"]
    return str(done)


async def test_a_rerun_gets_what_its_first_run_got_in_any_process(tmp_path: Path) -> None:
    """Answered in the process that asked, the re-run got the steps with "audit" twice, as
    the first validation had added it to the call's input; answered in another, once. The
    same for a body that changes a value it holds as the model gave it (`dict[str, Any]`)."""
    for changes in (False, True):
        for elsewhere in (False, True):
            runs: list[list[str]] = []
            store = f"sqlite:///{tmp_path}/{changes}-{elsewhere}.db"
            done = await _answered(store, runs, changes, elsewhere)
            assert (changes, elsewhere, done) == (changes, elsewhere, "eu: ['build', 'audit']")
            assert runs == [["build", "audit"], ["build", "audit"]]


def test_a_strict_model_is_tried_as_json_on_the_input_given() -> None:
    """A strict model's Python pass, which refuses a date as text, ran its validator on the
    input itself: the JSON pass then read it changed, and added "audit" again."""

    def plan(job: StrictJob) -> str:
        """Plan a job."""
        return ""

    raw = {"job": {"steps": ["build"], "on": "2024-05-01"}}
    validated: Any = so.tool(plan).validate(raw)
    assert validated.job.steps == ["build", "audit"]
    assert raw == {"job": {"steps": ["build"], "on": "2024-05-01"}}
