"""`ask_question()`: the opt-in built-in tool that lets the model ask the user one question."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from ._option_names import shadowed_number, twin_labels, unique_name
from ._tool_context import ToolContext
from ._tool_signals import InputUnavailable, QuestionWithdrawn
from ._tools import Tool
from ._types import Option

__all__ = ["MAX_QUESTION_CHARS", "QuestionOption", "answered", "ask_question", "echoes_answers"]

MAX_QUESTION_CHARS = 2000
"""The longest question the model may ask (its options are bounded below): a person reads it
at a glance in every pending list, and Slack shows it whole (it clips a text at 3,000)."""


class QuestionOption(BaseModel):
    """One of two or three mutually exclusive choices."""

    model_config = ConfigDict(extra="forbid")

    label: str = Field(min_length=1, max_length=80)
    description: str = Field(min_length=1, max_length=300, description="One sentence.")


def _choices(options: list[QuestionOption]) -> list[Option]:
    """The options a person is shown, numbered from 1 (their ids)."""
    return [
        Option(id=str(i), label=o.label, description=o.description)
        for i, o in enumerate(options, 1)
    ]


def _distinct(options: list[QuestionOption]) -> list[QuestionOption]:
    """Refuse options a person cannot tell apart: a label twice, one that no reply names alone
    (each label another's number), or a label `#2` taking the second's reply; the model is told,
    and can ask again."""
    choices = _choices(options)
    problem = twin_labels(choices) or shadowed_number(choices)
    if problem is not None:
        raise ValueError(problem)
    for choice in choices:
        if unique_name(choices, choice) is None:
            raise ValueError(
                f"no reply names option {choice.label.strip()!r} alone (its number and its "
                f"label name other options too): choose labels that are not another's number"
            )
    return options


async def _ask_question(
    ctx: ToolContext,
    question: Annotated[str, Field(max_length=MAX_QUESTION_CHARS)],
    options: Annotated[
        list[QuestionOption], Field(min_length=2, max_length=3), AfterValidator(_distinct)
    ]
    | None = None,
) -> dict[str, Any]:
    """Ask the user one question instead of guessing, optionally with 2 or 3 choices.

    Their labels must be distinct. The user can always type their own answer, so never add an
    "Other" option.
    """
    choices = None if options is None else _choices(options)
    try:
        answer = await ctx.ask(question, options=choices, allow_text=True)
    except QuestionWithdrawn:
        return {"interrupted": True}
    except InputUnavailable:
        return {"status": "unavailable"}
    return answered(answer.value)


def answered(value: str) -> dict[str, Any]:
    """What `ask_question` returns for an answer: the answer whole, which the model reads."""
    return {"status": "answered", "answer": value}


def echoes_answers(tool: Tool) -> bool:
    """Whether `tool` is an `ask_question` tool, whose result is its answer whole (`answered`):
    an answer over its `max_result_bytes` could never reach the model."""
    return tool.fn is _ask_question


def ask_question(*, name: str = "ask_question") -> Tool:
    """The `ask_question` tool: `{question, options?}` in, the user's answer out."""
    return Tool(_ask_question, name=name, workflow=True)
