"""Workflow tools: `ctx.step()` journals and a re-run replays it, exceptions included; the
principals, event reader and `Transfer` tool the other workflow tests share."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff._recording import load_journal
from signoff._steps import raise_recorded
from signoff.stores import Commit, SQLiteStore
from signoff.testing import (
    Capture,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    timeline,
    tool_results,
)

ALICE = so.Principal(authenticator="okta", principal_id="alice", principal_type="user")
BOB = so.Principal(authenticator="sso", principal_id="bob", principal_type="service")


async def events(rt: so.Runtime, session_id: str) -> list[so.Event]:
    return [e async for e in rt.events(session_id, follow=False)]


def answer_dict(answer: so.Answer) -> dict[str, Any]:
    return {
        "value": answer.value,
        "option_id": answer.option_id,
        "text": answer.text,
        "authenticator": answer.authenticator,
        "principal_id": answer.principal_id,
        "principal_type": answer.principal_type,
    }


class Transfer:
    """A workflow tool that quotes (a journaled step), then asks twice; counts what really ran."""

    def __init__(self) -> None:
        self.quotes = 0
        self.bodies = 0
        self.keys: list[str] = []
        self.currents: list[so.Principal | None] = []

        @so.tool
        async def transfer(ctx: so.ToolContext, amount: float) -> dict[str, Any]:
            """Move money after the customer confirms the fee."""
            self.bodies += 1
            self.keys.append(ctx.idempotency_key("send"))
            self.currents.append(ctx.session.auth.current)
            quote = await ctx.step("quote", self.quote, amount)
            proceed = await ctx.ask(f"Fee is {quote['fee']}. Proceed?", options=["yes", "no"])
            account = await ctx.ask("Which account should it come from?")
            return {
                "quote": quote,
                "proceed": answer_dict(proceed),
                "account": answer_dict(account),
            }

        self.tool = transfer

    def quote(self, amount: float) -> dict[str, float]:
        self.quotes += 1
        return {"fee": round(amount * 0.025, 2)}


async def test_step_runs_once_and_answers_replay_in_order(tmp_path: Path) -> None:
    t = Transfer()
    seen = Capture(reply("Sent."))
    agent = scripted_agent(
        "bank", [call_tools(call("transfer", call_id="c1", amount=200)), seen], tools=[t.tool]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("bank", prompt="move 200", auth=ALICE)
        sid = r.session_id
        assert r.status == "waiting"
        [first] = r.pending
        assert first.kind == "question"
        assert first.question == "Fee is 5.0. Proceed?"
        assert [(o.id, o.label) for o in first.options] == [("yes", "yes"), ("no", "no")]
        assert first.allow_text is True
        assert first.call_id == "c1"
        assert first.requested_by == ALICE
        assert (t.quotes, t.bodies) == (1, 1)

        r = await rt.respond(
            sid, [so.InputResponse(request_id=first.id, option_id="yes")], principal=ALICE
        )
        assert r.status == "waiting"
        assert r.outcomes == [so.Outcome(request_id=first.id, outcome="answered", applied=True)]
        [second] = r.pending
        assert second.question == "Which account should it come from?"
        assert second.options == []
        assert (t.quotes, t.bodies) == (1, 2)  # the body re-ran; the step replayed

        r = await rt.send(sid, "savings", principal=ALICE)
        assert r.status == "completed"
        assert r.text == "Sent."
        assert (t.quotes, t.bodies) == (1, 3)
        log = await events(rt, sid)
        # stable across replays (the call's key, recorded once); the turn's auth never changes
        started = [e.data for e in log if e.type == "tool.started"]
        assert len(started) == 1
        key = started[0]["idempotency_key"]
        assert key.startswith(sid) and "c1" in key
        assert t.keys == [f"{key}:send"] * 3
        assert t.currents == [ALICE] * 3

        assert timeline(log) == [
            "session.created",
            "turn.started",
            "model.completed",
            "tool.started transfer",
            "tool.step transfer:quote",
            "input.requested question:Fee is 5.0. Proceed?",
            "turn.waiting",
            "input.resolved answered",
            "input.requested question:Which account should it come from?",
            "turn.waiting",
            "input.resolved answered",
            "tool.completed transfer ok",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        assert [e.seq for e in log] == list(range(1, len(log) + 1))
        waits = [e for e in log if e.type == "turn.waiting"]
        assert [w.data for w in waits] == [
            {"on": "input", "request_ids": [first.id]},
            {"on": "input", "request_ids": [second.id]},
        ]
        assert {e.turn_id for e in log[1:]} == {r.turn_id}  # one turn throughout
        step = next(e for e in log if e.type == "tool.step")
        assert step.data["result"] == {"fee": 5.0}
        resolved = [e.data for e in log if e.type == "input.resolved"]
        assert resolved[0]["answer"] == {"value": "yes", "option_id": "yes", "text": None}
        assert resolved[1]["answer"] == {"value": "savings", "option_id": None, "text": "savings"}

        who = {"authenticator": "okta", "principal_id": "alice", "principal_type": "user"}
        [result] = tool_results(seen.last)
        assert result.is_error is False
        assert result.content == {
            "quote": {"fee": 5.0},
            "proceed": {"value": "yes", "option_id": "yes", "text": None, **who},
            "account": {"value": "savings", "option_id": None, "text": "savings", **who},
        }
        # the model saw no extra user message: "savings" was an answer, not a message
        assert [m.kind for m in seen.last] == ["user", "assistant", "tool"]


async def test_answer_names_the_responder_not_the_turns_auth(tmp_path: Path) -> None:
    t = Transfer()
    agent = scripted_agent(
        "bank", [call_tools(call("transfer", amount=40)), reply("ok")], tools=[t.tool]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("bank", prompt="move 40")  # nobody in particular started it
        r = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=r.pending[0].id, text="Yes please")],
            principal=BOB,
        )
        r = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=r.pending[0].id, option_id=None, text="checking")],
            principal=ALICE,
        )
        assert r.status == "completed"
        assert t.currents == [None, None, None]  # ctx.session.auth.current stays the run's
        log = await events(rt, r.session_id)
        result = next(e for e in log if e.type == "tool.completed").data["result"]
        assert result["proceed"] == {
            "value": "Yes please",
            "option_id": None,
            "text": "Yes please",
            "authenticator": "sso",
            "principal_id": "bob",
            "principal_type": "service",
        }
        assert result["account"]["principal_id"] == "alice"
        assert result["account"]["authenticator"] == "okta"
        by = [e.data["by"]["principal_id"] for e in log if e.type == "input.resolved"]
        assert by == ["bob", "alice"]


async def test_step_awaits_async_functions_and_journals_json(tmp_path: Path) -> None:
    runs: list[str] = []

    async def fetch(order_id: str, *, full: bool) -> tuple[str, bool]:
        runs.append(order_id)
        return (order_id, full)

    @so.tool
    async def lookup(ctx: so.ToolContext) -> dict[str, Any]:
        """Fetch, then confirm."""
        got = await ctx.step("fetch", fetch, "1042", full=True)
        await ctx.ask("Is this your order?", options=["yes", "no"])
        return {"got": got}

    seen = Capture(reply("ok"))
    agent = scripted_agent("bot", [call_tools(call("lookup")), seen], tools=[lookup])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("bot", prompt="go", auth=ALICE)
        r = await rt.send(r.session_id, "yes", principal=ALICE)
        assert r.status == "completed"
        assert runs == ["1042"]
        # the first run and the replay both see the journaled (JSON) value
        assert tool_results(seen.last)[0].content == {"got": ["1042", True]}


async def test_ask_and_step_need_the_engine() -> None:
    ctx = so.ToolContext(
        session=so.SessionInfo(
            id="s", agent="a", turn="t", auth=so.SessionAuth(current=None, initiator=None)
        ),
        call_id="c",
        tool_name="t",
        idempotency_key="k",
    )
    with pytest.raises(so.UsageError, match="needs a context given by the signoff engine"):
        await ctx.ask("Hello?")
    with pytest.raises(so.UsageError, match="needs a context given by the signoff engine"):
        await ctx.step("x", print)
    assert ctx.idempotency_key() == "k"
    assert ctx.idempotency_key("send") == "k:send"


class PositionalWriter(SQLiteStore):
    """Stores calls as a signoff before keyed journals did: no `keyed` mark on a call's entries,
    and each step or question's `index` its position in the call's journal."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.positions: dict[str, int] = {}

    def _position(self, call_id: str) -> int:
        at = self.positions.get(call_id, 0)
        self.positions[call_id] = at + 1
        return at

    async def commit(self, commit: Commit) -> None:
        events, requests = [], {r.id: r for r in commit.new_requests}
        for e in commit.events:
            data = dict(e.data)
            if e.type == "tool.step":
                data.pop("keyed", None)
                data["index"] = self._position(data["call_id"])
            elif e.type == "input.requested":
                data.pop("keyed", None)
                asked = []
                for raw in data["requests"]:
                    if raw.get("source") == "ask":
                        raw = {**raw, "index": self._position(raw["action"]["call_id"])}
                        requests[raw["id"]] = so.InputRequest.model_validate(raw)
                    asked.append(raw)
                data["requests"] = asked
            events.append(dataclasses.replace(e, data=data))
        await super().commit(
            dataclasses.replace(
                commit, events=events, new_requests=list(requests.values()), snapshot=None
            )
        )


