"""`so.models.Scripted`: what a script may hold, and the error when a session runs past its end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.testing import call, call_tools, reply, scripted_agent, sqlite_runtime


@pytest.mark.parametrize(
    ("steps", "where"),
    [
        (["hello"], "#1"),
        ([reply("ok"), {"text": "hi"}], "#2"),
        ([reply("ok"), None], "#2"),
    ],
)
def test_a_step_that_cannot_answer_is_refused_when_scripted(steps: list[Any], where: str) -> None:
    """Not at the first model call, as a TypeError inside a failed turn."""
    with pytest.raises(so.UsageError, match=where):
        so.models.Scripted(steps)
    with pytest.raises(so.UsageError, match=where):
        scripted_agent("a", steps)


@pytest.mark.parametrize("steps", [reply("ok"), "ok", ValueError("boom"), None])
def test_steps_that_are_not_a_sequence_are_refused_as_such(steps: Any) -> None:
    # A lone ModelResponse was iterated as pydantic fields: "step #1 is a tuple".
    with pytest.raises(so.UsageError, match="a list of steps"):
        so.models.Scripted(steps)


async def test_a_session_past_the_end_of_its_script_names_the_agent_and_the_length(
    tmp_path: Path,
) -> None:
    async with sqlite_runtime(tmp_path, scripted_agent("support", [reply("hi")])) as rt:
        first = await rt.generate("support", prompt="x")
        assert first.status == "completed"
        second = await rt.generate(session_id=first.session_id, prompt="again")
        assert second.status == "failed"
        message = (second.error or {})["message"]
        assert "ModelError" in message and "'support'" in message
        assert "1 response(s)" in message and "#2" in message and "repeat_last" in message


async def test_one_script_serves_two_sessions_and_two_runtimes_from_its_start(
    tmp_path: Path,
) -> None:
    """Responses are counted per session: a shared script does not run out sooner."""
    agent = scripted_agent("a", [reply("one"), reply("two")])
    async with (
        sqlite_runtime(tmp_path / "x", agent) as rt1,
        sqlite_runtime(tmp_path / "y", agent) as rt2,
    ):
        for rt in (rt1, rt1, rt2):
            r = await rt.generate("a", prompt="hi")
            assert r.status == "completed"
            r = await rt.generate(session_id=r.session_id, prompt="more")
            assert r.status == "completed"
            events = [e async for e in rt.events(r.session_id, follow=False)]
            texts = [e.data["text"] for e in events if e.type == "model.completed"]
            assert texts == ["one", "two"]


@pytest.mark.parametrize(
    ("steps", "problem"),
    [
        ([reply("ok"), lambda: reply("no")], "#2 .*takes the conversation"),
        ([lambda messages, extra: reply("no")], "#1 .*takes the conversation"),
        ([ValueError], "#1 is the exception class ValueError.*ValueError\\(\\.\\.\\.\\)"),
    ],
    ids=["no-argument", "two-arguments", "exception-class"],
)
def test_a_step_function_that_cannot_take_the_conversation_is_refused_when_scripted(
    steps: list[Any], problem: str
) -> None:
    """A function that cannot be called with the conversation, or an exception class (called
    with it, it returned an exception rather than raising one), is refused when scripted, not
    met as a TypeError or a 'returned ValueError(...)' inside a failed turn."""
    with pytest.raises(so.UsageError, match=problem):
        so.models.Scripted(steps)


def test_a_step_function_of_the_conversation_is_accepted_in_every_form() -> None:
    def plain(messages: list[so.Message]) -> so.ModelResponse:
        return reply("ok")

    async def later(messages: list[so.Message], *, note: str = "") -> so.ModelResponse:
        return reply("ok")

    def loose(*args: Any) -> so.ModelResponse:
        return reply("ok")

    assert len(so.models.Scripted([plain, later, loose]).steps) == 3


@pytest.mark.parametrize("repeat_last", ["no", 0, None])
def test_repeat_last_must_be_a_bool(repeat_last: Any) -> None:
    """`repeat_last="no"` was taken for its truth: the script repeated its last step."""
    with pytest.raises(so.UsageError, match="repeat_last must be True or False"):
        so.models.Scripted([reply("ok")], repeat_last=repeat_last)


def test_a_scripted_reviewer_of_more_than_one_step_is_refused_by_auto() -> None:
    """Each review is a conversation of its own: every review played step #1, so a script of
    [clear, caution] cleared the second call too, silently."""
    verdicts = [reply('{"verdict": "clear"}'), reply('{"verdict": "caution"}')]
    with pytest.raises(so.UsageError, match=r"first step.*2 steps"):
        so.auto(so.models.Scripted(verdicts))
    so.auto(so.models.Scripted(verdicts[:1]))  # one step: every review plays it, as it says


async def test_a_scripted_reviewer_decides_each_call_from_the_call_it_reads(
    tmp_path: Path,
) -> None:
    """What the refusal points to: one step, a function of the review's one message."""

    def review(conversation: list[so.Message]) -> so.ModelResponse:
        (asked,) = conversation
        assert isinstance(asked, so.UserMessage)
        large = '"amount": 1000' in asked.text
        return reply(f'{{"verdict": "{"caution" if large else "clear"}", "reason": "r"}}')

    @so.tool(approval=so.auto(so.models.Scripted([review])))
    async def pay(amount: float) -> float:
        """Pay."""
        return amount

    small, large = call_tools(call("pay", amount=1)), call_tools(call("pay", amount=1000))
    async with sqlite_runtime(tmp_path, scripted_agent("a", [small, large], tools=[pay])) as rt:
        r = await rt.generate("a", prompt="pay")
        assert [(p.action and p.action.input, p.auto_verdict) for p in r.pending] == [
            ({"amount": 1000}, "caution")
        ]


