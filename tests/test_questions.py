"""`so.ask_question()` and answering questions: by option id, label, index or free text, and
every way an answer can be wrong (a clear error, and the store unchanged)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.testing import (
    Capture,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    store_contents,
    timeline,
    tool_results,
)

from ._replaced import assert_only_the_new_turn, assert_told_cancelled, replace_turn

ALICE = so.Principal(authenticator="okta", principal_id="alice")
MALLORY = so.Principal(authenticator="okta", principal_id="mallory")

SHIPPING = [
    {"label": "Standard", "description": "Arrives in five working days."},
    {"label": "Express", "description": "Arrives tomorrow."},
    {"label": "Pickup", "description": "Collect it from the store today."},
]
QUESTION = "How should we ship the order?"


async def events(rt: so.Runtime, session_id: str) -> list[so.Event]:
    return [e async for e in rt.events(session_id, follow=False)]


def shipping_agent(seen: Capture, options: Any = SHIPPING) -> so.Agent:
    ask: dict[str, Any] = {"question": QUESTION}
    if options is not None:
        ask["options"] = options
    return scripted_agent(
        "shop",
        [call_tools(call("ask_question", call_id="q1", **ask)), seen],
        tools=[so.ask_question()],
    )


Answering = Callable[[so.Runtime, str, str], Awaitable[so.GenerateResult]]


async def respond_option(rt: so.Runtime, sid: str, rid: str) -> so.GenerateResult:
    return await rt.respond(sid, [so.InputResponse(request_id=rid, option_id="2")], principal=ALICE)


async def respond_text(rt: so.Runtime, sid: str, rid: str) -> so.GenerateResult:
    return await rt.respond(
        sid, [so.InputResponse(request_id=rid, text="whichever is cheapest")], principal=ALICE
    )


def send(text: str) -> Answering:
    async def answer(rt: so.Runtime, sid: str, rid: str) -> so.GenerateResult:
        return await rt.send(sid, text, principal=ALICE)

    return answer


@pytest.mark.parametrize(
    ("answer", "expected", "recorded"),
    [
        (respond_option, "Express", {"value": "Express", "option_id": "2", "text": None}),
        (send("2"), "Express", {"value": "Express", "option_id": "2", "text": None}),  # id/index
        (send("express"), "Express", {"value": "Express", "option_id": "2", "text": None}),
        (send(" Pickup "), "Pickup", {"value": "Pickup", "option_id": "3", "text": None}),
        (send("3"), "Pickup", {"value": "Pickup", "option_id": "3", "text": None}),
        (
            send("whichever is cheapest"),
            "whichever is cheapest",
            {"value": "whichever is cheapest", "option_id": None, "text": "whichever is cheapest"},
        ),
        (
            respond_text,
            "whichever is cheapest",
            {"value": "whichever is cheapest", "option_id": None, "text": "whichever is cheapest"},
        ),
    ],
    ids=[
        "respond-option",
        "send-id",
        "send-label",
        "send-label-2",
        "send-index",
        "send-text",
        "respond-text",
    ],
)
async def test_ask_question_answered(
    tmp_path: Path, answer: Answering, expected: str, recorded: dict[str, Any]
) -> None:
    seen = Capture(reply("Noted."))
    async with sqlite_runtime(tmp_path, shipping_agent(seen)) as rt:
        r = await rt.generate("shop", prompt="ship my order", auth=ALICE)
        assert r.status == "waiting"
        [req] = r.pending
        assert req.kind == "question"
        assert req.question == QUESTION
        assert req.allow_text is True  # the user can always type their own answer
        assert [o.model_dump() for o in req.options] == [
            {"id": "1", "label": "Standard", "description": "Arrives in five working days."},
            {"id": "2", "label": "Express", "description": "Arrives tomorrow."},
            {"id": "3", "label": "Pickup", "description": "Collect it from the store today."},
        ]
        assert req.call_id == "q1"
        assert [p.id for p in await rt.pending(session_id=r.session_id)] == [req.id]

        r = await answer(rt, r.session_id, req.id)
        assert r.status == "completed"
        assert r.text == "Noted."
        assert r.pending == []
        assert await rt.pending(session_id=r.session_id) == []

        log = await events(rt, r.session_id)
        assert timeline(log) == [
            "session.created",
            "turn.started",
            "model.completed",
            "tool.started ask_question",
            f"input.requested question:{QUESTION}",
            "turn.waiting",
            "input.resolved answered",
            "tool.completed ask_question ok",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        resolved = next(e.data for e in log if e.type == "input.resolved")
        assert resolved["request_id"] == req.id
        assert resolved["answer"] == recorded
        assert resolved["by"]["principal_id"] == "alice"
        [result] = tool_results(seen.last)
        assert result.call_id == "q1"
        assert result.is_error is False
        assert result.content == {"status": "answered", "answer": expected}
        # an answer is not a message: the model sees only the tool result
        assert [m.kind for m in seen.last] == ["user", "assistant", "tool"]


async def test_open_question_takes_any_text_and_a_number_is_just_text(tmp_path: Path) -> None:
    seen = Capture(reply("Noted."))
    async with sqlite_runtime(tmp_path, shipping_agent(seen, options=None)) as rt:
        r = await rt.generate("shop", prompt="ship my order", auth=ALICE)
        [req] = r.pending
        assert req.options == [] and req.allow_text is True
        r = await rt.send(r.session_id, "1", principal=ALICE)
        assert r.status == "completed"
        assert tool_results(seen.last)[0].content == {"status": "answered", "answer": "1"}


async def test_ask_question_is_interrupted_by_a_message_that_answers_nothing(
    tmp_path: Path,
) -> None:
    """A message that does not answer the first open request steers: every waiting question is
    withdrawn, `ask_question` returns `{"interrupted": true}` and the model reads the message."""
    bodies = 0

    @so.tool
    async def pick_size(ctx: so.ToolContext) -> str:
        """Pick a size from the list (no free text)."""
        nonlocal bodies
        bodies += 1
        a = await ctx.ask("Which size?", options=["S", "M", "L"], allow_text=False)
        return a.value

    seen = Capture(reply("Understood, cancelling."))
    agent = scripted_agent(
        "shop",
        [
            call_tools(
                call("pick_size", call_id="c1"),
                call("ask_question", call_id="c2", question=QUESTION, options=SHIPPING),
            ),
            seen,
        ],
        tools=[pick_size, so.ask_question()],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("shop", prompt="order a shirt", auth=ALICE)
        assert [p.question for p in r.pending] == ["Which size?", QUESTION]
        size_req, ship_req = r.pending
        r = await rt.send(r.session_id, "forget it, I'll buy in store", principal=ALICE)
        assert r.status == "completed"
        assert r.pending == []
        log = await events(rt, r.session_id)
        assert timeline(log)[3:] == [
            "tool.started pick_size",
            "input.requested question:Which size?",
            "tool.started ask_question",
            f"input.requested question:{QUESTION}",
            "turn.waiting",
            "input.resolved cancelled",
            "input.resolved cancelled",
            "turn.message forget it, I'll buy in store",
            "tool.completed pick_size cancelled",
            "tool.completed ask_question ok",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        resolved = [e.data for e in log if e.type == "input.resolved"]
        assert [(d["request_id"], d["status"]) for d in resolved] == [
            (size_req.id, "withdrawn"),
            (ship_req.id, "withdrawn"),
        ]
        assert bodies == 2
        c1, c2 = tool_results(seen.last)
        assert (c1.call_id, c1.is_error, c1.content["cancelled"]) == ("c1", True, True)
        assert (c2.call_id, c2.is_error, c2.content) == ("c2", False, {"interrupted": True})
        # the message comes after both results
        last = seen.last[-1]
        assert isinstance(last, so.UserMessage) and last.text == "forget it, I'll buy in store"


@pytest.mark.parametrize("how", ["app-principal", "schedule"])
async def test_ask_question_is_unavailable_when_no_person_can_answer(
    tmp_path: Path, how: str
) -> None:
    seen = Capture(reply("I'll pick standard shipping."))
    async with sqlite_runtime(tmp_path, shipping_agent(seen)) as rt:
        if how == "schedule":
            r = await rt.schedule("shop", "nightly: ship orders")
        else:
            r = await rt.generate("shop", prompt="nightly: ship orders", auth=so.APP_PRINCIPAL)
        assert r.status == "completed"
        assert r.pending == []
        assert timeline(await events(rt, r.session_id))[3:] == [
            "tool.started ask_question",
            "tool.completed ask_question ok",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        [result] = tool_results(seen.last)
        assert result.content == {"status": "unavailable"}
        assert result.is_error is False
        assert await rt.pending(session_id=r.session_id) == []


async def test_a_custom_ask_with_nobody_to_answer_is_a_tool_error(tmp_path: Path) -> None:
    @so.tool
    async def confirm(ctx: so.ToolContext) -> str:
        """Asks and lets InputUnavailable propagate."""
        a = await ctx.ask("Really?", options=["yes", "no"])
        return a.value

    seen = Capture(reply("Skipped."))
    agent = scripted_agent("shop", [call_tools(call("confirm")), seen], tools=[confirm])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.schedule("shop", "nightly")
        assert r.status == "completed"
        [result] = tool_results(seen.last)
        assert result.is_error is True
        assert result.content["error"].startswith("unavailable: ")
        assert "tool.completed confirm error" in timeline(await events(rt, r.session_id))
        assert await rt.pending(session_id=r.session_id) == []


def test_ask_question_schema_allows_two_or_three_options() -> None:
    schema = so.ask_question().json_schema()
    assert schema["required"] == ["question"]
    array = next(s for s in schema["properties"]["options"]["anyOf"] if s.get("type") == "array")
    assert (array["minItems"], array["maxItems"]) == (2, 3)
    option = schema["$defs"]["QuestionOption"]
    assert sorted(option["required"]) == ["description", "label"]


@pytest.mark.parametrize("count", [0, 1, 4])
async def test_ask_question_with_a_wrong_number_of_options_is_a_tool_error(
    tmp_path: Path, count: int
) -> None:
    options = [{"label": f"Choice {i}", "description": "A choice."} for i in range(count)]
    seen = Capture(reply("Let me ask that properly."))
    async with sqlite_runtime(tmp_path, shipping_agent(seen, options=options)) as rt:
        r = await rt.generate("shop", prompt="ship my order", auth=ALICE)
        assert r.status == "completed"  # nothing was asked: the model got the error instead
        assert r.pending == []
        log = await events(rt, r.session_id)
        assert not any(e.type in ("input.requested", "turn.waiting") for e in log)
        assert "tool.completed ask_question error" in timeline(log)
        [result] = tool_results(seen.last)
        assert result.is_error is True
        assert result.content["error"] == "invalid input"
        [detail] = result.content["details"]
        assert detail["loc"] == ["options"]
        assert detail["type"] == ("too_short" if count < 2 else "too_long")
        assert await rt.pending() == []


async def test_ask_question_label_taking_another_options_hash_number_is_invalid_input(
    tmp_path: Path,
) -> None:
    """Labels `#2` and `1`: a typed 1 names both options, so a person is told to reply `#2`
    for the second, which the first's label takes. The model reads why and can ask again."""
    seen = Capture(reply("ok"))
    options = [{"label": "#2", "description": "a"}, {"label": "1", "description": "b"}]
    async with sqlite_runtime(tmp_path, shipping_agent(seen, options=options)) as rt:
        r = await rt.generate("shop", prompt="ship my order", auth=ALICE)
        assert r.pending == []
        [result] = tool_results(seen.last)
        assert result.is_error is True and result.content["error"] == "invalid input"
        [detail] = result.content["details"]
        assert detail["loc"] == ["options"]
        assert "option #1's label '#2' is how a person names option #2" in detail["msg"]