async def test_a_call_journaled_by_position_replays_by_position(tmp_path: Path) -> None:
    """Entries stored before journals were keyed (by position, no `keyed` mark) still replay:
    the call goes on by position, and what it journals next is positional too."""
    ran: list[str] = []

    def run(what: str, result: str) -> str:
        ran.append(what)
        return result

    @so.tool
    async def transfer(ctx: so.ToolContext) -> dict[str, str]:
        """Quote, confirm, send, ask for a memo."""
        fee = await ctx.step("quote", run, "quote", "2.5%")
        proceed = await ctx.ask(f"Fee is {fee}. Proceed?", options=["yes", "no"])
        sent = await ctx.step("send", run, "send", "sent")
        memo = await ctx.ask("Memo?")
        return {"proceed": proceed.value, "sent": sent, "memo": memo.value}

    seen = Capture(reply("Done."))
    agent = scripted_agent(
        "bank", [call_tools(call("transfer", call_id="t1")), seen], tools=[transfer]
    )
    url = f"sqlite:///{tmp_path / 'state.db'}"
    async with so.Runtime([agent], store=PositionalWriter(url)) as old:
        r = await old.generate("bank", prompt="pay", auth=ALICE)
        assert [p.question for p in r.pending] == ["Fee is 2.5%. Proceed?"]
    async with so.Runtime([agent], store=url) as rt:
        assert [p.index for p in await rt.pending()] == [1]  # stored by position
        r = await rt.send(r.session_id, "yes", principal=ALICE)
        assert [(p.question, p.index) for p in r.pending] == [("Memo?", 3)]
        r = await rt.send(r.session_id, "rent", principal=ALICE)
        assert r.status == "completed"
        [result] = tool_results(seen.last)
        assert result.content == {"proceed": "yes", "sent": "sent", "memo": "rent"}
        assert ran == ["quote", "send"]
        log = await events(rt, r.session_id)
        assert [e.data["index"] for e in log if e.type == "tool.step"] == [0, 2]


