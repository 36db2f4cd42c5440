"""What a child session may spend through its delegated turn as its parent stands now
(`headroom_now`): kept apart from `_child_sessions`, which counts what children spent."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from ._budgets import by_budget
from ._child_sessions import delegated, first_turn
from ._exceptions import UnknownSession
from ._state import SessionState, delegated_turn
from ._types import Usage

if TYPE_CHECKING:
    from ._runtime import Runtime

__all__ = ["headroom_now"]

_DEEPEST = 9  # how far up `headroom_now` and down `_live_spend` look: subagents nest 8 deep


async def headroom_now(rt: Runtime, state: SessionState, depth: int = 0) -> dict[str, float]:
    """What the child may spend through its delegated turn, by budget, as its parent stands now:
    its `headroom` less what the parent counted since the child was created and what its other
    subagents spend uncounted (children started from one model response share what the parent
    had left), and no more than the parent's own such bound leaves it. Read from the store at
    each model step, so a restart decides on what was recorded; a child created without
    `parent_spent` (an older signoff's) keeps its headroom as it was fixed."""
    bound = dict(state.headroom)
    if not bound or not state.parent_spent or state.parent is None or depth >= _DEEPEST:
        return bound
    try:
        parent = await rt._state(state.parent)
    except UnknownSession:
        return bound
    counted = parent.usage + parent.delegated
    others = await _uncounted_spend(rt, parent, depth, but=state.id)
    now, theirs = by_budget(counted, bound), by_budget(others, bound)
    for key, cap in bound.items():
        bound[key] = cap - (now[key] - state.parent_spent.get(key, now[key])) - theirs[key]
    if parent.headroom and delegated_turn(parent):
        above = await headroom_now(rt, parent, depth + 1)
        for key, cap in above.items():
            if key in bound:
                bound[key] = min(bound[key], cap - now[key] - theirs[key])
    return bound


def _uncounted(parent: SessionState) -> list[str]:
    """The parent's children whose spend it has not counted: those of its turn's delegate calls
    without a result, and those it owes."""
    return list(dict.fromkeys([*delegated(parent), *parent.owed]))


async def _uncounted_spend(
    rt: Runtime, parent: SessionState, depth: int, *, but: str | None = None
) -> Usage:
    """What the parent's children (`but` one) spent that it has not counted: those it has not
    counted at all, and those counted short, past that count."""
    spent = Usage()
    if depth >= _DEEPEST:
        return spent
    for kid in _uncounted(parent):
        if kid != but:
            with contextlib.suppress(UnknownSession):
                spent = spent + await _live_spend(rt, kid, depth)
    for kid, (_, counted) in parent.short.items():
        if kid == but:
            continue
        with contextlib.suppress(UnknownSession):
            live = (await _live_spend(rt, kid, depth)).model_dump()
            spent = spent + Usage(**{k: max(v - counted.get(k, 0), 0) for k, v in live.items()})
    return spent


async def _live_spend(rt: Runtime, child: str, depth: int) -> Usage:
    """What the child spent through its delegated turn so far, with what its own children spent
    that it has not counted yet."""
    first = await first_turn(rt, await rt._state(child))
    return first.usage + first.delegated + await _uncounted_spend(rt, first, depth + 1)