async def test_ask_question_option_without_a_description_is_a_tool_error(tmp_path: Path) -> None:
    seen = Capture(reply("ok"))
    options = [{"label": "A"}, {"label": "B", "description": "b"}]
    async with sqlite_runtime(tmp_path, shipping_agent(seen, options=options)) as rt:
        r = await rt.generate("shop", prompt="ship my order", auth=ALICE)
        [result] = tool_results(seen.last)
        assert result.is_error is True
        assert [d["loc"] for d in result.content["details"]] == [["options", 0, "description"]]
        assert r.pending == []


async def test_ask_question_option_with_an_unknown_field_is_a_tool_error(tmp_path: Path) -> None:
    """An option the schema does not describe (an `id` the model made up, say) is refused, not
    silently dropped: the model learns its input was wrong and nothing is asked."""
    seen = Capture(reply("ok"))
    options = [{"label": "A", "description": "a", "id": "x"}, {"label": "B", "description": "b"}]
    async with sqlite_runtime(tmp_path, shipping_agent(seen, options=options)) as rt:
        r = await rt.generate("shop", prompt="ship my order", auth=ALICE)
        [result] = tool_results(seen.last)
        assert result.is_error is True
        [detail] = result.content["details"]
        assert (detail["loc"], detail["type"]) == (["options", 0, "id"], "extra_forbidden")
        assert r.pending == []
        assert "input.requested" not in timeline(await events(rt, r.session_id))


