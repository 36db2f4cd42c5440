"""Session limits: a spent token or cost budget parks the turn on a `session-limit` request."""

import asyncio
import dataclasses
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff._budgets import own_left
from signoff._engine import Driver
from signoff.models._scripted import Step
from signoff.testing import call, call_tools, reply, scripted_agent, timeline

from ._models import Capped

ALICE = so.Principal(authenticator="test", principal_id="alice")


@so.tool
async def lookup(n: int) -> int:
    """Look something up."""
    return n


def costly(tokens: int) -> so.ModelResponse:
    step = call_tools(call("lookup", n=1))
    return so.ModelResponse(
        tool_calls=step.tool_calls, usage=so.Usage(input_tokens=0, output_tokens=tokens)
    )


def agent(**limits: object) -> so.Agent:
    steps = [costly(60), costly(60), costly(60), costly(60), reply("finished")]
    return scripted_agent("a", steps, tools=[lookup], limits=so.Limits(**limits))  # type: ignore[arg-type]


async def test_a_spent_budget_asks_to_continue_or_stop(tmp_path: Path) -> None:
    async with so.Runtime([agent(max_tokens=100)], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        assert r.status == "waiting"
        (req,) = r.pending
        assert req.kind == "session-limit"
        assert [o.id for o in req.options] == ["continue", "stop"]
        assert "120 of max_tokens=100" in (req.question or "")
        # A follow-up message naming an option answers it; the budget doubles.
        r = await rt.send(r.session_id, "continue", principal=ALICE)
        assert r.status == "waiting"
        assert "240 of max_tokens=200" in (r.pending[0].question or "")
        r = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=r.pending[0].id, option_id="continue")],
            principal=ALICE,
        )
        assert r.status == "completed"
        assert r.text.endswith("finished")
        events = [e async for e in rt.events(r.session_id, follow=False)]
        kinds = [
            line
            for line in timeline(events)
            if line.startswith(("input.", "turn.waiting", "turn.completed"))
        ]
        assert kinds[0].startswith("input.requested")
        assert any(line.startswith("input.resolved") for line in kinds)
        assert kinds[-1].startswith("turn.completed")