def test_a_script_made_afresh_after_a_restart_resumes_each_session_at_its_next_step(
    tmp_path: Path,
) -> None:
    """As docs/testing.md says: the step a session plays is counted from the store, not by the
    model, so a new runtime with a new Scripted model (a restarted process) neither replays the
    script from its start nor skips a step, in a parent and in its subagent's child session."""

    def agents() -> tuple[so.Agent, so.Agent]:
        @so.tool(approval=so.always())
        async def refund(amount: float) -> float:
            """Refund."""
            return amount

        child = [call_tools(call("refund", amount=5)), reply("refunded")]
        parent = [call_tools(call("billing", message="refund 5")), reply("all done")]
        return (
            scripted_agent("support", parent, tools=[so.delegate("billing")]),
            scripted_agent("billing", child, tools=[refund]),
        )

    with sqlite_runtime(tmp_path, *agents()) as rt:
        r = rt.generate_sync("support", prompt="refund")
        (request,) = r.pending
    with sqlite_runtime(tmp_path, *agents()) as rt:  # the same store, the script made again
        approve = so.InputResponse(request_id=request.id, option_id="approve")
        r = rt.respond_sync(r.session_id, [approve])
        assert (r.status, r.text) == ("completed", "all done")
        (done,) = [e for e in rt.events_sync(r.session_id) if e.type == "tool.completed"]
        assert (done.data["tool_name"], done.data["result"]) == ("billing", "refunded")


@pytest.mark.parametrize(
    "make",
    [
        lambda: so.models.Scripted([], repeat_last=True),
        lambda: scripted_agent("a", [], repeat_last=True),
    ],
    ids=["Scripted", "scripted_agent"],
)
def test_repeat_last_with_no_step_to_repeat_is_refused_when_scripted(make: Any) -> None:
    """It was accepted, and then every session's first model call failed its turn saying to
    "script more, or pass repeat_last=True", which was passed."""
    with pytest.raises(so.UsageError, match="repeat_last=True has no step to repeat"):
        make()


async def test_a_script_past_its_end_suggests_repeat_last_only_when_it_is_off(
    tmp_path: Path,
) -> None:
    model = so.models.Scripted([reply("hi")], repeat_last=True)
    model.steps.clear()  # emptied after it was made: there is nothing to repeat
    agent = so.Agent(name="a", model=model)
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="x")
    message = (r.error or {})["message"]
    assert r.status == "failed" and message.endswith("(script more)"), message
