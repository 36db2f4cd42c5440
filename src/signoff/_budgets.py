"""What a session may still spend: its own budgets and, in a turn its parent delegated, what
the parent had left, as the engine checks them before each model call and a child records them;
and the session-limit question asked when one is spent, with how far its `continue` raises them
and the `stop` that ends the turn."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ._output_caps import input_price_floor, output_cap, output_price, spare
from ._state import SessionState, delegated_turn
from ._types import Option, Usage

if TYPE_CHECKING:
    from ._agent import Limits
    from .stores import Store

__all__ = [
    "budget_left",
    "by_budget",
    "call_cap",
    "continue_to",
    "limit_options",
    "limit_question",
    "own_left",
    "over_budget",
    "raised_to",
    "spending",
    "stopped_at_limit",
]


def budget_left(s: SessionState, max_tokens: int | None, max_cost: float | None) -> dict[str, Any]:
    """What the session may still spend now, by budget (`max_tokens`, `max_cost_usd`): what its
    own budgets leave (raised by each `continue`) and, in the turn its parent delegated, what its
    parent had left (its own `headroom`), whichever is less. A new child's `session.created`
    records it, so the child's bound is fixed once, the same on replay and after a restart."""
    spent = s.usage + s.delegated
    left: dict[str, Any] = {
        k: bound - by_budget(spent, [k])[k] for k, bound in _bounds(s, max_tokens, max_cost).items()
    }
    if delegated_turn(s):
        for key, cap in s.headroom.items():
            used = spent.total_tokens if key == "max_tokens" else spent.cost_usd
            left[key] = min(left.get(key, cap - used), cap - used)
    return {key: max(value, 0) for key, value in left.items()}


def by_budget(usage: Usage, keys: Iterable[str]) -> dict[str, float]:
    """`usage` as the budgets named by `keys` count it: `max_tokens` its tokens, `max_cost_usd`
    its cost."""
    return {k: usage.total_tokens if k == "max_tokens" else usage.cost_usd for k in keys}


# A session-limit request's question is the problem, `_ASKED`, what `continue` raises the
# budgets to (an older signoff's: "a raised budget") and `_OR_STOP`.
_ASKED = ". Continue with "
_OR_STOP = ", or stop?"

_MOST_SIZES = 2**53
"""The most sizes one `continue` raises a budget by: a budget so small that the next call needs
more is raised that much (what it becomes stays a finite number), and asks again."""


def limit_question(problem: str, raised: str) -> str:
    """A session-limit request's question: what spent the budget, and what `continue` raises the
    budgets to (`raised_to`)."""
    return f"{problem}{_ASKED}{raised or 'a raised budget'}{_OR_STOP}"


def limit_options(raised: str) -> list[Option]:
    """A session-limit request's options, `continue` saying what it raises the budgets to."""
    go_on = f"Go on with {raised}." if raised else "Raise the budget by its size again."
    return [
        Option(id="continue", label="Continue", description=go_on),
        Option(id="stop", label="Stop", description="End this turn here."),
    ]


def _problem(question: str) -> str:
    """What spent the budget, as a session-limit request's question (`limit_question`, or an
    older signoff's) says it."""
    head, asked, tail = question.rpartition(_ASKED)
    return head if asked and tail.endswith(_OR_STOP) else question


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
    return _problem(last.request.question or "") or "a session budget was spent"


def own_left(s: SessionState, limits: Limits) -> dict[str, float]:
    """What the session's own budgets (raised by each `continue`) leave, by budget."""
    return spare(_bounds(s, limits.tokens_bound, limits.cost_bound), s.usage + s.delegated)


def _bounds(s: SessionState, max_tokens: int | None, max_cost: float | None) -> dict[str, Any]:
    """The session's own budgets of these sizes, raised by the `continue`s answered: each a
    size more for an older signoff's (`limit_grants`), and at least what a newer one's said it
    raises the budget to (`raised`), whatever size a redeploy gave it since."""
    times = 1 + s.limit_grants
    return {
        k: max(size * times, s.raised.get(k, 0))
        for k, size in (("max_tokens", max_tokens), ("max_cost_usd", max_cost))
        if size is not None
    }


