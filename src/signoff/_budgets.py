"""What a session may still spend: its own budgets and, in a turn its parent delegated, what
the parent had left, as the engine checks them before each model call and a child records them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ._state import SessionState, delegated_turn
from ._types import Usage

__all__ = ["budget_left", "by_budget"]


def budget_left(s: SessionState, max_tokens: int | None, max_cost: float | None) -> dict[str, Any]:
    """What the session may still spend now, by budget (`max_tokens`, `max_cost_usd`): what its
    own budgets leave (raised by each `continue`) and, in the turn its parent delegated, what its
    parent had left (its own `headroom`), whichever is less. A new child's `session.created`
    records it, so the child's bound is fixed once, the same on replay and after a restart."""
    times = 1 + s.limit_grants
    spent = s.usage + s.delegated
    left: dict[str, Any] = {}
    if max_tokens is not None:
        left["max_tokens"] = max_tokens * times - spent.total_tokens
    if max_cost is not None:
        left["max_cost_usd"] = max_cost * times - spent.cost_usd
    if delegated_turn(s):
        for key, cap in s.headroom.items():
            used = spent.total_tokens if key == "max_tokens" else spent.cost_usd
            left[key] = min(left.get(key, cap - used), cap - used)
    return {key: max(value, 0) for key, value in left.items()}


def by_budget(usage: Usage, keys: Iterable[str]) -> dict[str, float]:
    """`usage` as the budgets named by `keys` count it: `max_tokens` its tokens, `max_cost_usd`
    its cost."""
    return {k: usage.total_tokens if k == "max_tokens" else usage.cost_usd for k in keys}
