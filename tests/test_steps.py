"""A journaled step that raised (`_steps`): what its failure records, and what replay raises."""

from __future__ import annotations

import json

import pytest

import signoff as so
from signoff._steps import failure_of, raise_recorded


class Declined(Exception):
    """Builds its message from its argument: its args, given to it again, make another message."""

    def __init__(self, amount: object) -> None:
        super().__init__(f"declined {amount}")


def replayed(error: dict[str, object]) -> BaseException:
    """What replaying the step failure `error` raises, after a round trip through JSON."""
    with pytest.raises(Exception) as info:
        raise_recorded("charge", json.loads(json.dumps(error, allow_nan=False)))
    return info.value


def test_plain_arguments_are_kept_and_the_same_exception_is_raised_again() -> None:
    error = failure_of(ValueError("bad", 3, [1.5, None], {"k": True}))
    assert error["args"] == ["bad", 3, [1.5, None], {"k": True}]
    again = replayed(error)
    assert type(again) is ValueError and again.args == ("bad", 3, [1.5, None], {"k": True})


def test_an_exception_its_args_rebuild_with_another_message_replays_as_step_failed() -> None:
    """`Declined(5)` holds the args `("declined 5",)`: built from them it would say `declined
    declined 5`, so replay raises `StepFailed` with the message the step raised."""
    error = failure_of(Declined(5))
    assert error["args"] == ["declined 5"] and error["message"] == "declined 5"
    again = replayed(error)
    assert isinstance(again, so.StepFailed)
    assert again.error_type == f"{__name__}.Declined" and again.error_message == "declined 5"


@pytest.mark.parametrize(
    "arg",
    [object(), float("nan"), float("inf"), {1: "one"}, ("a", 1), b"x"],
    ids=["object", "nan", "inf", "int-key", "tuple", "bytes"],
)
def test_arguments_the_log_cannot_give_back_as_they_were_are_not_kept(arg: object) -> None:
    """Arguments JSON cannot hold, or gives back changed, are left out (the entry stays plain
    JSON, so the store takes it), and replay raises `StepFailed` with the message."""
    exc = ValueError(arg)
    error = failure_of(exc)
    assert error["args"] is None
    again = replayed(error)
    assert isinstance(again, so.StepFailed)
    assert again.error_type == "ValueError" and again.error_message == str(exc)
