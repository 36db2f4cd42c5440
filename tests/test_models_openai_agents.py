"""`OpenAIChat` end to end through an agent: an approved call, a denial, a failed turn, malformed
arguments, parallel tool calls and a call a cancelled turn left open."""

from __future__ import annotations

import json
from pathlib import Path

import signoff as so
from signoff.testing import ManualClock

from ._models import issue_refund, lookup_order, support_agent
from ._models_openai import fake, model
from .fakes.llm import FakeLLM, Reply, openai_completion, openai_tool_call

__all__ = ["fake", "model"]  # the fixtures, used by name


async def test_an_approved_call_round_trips_through_the_sdk(fake, model, tmp_path: Path) -> None:
    fake.queue(
        openai_completion(
            "Let me refund that.",
            [openai_tool_call("call_abc", "issue_refund", {"order_id": "1042", "amount": 180})],
            usage=(100, 20),
        ),
        openai_completion("Refunded 180.", usage=(150, 10)),
    )
    async with so.Runtime([support_agent(model)], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="Refund order 1042")
        assert r.status == "waiting"
        [req] = r.pending
        assert (req.tool_name, req.call_id) == ("issue_refund", "call_abc")
        assert req.input == {"order_id": "1042", "amount": 180.0}
        assert len(fake.received) == 1  # the model is not called while the call waits

        r = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=req.id, approved=True)]
        )
        assert r.status == "completed" and r.text.endswith("Refunded 180.")
        state = await rt.state(r.session_id)
        assert (state.usage.input_tokens, state.usage.output_tokens) == (250, 30)

    first, second = fake.bodies
    assert first["messages"] == [
        {"role": "system", "content": "You help customers."},
        {"role": "user", "content": "Refund order 1042"},
    ]
    [tool] = first["tools"]
    assert tool["type"] == "function"
    assert tool["function"]["name"] == "issue_refund"
    assert tool["function"]["description"] == "Refund an order."
    assert set(tool["function"]["parameters"]["properties"]) == {"order_id", "amount"}
    assert second["messages"][2:] == [
        {
            "role": "assistant",
            "content": "Let me refund that.",
            "tool_calls": [
                {
                    "id": "call_abc",
                    "type": "function",
                    "function": {
                        "name": "issue_refund",
                        "arguments": '{"order_id": "1042", "amount": 180}',
                    },
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_abc",
            "content": '{"refunded": 180.0, "order_id": "1042"}',
        },
    ]


async def test_a_denial_and_its_reason_reach_the_model(fake, model, tmp_path: Path) -> None:
    fake.queue(
        openai_completion(
            None, [openai_tool_call("call_d", "issue_refund", {"order_id": "9", "amount": 5000})]
        ),
        openai_completion("Sorry, the refund was declined."),
    )
    async with so.Runtime([support_agent(model)], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="Refund order 9")
        r = await rt.generate(
            session_id=r.session_id,
            approvals=[so.Decision(id=r.pending[0].id, approved=False, reason="over the limit")],
        )
        assert r.status == "completed"
    tool_message = fake.bodies[1]["messages"][-1]
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "call_d"
    assert tool_message["content"].startswith("DENIED: the call to issue_refund was not run.")
    assert "over the limit" in tool_message["content"]


async def test_a_server_error_fails_the_turn_retryably(fake, model, tmp_path: Path) -> None:
    fake.queue(Reply({"error": {"message": "model overloaded"}}, 500))
    async with so.Runtime([support_agent(model)], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="hi")
        assert r.status == "failed" and r.retryable is True
        assert r.error is not None and r.error["code"] == "model_error"
        assert "HTTP 500" in r.error["message"] and "model overloaded" in r.error["message"]

        fake.queue(openai_completion("Hello!"))
        r = await rt.generate(session_id=r.session_id)  # the retry resumes the same turn
        assert (r.status, r.text) == ("completed", "Hello!")
    assert fake.bodies[0]["messages"] == fake.bodies[1]["messages"]


async def test_malformed_arguments_become_a_tool_error_the_model_sees(
    fake, model, tmp_path: Path
) -> None:
    raw = '{"order_id": "1042", "amount": 18'
    fake.queue(
        openai_completion(None, [openai_tool_call("call_bad", "issue_refund", raw)]),
        openai_completion("Sorry, let me retry that."),
    )
    async with so.Runtime([support_agent(model)], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="Refund order 1042")
        # no approval is asked for a call that cannot be validated, and it never runs
        assert (r.status, r.pending) == ("completed", [])
        events = [e async for e in rt.events(r.session_id, after=0, follow=False)]
    completed = [e.data for e in events if e.type == "tool.completed"]
    assert [(d["call_id"], d["status"]) for d in completed] == [("call_bad", "error")]
    assistant, tool_message = fake.bodies[1]["messages"][-2:]
    # the malformed text goes back exactly as the model wrote it
    sent = assistant["tool_calls"][0]["function"]["arguments"]
    assert json.loads(sent) == {"_unparsed_arguments": raw}  # a JSON object, what it wrote in it
    assert tool_message["tool_call_id"] == "call_bad"
    content = tool_message["content"]
    assert content.startswith("ERROR: the call to issue_refund failed.")
    details = json.loads(content.split("failed. ", 1)[1])
    assert details["error"] == "invalid input"
    # One error that says the arguments could not be read: it named a parameter the model never
    # sent (`_unparsed_arguments`, not permitted) and called the ones it did send missing.
    [detail] = details["details"]
    assert (detail["loc"], detail["type"]) == ([], "json_invalid")
    assert detail["msg"].startswith("Invalid JSON: the arguments could not be read as a JSON")
    assert "_unparsed" not in content


async def test_parallel_tool_calls_each_get_their_tool_message(
    fake: FakeLLM, model: so.models.OpenAIChat, tmp_path: Path
) -> None:
    fake.queue(
        openai_completion(
            None,
            [
                openai_tool_call("call_look", "lookup_order", {"order_id": "1042"}),
                openai_tool_call("call_pay", "issue_refund", {"order_id": "1042", "amount": 180}),
            ],
        ),
        openai_completion("Done."),
    )
    agent = so.Agent(name="support", model=model, tools=[lookup_order, issue_refund])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="Refund order 1042")
        assert [p.call_id for p in r.pending] == ["call_pay"]  # the lookup ran meanwhile
        r = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=r.pending[0].id, approved=True)]
        )
        assert r.status == "completed"
    assistant, *results = fake.bodies[1]["messages"][1:]
    assert [c["id"] for c in assistant["tool_calls"]] == ["call_look", "call_pay"]
    assert [(m["role"], m["tool_call_id"]) for m in results] == [
        ("tool", "call_look"),
        ("tool", "call_pay"),
    ]
    assert json.loads(results[0]["content"]) == {"order_id": "1042", "total": 180.0}