async def test_an_option_that_is_not_valid_unicode_is_a_tool_error_not_a_stuck_question(
    tmp_path: Path,
) -> None:
    """A tool asking with a label that holds a lone surrogate (taken from data a model wrote,
    say) made a question no answer could be recorded for ("not plain JSON text"): `ctx.ask`
    refuses it with a UsageError the tool's result reports, and nothing is asked."""

    @so.tool
    async def pick_carrier(ctx: so.ToolContext) -> str:
        """Ask which carrier to use."""
        return (await ctx.ask("Which carrier?", options=["Fast\ud800", "Slow"])).value

    seen = Capture(reply("ok"))
    agent = scripted_agent(
        "shop", [call_tools(call("pick_carrier", call_id="c1")), seen], tools=[pick_carrier]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("shop", prompt="ship my order", auth=ALICE)
        assert (r.status, r.pending) == ("completed", [])
        [result] = tool_results(seen.last)
        assert result.is_error is True
        assert "option #1's id is not valid Unicode text" in str(result.content)
        assert await rt.pending() == []


# -- bad answers: a clear error, and nothing changes ---------------------------------------------


@so.tool
async def pick_plan(ctx: so.ToolContext) -> str:
    """Choose a plan from the list (no free text)."""
    a = await ctx.ask("Which plan?", options=["basic", "pro"], allow_text=False)
    return a.value


async def parked(rt: so.Runtime, *, options_only: bool) -> tuple[str, str]:
    prompt = "upgrade" if options_only else "ship my order"
    r = await rt.generate("shop", prompt=prompt, auth=ALICE)
    assert r.status == "waiting"
    return r.session_id, r.pending[0].id


def bad_answer_agent() -> so.Agent:
    def first(conversation: list[so.Message]) -> so.ModelResponse:
        text = getattr(conversation[0], "text", "")
        if text == "upgrade":
            return call_tools(call("pick_plan"))
        return call_tools(call("ask_question", question=QUESTION, options=SHIPPING))

    return scripted_agent("shop", [first, reply("done")], tools=[pick_plan, so.ask_question()])


@pytest.mark.parametrize(
    ("options_only", "response", "error", "words"),
    [
        (False, {"option_id": "7"}, so.InvalidAnswer, ["has no option '7'", "options: 1, 2, 3"]),
        (False, {"option_id": "Express"}, so.InvalidAnswer, ["has no option 'Express'"]),
        (False, {"text": ""}, so.InvalidAnswer, ["the answer text is empty"]),
        (False, {"text": "   "}, so.InvalidAnswer, ["the answer text is empty"]),
        (False, {"text": "\u200b\u2060 \ufeff\x00"}, so.InvalidAnswer, ["answer text is empty"]),
        (False, {}, so.InvalidAnswer, ["needs an option_id or text"]),
        (False, {"option_id": "1", "text": "and gift wrap"}, so.InvalidAnswer, ["not both"]),
        (True, {"text": "enterprise"}, so.InvalidAnswer, ["takes one of its options"]),
        (True, {"option_id": "approve"}, so.InvalidAnswer, ["has no option 'approve'"]),
    ],
    ids=[
        "no-such-option",
        "label-is-not-an-id",
        "empty-text",
        "blank-text",
        "invisible-text",
        "nothing",
        "option-and-text",
        "text-where-options-only",
        "approval-option",
    ],
)
async def test_bad_answer_is_rejected_and_changes_nothing(
    tmp_path: Path,
    options_only: bool,
    response: dict[str, Any],
    error: type[Exception],
    words: list[str],
) -> None:
    async with sqlite_runtime(tmp_path, bad_answer_agent()) as rt:
        sid, rid = await parked(rt, options_only=options_only)
        before = await store_contents(rt.store, sid)
        with pytest.raises(error) as caught:
            await rt.respond(sid, [so.InputResponse(request_id=rid, **response)], principal=ALICE)
        assert rid in str(caught.value)
        for w in words:
            assert w in str(caught.value)
        assert isinstance(caught.value, so.SignoffError)
        assert getattr(caught.value, "request_ids", [rid]) == [rid]
        assert await store_contents(rt.store, sid) == before
        # the question is still open and a good answer still works
        good = {"option_id": "pro"} if options_only else {"option_id": "1"}
        r = await rt.respond(sid, [so.InputResponse(request_id=rid, **good)], principal=ALICE)
        assert r.status == "completed"


async def test_unknown_foreign_and_unauthorized_answers_change_nothing(tmp_path: Path) -> None:
    async with sqlite_runtime(tmp_path, bad_answer_agent()) as rt:
        sid, rid = await parked(rt, options_only=False)
        other_sid, other_rid = await parked(rt, options_only=False)
        before = await store_contents(rt.store, sid)
        other_before = await store_contents(rt.store, other_sid)

        with pytest.raises(so.UnknownRequest) as unknown:
            await rt.respond(
                sid, [so.InputResponse(request_id="req_nope", text="x")], principal=ALICE
            )
        assert "req_nope" in str(unknown.value)
        with pytest.raises(so.UnknownRequest) as foreign:
            await rt.respond(
                sid, [so.InputResponse(request_id=other_rid, text="x")], principal=ALICE
            )
        assert other_rid in str(foreign.value)
        with pytest.raises(so.NotAllowed) as denied:
            await rt.respond(sid, [so.InputResponse(request_id=rid, text="x")], principal=MALLORY)
        assert "mallory" in str(denied.value)
        with pytest.raises(so.UsageError):
            await rt.send(sid, "   ", principal=ALICE)
        with pytest.raises(so.InvalidAnswer):
            await rt.respond(sid, [], principal=ALICE)
        with pytest.raises(so.InvalidAnswer):
            await rt.respond(sid, [{"request_id": rid, "option_id": 2}], principal=ALICE)

        assert await store_contents(rt.store, sid) == before
        assert await store_contents(rt.store, other_sid) == other_before


async def test_an_input_hash_on_a_question_answer_is_checked(store_url: str) -> None:
    """A question is bound to the call that asked it: an answer naming another call's input
    hash is stale and changes nothing, on either store; the right hash, or none, is accepted."""
    async with so.Runtime([bad_answer_agent()], store=store_url) as rt:
        sid, rid = await parked(rt, options_only=True)
        other_sid, other_rid = await parked(rt, options_only=False)
        (request,) = await rt.pending(session_id=sid)
        (other,) = await rt.pending(session_id=other_sid)
        assert request.action is not None and other.action is not None
        before = await store_contents(rt.store, sid)
        for wrong in [other.action.input_hash, "sha256:" + "0" * 64, ""]:
            for answer in [{"option_id": "pro"}, {"text": "pro"}]:
                with pytest.raises(so.StaleAnswer) as stale:
                    await rt.respond(
                        sid,
                        [so.InputResponse(request_id=rid, input_hash=wrong, **answer)],
                        principal=ALICE,
                    )
                assert stale.value.request_ids == [rid]
                assert request.action.input_hash in str(stale.value)
        assert await store_contents(rt.store, sid) == before
        right = so.InputResponse(
            request_id=rid, option_id="pro", input_hash=request.action.input_hash
        )
        assert (await rt.respond(sid, [right], principal=ALICE)).status == "completed"
        unbound = so.InputResponse(request_id=other_rid, option_id="2")
        assert (await rt.respond(other_sid, [unbound], principal=ALICE)).status == "completed"


async def test_an_answer_to_a_withdrawn_question_is_request_closed(tmp_path: Path) -> None:
    async with sqlite_runtime(tmp_path, bad_answer_agent()) as rt:
        sid, rid = await parked(rt, options_only=True)
        r = await rt.send(sid, "never mind, what's the weather?", principal=ALICE)
        assert r.status == "completed"
        before = await store_contents(rt.store, sid)
        assert (rid, "withdrawn") in before.requests
        with pytest.raises(so.RequestClosed) as closed:
            await rt.respond(
                sid, [so.InputResponse(request_id=rid, option_id="pro")], principal=ALICE
            )
        assert rid in str(closed.value)
        assert "withdrawn" in str(closed.value)
        assert closed.value.request_ids == [rid]
        assert await store_contents(rt.store, sid) == before


async def test_same_answer_twice_is_a_no_op_and_a_different_one_conflicts(
    tmp_path: Path,
) -> None:
    async with sqlite_runtime(tmp_path, bad_answer_agent()) as rt:
        sid, rid = await parked(rt, options_only=False)
        r = await rt.respond(
            sid, [so.InputResponse(request_id=rid, option_id="2")], principal=ALICE
        )
        assert r.status == "completed"
        before = await store_contents(rt.store, sid)
        again = await rt.respond(
            sid, [so.InputResponse(request_id=rid, option_id="2")], principal=ALICE
        )
        assert again.outcomes == [so.Outcome(request_id=rid, outcome="answered", applied=False)]
        with pytest.raises(so.ConflictingAnswer) as conflict:
            await rt.respond(
                sid, [so.InputResponse(request_id=rid, option_id="1")], principal=ALICE
            )
        assert rid in str(conflict.value)
        assert await store_contents(rt.store, sid) == before


async def test_a_question_whose_turn_was_replaced_meanwhile_is_not_asked(store_url: str) -> None:
    """A tool body is about to ask when another process cancels its turn and starts a new one
    (left running: this process holds the lease). The question is not asked, nothing of the
    old turn lands in the new one, and the new turn runs normally."""
    new_turn: list[str] = []
    sid = ""

    @so.tool
    async def pick_size(ctx: so.ToolContext) -> str:
        """Pick a size."""
        new_turn.append(await replace_turn(other, sid))
        return (await ctx.ask("Which size?", options=["S", "M", "L"])).value

    def agent() -> so.Agent:
        script = [call_tools(call("pick_size", call_id="c1")), reply("Tried again.")]
        return scripted_agent("shop", script, tools=[pick_size])

    async with (
        so.Runtime([agent()], store=store_url) as rt,
        so.Runtime([agent()], store=store_url, lease_wait=0) as other,
    ):
        sid = await rt.create_session("shop", auth=ALICE)
        first = await rt.generate(session_id=sid, prompt="Pick one", auth=ALICE)
        await assert_told_cancelled(rt, sid, first, new_turn[0], "Tried again.")
        await assert_only_the_new_turn(rt, sid, new_turn[0])
        assert await rt.pending(session_id=sid) == []
        assert "input.requested" not in timeline(await events(rt, sid))
