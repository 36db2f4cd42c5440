"""`Anthropic` end to end through an agent: an approved tool use, a denial, a failed turn, invalid
tool input, parallel tool uses, a call a cancelled turn left open, blank text."""

from __future__ import annotations

from pathlib import Path

import signoff as so

from ._models import issue_refund, lookup_order, request, support_agent
from ._models_anthropic import fake, model, tool_use
from .fakes.llm import (
    FakeLLM,
    Reply,
    anthropic_message,
)

__all__ = ["fake", "model"]  # the fixtures, used by name


async def test_an_approved_tool_use_round_trips_through_the_sdk(
    fake, model, tmp_path: Path
) -> None:
    fake.queue(
        anthropic_message(
            "Refunding.", tool_use("toolu_01A", "issue_refund", {"order_id": "1042", "amount": 180})
        ),
        anthropic_message("Refunded 180."),
    )
    async with so.Runtime([support_agent(model)], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="Refund order 1042")
        assert r.status == "waiting"
        [req] = r.pending
        assert (req.tool_name, req.call_id) == ("issue_refund", "toolu_01A")
        assert len(fake.received) == 1
        r = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=req.id, approved=True)]
        )
        assert r.status == "completed" and r.text.endswith("Refunded 180.")

    first, second = fake.bodies
    assert first["system"] == "You help customers."
    [tool] = first["tools"]
    assert (tool["name"], tool["description"]) == ("issue_refund", "Refund an order.")
    assert set(tool["input_schema"]["properties"]) == {"order_id", "amount"}
    assert second["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Refund order 1042"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Refunding."},
                tool_use("toolu_01A", "issue_refund", {"order_id": "1042", "amount": 180}),
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01A",
                    "content": '{"refunded": 180.0, "order_id": "1042"}',
                }
            ],
        },
    ]


async def test_a_denial_reaches_the_model_as_an_error_result(fake, model, tmp_path: Path) -> None:
    fake.queue(
        anthropic_message(tool_use("toolu_d", "issue_refund", {"order_id": "9", "amount": 5000})),
        anthropic_message("Declined, sorry."),
    )
    async with so.Runtime([support_agent(model)], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="Refund order 9")
        r = await rt.generate(
            session_id=r.session_id,
            approvals=[so.Decision(id=r.pending[0].id, approved=False, reason="over the limit")],
        )
        assert r.status == "completed"
    [result] = fake.bodies[1]["messages"][-1]["content"]
    assert (result["type"], result["tool_use_id"], result["is_error"]) == (
        "tool_result",
        "toolu_d",
        True,
    )
    assert "over the limit" in result["content"]


async def test_a_server_error_fails_the_turn_retryably(fake, model, tmp_path: Path) -> None:
    fake.queue(Reply({"type": "error", "error": {"type": "api_error", "message": "boom"}}, 500))
    async with so.Runtime([support_agent(model)], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="hi")
        assert (r.status, r.retryable) == ("failed", True)
        assert r.error is not None and r.error["code"] == "model_error"
        assert "HTTP 500: api_error: boom" in r.error["message"]
        fake.queue(anthropic_message("Hello!"))
        r = await rt.generate(session_id=r.session_id)
        assert (r.status, r.text) == ("completed", "Hello!")


async def test_invalid_tool_input_becomes_an_error_result(fake, model, tmp_path: Path) -> None:
    fake.queue(
        anthropic_message(tool_use("toolu_x", "issue_refund", {"order_id": "1042"})),
        anthropic_message("I need the amount."),
    )
    async with so.Runtime([support_agent(model)], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="Refund order 1042")
        assert (r.status, r.pending) == ("completed", [])
    [result] = fake.bodies[1]["messages"][-1]["content"]
    assert (result["tool_use_id"], result["is_error"]) == ("toolu_x", True)
    assert "invalid input" in result["content"] and "amount" in result["content"]


async def test_parallel_tool_uses_come_back_as_one_user_message(
    fake: FakeLLM, model: so.models.Anthropic, tmp_path: Path
) -> None:
    fake.queue(
        anthropic_message(
            tool_use("toolu_look", "lookup_order", {"order_id": "1042"}),
            tool_use("toolu_pay", "issue_refund", {"order_id": "1042", "amount": 180}),
        ),
        anthropic_message("Done."),
    )
    agent = so.Agent(name="support", model=model, tools=[lookup_order, issue_refund])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="Refund order 1042")
        assert [p.call_id for p in r.pending] == ["toolu_pay"]  # the lookup ran meanwhile
        r = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=r.pending[0].id, approved=True)]
        )
        assert r.status == "completed"
    last = fake.bodies[1]["messages"][-1]
    assert last["role"] == "user"
    assert [(b["type"], b["tool_use_id"]) for b in last["content"]] == [
        ("tool_result", "toolu_look"),
        ("tool_result", "toolu_pay"),
    ]
    assert [b.get("is_error", False) for b in last["content"]] == [False, False]
    assert len(fake.bodies[1]["messages"]) == 3


