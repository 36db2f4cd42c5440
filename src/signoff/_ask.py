"""`ask_question()`: the opt-in built-in tool that lets the model ask the user one question."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from ._tool_context import ToolContext
from ._tool_signals import InputUnavailable, QuestionWithdrawn
from ._tools import Tool

__all__ = ["QuestionOption", "ask_question"]


class QuestionOption(BaseModel):
    """One of two or three mutually exclusive choices."""

    model_config = ConfigDict(extra="forbid")

    label: str = Field(min_length=1, max_length=80)
    description: str = Field(min_length=1, max_length=300, description="One sentence.")


async def _ask_question(
    ctx: ToolContext,
    question: str,
    options: Annotated[list[QuestionOption], Field(min_length=2, max_length=3)] | None = None,
) -> dict[str, Any]:
    """Ask the user one question instead of guessing, optionally with 2 or 3 choices.

    The user can always type their own answer, so never add an "Other" option.
    """
    choices = None
    if options is not None:
        choices = [
            {"id": str(i + 1), "label": o.label, "description": o.description}
            for i, o in enumerate(options)
        ]
    try:
        answer = await ctx.ask(question, options=choices, allow_text=True)
    except QuestionWithdrawn:
        return {"interrupted": True}
    except InputUnavailable:
        return {"status": "unavailable"}
    return {"status": "answered", "answer": answer.value}


def ask_question(*, name: str = "ask_question") -> Tool:
    """The `ask_question` tool: `{question, options?}` in, the user's answer out."""
    return Tool(_ask_question, name=name, workflow=True)
