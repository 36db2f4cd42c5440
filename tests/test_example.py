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


async def test_a_refund_of_nothing_is_refused_not_made_in_full(
    tmp_path: Path, support: so.Agent
) -> None:
    """'$0' was read as no amount at all: the demo refunded the order's whole 45.00, and under
    the approval threshold, without asking anyone."""
    import examples.support

    async with so.Runtime([support], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="refund order 1043 $0, changed my mind")
        assert (r.status, r.pending) == ("completed", [])
        assert r.text == (
            "The refund failed: amount must be between 0 and what is left of the order total "
            "45.00: 45.00."
        )
    assert examples.support.REFUNDS == []


@pytest.mark.parametrize(
    ("prompt", "amount"),
    [
        ("refund 30 euros on order 1043, it was late", 30.0),
        ("refund 1 dollar on order 1043, it was late", 1.0),
        ("refund 12,50 EUR on order 1043, it was late", 12.5),
        ("refund USD 20 on order 1043, it was late", 20.0),
        ("refund €5 on order 1043, it was late", 5.0),
        ("refund 7.25$ on order 1043, it was late", 7.25),
    ],
)
async def test_an_amount_in_any_currency_word_is_the_amount_refunded(
    tmp_path: Path, support: so.Agent, prompt: str, amount: float
) -> None:
    """Only `$N`, `N usd`, `N dollars` and `N eur` were read: "30 euros" or "1 dollar" refunded
    the whole 45.00 (under the approval threshold, so no one was asked), "50,00 EUR" nothing."""
    import examples.support

    async with so.Runtime([support], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt=prompt)
        assert (r.status, r.pending) == ("completed", []), r
        assert f"refunded {amount:.2f} for order 1043" in r.text
    assert [x["amount"] for x in examples.support.REFUNDS] == [amount]


async def test_an_order_is_refunded_at_most_its_total_in_all(
    tmp_path: Path, support: so.Agent
) -> None:
    """Each refund was checked against the order's total alone: three refunds of the 45.00
    order refunded 135.00, none asked about (each under the threshold)."""
    import examples.support

    async with so.Runtime([support], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="refund $30 on order 1043, it was late")
        assert "refunded 30.00" in r.text
        r = await rt.send(r.session_id, "refund order 1043, it broke")
        assert r.text == (
            "The refund failed: amount must be between 0 and what is left of the order total "
            "45.00: 15.00 (30.00 refunded already)."
        )
        r = await rt.send(r.session_id, "refund $15 on order 1043, it broke")
        assert "refunded 15.00" in r.text
        # what is left is reckoned in cents: 120.00 - 64.40 leaves 55.60, not 55.5999...
        r = await rt.send(r.session_id, "refund $64.40 on order 1044, it broke")
        assert "refunded 64.40" in r.text, r
        r = await rt.send(r.session_id, "refund $55.60 on order 1044, it broke")
        assert "refunded 55.60" in r.text, r
    assert [x["amount"] for x in examples.support.REFUNDS] == [30.0, 15.0, 64.4, 55.6]


@pytest.mark.parametrize(
    "prompt",
    [
        "I bought it in 2025, refund order 1042, it arrived broken",
        "refund order \uff11\uff10\uff14\uff12, it arrived broken",  # full-width digits
        "refund order #1042, it arrived broken",
    ],
    ids=["a-year-first", "full-width", "hash"],
)
async def test_the_order_is_the_number_after_order(
    tmp_path: Path, support: so.Agent, prompt: str
) -> None:
    """The first number of four digits or more was the order: a year said first was looked up
    ("no order 2025"), and full-width digits (an input method's wide mode) were no order."""
    async with so.Runtime([support], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt=prompt)
        (approval,) = r.pending
        assert approval.tool_name == "issue_refund" and approval.input["order_id"] == "1042"


async def test_delete_account_is_gated_by_the_guardrail(tmp_path: Path, support: so.Agent) -> None:
    async with so.Runtime([support], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="please delete account ann@example.com")
        (approval,) = r.pending
        assert approval.tool_name == "delete_account" and approval.source == "guardrail"


async def test_delete_account_without_an_email_asks_for_it_then_waits_for_approval(
    tmp_path: Path, support: so.Agent
) -> None:
    """The demo model asks which account as a question (parked, shown in the queue) and
    follows the answer, rather than a sentence whose reply it could not act on."""
    async with so.Runtime([support], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="delete my account")
        (question,) = r.pending
        assert question.kind == "question" and "email" in (question.question or "")
        r = await rt.send(r.session_id, "it is ann@example.com")
        (approval,) = r.pending
        assert approval.tool_name == "delete_account"
        assert approval.input == {"email": "ann@example.com"}
        r = await rt.send(r.session_id, "approve")
        assert (r.status, r.text) == ("completed", "The account ann@example.com has been deleted.")


def test_a_failing_runtime_factory_is_one_clear_usage_error(tmp_path: Path) -> None:
    import sys

    from signoff.server import load_runtime

    (tmp_path / "broken_factory.py").write_text(
        "def make():\n    raise RuntimeError('no config file')\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(so.UsageError, match="broken_factory:make\\(\\) failed: RuntimeError"):
            load_runtime("broken_factory:make")
    finally:
        sys.path.remove(str(tmp_path))


def test_an_async_runtime_factory_is_refused_without_a_stray_warning(tmp_path: Path) -> None:
    import sys

    from signoff.server import load_runtime

    (tmp_path / "async_factory.py").write_text("async def make():\n    return None\n")
    sys.path.insert(0, str(tmp_path))
    try:
        # filterwarnings = error: a coroutine left unawaited would fail the test at collection.
        with pytest.raises(so.UsageError, match=r"async_factory:make\(\) is a coroutine"):
            load_runtime("async_factory:make")
        import gc

        gc.collect()
    finally:
        sys.path.remove(str(tmp_path))


async def test_an_amount_is_read_whole_with_its_sign_and_every_decimal(
    tmp_path: Path, support: so.Agent
) -> None:
    """The demo model read "$100.005" as 100.00 (refunded with no one asked: the threshold is
    over 100), and in "order 1042 $-5" took the order number for the amount (1042 asked for);
    now 100.005 is asked about as it is, and -5 reaches the tool, which refuses it."""
    import examples.support

    async with so.Runtime([support], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="refund order 1044 $100.005, it broke")
        assert r.status == "waiting", r
        (request,) = r.pending
        assert request.action is not None and request.action.input["amount"] == 100.005
        for prompt in ("refund order 1042 $-5, it broke", "refund order 1042 -5$, it broke"):
            r = await rt.generate("support", prompt=prompt)
            assert r.status == "completed" and r.pending == [], r
            assert r.text.startswith("The refund failed: amount must be between 0"), r.text
    assert examples.support.REFUNDS == []
