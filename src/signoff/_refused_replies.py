"""A model reply refused as unusable but billed (a `ModelError` with `usage`): what it cost, which
the failed turn or the budget's request counts, and how much of its input the next call reads
again, which the budgets hold back before it."""

from __future__ import annotations

from typing import Any

from ._exceptions import ModelError
from ._types import Usage, billable, usage_fields

__all__ = ["billing", "read_again", "refused_cost"]


def refused_cost(exc: BaseException) -> Usage | None:
    """What the refused reply behind a `ModelError` cost, when it says (see `billable`): the
    failed turn adds it to the session's usage, as the provider billed it."""
    return billable(exc.usage) if isinstance(exc, ModelError) else None


def read_again(exc: BaseException, usage: Usage | None) -> int | None:
    """How many of the refused reply's input tokens (`usage`, its `refused_cost`) the next call
    reads again, when the model says not all of them (`ModelError.context_tokens`; 0: not
    known), at most its input. One built without it (an older signoff's, rebuilt from a
    journal; the HTTP client's), or not a whole number from 0, says nothing: all of it is
    held back."""
    kept = getattr(exc, "context_tokens", None) if isinstance(exc, ModelError) else None
    if type(kept) is not int or kept < 0 or usage is None:
        return None
    return min(kept, usage.input_tokens)


def billing(usage: Usage | None, kept: int | None) -> dict[str, Any]:
    """What an event counts of a reply billed and not used: its `usage`, and `context_tokens`
    when the next call reads again less than all its input (what `model.completed` says of a
    reply used), which the budgets then hold back before it instead."""
    if usage is None:
        return {}
    return {**usage_fields(usage), **({} if kept is None else {"context_tokens": kept})}
