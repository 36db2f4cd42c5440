"""Whether a reply's usage holds the token counts a session's budgets need: a reply that reports
none (or counts that are not whole numbers from 0) would count as free, and a budget would never
be spent, so a call the budgets bound fails on it instead."""

from __future__ import annotations

from typing import Any

from ._provider import plain_int

__all__ = ["uncounted", "unread_usage"]


def unread_usage(usage: Any, fields: tuple[str, ...]) -> str | None:
    """The first of `fields` a reply's `usage` does not hold as a token count `plain_int` takes
    as it is (`usage` itself when there is none), or None when it holds them all: what a
    session's budgets cannot count."""
    if usage is None or isinstance(usage, str | int | float | list):
        return "usage"
    for field in fields:
        value = getattr(usage, field, None)
        if isinstance(value, bool) or value is None or plain_int(value) != value:
            return f"usage.{field}"
    return None


def uncounted(what: str, where: str, field: str) -> str:
    """Why a reply whose usage lacks `field` fails a call the session's budgets bound."""
    return (
        f"{what} for {where} reported no usage the session's budgets can count ({field} is "
        "missing or not a whole number from 0): counted as free, its replies would never spend "
        "max_tokens or max_cost_usd; use a server that reports usage, or no budget"
    )
