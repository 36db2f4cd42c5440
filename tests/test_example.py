"""The example support agent (`examples/support.py`) with its offline demo model."""

from pathlib import Path

import pytest

import signoff as so


@pytest.fixture
def support(monkeypatch: pytest.MonkeyPatch) -> so.Agent:
    monkeypatch.setenv("SIGNOFF_MODEL", "demo")
    import importlib

    import examples.support

    agent: so.Agent = importlib.reload(examples.support).agent
    return agent


async def test_asks_which_order_then_waits_for_the_refund_approval(
    tmp_path: Path, support: so.Agent
) -> None:
    async with so.Runtime([support], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="I want a refund please, it arrived broken")
        (question,) = r.pending
        assert question.kind == "question" and question.question == "Which order should I refund?"
        r = await rt.send(r.session_id, "it's order 1042")
        (approval,) = r.pending
        assert approval.tool_name == "issue_refund"
        assert approval.input == {
            "order_id": "1042",
            "amount": 180.0,
            "reason": "It arrived broken",
        }
        r = await rt.send(r.session_id, "deny")  # a typed option answers the approval
        assert r.status == "completed"
        assert "couldn't issue the refund" in r.text


async def test_delete_account_is_gated_by_the_guardrail(tmp_path: Path, support: so.Agent) -> None:
    async with so.Runtime([support], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="please delete account ann@example.com")
        (approval,) = r.pending
        assert approval.tool_name == "delete_account" and approval.source == "guardrail"