async def test_stop_ends_the_turn_and_the_limit_survives_a_new_process(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    async with so.Runtime([agent(max_cost_usd=1.0, max_tokens=100)], store=url) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        rid = r.pending[0].id
    async with so.Runtime([agent(max_cost_usd=1.0, max_tokens=100)], store=url) as rt2:
        r = await rt2.respond(
            r.session_id, [so.InputResponse(request_id=rid, option_id="stop")], principal=ALICE
        )
        assert r.status == "failed"
        assert r.error is not None and r.error["code"] == "session_limit_reached"
        assert "chose to stop" in r.error["message"]
        assert not r.retryable


async def test_a_scheduled_turn_has_nobody_to_ask(tmp_path: Path) -> None:
    async with so.Runtime([agent(max_tokens=100)], store=f"sqlite:///{tmp_path}/s.db") as rt:
        with pytest.raises(so.SessionLimitReached) as info:
            await rt.schedule("a", "nightly run")
        assert "nobody can raise the budget" in str(info.value)
        assert await rt.pending() == []


async def test_a_bad_answer_to_the_limit_prompt_changes_nothing(tmp_path: Path) -> None:
    async with so.Runtime([agent(max_tokens=100)], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        before = [e.seq async for e in rt.events(r.session_id, follow=False)]
        with pytest.raises(so.InvalidAnswer):
            await rt.respond(
                r.session_id,
                [so.InputResponse(request_id=r.pending[0].id, option_id="more")],
                principal=ALICE,
            )
        with pytest.raises(so.InvalidAnswer):
            await rt.respond(
                r.session_id,
                [so.InputResponse(request_id=r.pending[0].id, text="sure")],
                principal=ALICE,
            )
        after = [e.seq async for e in rt.events(r.session_id, follow=False)]
        assert before == after


async def test_an_input_hash_on_the_limit_prompt_is_refused(store_url: str) -> None:
    """The prompt to continue is bound to no call, so no input hash can be its: an answer
    naming one is refused, on either store, and changes nothing."""
    async with so.Runtime([agent(max_tokens=100)], store=store_url) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        (request,) = r.pending
        assert (request.kind, request.action) == ("session-limit", None)
        before = [e.seq async for e in rt.events(r.session_id, follow=False)]
        with pytest.raises(so.InvalidAnswer, match="bound to no call: it takes no input_hash"):
            await rt.respond(
                r.session_id,
                [so.InputResponse(request_id=request.id, option_id="stop", input_hash="sha256:x")],
                principal=ALICE,
            )
        assert [e.seq async for e in rt.events(r.session_id, follow=False)] == before
        answered = so.InputResponse(request_id=request.id, option_id="stop")
        assert (await rt.respond(r.session_id, [answered], principal=ALICE)).status != "waiting"


@pytest.mark.parametrize(
    "bad",
    [
        {"ttl": -1},
        {"ttl": 0},
        {"ttl": "1h"},
        {"ttl": timedelta(seconds=-5)},
        {"max_steps": 0},
        {"max_steps": 2.5},
        {"max_messages": 0},
        {"max_tokens": -10},
        {"max_tokens": True},
        {"max_cost_usd": -1.0},
        {"max_cost_usd": float("nan")},
        {"max_calls_per_response": 0},
        {"max_calls_per_response": 2.5},
        {"max_calls_per_response": True},
    ],
    ids=str,
)
def test_limits_that_cannot_work_are_usage_errors(bad: dict[str, Any]) -> None:
    # A negative TTL would create a session that is expired before its first turn.
    with pytest.raises(so.UsageError):
        so.Limits(**bad)


def test_budgets_past_what_can_be_added_up_count_as_the_most() -> None:
    # Taken as given, 1e308 made each model step raise a raw OverflowError (10**5000 a
    # ValueError), the session left running; `sys.maxsize` for "no bound" worked, and does.
    huge = so.Limits(max_tokens=10**5000, max_cost_usd=1e308)
    assert (huge.max_tokens, huge.max_cost_usd) == (2**53 - 1, 1e18)
    assert so.Limits(max_tokens=sys.maxsize).max_tokens == 2**53 - 1
    exact = so.Limits(max_tokens=2**53 - 1, max_cost_usd=1e18)
    assert (exact.max_tokens, exact.max_cost_usd) == (2**53 - 1, 1e18)


async def test_a_budget_of_1e308_runs_a_priced_model(tmp_path: Path) -> None:
    model = so.models.Scripted([reply("hi", usage=so.Usage(input_tokens=3, output_tokens=2))])
    model.price_per_mtok = (2.0, 8.0)  # type: ignore[attr-defined]
    agent = so.Agent(name="a", model=model, limits=so.Limits(max_cost_usd=1e308))
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("a", prompt="hi")
        assert (r.status, r.text) == ("completed", "hi")


def test_a_ttl_no_float_holds_is_a_usage_error() -> None:
    """`Limits(ttl=10**400)` was taken, and every session under it failed with an
    `OverflowError` when it was created."""
    with pytest.raises(so.UsageError, match="ttl"):
        so.Limits(ttl=10**400)
    with pytest.raises(so.UsageError, match="max_cost_usd"):
        so.Limits(max_cost_usd=10**400)


async def test_max_steps_ends_the_turn_and_a_retry_cannot_lift_it(tmp_path: Path) -> None:
    """A turn that keeps calling tools fails with `session_limit_reached` at `max_steps` model
    responses, not retryable; the next message starts a turn with a fresh count."""
    async with so.Runtime([agent(max_steps=2)], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        assert r.status == "failed" and not r.retryable
        assert r.error is not None and r.error["code"] == "session_limit_reached"
        assert "max_steps=2" in r.error["message"]
        lines = timeline([e async for e in rt.events(r.session_id, follow=False)])
        assert lines.count("model.completed") == 2
        assert lines.count("tool.completed lookup ok") == 2
        again = await rt.generate(session_id=r.session_id, prompt="go on", auth=ALICE)
        assert again.status == "failed"  # two more steps, then the same bound
        lines = timeline([e async for e in rt.events(r.session_id, follow=False)])
        assert lines.count("model.completed") == 4
        with pytest.raises(so.SessionLimitReached, match="max_steps=2"):
            await rt.schedule("a", "nightly")  # a scheduled turn raises it, like a budget


async def _seqs(rt: so.Runtime, session_id: str) -> list[int]:
    return [e.seq async for e in rt.events(session_id, follow=False)]


async def test_retrying_a_turn_failed_at_max_steps_changes_nothing(tmp_path: Path) -> None:
    """A retry (`generate(session_id=...)` with no prompt) cannot lift `max_steps`: it returns
    the same failure and appends nothing, rather than another `turn.failed` each time."""
    url = f"sqlite:///{tmp_path}/s.db"
    async with so.Runtime([agent(max_steps=2)], store=url) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        assert r.status == "failed" and not r.retryable
        before = await _seqs(rt, r.session_id)
        for _ in range(2):
            again = await rt.generate(session_id=r.session_id, auth=ALICE)
            assert (again.status, again.error, again.retryable) == ("failed", r.error, False)
            assert again.turn_id == r.turn_id
        assert await _seqs(rt, r.session_id) == before
    async with so.Runtime([agent(max_steps=2)], store=url, inline=False) as front:
        # Not `running`: no worker can do anything with it either.
        again = await front.generate(session_id=r.session_id, auth=ALICE)
        assert (again.status, again.retryable) == ("failed", False)
        assert [s.status for s in await front.sessions()] == ["failed"]
        assert await _seqs(front, r.session_id) == before


async def test_retrying_a_scheduled_turn_over_its_budget_changes_nothing(tmp_path: Path) -> None:
    """A scheduled turn whose budget nobody can raise fails for good: retrying it appends
    nothing and returns the same failure."""
    async with so.Runtime([agent(max_tokens=100)], store=f"sqlite:///{tmp_path}/s.db") as rt:
        with pytest.raises(so.SessionLimitReached) as info:
            await rt.schedule("a", "nightly run")
        [session] = await rt.sessions()
        assert info.value.session_id == session.id
        before = await _seqs(rt, session.id)
        again = await rt.generate(session_id=session.id)
        assert again.status == "failed" and not again.retryable
        assert "nobody can raise the budget" in str((again.error or {}).get("message"))
        assert await _seqs(rt, session.id) == before


@pytest.mark.parametrize(
    "model",
    [
        lambda **kw: so.models.OpenAIChat("ft:gpt-4o-mini:acme::a1b2c3", api_key="k", **kw),
        lambda **kw: so.models.OpenAIChat("qwen3:8b", base_url="http://127.0.0.1:9/v1", **kw),
        lambda **kw: so.models.Anthropic("claude-by-another-name", api_key="k", **kw),
    ],
    ids=["fine-tune", "local", "anthropic-alias"],
)
def test_a_cost_budget_over_a_model_of_no_known_price_is_a_usage_error(model: Any) -> None:
    """A provider model signoff knows no price for reports a cost of 0 for every response: a
    `max_cost_usd` over it would never be spent, whatever the session cost."""
    with pytest.raises(so.UsageError, match=r"max_cost_usd .* price_per_mtok"):
        so.Agent(name="a", model=model(), limits=so.Limits(max_cost_usd=2.0))
    so.Agent(name="a", model=model(), limits=so.Limits(max_tokens=1000))  # tokens are counted
    free = model(price_per_mtok=(0, 0))  # a local model that costs nothing, said so
    so.Agent(name="a", model=free, limits=so.Limits(max_cost_usd=2.0))


def test_a_cost_budget_over_an_auto_reviewer_of_no_known_price_is_a_usage_error() -> None:
    """What `so.auto()`'s reviewer spends counts against the session's budgets, but a reviewer
    on a provider model of no known price counts every review as costing 0: one review that read
    2,000,000 tokens and wrote 500,000 added $0 under `max_cost_usd=0.01` (measured against a
    fake OpenAI server), and the call ran. Refused as a budget over the agent's own model is."""
    unknown = so.models.OpenAIChat("qwen3:8b", base_url="http://127.0.0.1:9/v1", api_key="k")
    priced = so.models.OpenAIChat(
        "qwen3:8b", base_url="http://127.0.0.1:9/v1", price_per_mtok=(1, 2)
    )

    def refund(review: so.models.Model) -> so.Tool:
        @so.tool(approval=so.ApprovalSpec(so.auto(review), expires_in=60))
        async def refund(amount: float) -> str:
            """Refund."""
            return "ok"

        return refund

    scripted = so.models.Scripted([])
    with pytest.raises(so.UsageError, match=r"auto\(\) review of tool 'refund'.*price_per_mtok"):
        so.Agent(
            name="a", model=scripted, tools=[refund(unknown)], limits=so.Limits(max_cost_usd=1.0)
        )
    so.Agent(name="a", model=scripted, tools=[refund(priced)], limits=so.Limits(max_cost_usd=1.0))
    so.Agent(name="a", model=scripted, tools=[refund(unknown)], limits=so.Limits(max_tokens=1000))


@pytest.mark.parametrize("raised", [{"max_tokens": 1000}, {}], ids=["raised", "removed"])
@pytest.mark.parametrize("snapshots", [False, True], ids=["events", "snapshots"])
async def test_stop_ends_the_turn_though_a_redeploy_raised_the_budget(
    store_url: str, raised: dict[str, Any], snapshots: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The turn spent 120 of max_tokens=100 and asked; the agent was redeployed with a larger
    budget (or none) and the person answered `stop`. The answer was read only once a budget was
    spent again, so the turn went on: two more model calls and a tool ran, and it completed."""
    if snapshots:  # the answering process loads the state from a snapshot, not from events
        monkeypatch.setattr("signoff._recording.SNAPSHOT_EVERY", 1)
    async with so.Runtime([agent(max_tokens=100)], store=store_url) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        [asked] = r.pending
    async with so.Runtime([agent(**raised)], store=store_url) as rt2:
        answer = so.InputResponse(request_id=asked.id, option_id="stop")
        r = await rt2.respond(r.session_id, [answer], principal=ALICE)
        assert (r.status, r.retryable) == ("failed", False)
        assert r.error == {
            "code": "session_limit_reached",
            "message": "the session used 120 of max_tokens=100; the person chose to stop",
        }
        lines = timeline([e async for e in rt2.events(r.session_id, follow=False)])
        assert lines.count("model.completed") == 2
        assert lines.count("tool.completed lookup ok") == 2
        assert lines[-3:] == ["input.resolved answered", "turn.failed", "session.waiting"]
        # The stop was that turn's: the next message's turn runs on the raised budget.
        r = await rt2.generate(session_id=r.session_id, prompt="again", auth=ALICE)
        assert (r.status, r.text) == ("completed", "finished")


async def test_stop_after_a_continue_ends_the_turn_at_the_budget_it_asked_about(
    tmp_path: Path,
) -> None:
    """`continue` raised the budget to 200 and the turn asked again at 240; the redeploy's
    budget of 1000 leaves room, but the later `stop` is the answer the turn goes by."""
    url = f"sqlite:///{tmp_path}/s.db"
    async with so.Runtime([agent(max_tokens=100)], store=url) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        r = await rt.send(r.session_id, "continue", principal=ALICE)
        [asked] = r.pending
    async with so.Runtime([agent(max_tokens=1000)], store=url) as rt2:
        answer = so.InputResponse(request_id=asked.id, option_id="stop")
        r = await rt2.respond(r.session_id, [answer], principal=ALICE)
        assert (r.status, r.retryable) == ("failed", False)
        assert r.error is not None and r.error["message"] == (
            "the session used 240 of max_tokens=200; the person chose to stop"
        )
        lines = timeline([e async for e in rt2.events(r.session_id, follow=False)])
        assert lines.count("model.completed") == 4


async def test_stop_after_a_reply_too_few_tokens_could_hold_calls_the_model_no_more(
    tmp_path: Path,
) -> None:
    """A model that found the tokens left too few for its reply (`BudgetSpent` with no usage,
    as a thinking model's is) asks without spending; `stop` then called it once more, which
    raised again, before the turn failed."""
    model = Capped(so.BudgetSpent("too few for thinking"), so.BudgetSpent("too few for thinking"))
    a = so.Agent(name="a", model=model, limits=so.Limits(max_tokens=100))
    async with so.Runtime([a], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        [asked] = r.pending
        assert asked.kind == "session-limit"
        answer = so.InputResponse(request_id=asked.id, option_id="stop")
        r = await rt.respond(r.session_id, [answer], principal=ALICE)
        assert (r.status, r.retryable) == ("failed", False)
        assert r.error is not None and r.error["code"] == "session_limit_reached"
        assert r.error["message"] == (
            "the 100 output tokens left were too few for the model's reply in the session's "
            "budget: the session used 0 of max_tokens=100; the person chose to stop"
        )
    assert model.caps == [100]


def _echo(messages: list[so.Message]) -> so.ModelResponse:
    """A reply saying the last message the person sent."""
    said = [m.text for m in messages if isinstance(m, so.UserMessage)]
    return reply(f"read: {said[-1]}")


async def test_a_message_after_a_stop_not_yet_driven_starts_the_next_turn(
    store_url: str,
) -> None:
    """The person answered `stop` with nothing driving the turn (`resume=False`, as a CLI
    answer without the agent or a server's worker before its claim does), then sent a message:
    the turn ends at its next model step without the model reading anything, so the message
    waits for that end and starts the next turn, which asks about the budget again; continued,
    the model reads it. Before, it went into the stopped turn, which failed unread, and it
    started no turn."""
    steps: list[Step] = [costly(60), costly(60), _echo]
    a = scripted_agent("a", steps, tools=[lookup], limits=so.Limits(max_tokens=100))
    async with so.Runtime([a], store=store_url) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        [asked] = r.pending
        stop = so.InputResponse(request_id=asked.id, option_id="stop")
        r = await rt.respond(r.session_id, [stop], principal=ALICE, resume=False)
        assert r.status == "running"
        r = await rt.send(r.session_id, "just summarize", principal=ALICE)
        assert (r.status, r.error, r.queued) == ("waiting", None, False)
        [again] = r.pending
        assert again.kind == "session-limit" and again.turn_id != asked.turn_id
        events = [e async for e in rt.events(r.session_id, follow=False)]
        [failed] = [e for e in events if e.type == "turn.failed"]
        assert (failed.turn_id, failed.data["error"]) == (
            asked.turn_id,
            {
                "code": "session_limit_reached",
                "message": "the session used 120 of max_tokens=100; the person chose to stop",
            },
        )
        assert timeline(events)[-7:] == [
            "input.resolved answered",
            "turn.message queued:just summarize",
            "turn.failed",
            "session.waiting",
            "turn.started",
            "input.requested session-limit:" + (again.question or ""),
            "turn.waiting",
        ]
        go_on = so.InputResponse(request_id=again.id, option_id="continue")
        r = await rt.respond(r.session_id, [go_on], principal=ALICE)
        assert (r.status, r.text) == ("completed", "read: just summarize")


@so.tool(approval=True)
async def refund(n: int) -> str:
    """Refund."""
    return f"refunded {n}"


def _not_read(state: Any, store: Any = None) -> Any:
    """`stopped_at_limit` as a signoff before 5afecff1 had it: none, so no `stop` was read once
    the budget was raised or removed (awaited here; called, then, with the state alone)."""
    return None if store is None else asyncio.sleep(0)


async def test_a_stop_the_turn_went_on_past_is_not_read_after_an_upgrade(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The turn asked at 120 of max_tokens=100; the person answered `stop` after a redeploy
    removed the budget, and the older signoff went on (it read no stop then): the model was
    called and asked to refund. Approved after the upgrade, the refund ran and then the turn
    failed at its next model step, for a budget the agent no longer has. Now a stop is read
    only when no model call of the turn came after it: the turn goes on to its answer."""
    steps = [costly(60), costly(60), call_tools(call("refund", n=1)), reply("finished")]

    def agent(**limits: Any) -> so.Agent:
        return scripted_agent("a", steps, tools=[lookup, refund], limits=so.Limits(**limits))

    async with so.Runtime([agent(max_tokens=100)], store=store_url) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        [asked] = r.pending
    with monkeypatch.context() as patched:
        patched.setattr("signoff._model_step.stopped_at_limit", _not_read)
        async with so.Runtime([agent()], store=store_url) as rt:
            stop = so.InputResponse(request_id=asked.id, option_id="stop")
            r = await rt.respond(r.session_id, [stop], principal=ALICE)
            [approval] = r.pending
            assert (r.status, approval.kind) == ("waiting", "tool-approval")
    async with so.Runtime([agent()], store=store_url) as rt:
        approve = so.InputResponse(request_id=approval.id, option_id="approve")
        r = await rt.respond(r.session_id, [approve], principal=ALICE)
        assert (r.status, r.error, r.text) == ("completed", None, "finished")
        lines = timeline([e async for e in rt.events(r.session_id, follow=False)])
    assert lines.count("model.completed") == 4
    assert "tool.completed refund ok" in lines


def _pasted(first_in: int, then_in: int) -> so.Agent:
    """An agent whose first call read `first_in` tokens (a pasted document) and called a tool,
    and whose next reads `then_in` and answers."""
    step = call_tools(call("lookup", n=1))
    big = so.ModelResponse(
        tool_calls=step.tool_calls, usage=so.Usage(input_tokens=first_in, output_tokens=10)
    )
    done = reply("done", usage=so.Usage(input_tokens=then_in, output_tokens=5))
    return scripted_agent("a", [big, done], tools=[lookup], limits=so.Limits(max_tokens=1000))


async def test_one_continue_raises_the_budget_as_far_as_the_next_call_needs(
    store_url: str,
) -> None:
    """A call that read a pasted document of 5,000 tokens under max_tokens=1000 spent 5010,
    and the next reads those 5,000 again. Each `continue` raised the budget by one size, which
    let no model call happen: ten prompts (each a notification), ten answers, before the model
    ran. Now the prompt says how far one raises it, to 11000 (what is spent and what the next
    call reads, and an output token), and one `continue` runs the model. The raise is recorded
    with the request (`raise_to`), so another process folds the same budget."""
    async with so.Runtime([_pasted(5000, 5100)], store=store_url) as rt:
        r = await rt.generate("a", prompt="a long pasted document ...", auth=ALICE)
        [asked] = r.pending
        assert asked.question == (
            "the session used 5010 of max_tokens=1000. Continue with max_tokens raised to "
            "11000, or stop?"
        )
        assert [(o.id, o.description) for o in asked.options] == [
            ("continue", "Go on with max_tokens raised to 11000."),
            ("stop", "End this turn here."),
        ]
    async with so.Runtime([_pasted(5000, 5100)], store=store_url) as rt:  # another process
        answer = so.InputResponse(request_id=asked.id, option_id="continue")
        r = await rt.respond(r.session_id, [answer], principal=ALICE)
        assert (r.status, r.text, r.pending) == ("completed", "done", [])
        state = await rt.state(r.session_id)
        assert (state.limit_grants, state.raised) == (0, {"max_tokens": 11000})
        events = [e async for e in rt.events(r.session_id, follow=False)]
    [requested] = [e for e in events if e.type == "input.requested"]
    assert requested.data["raise_to"] == {"max_tokens": 11000}
    assert [line for line in timeline(events) if line == "model.completed"] == [
        "model.completed"
    ] * 2


def _as_older(patched: pytest.MonkeyPatch) -> None:
    """Record requests as a signoff before `raise_to` did: without it."""
    record = Driver.record

    async def older(self: Any, specs: Any, **kw: Any) -> Any:
        if isinstance(specs, list):
            specs = [(t, {k: v for k, v in d.items() if k != "raise_to"}) for t, d in specs]
        return await record(self, specs, **kw)

    patched.setattr(Driver, "record", older)


async def test_an_older_stores_continue_raises_the_budget_by_one_size_as_it_did(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request an older signoff recorded has no `raise_to`: its `continue` folds, now as then,
    to one size more, so a store's history replays to the budgets it had; the next model step
    asks again, saying how far its own answer raises the budget, and one more `continue` runs
    the model."""
    with monkeypatch.context() as patched:
        _as_older(patched)
        async with so.Runtime([_pasted(5000, 5100)], store=store_url) as rt:
            r = await rt.generate("a", prompt="a long pasted document ...", auth=ALICE)
            [older] = r.pending
    async with so.Runtime([_pasted(5000, 5100)], store=store_url) as rt:
        answer = so.InputResponse(request_id=older.id, option_id="continue")
        r = await rt.respond(r.session_id, [answer], principal=ALICE)
        assert (await rt.state(r.session_id)).limit_grants == 1
        [asked] = r.pending
        assert asked.question == (
            "the session used 5010 of max_tokens=2000. Continue with max_tokens raised to "
            "11000, or stop?"
        )
        answer = so.InputResponse(request_id=asked.id, option_id="continue")
        r = await rt.respond(r.session_id, [answer], principal=ALICE)
        assert (r.status, r.text) == ("completed", "done")
        state = await rt.state(r.session_id)
        assert (state.limit_grants, state.raised) == (1, {"max_tokens": 11000})
        events = await rt.store.read_events(r.session_id)
    # Folded with no `raise_to` at all, as an older signoff recorded every request: one each.
    then = so.SessionState(id=r.session_id)
    for event in events:
        data = {k: v for k, v in event.data.items() if k != "raise_to"}
        then.apply(dataclasses.replace(event, data=data))
    assert then.limit_grants == 2


def _priced(budget: str, size: float) -> so.Agent:
    """An agent whose first call read a pasted document (5,000 tokens, $5) and called a tool,
    and whose next reads 5,100 tokens ($0.50) and answers; `budget` of `size` its one budget."""
    step = call_tools(call("lookup", n=1))
    big = so.ModelResponse(
        tool_calls=step.tool_calls,
        usage=so.Usage(input_tokens=5000, output_tokens=10, cost_usd=5.0),
    )
    done = reply("done", usage=so.Usage(input_tokens=5100, output_tokens=5, cost_usd=0.5))
    limits = so.Limits(**{budget: size})  # type: ignore[arg-type]
    return scripted_agent("a", [big, done], tools=[lookup], limits=limits)


@pytest.mark.parametrize(
    ("budget", "answered_under", "promised", "bound"),
    [
        ("max_tokens", 500, 11000, 11000),  # lowered: what was promised, the model runs
        ("max_tokens", 100_000, 11000, 100_000),  # raised: its own, not 11 of its sizes
        ("max_cost_usd", 0.5, 6, 6),
        ("max_cost_usd", 50.0, 6, 50),
    ],
)
async def test_a_continue_answered_under_another_budget_size_gives_what_it_promised(
    store_url: str, budget: str, answered_under: float, promised: float, bound: float
) -> None:
    """A prompt asked under max_tokens=1000 (max_cost_usd=1) says its `continue` raises the
    budget to 11000 ($6); a redeploy changes the budget's size before it is answered. The
    answer raised the budget by as many of the new deploy's sizes: a size of $50 gave $300, 50
    times what the person approved, and one of 500 tokens gave 5500, where the next call could
    not run and the turn asked again. Now a `continue` raises a budget to what it said, or
    leaves the deploy's own where that is more."""
    asked_under = 1000 if budget == "max_tokens" else 1.0
    async with so.Runtime([_priced(budget, asked_under)], store=store_url) as rt:
        r = await rt.generate("a", prompt="a long pasted document ...", auth=ALICE)
        [asked] = r.pending
        assert (asked.question or "").endswith(
            f"Continue with {budget} raised to {promised}, or stop?"
        )
    agent = _priced(budget, answered_under)
    async with so.Runtime([agent], store=store_url) as rt:  # the redeploy answers
        answer = so.InputResponse(request_id=asked.id, option_id="continue")
        r = await rt.respond(r.session_id, [answer], principal=ALICE)
        assert (r.status, r.text, r.pending) == ("completed", "done", [])
        state = await rt.state(r.session_id)
    spent = state.usage.total_tokens if budget == "max_tokens" else state.usage.cost_usd
    assert own_left(state, agent.limits) == {budget: pytest.approx(bound - spent)}
    assert (state.limit_grants, state.raised) == (0, {budget: promised})