async def test_a_call_left_open_by_a_cancelled_turn_gets_a_result_before_the_next_prompt(
    fake: FakeLLM, model: so.models.OpenAIChat, tmp_path: Path
) -> None:
    # A call with no tool message makes the API refuse every later request of the session.
    fake.queue(
        openai_completion(
            None,
            [
                openai_tool_call("call_look", "lookup_order", {"order_id": "1042"}),
                openai_tool_call("call_pay", "issue_refund", {"order_id": "1042", "amount": 180}),
            ],
        ),
        openai_completion("Hello again."),
    )
    agent = so.Agent(name="support", model=model, tools=[lookup_order, issue_refund])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="Refund order 1042")
        r = await rt.cancel(r.session_id, "changed my mind")
        assert r.status == "cancelled"
        r = await rt.generate(session_id=r.session_id, prompt="hello")
        assert (r.status, r.error, r.text) == ("completed", None, "Hello again.")
    look, pay, prompt = fake.bodies[1]["messages"][2:]
    assert (look["tool_call_id"], pay["tool_call_id"]) == ("call_look", "call_pay")
    assert pay["content"].startswith("CANCELLED: the call to issue_refund has no result.")
    assert prompt == {"role": "user", "content": "hello"}


async def test_a_call_whose_approval_expired_reads_as_not_run(
    fake: FakeLLM, model: so.models.OpenAIChat, tmp_path: Path
) -> None:
    """It read "ERROR: the call to ask_refund failed.", against its own `"ran": false`."""
    fake.queue(
        openai_completion(
            None, [openai_tool_call("call_pay", "ask_refund", {"order_id": "1042", "amount": 5})]
        ),
        openai_completion("Nobody approved it."),
    )

    @so.tool(name="ask_refund", approval=so.always(expires_in=60, on_timeout="deny"))
    async def ask_refund(order_id: str, amount: float) -> dict[str, object]:
        """Refund an order."""
        return {"refunded": amount, "order_id": order_id}

    clock = ManualClock()
    agent = so.Agent(name="support", model=model, tools=[ask_refund])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db", clock=clock) as rt:
        r = await rt.generate("support", prompt="Refund order 1042")
        clock.advance(61)
        assert await rt.expire_due() == 1
        assert (await rt.state(r.session_id)).turn is not None
    (pay,) = [m for m in fake.bodies[1]["messages"] if m["role"] == "tool"]
    assert pay["content"].startswith(
        "EXPIRED: no one decided on the call to ask_refund in time; it was not run. "
    )
    assert json.loads(pay["content"].split("not run. ", 1)[1])["ran"] is False