async def test_a_call_left_open_by_a_cancelled_turn_gets_a_result_before_the_next_prompt(
    fake: FakeLLM, model: so.models.Anthropic, tmp_path: Path
) -> None:
    # A tool_use with no tool_result makes the API refuse every later request of the session.
    fake.queue(
        anthropic_message(
            tool_use("toolu_look", "lookup_order", {"order_id": "1042"}),
            tool_use("toolu_pay", "issue_refund", {"order_id": "1042", "amount": 180}),
        ),
        anthropic_message("Hello again."),
    )
    agent = so.Agent(name="support", model=model, tools=[lookup_order, issue_refund])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="Refund order 1042")
        r = await rt.cancel(r.session_id, "changed my mind")
        r = await rt.generate(session_id=r.session_id, prompt="hello")
        assert (r.status, r.error, r.text) == ("completed", None, "Hello again.")
    last = fake.bodies[1]["messages"][-1]
    assert [(b["type"], b.get("tool_use_id"), b.get("is_error")) for b in last["content"]] == [
        ("tool_result", "toolu_look", None),
        ("tool_result", "toolu_pay", True),
        ("text", None, None),
    ]
    assert '"cancelled": true' in last["content"][1]["content"]


@so.tool
async def blank() -> str:
    """Return nothing but whitespace."""
    return "\n"


async def test_blank_text_never_reaches_the_api(fake, model, tmp_path: Path) -> None:
    # The API refuses a text block of whitespace alone with a 400, so one blank user message or
    # a model's blank text before a tool_use made every later request of the session fail.
    # (A blank prompt is refused before any model sees it; a blank user message can still come
    # from a history written before that, or a custom message source.)
    fake.queue(
        anthropic_message("\n\n", tool_use("toolu_b", "blank", {})),
        anthropic_message("Nothing there."),
        anthropic_message("Still here."),
    )
    agent = so.Agent(name="support", model=model, tools=[blank])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="look")
        assert (r.status, r.error) == ("completed", None)
        assert r.text.endswith("Nothing there.")
    assert fake.bodies[1]["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "look"}]},
        {"role": "assistant", "content": [tool_use("toolu_b", "blank", {})]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_b"}]},
    ]
    assert (await model.complete(request(so.UserMessage(text="  ")))).text == "Still here."
    assert fake.bodies[2]["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "(empty message)"}]},
    ]


async def _used_a_tool_then_lost_it(fake: FakeLLM, model: so.models.Anthropic, db: str) -> str:
    """A session whose agent looked an order up; the session of the same agent, deployed again
    without tools, where the next prompt goes."""
    fake.queue(
        anthropic_message(tool_use("toolu_look", "lookup_order", {"order_id": "1042"})),
        anthropic_message("It shipped."),
    )
    agent = so.Agent(name="support", model=model, tools=[lookup_order])
    async with so.Runtime([agent], store=db) as rt:
        r = await rt.generate("support", prompt="Where is order 1042?")
        assert (r.status, r.text) == ("completed", "It shipped.")
    assert "tool_choice" not in fake.bodies[1]  # with tools, nothing changes
    return r.session_id


async def test_a_session_that_used_tools_goes_on_once_its_agent_has_none(
    fake: FakeLLM, model: so.models.Anthropic, tmp_path: Path
) -> None:
    # The API refuses tool_use/tool_result blocks without `tools`: every later turn of such a
    # session failed with a 400, marked retryable, for good.
    db = f"sqlite:///{tmp_path}/s.db"
    session_id = await _used_a_tool_then_lost_it(fake, model, db)
    fake.queue(anthropic_message("You're welcome."))
    async with so.Runtime([so.Agent(name="support", model=model)], store=db) as rt:
        r = await rt.generate(session_id=session_id, prompt="thanks")
        assert (r.status, r.error, r.text) == ("completed", None, "You're welcome.")
    body = fake.bodies[2]
    assert [(t["name"], t["input_schema"]) for t in body["tools"]] == [
        ("lookup_order", {"type": "object"})
    ]
    assert body["tool_choice"] == {"type": "none"}
    assert body["messages"][:3] == fake.bodies[1]["messages"]  # the history as it was sent


async def test_a_stand_in_the_model_calls_anyway_is_an_unknown_tool(
    fake: FakeLLM, model: so.models.Anthropic, tmp_path: Path
) -> None:
    # `tool_choice` none should keep the model from calling one; if it did, the call is answered
    # as any call of a tool the agent lacks, and the turn goes on.
    db = f"sqlite:///{tmp_path}/s.db"
    session_id = await _used_a_tool_then_lost_it(fake, model, db)
    fake.queue(
        anthropic_message(tool_use("toolu_again", "lookup_order", {"order_id": "7"})),
        anthropic_message("I can no longer look orders up."),
    )
    async with so.Runtime([so.Agent(name="support", model=model)], store=db) as rt:
        r = await rt.generate(session_id=session_id, prompt="and order 7?")
        assert (r.status, r.text) == ("completed", "I can no longer look orders up.")
    [result] = fake.bodies[3]["messages"][-1]["content"]
    assert (result["tool_use_id"], result["is_error"]) == ("toolu_again", True)
    assert "unknown tool 'lookup_order'; available: none" in result["content"]
