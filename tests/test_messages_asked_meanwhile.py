"""A follow-up message whose request is answered or closed before the message is taken: it is
delivered anew, answering only a request that was open when it arrived, never one asked
meanwhile (a subagent's next question, or the turn's own once another answer resumed it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.testing import call, call_tools, reply, scripted_agent, sqlite_runtime

from ._steer import answered_first
from ._subagents import ALICE, Counted, events


def _bank_agents(seen: dict[str, Any], depth: int, after: Counted) -> list[so.Agent]:
    """`front` delegating to `bank` (through `depth - 1` agents between), whose workflow tool
    asks `Proceed?` and then which account."""

    @so.tool
    async def transfer(ctx: so.ToolContext) -> dict[str, Any]:
        """Move money, once told to and from where."""
        ok = await ctx.ask("Proceed?", options=["yes", "no"])
        account = await ctx.ask("Which account should it come from?")
        seen.update(proceed=ok.value, account=account.value)
        return seen

    agents = [
        scripted_agent("bank", [call_tools(call("transfer")), reply("bank done")], tools=[transfer])
    ]
    for level in range(1, depth):
        name = "front" if level == depth - 1 else f"desk{level}"
        below = agents[-1].name
        agents.append(
            scripted_agent(
                name,
                [
                    call_tools(call(below, message="move money")),
                    after if name == "front" else reply(f"{name} done"),
                ],
                tools=[so.delegate(below)],
            )
        )
    return agents


@pytest.mark.parametrize("depth", [2, 3], ids=["parent and child", "top, middle and leaf"])
async def test_a_message_to_a_mirror_answered_unseen_does_not_answer_the_next_question(
    tmp_path: Path, depth: int
) -> None:
    """The bank's `Proceed?` is answered on its own session without resuming (or by someone
    else just as Alice writes), and Alice replies `no` to the `Proceed?` the top session still
    shows. Her answer is refused there, which closes the mirror and lets the bank ask which
    account; the message was then taken as the answer to that question, asked after she
    wrote: the transfer came from account `no`. It is delivered as a message instead, and
    steers."""
    seen: dict[str, Any] = {}
    after = Counted("Stopped, as you said.")
    async with sqlite_runtime(tmp_path, *_bank_agents(seen, depth, after)) as rt:
        r = await rt.generate("front", prompt="go", auth=ALICE)
        [mirror] = r.pending
        assert mirror.question == "Proceed?"
        [leaf] = [p for p in await rt.pending() if p.child is None]
        await rt.respond(
            leaf.session_id,
            [so.InputResponse(request_id=leaf.id, option_id="yes")],
            principal=ALICE,
            resume=False,
        )
        assert [p.question for p in await rt.pending(session_id=r.session_id)] == ["Proceed?"]
        done = await rt.send(r.session_id, "no", principal=ALICE)
        assert seen == {}, "the message was taken as the answer to a question asked after it"
        assert (done.status, done.text) == ("completed", "Stopped, as you said.")
        assert after.calls == 1 and await rt.pending() == []
        assert mirror.child is not None
        for sid in {r.session_id, mirror.child.session_id, leaf.session_id}:
            asked = {
                q["id"]: q["question"]
                for e in await events(rt, sid)
                if e.type == "input.requested"
                for q in e.data["requests"]
            }
            closed = {
                asked[e.data["request_id"]]: (e.data["outcome"], e.data.get("answer"))
                for e in await events(rt, sid)
                if e.type == "input.resolved"
            }
            assert closed["Which account should it come from?"] == ("cancelled", None), sid
        said = [
            e.data["message"] for e in await events(rt, r.session_id) if e.type == "turn.message"
        ]
        assert said == ["no"]


def _plan_agent(after: Counted) -> so.Agent:
    """A turn whose tool asks for a plan (options only), then for notes (free text)."""

    @so.tool
    async def sign_up(ctx: so.ToolContext) -> str:
        """Sign up for a plan."""
        plan = await ctx.ask("Which plan?", options=["basic", "pro"], allow_text=False)
        notes = await ctx.ask("Any notes for the account manager?")
        return f"{plan.value}: {notes.value}"

    return scripted_agent(
        "sales", [call_tools(call("sign_up", call_id="s1")), after], tools=[sign_up]
    )


async def test_a_message_whose_question_another_answer_resumed_does_not_answer_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Alice sends `pro` for `Which plan?` as it is answered `basic` elsewhere (her other tab),
    resuming the turn, which asks for notes: her message, refused for the plan, was recorded
    as the notes, a question asked after she wrote. It steers instead, the notes withdrawn."""
    after = Counted("Noted.")
    async with sqlite_runtime(tmp_path, _plan_agent(after)) as rt:
        r = await rt.generate("sales", prompt="Sign me up", auth=ALICE)
        [question] = r.pending
        settle = so.Runtime._settle
        raced: list[bool] = []

        async def racing(runtime: so.Runtime, session_id: str, answers: Any, *a: Any, **k: Any):
            if not raced:  # the other answer lands between the message's check and its answer
                raced.append(True)
                other = await rt.respond(
                    session_id,
                    [so.InputResponse(request_id=question.id, option_id="basic")],
                    principal=ALICE,
                )
                assert [p.question for p in other.pending] == ["Any notes for the account manager?"]
            return await settle(runtime, session_id, answers, *a, **k)

        monkeypatch.setattr(so.Runtime, "_settle", racing)
        done = await rt.send(r.session_id, "pro", principal=ALICE)
        assert (done.status, done.text) == ("completed", "Noted.")
        resolved = [
            (e.data["outcome"], e.data.get("answer"))
            for e in await events(rt, r.session_id)
            if e.type == "input.resolved"
        ]
        assert resolved == [
            ("answered", {"value": "basic", "option_id": "basic", "text": None}),
            ("cancelled", None),
        ]
        said = [
            e.data["message"] for e in await events(rt, r.session_id) if e.type == "turn.message"
        ]
        assert said == ["pro"]


async def test_a_message_whose_question_was_answered_meanwhile_answers_the_next_one_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two questions are open when Alice's message arrives; the first is answered meanwhile
    (without resuming): her message answers the second, which she could see, as the first
    open request once the first closed."""
    after = Counted("All set.")

    @so.tool
    async def pick_plan(ctx: so.ToolContext) -> str:
        """Choose a plan."""
        return (await ctx.ask("Which plan?", options=["basic", "pro"], allow_text=False)).value

    @so.tool
    async def take_notes(ctx: so.ToolContext) -> str:
        """Ask for notes."""
        return (await ctx.ask("Any notes?")).value

    agent = scripted_agent(
        "sales",
        [call_tools(call("pick_plan", call_id="p1"), call("take_notes", call_id="n1")), after],
        tools=[pick_plan, take_notes],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("sales", prompt="Sign me up", auth=ALICE)
        assert [p.question for p in r.pending] == ["Which plan?", "Any notes?"]
        plan, notes = r.pending
        answered_first(monkeypatch, rt, plan.id, "basic", ALICE)
        done = await rt.send(r.session_id, "pro", principal=ALICE)
        assert (done.status, done.text) == ("completed", "All set.")
        answers = {
            e.data["request_id"]: e.data["answer"]["value"]
            for e in await events(rt, r.session_id)
            if e.type == "input.resolved"
        }
        assert answers == {plan.id: "basic", notes.id: "pro"}
