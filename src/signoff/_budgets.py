"""What a session may still spend: its own budgets and, in a turn its parent delegated, what
the parent had left, as the engine checks them before each model call and a child records them;
and the session-limit question asked when one is spent, with the `stop` that ends the turn."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ._output_caps import input_price_floor, output_cap, output_price, spare
from ._state import SessionState, delegated_turn
from ._types import Option, Usage

if TYPE_CHECKING:
    from ._agent import Limits
    from .stores import Store

__all__ = [
    "LIMIT_ASKED",
    "LIMIT_OPTIONS",
    "budget_left",
    "by_budget",
    "call_cap",
    "own_left",
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


async def stopped_at_limit(s: SessionState, store: Store) -> str | None:
    """The spent budget the turn's latest session-limit request asked about, when the person
    answered it `stop` and no model call of the turn came after the answer: the turn ends at its
    next model step, whatever the budgets are by then. A turn that went on past its answer (a
    signoff before this one did, when the budget was raised or removed by then) is not ended by
    it now, after tools approved since ran."""
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
    if turn.model_seq > turn.first_seq:
        # Where the answer was recorded, the fold does not keep: it is among the events since
        # the turn's last model call, or that call came after it. Read only on a stop.
        since = await store.read_events(s.id, after=turn.model_seq, types=["input.resolved"])
        rid = last.request.id
        if not any(e.seq <= s.seq and e.data.get("request_id") == rid for e in since):
            return None
    return (last.request.question or "").removesuffix(LIMIT_ASKED) or "a session budget was spent"


def own_left(s: SessionState, limits: Limits) -> dict[str, float]:
    """What the session's own budgets (raised by each `continue`) leave, by budget."""
    times = 1 + s.limit_grants
    bound = {
        k: v * times
        for k, v in (("max_tokens", limits.tokens_bound), ("max_cost_usd", limits.cost_bound))
        if v is not None
    }
    return spare(bound, s.usage + s.delegated)


def call_cap(
    s: SessionState, limits: Limits, model: object, theirs: Mapping[str, float], floor: int
) -> tuple[int | None, bool, int]:
    """The most output tokens a call of `model` reading at least `floor` input tokens may write
    within what the budgets leave, its own and its share of its parent's (`theirs`), with that
    input held back first in tokens and at the model's least input price (None: nothing bounds
    it); whether the parent's share sets it; and, when it is 0, `floor` if that input is what
    leaves no output token (else 0: none was left before it)."""
    reading = Usage(input_tokens=floor, cost_usd=floor * (input_price_floor(model) or 0.0))
    price = output_price(model)
    own_room = own_left(s, limits)
    own = output_cap(spare(own_room, reading), price)
    share = output_cap(spare(theirs, reading), price)
    cap = own if share is None or (own is not None and own < share) else share
    parents = cap is not None and cap == share
    if cap != 0:
        return cap, parents, 0
    before = output_cap(theirs if parents else own_room, price)
    return cap, parents, floor if before != 0 else 0


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