async def test_the_same_step_and_question_twice_replay_each_in_turn(tmp_path: Path) -> None:
    """A step name and a question asked again later in the call are told apart by occurrence:
    each replay returns the right one's result and answer, and no step runs twice."""
    rolls = iter(["4", "6"])
    ran: list[str] = []

    def roll() -> str:
        ran.append("roll")
        return next(rolls)

    @so.tool
    async def dice(ctx: so.ToolContext) -> list[str]:
        """Roll, ask whether to roll again, twice."""
        seen: list[str] = []
        for _ in range(2):
            seen.append(await ctx.step("roll", roll))
            seen.append((await ctx.ask("Again?", options=["yes", "no"])).value)
        return seen

    seen = Capture(reply("Rolled."))
    agent = scripted_agent("game", [call_tools(call("dice", call_id="d1")), seen], tools=[dice])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("game", prompt="roll", auth=ALICE)
        r = await rt.send(r.session_id, "yes", principal=ALICE)
        assert [p.question for p in r.pending] == ["Again?"]
        r = await rt.send(r.session_id, "no", principal=ALICE)
        assert r.status == "completed"
        assert tool_results(seen.last)[0].content == ["4", "yes", "6", "no"]
        assert ran == ["roll", "roll"]


async def test_a_snapshot_keeps_a_calls_journal_keyed(tmp_path: Path) -> None:
    """A session resumed from a snapshot taken while a call waits on its question still finds
    the call's entries by key (read as positional, they would replay as a different tool): the
    snapshot keeps how the journal is keyed, and the entries are read back from the events."""

    @so.tool
    async def book(ctx: so.ToolContext) -> list[str]:
        """Hold a table and ask for a time."""
        held = await ctx.step("hold", lambda: "held")
        return [held, (await ctx.ask("What time?")).value]

    agent = scripted_agent(
        "host", [call_tools(call("book", call_id="b1")), reply("ok")], tools=[book]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("host", prompt="book", auth=ALICE)
        state = await rt.state(r.session_id)
        restored = so.SessionState.from_snapshot(state.to_snapshot())
        assert restored.turn is not None and state.turn is not None
        call_state = restored.turn.calls["b1"]
        assert call_state.keyed is True and call_state.journal is None
        await load_journal(rt.store, restored, call_state)
    assert call_state.journal is not None and call_state.journal == state.turn.calls["b1"].journal
    assert [(e["kind"], e["name"], e["n"]) for e in call_state.journal if e] == [
        ("step", "hold", 0),
        ("ask", "What time?", 0),
    ]


class Declined(Exception):
    """A card payment the bank declined (a step's own failure, caught by the tool)."""


async def test_a_step_that_raises_is_journaled_and_raised_again_on_replay(store_url: str) -> None:
    """A step that raised is not run again on replay: the same exception is raised again, so a
    tool that catches it takes the same path (the card is charged once, not retried)."""
    charges: list[str] = []

    def charge(card: str) -> str:
        charges.append(card)
        raise Declined(f"card {card} declined")

    @so.tool
    async def pay(ctx: so.ToolContext) -> dict[str, str]:
        """Charge the card on file; if declined, ask for another."""
        try:
            return {"paid": await ctx.step("charge", charge, "4242")}
        except Declined as exc:
            other = await ctx.ask(f"{exc}. Try another card?", options=["yes", "no"])
            return {"declined": str(exc), "retry": other.value}

    seen = Capture(reply("Done."))
    agent = scripted_agent("shop", [call_tools(call("pay", call_id="p1")), seen], tools=[pay])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("shop", prompt="pay", auth=ALICE)
        assert [p.question for p in r.pending] == ["card 4242 declined. Try another card?"]
        r = await rt.send(r.session_id, "no", principal=ALICE)
        assert r.status == "completed"
        [result] = tool_results(seen.last)
        assert result.content == {"declined": "card 4242 declined", "retry": "no"}
        assert charges == ["4242"]  # charged once, though the body ran twice
        [step] = [e for e in await events(rt, r.session_id) if e.type == "tool.step"]
        assert step.data["error"]["type"] == "Declined"
        assert "result" not in step.data


class NeedsTwo(Exception):
    """An exception whose arguments are not what its constructor takes."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"{code}: {detail}")


async def test_a_step_exception_that_cannot_be_rebuilt_replays_as_step_failed(
    tmp_path: Path,
) -> None:
    """An exception signoff cannot build again as it was (its class is local to a function, or
    its args are not what it takes) is raised on replay as `StepFailed`, naming it: never by
    running the step again."""
    ran: list[str] = []

    class Local(Exception):
        pass

    def fail(kind: str) -> str:
        ran.append(kind)
        raise (Local("local failure") if kind == "local" else NeedsTwo(7, "two args"))

    caught: list[tuple[str, str]] = []

    @so.tool
    async def flaky(ctx: so.ToolContext) -> list[str]:
        """Two steps that fail, then a question."""
        for kind in ("local", "two"):
            try:
                await ctx.step(kind, fail, kind)
            except Exception as exc:
                caught.append((type(exc).__name__, str(exc)))
        return [(await ctx.ask("Go on?")).value]

    agent = scripted_agent(
        "ops", [call_tools(call("flaky", call_id="f1")), reply("ok")], tools=[flaky]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("ops", prompt="go", auth=ALICE)
        r = await rt.send(r.session_id, "yes", principal=ALICE)
        assert r.status == "completed"
    assert ran == ["local", "two"]
    qualname = "test_a_step_exception_that_cannot_be_rebuilt_replays_as_step_failed.<locals>.Local"
    where = "tests.test_workflow"
    assert caught == [
        ("Local", "local failure"),
        ("NeedsTwo", "7: two args"),
        ("StepFailed", f"step 'local' raised {where}.{qualname}: local failure"),
        ("StepFailed", f"step 'two' raised {where}.NeedsTwo: 7: two args"),
    ]


async def test_a_step_failure_is_never_built_from_a_class_not_already_imported(
    tmp_path: Path,
) -> None:
    """The journal names an exception class by module; replay raises it only from a module
    already imported, so a tampered journal cannot make signoff import code."""
    error = {"module": "antigravity", "type": "Exception", "message": "boom", "args": ["boom"]}
    assert "antigravity" not in sys.modules
    with pytest.raises(so.StepFailed, match="antigravity.Exception: boom"):
        raise_recorded("s", error)
    assert "antigravity" not in sys.modules
    with pytest.raises(ValueError, match="^bad$"):
        raise_recorded(
            "s", {"module": "builtins", "type": "ValueError", "message": "bad", "args": ["bad"]}
        )
    with pytest.raises(so.StepFailed, match="step 's' raised SystemExit: 3"):
        raise_recorded(
            "s", {"module": "builtins", "type": "SystemExit", "message": "3", "args": [3]}
        )


async def test_a_step_whose_function_steps_or_asks_is_refused_not_hung(store_url: str) -> None:
    """A step's function that asks (it would park inside the step, which the body's park then
    waits for: a drive hung for ever) or steps (its entry is never replayed, as the outer step
    replays whole: a later step failed with `ReplayError`) is a `UsageError` the model reads."""
    ran: list[str] = []

    async def asks(ctx: so.ToolContext) -> str:
        ran.append("asks")
        return (await ctx.ask("Sure?", options=["yes", "no"])).value

    async def steps(ctx: so.ToolContext) -> str:
        ran.append("steps")
        return str(await ctx.step("inner", ran.append, "inner"))

    @so.tool
    async def nest(ctx: so.ToolContext, inner: str) -> str:
        """Runs a step whose function steps or asks."""
        return str(await ctx.step("outer", asks if inner == "ask" else steps, ctx))

    seen = Capture(reply("ok"))
    agent = scripted_agent(
        "ops",
        [
            call_tools(
                call("nest", call_id="n1", inner="ask"), call("nest", call_id="n2", inner="step")
            ),
            seen,
        ],
        tools=[nest],
    )
    async with so.Runtime([agent], store=store_url) as rt:
        async with asyncio.timeout(20):
            r = await rt.generate("ops", prompt="go", auth=ALICE)
        assert r.status == "completed" and r.pending == []
        assert ran == ["asks", "steps"]  # neither the question asked nor the inner step run
        asked, stepped = tool_results(seen.last)
        assert asked.is_error and stepped.is_error
        assert asked.content == {
            "error": "UsageError: ctx.ask() inside step 'outer': a step's function may not "
            "step or ask (call them from the tool's body)"
        }
        assert stepped.content == {
            "error": "UsageError: ctx.step() inside step 'outer': a step's function may not "
            "step or ask (call them from the tool's body)"
        }
        log = await events(rt, r.session_id)
        assert not [e for e in log if e.type in ("tool.step", "input.requested")]


async def test_a_tool_changing_what_a_step_returned_changes_no_replay(store_url: str) -> None:
    """A step's result is the tool's to change: what the first run and every replay get is what
    the step journaled, as a process reading the log would, not the object a previous run of
    the body changed (the session's state held that very object)."""
    ran: list[str] = []
    got: list[Any] = []

    def fetch() -> dict[str, list[int]]:
        ran.append("fetch")
        return {"items": [1]}

    @so.tool
    async def basket(ctx: so.ToolContext) -> Any:
        """Fetch a basket, add to it, confirm twice."""
        items = await ctx.step("fetch", fetch)
        got.append(json.loads(json.dumps(items)))
        items["items"].append(2)
        await ctx.ask("Add it?", options=["yes", "no"])
        await ctx.ask("Really?", options=["yes", "no"])
        return items

    agent = scripted_agent(
        "shop", [call_tools(call("basket", call_id="b1")), reply("ok")], tools=[basket]
    )
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("shop", prompt="go", auth=ALICE)
        for _ in range(2):
            yes = so.InputResponse(request_id=r.pending[0].id, option_id="yes")
            r = await rt.respond(r.session_id, [yes], principal=ALICE)
        assert r.status == "completed"
        log = await events(rt, r.session_id)
    assert ran == ["fetch"]
    assert got == [{"items": [1]}] * 3
    assert [e.data["result"] for e in log if e.type == "tool.step"] == [{"items": [1]}]
    assert [e.data["result"] for e in log if e.type == "tool.completed"] == [{"items": [1, 2]}]