def continue_to(
    s: SessionState,
    limits: Limits,
    model: object,
    floor: int,
    more: Usage | None = None,
    room: int = 1,
) -> dict[str, Any]:
    """What a `continue` raises each of the session's own budgets to: a whole number of its
    sizes, as many as its next model call, reading at least `floor` input tokens, needs to be
    made with `room` output tokens left (as `call_cap` holds its input back) once `more` is
    spent besides; a size more than it is at least. Each budget counts its own sizes: one that
    was not spent is not raised as far as the other needs. Decided when the person is asked
    and recorded with the request (`raise_to`), never recomputed."""
    spent = s.usage + s.delegated + (more or Usage())
    least, price = input_price_floor(model) or 0.0, output_price(model)
    reading = Usage(input_tokens=floor, cost_usd=floor * least)
    bounds = _bounds(s, limits.tokens_bound, limits.cost_bound)
    to: dict[str, Any] = {}
    for k, size in (("max_tokens", limits.tokens_bound), ("max_cost_usd", limits.cost_bound)):
        if size is None:
            continue
        past = _past(bounds[k], size)
        times = max(_needed(k, size, spent, reading, price, room), past)
        # Rounding may leave a float a hair short: a size more, as `output_cap` counts it.
        for more_sizes in range(4):
            to[k] = size * min(times + more_sizes, past - 1 + _MOST_SIZES)
            cap = output_cap(spare({k: to[k]}, spent + reading), price)
            if cap is None or cap >= room:
                break
    return to


def _needed(
    k: str, size: float, spent: Usage, reading: Usage, price: float | None, room: int
) -> int:
    """How many of its sizes budget `k` needs to be for a call reading `reading` to be left
    `room` output tokens once `spent` is counted (as many as one `continue` gives at most)."""
    if k == "max_tokens":  # more than what is spent and read, by the room
        return -(-(spent.total_tokens + reading.total_tokens + room) // int(size))
    # What is spent and read, and the room's output at its price (free: more than nothing).
    want = (spent.cost_usd + reading.cost_usd + room * (price or 0.0)) / size
    if not want < _MOST_SIZES:  # past it (or infinite): as many as one continue gives
        return 2 * _MOST_SIZES
    return math.floor(want) + 1 if price is None else math.ceil(want)


def _past(bound: float, size: float) -> int:
    """The fewest whole sizes more than `bound`, one size past it at least."""
    n = int(bound // size) + 1
    return n + 1 if size * n <= bound else n


def raised_to(to: Mapping[str, float]) -> str:
    """What a `continue` raises the session's own budgets to (`continue_to`), in words
    ("max_tokens raised to 6000"); empty when it has none."""
    out = []
    if "max_tokens" in to:
        out.append(f"max_tokens raised to {to['max_tokens']}")
    if "max_cost_usd" in to:
        out.append(f"max_cost_usd raised to {to['max_cost_usd']:g}")
    return " and ".join(out)


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
    """Which budget the session has spent (with `more` spent besides), each raised by the
    `continue`s answered: its own usage and what its delegate calls' children spent count alike."""
    return next((text for text, over in spending(s, max_tokens, max_cost, more) if over), None)


def spending(
    s: SessionState, max_tokens: int | None, max_cost: float | None, more: Usage | None
) -> list[tuple[str, bool]]:
    """What the session spent of each budget it has, in words, and whether that spent it."""
    bound = _bounds(s, max_tokens, max_cost)
    spent, theirs = s.usage + s.delegated, s.delegated
    if more is not None:
        spent = spent + more
    out = []
    if "max_tokens" in bound:
        by = f" ({theirs.total_tokens} of them by its subagents)" if theirs.total_tokens else ""
        text = f"the session used {spent.total_tokens} of max_tokens={bound['max_tokens']}{by}"
        out.append((text, spent.total_tokens >= bound["max_tokens"]))
    if "max_cost_usd" in bound:
        by = f" ({theirs.cost_usd:.4f} of it by its subagents)" if theirs.cost_usd else ""
        text = (
            f"the session cost {spent.cost_usd:.4f} of max_cost_usd={bound['max_cost_usd']:g}{by}"
        )
        out.append((text, spent.cost_usd >= bound["max_cost_usd"]))
    return out
