"""What a session may still spend: its own budgets and, in a turn its parent delegated, what
the parent had left, as the engine checks them before each model call and a child records them;
and the session-limit question asked when one is spent, with the `stop` that ends the turn."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ._state import SessionState, delegated_turn
from ._types import Option, Usage

__all__ = [
    "LIMIT_ASKED",
    "LIMIT_OPTIONS",
    "budget_left",
    "by_budget",
    "over_budget",
    "spending",
    "stopped_at_limit",
]


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


LIMIT_OPTIONS = [
    Option(id="continue", label="Continue", description="Raise the budget by its size again."),
    Option(id="stop", label="Stop", description="End this turn here."),
]
LIMIT_ASKED = ". Continue with a raised budget, or stop?"  # ends a session-limit request's question


def stopped_at_limit(s: SessionState) -> str | None:
    """The spent budget the turn's latest session-limit request asked about, when the person
    answered it `stop`: the turn ends at its next model step, whatever the budgets are by then."""
    turn = s.turn
    assert turn is not None
    own = ("session-limit", None, turn.id)  # not a subagent's, nor an earlier turn's
    asked = [
        r
        for r in s.requests.values()
        if (r.request.kind, r.request.child, r.request.turn_id) == own
    ]
    if not asked or asked[-1].outcome != "answered":
        return None  # pending, expired, or none asked
    last = asked[-1]
    if ((last.resolution or {}).get("answer") or {}).get("option_id") != "stop":
        return None
    return (last.request.question or "").removesuffix(LIMIT_ASKED) or "a session budget was spent"


def over_budget(
    s: SessionState, max_tokens: int | None, max_cost: float | None, more: Usage | None = None
) -> str | None:
    """Which budget the session has spent (with `more` spent besides), each raised once per
    `continue` answered: its own usage and what its delegate calls' children spent count alike."""
    return next((text for text, over in spending(s, max_tokens, max_cost, more) if over), None)


def spending(
    s: SessionState, max_tokens: int | None, max_cost: float | None, more: Usage | None
) -> list[tuple[str, bool]]:
    """What the session spent of each budget it has, in words, and whether that spent it."""
    times = 1 + s.limit_grants
    spent, theirs = s.usage + s.delegated, s.delegated
    if more is not None:
        spent = spent + more
    out = []
    if max_tokens is not None:
        by = f" ({theirs.total_tokens} of them by its subagents)" if theirs.total_tokens else ""
        text = f"the session used {spent.total_tokens} of max_tokens={max_tokens * times}{by}"
        out.append((text, spent.total_tokens >= max_tokens * times))
    if max_cost is not None:
        by = f" ({theirs.cost_usd:.4f} of it by its subagents)" if theirs.cost_usd else ""
        text = f"the session cost {spent.cost_usd:.4f} of max_cost_usd={max_cost * times:g}{by}"
        out.append((text, spent.cost_usd >= max_cost * times))
    return out
