"""Every error and control-flow signal signoff raises survives pickling whole (a process pool,
a multiprocessing queue, a test runner's worker): same class, message, args and attributes;
and the hierarchy the exceptions module draws is the classes' own."""

from __future__ import annotations

import copy
import inspect
import pickle
from collections.abc import Callable

import pytest

import signoff as so
from signoff import channels

SAMPLES: dict[str, Callable[[], BaseException]] = {
    "SignoffError": lambda: so.SignoffError("m"),
    "UsageError": lambda: so.UsageError("m"),
    "IdempotencyKeyReused": lambda: so.IdempotencyKeyReused("key reused", "ses_1"),
    "InvalidAnswer": lambda: so.InvalidAnswer("bad", ["req_1"]),
    "TooLarge": lambda: so.TooLarge("big"),
    "UnknownAgent": lambda: so.UnknownAgent("unknown agent 'b'"),
    "UnknownTool": lambda: so.UnknownTool("unknown tool 'b'"),
    "ReplayError": lambda: so.ReplayError("order changed"),
    "SessionError": lambda: so.SessionError("about it", "ses_1"),
    "UnknownSession": lambda: so.UnknownSession("ses_1"),
    "SessionExpired": lambda: so.SessionExpired("ses_1", ["req_1", "req_2"]),
    "SessionBusy": lambda: so.SessionBusy("busy", "ses_1"),
    "SessionDeleted": lambda: so.SessionDeleted("ses_1"),
    "SessionWaiting": lambda: so.SessionWaiting("ses_1", ["req_1", "req_2"]),
    "SubagentSession": lambda: so.SubagentSession("ses_2", "ses_1"),
    "SubagentOrphaned": lambda: so.SubagentOrphaned("ses_2", "ses_1"),
    "SessionLimitReached": lambda: so.SessionLimitReached("spent", "ses_1"),
    "AnswerError": lambda: so.AnswerError("no", ["req_1"]),
    "UnknownRequest": lambda: so.UnknownRequest("ses_1", ["req_1", "req_2"]),
    "PartialAnswer": lambda: so.PartialAnswer("ses_1", ["req_1", "req_2"], ["req_2"]),
    "ConflictingAnswer": lambda: so.ConflictingAnswer("differs", ["req_1"]),
    "RequestClosed": lambda: so.RequestClosed("closed", ["req_1"]),
    "StaleAnswer": lambda: so.StaleAnswer("stale", ["req_1"]),
    "NotAllowed": lambda: so.NotAllowed("not you", ["req_1"]),
    "ModelError": lambda: so.ModelError("down"),
    "BudgetSpent": lambda: so.BudgetSpent("cut", usage=so.Usage(output_tokens=40), needed=1025),
    "StepFailed": lambda: so.StepFailed("quote", "ValueError", "boom"),
    "RemoteError": lambda: so.RemoteError("gone", "timeout", 0, idempotency_key="k1"),
    "StoreError": lambda: so.StoreError("broken"),
    "SchemaVersionError": lambda: so.SchemaVersionError("newer"),
    "StoreGone": lambda: so.StoreGone("deleted"),
    "AppendConflict": lambda: so.AppendConflict("moved"),
    "LeaseLost": lambda: so.LeaseLost("taken"),
    "EventsRewritten": lambda: so.EventsRewritten("ses_1", 3),
    "StoreUnavailable": lambda: so.StoreUnavailable("down"),
    "StoreBusy": lambda: so.StoreBusy("busy"),
    "StoreDamaged": lambda: so.StoreDamaged("request req_1: a stored document is not JSON"),
    "ApprovalRequired": lambda: so.ApprovalRequired({"amount": 5}, call_id="call_1"),
    "QuestionWithdrawn": lambda: so.QuestionWithdrawn("req_1", "ignored"),
    "InputUnavailable": lambda: so.InputUnavailable("nobody can answer"),
    "InvalidSignature": lambda: channels.InvalidSignature("forged"),
    "RateLimited": lambda: channels.RateLimited("slow down", 2.5),
    "ChannelUnreachable": lambda: channels.ChannelUnreachable("invite the bot", 30.0),
}


def _exported_exceptions() -> set[str]:
    names = set()
    for module in (so, channels):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) and issubclass(obj, BaseException):
                names.add(name)
    return names


def test_every_exported_error_and_signal_has_a_sample() -> None:
    assert sorted(_exported_exceptions() - SAMPLES.keys()) == []


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_a_pickled_error_comes_back_whole(name: str) -> None:
    error = SAMPLES[name]()
    for back in (pickle.loads(pickle.dumps(error)), copy.copy(error), copy.deepcopy(error)):
        assert type(back) is type(error)
        assert str(back) == str(error)
        assert back.args == error.args
        assert vars(back) == vars(error)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_a_pickled_error_keeps_its_notes_and_attributes(name: str) -> None:
    """`QuestionWithdrawn` and `ApprovalRequired` were rebuilt from their arguments alone: a
    note added on the way up (`add_note`) or an attribute set on them was lost in a pool."""
    error = SAMPLES[name]()
    error.add_note("while refunding order 1")
    error.attempt = 2  # type: ignore[attr-defined]
    for back in (pickle.loads(pickle.dumps(error)), copy.copy(error), copy.deepcopy(error)):
        assert type(back) is type(error)
        assert back.args == error.args
        assert vars(back) == vars(error)
        assert back.__notes__ == ["while refunding order 1"]


def test_a_partial_answer_says_how_the_questions_it_names_are_answered() -> None:
    """A decision cannot answer a question: the message says to answer it with respond() (or
    over HTTP at /responses) instead of only asking for every request in one call."""
    approvals = str(so.PartialAnswer("ses_1", ["req_1"]))
    assert approvals.endswith("unanswered: req_1") and "question" not in approvals
    one = so.PartialAnswer("ses_1", ["req_1", "req_2"], ["req_2", "req_9"])
    assert one.request_ids == ["req_1", "req_2"]
    assert str(one).endswith(
        "unanswered: req_1, req_2 (req_2 is a question, which a decision does not answer: "
        "answer it first with respond(), over HTTP POST /v1/sessions/ses_1/responses)"
    )
    two = str(so.PartialAnswer("ses_1", ["req_1", "req_2"], ["req_1", "req_2"]))
    assert "req_1, req_2 are questions" in two and "answer them first" in two
